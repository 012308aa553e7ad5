"""Prometheus metrics: the panel's reading as metric families, served on the server's own ``/metrics``.

The families are checked against the inventory reply they come from; the exposition text is
parsed back with prometheus_client's own parser, so a hostile label can be seen not to forge a
series.  On a real Jupyter server (pytest-jupyter), ``/metrics`` carries the same figures as
``GET tfgpu/api/status``, is refused without the token, and many scrapes cost one reading.
A real Prometheus scraping a real server is tests/test_prometheus.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from datetime import datetime, timezone
from typing import Any

import pytest
from jupyter_server.auth import Authorizer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pytest_jupyter.jupyter_server import *  # noqa: F403  the fixtures: jp_serverapp, jp_fetch, ...
from tornado.httpclient import HTTPClientError

from tfgpu_magic import __version__
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess, shared_server
from tfgpu_magic.server import extension as serverext
from tfgpu_magic.server import kernel_inventory, metrics
from tfgpu_magic.server.kernel_inventory import KernelDescription

GIB = 1024**3
HOSTILE = 'x"}\nfake_series{a="b"} 1\n\x1b]0;owned\x07'


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{family name: [(labels, value)]}`` of an exposition text, parsed as Prometheus would."""
    parsed: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed.setdefault(sample.name, []).append((sample.labels, sample.value))
    return parsed


def exposition(reply: dict[str, Any]) -> str:
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):
            return metrics.families(reply, __version__)

    registry.register(Fixed())
    return generate_latest(registry).decode()


def a_reply(path: str = "train.ipynb") -> dict[str, Any]:
    """An inventory of shared_server with one kernel: this process, holding memory on GPU 1."""
    kernel = KernelDescription(
        id="k1",
        name="python3",
        path=path,
        execution_state="idle",
        last_activity="2026-11-18T10:00:00.000000Z",
        pid=os.getpid(),
    )
    return kernel_inventory.inventory(
        Nvml(lib=shared_server(my_pid=os.getpid())), [kernel], clock=lambda: 1_795_000_000.0
    )  # 2026-11-18T11:06:40Z


# -- the families -----------------------------------------------------------------------------
def test_each_figure_is_the_replys():
    reply = a_reply()
    parsed = samples(exposition(reply))
    kernel = reply["kernels"][0]
    assert kernel["gpu_memory_bytes"]  # the kernel holds something, or this test proves nothing
    by_gpu = {labels["gpu"]: value for labels, value in parsed["tfgpu_kernel_gpu_memory_bytes"]}
    assert by_gpu == {gpu: float(size) for gpu, size in kernel["gpu_memory_bytes"].items()}
    labels = parsed["tfgpu_kernel_gpu_memory_bytes"][0][0]
    gpu = reply["gpus"][int(labels["gpu"])]
    assert labels == {
        "kernel_id": "k1",
        "kernel_name": "python3",
        "path": "train.ipynb",
        "gpu": str(gpu["index"]),
        "gpu_uuid": gpu["uuid"],
    }
    used = {labels["gpu"]: v for labels, v in parsed["tfgpu_gpu_memory_used_bytes"]}
    assert used == {str(g["index"]): float(g["memory_used_bytes"]) for g in reply["gpus"]}
    others = {labels["gpu"]: v for labels, v in parsed["tfgpu_other_users_gpu_memory_bytes"]}
    assert others == {str(g["index"]): float(g["split"]["others_bytes"]) for g in reply["gpus"]}
    assert parsed["tfgpu_reading_timestamp_seconds"] == [({}, 1_795_000_000.0)]
    assert parsed["tfgpu_server_info"] == [({"user": reply["user"], "version": __version__}, 1.0)]
    idle = 1_795_000_000.0 - datetime(2026, 11, 18, 10, tzinfo=timezone.utc).timestamp()
    assert idle == 4000.0
    assert parsed["tfgpu_kernel_idle_seconds"] == [
        ({"kernel_id": "k1", "kernel_name": "python3", "path": "train.ipynb"}, idle)
    ]


def test_an_unsupported_reading_is_absent_not_zero():
    reply = a_reply()
    reply["gpus"][3]["utilization_percent"] = None
    reply["gpus"][2]["memory_used_bytes"] = None  # a lost GPU
    parsed = samples(exposition(reply))
    assert "3" not in {labels["gpu"] for labels, _ in parsed["tfgpu_gpu_utilization_ratio"]}
    assert "2" not in {labels["gpu"] for labels, _ in parsed["tfgpu_gpu_memory_used_bytes"]}
    ratios = [v for _, v in parsed["tfgpu_gpu_utilization_ratio"]]
    assert ratios and all(0 <= v <= 1 for v in ratios)


def test_a_busy_kernel_is_idle_zero_seconds_and_a_starting_one_has_no_figure():
    reply = a_reply()
    reply["kernels"][0]["execution_state"] = "busy"
    assert samples(exposition(reply))["tfgpu_kernel_idle_seconds"][0][1] == 0.0
    reply["kernels"][0]["execution_state"] = "starting"
    assert "tfgpu_kernel_idle_seconds" not in samples(exposition(reply))


def test_a_hostile_notebook_path_or_process_name_forges_no_series():
    server = SimulatedNvml([SimulatedGpu(processes=[SimulatedProcess(4_000_001, 1024, "mallory", HOSTILE)])])
    kernel = KernelDescription(id="k1", name=HOSTILE, path=HOSTILE, execution_state="idle", pid=os.getpid())
    reply = kernel_inventory.inventory(Nvml(lib=server), [kernel])
    text = exposition(reply)
    parsed = samples(text)
    assert "fake_series" not in parsed
    assert all(name.startswith("tfgpu_") for name in parsed)
    assert "\x1b" not in text and "\x07" not in text
    paths = {labels["path"] for labels, _ in parsed.get("tfgpu_kernel_cull_due_timestamp_seconds", [])} | {
        labels.get("path") for labels, _ in parsed.get("tfgpu_kernel_gpu_memory_bytes", [])
    }
    assert all("\n" not in (p or "") for p in paths)


def test_in_another_pid_namespace_no_memory_is_said_to_be_a_kernels_or_another_users():
    server = SimulatedNvml(
        [SimulatedGpu(processes=[SimulatedProcess(4_000_001, 1024, "mallory", "x", alive=False)])]
    )
    kernel = KernelDescription(
        id="k1", name="python3", path="a.ipynb", execution_state="idle", pid=os.getpid()
    )
    reply = kernel_inventory.inventory(Nvml(lib=server), [kernel])
    assert reply["pids_visible"] is False
    parsed = samples(exposition(reply))
    assert (
        "tfgpu_other_users_gpu_memory_bytes" not in parsed and "tfgpu_kernel_gpu_memory_bytes" not in parsed
    )
    assert [v for _, v in parsed["tfgpu_gpu_memory_used_bytes"]] == [
        float(reply["gpus"][0]["memory_used_bytes"])
    ]


def test_without_a_login_no_kernels_path_or_id_is_served():
    parsed = samples(
        generate_latest_of(metrics.families(a_reply("secret/salaries.ipynb"), __version__, per_kernel=False))
    )
    assert not [name for name in parsed if name.startswith("tfgpu_kernel_")]
    assert "tfgpu_gpu_memory_used_bytes" in parsed


@pytest.fixture
def open_metrics_config(jp_server_config):
    jp_server_config["ServerApp"]["authenticate_prometheus"] = False
    return jp_server_config


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_unauthenticated_metrics_carry_no_per_kernel_series(open_metrics_config, jp_serverapp, jp_fetch, run):
    body = json.dumps(
        {"path": "secret.ipynb", "name": "s", "type": "notebook", "kernel": {"name": "python3"}}
    )
    run(jp_fetch("api", "sessions", method="POST", body=body))
    parsed = scrape_until(jp_fetch, run, "tfgpu_gpu_memory_used_bytes")
    assert "tfgpu_gpu_memory_used_bytes" in parsed
    assert not [name for name in parsed if name.startswith("tfgpu_kernel_")]


class NoKernelsForYou(Authorizer):
    """An authorizer that lets a user do anything but read kernels."""

    def is_authorized(self, handler, user, action, resource):
        return not (resource == "kernels" and action == "read")


@pytest.fixture
def barred_config(jp_server_config):
    jp_server_config["ServerApp"]["authorizer_class"] = NoKernelsForYou
    return jp_server_config


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_a_user_who_may_not_read_kernels_gets_no_per_kernel_series(
    barred_config, jp_serverapp, jp_fetch, run
):
    """Issue 28, 8: /metrics asks for the status endpoint's permission before it shows a kernel."""
    body = json.dumps(
        {"path": "secret/alice-thesis.ipynb", "name": "t", "type": "notebook", "kernel": {"name": "python3"}}
    )
    run(jp_fetch("api", "sessions", method="POST", body=body))
    with pytest.raises(HTTPClientError) as refused:
        run(jp_fetch(*serverext.ROUTE))
    assert refused.value.code == 403
    scrape_until(jp_fetch, run, "tfgpu_gpu_memory_used_bytes")
    deadline = time.monotonic() + 60
    while True:  # until the reading the scrape serves has the kernel's memory: then it would show it
        latest = metrics._installed._latest() or {}
        if any(k.get("total_gpu_memory_bytes") for k in latest.get("kernels", [])):
            break
        assert time.monotonic() < deadline, latest
        run(jp_fetch("metrics"))
        run(asyncio.sleep(0.2))
    text = run(jp_fetch("metrics")).body.decode()
    parsed = samples(text)
    assert "tfgpu_gpu_memory_used_bytes" in parsed
    assert not [name for name in parsed if name.startswith("tfgpu_kernel_")]
    assert "alice-thesis" not in text


def test_under_jupyterhub_the_user_is_the_hubs_name():
    reply = a_reply()
    [(labels, _)] = samples(generate_latest_of(metrics.families(reply, __version__, user="alice")))[
        "tfgpu_server_info"
    ]
    assert labels["user"] == "alice"


def generate_latest_of(families) -> str:
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):
            return families

    registry.register(Fixed())
    return generate_latest(registry).decode()


def test_without_a_driver_there_is_one_line_saying_so():
    reply = kernel_inventory.unavailable([], "NVML Shared Library Not Found")
    parsed = samples(exposition(reply))
    assert parsed["tfgpu_driver_available"] == [({}, 0.0)]
    assert "tfgpu_gpu_memory_used_bytes" not in parsed


# -- the collector: never a reading on the scrape's path ----------------------------------------
def test_a_scrape_never_waits_for_a_reading():
    """collect() runs on the server's loop (jupyter_server's handler is synchronous): it serves the
    last reading and starts a refresh task, even when that refresh never ends."""
    never = asyncio.Event()

    async def refresh_that_hangs():
        await never.wait()

    async def scrape():
        collector = metrics.GpuMetrics(
            lambda: None, refresh_that_hangs, 2.0, __version__, logging.getLogger("t")
        )
        first = list(collector.collect())
        assert first == []  # nothing read yet: no figures, and no wait
        warmer = collector._warmer
        assert warmer is not None and not warmer.done()
        warmer.cancel()

    asyncio.run(scrape())


def test_the_warm_reading_stops_after_the_last_scrape():
    now = [0.0]
    reads = []

    async def refresh():
        reads.append(now[0])
        now[0] += metrics.KEEP_WARM_S / 2

    async def scrape_once():
        collector = metrics.GpuMetrics(
            lambda: None, refresh, 0.0, __version__, logging.getLogger("t"), clock=lambda: now[0]
        )
        list(collector.collect())
        await asyncio.wait_for(collector._warmer, timeout=30)

    asyncio.run(scrape_once())
    assert len(reads) == 2  # at 0 and at half the keep-warm time; then nobody scraped for long enough


# -- on a real Jupyter server -----------------------------------------------------------------
@pytest.fixture
def device_source(server):
    return lambda: server


@pytest.fixture
def jp_server_config(device_source):
    return {
        "ServerApp": {"jpserver_extensions": {"tfgpu_magic": True}},
        "TfgpuMagic": {"device_source": device_source, "refresh_interval": 0.2},
    }


@pytest.fixture
def run(jp_asyncio_loop):
    return jp_asyncio_loop.run_until_complete


def scrape_until(jp_fetch, run, name: str, timeout: float = 20.0) -> dict[str, list]:
    """Scrape /metrics until ``name`` appears (the first scrape starts the reading)."""
    deadline = time.monotonic() + timeout
    while True:
        parsed = samples(run(jp_fetch("metrics")).body.decode())
        if name in parsed or time.monotonic() > deadline:
            return parsed
        run(asyncio.sleep(0.1))


@pytest.mark.parametrize("device_source", ["tfgpu_magic.simulated:kernels_server"])
def test_metrics_carry_the_panels_figures_for_real_kernels(jp_serverapp, jp_fetch, run):
    for path in ("a.ipynb", "b.ipynb"):
        body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
        run(jp_fetch("api", "sessions", method="POST", body=body))
    deadline = time.monotonic() + 60
    while True:  # both kernels' processes running and seen by the simulated driver
        status = json.loads(run(jp_fetch(*serverext.ROUTE)).body)
        if all(k["total_gpu_memory_bytes"] for k in status["kernels"]) or time.monotonic() > deadline:
            break
        run(asyncio.sleep(0.2))
    parsed = scrape_until(jp_fetch, run, "tfgpu_kernel_gpu_memory_bytes")
    status = json.loads(run(jp_fetch(*serverext.ROUTE)).body)
    scraped = {(labels["path"], labels["gpu"]): v for labels, v in parsed["tfgpu_kernel_gpu_memory_bytes"]}
    expected = {
        (k["path"], gpu): float(size)
        for k in status["kernels"]
        for gpu, size in k["gpu_memory_bytes"].items()
    }
    assert scraped == expected and {p for p, _ in scraped} == {"a.ipynb", "b.ipynb"}
    assert {labels["gpu"] for labels, _ in parsed["tfgpu_gpu_utilization_ratio"]} == {
        "0",
        "1",
        "2",
    }  # GPU 3 reports none
    assert "http_request_duration_seconds_count" in parsed  # jupyter_server's own metrics are still there


def test_metrics_are_refused_without_the_token(jp_fetch, run):
    with pytest.raises(HTTPClientError) as refused:
        run(jp_fetch("metrics", headers={"Authorization": ""}))
    assert refused.value.code == 403


class Counting(SimulatedNvml):
    reads = 0

    def nvmlDeviceGetMemoryInfo(self, handle):
        Counting.reads += 1  # once per reading: the server has one GPU
        return super().nvmlDeviceGetMemoryInfo(handle)


@pytest.mark.parametrize("device_source", [lambda: Counting([SimulatedGpu(total_mib=1024)])])
def test_many_scrapes_and_polls_cost_one_reading_per_interval(jp_serverapp, jp_fetch, run):
    scrape_until(jp_fetch, run, "tfgpu_gpu_memory_total_bytes")
    run(asyncio.sleep(0.3))  # the last reading is stale now: the crowd must cause one
    Counting.reads = 0
    started = time.monotonic()

    async def crowd():
        calls = [jp_fetch("metrics") for _ in range(20)] + [jp_fetch(*serverext.ROUTE) for _ in range(20)]
        await asyncio.gather(*calls)

    run(crowd())
    intervals = (time.monotonic() - started) / 0.2 + 2  # however long the crowd took, and the edges
    assert 0 < Counting.reads <= intervals
