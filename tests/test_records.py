"""Record: a frozen dataclass declared ``eq=False, repr=False`` on it compares, hashes and shows
as ``@dataclass(frozen=True)`` would (tfgpu_magic/records.py says why it exists)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfgpu_magic.records import Record


@dataclass(frozen=True)
class Stdlib:
    """The reference: the standard library's frozen dataclass."""

    a: int
    b: str = ""
    c: tuple[int, ...] = ()
    hidden: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, eq=False, repr=False)
class Cheap(Record):
    """The same fields as a record."""

    a: int
    b: str = ""
    c: tuple[int, ...] = ()
    hidden: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, eq=False, repr=False)
class Other(Record):
    """Another record with the same fields."""

    a: int
    b: str = ""
    c: tuple[int, ...] = ()
    hidden: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, eq=False, repr=False)
class One(Record):
    """One field."""

    value: float


@dataclass(frozen=True, eq=False, repr=False)
class Empty(Record):
    """No field."""


values = st.tuples(st.integers(), st.text(max_size=5), st.tuples(st.integers()), st.integers())


@given(values, values)
def test_equality_hash_and_repr_are_the_dataclass_ones(x, y):
    stdlib_x, stdlib_y, cheap_x, cheap_y = Stdlib(*x), Stdlib(*y), Cheap(*x), Cheap(*y)
    assert (cheap_x == cheap_y) == (stdlib_x == stdlib_y)
    assert (cheap_x != cheap_y) == (stdlib_x != stdlib_y)
    assert hash(cheap_x) == hash(Cheap(*x)) and (cheap_x != cheap_y or hash(cheap_x) == hash(cheap_y))
    assert repr(cheap_x) == repr(stdlib_x).replace("Stdlib(", "Cheap(", 1)


def test_another_class_is_never_equal():
    assert Cheap(1) != Other(1) and Cheap(1) != (1, "", (), 0) and Empty() != One(0.0)
    assert Empty() == Empty() and hash(Empty()) == hash(Empty()) and repr(Empty()) == "Empty()"
    assert len({Cheap(1), Cheap(1), Cheap(1, hidden=5), Other(1)}) == 2  # `hidden` is not compared


def test_one_field_compares_as_a_tuple_does():
    nan = math.nan
    assert One(nan) == One(nan)  # the same object: as (nan,) == (nan,), and as the dataclass does
    assert One(1.0) == One(1) and repr(One(0.5)) == "One(value=0.5)"


def test_still_a_frozen_dataclass():
    record = Cheap(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.a = 2  # type: ignore[misc]
    assert dataclasses.replace(record, a=2) == Cheap(2, "x")
    assert dataclasses.asdict(record) == {"a": 1, "b": "x", "c": (), "hidden": 0}
    assert [f.name for f in dataclasses.fields(Cheap)] == ["a", "b", "c", "hidden"]
