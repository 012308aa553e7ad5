"""Issue 12, the kernel side of the panel: the shared interval, utilization, the GPUs the kernel
sees, and a terminal IPython (no front end: a line, and nothing started)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import allocator_figures, monitor
from tfgpu_magic.kernel import panels as opening
from tfgpu_magic.kernel.monitor import HAND_ON_S, THREAD_NAME, Hub, Sampler

from support.fakes import monitor_threads
from support.panel_wire import unpacked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ME = 4242
widget = pytest.importorskip("tfgpu_magic.kernel.widget")


class ManualSampler(Sampler):
    """A sampler whose thread never starts: the test ticks it, so messages are exact."""

    def start(self) -> None:
        pass


pytestmark = pytest.mark.usefixtures("no_leaked_sampler")


@pytest.fixture
def panels():
    """open(**kwargs) -> a MemoryPanel on a fake server whose sends are recorded in .sent."""
    hub, server, made = Hub(), shared_server(ME), []
    seen = {"visible": None}
    # each tick a hand-on's time on: a panel sends at most one message a hand-on (MAX_MESSAGES_PER_S)
    clock = itertools.count(1_700_000_000.0, HAND_ON_S).__next__

    def make():
        made.append(
            ManualSampler(Nvml(lib=server), ME, interval=0.5, clock=clock, visible=lambda: seen["visible"])
        )
        return made[-1]

    def open_one(**kwargs):
        panel = widget.MemoryPanel(hub, make, **kwargs)
        panel.sent = []
        panel.send = lambda content, buffers=None: panel.sent.append(unpacked(content, buffers))
        return panel

    open_one.hub, open_one.server, open_one.made, open_one.seen = hub, server, made, seen
    yield open_one
    hub.stop_all()


# -- item 12: one interval for every panel, and the panel says which ------------------------------
def test_a_panel_without_an_interval_joins_the_sampler_at_the_interval_in_force(panels):
    first = panels(interval=0.2)
    second = panels()  # `%gpu monitor` without --interval
    assert panels.made[0].interval == first.interval == second.interval == 0.2
    assert second.note == "joined the running sampler at its 0.2 s (--interval changes it for every panel)"
    assert first.note == ""


def test_the_first_panel_without_an_interval_samples_every_half_second(panels):
    panel = panels()
    assert panel.interval == panels.made[0].interval == 0.5 and panel.note == ""


def test_an_explicit_interval_changes_every_panel_and_says_so(panels):
    first = panels(interval=0.2)
    second = panels(interval=1.0)
    assert panels.made[0].interval == first.interval == 1.0
    assert second.note == "sampling every 1 s now, for every open panel (was 0.2 s)"
    assert first.note == "sampling every 1 s, as another panel asked (one sampler serves all)"
    first.interval = 0.5  # from the first panel's control: its own choice, no note
    assert first.note == "" and second.interval == 0.5


def test_the_grammar_leaves_the_interval_to_the_panel_when_none_is_given():
    from tfgpu_magic.command import grammar

    assert grammar.parse("monitor").interval is None
    assert grammar.parse("monitor --interval 0.5").interval == 0.5


# -- item 10: utilization per GPU, a gap where there is none ----------------------------------------
def test_utilization_goes_to_the_panel_per_gpu_and_a_missing_one_is_null(panels):
    panel = panels()
    panels.made[0].tick()
    panels.server.gpus[1].lost = True
    panels.made[0].tick()
    first, second = panel.sent
    util = {key: cols["util"] for key, cols in first["d"].items()}
    assert util == {"gpu0": [97], "gpu1": [35], "gpu2": [0], "gpu3": [None]}  # GPU 3 has no reading
    assert second["d"]["gpu1"]["util"] == [None]  # lost: a gap, never 0
    assert json.dumps(first).count("util") == 4  # one short column per GPU


def test_utilization_is_kept_in_the_history():
    s = ManualSampler(Nvml(lib=shared_server(ME)), ME)
    s.tick()
    assert [d.utilization_percent for d in s.latest().devices] == [97, 35, 0, None]


# -- item 11: the GPUs the kernel sees ---------------------------------------------------------------
def test_a_gpu_hidden_from_the_kernel_keeps_its_chart_with_a_note(panels, monkeypatch):
    monkeypatch.setattr(monitor, "SLOW_SOURCES_S", 0.0)  # re-read the visible GPUs on every tick
    panel = panels()
    panels.made[0].tick()
    assert [d["gone"] for d in panel.devices] == [None] * 4
    panels.seen["visible"] = [1]
    panels.made[0].tick()
    notes = {d["key"]: d["gone"] for d in panel.devices}
    assert notes == {
        "gpu0": widget.HIDDEN_GPU,
        "gpu1": None,
        "gpu2": widget.HIDDEN_GPU,
        "gpu3": widget.HIDDEN_GPU,
    }
    assert list(panel.sent[-1]["d"]) == ["gpu1"]
    panels.seen["visible"] = None  # shown again: the note goes
    panels.made[0].tick()
    assert [d["gone"] for d in panel.devices] == [None] * 4


def test_a_panel_opened_after_use_auto_charts_only_the_visible_gpus_with_their_titles(panels, monkeypatch):
    monkeypatch.setattr(monitor, "SLOW_SOURCES_S", 0.0)
    panels()
    panels.made[0].tick()
    panels.seen["visible"] = [1]
    panels.made[0].tick()
    late = panels()
    assert late.devices == [
        {"key": "gpu1", "label": "GPU 1 · NVIDIA A100-SXM4-80GB", "gpu": True, "gone": None}
    ]
    late._on_message(late, {"kind": "history"}, [])
    (history,) = late.sent
    assert list(history["d"]) == ["gpu1"] and len(history["t"]) == 2
    assert list(history["errors"]) == ["gpu1"]


def test_use_auto_hides_gpus_from_an_open_panel_and_a_later_one(gpu, monkeypatch):
    """The real path: the session's visible GPUs, changed by `%gpu use auto` on the simulated server."""
    monkeypatch.setattr(monitor, "SLOW_SOURCES_S", 0.0)
    panel = opening.open_panel(interval=0.1, window=60, display=False, session=gpu.session)
    try:
        sampler = monitor.active_sampler()
        sampler.tick()
        assert [d["key"] for d in panel.devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]
        gpu("use auto")
        visible = gpu.session.visible_gpus()
        assert visible and len(visible) < 4
        sampler.tick()
        hidden = [d["key"] for d in panel.devices if d["gone"] == widget.HIDDEN_GPU]
        assert hidden == [f"gpu{i}" for i in range(4) if i not in visible]
        late = opening.open_panel(display=False, session=gpu.session)
        assert [d["key"] for d in late.devices] == [f"gpu{i}" for i in visible]
        assert all(d["label"].startswith(f"GPU {d['key'][3:]} · ") for d in late.devices)
        assert late.interval == 0.1 and late.note.startswith("joined the running sampler at its 0.1 s")
    finally:
        monitor.stop_panels()


# -- item 14: a terminal IPython has no front end ----------------------------------------------------
TERMINAL = """
import json, threading
from IPython.{module} import {shell}
shell = {shell}.instance()
shell.run_line_magic("load_ext", "tfgpu_magic")
shell.run_line_magic("gpu", "monitor")
print(json.dumps({{"threads": [t.name for t in threading.enumerate()]}}))
"""


@pytest.mark.parametrize(
    "module, shell",
    [
        ("terminal.interactiveshell", "TerminalInteractiveShell"),
        ("core.interactiveshell", "InteractiveShell"),
    ],
)
def test_in_a_terminal_ipython_monitor_prints_one_line_and_starts_nothing(module, shell, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "IPYTHONDIR": str(tmp_path),
        "TFGPU_MAGIC_CLAIM_DIR": str(tmp_path),
    }
    code = TERMINAL.format(module=module, shell=shell)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.strip().splitlines()
    assert printed == [opening.NO_FRONT_END]
    assert THREAD_NAME not in json.loads(last)["threads"]
    assert "MemoryPanel" not in proc.stdout


def test_open_panel_outside_ipython_prints_the_line_and_returns_none(capsys):
    assert opening.open_panel(nvml=Nvml(lib=shared_server())) is None
    assert capsys.readouterr().out == opening.NO_FRONT_END + "\n"
    assert monitor.active_sampler() is None and monitor_threads() == []


# -- issue 16, item 5: TensorFlow found no GPU (a CPU build): the GPUs were not hidden ----------------
@pytest.mark.parametrize("typed", [[], ["use auto"]], ids=["no-use", "use-auto"])
def test_when_tensorflow_finds_no_gpu_the_charts_stay_and_say_why(gpu, monkeypatch, typed):
    from tfgpu_magic.frameworks.tensorflow import Stage

    monkeypatch.setattr(monitor, "SLOW_SOURCES_S", 0.0)
    for line in typed:
        gpu(line)
    shown = [f"gpu{i}" for i in gpu.session.visible_gpus()]  # what `%gpu use` left (all, or the chosen)
    panel = opening.open_panel(interval=0.1, window=60, display=False, session=gpu.session)
    try:
        sampler = monitor.active_sampler()
        sampler.tick()
        gpu.session.adapter("tensorflow").fake_stage, gpu.session.adapter("tensorflow").found = (
            Stage.ENUMERATED,
            [],
        )  # it listed none
        allocator_figures.publish(gpu.session)  # the cell ends: the kernel publishes what it read
        sample = sampler.tick()
        assert [d["key"] for d in panel.devices] == shown
        assert [d["gone"] for d in panel.devices] == [None] * len(shown)  # not "hidden by %gpu use"
        assert [d.key for d in sample.devices] == shown and all(d.used_bytes for d in sample.devices)
        assert sample.status == opening.FOUND_NO_GPU.format(name="TensorFlow")
        assert (
            sample.status
            == "TensorFlow found no GPU (`%gpu` says why); the charts show the driver's readings"
        )
        late = opening.open_panel(display=False, session=gpu.session)  # not "Nothing to chart"
        assert [d["key"] for d in late.devices] == shown
    finally:
        monitor.stop_panels()
