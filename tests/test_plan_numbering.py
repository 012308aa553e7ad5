"""Plans (what was asked) and GPU numbering (NVML versus CUDA): pure logic."""

from __future__ import annotations

import pytest

from tfgpu_magic import grammar
from tfgpu_magic.grammar import Percent
from tfgpu_magic.numbering import cuda_to_nvml, visible_env_value
from tfgpu_magic.plan import CONTEXT_RESERVE_MIB, Plan, PlanError, limit_mib, logical_sizes_mib

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


def test_limits_resolve_per_gpu():
    plan = Plan(limits=(Percent(50),))
    assert limit_mib(plan, 0, 40960) == 20480
    assert limit_mib(Plan(limits=(4096, 8192)), 1, None) == 8192
    with pytest.raises(PlanError, match="NVML cannot read here"):
        limit_mib(plan, 0, None)


def test_split_divides_the_limit_or_the_gpu():
    assert logical_sizes_mib(Plan(limits=(4096,), split=grammar.Split(count=2)), 0, 40960) == [2048, 2048]
    whole = logical_sizes_mib(Plan(split=grammar.Split(count=2)), 0, 40960)
    assert whole == [(40960 - CONTEXT_RESERVE_MIB) // 2] * 2
    assert logical_sizes_mib(Plan(split=grammar.Split(sizes=(1024, 512))), 0, None) == [1024, 512]
    assert logical_sizes_mib(Plan(), 0, 40960) is None


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
