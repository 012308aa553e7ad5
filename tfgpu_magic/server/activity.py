"""What each kernel is doing, read from its own IOPub messages: the GPU idle culler's "busy" and "idle".

jupyter_server's ``execution_state`` is the last status message whose parent is a request type
it tracks, so a ``usage_request`` (jupyter-resource-usage's kernel panel) or a
``list_subshell_request`` answered on the control channel while a cell runs makes a busy kernel
"idle"; and its ``last_activity`` moves with every comm message, so an open ``%gpu monitor``,
whose panel sends a heartbeat a second, keeps a forgotten kernel fresh for ever.  Neither can
decide whether to shut a kernel down.

:class:`ActivityWatcher` subscribes to each kernel's IOPub from the moment jupyter_server starts
watching it (it wraps the kernel manager's ``start_watching_activity``) and keeps, per kernel:

- ``executing``: per shell (the main one, and each subshell of ipykernel 7), the
  ``execute_request`` the kernel has started (its ``busy`` status, or its ``execute_input``,
  with that request as parent) and not finished (its ``idle`` status with that parent).  While
  one is outstanding the kernel is busy, whatever any other status says.  A shell runs one
  cell at a time, so a cell started on a shell ends the one recorded there (an "idle" lost on
  the way heals at the next cell); a kernel that starts again (a ``starting`` status: a
  restart) has none.
- ``last_activity``: when the kernel last published something a user's request caused, counted
  as jupyter_server counts it (its ``untracked_message_types``, and the control-channel polls
  above, are not activity), except the ``%gpu monitor`` panel's own traffic: the comm messages
  of the panels this kernel opened (anywidget's ``_anywidget_id`` names tfgpu_magic's class).

A message that cannot be read is ignored: a missed "busy" is caught by jupyter_server's own
state (the culler needs both to say idle), a missed "idle" keeps the kernel busy (never culled).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NOT_ACTIVITY", "PANEL_ID_PREFIX", "Activity", "ActivityWatcher"]

# Requests answered on the control channel that pollers send while cells run: their replies
# and statuses are not the user's activity (jupyter_server counts them, and takes their status).
NOT_ACTIVITY = frozenset(
    {
        "usage_request",
        "usage_reply",
        "list_subshell_request",
        "list_subshell_reply",
        "create_subshell_request",
        "create_subshell_reply",
        "delete_subshell_request",
        "delete_subshell_reply",
    }
)

# anywidget's per-class id (``module.ClassName``) in a comm_open's state: the tfgpu panels'.
PANEL_ID_PREFIX = "tfgpu_magic."
_COMM_TYPES = ("comm_open", "comm_msg", "comm_close")


@dataclass
class Activity:
    """One kernel, as its IOPub shows it."""

    since: float  # when watching began (epoch seconds)
    from_start: bool  # watched since jupyter_server started watching it (else: first seen running)
    last_activity: float
    executing: dict[str | None, str] = field(
        default_factory=dict
    )  # shell (subshell id) -> execute_request id
    panels: set[str] = field(default_factory=set)  # comm ids of this kernel's tfgpu panels

    @property
    def busy(self) -> bool:
        return bool(self.executing)


class ActivityWatcher:
    """The IOPub watch of every kernel of one kernel manager (see the module's doc)."""

    def __init__(self, manager: Any, log: logging.Logger, clock: Callable[[], float] = time.time) -> None:
        self._manager = manager
        self._log = log
        self._clock = clock
        self._kernels: dict[str, Activity] = {}
        self._streams: dict[str, Any] = {}
        self._originals: dict[str, Any] = {}

    # -- installing ------------------------------------------------------------------------------
    def install(self) -> None:
        """Watch every kernel from now on, from its start, and the ones already running from now."""
        manager = self._manager
        start, stop = manager.start_watching_activity, manager.stop_watching_activity
        self._originals = {
            name: vars(manager).get(name) for name in ("start_watching_activity", "stop_watching_activity")
        }

        def start_watching_activity(kernel_id: str) -> Any:
            result = start(kernel_id)
            self.watch(kernel_id, from_start=True)
            return result

        def stop_watching_activity(kernel_id: str) -> Any:
            self.forget(kernel_id)
            return stop(kernel_id)

        manager.start_watching_activity = start_watching_activity
        manager.stop_watching_activity = stop_watching_activity
        for kernel_id in list(manager.list_kernel_ids()):
            self.watch(kernel_id, from_start=False)

    def uninstall(self) -> None:
        """Stop watching: close every stream and give the kernel manager its own methods back."""
        for name, original in self._originals.items():
            if original is None:
                vars(self._manager).pop(name, None)  # the class's own method again
            else:
                setattr(self._manager, name, original)
        self._originals = {}
        for kernel_id in list(self._streams):
            self.forget(kernel_id)

    # -- watching --------------------------------------------------------------------------------
    def watch(self, kernel_id: str, from_start: bool) -> None:
        """Subscribe to ``kernel_id``'s IOPub (again, after a restart on new ports)."""
        self.forget(kernel_id)
        try:
            kernel = self._manager.get_kernel(kernel_id)
            from jupyter_client.session import Session

            session = Session(config=kernel.session.config, key=kernel.session.key)
            stream = kernel.connect_iopub()
        except Exception as err:  # not watched: the culler never culls it
            self._log.warning(
                "tfgpu_magic: kernel %s cannot be watched (%s); the GPU idle culler leaves it alone",
                kernel_id,
                err,
            )
            return
        now = self._clock()
        self._kernels[kernel_id] = Activity(since=now, from_start=from_start, last_activity=now)
        self._streams[kernel_id] = stream
        stream.on_recv(lambda parts: self._receive(kernel_id, session, parts))

    def forget(self, kernel_id: str) -> None:
        self._kernels.pop(kernel_id, None)
        stream = self._streams.pop(kernel_id, None)
        if stream is not None:
            try:
                stream.close()
            except Exception:  # closing twice, or a socket the loop already closed
                pass

    def activity(self, kernel_id: str) -> Activity | None:
        """What ``kernel_id`` is doing; None when it is not watched."""
        return self._kernels.get(kernel_id)

    def _receive(self, kernel_id: str, session: Any, parts: list[Any]) -> None:
        activity = self._kernels.get(kernel_id)
        if activity is None:
            return
        try:
            _idents, parts = session.feed_identities(parts)
            msg = session.deserialize(parts, content=False)
            msg_type = msg["header"]["msg_type"]
            if msg_type == "status" or msg_type in _COMM_TYPES:
                msg = session.deserialize(parts, content=True)
        except Exception as err:  # an unsigned or garbled message: not the kernel's, or not readable
            self._log.debug(
                "tfgpu_magic: an IOPub message of kernel %s could not be read (%s)", kernel_id, err
            )
            return
        self.record(activity, msg)

    def record(self, activity: Activity, msg: dict[str, Any]) -> None:
        """Update ``activity`` from one IOPub message (deserialized; content where needed)."""
        msg_type = msg["header"]["msg_type"]
        parent = msg.get("parent_header") or {}
        parent_type, parent_id = parent.get("msg_type"), parent.get("msg_id")
        content = msg.get("content") or {}
        if msg_type == "status":
            state = content.get("execution_state")
            if state == "starting":  # a new kernel process: nothing of the old one runs
                activity.executing.clear()
            elif parent_type == "execute_request" and parent_id:
                if state == "busy":
                    activity.executing[parent.get("subshell_id")] = parent_id
                elif state == "idle":
                    for shell in [s for s, running in activity.executing.items() if running == parent_id]:
                        del activity.executing[shell]
        elif msg_type == "execute_input" and parent_type == "execute_request" and parent_id:
            activity.executing[parent.get("subshell_id")] = parent_id
        if self._panel_traffic(activity, msg_type, content):
            return
        if activity.busy or self._counts(msg_type) or self._counts(parent_type):
            activity.last_activity = max(activity.last_activity, self._clock())

    def _counts(self, msg_type: str | None) -> bool:
        if msg_type is None or msg_type in NOT_ACTIVITY:
            return False
        track = getattr(self._manager, "track_message_type", None)
        return track(msg_type) if track is not None else True

    @staticmethod
    def _panel_traffic(activity: Activity, msg_type: str, content: dict[str, Any]) -> bool:
        """A tfgpu panel's comm message (its opening noted): the panel's own traffic."""
        if msg_type not in _COMM_TYPES:
            return False
        comm_id = content.get("comm_id")
        if msg_type == "comm_open":
            state = (content.get("data") or {}).get("state") or {}
            widget_id = state.get("_anywidget_id")
            if isinstance(widget_id, str) and widget_id.startswith(PANEL_ID_PREFIX) and comm_id:
                activity.panels.add(comm_id)
            return False  # opening a panel is the user's doing (the cell that ran %gpu monitor)
        if comm_id in activity.panels:
            if msg_type == "comm_close":
                activity.panels.discard(comm_id)
            return True
        return False
