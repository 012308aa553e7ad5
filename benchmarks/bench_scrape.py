"""What a Prometheus scrape of ``/metrics`` costs, beside jupyter-resource-usage's ``/api/metrics/v1``, with 20 real kernels.

Run by hand: ``.venv/bin/python benchmarks/bench_scrape.py [--kernels 20] [--rounds 300]``.
Prints medians and 95th percentiles, the ratio last; no assertions.

Part 1, in this process: the exposition text of tfgpu_magic's collector alone
(``metrics.families`` of one inventory reply, then ``prometheus_client.generate_latest``) for
20 kernels on ``simulated.busy_server`` (8 GPUs, 40 processes of five users): the work our
collector adds to every scrape.

Part 2, over HTTP: one real ``jupyter server`` (bench_endpoint's: loopback, a token, the
extension enabled by the shipped file, reading ``busy_with_kernels``, refresh interval 0.5 s) with
jupyter-resource-usage enabled too, and ``--kernels`` real kernels.  One keep-alive client sends
``GET /metrics`` (what Prometheus does; served from the latest reading, while a refresh runs in
the background every interval as long as scrapes come) and ``GET /api/metrics/v1`` (what
jupyter-resource-usage's status bar polls: psutil's memory of the server and each of its child
processes, read on the server's event loop), interleaved, the order alternating every round.
jupyter-resource-usage's own Prometheus gauges (a callback every second) are off, so that
``/metrics`` carries jupyter_server's metrics and ours only.

jupyter-resource-usage is not a dependency of this project: it is installed on first use into
``build/bench-deps/`` (``pip install --no-deps --target``; its dependencies are jupyter_server's) and
put on the benchmark server's ``PYTHONPATH`` only, so no other Jupyter server of this checkout loads it.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_endpoint import Client, busy_server_as_me, free_port, quantile, start_server, wait_until_quiet, wait_until_up  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from timing import median_ms  # noqa: E402

from tfgpu_magic import __version__  # noqa: E402
from tfgpu_magic.gpus import owners  # noqa: E402
from tfgpu_magic.gpus.nvml import Nvml  # noqa: E402
from tfgpu_magic.server import metrics  # noqa: E402
from tfgpu_magic.server.kernel_inventory import KernelDescription, inventory  # noqa: E402

JRU_VERSION = "1.3.0"
JRU_DIR = os.path.join(ROOT, "build", "bench-deps", f"jupyter-resource-usage-{JRU_VERSION}")


def jupyter_resource_usage() -> str:
    """The folder jupyter-resource-usage is importable from (installed there on first use)."""
    if not os.path.isdir(os.path.join(JRU_DIR, "jupyter_resource_usage")):
        print(f"Installing jupyter-resource-usage {JRU_VERSION} into {os.path.relpath(JRU_DIR, ROOT)} (first run only)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", JRU_DIR,
             f"jupyter-resource-usage=={JRU_VERSION}"],
            check=True,
        )
    return JRU_DIR


# -- part 1: our collector's exposition, in process -----------------------------------------------
def collector_part(kernels: int, runs: int = 500) -> None:
    server = busy_server_as_me()
    nvml = Nvml(lib=server)
    pids = [p.pid for gpu in server.gpus for p in gpu.processes if p.alive][:kernels]
    described = [
        KernelDescription(f"kernel-{n}", "python3", f"work/notebook_{n}.ipynb", f"notebook_{n}.ipynb", "notebook",
                          "idle", "2026-11-22T10:00:00.000000Z", pid)
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
    print(f"  families and exposition text      {exposition_ms:6.3f} ms  ({series} series, {len(text)} bytes)")


# -- part 2: a real server ------------------------------------------------------------------------
def server_part(kernels: int, rounds: int) -> tuple[float, float]:
    jru = jupyter_resource_usage()
    workdir = tempfile.mkdtemp(prefix="tfgpu-bench-scrape-")
    port, token = free_port(), secrets.token_hex(16)
    extra = {
        "ServerApp": {"jpserver_extensions": {"jupyter_resource_usage": True}},
        "ResourceUseDisplay": {"enable_prometheus_metrics": False},
    }
    server = start_server(port, token, workdir, extra_config=extra, pythonpath=[jru])
    try:
        client = wait_until_up(lambda: Client(port, token), server)
        started = time.perf_counter()
        for n in range(kernels):
            body = {"path": f"notebook_{n}.ipynb", "name": f"notebook_{n}.ipynb", "type": "notebook",
                    "kernel": {"name": "python3"}}
            status, _ = client.call("POST", "/api/sessions", body)
            assert status == 201, status
        wait_until_quiet(server.pid)
        print(f"Part 2: real jupyter server on loopback, {kernels} real kernels (started and quiet in "
              f"{time.perf_counter() - started:.1f} s), tfgpu_magic and jupyter-resource-usage {JRU_VERSION} enabled")
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
        print(f"  /metrics: {len(body)} bytes ({ours} tfgpu_ series of {body.count(b'tfgpu_kernel_gpu_memory_bytes{')} "
              f"kernels' memory, and jupyter_server's own); /api/metrics/v1: {len(usage)} bytes")
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
            print(f"  GET {path:<16} median {statistics.median(samples):6.2f} ms  p95 {quantile(samples, 0.95):6.2f} ms"
                  f"  ({len(samples)} requests)")
        client.call("POST", "/api/shutdown")
        server.wait(timeout=60)
        return statistics.median(timings["/metrics"]), statistics.median(timings["/api/metrics/v1"])
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=300, help="requests to each endpoint, interleaved")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}")
    collector_part(args.kernels)
    scrape, usage = server_part(args.kernels, args.rounds)
    print(f"Ratio: a /metrics scrape costs {scrape / usage:.2f}x jupyter-resource-usage's /api/metrics/v1 "
          f"(medians, {scrape:.2f} ms vs {usage:.2f} ms)")


if __name__ == "__main__":
    main()
