"""The extension as a kernel's starter loads it, under a name of its own (``saved.KERNEL_ARGUMENT``).

``tfgpu run``, papermill's ``tfgpu`` engine and the Jupyter server (for a notebook whose metadata
has saved settings) start the kernel with this module among IPython's ``extra_extensions``, so the
settings are in force before the first cell.  Loading it is loading tfgpu_magic
(:func:`tfgpu_magic.kernel.magics.load`); a ``%load_ext tfgpu_magic`` cell afterwards finds this
kernel's session loaded and adds nothing, without IPython's "already loaded" lines, which that
cell would print under the notebook if the extension had been loaded under its own name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load

    load(ipython)
