"""Issue 10, finding 1: the panel never breaks TensorFlow's import (20 fresh kernels)."""

from __future__ import annotations

import pytest

from conftest import run_scenario

pytestmark = pytest.mark.slow

RUNS = 20


def test_monitor_then_import_tensorflow_never_fails():
    outcomes = [run_scenario("monitor_then_import") for _ in range(RUNS)]
    failures = [o["error"] for o in outcomes if o["error"] is not None]
    assert failures == [], f"{len(failures)} of {RUNS} imports failed: {failures[:3]}"
    assert all(o["total"] == 16.0 for o in outcomes)
    assert all(o["tf_device_sampled"] for o in outcomes)  # once imported, the sampler reads TensorFlow
