"""A notebook with saved GPU settings gets a kernel that applies them before its first cell.

A kernel applies a notebook's ``tfgpu`` metadata key when tfgpu_magic loads in it
(:mod:`tfgpu_magic.kernel.notebook_settings`); a user who opens such a notebook has not run
``%load_ext`` yet.  So when this server starts an IPython kernel for a notebook whose file has
the key, the kernel is started with :data:`~tfgpu_magic.command.saved.KERNEL_ARGUMENT` (on the kernel's
command line: jupyter_client keeps it for restarts, which reuse the launch's arguments).

The notebook is the one jupyter_server names in the kernel's environment (``JPY_SESSION_NAME``,
set for every session's kernel).  It is read in a worker thread, at most
:data:`MAX_NOTEBOOK_BYTES`, never through a link; :func:`tfgpu_magic.command.saved.read` decides:
a key it cannot read loads the extension all the same, and the kernel then says the one line
saying what is wrong.  Nothing here ever stops a kernel from starting: a fault is a warning in
the server's log, and the kernel starts as it would have without this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_server.utils import ensure_async

from ..command import saved
from ..safe_text import safe

__all__ = [
    "EXTENSION_ARGUMENT",
    "MAX_NOTEBOOK_BYTES",
    "NotebookSettingsLoader",
    "has_settings",
    "runs_ipykernel",
]

EXTENSION_ARGUMENT = saved.KERNEL_ARGUMENT
NOTEBOOK_ENV = "JPY_SESSION_NAME"
# The kernel reads no larger notebook at its start (kernel/notebook_settings.py, the same bound):
# loading the extension for one would apply nothing.
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024
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
    metadata = _notebook_metadata(path)
    try:
        return saved.read(metadata) is not None
    except saved.SettingsError:
        return True


def _notebook_metadata(path: str) -> Any:
    """The notebook's metadata; {} for a file that is gone, a link, not a regular file, too large,
    or not JSON (a notebook being written): no settings are known of it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
            return {}
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_NOTEBOOK_BYTES + 1)
        if b'"tfgpu"' not in raw:  # most notebooks, as the kernel reads them: no parse of their outputs
            return {}
        notebook = json.loads(raw)
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past the parser's limit
        return {}
    finally:
        os.close(fd)
    return notebook.get("metadata", {}) if isinstance(notebook, dict) else {}


class NotebookSettingsLoader:
    """Wraps the server's kernel manager's ``start_kernel``: a notebook with saved settings gets
    :data:`EXTENSION_ARGUMENT` among its kernel's extra arguments (see the module's docstring)."""

    def __init__(self, manager: Any, log: logging.Logger) -> None:
        self._manager = manager
        self._log = log
        self._original: Any = None

    def install(self) -> None:
        manager, start = self._manager, self._manager.start_kernel
        self._original = vars(manager).get("start_kernel")

        async def start_kernel(*args: Any, **kwargs: Any) -> Any:
            extra = await self._extra_arguments(kwargs.get("kernel_name"), kwargs.get("env"))
            if extra:
                kwargs["extra_arguments"] = [*(kwargs.get("extra_arguments") or []), *extra]
            return await ensure_async(start(*args, **kwargs))

        manager.start_kernel = start_kernel

    def uninstall(self) -> None:
        if self._original is None:
            vars(self._manager).pop("start_kernel", None)  # the class's own method again
        else:
            self._manager.start_kernel = self._original

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
