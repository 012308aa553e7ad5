"""The server's ``GET tfgpu/api/status`` with 1, 10 and 20 real kernels, against jupyter-resource-usage.

Run by ``compare.py`` as a child process (``python benchmarks/vs_endpoint.py ROUNDS INTERVAL``), which
prints one JSON line.  One real ``jupyter server`` (loopback, a token) runs both extensions:
tfgpu_magic, enabled by the file the wheel ships, and jupyter-resource-usage 1.3.0 (its own
Prometheus gauges off, so nothing else of it runs between requests).  NVML is the stand-in
(``standin.KernelsFromFile``): 8 GPUs listing the server's real kernels and real processes of
other users.

With tfgpu_magic's ``refresh_interval`` at 0, every request makes a whole reading (NVML, each
process's owner and ancestry, the kernels from the kernel manager, the reply made safe and
encoded), as jupyter-resource-usage's ``GET api/metrics/v1`` reads psutil on every request (the
server's memory and each kernel's); at the default, 2 s, requests within the interval get the
last reply (``new_readings`` says how many replies were new readings).  One keep-alive client sends both requests in turn, the order
alternating every round; kernels are added between the sizes, and their start-up is left to
finish before timing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers
import standin
from servers import JupyterServer
from timing import summary

SIZES = (1, 10, 20)
PATHS = {"tfgpu_magic": "/tfgpu/api/status", "jupyter-resource-usage": "/api/metrics/v1"}


def timed_rounds(server: JupyterServer, rounds: int) -> tuple[dict[str, list[float]], int]:
    """Milliseconds per request of each, and how many of our replies were new readings."""
    samples: dict[str, list[float]] = {name: [] for name in PATHS}
    readings: set[Any] = set()
    names = list(PATHS)
    for name in names:
        server.client.call("GET", PATHS[name])  # untimed: the first of each
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            status, body = server.client.call("GET", PATHS[name])
            samples[name].append((time.perf_counter() - start) * 1000)
            if status != 200:
                raise RuntimeError(f"GET {PATHS[name]}: {status}")
            if name == "tfgpu_magic":
                readings.add(json.loads(body)["generated_at"])
            time.sleep(0.005)
    return samples, len(readings)


def main() -> None:
    rounds, interval = int(sys.argv[1]), float(sys.argv[2])
    peers.ensure_installed()
    pids_file = os.path.join(tempfile.mkdtemp(prefix="tfgpu-bench-kernels-"), "kernels.json")
    result: dict[str, Any] = {"sizes": {}}
    with standin.Sleepers(8) as sleepers:
        config_py = (
            f"import standin\nstandin.install(standin.KernelsFromFile({pids_file!r}, {sleepers.pids!r}))\n"
        )
        config = {
            "ServerApp": {"jpserver_extensions": {"jupyter_resource_usage": True}},
            "ResourceUseDisplay": {"enable_prometheus_metrics": False},
            "TfgpuMagic": {"refresh_interval": interval},
        }
        with JupyterServer(config=config, config_py=config_py, pythonpath=[peers.PEERS_DIR]) as server:
            started = 0
            for size in SIZES:
                server.start_kernels(size - started, first=started)
                started = size
                server.wait_until_quiet()
                kernels = server.kernel_pids()
                with open(pids_file, "w") as f:
                    json.dump(kernels, f)
                time.sleep(0.2)
                reply = json.loads(server.client.call("GET", PATHS["tfgpu_magic"])[1])
                holding = sum(1 for k in reply["kernels"] if k.get("total_gpu_memory_bytes"))
                samples, readings = timed_rounds(server, rounds)
                result["sizes"][str(size)] = {
                    "new_readings": readings,
                    "kernels_holding_memory": holding,
                    "other_users": len(reply.get("other_users") or []),
                    "contenders": {name: summary(ms) for name, ms in samples.items()},
                }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
