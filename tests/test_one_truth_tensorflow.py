"""Issue 9 with the real TensorFlow, each scenario in a fresh process (tests/scripts/truth.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support.processes import run_scenario

pytestmark = pytest.mark.slow


def test_a_late_cuda_visible_devices_does_not_change_the_numbering():
    r = run_scenario("truth", "late_cuda_visible_devices")
    assert r["use"] == "use 2: applied to TensorFlow now (imported, not started)"
    assert r["options"]["visible_device_list"] == "2"  # CUDA's device 2 is nvidia-smi's GPU 2
    assert r["tensorflow_view"] == r["status_visible"] == [2]


def test_an_inherited_fastest_first_order_is_replaced_before_cuda_starts_and_said_once():
    r = run_scenario("truth", "inherited_device_order", env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    note = (
        "CUDA_DEVICE_ORDER was 'FASTEST_FIRST'; tfgpu_magic set it to PCI_BUS_ID so that CUDA numbers "
        "the GPUs as nvidia-smi does (before CUDA started, so nothing else changes)"
    )
    assert r["said"] == f"tfgpu_magic: {note}"
    assert r["order"] == r["seen_by_cuda"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert r["notes"] == [note]


def test_the_inherited_allocation_holds_through_use_and_tensorflow():
    r = run_scenario("truth", "allocation", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert r["use_0"].startswith(
        "UsageError: GPU 0 is outside this kernel's allocation: the environment allocated GPU 2, 3"
    )
    assert r["use_all"] == "use all: takes effect when TensorFlow, PyTorch or JAX starts in this kernel"
    assert r["env"] == "2,3"
    assert r["tensorflow_view"] == r["status_visible"] == [2, 3]
    assert r["use_3"] == "use 3: applied to TensorFlow now (imported, not started)"
    assert r["tensorflow_view_3"] == [3]
    assert "allocated by the environment: GPU 2, 3" in r["in_force"]


def test_what_tensorflow_started_with_is_recorded_when_it_starts():
    r = run_scenario("truth", "start_facts")
    assert (r["before"], r["after_device_lib"]) == ("IMPORTED", "ENUMERATED")  # device_lib lists devices
    assert r["started_with"] == {"TF_FORCE_GPU_ALLOW_GROWTH": None, "TF_GPU_ALLOCATOR": None}
    assert r["in_force"] == {"growth": None, "allocator": "default"}  # not the values set by hand later
    assert "memory growth on" not in r["grow_off"]


def test_a_gpu_setting_that_cannot_take_effect_is_said_once_and_precision_still_works():
    r = run_scenario("truth", "no_gpu_note")
    assert r["grow"] == "grow: takes effect when TensorFlow, PyTorch or JAX starts in this kernel"
    assert r["stderr"] == [
        "tfgpu_magic: TensorFlow found no GPU (a CPU-only build, or no working NVIDIA driver), so these GPU "
        "settings cannot take effect: grow. Run `%gpu` for details."
    ]
    assert r["precision"] == "precision mixed_float16: Keras global policy set now"


def test_reset_puts_the_policy_back_and_says_what_cuda_already_read():
    r = run_scenario("truth", "reset_precision")
    assert r["policy_before"] == "mixed_float16" and r["policy_after"] == "float32"
    assert r["reset"] == (
        "forgot: use none; precision mixed_float16\nrequested now: nothing (each framework's defaults)\n"
        "cannot undo: CUDA_VISIBLE_DEVICES=-1 was read by CUDA when TensorFlow listed its devices; "
        "GPUs hidden then stay hidden until the kernel restarts"
    )
    assert r["env"] is None  # the variable is back as the kernel inherited it


# -- the property ----------------------------------------------------------------------------------------
COMMANDS = st.sampled_from(
    [
        "use 0",
        "use 1",
        "use 2,3",
        "use 1,3",
        "use all",
        "use none",
        "grow",
        "grow off",
        "limit 4G",
        "limit 50%",
        "limit off",
        "split 2",
        "split off",
        "allocator async",
        "reset",
    ]
)
HAND_MADE = st.sampled_from(
    [
        "CUDA_VISIBLE_DEVICES=1",
        "CUDA_VISIBLE_DEVICES=0,2",
        "TF_FORCE_GPU_ALLOW_GROWTH=true",
        "TF_FORCE_GPU_ALLOW_GROWTH=false",
    ]
)
STEP = st.one_of(
    st.tuples(st.just("gpu"), COMMANDS),
    st.tuples(st.just("env"), HAND_MADE),
    st.tuples(st.just("import"), st.just("")),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=7))
@example(
    [("import", ""), ("env", "CUDA_VISIBLE_DEVICES=1"), ("gpu", "use 2,3"), ("gpu", "limit 50%")]
)  # defect 1
@example(
    [("gpu", "use all"), ("env", "CUDA_VISIBLE_DEVICES=1"), ("import", "")]
)  # set by hand after `use all`
@example([("gpu", "use none"), ("env", "CUDA_VISIBLE_DEVICES=1"), ("import", "")])  # ... after `use none`
@example([("gpu", "limit 4G"), ("env", "CUDA_VISIBLE_DEVICES=0,2"), ("import", "")])  # ... after no `use`
def test_status_says_what_tensorflow_would_start_with(steps):
    r = run_scenario("truth", "steps", json.dumps(steps))
    assert r["status_visible"] == r["tensorflow_view"], r  # numbering: never disagree
    refused = [n for n in r["notes"] if n.startswith(("could not apply", "the request cannot hold"))]
    if not refused:  # the request took effect: what was resolved is what TensorFlow has
        assert r["resolved"]["visible"] == r["tensorflow_view"], r
        sized = [g["logical_mib"] for g in r["resolved"]["gpus"] if g["logical_mib"]]
        assert sorted(map(tuple, sized)) == sorted(tuple(v) for v in r["virtual_mib"] if v), r
    growth = [line for line in r["in_force"] if "TF_FORCE_GPU_ALLOW_GROWTH" in line]
    assert bool(growth) == (r["env_growth"] is not None), r  # the start environment as it stands
