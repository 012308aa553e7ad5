"""Cost of the monitor's sampling in the kernel, on the fake NVML source (run by hand).

    python benchmarks/bench_monitor.py [--seconds 20]

Prints (1) the cost of one tick for 8 GPUs in our own code, the fake NVML's share taken out,
and (2) the kernel's CPU use while sampling at 10 samples a second on the sampler thread,
each sample turned into the panel's message and serialised and signed as ipykernel would.
No assertions: figures for the Performance section of README.md.
"""

from __future__ import annotations

import argparse
import os
import time

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess
from tfgpu_magic.kernel.monitor import Sampler
from tfgpu_magic.kernel.widget import batch

GPUS = 8


def eight_gpu_server(my_pid: int) -> SimulatedNvml:
    """Eight 80 GiB GPUs, each with this kernel and two other processes on it."""
    return SimulatedNvml([
        SimulatedGpu(
            name="NVIDIA H100 80GB HBM3",
            total_mib=81920,
            processes=[
                SimulatedProcess(my_pid, 4096 + i),
                SimulatedProcess(50000 + i, 8192, "alice"),
                SimulatedProcess(60000 + i, 2048, "bob", kind="graphics"),
            ],
        )
        for i in range(GPUS)
    ])


def message_sender():
    """What MemoryPanel does per sample: batch(), then the kernel's serialise-and-sign."""
    from jupyter_client.session import Session

    session = Session(key=b"benchmark-key")

    def send(sample) -> None:
        content = {"comm_id": "x" * 32, "data": {"method": "custom", "content": batch([sample])}}
        session.serialize(session.msg("comm_msg", content))

    return send


def per_call(func, repeat: int) -> float:
    """Seconds per call, best of five runs (the least disturbed by the machine)."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            func()
        runs.append((time.perf_counter() - start) / repeat)
    return min(runs)


def fake_nvml_cost(server: SimulatedNvml) -> float:
    """Seconds the fake itself spends on one tick's NVML calls (what real NVML replaces)."""
    def calls() -> None:
        for i in range(GPUS):
            server.nvmlDeviceGetMemoryInfo(i)
            server.nvmlDeviceGetComputeRunningProcesses(i)
            server.nvmlDeviceGetGraphicsRunningProcesses(i)

    return per_call(calls, 2000)


def tick_costs() -> dict[str, float]:
    server = eight_gpu_server(os.getpid())
    sampler = Sampler(Nvml(lib=server), os.getpid())
    sampler.tick()  # names read once, NVML started
    before = server.calls
    sampler.tick()
    calls_per_tick = server.calls - before
    fake = fake_nvml_cost(server)
    read = per_call(sampler.read, 2000)
    sample = sampler.read()
    send = message_sender()
    message = per_call(lambda: send(sample), 2000)
    return {
        "nvml_calls_per_tick": calls_per_tick,
        "fake_nvml_us": fake * 1e6,
        "read_us": read * 1e6,
        "read_ours_us": (read - fake) * 1e6,
        "message_us": message * 1e6,
        "tick_ours_us": (read - fake + message) * 1e6,
    }


def cpu_at_10_hz(seconds: float) -> dict[str, float]:
    server = eight_gpu_server(os.getpid())
    sampler = Sampler(Nvml(lib=server), os.getpid(), interval=0.1, keep_s=300)
    sampler.subscribe(message_sender())
    sampler.tick()  # starts NVML, reads the names
    fake = fake_nvml_cost(server)
    idle_start, idle_cpu = time.monotonic(), time.process_time()
    time.sleep(min(seconds, 5.0))  # the process's own background cost, without sampling
    idle = (time.process_time() - idle_cpu) / (time.monotonic() - idle_start)
    start_wall, start_cpu = time.monotonic(), time.process_time()
    ticks_before = len(sampler.history)
    sampler.start()
    time.sleep(seconds)  # the main thread idles: all CPU counted is the sampler's
    sampler.stop()
    wall = time.monotonic() - start_wall
    cpu = time.process_time() - start_cpu
    ticks = len(sampler.history) - ticks_before
    ours = cpu - ticks * fake - idle * wall
    return {
        "idle_percent": 100 * idle,
        "seconds": wall,
        "ticks": ticks,
        "rate_hz": ticks / wall,
        "cpu_percent": 100 * cpu / wall,
        "cpu_ours_percent": 100 * ours / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    t = tick_costs()
    print(f"one tick, {GPUS} GPUs, fake NVML ({t['nvml_calls_per_tick']} NVML calls):")
    print(f"  sampler.read()                 {t['read_us']:8.1f} us")
    print(f"    of which the fake NVML       {t['fake_nvml_us']:8.1f} us")
    print(f"    our own code                 {t['read_ours_us']:8.1f} us")
    print(f"  message (batch+serialise+sign) {t['message_us']:8.1f} us")
    print(f"  our cost per tick              {t['tick_ours_us']:8.1f} us")
    c = cpu_at_10_hz(args.seconds)
    print(f"kernel CPU at 10 samples/s over {c['seconds']:.1f} s ({c['ticks']} ticks, {c['rate_hz']:.2f}/s):")
    print(f"  process CPU                    {c['cpu_percent']:8.3f} % of one core")
    print(f"  the process idle, no sampling  {c['idle_percent']:8.3f} % of one core")
    print(f"  ours (less idle and fake NVML) {c['cpu_ours_percent']:8.3f} % of one core")
    print(f"  (our per-tick cost x 10/s:     {t['tick_ours_us'] * 10 / 1e4:8.3f} %)")


if __name__ == "__main__":
    main()
