"""How long the server extension's ``GET tfgpu/api/status`` takes, on a simulated busy server with 20 kernels.

Run by hand: ``.venv/bin/python benchmarks/bench_endpoint.py [--kernels 20] [--seconds 10]``.
Prints medians; no assertions.

Part 1, in this process: one refresh of the inventory (``kernel_inventory.inventory``: NVML,
owners, the ancestry of each GPU process, the reply made safe) for 20 kernel descriptions
on ``simulated.busy_server`` (8 GPUs, 40 processes of five users), the kernels holding 20 of
those processes; then the reply's JSON encoding.

Part 2, over HTTP: a real ``jupyter server`` subprocess on loopback with a token, the extension
enabled by the very file the wheel ships (``jupyter-config/server-config/tfgpu_magic.json`` in a
``jupyter_server_config.d`` on ``JUPYTER_CONFIG_PATH``), reading :func:`busy_with_kernels` (the
same busy server, plus the server's real kernels as ``simulated.LiveKernelsNvml`` places them,
on all 8 GPUs), with ``--kernels`` real kernels started through ``POST api/sessions``.  One
keep-alive client polls for ``--seconds`` with the refresh interval at 0.5 s; a request whose
reply carries a new ``generated_at`` paid for a refresh, the others got the cached reply.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

from tfgpu_magic.gpus import owners  # noqa: E402
from tfgpu_magic.gpus.nvml import Nvml  # noqa: E402
from tfgpu_magic.gpus.simulated import FAKE_PID_BASE, LiveKernelsNvml, SimulatedNvml, busy_server  # noqa: E402
from tfgpu_magic.server.kernel_inventory import KernelDescription, inventory, read_ancestry, read_parent_map  # noqa: E402

INTERVAL_S = 0.5  # the server's refresh interval in part 2 (the default is 2 s)


def busy_server_as_me() -> SimulatedNvml:
    """``busy_server`` with this machine's user as "me" and no process of the server's own."""
    me = owners.PsutilProcessTable().current_user() or "me"
    return busy_server(my_pid=FAKE_PID_BASE + 99, me=me)


def busy_with_kernels() -> LiveKernelsNvml:
    """The device source of part 2: the busy server, plus the Jupyter server's real kernels on its 8 GPUs."""
    return LiveKernelsNvml(busy_server_as_me().gpus, kernel_gpus=8)


# -- part 1: the refresh, in process ------------------------------------------------------------
def inventory_part(kernels: int, runs: int = 200) -> None:
    server = busy_server_as_me()
    nvml = Nvml(lib=server)
    table = owners.process_table_for(nvml)
    pids = [p.pid for gpu in server.gpus for p in gpu.processes if p.alive][:kernels]
    described = [
        KernelDescription(f"kernel-{n}", "python3", f"work/notebook_{n}.ipynb", f"notebook_{n}.ipynb", "notebook",
                          "idle", "2026-11-22T10:00:00.000000Z", pid)
        for n, pid in enumerate(pids)
    ]
    server_pid = os.getpid()
    listed = [p.pid for gpu in server.gpus for p in gpu.processes]

    def refresh() -> dict[str, Any]:
        parents = read_ancestry(listed)  # what every refresh reads: each GPU process's ancestry
        parents.update({pid: server_pid for pid in pids})  # the fake kernels are this process's children
        return inventory(nvml, described, table, parents)

    reply = refresh()
    before = server.calls
    refresh()
    calls = server.calls - before
    refresh_ms = median_ms(refresh, runs)
    ancestry_ms = median_ms(lambda: read_ancestry(listed), runs)
    scan_ms = median_ms(read_parent_map, runs)
    encode_ms = median_ms(lambda: json.dumps(reply), runs)
    simulation_ms = median_ms(LiveKernelsNvml(server.gpus, scan_ttl_s=0.0).live_processes, runs)
    per_call = median_ms(lambda: [server.nvmlDeviceGetMemoryInfo(0) for _ in range(1000)], 20) / 1000
    processes = len(read_parent_map()[0])
    print(f"Part 1: inventory refresh in process: 8 fake GPUs, 40 processes, {len(described)} kernel descriptions")
    print(f"  refresh (inventory + ancestries)   {refresh_ms:7.2f} ms  ({calls} fake NVML calls, about {calls * per_call:.2f} ms of them)")
    print(f"  of which the GPU processes' ancestries {ancestry_ms:5.2f} ms  ({len(listed)} pids)")
    print(f"  (a whole process-table scan, not made: {scan_ms:.2f} ms for the {processes} processes on this machine)")
    print(f"  JSON encoding of the reply         {encode_ms:7.2f} ms  ({len(json.dumps(reply))} bytes)")
    print(f"  (part 2's simulated driver finds the server's kernels with its own scan, "
          f"{simulation_ms:.2f} ms here, which real NVML does not make)")


# -- part 2: a real Jupyter server --------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    port: int,
    token: str,
    workdir: str,
    device_source: Optional[str] = "bench_endpoint:busy_with_kernels",
    extra_config: Optional[dict[str, Any]] = None,
    pythonpath: Sequence[str] = (),
) -> subprocess.Popen:
    """``jupyter server`` on loopback with the extension enabled by the shipped file; None: the real driver.

    ``extra_config``: one more ``jupyter_server_config.d`` file (another extension enabled, its
    settings); ``pythonpath``: folders after this checkout's on the server's ``PYTHONPATH``.
    """
    config = os.path.join(workdir, "config", "jupyter_server_config.d")
    os.makedirs(config)
    shutil.copy(os.path.join(ROOT, "jupyter-config", "server-config", "tfgpu_magic.json"), config)
    if extra_config:
        with open(os.path.join(config, "extra.json"), "w") as f:
            json.dump(extra_config, f)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [ROOT, os.path.join(ROOT, "benchmarks"), *pythonpath, os.environ.get("PYTHONPATH", "")]
        ),
        "JUPYTER_CONFIG_PATH": os.path.dirname(config),
        "JUPYTER_RUNTIME_DIR": os.path.join(workdir, "runtime"),  # the kernels' connection files
    }
    command = [
        sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}",
        f"--TfgpuMagic.refresh_interval={INTERVAL_S}",
    ]
    if device_source is not None:
        command.append(f"--TfgpuMagic.device_source={device_source}")
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(os.path.join(workdir, "server.log"), "w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


class Client:
    """One keep-alive connection, as a browser tab polls."""

    def __init__(self, port: int, token: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"token {token}"}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body)
        self.connection.request(method, path, body=data, headers=self.headers)
        response = self.connection.getresponse()
        return response.status, response.read()


def wait_until_up(client_factory: Callable[[], Client], server: subprocess.Popen, timeout: float = 60) -> Client:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the Jupyter server exited; see its server.log")
        try:
            client = client_factory()
            if client.call("GET", "/api/status")[0] == 200:
                return client
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the Jupyter server did not answer in time")


def wait_until_quiet(server_pid: int, timeout: float = 300) -> None:
    """Until the server's kernels have finished starting (less than 5 % of a core for a second)."""
    import psutil

    def cpu_seconds() -> float:
        total = 0.0
        for child in psutil.Process(server_pid).children(recursive=True):
            try:
                times = child.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds()
        time.sleep(1.0)
        if cpu_seconds() - before < 0.05:
            return
    raise RuntimeError("the kernels kept the CPU busy")


def endpoint_part(kernels: int, seconds: float) -> None:
    workdir = tempfile.mkdtemp(prefix="tfgpu-bench-endpoint-")
    port, token = free_port(), secrets.token_hex(16)
    server = start_server(port, token, workdir)
    try:
        client = wait_until_up(lambda: Client(port, token), server)
        started = time.perf_counter()
        for n in range(kernels):
            body = {"path": f"notebook_{n}.ipynb", "name": f"notebook_{n}.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
            status, _ = client.call("POST", "/api/sessions", body)
            assert status == 201, status
        wait_until_quiet(server.pid)  # kernels still importing would compete for the CPU
        print(f"Part 2: real jupyter server on loopback, {kernels} real kernels (started and quiet in {time.perf_counter() - started:.1f} s)")
        time.sleep(INTERVAL_S * 2)
        status, body = client.call("GET", "/tfgpu/api/status")
        reply = json.loads(body)
        holding = sum(1 for k in reply["kernels"] if k["total_gpu_memory_bytes"])
        print(f"  reply: {len(body)} bytes, {len(reply['gpus'])} GPUs, {len(reply['kernels'])} kernels ({holding} holding memory), "
              f"{len(reply['other_users'])} processes of other users")
        refreshed, cached = poll(client, seconds, last=reply["generated_at"])
        print(f"  GET, reply cached (within the {INTERVAL_S} s interval)   median {statistics.median(cached):6.2f} ms  "
              f"p95 {quantile(cached, 0.95):6.2f} ms  ({len(cached)} requests)")
        print(f"  GET that made a refresh                           median {statistics.median(refreshed):6.2f} ms  "
              f"p95 {quantile(refreshed, 0.95):6.2f} ms  ({len(refreshed)} requests)")
        client.call("POST", "/api/shutdown")  # shuts the kernels down too
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def poll(client: Client, seconds: float, last: float) -> tuple[list[float], list[float]]:
    refreshed: list[float] = []
    cached: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        status, body = client.call("GET", "/tfgpu/api/status")
        elapsed = (time.perf_counter() - start) * 1000
        generated_at = json.loads(body)["generated_at"]
        (cached if generated_at == last else refreshed).append(elapsed)
        last = generated_at
        time.sleep(0.01)
    return refreshed, cached


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the client polls in part 2")
    parser.add_argument("--skip-server", action="store_true", help="part 1 only")
    args = parser.parse_args()
    inventory_part(args.kernels)
    if not args.skip_server:
        endpoint_part(args.kernels, args.seconds)


if __name__ == "__main__":
    main()
