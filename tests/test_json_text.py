"""json_text.indented: byte for byte what json.dumps writes with an indent, for any report-like tree."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfgpu_magic.json_text import NotPlainJson, indented
from tfgpu_magic.safe_text import strict_json

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # any code point: controls, surrogates, emoji, quotes and backslashes
)
keys = (
    st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False, allow_infinity=False)
)
trees = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=30,
)


@given(trees, st.integers(min_value=0, max_value=4))
def test_the_bytes_json_dumps_writes(tree, indent):
    assert indented(tree, indent) == json.dumps(tree, indent=indent, allow_nan=False)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_as_json_refuses_them(bad):
    for tree in ({"a": [1, bad]}, {bad: 1}):
        with pytest.raises(ValueError):
            json.dumps(tree, indent=2, allow_nan=False)
        with pytest.raises(ValueError):
            indented(tree, 2)


def test_anything_else_is_left_to_json():
    with pytest.raises(NotPlainJson):
        indented({"a": {1, 2}}, 2)
    with pytest.raises(NotPlainJson):
        indented({(1, 2): 1}, 2)


@given(trees)
def test_strict_json_writes_what_it_wrote_before(tree):
    """strict_json with an indent: json.dumps's bytes, NaN and infinities as null, said in notes."""
    assert strict_json(tree, indent=2) == json.dumps(tree, indent=2, allow_nan=False)


def test_strict_json_still_nulls_a_nan_and_says_where():
    written = json.loads(strict_json({"value": math.nan, "notes": []}, indent=2))
    assert written["value"] is None and "value (nan)" in written["notes"][0]


def test_subclasses_are_written_as_json_writes_them():
    import collections
    import enum
    from typing import NamedTuple

    class Level(enum.IntEnum):
        HIGH = 3

    class Word(str, enum.Enum):
        ON = "on"

    class Pair(NamedTuple):
        a: int
        b: str

    tree = {
        "level": Level.HIGH,
        "word": Word.ON,
        "pair": Pair(1, "x"),
        "ordered": collections.OrderedDict([("z", 1), ("a", [True, None, 0.5])]),
        Level.HIGH: "an int key",
    }
    assert indented(tree, 2) == json.dumps(tree, indent=2, allow_nan=False)
