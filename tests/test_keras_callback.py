"""MemoryCallback in a real Keras fit (fresh process, CPU allocator statistics on)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.paths import ROOT
from support.processes import run_scenario


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tensorboard")
    return run_scenario("keras_scenario", str(log_dir), env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})


@pytest.mark.slow
def test_history_holds_one_peak_per_epoch(training):
    assert training["keys"] == ["cpu0_peak_bytes", "loss"]
    assert len(training["small"]) == 2
    # The weights are allocated before the first epoch and held through it: every peak covers them.
    assert all(
        isinstance(peak, int) and peak >= training["small_weights_bytes"] for peak in training["small"]
    )
    (wide,) = training["wide"]
    assert wide >= training["wide_weights_bytes"]
    assert wide > max(training["small"])


@pytest.mark.slow
def test_tensorboard_gets_the_same_peaks(training):
    assert training["tensorboard"] == {
        "memory/cpu0_peak_bytes": [[epoch, float(peak)] for epoch, peak in enumerate(training["small"])]
    }


@pytest.mark.slow
def test_keys_follow_tensorflows_device_names(training):
    assert training["log_keys"] == ["gpu0_peak_bytes", "gpu12_peak_bytes", "cpu0_peak_bytes"]
    assert training["tensorflow_before"] is False
    assert training["all_honest"]


def test_importing_the_package_and_the_magic_modules_imports_neither_tensorflow_nor_keras():
    code = (
        "import sys, tfgpu_magic, tfgpu_magic.kernel.trace, tfgpu_magic.kernel.cells, tfgpu_magic.kernel.oom\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    assert out.stdout == "[]\n"


def test_all_is_honest():
    from tfgpu_magic.frameworks import tensorflow as tf_runtime
    from tfgpu_magic.kernel import cells, oom, trace

    for module in (cells, oom, tf_runtime, trace):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
