"""The panel's lifecycle: truthful stops, one sampler thread at most, no leaked widgets, bounded settings.

A slow reading is injected (a source that blocks until the test lets it go), as a hung NVML
call would be on a real server.
"""

from __future__ import annotations

import threading
import time

import pytest

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import monitor, panels
from tfgpu_magic.kernel.allocator_figures import NOTHING_READ, AllocatorFigures
from tfgpu_magic.kernel.monitor import MAX_INTERVAL_S, MIN_INTERVAL_S, Hub, Sampler

from support.fakes import monitor_threads, wait_for

ME = 4242


class Gate:
    """A source that blocks while closed: a GPU driver call that does not return."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def close(self) -> None:
        self.entered.clear()
        self.open.clear()

    def __call__(self) -> AllocatorFigures:
        if not self.open.is_set():
            self.entered.set()
            self.open.wait(20)
        return NOTHING_READ


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch):
    monkeypatch.setattr(monitor, "STOP_WAIT_S", 0.3, raising=False)  # a slow reading outlasts it
    yield
    monitor._hub.stop_all(timeout=5)
    wait_for(lambda: monitor_threads() == [])


# -- truthful stops ------------------------------------------------------------------------------
def test_a_stop_during_a_slow_reading_says_the_thread_still_runs():
    gate = Gate()
    s = Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1, figures=gate)
    s.start()
    wait_for(lambda: len(s.history) >= 1)
    gate.close()
    assert gate.entered.wait(5)
    assert s.stop(timeout=0.2) is False  # still inside the reading
    assert s.alive and not s.running
    gate.open.set()
    assert s.stop(timeout=5) is True
    assert not s.alive and monitor_threads() == []


def test_monitor_off_during_a_slow_reading_tells_the_truth_and_the_next_panel_reuses_the_thread():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    gate = Gate()
    fake = Nvml(lib=shared_server())
    panel = panels.open_panel(interval=0.1, window=60, nvml=fake, display=False, figures=gate)
    first = monitor.active_sampler()
    wait_for(lambda: len(first.history) >= 1)
    gate.close()
    assert gate.entered.wait(5)

    answer = monitor.stop_panels()
    assert answer.startswith("Stopped 1 memory panel; the sampling thread is still finishing a reading")
    assert "has ended" not in answer
    assert monitor.sampler_running() and len(monitor_threads()) == 1  # what the answer said
    assert not panel.running
    assert monitor.stop_panels() == (  # asked again while the reading still hangs
        "No memory panel is running in this kernel; the sampling thread is still finishing a reading "
        "(a GPU driver call that has not returned) and ends when it returns."
    )

    second = panels.open_panel(interval=0.1, window=60, nvml=fake, display=False)
    assert monitor.active_sampler() is first  # taken back, not a second thread beside it
    assert len(monitor_threads()) == 1
    gate.open.set()
    before = len(first.history)
    counts = []
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        counts.append(len(monitor_threads()))
        time.sleep(0.01)
    assert set(counts) == {1}
    assert len(first.history) > before  # sampling for the new panel
    assert second.running

    assert monitor.stop_panels() == (
        "Stopped 1 memory panel; the sampling thread has ended. `%gpu monitor` starts a new one."
    )
    assert not monitor.sampler_running()


def test_the_hub_never_runs_two_sampler_threads():
    gate = Gate()
    hub, made = Hub(), []

    def make():
        made.append(Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1, figures=gate))
        return made[-1]

    a, b = object(), object()
    s = hub.join(a, make, 60)
    wait_for(lambda: len(s.history) >= 1)
    gate.close()
    assert gate.entered.wait(5)
    assert hub.leave(a) is False  # the thread is still in its reading
    assert hub.sampler is None
    assert hub.join(b, make, 60) is s and len(made) == 1
    gate.open.set()
    wait_for(lambda: len(s.history) >= 3)
    assert len(monitor_threads()) == 1
    assert hub.leave(b) is True and monitor_threads() == []


def test_a_thread_that_ends_between_stop_and_reuse_is_started_afresh():
    hub = Hub()
    s = hub.join(object(), lambda: Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1), 60)
    wait_for(lambda: len(s.history) >= 1)
    first_thread = s._thread
    hub.stop_all()
    s.start()
    assert s._thread is not first_thread and s.running
    wait_for(lambda: len(s.history) >= 3)
    assert len(monitor_threads()) == 1
    s.stop()


# -- widgets and comms ----------------------------------------------------------------------------
def registries() -> tuple[int, int]:
    import comm
    from ipywidgets.widgets import widget

    return len(widget._instances), len(comm.get_comm_manager().comms)


def test_open_and_off_cycles_leave_no_widget_or_comm_behind():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    fake = Nvml(lib=shared_server())
    before = registries()
    for _ in range(5):
        opened = [panels.open_panel(interval=0.1, window=60, nvml=fake, display=False) for _ in range(2)]
        assert registries()[0] >= before[0] + 4  # each panel: its model and its Layout
        monitor.stop_panels()
        assert [p.running for p in opened] == [False, False]
        assert registries() == before
    assert monitor_threads() == []


def test_a_panel_stopped_by_its_button_stays_on_screen_until_monitor_off_closes_it():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    fake = Nvml(lib=shared_server())
    before = registries()
    panel = panels.open_panel(interval=0.1, window=60, nvml=fake, display=False)
    panel._on_message(panel, {"kind": "stop"}, [])
    assert not panel.running and panel.comm is not None  # frozen, still shown
    assert not monitor.sampler_running()
    assert monitor.stop_panels() == "No memory panel is running in this kernel; closed 1 stopped panel."
    assert panel.comm is None and registries() == before


def test_closing_a_panel_closes_its_layout_and_its_sidebar(shell, monkeypatch):
    pytest.importorskip("tfgpu_magic.kernel.widget")
    monkeypatch.setattr(panels, "_has_front_end", lambda: True)  # the test shell has no kernel
    fake = Nvml(lib=shared_server())
    before = registries()
    for sidebar in (False, True):
        panel = panels.open_panel(interval=0.1, window=60, nvml=fake, display=True, sidebar=sidebar)
        assert (panel.side_area is not None) is sidebar
        if sidebar:
            assert panel.side_area.child is panel
        panel.close()
        assert registries() == before
    panel = panels.open_panel(interval=0.1, window=60, nvml=fake, display=True, sidebar=True)
    monitor.stop_panels()
    assert registries() == before


def test_the_front_end_closing_the_model_releases_it_in_the_kernel():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    before = registries()
    panel = panels.open_panel(interval=0.1, window=60, nvml=Nvml(lib=shared_server()), display=False)
    import comm

    comm.get_comm_manager().comm_close(None, None, {"content": {"comm_id": panel.comm.comm_id, "data": {}}})
    assert not panel.running and not monitor.sampler_running()
    assert registries() == before


# -- bounded settings, a loop that survives -------------------------------------------------------
@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan"), 60.5, 1e9, 0.05, 0, -1])
def test_an_interval_outside_what_the_grammar_allows_is_refused(seconds):
    with pytest.raises(ValueError, match=r"interval must be from 0.1 s to 60 s"):
        Sampler(Nvml(lib=shared_server(ME)), ME, interval=seconds)
    s = Sampler(Nvml(lib=shared_server(ME)), ME)
    with pytest.raises(ValueError, match=r"interval must be from 0.1 s to 60 s"):
        s.interval = seconds
    assert s.interval == 0.5


def test_the_bounds_are_the_grammars():
    assert (MIN_INTERVAL_S, MAX_INTERVAL_S) == (0.1, 60.0)
    Sampler(Nvml(lib=shared_server(ME)), ME, interval=60)
    Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1)


@pytest.mark.parametrize("window", [float("inf"), float("nan"), 1e300, -5])
def test_any_window_gives_a_bounded_history(window):
    s = Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1, keep_s=window)
    assert 1 <= s.history.maxlen <= monitor.MAX_HISTORY
    s.keep(window)
    assert 1 <= s.history.maxlen <= monitor.MAX_HISTORY


class FlakyNvml(Nvml):
    """An NVML whose device count fails in a way the sampler does not expect, for a while."""

    def __init__(self, failures: int) -> None:
        super().__init__(lib=shared_server(ME))
        self.failures = failures
        self.calls = 0

    def device_count(self) -> int:
        self.calls += 1
        if 2 <= self.calls < 2 + self.failures:
            raise ZeroDivisionError("driver hiccup")
        return super().device_count()


def test_a_failing_tick_is_a_gap_with_a_note_and_the_loop_goes_on():
    s = Sampler(FlakyNvml(failures=2), ME, interval=0.1)
    s.start()
    try:
        wait_for(lambda: len(s.history) >= 5)
        assert s.running
    finally:
        s.stop()
    samples = s.snapshot()
    failed = samples[1]
    assert failed.status == "sampling failed (ZeroDivisionError: driver hiccup); trying again next tick"
    assert [d.key for d in failed.devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]  # the last devices, as gaps
    assert all(d.used_bytes is None and d.error == failed.status for d in failed.devices)
    assert samples[3].status is None and samples[3].devices[1].mine_bytes is not None


def test_a_tick_never_raises():
    s = Sampler(FlakyNvml(failures=1), ME, interval=0.1)
    s.tick()
    sample = s.tick()
    assert sample.status.startswith("sampling failed (ZeroDivisionError")


def test_a_refused_window_leaves_nothing_behind():
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    import traitlets

    before = registries()
    with pytest.raises(traitlets.TraitError, match="window"):
        panels.open_panel(interval=0.5, window=10 * 24 * 3600, nvml=Nvml(lib=shared_server()), display=False)
    assert registries() == before and monitor.active_sampler() is None
    # What ipywidgets' __del__ does to such a half-made panel: close() must have nothing to do.
    half_made = widget.MemoryPanel.__new__(widget.MemoryPanel)
    half_made.stop()
    half_made.close()


@pytest.mark.parametrize("name", ["interval", "window"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_setting_from_the_front_end_is_refused_and_the_panel_keeps_its_own(
    name, value, monkeypatch
):
    """Issue 28, item 11: a comm update `interval: NaN` passed the trait's bounds (NaN compares
    false to both), the sampler refused it with a traceback in the output area, and the panel kept
    NaN.  Now the panel keeps its value, the front end is sent it back, and nothing raises."""
    pytest.importorskip("tfgpu_magic.kernel.widget")
    panel = panels.open_panel(interval=0.2, window=60, nvml=Nvml(lib=shared_server()), display=False)
    sent: list = []
    monkeypatch.setattr(panel.comm, "send", lambda data=None, metadata=None, buffers=None: sent.append(data))
    before = getattr(panel, name)
    update = {"method": "update", "state": {name: value}, "buffer_paths": []}
    panel._handle_msg({"content": {"data": update}, "buffers": []})  # what ipywidgets does with the message
    assert getattr(panel, name) == before
    assert panel._sampler.interval == 0.2
    echoed = [d["state"][name] for d in sent if isinstance(d, dict) and name in d.get("state", {})]
    assert echoed and echoed[-1] == before  # the front end is told the value that stands
    import json

    for data in sent:  # every message is strict JSON (jupyter_client warned of a non-JSON float)
        json.dumps(data, allow_nan=False)


def test_the_panel_says_who_holds_its_limit_line_and_follows_each_cell():
    """Every limit shown says soft or hard: the chart's dashed limit line too (issue 31)."""
    from tfgpu_magic.command import grammar
    from tfgpu_magic.kernel import allocator_figures
    from tfgpu_magic.kernel.session import Session

    session = Session(nvml=Nvml(lib=shared_server()), env={})
    panel = panels.open_panel(interval=0.1, window=60, display=False, session=session)
    assert panel.limit_label == ""  # no limit, no line
    session.configure(grammar.parse("limit 2G"))
    allocator_figures.publish(session)  # what runs after each cell, on the user's thread
    assert panel.limit_label.startswith("soft (") and panel.limit_label.endswith("allocator)")
    assert panel.limit_label == session.limit_label()
    session.configure(grammar.parse("limit off"))
    allocator_figures.publish(session)
    assert panel.limit_label == ""
    panel.close()
