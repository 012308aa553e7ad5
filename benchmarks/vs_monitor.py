"""The live monitor at 10 samples a second on 8 GPUs: ``%gpu monitor`` against jupyterlab-nvdashboard.

Run by ``compare.py`` as a child process (``python benchmarks/vs_monitor.py ROUNDS SECONDS``),
which prints one JSON line.  Both run as their users run them, in real processes, on the same
stand-in NVML (``standin.LiveServer``: 8 busy GPUs whose utilization moves with each of the
driver's samples, six a second, and where one process per GPU grows or shrinks every 2 s; on each
GPU the kernel and two processes of other users, real sleepers):

- ours: a real ``python3`` kernel (jupyter_client) running ``%gpu monitor --interval 0.1``: the
  sampler thread reads memory, utilization and this kernel's share on every GPU and the panel
  sends each sample over the widget's comm (IOPub), which this script reads and drops, as a
  browser would read it.  ``%gpu monitor off`` ends it.
- jupyterlab-nvdashboard: a real ``jupyter server`` with its extension, and a websocket on its
  ``gpu_resource`` handler (its "GPU Resources" chart: memory and utilization of every GPU) asking
  for an update every 100 ms; pausing it (its front end's pause message) ends it.
- the floor, no contender: in the same kernel, a thread that takes its own NVML reference
  (``nvmlInit``: it never leans on one left by ``%gpu``), sleeps to a 100 ms deadline and does
  what issue 32 names as what a monitor must do: each tick, memory and utilization of every GPU
  through ``pynvml`` (16 calls) and a GPU's process lists (compute and graphics) when its used memory
  moved; every ``BATCH`` ticks (2 s, the batch ours sends) one comm message with the batch's numbers
  as a binary buffer.  No chart, no history, no check of what a reading says.  What any monitor in
  a kernel pays at 10 Hz on this machine, to read the others against.  A floor whose thread
  failed ends the benchmark with its error rather than measuring an idle kernel.

Each round has four windows of ``SECONDS``: ours sampling, nvdashboard sampling, the floor, and
all idle (the order of the first three turning).  A contender's cost is its process's CPU (all threads,
from the scheduler) in its window less the same process's CPU in the idle window of that
round: % of a core, and per tick (the CPU divided by the ticks the window had at 10 a second).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers
import standin
from servers import BENCHMARKS, ROOT, JupyterServer

from tfgpu_magic.kernel.monitor import HAND_ON_S

GPUS = 8
INTERVAL_S = 0.1
BATCH = round(HAND_ON_S / INTERVAL_S)  # ticks per comm message in the floor: the batch ours sends
FLOOR = "floor (the calls a tick must make, a comm message per batch)"

# Defined in the kernel: the floor's thread (see the module's docstring).
FLOOR_CODE = """
import threading as _threading, time as _time, pynvml as _pynvml
from array import array as _array
from comm import create_comm as _create_comm
def _bench_floor(stop, interval, batch):
    _pynvml.nvmlInit()  # its own reference, as any monitor takes: never one left by another contender
    try:
        handles = [_pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(_pynvml.nvmlDeviceGetCount())]
        channel = _create_comm(target_name="tfgpu-bench-floor")
        used = [None] * len(handles)
        readings, ticks = _array("q"), 0
        deadline = _time.monotonic()
        while not stop.is_set():
            for n, handle in enumerate(handles):
                memory = _pynvml.nvmlDeviceGetMemoryInfo(handle)
                busy = _pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                if memory.used != used[n]:  # the process lists only when the memory moved
                    used[n] = memory.used
                    _pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                    _pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
                readings.extend((memory.total, memory.used, busy))
            ticks += 1
            if ticks % batch == 0:
                channel.send({"ticks": batch}, buffers=[memoryview(readings)])
                readings = _array("q")
            deadline = max(deadline + interval, _time.monotonic())
            _time.sleep(deadline - _time.monotonic())
        channel.close()
    finally:
        _pynvml.nvmlShutdown()
_bench_floor_thread = None
_bench_floor_failure = []
def _bench_floor_run(stop, interval, batch):
    try:
        _bench_floor(stop, interval, batch)
    except BaseException as err:  # said by _bench_floor_end: a floor that died measured nothing
        _bench_floor_failure.append(err)
def _bench_floor_start(interval, batch):
    global _bench_floor_stop, _bench_floor_thread
    _bench_floor_stop = _threading.Event()
    _bench_floor_thread = _threading.Thread(
        target=_bench_floor_run, args=(_bench_floor_stop, interval, batch), daemon=True
    )
    _bench_floor_thread.start()
def _bench_floor_end():
    _bench_floor_stop.set()
    _bench_floor_thread.join(10)
    if _bench_floor_thread.is_alive():  # still sampling: it would be measured in the next windows
        raise RuntimeError("the floor's thread did not end within 10 s")
    if _bench_floor_failure:
        raise RuntimeError(f"the floor's thread failed: {_bench_floor_failure[-1]!r}")
"""


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid``, in nanoseconds' resolution from the scheduler
    (``/proc/<pid>/task/*/schedstat``; the clock-tick counts of ``stat`` move in 10 ms steps)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9


class Kernel:
    """A real python3 kernel with the stand-in NVML installed before ``%load_ext``; IOPub drained."""

    def __init__(self, others: list[int]) -> None:
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, BENCHMARKS, peers.PEERS_DIR])}
        self.manager.start_kernel(env=env, stderr=subprocess.DEVNULL)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.pid = self.manager.provisioner.process.pid
        self.comm_messages = 0
        self.run(
            f"import os, standin\nstandin.install(standin.monitor_server(os.getpid(), {others!r}, {GPUS}))"
        )
        self.run("%load_ext tfgpu_magic")
        self.run(FLOOR_CODE)
        self._draining = True
        self._drain = threading.Thread(target=self._drain_iopub, daemon=True)
        self._drain.start()

    def run(self, code: str) -> None:
        reply = self.client.execute(code, reply=True, timeout=60)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")

    def _drain_iopub(self) -> None:
        while self._draining:
            try:
                message = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if message["header"]["msg_type"] == "comm_msg":
                self.comm_messages += 1

    def close(self) -> None:
        self._draining = False
        self._drain.join()
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class DashboardSocket:
    """A websocket on nvdashboard's gpu_resource handler, in its own thread and event loop."""

    def __init__(self, server: JupyterServer) -> None:
        self.messages = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("no websocket to nvdashboard's gpu_resource")

    def _run(self, server: JupyterServer) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._connect(server))
        self._loop.run_forever()

    async def _connect(self, server: JupyterServer) -> None:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        request = HTTPRequest(
            f"ws://127.0.0.1:{server.port}/nvdashboard/gpu_resource",
            headers={"Authorization": f"token {server.token}"},
        )
        self._socket = await websocket_connect(request, on_message_callback=self._on_message)
        self._ready.set()

    def _on_message(self, message: Any) -> None:
        if message is not None:
            self.messages += 1

    def _send(self, paused: bool) -> None:
        text = json.dumps({"updateFrequency": int(INTERVAL_S * 1000), "isPaused": paused})

        async def send() -> None:
            await self._socket.write_message(text)

        asyncio.run_coroutine_threadsafe(send(), self._loop).result(10)

    def start(self) -> None:
        self._send(paused=False)

    def pause(self) -> None:
        self._send(paused=True)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._socket.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def window(
    pid: int,
    seconds: float,
    start: Callable[[], None],
    stop: Callable[[], None],
    messages: Callable[[], int] = lambda: 0,
) -> tuple[float, int]:
    """CPU seconds of ``pid`` while ``start()``..``stop()`` runs for ``seconds``, and the messages
    sent meanwhile (``messages()``: a running count); the switching itself outside both."""
    start()
    time.sleep(0.5)  # the first sample's one-off work (names, the panel's description) left out
    before, sent = cpu_seconds(pid), messages()
    time.sleep(seconds)
    used, sent = cpu_seconds(pid) - before, messages() - sent
    stop()
    time.sleep(0.5)
    return used, sent


def main() -> None:
    rounds, seconds = int(sys.argv[1]), float(sys.argv[2])
    peers.ensure_installed()
    with standin.Sleepers(2 * GPUS) as sleepers:
        kernel = Kernel(sleepers.pids)
        config_py = (
            "import os, standin\n"
            f"standin.install(standin.monitor_server({kernel.pid}, {sleepers.pids!r}, {GPUS}))\n"
        )
        extensions = {"ServerApp": {"jpserver_extensions": {"jupyterlab_nvdashboard": True}}}
        try:
            with JupyterServer(
                config=extensions, config_py=config_py, pythonpath=[peers.PEERS_DIR]
            ) as server:
                socket = DashboardSocket(server)
                time.sleep(2)  # the server's own start-up work settles
                names = ["tfgpu_magic", "jupyterlab-nvdashboard", FLOOR]
                runs: dict[str, list[float]] = {name: [] for name in names}
                idle: dict[str, list[float]] = {name: [] for name in names}
                sent = {name: 0 for name in names}
                switches: dict[str, tuple[int, Callable[[], None], Callable[[], None], Callable[[], int]]] = {
                    "tfgpu_magic": (
                        kernel.pid,
                        lambda: kernel.run("%gpu monitor --interval 0.1"),
                        lambda: kernel.run("%gpu monitor off"),
                        lambda: kernel.comm_messages,
                    ),
                    "jupyterlab-nvdashboard": (
                        server.pid,
                        socket.start,
                        socket.pause,
                        lambda: socket.messages,
                    ),
                    FLOOR: (
                        kernel.pid,
                        lambda: kernel.run(f"_bench_floor_start({INTERVAL_S}, {BATCH})"),
                        lambda: kernel.run("_bench_floor_end()"),
                        lambda: kernel.comm_messages,
                    ),
                }
                for round_ in range(rounds):
                    for name in names[round_ % 3 :] + names[: round_ % 3]:
                        pid, start, stop, messages = switches[name]
                        used, in_window = window(pid, seconds, start, stop, messages)
                        runs[name].append(used)
                        sent[name] += in_window  # those of the measured time: not the start's or the stop's
                    kernel_before, server_before = cpu_seconds(kernel.pid), cpu_seconds(server.pid)
                    time.sleep(seconds)
                    idle["tfgpu_magic"].append(cpu_seconds(kernel.pid) - kernel_before)
                    idle[FLOOR].append(idle["tfgpu_magic"][-1])
                    idle["jupyterlab-nvdashboard"].append(cpu_seconds(server.pid) - server_before)
                socket.close()
        finally:
            kernel.close()
    ticks = seconds / INTERVAL_S
    result: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "gpus": GPUS, "contenders": {}}
    for name in runs:
        net = [run - rest for run, rest in zip(runs[name], idle[name], strict=False)]
        result["contenders"][name] = {
            "percent_core": [100 * n / seconds for n in net],
            "us_per_tick": [1e6 * n / ticks for n in net],
            "idle_percent_core": [100 * i / seconds for i in idle[name]],
            "messages_per_s": sent[name] / (rounds * seconds),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
