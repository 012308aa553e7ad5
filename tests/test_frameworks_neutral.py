"""The kernel names no framework: a fourth adapter, registered in a Session, shows up in
`%gpu status` (JSON, text, card), in the out-of-memory explanation and in `%%gpu on` without a
line of kernel code knowing it (issue 27).  Each framework's part is its adapter's."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from html.parser import HTMLParser
from typing import Any

import pytest

from tfgpu_magic.frameworks.base import (
    DeviceMemory,
    GpuShare,
    OomFacts,
    ReportView,
    Stage,
    UnresettablePeakWindow,
)
from tfgpu_magic.frameworks.jax import Jax, limit_problem
from tfgpu_magic.frameworks.pytorch import PyTorch
from tfgpu_magic.frameworks.tensorflow import TensorFlow
from tfgpu_magic.gpus import claims
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import cells, oom, status
from tfgpu_magic.kernel.session import Session

ME = 4242
MIB = 1024 * 1024
GIB = 1024 * MIB


from tfgpu_magic.frameworks import adapters  # noqa: E402

from support.fakes import WriteSideDefaults  # noqa: E402


class StandInError(Exception):
    """The stand-in framework's out-of-memory error."""


class StandIn(WriteSideDefaults):
    """A framework the kernel has never heard of: only the protocol connects them."""

    key = "standin"
    name = "StandIn"
    module = "standin"
    start_variables = ("STANDIN_POOL",)
    takes_effect = "when it starts"

    def __init__(self, stage: Stage = Stage.STARTED, gpu: int = 1) -> None:
        self._stage, self.gpu, self.scopes = stage, gpu, []

    def on_import(self, module: Any) -> None: ...

    def installed(self) -> bool:
        return True

    def read_environment(self, env: Mapping[str, str]) -> dict[str, str | None]:
        return {"STANDIN_POOL": env.get("STANDIN_POOL")}

    def stage(self) -> Stage:
        return self._stage

    def device_memory(self) -> dict[str, DeviceMemory]:
        return {"dev:0": DeviceMemory(3 * MIB, 5 * MIB)} if self._stage is Stage.STARTED else {}

    def open_peak_window(self) -> UnresettablePeakWindow:
        return UnresettablePeakWindow(self.device_memory)

    def oom_error_type(self) -> type | None:
        return StandInError

    # -- reports (status, out-of-memory, %%gpu on) --
    def report(self, view: ReportView) -> dict[str, Any]:
        return {
            "stage": self._stage.name.lower(),
            "installed": True,
            "pool": "shared",
            "applied": None if view.applied is None else view.applied.describe(),
        }

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        if entry["stage"] == "not_imported":
            return []
        return [f"{self.name + ':':<11} running with the {entry['pool']} pool", "  dev:0 holds 3 MiB"]

    def in_force_notes(self, view: ReportView) -> list[str]:
        return [f"{self.name} pool: shared"] if self._stage is Stage.STARTED else []

    def gpu_shares(self, view: ReportView) -> dict[int, GpuShare]:
        if self._stage is not Stage.STARTED:
            return {}
        return {self.gpu: GpuShare(("dev:0",), 3 * GIB, 5 * GIB)}

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts | None:
        if not isinstance(error, StandInError):
            return None
        return OomFacts(
            "dev:0",
            f"{self.name} dev:0",
            f"{self.name} dev:0",
            True,
            self.gpu,
            (f"{self.name}'s pool: 3 MiB in use",),
            ("shrink the pool",),
        )

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        if self._stage is not Stage.STARTED:
            return None, None
        return [self.gpu], self._scope() if gpu == self.gpu else None

    def scope_hint(self) -> tuple[str, str]:
        return "standin.on", "`import standin`"

    @contextlib.contextmanager
    def _scope(self) -> Any:
        self.scopes.append("in")
        yield
        self.scopes.append("out")


class FourFrameworks(Session):
    """A session with a fourth adapter: registering it is all it takes."""

    def __init__(self, standin: StandIn, tf: Any, **kwargs: Any) -> None:
        super().__init__(frameworks=(*adapters(tensorflow=tf), standin), **kwargs)
        self.standin = standin


@pytest.fixture(autouse=True)
def claim_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(claims.ENV_DIR, str(tmp_path / "claims"))
    yield
    claims.release_all()


def four(stage: Stage = Stage.STARTED, my_pid: int = ME) -> tuple[FourFrameworks, dict]:
    from support.fakes import FakeTensorFlow

    session = FourFrameworks(StandIn(stage), nvml=Nvml(lib=shared_server(ME)), env={}, tf=FakeTensorFlow())
    return session, status.build_report(session, my_pid=my_pid)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []

    def handle_data(self, data: str) -> None:
        self.cells.append(data)


# -- %gpu status ----------------------------------------------------------------------------------
def test_a_fourth_framework_is_in_the_json_as_its_adapter_reports_it():
    _, report = four()
    assert list(report["frameworks"]) == ["tensorflow", "pytorch", "jax", "standin"]
    assert report["frameworks"]["standin"] == {
        "stage": "started",
        "installed": True,
        "pool": "shared",
        "applied": None,
    }
    assert report["display"]["frameworks"][-1] == {
        "key": "standin",
        "name": "StandIn",
        "lines": ["StandIn:    running with the shared pool", "  dev:0 holds 3 MiB"],
    }
    assert "StandIn pool: shared" in report["in_force"]
    gpu = report["gpus"][1]
    assert gpu["frameworks"] == [
        {
            "key": "standin",
            "name": "StandIn",
            "names": ["dev:0"],
            "in_use_bytes": 3 * GIB,
            "peak_bytes": 5 * GIB,
        }
    ]
    assert gpu["tensorflow_names"] == [] and gpu["tensorflow_in_use_bytes"] is None  # the old keys stay
    assert json.loads(json.dumps(report)) == report


def test_a_fourth_framework_is_in_the_text_and_the_card_alike():
    _, report = four()
    text = status.render_text(report)
    assert "StandIn:    running with the shared pool\n  dev:0 holds 3 MiB\n" in text
    assert "visible (StandIn dev:0)" in text and "  StandIn allocator: 3.0 GiB in use, peak 5.0 GiB" in text
    card = _Text()
    card.feed(status.render_html(report))
    shown = " | ".join(card.cells)
    for label, value in status.header_rows(report):  # the card's rows are the text's lines
        assert (f"{label + ':':<11} {value}" if label else f"  {value}") in text
        assert value in shown and (not label or label in shown)
    assert "StandIn allocator: 3.0 GiB in use, peak 5.0 GiB" in shown


def test_a_fourth_framework_not_imported_is_named_among_those_the_settings_reach():
    _, report = four(Stage.NOT_IMPORTED)
    assert (
        "Frameworks: none imported yet; settings reach TensorFlow, PyTorch, JAX and StandIn when they start"
        in (status.render_text(report))
    )
    assert "environment read at start by TensorFlow, PyTorch, JAX and StandIn" not in " ".join(
        report["in_force"]
    )


def test_where_nvml_lists_no_pid_of_ours_the_frameworks_allocator_is_shown_under_its_name():
    _, report = four(my_pid=999)  # a container: NVML lists the host's pids
    usage = report["gpus"][1]["usage"]
    assert (usage["this_kernel_bytes"], usage["this_kernel_source"]) == (3 * GIB, "standin")
    assert "this kernel 3.0 GiB (StandIn allocator)" in status.render_text(report)
    assert "this kernel 3.0 GiB (StandIn allocator)" in status.render_html(report)
    assert any("showing StandIn's allocator in use" in note for note in report["gpus"][1]["notes"])


# -- the out-of-memory explanation, %%gpu on ------------------------------------------------------------
def test_a_fourth_frameworks_out_of_memory_error_is_explained_with_its_own_facts():
    session, _ = four()
    text = oom.explain(session, StandInError("no room"))
    assert text.splitlines()[:2] == [
        "tfgpu_magic: StandIn ran out of memory on GPU 1 (StandIn dev:0, NVIDIA A100-SXM4-80GB).",
        "  StandIn's pool: 3 MiB in use",
    ]
    assert "    - shrink the pool" in text and "  Other processes on GPU 1:" in text


def test_gpu_on_enters_a_fourth_frameworks_scope_and_names_it_when_the_gpu_is_not_its():
    session, _ = four()
    with cells._gpu_scope(session, 1):
        assert session.standin.scopes == ["in"]
    assert session.standin.scopes == ["in", "out"]
    with pytest.raises(Exception, match=r"^GPU 2 is not visible to StandIn \(visible: GPU 1"):
        with cells._gpu_scope(session, 2):
            pass


def test_with_nothing_to_run_on_every_frameworks_scope_is_named_in_order():
    session, _ = four(Stage.NOT_IMPORTED)
    with pytest.raises(Exception) as err:
        with cells._gpu_scope(session, 0):
            pass
    assert str(err.value) == (
        "`%%gpu on` runs the cell under TensorFlow's tf.device, and TensorFlow is not imported: run "
        "`import tensorflow as tf` in an earlier cell (or `import torch`, or a first JAX operation, or "
        "`import standin`, for torch.cuda.device, jax.default_device, standin.on)"
    )


# -- the adapters' own parts ------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", [TensorFlow(), PyTorch(), Jax()], ids=lambda a: a.key)
def test_each_adapter_reports_nothing_of_itself_before_its_import(adapter):
    entry = adapter.report(ReportView())
    assert entry["stage"] == "not_imported" and adapter.status_lines(entry) == []
    assert adapter.in_force_lines(ReportView()) is None and adapter.listed_gpus(ReportView()) is None
    assert adapter.gpu_shares(ReportView()) == {} and adapter.started_gpus(ReportView()) is None
    assert adapter.gpu_scope(0, ReportView()) == (None, None)


def test_only_tensorflow_keeps_top_level_and_per_gpu_keys_of_its_own():
    tf = TensorFlow()
    entry = tf.report(ReportView())
    assert tf.report_keys(entry) == {"tensorflow": {"stage": "not_imported", "description": "not imported"}}
    assert tf.gpu_keys(None) == {
        "tensorflow_names": [],
        "tensorflow_in_use_bytes": None,
        "tensorflow_peak_bytes": None,
    }
    assert PyTorch().report_keys({}) == {} == Jax().gpu_keys(None)


def test_jaxs_limit_problem_is_its_adapters_and_reaches_its_entry():
    from tfgpu_magic.command import grammar

    session = Session(nvml=Nvml(lib=shared_server(ME)), env={})
    session.configure(grammar.parse("use 0,1"))
    session.configure(grammar.parse("limit 10G"))  # 25% of GPU 0, 12.5% of GPU 1: no one fraction
    problem = limit_problem(session.resolved())
    assert problem is not None and re.search(r"25% of GPU 0, 12% of GPU 1", problem)
    assert (
        Jax().report(ReportView(accepted=session.resolved()))["stage"] == "not_imported"
    )  # said once imported
