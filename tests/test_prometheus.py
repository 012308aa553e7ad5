"""A real Prometheus scraping real Jupyter servers' ``/metrics``, and the Grafana dashboard's queries.

Two ``jupyter server`` subprocesses on the simulated driver (``kernels_server``): one at ``/``
with one kernel, one at ``/user/alice/`` (where a JupyterHub single-user server answers) with two;
each kernel has run a cell, so it is idle.  The real ``prometheus`` binary (Debian's 2.42)
scrapes both every second with the documentation's own scrape configurations (only the addresses, the
token files and the interval changed), plus a job with a wrong token.  Assertions go through
Prometheus' HTTP API: what it stored is what ``GET tfgpu/api/status`` says, and every query of
the dashboard (``jupyter-config/grafana/tfgpu-dashboard.json``) returns data.

The culler's panel needs the GPU idle culler: the servers run it with an hour's idle time
(``TfgpuMagic.cull_idle_gpu_kernels_after=3600``), so every kernel has a due time and none is culled.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tfgpu_magic import __version__

from support.prometheus_stack import (
    DASHBOARD,
    LEAKY_PREFIXES,
    ROOT,
    Prometheus,
    Stack,
    as_grafana_sends,
    clean_env,
    dashboard,
    has_prometheus,
    panels,
)

needs_prometheus = pytest.mark.skipif(
    not has_prometheus(), reason="needs the prometheus binary (make setup installs it)"
)
CULLING_PANEL = "Kernels due for culling"


def by(series: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    """``{(label values...): value}`` of an instant vector."""
    return {tuple(s["metric"].get(label, "") for label in labels): float(s["value"][1]) for s in series}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    home = Path(tempfile.mkdtemp(prefix="tfgpu-prometheus-"))
    stack = Stack(home, culler=True)
    try:
        try:
            stack.start()
            stack.run_notebooks()
            stack.wait_for_every_kernel()
        except Exception as err:
            raise RuntimeError(f"the stack did not start: {err}\n{stack.logs()}") from err
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def prom(stack) -> Prometheus:
    assert stack.prometheus is not None
    return stack.prometheus


# -- what Prometheus stored is what the server says ---------------------------------------------
@pytest.mark.slow
@needs_prometheus
def test_each_kernels_memory_per_gpu_is_what_the_status_says(stack, prom):
    stored = by(
        prom.query("tfgpu_kernel_gpu_memory_bytes"),
        "instance",
        "kernel_id",
        "kernel_name",
        "path",
        "gpu",
        "gpu_uuid",
    )
    expected = {}
    for server in stack.servers:
        status = server.status()
        uuid = {str(gpu["index"]): gpu["uuid"] for gpu in status["gpus"]}
        for kernel in status["kernels"]:
            for gpu, size in kernel["gpu_memory_bytes"].items():
                key = (
                    stack.instance[id(server)],
                    kernel["id"],
                    kernel["name"],
                    kernel["path"],
                    gpu,
                    uuid[gpu],
                )
                expected[key] = float(size)
    assert len(expected) == 3 and all(
        expected.values()
    )  # three kernels holding memory, or this proves nothing
    assert stored == expected


@pytest.mark.slow
@needs_prometheus
def test_gpu_totals_used_and_utilization_are_the_servers_and_gpu_3_has_no_utilization(stack, prom):
    totals = by(prom.query("tfgpu_gpu_memory_total_bytes"), "instance", "gpu", "gpu_uuid", "name")
    used = by(prom.query("tfgpu_gpu_memory_used_bytes"), "instance", "gpu")
    utilization = by(prom.query("tfgpu_gpu_utilization_ratio"), "instance", "gpu")
    for server in stack.servers:
        instance = stack.instance[id(server)]
        gpus = server.status()["gpus"]
        assert {k: v for k, v in totals.items() if k[0] == instance} == {
            (instance, str(g["index"]), g["uuid"], g["name"]): float(g["memory_total_bytes"]) for g in gpus
        }
        assert {k: v for k, v in used.items() if k[0] == instance} == {
            (instance, str(g["index"])): float(g["memory_used_bytes"]) for g in gpus
        }
        assert {k: v for k, v in utilization.items() if k[0] == instance} == {
            (instance, str(g["index"])): g["utilization_percent"] / 100 for g in gpus if g["index"] != 3
        }
        assert [g["utilization_percent"] for g in gpus if g["index"] == 3] == [None]  # absent, not 0
    assert prom.query('tfgpu_gpu_utilization_ratio{gpu="3"}') == []


@pytest.mark.slow
@needs_prometheus
def test_server_info_reading_and_idle_kernels(stack, prom):
    info = by(prom.query("tfgpu_server_info"), "instance", "user", "version")
    assert info == {(stack.instance[id(s)], s.status()["user"], __version__): 1.0 for s in stack.servers}
    assert by(prom.query("tfgpu_driver_available"), "instance") == {
        (stack.instance[id(s)],): 1.0 for s in stack.servers
    }
    for _, read_at in by(prom.query("tfgpu_reading_timestamp_seconds"), "instance").items():
        assert abs(time.time() - read_at) < 30
    idle = by(prom.query("tfgpu_kernel_idle_seconds"), "instance", "path")
    assert sorted(path for _, path in idle) == ["eval.ipynb", "explore.ipynb", "train.ipynb"]
    assert all(0 <= seconds < 120 for seconds in idle.values())
    due = by(prom.query("tfgpu_kernel_cull_due_timestamp_seconds"), "path")
    assert len(due) == 3
    assert all(time.time() + 3000 < when < time.time() + 3700 for when in due.values())


@pytest.mark.slow
@needs_prometheus
def test_each_kernels_utilization_and_idle_memory_time_are_the_servers(stack, prom):
    """Issue 31, item 4: the kernels ran a cell and nothing since, so each is at 0% on its GPU (the
    simulated driver's process samples) and its memory-time held idle grows, as the status says."""
    keys = ("instance", "kernel_id", "path", "gpu", "gpu_uuid", "scope")
    stored = by(prom.query("tfgpu_kernel_gpu_utilization_ratio"), *keys)
    expected = {}
    for server in stack.servers:
        status = server.status()
        uuid = {str(gpu["index"]): gpu["uuid"] for gpu in status["gpus"]}
        for kernel in status["kernels"]:
            for gpu, figure in kernel["gpu_utilization"].items():
                key = (
                    stack.instance[id(server)],
                    kernel["id"],
                    kernel["path"],
                    gpu,
                    uuid[gpu],
                    figure["scope"],
                )
                expected[key] = figure["percent"] / 100
    assert len(expected) == 3 and set(expected.values()) == {0.0}  # three idle kernels, each on its GPU
    assert stored == expected
    idle = prom.wait_for("tfgpu_kernel_idle_gpu_memory_byte_seconds_total > 0", count=3, timeout=30)
    first = by(idle, "instance", "kernel_id")
    time.sleep(3)
    later = by(prom.query("tfgpu_kernel_idle_gpu_memory_byte_seconds_total"), "instance", "kernel_id")
    for key, value in first.items():
        server = next(s for s in stack.servers if stack.instance[id(s)] == key[0])
        kernel = next(k for k in server.status()["kernels"] if k["id"] == key[1])
        assert (
            value < later[key] <= kernel["idle_gpu_memory_byte_seconds"]
        )  # it grows; the server's is newest
        assert kernel["gpu_idle_since"] is not None
    assert prom.query("increase(tfgpu_kernel_idle_gpu_memory_byte_seconds_total[1m]) > 0")  # a team's waste


@pytest.mark.slow
@needs_prometheus
def test_without_the_token_metrics_is_refused_and_prometheus_says_403(stack, prom):
    for server in stack.servers:
        assert server.request("GET", "metrics", authorization=None)[0] == 403
        assert server.request("GET", "metrics", authorization="token not-the-token")[0] == 403
        status, body = server.request("GET", "metrics", authorization="Bearer")  # what Prometheus sends
        assert status == 200 and b"tfgpu_server_info{" in body
    health = {t["labels"]["job"]: t for t in prom.targets()}
    assert {job: t["health"] for job, t in health.items()} == {
        "jupyter": "up",
        "jupyterhub": "up",
        "wrong-token": "down",
    }
    assert "403" in health["wrong-token"]["lastError"]
    assert health["jupyterhub"]["scrapeUrl"].endswith("/user/alice/metrics")
    assert health["jupyterhub"]["labels"]["instance"] == f"{stack.alice.address}/user/alice"
    assert by(prom.query('up{job="wrong-token"}'), "job") == {("wrong-token",): 0.0}


# -- the dashboard ------------------------------------------------------------------------------
def targets_of(title: str) -> list[str]:
    [panel] = [p for p in panels() if p["title"] == title]
    return [t["expr"] for t in panel["targets"]]


def test_the_dashboard_is_a_grafana_10_dashboard_on_a_chosen_prometheus():
    board = dashboard()
    assert board["schemaVersion"] >= 38 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["DS_PROMETHEUS"]["type"] == "datasource"
        and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    )
    instance = variables["instance"]
    assert (instance["includeAll"], instance["allValue"], instance["multi"]) == (True, ".*", True)
    assert instance["definition"] == "label_values(tfgpu_server_info, instance)"
    titles = [p["title"] for p in panels(board)]
    assert sorted(titles) == sorted(
        [
            "GPU memory by notebook",
            "GPU memory by user",
            "GPU memory by GPU across hosts",
            "Idle kernels holding GPU memory",
            "Other users' memory per GPU",
            CULLING_PANEL,
            "Idle GPU memory by user",
        ]
    )
    assert len({p["id"] for p in panels(board)}) == len(titles)
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])
    assert "on (instance) group_left (user) tfgpu_server_info" in targets_of("GPU memory by user")[0]


@pytest.mark.slow
@needs_prometheus
@pytest.mark.parametrize("title", [p["title"] for p in panels()])
def test_every_panel_query_returns_data_from_the_real_prometheus(title, stack, prom):
    for expr in targets_of(title):
        result = prom.query(as_grafana_sends(expr))
        assert result, f"{title}: {as_grafana_sends(expr)} returned nothing"


@pytest.mark.slow
@needs_prometheus
def test_the_panels_add_up(stack, prom):
    """By notebook, by user and the instance variable give the figures the servers report."""
    notebooks = by(prom.query(as_grafana_sends(targets_of("GPU memory by notebook")[0])), "instance", "path")
    kernels = {
        (stack.instance[id(s)], k["path"]): float(k["total_gpu_memory_bytes"])
        for s in stack.servers
        for k in s.status()["kernels"]
    }
    assert notebooks == kernels
    users = by(prom.query(as_grafana_sends(targets_of("GPU memory by user")[0])), "user")
    assert users == {(stack.plain.status()["user"],): sum(kernels.values())}  # both servers run as this user
    only_alice = as_grafana_sends(
        targets_of("GPU memory by notebook")[0], {"instance": f"{stack.alice.address}/user/alice"}
    )
    assert sorted(path for _, path in by(prom.query(only_alice), "instance", "path")) == [
        "eval.ipynb",
        "train.ipynb",
    ]
    instances = prom.api("series", **{"match[]": "tfgpu_server_info"})
    assert sorted(s["instance"] for s in instances) == sorted(stack.instance.values())
    gpus = by(prom.query(as_grafana_sends(targets_of("GPU memory by GPU across hosts")[1])), "gpu_uuid")
    assert len(gpus) == 4  # one line per physical GPU, though two servers report each
    idle = by(prom.query(as_grafana_sends(targets_of("Idle GPU memory by user")[0])), "user")
    # the idle kernels' waste: both servers run as this user
    [(user,)] = idle
    assert user == stack.plain.status()["user"] and idle[(user,)] > 0


def test_grafana_variables_are_substituted_as_with_all_selected():
    assert as_grafana_sends('x{instance=~"$instance"}') == 'x{instance=~".*"}'
    assert as_grafana_sends('x{instance=~"${instance}"}', {"instance": "a"}) == 'x{instance=~"a"}'
    assert DASHBOARD.name == "tfgpu-dashboard.json"


# -- the set-up ---------------------------------------------------------------------------------
def test_a_started_servers_environment_inherits_nothing_from_the_shell(monkeypatch, tmp_path):
    for name, value in {
        "JUPYTER_TOKEN": "leaked",
        "JUPYTER_CONFIG_DIR": "/nowhere",
        "CUDA_VISIBLE_DEVICES": "7",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "IPYTHONDIR": "/nowhere",
        "JPY_SESSION_NAME": "x",
    }.items():
        monkeypatch.setenv(name, value)
    env = clean_env(tmp_path, ["/extra"])
    assert {k for k in env if k.startswith(LEAKY_PREFIXES)} == {
        "TF_CPP_MIN_LOG_LEVEL",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "IPYTHONDIR",
    }
    assert str(tmp_path) in env["JUPYTER_CONFIG_DIR"] and env["PYTHONPATH"].endswith("/extra")


@pytest.mark.slow
@needs_prometheus
def test_the_kernels_inherit_nothing_from_the_shell_either(stack):
    ours = {
        "TF_CPP_MIN_LOG_LEVEL",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTER_CONFIG_PATH",
        "IPYTHONDIR",
    }
    for server in stack.servers:
        for kernel in server.status()["kernels"]:
            environ = Path(f"/proc/{kernel['pid']}/environ").read_bytes().split(b"\0")
            names = {item.split(b"=", 1)[0].decode() for item in environ if b"=" in item}
            # The kernel's own (its connection, set by jupyter_client) are JPY_*; everything else is ours.
            assert {n for n in names if n.startswith(LEAKY_PREFIXES) and not n.startswith("JPY_")} <= ours


def test_make_setup_installs_prometheus_without_its_recommends():
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    plan = subprocess.run(
        ["make", "-n", "setup", "APT_BARE=prometheus"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert ".ci/apt-install --no-install-recommends prometheus" in plan
    assert "APT_BARE := $(if $(shell command -v prometheus),,prometheus)" in (ROOT / "Makefile").read_text()
