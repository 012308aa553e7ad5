"""What a light ``%load_ext`` left for the session's first use (:func:`tfgpu_magic.kernel.magics.load`).

Loading registers ``%gpu``, its completion and the import hooks, and builds no session when
nothing asks for one at load (no administrator's defaults, no saved settings, nothing CUDA read
already): the session, the command language and their dataclasses are built at the first
``%gpu``, framework import or other use (:func:`tfgpu_magic.kernel.session.get_session`), which
then finishes the load with the function left here.  Imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["defer", "pending", "take"]

_finish: Callable[[Any], None] | None = None
_shell: Any = None


def defer(shell: Any, finish: Callable[[Any], None]) -> None:
    """``finish(session)`` runs once, when the session of ``shell``'s kernel is built."""
    global _finish, _shell
    _finish, _shell = finish, shell


def pending(shell: Any) -> bool:
    """Whether ``shell`` was loaded lightly and its session is not built yet."""
    return _finish is not None and _shell is shell


def take() -> Callable[[Any], None] | None:
    """The load's unfinished part (once), or None."""
    global _finish, _shell
    finish, _finish, _shell = _finish, None, None
    return finish
