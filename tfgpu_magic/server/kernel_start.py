"""Adding to each kernel the server starts: the one way the extension wraps ``start_kernel``.

The server's kernel manager (jupyter_server's ``MappingKernelManager``) is wrapped on the instance,
never on its class, so another server in the same process is untouched and :meth:`uninstall`
restores exactly what was there.  jupyter_client starts a restarted kernel with its launch's
arguments, so what a hook adds (variables, extra arguments) stays through restarts.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import ensure_async

__all__ = ["KernelStartHook"]


class KernelStartHook:
    """Wraps ``manager.start_kernel``: :meth:`adjust` sees and changes each start's keyword
    arguments (``env``, ``extra_arguments``, ``kernel_name``) before the kernel is started."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self._original: Any = None

    async def adjust(self, kwargs: dict[str, Any]) -> None:
        """Change ``kwargs`` in place; must not raise (a kernel starts whatever a hook finds)."""

    def install(self) -> None:
        manager, start = self._manager, self._manager.start_kernel
        self._original = vars(manager).get("start_kernel")

        async def start_kernel(*args: Any, **kwargs: Any) -> Any:
            await self.adjust(kwargs)
            return await ensure_async(start(*args, **kwargs))

        manager.start_kernel = start_kernel

    def uninstall(self) -> None:
        if self._original is None:
            vars(self._manager).pop("start_kernel", None)  # the class's own method again
        else:
            self._manager.start_kernel = self._original
