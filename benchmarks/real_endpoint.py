"""``GET tfgpu/api/status`` on a real NVIDIA driver: what it attributes to which kernel (run by hand on a GPU machine).

    python benchmarks/real_endpoint.py [--seconds 10]

Starts a real ``jupyter server`` on loopback (the extension enabled by the file the wheel ships,
NVML the real driver's) with two notebook kernels.  Kernel A allocates 2 GiB through CuPy (or
PyTorch); kernel B starts a child process that allocates 1 GiB; a process outside Jupyter
(this script's child, so "my other processes") allocates 512 MiB.  Then it prints what the
endpoint attributes to each, beside nvidia-smi's per-process listing, and the endpoint's
timings, cached and refreshing.  Needs CuPy or PyTorch with CUDA, jupyter_server and ipykernel;
no TensorFlow.  No assertions: what it saw goes in README.md with the date and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from servers import Client, JupyterServer
from timing import quantile

MIB = 2**20
ALLOCATE = """
try:
    import cupy
    block = cupy.ones({size}, dtype=cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
    library = "cupy"
except ImportError:
    import torch
    block = torch.ones({size}, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    library = "torch"
print("allocated through", library, flush=True)
"""
HOLD = "import time\ntime.sleep(3600)\n"
CHILD = "import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {code!r}])\nprint('child', child.pid)"


def run_in_kernel(server: JupyterServer, kernel_id: str, code: str) -> None:
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(
        connection_file=os.path.join(server.workdir, "runtime", f"kernel-{kernel_id}.json")
    )
    client.load_connection_file()
    client.start_channels()
    try:
        reply = client.execute_interactive(code, timeout=120)
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"the kernel failed: {content.get('ename')}: {content.get('evalue')}")
    finally:
        client.stop_channels()


def start_session(client: Client, path: str) -> dict:
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}
    status, reply = client.call("POST", "/api/sessions", body)
    assert status == 201, (status, reply)
    return json.loads(reply)


def wait_for_attribution(client: Client, kernels: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = json.loads(client.call("GET", "/tfgpu/api/status")[1])
        holding = [k for k in reply["kernels"] if k["total_gpu_memory_bytes"]]
        if len(holding) == kernels and reply["my_other_processes"]:
            return reply
        time.sleep(0.5)
    return reply


def poll(client: Client, seconds: float, last: float) -> tuple[list[float], list[float]]:
    """Milliseconds of requests that made a refresh, and of those answered with the last reply."""
    refreshed: list[float] = []
    cached: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        _status, body = client.call("GET", "/tfgpu/api/status")
        elapsed = (time.perf_counter() - start) * 1000
        generated_at = json.loads(body)["generated_at"]
        (cached if generated_at == last else refreshed).append(elapsed)
        last = generated_at
        time.sleep(0.01)
    return refreshed, cached


def show(reply: dict) -> None:
    print(f"driver: {reply['driver']}, user {reply['user']}")
    for gpu in reply["gpus"]:
        split = {k: None if v is None else round(v / MIB) for k, v in gpu["split"].items()}
        print(
            f"  GPU {gpu['index']} {gpu['name']}: used {gpu['memory_used_bytes'] // MIB} MiB of "
            f"{gpu['memory_total_bytes'] // MIB} MiB; split in MiB {split}; notes {gpu['notes']}"
        )
    for kernel in reply["kernels"]:
        memory = {gpu: held // MIB for gpu, held in kernel["gpu_memory_bytes"].items()}
        print(
            f"  kernel {kernel['path']}: pid {kernel['pid']}, children {kernel['child_pids']}, MiB per GPU {memory}, "
            f"state {kernel['execution_state']}, note {kernel['note']}"
        )
    for key in ("my_other_processes", "other_users", "unattributed"):
        for entry in reply[key]:
            print(
                f"  {key}: pid {entry['pid']} on GPU {entry['gpu']}: {(entry['used_memory_bytes'] or 0) // MIB} MiB"
            )
    print(f"  notes: {reply['notes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    outside = None
    with JupyterServer(config={"TfgpuMagic": {"refresh_interval": 0.5}}) as server:  # NVML: the real driver
        try:
            client = server.client
            a, b = start_session(client, "kernel_a.ipynb"), start_session(client, "kernel_b.ipynb")
            run_in_kernel(server, a["kernel"]["id"], ALLOCATE.format(size=2048 * MIB))
            run_in_kernel(
                server, b["kernel"]["id"], CHILD.format(code=ALLOCATE.format(size=1024 * MIB) + HOLD)
            )
            outside = subprocess.Popen([sys.executable, "-c", ALLOCATE.format(size=512 * MIB) + HOLD])
            reply = wait_for_attribution(client, kernels=2)
            print(
                f"Kernel A allocated 2048 MiB itself; kernel B's child 1024 MiB; pid {outside.pid} (not a kernel) 512 MiB."
            )
            show(reply)
            smi = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            ).stdout
            print(
                "nvidia-smi --query-compute-apps=pid,used_memory:\n  " + "\n  ".join(smi.strip().splitlines())
            )
            refreshed, cached = poll(client, args.seconds, last=reply["generated_at"])
            print(
                f"GET, reply cached        median {statistics.median(cached):6.2f} ms  p95 {quantile(cached, 0.95):6.2f} ms  ({len(cached)} requests)"
            )
            print(
                f"GET that made a refresh  median {statistics.median(refreshed):6.2f} ms  p95 {quantile(refreshed, 0.95):6.2f} ms  ({len(refreshed)} requests)"
            )
        finally:
            if outside is not None:
                outside.kill()
                outside.wait()


if __name__ == "__main__":
    main()
