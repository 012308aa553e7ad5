"""A property over the three frameworks (issue 18, item 5): whatever `%gpu` commands, imports and
first operations a notebook runs, in whatever order, `%gpu status --json` says what each framework
started with, and that is what the framework itself read.

Each example runs in a fresh process (a framework starts once per process), with real TensorFlow,
PyTorch and JAX (their CPU builds).  The expected settings come from a model of the commands the
session accepted (a reply that is not a UsageError) before the framework read them; the framework's
own reading comes from the framework (tests/scripts/frameworks_sequence.py).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.processes import run_scenario

pytest.importorskip("jax")
pytest.importorskip("torch")

COMMANDS = (
    "use 0",
    "use 0,1",
    "use all",
    "grow",
    "grow off",
    "limit 25%",
    "limit 50%",
    "limit off",
    "limit 4G,8G",  # 10% of GPU 0 (40 GiB) and of GPU 1 (80 GiB): one fraction, with `use 0,1`
    "limit 8G,8G",  # 20% and 10%: no one fraction, so JAX gets none
    "allocator async",
    "allocator default",
    "allocator platform",
)
JAX_ALLOCATOR = {None: "default", "default": "default", "async": "cuda_async", "platform": "platform"}
FRACTION = {
    None: None,
    "limit off": None,
    "limit 25%": 0.25,
    "limit 50%": 0.5,
    "limit 4G,8G": 0.1,
    "limit 8G,8G": None,
}


@st.composite
def notebooks(draw) -> list[tuple[str, str]]:
    """Commands, imports and first operations, each first operation after its import."""
    steps = [("cmd", c) for c in draw(st.lists(st.sampled_from(COMMANDS), max_size=6))]
    # JAX always (its start is where most is read); TensorFlow, the slowest to start, now and then.
    others = draw(st.sets(st.sampled_from(["torch", "tensorflow"])))
    for framework in ["jax", *sorted(others)]:
        steps.append(("import", framework))
        if framework != "torch" and draw(st.integers(0, 3)) > 0:  # torch's CPU build never starts CUDA
            steps.append(("start", framework))
    steps = draw(st.permutations(steps))
    for framework in ("jax", "tensorflow"):
        if ("start", framework) in steps:
            i, s = steps.index(("import", framework)), steps.index(("start", framework))
            if s < i:
                steps[i], steps[s] = steps[s], steps[i]
    return steps


class Model:
    """The request as the session accepted it, command by command."""

    def __init__(self) -> None:
        self.visible: str | None = None
        self.growth: bool | None = None
        self.limit: str | None = None
        self.allocator: str | None = None

    def accept(self, command: str) -> None:
        verb, _, value = command.partition(" ")
        if verb == "use":
            self.visible = value
        elif verb == "grow":
            self.growth = value != "off"
        elif verb == "limit":
            self.limit = None if value == "off" else command
        else:
            self.allocator = value

    def jax_start(self) -> dict:
        return {
            "preallocate": self.growth is not True,
            "memory_fraction": FRACTION[self.limit],
            "allocator": JAX_ALLOCATOR[self.allocator],
            "cuda_visible_devices": None if self.visible in (None, "all") else self.visible,
        }


@pytest.mark.slow
@settings(max_examples=16, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(notebooks())
def test_status_says_what_each_framework_started_with_and_the_framework_agrees(steps):
    r = run_scenario("frameworks_sequence", json.dumps(steps))
    model, replies = Model(), iter(r["replies"])
    expected: dict = {}
    for kind, what in steps:
        if kind == "cmd":
            if not next(replies).startswith("UsageError"):
                model.accept(what)
        elif (kind, what) == ("import", "torch"):
            expected["torch_async"] = model.allocator == "async"
        elif (kind, what) == ("start", "jax") and "jax" not in expected:
            expected["jax"] = model.jax_start()
    frameworks = r["frameworks"]
    if "torch_async" in expected:  # what torch parsed at import, what %gpu says, what was asked
        parsed_async = "backend:cudaMallocAsync" in r["own"]["torch_settings"]
        assert parsed_async == expected["torch_async"] == (frameworks["pytorch"]["allocator"] == "async")
    if "jax" in expected:
        own = r["own"]["jax_options"]
        said = frameworks["jax"]["started_with"]
        jax_read = {
            "preallocate": own.get("preallocate", True),
            "memory_fraction": own.get("memory_fraction"),
            "allocator": own["allocator"],
            "cuda_visible_devices": r["own"]["jax_cuda_visible_devices"],
        }
        assert {k: said[k] for k in jax_read} == jax_read == expected["jax"]
    else:
        assert frameworks["jax"]["stage"] in ("not_imported", "imported")
    started_tf = ("start", "tensorflow") in steps
    assert frameworks["tensorflow"]["stage"] == (
        "started" if started_tf else frameworks["tensorflow"]["stage"]
    )
    assert (frameworks["tensorflow"]["stage"] == "not_imported") == (("import", "tensorflow") not in steps)
