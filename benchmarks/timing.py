"""The one timing helper of the hand-run benchmarks (imported from the script's own folder)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


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
