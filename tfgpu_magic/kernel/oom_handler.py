"""IPython's handler for the frameworks' out-of-memory errors: the traceback, then the explanation.

:func:`install` (called when the extension loads) hooks IPython's ``set_custom_exc`` for
TensorFlow's ``tf.errors.ResourceExhaustedError``, PyTorch's ``torch.OutOfMemoryError`` and JAX's
``JaxRuntimeError`` (its ``RESOURCE_EXHAUSTED`` kind).  No framework is imported for it: the hook
for each is installed the moment the user imports it.  The handler shows IPython's normal
traceback first, so the original error stays as it was (also in ``sys.last_value``), then the
explanation.  If the explanation itself fails, only the traceback is shown.

The explanation (:mod:`.oom`, its facts, messages and advice) is imported when the first
out-of-memory error arrives, not at ``%load_ext``, which only needs this wiring.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from ..frameworks.base import Framework
from ..frameworks.import_hooks import run_after_import

__all__ = ["install"]

_installed: weakref.WeakSet[Any] = weakref.WeakSet()


def install(shell: Any, session: Any) -> None:
    """Explain the frameworks' out-of-memory errors in ``shell`` from now on (idempotent)."""
    if shell in _installed:
        return
    _installed.add(shell)
    for framework in session.frameworks():
        if framework.oom_error_type() is not None:
            _hook(shell, session, framework)
        else:

            def hook_later(module: Any, framework: Framework = framework) -> None:
                _hook_quietly(shell, session, framework)

            run_after_import(framework.module, hook_later)


def _hook_quietly(shell: Any, session: Any, framework: Any) -> None:
    try:
        _hook(shell, session, framework)
    except Exception as err:  # never break the user's import
        print(f"tfgpu_magic: out-of-memory explanations are off ({err!r})", file=sys.stderr)


def _hook(shell: Any, session: Any, framework: Any) -> None:
    """Add the framework's error to IPython's custom exceptions, keeping any handler already set."""
    oom_type = framework.oom_error_type()
    previous_types = tuple(shell.custom_exceptions)
    previous = shell.CustomTB if previous_types else None
    if oom_type is None or oom_type in previous_types:
        return

    def handler(self: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        if previous is not None and isinstance(value, previous_types):
            previous(etype, value, tb, tb_offset=tb_offset)  # theirs shows the traceback
        else:
            self.showtraceback((etype, value, tb), tb_offset=tb_offset)
        if isinstance(value, oom_type):
            _print_explanation(session, framework, value)

    shell.set_custom_exc((*previous_types, oom_type), handler)


def _print_explanation(session: Any, framework: Any, error: BaseException) -> None:
    from . import oom  # at the first out-of-memory error, not at `%load_ext`

    if not oom.is_out_of_memory(framework, error):
        return
    try:
        text = oom.explain(session, error)
    except Exception as err:  # the traceback is already shown; say why nothing follows
        text = f"tfgpu_magic: no out-of-memory explanation ({err!r})"
    print(text)
