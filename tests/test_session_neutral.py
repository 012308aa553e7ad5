"""The session names no framework and holds no lock while it calls one (issue 27).

Each framework's behaviour lives in its adapter; the session loops over the adapters.  A fourth,
made-up framework therefore takes part in every command without a line of the session changing,
and every call into an adapter happens with the session's lock released (a framework that calls
back, or blocks on a lock of its own, cannot deadlock the kernel)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.command.plan import Plan, Resolution
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.base import (
    Change,
    DeviceMemory,
    Framework,
    FreeReport,
    Host,
    Refusal,
    ReportView,
    Stage,
)
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.kernel.session import Session, SessionError
from tfgpu_magic.simulated import shared_server

from support.fakes import FakeTensorFlow, WriteSideDefaults


class Made(WriteSideDefaults):
    """A fourth framework, as an adapter would describe it: imported, not started, takes every setting."""

    key, name, module = "made", "MadeUp", "madeup"
    start_variables = managed_variables = ("MADEUP_LIMIT",)
    takes_effect = "at its first kernel launch"
    environ: Any = None
    cuda_record: Any = None

    def __init__(self, stage: Stage = Stage.IMPORTED) -> None:
        self._stage = stage
        self.given: list[Resolution] = []
        self.calls: list[str] = []
        self.session: Session | None = None
        self.refuse: str | None = None

    def _called(self, name: str) -> None:
        if self.session is not None:
            assert not self.session._lock._is_owned(), f"{name} was called with the session's lock held"
        self.calls.append(name)

    def on_import(self, module: Any) -> None:
        self._called("on_import")

    # Reporting's questions without a default (every adapter answers them for `%gpu status`)
    def report(self, view: ReportView) -> dict[str, Any]:
        return {"stage": self._stage.name.lower()}

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        return [f"{self.name}: {entry['stage']}"]

    def scope_hint(self) -> tuple[str, str]:
        return "madeup.device", "`import madeup`"

    def takes(self, command: Any) -> bool:
        return True

    def consider(self, change: Change) -> str | None:
        self._called("consider")
        if self.refuse:
            raise Refusal(self.refuse)
        return f"{self.name}: takes effect {self.takes_effect}"

    def prepare(self, change: Change) -> None:
        self._called("prepare")
        caps = change.resolution.caps_bytes()
        change.host.set_env("MADEUP_LIMIT", str(min(caps.values())) if caps else None)

    def give(self, resolution: Resolution, host: Host) -> bool:
        self._called("give")
        self.given.append(resolution)
        return True

    def takes_share(self) -> bool:
        return True

    def set_precision(self, policy: str | None) -> str | None:
        self._called("set_precision")
        return None

    def frozen(self, kept: Plan, host: Host) -> list[str]:
        self._called("frozen")
        return []

    def free_reading(self) -> dict:
        self._called("free_reading")
        return {}

    def free(self, plan: Plan, before: Any) -> FreeReport:
        self._called("free")
        return FreeReport(("Emptied MadeUp's pool.",))

    def installed(self) -> bool:
        return True

    def read_environment(self, env: Any) -> dict:
        return {}

    def stage(self) -> Stage:
        return self._stage

    def device_memory(self) -> dict[str, DeviceMemory]:
        return {}

    def open_peak_window(self) -> Any:
        raise NotImplementedError

    def oom_error_type(self) -> type | None:
        return None


def session_with_made(env: dict | None = None) -> tuple[Session, Made]:
    made = Made()
    session = Session(
        nvml=Nvml(lib=shared_server()),
        env=dict(env or {}),
        frameworks=(*adapters(tensorflow=FakeTensorFlow()), made),
    )
    made.session = session
    return session, made


def test_the_stand_in_is_a_framework():
    assert isinstance(Made(), Framework)


def test_a_fourth_framework_takes_part_in_every_command_without_a_line_of_the_session_changing():
    session, made = session_with_made()
    said = session.configure(grammar.parse("limit 4G"))
    assert said == "limit 4096MiB: MadeUp: takes effect at its first kernel launch"
    assert session.env["MADEUP_LIMIT"] == str(4 * 1024**3)
    assert session.applied["made"] is made.given[-1] and made.given[-1].caps_bytes()
    assert "Emptied MadeUp's pool." in session.free().splitlines()
    assert session.reset().startswith("forgot: limit 4096MiB")
    assert "MADEUP_LIMIT" not in session.env  # the variable it set for the framework is taken back


def test_a_refusal_by_one_framework_changes_nothing_for_any():
    session, made = session_with_made()
    session.configure(grammar.parse("grow"))
    before = (session.requested, dict(session.env), dict(session.applied))
    made.refuse = "MadeUp has started with its own limit; restart the kernel"
    with pytest.raises(SessionError, match=r"^MadeUp has started with its own limit; restart the kernel$"):
        session.configure(grammar.parse("limit 4G"))
    assert (session.requested, dict(session.env), dict(session.applied)) == before


def test_no_framework_is_called_with_the_sessions_lock_held():
    session, made = session_with_made()
    for line in ("use 1", "grow", "limit 50%", "allocator async", "precision mixed_float16"):
        session.configure(grammar.parse(line))
    session._on_import(made, object())
    session.free()
    session.reset()
    assert {
        "consider",
        "prepare",
        "give",
        "free_reading",
        "free",
        "frozen",
        "set_precision",
        "on_import",
    } <= set(made.calls)


def test_the_session_has_no_method_named_for_a_framework():
    names = [name for name, _ in inspect.getmembers(Session) if not name.startswith("__")]
    named = [
        n
        for n in names
        if any(w in n.lower() for w in ("tf", "tensorflow", "torch", "pytorch", "jax", "keras"))
    ]
    assert named == [], named
