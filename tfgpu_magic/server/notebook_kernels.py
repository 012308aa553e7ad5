"""A notebook with saved GPU settings gets a kernel that applies them before its first cell.

A kernel applies a notebook's ``tfgpu`` metadata key when tfgpu_magic loads in it
(:mod:`tfgpu_magic.kernel.notebook_settings`); a user who opens such a notebook has not run
``%load_ext`` yet.  So when this server starts an IPython kernel for a notebook whose file has
the key, the kernel is started with :data:`~tfgpu_magic.command.saved.KERNEL_ARGUMENT` (on the kernel's
command line: jupyter_client keeps it for restarts, which reuse the launch's arguments).

The notebook is the one jupyter_server names in the kernel's environment (``JPY_SESSION_NAME``,
set for every session's kernel).  It is read in a worker thread, at most
:data:`MAX_NOTEBOOK_BYTES`, never through a link (:func:`tfgpu_magic.command.saved.metadata_from_file`,
the kernel's own reader); :func:`tfgpu_magic.command.saved.read` decides:
a key it cannot read loads the extension all the same, and the kernel then says the one line
saying what is wrong.  Nothing here ever stops a kernel from starting: a fault is a warning in
the server's log, and the kernel starts as it would have without this module.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..command import saved
from ..safe_text import safe
from .kernel_start import KernelStartHook

__all__ = [
    "EXTENSION_ARGUMENT",
    "MAX_NOTEBOOK_BYTES",
    "NotebookSettingsLoader",
    "has_settings",
    "runs_ipykernel",
]

EXTENSION_ARGUMENT = saved.KERNEL_ARGUMENT
NOTEBOOK_ENV = saved.NOTEBOOK_ENV
# The kernel reads no larger notebook at its start (the same reader): loading the extension for
# one would apply nothing.
MAX_NOTEBOOK_BYTES = saved.MAX_NOTEBOOK_BYTES
_IPYKERNEL_MODULES = ("ipykernel_launcher", "ipykernel")


def runs_ipykernel(argv: Sequence[str]) -> bool:
    """Whether a kernelspec's command runs ipykernel (``python -m ipykernel_launcher -f ...``): only
    IPython reads ``--InteractiveShellApp`` options; another kernel would refuse the argument."""
    words = list(argv)
    return any(
        word == "-m" and index + 1 < len(words) and words[index + 1] in _IPYKERNEL_MODULES
        for index, word in enumerate(words)
    )


def has_settings(path: str) -> bool:
    """Whether the notebook at ``path`` has the ``tfgpu`` key (readable or not: a malformed key
    loads the extension, which says what is wrong).  Blocking: call it in a thread."""
    metadata = saved.metadata_from_file(path)
    try:
        return saved.read(metadata) is not None
    except saved.SettingsError:
        return True


class NotebookSettingsLoader(KernelStartHook):
    """Wraps the server's kernel manager's ``start_kernel``: a notebook with saved settings gets
    :data:`EXTENSION_ARGUMENT` among its kernel's extra arguments (see the module's docstring)."""

    def __init__(self, manager: Any, log: logging.Logger) -> None:
        super().__init__(manager)
        self._log = log

    async def adjust(self, kwargs: dict[str, Any]) -> None:
        extra = await self._extra_arguments(kwargs.get("kernel_name"), kwargs.get("env"))
        if extra:
            kwargs["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), *extra]

    async def _extra_arguments(self, kernel_name: str | None, env: Mapping[str, str] | None) -> list[str]:
        """The arguments to add: :data:`EXTENSION_ARGUMENT` or none; never raises."""
        name = (env or {}).get(NOTEBOOK_ENV)
        if not name or not name.endswith(".ipynb"):
            return []  # no notebook: a console, a kernel started through the REST API alone
        try:
            if await asyncio.to_thread(self._wanted, kernel_name, self.notebook_path(name)):
                return [EXTENSION_ARGUMENT]
        except Exception as err:  # a kernel must start whatever its notebook or its kernelspec hold
            self._log.warning(
                "tfgpu_magic: could not tell whether %s has saved GPU settings (%s: %s); "
                "its kernel starts without loading tfgpu_magic",
                safe(os.path.basename(name)),  # a shared folder's file names are others' choice
                type(err).__name__,
                safe(str(err)),
            )
        return []

    def notebook_path(self, name: str) -> str:
        """The notebook's file from ``JPY_SESSION_NAME``: jupyter_server gives its absolute path when
        the front end names the session (JupyterLab and Notebook 7 do), else its API path, under
        the server's root."""
        return name if os.path.isabs(name) else os.path.join(str(self._manager.root_dir), name)

    def _wanted(self, kernel_name: str | None, path: str) -> bool:
        """In the worker thread: an IPython kernel, for a notebook with the key."""
        spec = self._manager.kernel_spec_manager.get_kernel_spec(
            kernel_name or self._manager.default_kernel_name
        )
        if not runs_ipykernel(spec.argv):
            return False
        if EXTENSION_ARGUMENT in spec.argv:
            return False  # a kernelspec that loads it already
        return has_settings(path)
