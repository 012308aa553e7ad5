"""Plans (what was asked) and GPU numbering (NVML versus CUDA): pure logic."""

from __future__ import annotations

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.command.grammar import Percent
from tfgpu_magic.command.plan import CONTEXT_RESERVE_MIB, MachineFacts, Plan, PlanError, resolve
from tfgpu_magic.gpus.numbering import cuda_to_nvml, visible_env_value

UUIDS = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2", "GPU-dddd-3"]


def test_plan_records_commands():
    plan = Plan().with_command(grammar.Use((0, 2))).with_command(grammar.Grow(True))
    plan = plan.with_command(grammar.Limit((Percent(50),)))
    assert plan.describe() == ["use 0,2", "grow", "limit 50%"]
    assert plan.with_command(grammar.Limit(None)).limits is None


def test_split_sizes_and_a_limit_exclude_each_other():
    with_limit = Plan().with_command(grammar.Limit((4096,)))
    with pytest.raises(PlanError, match="run `%gpu limit off` first"):
        with_limit.with_command(grammar.Split(sizes=(1024, 1024)))
    with_split = Plan().with_command(grammar.Split(sizes=(1024, 1024)))
    with pytest.raises(PlanError, match="run `%gpu split off` first"):
        with_split.with_command(grammar.Limit((4096,)))


def facts(*totals_mib, allocated=None, allocation_text=None, cuda_found=None):
    """A machine with GPUs of these sizes (None: NVML cannot read it)."""
    count = len(totals_mib)
    return MachineFacts(
        count, dict(enumerate(totals_mib)), allocated, allocation_text, cuda_found, tuple(range(count))
    )


def sizes(plan, machine):
    return {g.index: g.logical_mib for g in resolve(plan, machine).gpus}


def test_limits_resolve_per_gpu():
    assert sizes(Plan(limits=(Percent(50),)), facts(40960, 81920)) == {0: (20480,), 1: (40960,)}
    assert sizes(Plan(visible=(1, 3), limits=(4096, 8192)), facts(None, None, None, None)) == {
        1: (4096,),
        3: (8192,),
    }
    with pytest.raises(PlanError, match="NVML cannot read here"):
        resolve(Plan(limits=(Percent(50),)), facts(None))


def test_split_divides_the_limit_or_the_gpu():
    assert sizes(Plan(limits=(4096,), split=grammar.Split(count=2)), facts(40960)) == {0: (2048, 2048)}
    assert sizes(Plan(split=grammar.Split(count=2)), facts(40960)) == {
        0: ((40960 - CONTEXT_RESERVE_MIB) // 2,) * 2
    }
    assert sizes(Plan(split=grammar.Split(sizes=(1024, 512))), facts(None)) == {0: (1024, 512)}
    assert sizes(Plan(), facts(40960)) == {0: None}


def test_the_resolution_names_percentages_per_gpu():
    resolution = resolve(Plan(visible=(1,), limits=(Percent(50),)), facts(81920, 40960))
    assert resolution.describe() == ["use 1", "limit 50%", "per GPU: GPU 1: 20.0 GiB"]
    assert resolution.caps_bytes() == {1: 20480 * 1024 * 1024}


def test_a_gpu_outside_the_allocation_is_refused_naming_it():
    machine = facts(40960, 40960, 40960, 40960, allocated=(2, 3), allocation_text="GPU 2, 3")
    assert resolve(Plan(visible="all"), machine).visible == (2, 3)
    with pytest.raises(
        PlanError, match=r"^GPU 0 is outside this kernel's allocation: the environment allocated GPU 2, 3 "
    ):
        resolve(Plan(visible=(0,)), machine)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "-1,0"}, []),  # CUDA stops at the first invalid entry
        ({"CUDA_VISIBLE_DEVICES": "1,9,2"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-cccc"}, [2]),  # a unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "GPU-"}, []),  # ambiguous prefix
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_cuda_numbering(env, expected):
    assert cuda_to_nvml(env, UUIDS) == expected


def test_visible_env_value():
    assert visible_env_value([1, 3]) == "1,3"
    assert visible_env_value([]) == "-1"


@pytest.mark.parametrize(
    "plan, needs_gpu",
    [
        (Plan(), False),
        (Plan(allocator="default", growth=False, visible="all"), False),  # TensorFlow's own defaults
        (Plan(visible="none", precision="mixed_float16"), False),
        (Plan(visible=(1,)), True),
        (Plan(growth=True), True),
        (Plan(limits=(4096,)), True),
        (Plan(allocator="async"), True),
    ],
)
def test_only_settings_that_need_a_gpu_are_said_not_to_take_effect_without_one(plan, needs_gpu):
    assert plan.gpu_settings is needs_gpu
