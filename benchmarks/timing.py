"""The timing helpers of the hand-run benchmarks (imported from the script's own folder)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def median_ms(work: Callable[[], object], runs: int) -> float:
    """Median milliseconds of ``work()`` over ``runs`` calls, after one warm-up call (imports,
    NVML's first start, caches that are meant to be warm)."""
    work()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: Sequence[float]) -> tuple[float, float]:
    """(median, 95th percentile)."""
    return statistics.median(samples), quantile(samples, 0.95)


def interleaved(
    contenders: dict[str, Callable[[], object]],
    rounds: int,
    prepare: dict[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Milliseconds of one call of each contender per round, the order rotating every round.

        Rounds alternate the contenders, so a slow spell of the machine (another process, the CPU's
        clock) falls on all of them alike; each is called once first, untimed (its imports and first
        start).  ``prepare[name]`` runs before each timed call of ``name``, untimed (to empty its caches
    for a cold reading).
    """
    names = list(contenders)
    for work in contenders.values():
        work()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            (prepare or {}).get(name, _nothing)()
            start = time.perf_counter()
            contenders[name]()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def _nothing() -> None:
    return None
