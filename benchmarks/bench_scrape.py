"""What a Prometheus scrape of ``/metrics`` costs, beside jupyter-resource-usage's ``/api/metrics/v1``, with 20 real kernels.

Run by hand: ``.venv/bin/python benchmarks/bench_scrape.py [--kernels 20] [--rounds 300]``.
Prints medians and 95th percentiles, the ratio last; no assertions.

Part 1, in this process: the exposition text of tfgpu_magic's collector alone
(``metrics.families`` of one inventory reply, then ``prometheus_client.generate_latest``) for
20 kernels on ``simulated.busy_server`` (8 GPUs, 40 processes of five users): the work our
collector adds to every scrape.

Part 2, over HTTP: one real ``jupyter server`` (``servers.JupyterServer``: loopback, a token, the
extension enabled by the shipped file, refresh interval 0.5 s) with jupyter-resource-usage enabled
too, and ``--kernels`` real kernels, on ``compare.py``'s stand-in NVML (``standin.KernelsFromFile``:
8 GPUs listing the kernels and real processes of other users).  One keep-alive client sends
``GET /metrics`` (what Prometheus does; served from the latest reading, while a refresh runs in
the background every interval as long as scrapes come) and ``GET /api/metrics/v1`` (what
jupyter-resource-usage's status bar polls: psutil's memory of the server and each of its child
processes, read on the server's event loop), interleaved, the order alternating every round.
jupyter-resource-usage's own Prometheus gauges (a callback every second) are off, so that
``/metrics`` carries jupyter_server's metrics and ours only.

jupyter-resource-usage is not a dependency of this project: ``peers.py`` installs it on first use
into ``build/bench-deps/peers`` and only the benchmark server's ``PYTHONPATH`` has it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import peers  # noqa: E402
import standin  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from servers import JupyterServer  # noqa: E402
from timing import median_ms, quantile  # noqa: E402

from tfgpu_magic import __version__  # noqa: E402
from tfgpu_magic.gpus import owners  # noqa: E402
from tfgpu_magic.gpus.nvml import Nvml  # noqa: E402
from tfgpu_magic.gpus.simulated import FAKE_PID_BASE, busy_server  # noqa: E402
from tfgpu_magic.server import metrics  # noqa: E402
from tfgpu_magic.server.kernel_inventory import KernelDescription, inventory  # noqa: E402

JRU_VERSION = peers.PINNED["jupyter-resource-usage"]


def busy_server_as_me():
    """``busy_server`` with this machine's user as "me" and no process of the server's own."""
    me = owners.PsutilProcessTable().current_user() or "me"
    return busy_server(my_pid=FAKE_PID_BASE + 99, me=me)


# -- part 1: our collector's exposition, in process -----------------------------------------------
def collector_part(kernels: int, runs: int = 500) -> None:
    server = busy_server_as_me()
    nvml = Nvml(lib=server)
    pids = [p.pid for gpu in server.gpus for p in gpu.processes if p.alive][:kernels]
    described = [
        KernelDescription(
            f"kernel-{n}",
            "python3",
            f"work/notebook_{n}.ipynb",
            f"notebook_{n}.ipynb",
            "notebook",
            "idle",
            "2026-11-22T10:00:00.000000Z",
            pid,
        )
        for n, pid in enumerate(pids)
    ]
    reply = inventory(nvml, described, owners.process_table_for(nvml), {pid: os.getpid() for pid in pids})
    registry = CollectorRegistry()

    class Latest:
        def collect(self):
            return metrics.families(reply, __version__)

    registry.register(Latest())
    text = generate_latest(registry)
    families_ms = median_ms(lambda: metrics.families(reply, __version__), runs)
    exposition_ms = median_ms(lambda: generate_latest(registry), runs)
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    print(f"Part 1: tfgpu_magic's collector alone, in process: {len(described)} kernels, 8 fake GPUs")
    print(f"  families of one reading           {families_ms:6.3f} ms")
    print(
        f"  families and exposition text      {exposition_ms:6.3f} ms  ({series} series, {len(text)} bytes)"
    )


# -- part 2: a real server ------------------------------------------------------------------------
def server_part(kernels: int, rounds: int) -> tuple[float, float]:
    pids_file = os.path.join(tempfile.mkdtemp(prefix="tfgpu-bench-kernels-"), "kernels.json")
    config = {
        "ServerApp": {"jpserver_extensions": {"jupyter_resource_usage": True}},
        "ResourceUseDisplay": {"enable_prometheus_metrics": False},
        "TfgpuMagic": {"refresh_interval": 0.5},
    }
    with (
        standin.Sleepers(8) as sleepers,
        JupyterServer(
            config=config,
            config_py=f"import standin\nstandin.install(standin.KernelsFromFile({pids_file!r}, {sleepers.pids!r}))\n",
            pythonpath=[peers.ensure_installed()],
        ) as server,
    ):
        client = server.client
        started = time.perf_counter()
        server.start_kernels(kernels)
        server.wait_until_quiet()
        with open(pids_file, "w") as f:
            json.dump(server.kernel_pids(), f)
        print(
            f"Part 2: real jupyter server on loopback, {kernels} real kernels (started and quiet in "
            f"{time.perf_counter() - started:.1f} s), tfgpu_magic and jupyter-resource-usage {JRU_VERSION} enabled"
        )
        deadline = time.monotonic() + 30
        while True:  # the first scrape starts the reading: wait until the kernels' series are there
            status, body = client.call("GET", "/metrics")
            assert status == 200, status
            if body.count(b"tfgpu_kernel_gpu_memory_bytes{") >= kernels or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        status, usage = client.call("GET", "/api/metrics/v1")
        assert status == 200, (status, usage)
        ours = sum(1 for line in body.decode().splitlines() if line.startswith("tfgpu_"))
        print(
            f"  /metrics: {len(body)} bytes ({ours} tfgpu_ series of {body.count(b'tfgpu_kernel_gpu_memory_bytes{')} "
            f"kernels' memory, and jupyter_server's own); /api/metrics/v1: {len(usage)} bytes"
        )
        timings: dict[str, list[float]] = {"/metrics": [], "/api/metrics/v1": []}
        for round_ in range(rounds):
            paths = list(timings) if round_ % 2 == 0 else list(reversed(timings))
            for path in paths:
                start = time.perf_counter()
                status, _ = client.call("GET", path)
                timings[path].append((time.perf_counter() - start) * 1000)
                assert status == 200, (path, status)
                time.sleep(0.01)
        for path, samples in timings.items():
            print(
                f"  GET {path:<16} median {statistics.median(samples):6.2f} ms  p95 {quantile(samples, 0.95):6.2f} ms"
                f"  ({len(samples)} requests)"
            )
        return statistics.median(timings["/metrics"]), statistics.median(timings["/api/metrics/v1"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=300, help="requests to each endpoint, interleaved")
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    collector_part(args.kernels)
    scrape, usage = server_part(args.kernels, args.rounds)
    print(
        f"Ratio: a /metrics scrape costs {scrape / usage:.2f}x jupyter-resource-usage's /api/metrics/v1 "
        f"(medians, {scrape:.2f} ms vs {usage:.2f} ms)"
    )


if __name__ == "__main__":
    main()
