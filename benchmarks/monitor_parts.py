"""Where the monitor's CPU goes at 10 samples a second: ``%gpu monitor`` with one part left out at a time.

Run by hand (``.venv/bin/python benchmarks/monitor_parts.py [ROUNDS] [SECONDS]``, default 6 rounds
of 10 s windows, about 7 minutes).  In one real kernel on ``vs_monitor.py``'s stand-in (8 busy
GPUs), windows taken in turn, the order turning each round, each one the kernel's CPU (all
threads) less the same kernel idle in that round, per tick (medians):

- the monitor as it is;
- without its message: the panel's ``send`` does nothing (the batch is still built);
- without the utilization fill: the hand-on reads no driver samples and fills nothing (the GPUs
  are still marked as sampled, so no tick reads utilization either);
- its ticks only: the hand-on drops the readings (no packing, fill, panel or message; the plan is
  still made again every hand-on, as the thread does);
- ``vs_monitor.py``'s floor, and the floor without its message.

A part's cost is the monitor's figure less the figure without it, from windows of one run.  The
parts are taken out by replacing methods in the kernel between windows and restoring them after:
a measurement, never a way to run the monitor.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import standin
from vs_monitor import BATCH, GPUS, INTERVAL_S, Kernel, cpu_seconds, window

# Run once in the kernel: keeps the methods the variants replace, to restore them.
KEEP = """
from tfgpu_magic.kernel import monitor as _parts_monitor, widget as _parts_widget
_parts_kept = {  # None: inherited (MemoryPanel.send is ipywidgets'), so restored by deleting the override
    (cls, name): vars(cls).get(name)
    for cls, name in (
        (_parts_monitor.Sampler, "_fill_utilization"),
        (_parts_monitor.Sampler, "_hand_on"),
        (_parts_widget.MemoryPanel, "send"),
    )
}
def _parts_restore():
    for (cls, name), method in _parts_kept.items():
        if method is not None:
            setattr(cls, name, method)
        elif name in vars(cls):
            delattr(cls, name)
def _parts_mark_sampled(sampler, plans):
    # What a fill finds on the stand-in: every GPU's utilization comes from the driver's samples.
    for plan in plans:
        if plan is not None:
            for index in plan.indices:
                sampler._from_samples.setdefault(index, True)
def _parts_no_fill(self, waiting):
    _parts_mark_sampled(self, [plan for _, plan in waiting])
def _parts_drop(self):
    self._plan_now = None
    with self._lock:
        taken = list(self._taken)
        self._taken.clear()
        self._waiting.clear()
    _parts_mark_sampled(self, [plan for _, plan, _, _ in taken])
    return []
"""

MONITOR = ("%gpu monitor --interval 0.1", "%gpu monitor off")
VARIANTS = {
    "the monitor as it is": ("", MONITOR),
    "without its message": ("_parts_widget.MemoryPanel.send = lambda self, *a, **k: None", MONITOR),
    "without the utilization fill": ("_parts_monitor.Sampler._fill_utilization = _parts_no_fill", MONITOR),
    "its ticks only": ("_parts_monitor.Sampler._hand_on = _parts_drop", MONITOR),
    "the floor": ("", (f"_bench_floor_start({INTERVAL_S}, {BATCH})", "_bench_floor_end()")),
    "the floor without its message": ("", (f"_bench_floor_start({INTERVAL_S}, 10**9)", "_bench_floor_end()")),
}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    names = list(VARIANTS)
    used: dict[str, list[float]] = {name: [] for name in names}
    idle: list[float] = []
    with standin.Sleepers(2 * GPUS) as sleepers:
        kernel = Kernel(sleepers.pids)
        try:
            kernel.run(KEEP)
            for round_ in range(rounds):
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    patch, (start, stop) = VARIANTS[name]
                    kernel.run(f"_parts_restore()\n{patch}")
                    used[name].append(
                        window(kernel.pid, seconds, partial(kernel.run, start), partial(kernel.run, stop))[0]
                    )
                kernel.run("_parts_restore()")
                before = cpu_seconds(kernel.pid)
                time.sleep(seconds)
                idle.append(cpu_seconds(kernel.pid) - before)
                print(f"round {round_ + 1} of {rounds} done", file=sys.stderr, flush=True)
        finally:
            kernel.close()
    ticks = seconds / INTERVAL_S
    print(
        f"{rounds} rounds of {seconds:g} s windows, the kernel's CPU less idle, per tick at 10 Hz (medians)"
    )
    for name in names:
        per_tick = [1e6 * (u - i) / ticks for u, i in zip(used[name], idle, strict=True)]
        windows = ", ".join(f"{v:.0f}" for v in per_tick)
        print(f"  {name:32s} {statistics.median(per_tick):6.0f} us   (windows: {windows})")


if __name__ == "__main__":
    main()
