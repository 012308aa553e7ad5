"""The framework adapters: the only code that touches TensorFlow (PyTorch, JAX).  An adapter
never imports its framework: it is handed the module once the user's import has finished.

:func:`adapters` is the one list of them: the kernel loops over it and names none."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing this package stays light: `%load_ext` reads WATCHED_MODULES only
    from .base import Framework

__all__ = ["WATCHED_MODULES", "adapters"]

# Every module an adapter hears the import of (its framework's, and its side_imports()): what
# `%load_ext` watches before the session is built (tests/test_lazy_load.py checks the list).
WATCHED_MODULES = ("tensorflow", "keras", "torch", "jax")


def adapters(
    tensorflow: Framework | None = None, pytorch: Framework | None = None, jax: Framework | None = None
) -> tuple[Framework, ...]:
    """Every framework's adapter, in the order of every report; a stand-in replaces one (tests)."""
    from .jax import Jax
    from .pytorch import PyTorch
    from .tensorflow import TensorFlow

    return (
        tensorflow if tensorflow is not None else TensorFlow(),
        pytorch if pytorch is not None else PyTorch(),
        jax if jax is not None else Jax(),
    )
