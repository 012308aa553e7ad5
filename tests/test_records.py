"""Record: a class declared on it is the frozen dataclass ``@dataclass(frozen=True)`` would make
(its ``__init__``, equality, hash, repr and frozen guards), at a fraction of the cost of defining
it (tfgpu_magic/records.py says why it exists)."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from dataclasses import KW_ONLY, dataclass, field
from typing import ClassVar

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


class Cheap(Record):
    """The same fields as a record."""

    a: int
    b: str = ""
    c: tuple[int, ...] = ()
    hidden: int = field(default=0, compare=False, repr=False)


class Other(Record):
    """Another record with the same fields."""

    a: int
    b: str = ""
    c: tuple[int, ...] = ()
    hidden: int = field(default=0, compare=False, repr=False)


class One(Record):
    """One field."""

    value: float


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
    for copied in (pickle.loads(pickle.dumps(record)), copy.copy(record), copy.deepcopy(record)):
        assert copied == record and hash(copied) == hash(record)  # made without __setattr__


# -- __init__: made at the first record of a class, as the dataclass would make it -------------------
def test_a_class_never_instantiated_compiles_no_init():
    class Unused(Record):
        a: int

    assert Unused.__init__.__code__.co_varnames[:3] == ("self", "args", "kwargs")  # the first-use stand-in
    assert Unused(1).a == 1
    assert Unused.__init__.__code__.co_varnames[:2] == ("self", "a")  # compiled, and kept for the next one


def test_a_field_out_of_order_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        class Wrong(Record):
            a: int = 0
            b: int


def test_factories_defaults_keywords_and_post_init():
    class Made(Record):
        a: int
        items: list[int] = field(default_factory=list)
        label: str = "x"
        fixed: tuple[int, ...] = field(default=(), init=False)
        counted: list[int] = field(default_factory=list, init=False)
        key: str = field(default="k", kw_only=True)

        def __post_init__(self) -> None:
            object.__setattr__(self, "label", self.label.upper())

    first, second = Made(1), Made(2, [3], "y", key="z")
    assert first.items == [] and first.items is not Made(1).items  # a new list each time
    assert (first.label, first.fixed, first.counted, first.key) == ("X", (), [], "k")
    assert (second.items, second.label, second.key) == ([3], "Y", "z")
    with pytest.raises(TypeError):
        Made(1, [], "y", "z")  # type: ignore[misc]  # `key` is keyword-only
    with pytest.raises(TypeError):
        Made()  # type: ignore[call-arg]


def test_a_subclass_adds_fields_and_keeps_its_own_init():
    class Base(Record):
        a: int

    class More(Base):
        b: str = ""

    class Custom(Base):
        def __init__(self, text: str) -> None:
            super().__init__(int(text))

    assert More(1, "x") == More(1, "x") and repr(More(1)).endswith(".More(a=1, b='')")
    assert Custom("7").a == 7 and Base(2).a == 2  # Base's own __init__ compiled for Base, not Custom
    with pytest.raises(dataclasses.FrozenInstanceError):
        del More(1).a


def test_a_field_called_self():
    class Odd(Record):
        self: int

    assert Odd(3).self == 3 and Odd(self=4).self == 4


_FIELD_KINDS = st.sampled_from(["plain", "default", "factory"])


@given(st.lists(_FIELD_KINDS, max_size=6), st.data())
def test_init_matches_the_dataclass_one(kinds, data):
    """Any order of plain, defaulted and factory-made fields (plain ones first, as the dataclass
    requires): the same arguments make the same values, and the same arguments fail with the
    same message.  Without a factory the __init__ is the template's, with one it is compiled."""
    kinds = sorted(kinds, key=lambda kind: kind != "plain")
    names = [f"f{i}" for i in range(len(kinds))]
    namespace: dict[str, object] = {"__annotations__": dict.fromkeys(names, "int")}
    for name, kind in zip(names, kinds, strict=True):
        if kind == "default":
            namespace[name] = -1
        elif kind == "factory":
            namespace[name] = field(default_factory=lambda: [0])
    reference = dataclass(frozen=True)(type("Ref", (), dict(namespace)))
    ours = type("Ours", (Record,), dict(namespace))
    given_args = data.draw(st.lists(st.integers(), max_size=len(kinds) + 1))
    given_kwargs = data.draw(st.dictionaries(st.sampled_from([*names, "other"]), st.integers(), max_size=2))
    outcomes = []
    for cls in (reference, ours):
        try:
            outcomes.append(dataclasses.astuple(cls(*given_args, **given_kwargs)))
        except TypeError as err:  # the same words, the class's name aside
            outcomes.append(str(err).replace(cls.__qualname__, "Record"))
    assert outcomes[0] == outcomes[1]


# -- the dataclass, made at the first use of each class ----------------------------------------------
def test_a_plain_class_is_made_a_dataclass_at_its_first_use_and_not_before():
    class Later(Record):
        a: int
        b: str = "x"

    assert type(vars(Later)["__dataclass_fields__"]).__name__ == "_Undeclared"  # nothing read yet
    assert "__match_args__" not in vars(Later)
    assert dataclasses.is_dataclass(Later)  # asking makes it
    assert isinstance(vars(Later)["__dataclass_fields__"], dict) and Later.__match_args__ == ("a", "b")
    assert [f.name for f in dataclasses.fields(Later)] == ["a", "b"] and Later(1).b == "x"


def test_a_record_made_first_makes_its_class_a_dataclass():
    class Made(Record):
        a: int
        b: str = "x"

    assert dataclasses.asdict(Made(1)) == {"a": 1, "b": "x"}
    assert dataclasses.replace(Made(1), b="y") == Made(1, "y")


def test_a_class_with_a_field_call_is_made_when_defined():
    class Now(Record):
        a: int
        b: int = field(default=5)
        items: list[int] = field(default_factory=list)

    assert isinstance(vars(Now)["__dataclass_fields__"], dict)  # made: the defaults read as the dataclass's
    assert Now.b == 5 and "items" not in vars(Now) and Now(1).items == []


def test_a_subclass_of_a_record():
    class Base(Record):
        a: int
        b: int = 0

    class Child(Base):
        c: int = 1

    assert [f.name for f in dataclasses.fields(Child)] == ["a", "b", "c"]
    assert Child(1) == Child(1, 0, 1) and Base(2).b == 0
    with pytest.raises(TypeError, match="non-default argument 'd' follows default argument"):

        class Wrong(Base):  # the base's `b` has a default: checked when the class is defined
            d: int


def test_what_the_dataclass_refuses_is_refused_when_defined():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        class OutOfOrder(Record):
            a: int = field(default=0)
            b: int

    with pytest.raises(ValueError, match="mutable default"):

        class Mutable(Record):
            items: list[int] = []  # noqa: RUF012  # the mistake refused

    with pytest.raises(TypeError, match="is a field but has no type annotation"):

        class Unannotated(Record):
            a: int
            b = field(default=0)


def test_what_is_not_a_plain_field_is_accepted_as_the_dataclass_accepts_it():
    class Marked(Record):
        a: int = 0
        _: KW_ONLY
        b: int

    class Shared(Record):
        kind: ClassVar[str] = "k"
        a: int

    class KeywordOnly(Record):  # keyword-only and init=False fields take no place in the order
        a: int = field(default=0, kw_only=True)
        hidden: int = field(default=0, init=False)
        b: int = 0

    assert Marked(b=2) == Marked(0, b=2) and [f.name for f in dataclasses.fields(Shared)] == ["a"]
    assert Shared(1).a == 1 and Shared.kind == "k"
    assert KeywordOnly(b=2).b == 2 and KeywordOnly(a=1).a == 1


def test_threads_making_one_class_at_once_agree():
    import sys

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch within the making, as they may on a busy machine
    try:
        _race_first_uses(rounds=50)
    finally:
        sys.setswitchinterval(switching)


def _race_first_uses(rounds: int) -> None:
    import threading

    def first_use(cls: type, barrier: threading.Barrier, seen: list[object]) -> None:
        barrier.wait()
        seen.append([(f.name, f.default) for f in dataclasses.fields(cls)])
        seen.append(cls(1, "y"))

    for _ in range(rounds):

        class Raced(Record):
            a: int
            b: str = "x"

        barrier = threading.Barrier(4)
        seen: list[object] = []
        threads = [threading.Thread(target=first_use, args=(Raced, barrier, seen)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        fields = [[("a", dataclasses.MISSING), ("b", "x")]] * 4
        assert [s for s in seen if isinstance(s, list)] == fields
        assert [s for s in seen if isinstance(s, Raced)] == [Raced(1, "y")] * 4
