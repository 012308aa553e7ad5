"""The GPU-aware idle culler: its one rule, and real kernels on a real Jupyter server.

With real kernels (pytest-jupyter): an idle kernel holding memory past the limit is shut down
and logged with its notebook and the memory it held; a busy one, an idle one without GPU memory
and one under the minimum are not.  The culler's pass is run directly (``check``) rather than
waited for, so nothing here depends on timing but "idle longer than one second".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, ClassVar

import pytest
from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
from pytest_jupyter.jupyter_server import *  # noqa: F403  the fixtures: jp_serverapp, jp_fetch, ...
from traitlets import TraitError

from tfgpu_magic.gpus.simulated import LiveKernelsNvml, SimulatedGpu, SimulatedProcess
from tfgpu_magic.server import extension as serverext
from tfgpu_magic.server.activity import Activity, ActivityWatcher
from tfgpu_magic.server.culler import Culler, CullPolicy, LiveState, memory_change_lines, parse_iso_utc

GIB = 1024**3
NOW = 1_795_000_000.0  # 2026-11-18T11:06:40Z
AN_HOUR_AGO = "2026-11-18T10:06:40.000000Z"


def kernel(**fields: Any) -> dict[str, Any]:
    entry = {
        "id": "k",
        "name": "python3",
        "path": "a.ipynb",
        "execution_state": "idle",
        "last_activity": AN_HOUR_AGO,
        "gpu_memory_bytes": {"1": 8 * GIB},
        "total_gpu_memory_bytes": 8 * GIB,
    }
    return {**entry, **fields}


# -- the rule -----------------------------------------------------------------------------------
def test_off_by_default():
    assert CullPolicy().due_at(kernel(), {}) is None
    assert CullPolicy().describe() is None


def test_a_kernel_the_culler_will_never_shut_down_shows_no_due_time():
    """Not watched since its start (running before the extension loaded, or its messages cannot be
    read): the culler leaves it alone, so the panel and /metrics must not say it is due (review)."""
    reply = {"kernels": [kernel(id="watched"), kernel(id="unwatched")], "gpus": []}
    CullPolicy(after_s=1800).annotate(reply, cullable=lambda kernel_id: kernel_id == "watched")
    assert [k["cull_due_at"] is None for k in reply["kernels"]] == [False, True]


def test_an_idle_kernel_holding_memory_is_due_its_idle_limit_after_its_last_activity():
    assert CullPolicy(after_s=1800).due_at(kernel(), {}) == NOW - 3600 + 1800


@pytest.mark.parametrize(
    "entry",
    [
        kernel(execution_state="busy"),
        kernel(execution_state="starting"),
        kernel(gpu_memory_bytes={}, total_gpu_memory_bytes=0),
        kernel(gpu_memory_bytes={"1": None}, total_gpu_memory_bytes=None),  # unknown is not none
        kernel(last_activity=None),
    ],
    ids=["busy", "starting", "no GPU memory", "unknown memory", "no activity known"],
)
def test_never_due(entry):
    assert CullPolicy(after_s=1).due_at(entry, {}) is None


def test_under_the_minimum_is_never_due():
    assert CullPolicy(after_s=1, min_memory_bytes=16 * GIB).due_at(kernel(), {}) is None
    assert CullPolicy(after_s=1, min_memory_bytes=8 * GIB).due_at(kernel(), {}) is not None


def test_with_a_free_memory_threshold_only_a_kernel_on_a_short_gpu_is_due():
    policy = CullPolicy(after_s=1, free_below_bytes=10 * GIB)
    assert policy.due_at(kernel(), {"1": 30 * GIB, "2": 1 * GIB}) is None  # GPU 2 is short, but not its GPU
    assert policy.due_at(kernel(), {"1": 5 * GIB}) is not None
    assert policy.due_at(kernel(), {"1": None}) is None  # no reading: not short


@pytest.mark.parametrize("after_s", [2.6e11, 1e308])
def test_an_idle_limit_past_any_date_is_never_due_and_never_raises(after_s):
    """Issue 28, 5: beyond year 9999 a due time is no date; such a limit means "never"."""
    reply = {"gpus": [], "kernels": [kernel()]}
    CullPolicy(after_s=after_s).annotate(reply)
    assert reply["culler"]["idle_after_s"] == after_s
    assert reply["kernels"][0]["cull_due_at"] is None
    assert CullPolicy(after_s=after_s).due_at(kernel(), {}) is None


def test_the_reply_says_the_policy_and_when_each_kernel_is_due():
    reply = {"gpus": [], "kernels": [kernel(id="a"), kernel(id="b", execution_state="busy")]}
    CullPolicy(after_s=1800, min_memory_bytes=GIB).annotate(reply)
    assert reply["culler"] == {"idle_after_s": 1800, "min_memory_bytes": GIB, "free_below_bytes": None}
    assert [k["cull_due_at"] for k in reply["kernels"]] == ["2026-11-18T10:36:40.000000Z", None]


# -- one pass, with stand-ins for the server ----------------------------------------------------
class Server:
    def __init__(self, live: dict[str, tuple[str, float | None]]) -> None:
        self.live = live
        self.shut: list[str] = []

    async def shutdown(self, kernel_id: str) -> None:
        self.shut.append(kernel_id)
        self.live.pop(kernel_id)


def one_pass(entries: list[dict[str, Any]], live: dict[str, tuple[str, float | None]], caplog) -> list[str]:
    server = Server(live)
    before = {"gpus": [{"index": 1, "memory_used_bytes": 30 * GIB, "split": {}}], "kernels": entries}
    after = {"gpus": [{"index": 1, "memory_used_bytes": 22 * GIB, "split": {}}], "kernels": []}
    fresh_readings = iter([before, after])  # just before the shutdowns, then after them

    async def reading():
        return before

    async def fresh():
        return next(fresh_readings)

    def state(kernel_id: str) -> LiveState | None:
        return LiveState(*server.live[kernel_id]) if kernel_id in server.live else None

    culler = Culler(
        CullPolicy(after_s=60),
        reading,
        fresh,
        state,
        server.shutdown,
        logging.getLogger("culler-test"),
        clock=lambda: NOW,
    )
    with caplog.at_level(logging.WARNING, "culler-test"):
        return asyncio.run(culler.check())


def test_a_due_kernel_is_shut_down_and_the_log_says_what_it_held_and_what_came_back(caplog):
    read_at = NOW - 3600
    assert one_pass([kernel(id="a")], {"a": ("idle", read_at)}, caplog) == ["a"]
    assert (
        "shut down kernel a (a.ipynb, python3): idle 60 min while holding GPU memory (GPU 1: 8,192 MiB"
        in caplog.text
    )
    assert (
        "GPU 1: 30.0 GiB in use before the culling, 22.0 GiB after (8,192 MiB back, the driver's reading)"
        in caplog.text
    )


def test_a_kernel_that_ran_a_cell_since_the_reading_is_spared(caplog):
    assert one_pass([kernel(id="a")], {"a": ("busy", NOW - 3600)}, caplog) == []
    assert one_pass([kernel(id="a")], {"a": ("idle", NOW - 5)}, caplog) == []  # idle again, but active since
    assert one_pass([kernel(id="a")], {}, caplog) == []  # gone already
    assert caplog.text == ""


def test_memory_change_lines_without_a_reading_say_so():
    before = {"gpus": [{"index": 1, "memory_used_bytes": None}]}
    assert memory_change_lines(before, before, [kernel()]) == [
        "tfgpu_magic: GPU 1: no driver reading to show what the culling gave back"
    ]


def test_no_memory_is_said_to_come_back_unless_the_driver_shows_less_in_use():
    """Issue 28, 3: the same use before and after (or more) is no gain, and a listed pid is said."""
    before = {"pids_visible": True, "gpus": [{"index": 1, "memory_used_bytes": 30 * GIB}]}
    after = {
        "pids_visible": True,
        "gpus": [{"index": 1, "memory_used_bytes": 31 * GIB}],
        "unattributed": [{"gpu": 1, "pid": 42, "used_memory_bytes": 8 * GIB}],
    }
    assert memory_change_lines(before, after, [kernel(pid=42, child_pids=[])]) == [
        "tfgpu_magic: GPU 1: 30.0 GiB in use before the culling, 31.0 GiB after: the driver shows no memory freed yet",
        "tfgpu_magic: the driver still lists pid 42 of the culled kernels",
    ]


# -- what a kernel is doing, from its IOPub messages -----------------------------------------------
class Manager:
    """A kernel manager's message rule, as jupyter_server's (its default untracked types)."""

    untracked: ClassVar[set[str]] = set(
        MappingKernelManager.class_traits()["untracked_message_types"].default()
    )

    def track_message_type(self, message_type):
        return message_type not in self.untracked


def iopub(
    msg_type: str,
    parent_type: str | None = None,
    parent_id: str = "",
    subshell: str | None = None,
    **content: Any,
) -> dict[str, Any]:
    parent = (
        {} if parent_type is None else {"msg_type": parent_type, "msg_id": parent_id, "subshell_id": subshell}
    )
    return {"header": {"msg_type": msg_type}, "parent_header": parent, "content": content}


def watching(now: list[float]) -> tuple[ActivityWatcher, Activity]:
    return ActivityWatcher(Manager(), logging.getLogger("t"), clock=lambda: now[0]), Activity(0.0, True, 0.0)


def test_a_cell_is_under_way_from_its_busy_to_its_idle_whatever_other_statuses_say():
    watcher, activity = watching([10.0])
    watcher.record(activity, iopub("status", "execute_request", "e1", execution_state="busy"))
    for poll in ("usage_request", "list_subshell_request", "kernel_info_request", "comm_info_request"):
        for state in ("busy", "idle"):
            watcher.record(activity, iopub("status", poll, "p", execution_state=state))
    assert activity.busy
    watcher.record(activity, iopub("status", "execute_request", "e1", execution_state="idle"))
    assert not activity.busy


def test_a_lost_idle_is_healed_by_the_next_cell_of_the_same_shell_only():
    watcher, activity = watching([10.0])
    watcher.record(activity, iopub("status", "execute_request", "e1", execution_state="busy"))
    watcher.record(activity, iopub("execute_input", "execute_request", "s1", subshell="sub"))
    watcher.record(
        activity, iopub("status", "execute_request", "e2", execution_state="busy")
    )  # e1's idle was lost
    watcher.record(activity, iopub("status", "execute_request", "e2", execution_state="idle"))
    assert activity.executing == {"sub": "s1"}  # the subshell's cell still runs
    watcher.record(activity, iopub("status", "execute_request", "s1", subshell="sub", execution_state="idle"))
    assert not activity.busy
    watcher.record(activity, iopub("status", "execute_request", "e3", execution_state="busy"))
    watcher.record(activity, iopub("status", None, execution_state="starting"))  # restarted
    assert not activity.busy


def test_the_panels_messages_are_not_activity_and_the_users_are():
    now = [10.0]
    watcher, activity = watching(now)
    state = {"_anywidget_id": "tfgpu_magic.kernel.widget.MemoryPanel"}
    watcher.record(
        activity,
        iopub(
            "comm_open",
            "execute_request",
            "e1",
            comm_id="panel",
            target_name="jupyter.widget",
            data={"state": state},
        ),
    )
    watcher.record(activity, iopub("status", "execute_request", "e1", execution_state="idle"))
    assert activity.last_activity == 10.0
    now[0] = 20.0
    watcher.record(
        activity, iopub("comm_msg", "execute_request", "e1", comm_id="panel", data={"kind": "samples"})
    )
    watcher.record(activity, iopub("status", "usage_request", "u", execution_state="idle"))
    assert activity.last_activity == 10.0
    now[0] = 30.0
    watcher.record(
        activity, iopub("comm_msg", "execute_request", "e1", comm_id="someone-elses-widget", data={})
    )
    assert activity.last_activity == 30.0
    now[0] = 40.0
    watcher.record(activity, iopub("comm_close", "execute_request", "e1", comm_id="panel"))
    watcher.record(
        activity, iopub("comm_msg", "execute_request", "e1", comm_id="panel", data={})
    )  # closed: not a panel now
    assert activity.last_activity == 40.0 and not activity.panels


# -- real kernels on a real server ----------------------------------------------------------------
class ChosenKernels(LiveKernelsNvml):
    """One 40 GiB GPU on which the test chooses how much each kernel's process holds."""

    def __init__(self) -> None:
        super().__init__([SimulatedGpu(total_mib=40960)], kernel_gpus=1, scan_ttl_s=0.0)
        self.held_mib: dict[int, int] = {}

    def live_processes(self) -> dict[int, list[SimulatedProcess]]:
        return {0: [SimulatedProcess(pid, mib, user="", command="") for pid, mib in self.held_mib.items()]}


@pytest.fixture
def chosen():
    return ChosenKernels()


@pytest.fixture
def refresh_interval():
    return 0.0  # every reading afresh, unless a test says otherwise


@pytest.fixture
def jp_server_config(chosen, refresh_interval):
    return {
        "ServerApp": {"jpserver_extensions": {"tfgpu_magic": True}},
        "TfgpuMagic": {
            "device_source": lambda: chosen,
            "refresh_interval": refresh_interval,
            "cull_idle_gpu_kernels_after": 1.0,
            "cull_min_gpu_memory": "2G",
            "cull_interval": 3600.0,  # this test runs the passes itself
        },
    }


@pytest.fixture
def run(jp_asyncio_loop):
    return jp_asyncio_loop.run_until_complete


def start_kernel(jp_fetch, run, path: str) -> str:
    body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
    return json.loads(run(jp_fetch("api", "sessions", method="POST", body=body)).body)["kernel"]["id"]


async def connect(serverapp, kernel_id: str) -> Any:
    """A client that has had the kernel's first reply, as a notebook opened in a browser has: until
    a client asks something, jupyter_server keeps a kernel "starting"."""
    kernel = serverapp.kernel_manager.get_kernel(kernel_id)
    client = kernel.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    deadline = time.monotonic() + 60
    while kernel.execution_state == "starting" and time.monotonic() < deadline:
        # The server's IOPub subscription may have joined after that reply: ask again, as
        # jupyter_server's own "nudge" does for a browser's connection.
        client.kernel_info()
        await asyncio.sleep(0.2)
    return client


def wait_for(run, condition, timeout: float = 60.0, said=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {said()}"
        run(asyncio.sleep(0.1))


def test_only_an_idle_kernel_holding_enough_memory_is_culled(jp_serverapp, jp_fetch, run, chosen, caplog):
    manager = jp_serverapp.kernel_manager
    ids = {
        path: start_kernel(jp_fetch, run, path)
        for path in ("idle_big.ipynb", "busy_big.ipynb", "idle_none.ipynb", "idle_small.ipynb")
    }
    pid = {path: manager.get_kernel(k).provisioner.pid for path, k in ids.items()}
    chosen.held_mib = {
        pid["idle_big.ipynb"]: 4096,
        pid["busy_big.ipynb"]: 4096,
        pid["idle_small.ipynb"]: 1024,
    }
    clients = [run(connect(jp_serverapp, k)) for k in ids.values()]
    clients[1].execute("import time; time.sleep(120)")  # busy_big, busy for the rest of the test
    try:
        wait_for(
            run,
            lambda: manager.get_kernel(ids["busy_big.ipynb"]).execution_state == "busy",
            said=lambda: {p: manager.get_kernel(k).execution_state for p, k in ids.items()},
        )
        wait_for(
            run,
            lambda: all(
                manager.get_kernel(ids[p]).execution_state == "idle"
                for p in ("idle_big.ipynb", "idle_none.ipynb", "idle_small.ipynb")
            ),
            said=lambda: {p: manager.get_kernel(k).execution_state for p, k in ids.items()},
        )
        run(asyncio.sleep(1.5))  # idle past the limit
        status = json.loads(run(jp_fetch(*serverext.ROUTE)).body)
        due = {k["path"]: k["cull_due_at"] for k in status["kernels"]}
        assert status["culler"]["idle_after_s"] == 1.0 and status["culler"]["min_memory_bytes"] == 2 * GIB
        assert due["idle_big.ipynb"] is not None
        assert due["busy_big.ipynb"] is due["idle_none.ipynb"] is due["idle_small.ipynb"] is None
        with caplog.at_level(logging.WARNING):
            culled = run(jp_serverapp.tfgpu_culler.check())
        assert culled == [ids["idle_big.ipynb"]]
        assert sorted(manager.list_kernel_ids()) == sorted(v for p, v in ids.items() if p != "idle_big.ipynb")
        assert f"shut down kernel {ids['idle_big.ipynb']} (idle_big.ipynb, python3)" in caplog.text
        assert "GPU 0: 4,096 MiB, the driver's reading before the shutdown" in caplog.text
    finally:
        for client in clients:
            client.stop_channels()


def status_of(jp_fetch, run, kernel_id: str) -> dict[str, Any]:
    status = json.loads(run(jp_fetch(*serverext.ROUTE)).body)
    return next(k for k in status["kernels"] if k["id"] == kernel_id)


def warnings_about(caplog, kernel_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and kernel_id in r.getMessage()]


def test_a_kernel_running_a_long_silent_cell_is_never_culled_whatever_control_requests_say(
    jp_serverapp, jp_fetch, run, chosen, caplog
):
    """Issue 28, 1: jupyter-resource-usage's ``usage_request`` (or a ``list_subshell_request``),
    answered on the control channel while a cell runs, makes jupyter_server record "idle"."""
    manager = jp_serverapp.kernel_manager
    kernel_id = start_kernel(jp_fetch, run, "training.ipynb")
    chosen.held_mib = {manager.get_kernel(kernel_id).provisioner.pid: 4096}
    client = run(connect(jp_serverapp, kernel_id))
    try:
        client.execute("import time; time.sleep(300)")  # a training step that prints nothing
        wait_for(run, lambda: manager.get_kernel(kernel_id).execution_state == "busy")
        for request in ("usage_request", "list_subshell_request"):
            client.control_channel.send(client.session.msg(request, {}))
        # What the attack relies on: the server now takes the kernel for idle.
        wait_for(run, lambda: manager.get_kernel(kernel_id).execution_state == "idle")
        run(asyncio.sleep(1.5))  # past the one-second limit, and nothing on IOPub since
        entry = status_of(jp_fetch, run, kernel_id)
        assert entry["total_gpu_memory_bytes"] == 4096 * 1024**2
        assert (entry["execution_state"], entry["cull_due_at"]) == ("busy", None)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                assert run(jp_serverapp.tfgpu_culler.check()) == []
                client.control_channel.send(client.session.msg("usage_request", {}))
                run(asyncio.sleep(0.5))
        assert kernel_id in manager.list_kernel_ids()
        assert "shut down kernel" not in caplog.text
    finally:
        client.stop_channels()


PANEL_CELL = (
    "import tfgpu_magic\n"
    "from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml\n"
    "tfgpu_magic.set_device_source(SimulatedNvml([SimulatedGpu(total_mib=1024)]))\n"
    "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')\n"
    "get_ipython().run_line_magic('gpu', 'monitor')"
)


def test_an_open_monitor_whose_browser_is_gone_does_not_keep_a_kernel_alive(
    jp_serverapp, jp_fetch, run, chosen, caplog
):
    """Issue 28, 2: the panel's messages (a heartbeat a second) are its own traffic, not the user's."""
    manager = jp_serverapp.kernel_manager
    kernel_id = start_kernel(jp_fetch, run, "left_open.ipynb")
    chosen.held_mib = {manager.get_kernel(kernel_id).provisioner.pid: 4096}
    client = run(connect(jp_serverapp, kernel_id))
    try:
        reply = run(client.execute_interactive(PANEL_CELL, timeout=60, output_hook=lambda msg: None))
        assert reply["content"]["status"] == "ok", reply["content"]
        finished = time.time()
        client.stop_channels()  # the browser is gone; the panel's sampler goes on sending
        # What the attack relies on: to jupyter_server the panel's messages are activity.
        wait_for(run, lambda: serverext.epoch(manager.get_kernel(kernel_id).last_activity) > finished + 2.0)
        with caplog.at_level(logging.WARNING):
            culled = run(jp_serverapp.tfgpu_culler.check())
        assert culled == [kernel_id]
        assert kernel_id not in manager.list_kernel_ids()
        assert f"shut down kernel {kernel_id} (left_open.ipynb, python3)" in caplog.text
    finally:
        client.stop_channels()


@pytest.mark.parametrize("refresh_interval", [30.0])
def test_a_kernel_whose_memory_is_gone_is_not_culled_and_no_gain_is_claimed(
    jp_serverapp, jp_fetch, run, chosen, caplog
):
    """Issue 28, 3: the culler decides from a reading made just before the shutdown, and says
    memory came back only where the driver's readings before and after show it."""
    manager = jp_serverapp.kernel_manager
    kernel_id = start_kernel(jp_fetch, run, "released.ipynb")
    pid = manager.get_kernel(kernel_id).provisioner.pid
    chosen.held_mib = {pid: 4096}
    client = run(connect(jp_serverapp, kernel_id))
    try:
        wait_for(run, lambda: manager.get_kernel(kernel_id).execution_state == "idle")
        run(asyncio.sleep(1.5))  # idle past the limit
        assert status_of(jp_fetch, run, kernel_id)["cull_due_at"] is not None  # the shared reading, kept 30 s
        chosen.held_mib = {}  # the kernel released its memory: the driver no longer lists it
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert run(jp_serverapp.tfgpu_culler.check()) == []
        assert kernel_id in manager.list_kernel_ids()
        assert not [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and "tfgpu" in r.getMessage()
        ]
    finally:
        client.stop_channels()


def test_no_gain_is_claimed_while_the_driver_still_lists_the_culled_kernel(
    jp_serverapp, jp_fetch, run, chosen, caplog
):
    manager = jp_serverapp.kernel_manager
    kernel_id = start_kernel(jp_fetch, run, "released.ipynb")
    pid = manager.get_kernel(kernel_id).provisioner.pid
    chosen.held_mib = {pid: 4096}  # and the simulated driver lists it after the kernel exits, too
    client = run(connect(jp_serverapp, kernel_id))
    try:
        wait_for(run, lambda: manager.get_kernel(kernel_id).execution_state == "idle")
        run(asyncio.sleep(1.5))  # idle past the limit
        with caplog.at_level(logging.WARNING):
            assert run(jp_serverapp.tfgpu_culler.check()) == [kernel_id]
        assert "GPU 0: 4,096 MiB, the driver's reading before the shutdown" in caplog.text
        assert "back" not in caplog.text
        assert (
            "GPU 0: 4,396 MiB in use before the culling, 4,396 MiB after: the driver shows no memory freed yet"
            in caplog.text
        )
        assert f"the driver still lists pid {pid}" in caplog.text
    finally:
        client.stop_channels()


def test_a_hung_or_failing_shutdown_never_stops_the_culler(
    jp_serverapp, jp_fetch, run, chosen, caplog, monkeypatch
):
    """Issue 28, 4: each shutdown has a timeout; a hung one is one note and the other due kernels
    are still culled; a failing one is one warning, not a traceback every pass."""
    manager = jp_serverapp.kernel_manager
    ids = {
        path: start_kernel(jp_fetch, run, path) for path in ("a_hangs.ipynb", "b_fails.ipynb", "c_goes.ipynb")
    }
    chosen.held_mib = {manager.get_kernel(k).provisioner.pid: 4096 for k in ids.values()}
    clients = [run(connect(jp_serverapp, k)) for k in ids.values()]
    original = manager.shutdown_kernel

    async def shutdown(kernel_id, *args, **kwargs):
        if kernel_id == ids["a_hangs.ipynb"]:
            await asyncio.Event().wait()  # never returns
        if kernel_id == ids["b_fails.ipynb"]:
            raise RuntimeError("the provisioner refused")
        return await original(kernel_id, *args, **kwargs)

    monkeypatch.setattr(manager, "shutdown_kernel", shutdown)
    culler = jp_serverapp.tfgpu_culler
    culler.shutdown_timeout_s = 2.0
    try:
        wait_for(run, lambda: all(manager.get_kernel(k).execution_state == "idle" for k in ids.values()))
        run(asyncio.sleep(1.5))
        with caplog.at_level(logging.WARNING):
            culled = [run(asyncio.wait_for(culler.check(), 60)) for _ in range(3)]  # a bound, not a timing
        assert culled == [[ids["c_goes.ipynb"]], [], []]
        assert len(warnings_about(caplog, ids["a_hangs.ipynb"])) == 1
        assert "did not finish in 2 s" in warnings_about(caplog, ids["a_hangs.ipynb"])[0].getMessage()
        [failed] = warnings_about(caplog, ids["b_fails.ipynb"])
        assert "RuntimeError: the provisioner refused" in failed.getMessage() and failed.exc_info is None
    finally:
        for client in clients:
            client.stop_channels()


def test_the_culler_and_the_watch_stop_with_the_server(jp_serverapp, run):
    manager = jp_serverapp.kernel_manager
    started = jp_serverapp.tfgpu_extension
    assert started.callback.is_running() and "start_watching_activity" in vars(manager)  # wrapped
    run(jp_serverapp.cleanup_extensions())
    assert not started.callback.is_running() and "start_watching_activity" not in vars(manager)


def test_a_naive_kernel_manager_time_is_utc_whatever_the_local_zone(monkeypatch):
    """The live check and the reading must agree on a naive time, or a kernel that just ran a cell
    could look idle for hours on a host east of UTC."""
    from datetime import datetime, timezone

    from tfgpu_magic.server.culler import epoch
    from tfgpu_magic.server.kernel_inventory import iso_utc

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        naive = datetime(2026, 11, 18, 10, 6, 40)
        assert epoch(naive) == epoch(naive.replace(tzinfo=timezone.utc)) == NOW - 3600
        assert parse_iso_utc(iso_utc(naive)) == epoch(naive)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize("setting", ["lots", "50%", "4G,8G"])
def test_a_wrong_size_setting_is_one_line_naming_it(setting):
    with pytest.raises(TraitError) as refused:
        serverext.TfgpuMagic(cull_min_gpu_memory=setting).cull_policy()
    assert str(refused.value) == (
        f'TfgpuMagic.cull_min_gpu_memory {setting!r} is not a size (like "1G", "512M", or a bare number of MiB)'
    )


@pytest.mark.parametrize("trait", ["refresh_interval", "cull_idle_gpu_kernels_after", "cull_interval"])
def test_not_a_number_of_seconds_is_refused(trait):
    with pytest.raises(TraitError, match=f"TfgpuMagic.{trait} must be a number of seconds, not nan"):
        serverext.TfgpuMagic(**{trait: float("nan")})
