"""Post-import hooks: call a function with a module the moment that module finishes importing.

This is what ``wrapt.register_post_import_hook`` did for us, without importing wrapt (which
pulls in asyncio, ssl and importlib.metadata: most of what ``%load_ext`` used to cost).

:func:`run_after_import` runs ``hook(module)``:

- at once, if the module is already imported;
- otherwise exactly once, right after the module's code has run, however it is imported
  (``import x``, ``from x import y``, ``importlib.import_module``, or as the parent of a
  submodule imported first).  The hook gets ``sys.modules[name]`` as it stands then, so a
  module that replaced itself there while running (TensorFlow's lazy loaders) is handed over
  as the importer will see it.

Hooks for one module run in the order they were registered, under the import system's lock
for that module: another thread importing it meanwhile waits until they are done.  A hook
registered while the module's code is running waits for its end; one already waiting for the
same module is not added twice.  If the module's import fails, its hooks keep waiting and run
after a later import succeeds.  A hook that raises does not break the import (nor the
registration): the error is printed to stderr with its traceback and the next hook runs.

How: a finder first on ``sys.meta_path`` answers None at once for every name nobody waits
for, so other imports pay one dict lookup.  For a watched name it asks the finders after it
for the spec and wraps the spec's loader, whose ``exec_module`` then runs the hooks.  Nothing
else changes: the module's ``__loader__`` and ``__spec__.loader`` are the original loader again
before its code runs.

Limits (wrapt has the same): a namespace package (a folder without ``__init__.py``) has no
loader to wrap, so its hooks run only if registered after it is imported; a finder put ahead
of this one on ``sys.meta_path`` that finds the module hides it; and a hook registered while
another thread is already importing that module may miss that import.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["run_after_import"]

Hook = Callable[[Any], None]

_lock = threading.RLock()  # guards the two tables below and the finder's installation
_waiting: dict[str, list[Hook]] = {}  # module name -> hooks to run once it is imported
_executing: set[str] = set()  # watched modules whose code is running now (their hooks wait for the end)


def run_after_import(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once the module ``name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None or name in _executing:
            hooks = _waiting.setdefault(name, [])
            if hook not in hooks:
                hooks.append(hook)
            _FINDER.install()
            return
    _run(name, [hook], module)  # outside the lock: a hook may import, or start a thread that registers


def _module_imported(name: str) -> None:
    """The module's code has run: hand the module, as the importer will see it, to its hooks."""
    module = sys.modules.get(name)
    if module is None:  # its code ran outside an import (runpy, a manual exec_module): keep waiting
        return
    with _lock:
        hooks = _waiting.pop(name, [])
    _run(name, hooks, module)


def _run(name: str, hooks: list[Hook], module: Any) -> None:
    for hook in hooks:
        try:
            hook(module)
        except Exception:  # the user's import succeeded; a hook must not turn it into a failure
            import traceback

            print(
                f"tfgpu_magic: a hook run after importing {name!r} failed (the import worked):",
                file=sys.stderr,
            )
            traceback.print_exc()


class _PostImportFinder:
    """First on ``sys.meta_path``; finds nothing itself, wraps the loader of a watched module."""

    def __init__(self) -> None:
        self._installed = False

    def install(self) -> None:
        """Go first on ``sys.meta_path``, once (the caller holds the lock)."""
        if not self._installed:
            sys.meta_path.insert(0, self)
            self._installed = True

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _waiting:  # every other import: one dict lookup, then the next finder
            return None
        spec = self._spec_from_later_finders(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if loader is not None and not isinstance(loader, _HookedLoader) and _HookedLoader.can_wrap(loader):
            spec.loader = _HookedLoader(spec, loader)
        return spec

    def _spec_from_later_finders(self, fullname: str, path: Any, target: Any) -> Any:
        """What importing would find without this finder: ask the ones after it, in order."""
        finders = list(sys.meta_path)  # a copy: another thread may change the list meanwhile
        later = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in later:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


class _HookedLoader:
    """The module's own loader, with its hooks run after its code.

    Has ``exec_module`` (or, for an old-style loader, ``load_module``) only if the wrapped
    loader has it: the import system picks the protocol by looking.  Every other attribute
    (``create_module``, ``get_code``, ``is_package``, ...) is the wrapped loader's.
    """

    def __init__(self, spec: Any, loader: Any) -> None:
        self._spec = spec
        self._loader = loader
        if hasattr(loader, "exec_module"):
            self.exec_module = self._exec_module
        else:
            self.load_module = self._load_module

    @staticmethod
    def can_wrap(loader: Any) -> bool:
        return hasattr(loader, "exec_module") or hasattr(loader, "load_module")

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "_loader":  # not set yet (a copy made without __init__): no endless lookup
            raise AttributeError(attribute)
        return getattr(self._loader, attribute)

    def _exec_module(self, module: Any) -> None:
        name = self._spec.name
        self._put_back_original(module)
        with _lock:
            _executing.add(name)
        try:
            self._loader.exec_module(module)  # if this raises, the hooks wait for the next import
        finally:
            with _lock:
                _executing.discard(name)
        _module_imported(name)

    def _load_module(self, fullname: str) -> Any:
        module = self._loader.load_module(fullname)
        self._put_back_original(module)
        _module_imported(fullname)
        return module

    def _put_back_original(self, module: Any) -> None:
        """The module's code, and everyone after, see its own loader, never this wrapper."""
        self._spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            try:
                module.__loader__ = self._loader
            except AttributeError:  # a module type that refuses attributes keeps the wrapper
                pass
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "loader", None) is self:
            spec.loader = self._loader


_FINDER = _PostImportFinder()
