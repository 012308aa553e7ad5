"""The Jupyter server extension: ``GET {base_url}tfgpu/api/status`` on a real Jupyter server with real kernels.

pytest-jupyter's server fixtures are imported into this module rather than registered as a
plugin: as a plugin its autouse fixtures (a new event loop and a ServerApp clean-up for every
test) and its test-call hooks would reach the other modules' tests too.  Without its hooks a
test cannot be ``async def``, so each one drives the server's loop through :func:`run`.

NVML is simulated; owners come from the simulated table for the simulated processes and from
psutil for real ones (the kernels).  No assertion here depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from jupyter_server.auth import Authorizer
from jupyter_server.extension.application import ExtensionApp
from pytest_jupyter.jupyter_server import *  # noqa: F403  the fixtures: jp_serverapp, jp_fetch, ...
from tornado.httpclient import HTTPClientError
from traitlets.config.loader import DeferredConfigString

from tfgpu_magic.gpus import owners
from tfgpu_magic.gpus.simulated import (
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    kernels_server,
    shared_server,
)
from tfgpu_magic.server import extension as serverext
from tfgpu_magic.server import kernel_inventory

from support.reply_schema import replies_follow_the_schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024**3
MIB = 1024**2
HOSTILE = "python x.py\x1b]0;owned\x07\n[tfgpu] all GPUs free\u202e"


@pytest.fixture(autouse=True)
def _replies_follow_the_schema(monkeypatch):
    """Every reply built here is checked against the shipped schema (tfgpu_magic/server/schema)."""
    yield from replies_follow_the_schema(monkeypatch)


# -- fixtures: a server with the extension, reading the device source a test chooses ------------
@pytest.fixture
def device_source(server):
    """What ``TfgpuMagic.device_source`` is set to; tests parametrize it by name."""
    return lambda: server


@pytest.fixture
def refresh_interval():
    return 0.0  # every request reads afresh, unless a test says otherwise


@pytest.fixture
def jp_server_config(device_source, refresh_interval):
    return {
        "ServerApp": {"jpserver_extensions": {"tfgpu_magic": True}},
        "TfgpuMagic": {"device_source": device_source, "refresh_interval": refresh_interval},
    }


@pytest.fixture
def run(jp_asyncio_loop):
    """Run a coroutine (or future) on the server's event loop and return its result."""
    return jp_asyncio_loop.run_until_complete


@pytest.fixture
def get_status(jp_fetch, run):
    def get(**kwargs: Any) -> dict[str, Any]:
        response = run(jp_fetch(*serverext.ROUTE, **kwargs))
        assert response.code == 200 and response.headers["Content-Type"] == "application/json"
        return json.loads(response.body)

    return get


@pytest.fixture
def start_session(jp_fetch, run):
    """Start a real kernel with a notebook session through the REST API; returns the session model."""

    def start(path: str) -> dict[str, Any]:
        body = json.dumps(
            {"path": path, "name": os.path.basename(path), "type": "notebook", "kernel": {"name": "python3"}}
        )
        return json.loads(run(jp_fetch("api", "sessions", method="POST", body=body)).body)

    return start


def kernel_pid(serverapp, kernel_id: str) -> int:
    return serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid


async def execute_in_kernel(serverapp, kernel_id: str, code: str) -> str:
    """Run ``code`` in a real kernel of the server; returns what it printed."""
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        said: list[str] = []
        reply = await client.execute_interactive(
            code, timeout=60, output_hook=lambda msg: said.append(msg["content"].get("text", ""))
        )
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(said)


async def start_child_in_kernel(serverapp, kernel_id: str) -> int:
    """Have the kernel itself start ``sleep``: a real child process of the kernel; returns its pid."""
    code = "import subprocess; _child = subprocess.Popen(['sleep', '120']); print(_child.pid)"
    return int((await execute_in_kernel(serverapp, kernel_id, code)).strip())


def all_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*all_strings(k), *all_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in all_strings(v)]
    return []


# -- the endpoint with real kernels ------------------------------------------------------------
@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_a_kernel_reading_kernels_server_sees_what_the_panel_shows(
    jp_serverapp, get_status, start_session, run
):
    """One simulated server for both: the README's two recipes give the same figures (issue 16, item 6)."""
    first, second = start_session("a.ipynb"), start_session("b.ipynb")
    code = (
        "import tfgpu_magic\n"
        "from tfgpu_magic.simulated import kernels_server\n"
        "tfgpu_magic.set_device_source(kernels_server())\n"
        "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')\n"
        "get_ipython().run_line_magic('gpu', 'status --json')\n"
    )
    for session in (first, second):
        kernel_id = session["kernel"]["id"]
        report = json.loads(run(execute_in_kernel(jp_serverapp, kernel_id, code)))
        status = get_status()
        in_kernel = {
            str(g["index"]): g["usage"]["this_kernel_bytes"]
            for g in report["gpus"]
            if g["usage"]["this_kernel_bytes"]
        }
        on_panel = {k["id"]: k for k in status["kernels"]}[kernel_id]["gpu_memory_bytes"]
        assert in_kernel == on_panel and in_kernel  # e.g. {"1": 2 GiB} for the second kernel, in both
        assert [g["memory_used_bytes"] for g in report["gpus"]] == [
            g["memory_used_bytes"] for g in status["gpus"]
        ]


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:host_kernels_server"])
def test_a_kernel_reading_host_kernels_server_sees_what_the_panel_shows(
    jp_serverapp, get_status, start_session, run
):
    """The host-wide simulated server (JupyterHub's test): the kernel's %gpu and the panel agree on it."""
    from tfgpu_magic.gpus.simulated import HOST_KERNEL_MIB

    kernel_id = start_session("a.ipynb")["kernel"]["id"]
    code = (
        "import tfgpu_magic\n"
        "from tfgpu_magic.simulated import host_kernels_server\n"
        "tfgpu_magic.set_device_source(host_kernels_server())\n"
        "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')\n"
        "get_ipython().run_line_magic('gpu', 'status --json')\n"
    )
    report = json.loads(run(execute_in_kernel(jp_serverapp, kernel_id, code)))
    in_kernel = {
        str(g["index"]): g["usage"]["this_kernel_bytes"]
        for g in report["gpus"]
        if g["usage"]["this_kernel_bytes"]
    }
    on_panel = {k["id"]: k for k in get_status()["kernels"]}[kernel_id]["gpu_memory_bytes"]
    pid = kernel_pid(jp_serverapp, kernel_id)
    assert in_kernel == on_panel == {str(pid % 2): HOST_KERNEL_MIB[pid % 4] * MIB}


@pytest.mark.parametrize(
    "device_source", ["tfgpu_magic.simulated:kernels_server", "tfgpu_magic.simulated:host_kernels_server"]
)
def test_a_kernel_of_a_server_on_a_simulated_server_reads_it_without_being_told(
    jp_serverapp, get_status, start_session, run, device_source
):
    """Issue 29, 7: ``%load_ext tfgpu_magic; %gpu`` in a kernel of such a server reads the simulated
    server the panel shows (the server names it in the kernel's environment), not "no driver"."""
    start_session("a.ipynb")
    kernel_id = start_session("b.ipynb")["kernel"]["id"]
    code = (
        "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')\n"
        "get_ipython().run_line_magic('gpu', 'status --json')\n"
    )
    report = json.loads(run(execute_in_kernel(jp_serverapp, kernel_id, code)))
    status = get_status()
    assert [g["name"] for g in report["gpus"]] == [g["name"] for g in status["gpus"]]
    in_kernel = {
        str(g["index"]): g["usage"]["this_kernel_bytes"]
        for g in report["gpus"]
        if g["usage"]["this_kernel_bytes"]
    }
    on_panel = {k["id"]: k for k in status["kernels"]}[kernel_id]["gpu_memory_bytes"]
    assert in_kernel == on_panel and in_kernel
    if device_source.endswith(":kernels_server"):  # host_kernels_server's totals: every kernel of the machine
        used = [g["memory_used_bytes"] for g in status["gpus"]]
        assert [g["memory_used_bytes"] for g in report["gpus"]] == used


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_a_kernel_keeps_its_gpu_and_memory_when_another_stops(jp_serverapp, get_status, start_session, run):
    """Issue 29, 7: stopping a kernel (as the culler does) gives its memory back and renumbers no
    survivor, so the culler's log says what came back."""
    from tfgpu_magic.server.culler import memory_change_lines

    ids = [start_session(f"{name}.ipynb")["kernel"]["id"] for name in ("a", "b", "c")]
    before = get_status()
    held = {k["id"]: k["gpu_memory_bytes"] for k in before["kernels"]}
    assert held == {ids[0]: {"0": 1 * GIB}, ids[1]: {"1": 2 * GIB}, ids[2]: {"0": 3 * GIB}}  # in start order
    (first,) = [k for k in before["kernels"] if k["id"] == ids[0]]
    run(jp_serverapp.kernel_manager.shutdown_kernel(ids[0]))
    used_before = before["gpus"][0]["memory_used_bytes"]
    deadline = time.monotonic() + 30  # a bound on the driver's reading catching up, not a timing
    after = get_status()
    while after["gpus"][0]["memory_used_bytes"] == used_before and time.monotonic() < deadline:
        run(asyncio.sleep(0.2))
        after = get_status()
    assert {k["id"]: k["gpu_memory_bytes"] for k in after["kernels"]} == {i: held[i] for i in ids[1:]}
    assert after["gpus"][0]["memory_used_bytes"] == before["gpus"][0]["memory_used_bytes"] - GIB
    assert "(1,024 MiB back, the driver's reading)" in memory_change_lines(before, after, [first])[0]


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_real_kernels_and_a_kernels_child_hold_the_memory_the_simulated_driver_gives_them(
    jp_serverapp, get_status, start_session, run
):
    first, second = start_session("work/a.ipynb"), start_session("b.ipynb")
    pids = {s["kernel"]["id"]: kernel_pid(jp_serverapp, s["kernel"]["id"]) for s in (first, second)}
    child = run(start_child_in_kernel(jp_serverapp, first["kernel"]["id"]))
    try:
        status = get_status()
    finally:
        os.kill(child, signal.SIGKILL)  # started by this test, through the kernel

    me = owners.PsutilProcessTable().current_user()
    assert status["version"] == 1 and status["driver"] == {"available": True, "reason": None}
    assert status["user"] == me and status["refresh_interval_s"] == 0.0
    # kernels_server's rule: kernel n (by pid) holds n + 1 GiB on GPU n % 2; a kernel's child 256 MiB there.
    order = sorted(pids, key=pids.get)
    expected = {}
    for n, kernel_id in enumerate(order):
        held = (n + 1) * GIB + (256 * MIB if kernel_id == first["kernel"]["id"] else 0)
        expected[kernel_id] = {str(n % 2): held}
    kernels = {k["id"]: k for k in status["kernels"]}
    assert set(kernels) == set(pids)
    a, b = kernels[first["kernel"]["id"]], kernels[second["kernel"]["id"]]
    assert (a["path"], a["session_name"], a["session_type"], a["name"]) == (
        "work/a.ipynb",
        "a.ipynb",
        "notebook",
        "python3",
    )
    assert (b["path"], b["pid"], b["child_pids"]) == ("b.ipynb", pids[second["kernel"]["id"]], [])
    assert (a["pid"], a["child_pids"], a["note"]) == (pids[first["kernel"]["id"]], [child], None)
    for kernel_id, memory in expected.items():
        assert kernels[kernel_id]["gpu_memory_bytes"] == memory
        assert kernels[kernel_id]["total_gpu_memory_bytes"] == sum(memory.values())
    totals = [k["total_gpu_memory_bytes"] for k in status["kernels"]]
    assert totals == sorted(totals, reverse=True)  # most GPU memory first
    assert a["last_activity"].endswith("Z") and a["execution_state"] in ("idle", "busy", "starting")

    gpu0, gpu1 = status["gpus"][0], status["gpus"][1]
    assert gpu0["split"]["kernels_bytes"] == sum(m.get("0", 0) for m in expected.values())
    assert gpu1["split"]["kernels_bytes"] == sum(m.get("1", 0) for m in expected.values())
    assert (gpu0["split"]["others_bytes"], gpu1["split"]["my_other_bytes"]) == (30 * GIB, 4 * GIB)
    assert [(p["user"], p["command"]) for p in status["other_users"]] == [
        ("alice", "python train_resnet.py"),
        ("bob", "python finetune.py"),
    ]
    assert [p["command"] for p in status["my_other_processes"]] == ["python train.py --resume"]
    assert [p["gpu"] for p in status["unattributed"]] == [3]
    assert status["gpus"][3]["utilization_percent"] is None


def test_the_reply_is_refused_without_the_token(jp_fetch, run):
    for headers in ({"Authorization": ""}, {"Authorization": "token not-the-token"}):
        with pytest.raises(HTTPClientError) as refused:
            run(jp_fetch(*serverext.ROUTE, headers=headers))
        assert refused.value.code == 403


class NoKernelsForYou(Authorizer):
    """An authorizer that lets a user do anything but read kernels."""

    def is_authorized(self, handler, user, action, resource):
        return not (resource == "kernels" and action == "read")


@pytest.fixture
def authorizer_config(jp_server_config):
    jp_server_config["ServerApp"]["authorizer_class"] = NoKernelsForYou
    return jp_server_config


def test_a_user_who_may_not_read_kernels_may_not_read_the_reply(authorizer_config, jp_fetch, run):
    with pytest.raises(HTTPClientError) as refused:
        run(jp_fetch(*serverext.ROUTE))
    assert refused.value.code == 403


class HangingListing(SimulatedNvml):
    """One GPU whose process listing, once ``hang`` is set, waits up to 40 s (as a stuck driver)."""

    def __init__(self) -> None:
        super().__init__([SimulatedGpu(total_mib=1024)])
        self.hang = threading.Event()
        self.release = threading.Event()

    def _processes(self, handle, kind):
        if self.hang.is_set():
            self.release.wait(40)
        return super()._processes(handle, kind)


@pytest.fixture
def hanging():
    driver = HangingListing()
    yield driver
    driver.release.set()


@pytest.fixture
def hanging_config(jp_server_config, hanging):
    jp_server_config["TfgpuMagic"].update(
        device_source=lambda: hanging,
        reading_timeout=1.0,
        cull_idle_gpu_kernels_after=1.0,
        cull_interval=3600.0,
    )
    return jp_server_config


def get_within(jp_fetch, run, bound_s: float = 15.0) -> dict[str, Any]:
    """The reply, failing if it takes longer than a generous bound (the client's own is 20 s)."""
    return json.loads(run(asyncio.wait_for(jp_fetch(*serverext.ROUTE), bound_s)).body)


def test_a_hung_driver_gives_the_last_good_reading_with_a_note(
    hanging_config, hanging, jp_serverapp, get_status, jp_fetch, run
):
    """Issue 28, 4: a reading has a timeout; the handler never waits for a stuck driver."""
    good = get_status()
    assert good["driver"]["available"] and not good["notes"]
    hanging.hang.set()
    for _ in range(2):  # the second request comes while the first reading still hangs
        reply = get_within(jp_fetch, run)
        assert reply["gpus"] == good["gpus"] and reply["generated_at"] == good["generated_at"]
        assert any("did not answer within 1 s" in note for note in reply["notes"]), reply["notes"]
    # The culler's pass does not wait for the driver either, and culls nothing without a fresh reading.
    assert run(asyncio.wait_for(jp_serverapp.tfgpu_culler.check(), 15)) == []


def test_a_driver_hung_from_the_start_is_unavailable_timed_out(hanging_config, hanging, jp_fetch, run):
    hanging.hang.set()
    reply = get_within(jp_fetch, run)
    assert not reply["driver"]["available"] and "timed out" in reply["driver"]["reason"]


def pending_tasks_of_ours(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task]:
    """The loop's unfinished tasks that run tfgpu_magic's code or a reading's thread."""
    package = os.path.dirname(serverext.__file__).rsplit(os.sep, 1)[0]

    def ours(task: asyncio.Task) -> bool:
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        return coro.__qualname__ == "to_thread" or (code is not None and code.co_filename.startswith(package))

    return [task for task in asyncio.all_tasks(loop) if not task.done() and ours(task)]


def test_stopping_leaves_no_task_of_the_extension_pending(
    hanging_config, hanging, jp_serverapp, jp_fetch, run, jp_asyncio_loop
):
    """Issue 29, 5: the server's clean-up of its extensions ends the metrics' keep-warm task and the
    reading that hangs in its thread, so none is "destroyed but pending" when the loop closes."""
    run(jp_fetch(*serverext.ROUTE))  # a good reading first
    hanging.hang.set()
    assert run(jp_fetch("metrics")).code == 200  # starts the keep-warm refresh, whose reading now hangs
    run(asyncio.sleep(1.5))  # the refresh is under way (its reading will not answer)
    assert pending_tasks_of_ours(jp_asyncio_loop)  # the test's premise: the extension has tasks under way
    run(asyncio.wait_for(jp_serverapp.cleanup_extensions(), 30))
    assert pending_tasks_of_ours(jp_asyncio_loop) == []


@pytest.fixture
def bad_culler_config(jp_server_config, bad_setting):
    jp_server_config["TfgpuMagic"].update({"cull_min_gpu_memory": "1G", **bad_setting})
    return jp_server_config


@pytest.mark.parametrize(
    "bad_setting",
    [
        {"cull_interval": 0.5},
        {"cull_idle_gpu_kernels_after": -1.0},
        {"cull_idle_gpu_kernels_after": float("nan")},
        {"cull_idle_gpu_kernels_after": 60.0, "cull_min_gpu_memory": "lots"},
        # as the command line gives them (--TfgpuMagic.cull_interval=0.5): text a trait reads
        {
            "cull_idle_gpu_kernels_after": DeferredConfigString("60"),
            "cull_interval": DeferredConfigString("0.5"),
        },
    ],
    ids=["interval 0.5", "after -1", "after nan", "size lots", "command line"],
)
def test_a_bad_culler_setting_turns_only_the_culler_off(
    bad_culler_config, bad_setting, jp_serverapp, get_status, jp_fetch, run
):
    """Issue 28, 5: the panel's endpoint and the metrics stay on (the log line: the test below)."""
    status = get_status()
    assert status["culler"] is None and status["driver"]["available"]
    assert not hasattr(jp_serverapp, "tfgpu_culler")
    deadline = time.monotonic() + 20
    while b"tfgpu_gpu_memory_used_bytes{" not in (body := run(jp_fetch("metrics")).body):
        assert time.monotonic() < deadline, body.decode()[-2000:]
        run(asyncio.sleep(0.1))


def test_settings_are_checked_together_one_line_each_and_only_the_culler_goes_off(caplog):
    from traitlets.config import Config

    config = Config(
        {
            "TfgpuMagic": {
                "cull_interval": 0.5,
                "cull_idle_gpu_kernels_after": DeferredConfigString("nan"),
                "cull_min_gpu_memory": "lots",
                "refresh_interval": -1.0,
                "device_source": "x:y",
                "reading_timeout": DeferredConfigString("3"),
            }
        }
    )
    log = logging.getLogger("settings-test")
    with caplog.at_level(logging.WARNING, "settings-test"):
        settings, policy = serverext.load_settings(config, log)
    assert not policy.enabled
    assert (
        settings.refresh_interval == kernel_inventory.REFRESH_INTERVAL_S and settings.device_source == "x:y"
    )
    assert settings.reading_timeout == 3.0
    lines = caplog.messages
    assert len(lines) == 4, lines
    for name in ("cull_interval", "cull_idle_gpu_kernels_after", "cull_min_gpu_memory"):
        [line] = [line for line in lines if f"TfgpuMagic.{name}" in line]
        assert line.endswith("; the GPU idle culler is off"), line
    [line] = [line for line in lines if "TfgpuMagic.refresh_interval" in line]
    assert line.endswith(f"; {kernel_inventory.REFRESH_INTERVAL_S} s is used instead"), line


def test_command_line_settings_turn_the_culler_on():
    from traitlets.config import Config

    config = Config(
        {
            "TfgpuMagic": {
                "cull_idle_gpu_kernels_after": DeferredConfigString("3600"),
                "cull_interval": DeferredConfigString("5"),
            }
        }
    )
    settings, policy = serverext.load_settings(config, logging.getLogger("settings-test"))
    assert policy.enabled and policy.after_s == 3600.0 and settings.cull_interval == 5.0


def test_polling_does_not_count_as_activity(jp_serverapp, get_status):
    before = jp_serverapp.web_app.settings.get("api_last_activity")
    get_status()
    assert jp_serverapp.web_app.settings.get("api_last_activity") == before  # an idle server stays cullable


# -- faults are data, never an error page -----------------------------------------------------
@pytest.mark.parametrize("device_source", [lambda: SimulatedNvml([SimulatedGpu()], driver=False)])
def test_without_a_driver_the_reply_says_why_and_still_lists_the_kernels(get_status, start_session):
    session = start_session("a.ipynb")
    status = get_status()
    assert status["driver"]["available"] is False
    assert "Driver Not Loaded" in status["driver"]["reason"] and "\n" not in status["driver"]["reason"]
    assert status["gpus"] == [] and status["other_users"] == []
    [kernel] = status["kernels"]
    assert (kernel["id"], kernel["path"], kernel["gpu_memory_bytes"], kernel["total_gpu_memory_bytes"]) == (
        session["kernel"]["id"],
        "a.ipynb",
        {},
        None,
    )


@pytest.mark.parametrize("device_source", ["no_such_module:nothing", "tfgpu_magic.simulated"])
def test_a_wrong_device_source_is_said_in_the_reply_and_does_not_stop_the_server(get_status, device_source):
    status = get_status()
    assert status["driver"]["available"] is False
    assert status["driver"]["reason"].startswith(
        f"TfgpuMagic.device_source {device_source!r} could not be loaded ("
    )


def test_a_lost_gpu_is_marked_lost_with_nulls(server, get_status):
    assert get_status()["gpus"][1]["lost"] is False
    server.gpus[1].lost = True
    gpu = get_status()["gpus"][1]
    assert gpu["lost"] is True
    assert [
        gpu[k] for k in ("name", "uuid", "memory_used_bytes", "memory_total_bytes", "utilization_percent")
    ] == [None] * 5
    assert set(gpu["split"].values()) == {None}


@pytest.mark.parametrize("device_source", [kernels_server])
def test_a_kernel_that_dies_between_two_readings_is_never_an_error(
    jp_serverapp, jp_fetch, get_status, start_session, run
):
    doomed, shut = start_session("doomed.ipynb"), start_session("shut.ipynb")
    doomed_id, shut_id = doomed["kernel"]["id"], shut["kernel"]["id"]
    doomed_pid = kernel_pid(jp_serverapp, doomed_id)
    assert {k["id"] for k in get_status()["kernels"]} == {doomed_id, shut_id}

    os.kill(doomed_pid, signal.SIGKILL)  # a kernel of this test's server: it dies without a word
    run(jp_fetch("api", "kernels", shut_id, method="DELETE"))  # the other is shut down
    status = get_status()
    kernels = {k["id"]: k for k in status["kernels"]}
    assert shut_id not in kernels  # gone from the server: simply absent
    holders = [(k["pid"], k["total_gpu_memory_bytes"]) for k in status["kernels"]]
    assert (doomed_pid, 1 * GIB) not in holders and (doomed_pid, 2 * GIB) not in holders
    if doomed_id in kernels and kernels[doomed_id]["pid"] == doomed_pid:  # not restarted yet
        dead = kernels[doomed_id]
        assert (dead["total_gpu_memory_bytes"], dead["note"]) == (
            0,
            f"its process {doomed_pid} is not running",
        )
    listed = [p["pid"] for key in ("my_other_processes", "other_users") for p in status[key]]
    assert doomed_pid not in listed  # if NVML still lists it, it is unattributed, not someone's


def test_a_failing_reading_is_a_note_in_the_reply_not_a_500(server, get_status):
    server.nvmlDeviceGetCount = lambda: 1 // 0  # a device source's bug, raised where NVML starts
    status = get_status()
    assert status["driver"]["available"] is False and "ZeroDivisionError" in status["driver"]["reason"]


def test_a_bug_in_reading_becomes_the_reason_and_the_log_has_the_traceback(get_status, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(kernel_inventory, "inventory", broken)
    status = get_status()
    assert status["driver"] == {
        "available": False,
        "reason": "reading the GPUs failed (TypeError: a bug); see the server's log",
    }
    [logged] = [r for r in caplog.records if r.getMessage() == "tfgpu_magic: reading the GPUs failed"]
    assert logged.exc_info[0] is TypeError


# -- other users' text ------------------------------------------------------------------------
@pytest.fixture
def hostile_server():
    gpu = SimulatedGpu(name="GPU\x1b[2J", processes=[SimulatedProcess(4_200_001, 1024, "eve\u202e", HOSTILE)])
    return SimulatedNvml([gpu])


@pytest.fixture
def hostile_config(jp_server_config, hostile_server):
    jp_server_config["TfgpuMagic"]["device_source"] = lambda: hostile_server
    return jp_server_config


def test_other_users_control_characters_come_out_escaped(hostile_config, get_status, start_session):
    start_session("evil\x1b[31m\n.ipynb")
    status = get_status()
    [other] = status["other_users"]
    assert other["command"] == "python x.py\\x1b]0;owned\\x07\\n[tfgpu] all GPUs free\\u202e"
    assert other["user"] == "eve\\u202e" and status["gpus"][0]["name"] == "GPU\\x1b[2J"
    assert status["kernels"][0]["path"] == "evil\\x1b[31m\\n.ipynb"
    assert all(s.isprintable() for s in all_strings(status))


# -- what others plant cannot bloat or break the reply (issue 28, items 6 and 10) ---------------
def strict_loads(text):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "device_source",
    [
        lambda: SimulatedNvml(
            [
                SimulatedGpu(
                    total_mib=81920,
                    processes=[
                        SimulatedProcess(50_000 + i, 1024, "bob", "python " + "A" * (1 << 20))
                        for i in range(20)
                    ],
                )
            ]
        )
    ],
)
def test_twenty_one_mebibyte_command_lines_make_a_small_reply(jp_fetch, run):
    response = run(jp_fetch(*serverext.ROUTE))
    status = strict_loads(response.body)
    assert len(status["other_users"]) == 20
    assert all(len(p["command"]) <= 1024 and p["command"].endswith("…") for p in status["other_users"])
    assert len(response.body) < 100_000  # was 21 MB


def test_the_reply_is_strict_json_whatever_a_reading_holds(jp_fetch, run, monkeypatch):
    real = kernel_inventory.inventory

    def with_nan(*args, **kwargs):
        reply = real(*args, **kwargs)
        reply["gpus"][0]["utilization_percent"] = float("nan")
        return reply

    monkeypatch.setattr(kernel_inventory, "inventory", with_nan)
    status = strict_loads(run(jp_fetch(*serverext.ROUTE)).body)
    assert status["gpus"][0]["utilization_percent"] is None
    assert "not a finite number, written as null: gpus[0].utilization_percent (nan)" in status["notes"]


# -- many tabs, one reading ---------------------------------------------------------------------
class CountingNvml(SimulatedNvml):
    """Counts the compute-process listings: one per GPU per reading."""

    listings = 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.listings += 1
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


@pytest.fixture
def counting():
    return CountingNvml(shared_server().gpus)


@pytest.fixture
def counting_config(jp_server_config, counting):
    jp_server_config["TfgpuMagic"].update(device_source=lambda: counting, refresh_interval=3600.0)
    return jp_server_config


def test_many_concurrent_requests_cost_one_reading(counting_config, counting, jp_fetch, run):
    async def twenty():
        return await asyncio.gather(*(jp_fetch(*serverext.ROUTE) for _ in range(20)))

    replies = [json.loads(r.body) for r in run(twenty())]
    assert counting.listings == len(counting.gpus)  # one reading, however the requests interleaved
    assert len({r["generated_at"] for r in replies}) == 1 and replies[0]["refresh_interval_s"] == 3600.0


def test_requests_during_a_reading_wait_for_that_reading(run):
    """Interval 0, so only sharing the reading under way can spare the other 19."""
    release, calls = threading.Event(), []

    async def refresh():
        calls.append(1)
        return await asyncio.to_thread(lambda: release.wait(30) and len(calls))

    shared = serverext.SharedRefresh(refresh, interval=0.0)

    async def twenty():
        waiting = [asyncio.ensure_future(shared.get()) for _ in range(20)]
        await asyncio.sleep(0)  # every request has started and found the reading under way
        release.set()
        return await asyncio.gather(*waiting)

    assert run(twenty()) == [1] * 20
    assert calls == [1] and shared.refreshes == 1
    assert run(shared.get()) == 2  # interval 0: the next request reads again


def test_a_fresh_value_is_reused_until_the_interval_has_passed(run):
    now, made = [0.0], []

    async def refresh():
        made.append(now[0])
        return len(made)

    shared = serverext.SharedRefresh(refresh, interval=2.0, clock=lambda: now[0])
    assert [run(shared.get()) for _ in range(3)] == [1, 1, 1]
    now[0] = 1.9
    assert run(shared.get()) == 1
    now[0] = 2.0
    assert run(shared.get()) == 2 and made == [0.0, 2.0]


def test_a_cancelled_request_does_not_cancel_the_reading_others_wait_for(run):
    release = asyncio.Event()

    async def refresh():
        await release.wait()
        return "reading"

    shared = serverext.SharedRefresh(refresh, interval=60.0)

    async def scenario():
        gone, stays = asyncio.ensure_future(shared.get()), asyncio.ensure_future(shared.get())
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        release.set()
        return await stays, gone.cancelled()

    assert run(scenario()) == ("reading", True)


# -- packaging ----------------------------------------------------------------------------------
def test_the_extension_is_declared_as_an_extension_app_and_enabled_by_the_shipped_config():
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfgpu_magic; assert 'jupyter_server' not in sys.modules; "
            "points = tfgpu_magic._jupyter_server_extension_points(); "
            "print(points, sorted(m for m in ('jupyter_server', 'tornado', 'psutil', 'pynvml') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert probe.stdout.strip() == (
        "[{'module': 'tfgpu_magic.server.extension', 'app': <class 'tfgpu_magic.server.extension.GpuStatusApp'>}] "
        "['jupyter_server', 'tornado']"  # the server's own modules, imported only when the server asks
    ), probe.stderr
    assert issubclass(serverext.GpuStatusApp, ExtensionApp) and serverext.GpuStatusApp.name == "tfgpu_magic"
    with open(os.path.join(ROOT, "jupyter-config", "server-config", "tfgpu_magic.json")) as f:
        assert json.load(f) == {"ServerApp": {"jpserver_extensions": {"tfgpu_magic": True}}}


def test_all_is_honest():
    for module in (serverext, kernel_inventory):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
