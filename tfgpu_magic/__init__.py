"""tfgpu_magic: GPU settings, memory and sharing for TensorFlow, PyTorch and JAX from inside a Jupyter notebook.

Load with ``%load_ext tfgpu_magic``.  Importing the package imports neither TensorFlow nor
pynvml (nor IPython, nor jupyter_server): those load when a command needs them.  The Jupyter
server extension (``GET tfgpu/api/status``) lives in :mod:`tfgpu_magic.server.extension`, named here
by its entry point only.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["__version__", "load_ipython_extension", "set_device_source", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext tfgpu_magic``: register ``%gpu`` and apply an administrator's defaults, then the
    notebook's saved settings, once per kernel (a kernel started for a notebook's settings loaded
    them already: a later ``%load_ext`` adds nothing)."""
    from .kernel.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo that would be safe: settings already given to TensorFlow stay."""


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Jupyter server's entry point: the extension's module and its ``ExtensionApp``, imported only
    when the server calls this (importing the package imports no part of the server)."""
    from .server.extension import GpuStatusApp

    return [{"module": "tfgpu_magic.server.extension", "app": GpuStatusApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab extension lives (``jupyter labextension develop`` links it).

    The wheel installs the same files under ``share/jupyter/labextensions/tfgpu-magic``.
    """
    return [{"src": "labextension", "dest": "tfgpu-magic"}]


def set_device_source(lib: Any) -> None:
    """Read GPUs through ``lib``, a pynvml-like object (``tfgpu_magic.simulated.shared_server()``)."""
    from .kernel.session import set_device_source as _set

    _set(lib)
