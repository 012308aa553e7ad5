"""Frozen records that cost little to define: :class:`Record`.

Before Python 3.13, ``@dataclass(frozen=True)`` compiles six methods from source for each class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), about
0.05 ms each; a fresh ``tfgpu --json`` defines some sixty such classes, which was about half of
its imports' time.  A class declared

    @dataclass(frozen=True, eq=False, repr=False)
    class Reading(Record): ...

is the same frozen dataclass (``fields``, ``replace``, ``asdict`` and ``FrozenInstanceError`` as
before) with the same equality, hash and repr, but these three come from :class:`Record`, shared
by every record: they read the fields' values through one getter per class, made at its first
comparison.  Only ``__init__`` and the frozen guards are compiled for the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any

__all__ = ["Record"]

_Values = Callable[[Any], tuple[Any, ...]]


class Record:
    """Equality, hash and repr of a frozen dataclass declared with ``eq=False, repr=False``, as
    ``@dataclass(frozen=True)`` would have made them: equal when of the same class with equal
    fields (those with ``compare``), hashed on those fields (or those with ``hash=True``), shown
    as ``Name(field=value, ...)`` (those with ``repr``)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        values = _getters(self.__class__)[0]
        return values(self) == values(other)

    def __hash__(self) -> int:
        return hash(_getters(self.__class__)[1](self))

    def __repr__(self) -> str:
        shown = _getters(self.__class__)[2]
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"


def _getters(cls: type) -> tuple[_Values, _Values, tuple[str, ...]]:
    """(the compared values, the hashed values, the names shown) of ``cls``'s records, made once."""
    made = cls.__dict__.get("_record_getters")
    if made is None:
        fields = dataclasses.fields(cls)
        compared = tuple(f.name for f in fields if f.compare)
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        made = (_values(compared), _values(hashed), tuple(f.name for f in fields if f.repr))
        type.__setattr__(cls, "_record_getters", made)  # the same for every caller: a race only repeats this
    return made


def _values(names: tuple[str, ...]) -> _Values:
    """A function giving the tuple of an object's attributes ``names`` (a tuple, as a dataclass
    compares them, even of one field)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()
