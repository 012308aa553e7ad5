"""The page's reader of the reply (js/lab/reply.ts) finds no fault in exactly the replies the schema allows.

The samples come from the shipped schema (tfgpu_magic/server/schema/status-reply.v1.json), not
from hand-written replies: valid ones are drawn from it (every optional key present or absent,
each nullable field either way, lists of none to three items), and invalid ones are valid ones
with one place changed by what the schema says of that place: a required key removed, a value of
a type it does not allow, a number past its minimum or maximum, a value other than its const,
a key it does not know, a GPU index key that is not one.  jsonschema confirms each sample is
what it is meant to be; then ``readReply`` runs over all of them in one Node process.  A valid
reply must come back with no problem and every value as sent; an invalid one must be refused
(one line) or come back with at least one problem.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tfgpu_magic.server.kernel_inventory import VERSION
from tfgpu_magic.server.schema import FILE_NAME, status_reply_schema

from support.reply_schema import reply_problems
from support.typescript import run_in_node

SCHEMA = status_reply_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
WORDS = ["", "a", "python3", "GPU-0", "é ü", "kernel null", "2026-11-22T10:00:00.000000Z", "\u202e"]


def resolve(node_schema: dict) -> dict:
    while "$ref" in node_schema:
        node_schema = SCHEMA["$defs"][node_schema["$ref"].rsplit("/", 1)[1]]
    return node_schema


def branches(node_schema: dict) -> list[dict]:
    node_schema = resolve(node_schema)
    if "oneOf" in node_schema:
        return [b for branch in node_schema["oneOf"] for b in branches(branch)]
    types = node_schema.get("type")
    if isinstance(types, list):
        return [{**node_schema, "type": t} for t in types]
    return [node_schema]


# -- valid samples, drawn from the schema ---------------------------------------------------------
def draw(node_schema: dict, rng: random.Random, depth: int = 0) -> Any:
    choices = branches(node_schema)
    branch = rng.choice(choices)
    if "const" in branch:
        return branch["const"]
    kind = branch.get("type")
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        text = rng.choice(WORDS)
        return text or "x" if branch.get("minLength") else text
    if kind in ("integer", "number"):
        low = branch.get("minimum", branch.get("exclusiveMinimum", 0))
        high = branch.get("maximum", low + 10**12)
        value = rng.choice([low, high, rng.randint(int(low), int(min(high, low + 10**12)))])
        if kind == "number":
            value = rng.choice([value, min(high, value + 0.25)])
        return value + 0.5 if "exclusiveMinimum" in branch and value == low else value
    if kind == "array":
        return [draw(branch["items"], rng, depth + 1) for _ in range(rng.randint(0, 3 if depth < 2 else 1))]
    if kind == "object" or "properties" in branch:
        out = {}
        for key, sub in branch.get("properties", {}).items():
            if key in branch.get("required", []) or rng.random() < 0.5:
                out[key] = draw(sub, rng, depth + 1)
        if "propertyNames" in branch:  # a map: GPU index -> bytes or null
            for _ in range(rng.randint(0, 3)):
                out[str(rng.choice([0, 1, 7, 9999]))] = draw(branch["additionalProperties"], rng, depth + 1)
        return out
    raise AssertionError(f"the sampler does not know {branch}")


def valid_samples(count: int) -> list[dict]:
    rng = random.Random(20261126)
    return [draw(SCHEMA, rng) for _ in range(count)]


# -- invalid samples: one place of a valid one changed by what the schema says there ---------------
def places(value: Any, node_schema: dict, path: tuple = ()) -> Iterator[tuple[tuple, dict, Any]]:
    """Each place of a valid ``value`` with the schema branch that holds there."""
    [branch] = [b for b in branches(node_schema) if fits(value, b)] or [resolve(node_schema)]
    yield path, resolve(node_schema), value
    if isinstance(value, dict):
        properties = branch.get("properties", {})
        for key, item in value.items():
            yield from places(item, properties.get(key, branch.get("additionalProperties", {})), (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from places(item, branch["items"], (*path, i))


def replaced(reply: dict, path: tuple, new: Any) -> dict:
    reply = copy.deepcopy(reply)
    *parents, last = path
    target = reply
    for step in parents:
        target = target[step]
    target[last] = new
    return reply


def removed(reply: dict, path: tuple, key: str) -> dict:
    reply = copy.deepcopy(reply)
    target = reply
    for step in path:
        target = target[step]
    del target[key]
    return reply


def invalid_samples(reply: dict) -> Iterator[tuple[str, str, dict]]:
    """(kind, where, sample) for each change the schema refuses at each place of ``reply``."""
    for path, node_schema, value in places(reply, SCHEMA):
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        allowed = branches(node_schema)
        if isinstance(value, dict):
            for branch in allowed:
                for key in branch.get("required", []) if key_in(value, branch) else []:
                    yield "a required key missing", f"{where}.{key}", removed(reply, path, key)
                if branch.get("additionalProperties") is False:
                    yield "an unknown key", where, replaced(reply, (*path, "surplus"), 1)
                if "propertyNames" in branch:
                    yield "a key out of its pattern", where, replaced(reply, (*path, "gpu0"), 1)
        if not path:
            continue
        for other in ("x", 7, 0.5, True, None, [], {}):
            yield "a wrong type", where, replaced(reply, path, other)
        for branch in allowed:
            if "const" in branch:
                const = branch["const"]  # a version number, or a word ("process", "device")
                other_value = const + "x" if isinstance(const, str) else const + 1
                yield "an unknown const value", where, replaced(reply, path, other_value)
            for bound, step in (("minimum", -1), ("maximum", 1), ("exclusiveMinimum", 0)):
                if bound in branch:
                    yield "a value out of range", where, replaced(reply, path, branch[bound] + step)
            if branch.get("minLength"):
                yield "a value out of range", where, replaced(reply, path, "")


def key_in(value: dict, branch: dict) -> bool:
    """Whether ``value`` is this object branch's (a MIG row is one of two)."""
    return branch.get("type") == "object" and fits(value, branch)


def fits(value: Any, branch: dict) -> bool:
    """Whether ``value`` is valid under one branch of the schema (its references still resolve)."""
    return jsonschema.Draft202012Validator({**branch, "$defs": SCHEMA["$defs"]}).is_valid(value)


# -- the check in Node ------------------------------------------------------------------------------
def read_in_node(tmp_path: Path, bodies: list) -> list:
    """readReply over each body, in one Node process."""
    return run_in_node(tmp_path, "reply.js", [("readReply", [body]) for body in bodies])


def sent_as_read(sent: Any, read: Any) -> bool:
    """Every value sent comes back as sent (the page may add keys it fills with null)."""
    if isinstance(sent, dict):
        return isinstance(read, dict) and all(k in read and sent_as_read(v, read[k]) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(read, list) and len(sent) == len(read) and all(map(sent_as_read, sent, read))
    return (sent == read and type(sent) is type(read)) or (isinstance(sent, float) and sent == read)


def test_the_schema_is_versioned_as_the_reply_is():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert FILE_NAME == f"status-reply.v{VERSION}.json"
    assert re.search(rf"[^0-9]v{VERSION}\.json$", SCHEMA["$id"])
    assert SCHEMA["properties"]["version"] == {**SCHEMA["properties"]["version"], "const": VERSION}
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_page_finds_no_fault_in_exactly_the_replies_the_schema_allows(tmp_path):
    valid = valid_samples(40)
    assert all(reply_problems(v) == [] for v in valid), "the sampler drew a reply the schema refuses"
    rich = max(valid, key=lambda v: len(json.dumps(v)))
    invalid = list(invalid_samples(rich))
    # A change can happen to be allowed (a wrong type where null is allowed): only those refused count.
    invalid = [(kind, where, s) for kind, where, s in invalid if reply_problems(s)]
    kinds = {kind for kind, _, _ in invalid}
    assert kinds >= {
        "a required key missing",
        "a wrong type",
        "a value out of range",
        "an unknown const value",
        "an unknown key",
        "a key out of its pattern",
    }

    read = read_in_node(tmp_path, valid + [s for _, _, s in invalid])
    for sent, got in zip(valid, read[: len(valid)], strict=True):
        assert isinstance(got, dict) and got["problems"] == [], (sent, got)
        assert sent_as_read(sent, got["reply"]), (sent, got["reply"])
    missed = [
        f"{kind} at {where}"
        for (kind, where, _), got in zip(invalid, read[len(valid) :], strict=True)
        if isinstance(got, dict) and not got["problems"]
    ]
    assert not missed, (
        f"{len(missed)} of {len(invalid)} invalid replies read without a problem: {missed[:20]}"
    )


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"pids_visible": "yes"}, "$.pids_visible: not true or false or null"),
        (
            {"hidden_processes": [{"gpu": 0, "pid": 5, "used_memory_bytes": -1, "note": "x"}]},
            "$.hidden_processes[0].used_memory_bytes: not a whole number of bytes or null",
        ),
        (
            {"culler": {"idle_after_s": 0, "min_memory_bytes": 1, "free_below_bytes": None}},
            "$.culler.idle_after_s: not a number > 0",
        ),
    ],
)
def test_a_problem_says_where_and_what(tmp_path, change, problem):
    reply = {**valid_samples(1)[0], **change}
    [got] = read_in_node(tmp_path, [reply])
    assert problem in got["problems"]
