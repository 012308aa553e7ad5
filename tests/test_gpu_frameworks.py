"""On a real NVIDIA GPU: what `%gpu` promises PyTorch and JAX users, seen by the driver (issue 18).

Marked `gpu`: skipped where NVML cannot start (see conftest.py), so on the CPU-only CI.  Each case
runs in a fresh process (tests/scripts/gpu_frameworks.py), as a notebook's kernel would.
"""

from __future__ import annotations

import pytest

from support.processes import run_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
GIB = 1 << 30


def test_a_4g_limit_makes_a_pytorch_allocation_beyond_it_fail_with_the_explanation():
    pytest.importorskip("torch")
    r = run_scenario("gpu_frameworks", "torch_cap")
    assert r["refused"] is True
    assert r["explanation"].startswith("tfgpu_magic: PyTorch ran out of memory on GPU 0 (PyTorch cuda:0")
    assert "limit: 4,096 MiB (`%gpu limit`, set as fraction" in r["explanation"]


def test_free_after_deleting_a_pytorch_tensor_shows_the_drivers_reading_drop():
    pytest.importorskip("torch")
    r = run_scenario("gpu_frameworks", "torch_free")
    assert r["driver_with_tensor"] - r["driver_after_free"] >= 2 * GIB * 0.9  # the driver's own figure
    assert "Ran torch.cuda.empty_cache()" in r["free"]
    # Said as the driver's reading where NVML lists this process (not in every container's pid namespace).
    assert "went back to the driver (NVML reading)" in r["free"] or "lists no GPU memory" in r["free"]


def test_grow_keeps_jaxs_reservation_small_in_the_drivers_reading():
    pytest.importorskip("jax")
    grown = run_scenario("gpu_frameworks", "jax_grow", "grow")
    default = run_scenario("gpu_frameworks", "jax_grow", "default")
    assert grown["started_with"]["preallocate"] is False and grown["started_with"]["gpu"] is True
    assert grown["driver_after_first_op"] - grown["driver_before"] < 2 * GIB
    assert (
        default["driver_after_first_op"] - default["driver_before"] > default["total"] // 2
    )  # 75% by default
