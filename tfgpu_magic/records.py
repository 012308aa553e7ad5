"""Frozen records that cost little to define: :class:`Record`.

A class declared

    class Reading(Record):
        index: int
        notes: tuple[str, ...] = ()

is a frozen dataclass: ``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work,
assigning a field raises ``FrozenInstanceError``, and equality, hash and repr are those
``@dataclass(frozen=True)`` would make.  Only its cost differs.

Before Python 3.13, ``@dataclass(frozen=True)`` compiles source for each class it makes: an
``__init__``, a ``__repr__``, an ``__eq__`` and the frozen ``__setattr__`` and ``__delattr__``,
about 0.06 ms each.  A fresh ``tfgpu --json`` defines some sixty record classes and uses about
twenty, and that compiling was over half of its imports' time.  Here the frozen guards, equality,
hash and repr are written once, on :class:`Record`, for every record; and a class of plain
fields (see :func:`_plainly_declared`; any other is made when defined) is made a dataclass (its
fields read: about 0.05 ms), and given its ``__init__``, the first time one of its records is made
or its fields are asked for, so a class never used costs next to nothing.
Most records have only positional fields, given or defaulted: their ``__init__`` is one compiled
template per number of fields with the class's names put in.  The others (factories, keyword-only
fields, ``__post_init__``) have theirs compiled from source, as the dataclass would.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect  # imported by dataclasses already
import sys
import threading
from collections.abc import Callable
from operator import attrgetter
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # in typing from Python 3.11
else:

    def dataclass_transform(**_: Any) -> Callable[[type], type]:
        return lambda cls: cls  # only type checkers read it


__all__ = ["Record"]

_Values = Callable[[Any], tuple[Any, ...]]


# For type checkers: a subclass's fields make its __init__ and its instances are frozen, as
# @dataclass(frozen=True) would have them (PEP 681).
@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
class Record:
    """A frozen dataclass that compares, hashes and shows as ``@dataclass(frozen=True)`` would:
    equal when of the same class with equal fields (those with ``compare``), hashed on those
    fields (or those with ``hash=True``), shown as ``Name(field=value, ...)`` (those with
    ``repr``)."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__doc__ is None:
            cls.__doc__ = cls.__name__  # else the dataclass inspects a signature to write one
        if _plainly_declared(cls):
            type.__setattr__(cls, _FIELDS, _Undeclared(cls))  # the dataclass made at first use
        else:  # made now: the dataclass's own checks refuse a mistake when the class is defined
            _make_dataclass(cls)
        if "__init__" not in cls.__dict__:
            type.__setattr__(cls, "__init__", _first_init(cls))

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

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


# -- the dataclass, made at the first use of each class -------------------------------------------
_FIELDS = "__dataclass_fields__"  # what dataclasses.fields, is_dataclass, replace and asdict read
# Held while a class is made a dataclass: two threads making one class at once fail (the
# dataclasses module walks the class while the other thread sets its attributes: "dictionary
# changed size during iteration").  Held only while that module reads our own class (no user
# code runs); an RLock, as making a class makes its bases first.
_MAKING = threading.RLock()


class _Undeclared:
    """A record class's ``__dataclass_fields__`` until something reads it: the first read (a
    record made, ``dataclasses.fields``, ``is_dataclass``...) makes the class a dataclass, which
    puts the real fields in this one's place."""

    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, dataclasses.Field[Any]]:
        fields: dict[str, dataclasses.Field[Any]] = getattr(_make_dataclass(self.cls), _FIELDS)
        return fields


def _make_dataclass(cls: type) -> type:
    """``cls`` made a dataclass (its fields read; nothing compiled), once."""
    with _MAKING:
        if isinstance(cls.__dict__.get(_FIELDS), _Undeclared) or _FIELDS not in cls.__dict__:
            dataclasses.dataclass(cls, init=False, repr=False, eq=False)  # puts the fields in place
            _check_order(cls, [f for f in dataclasses.fields(cls) if f.init])
    return cls


_NOT_PLAIN = ("ClassVar", "InitVar", "KW_ONLY")  # annotations that are not plain fields


def _plainly_declared(cls: type) -> bool:
    """Whether ``cls`` can wait to be made a dataclass: its fields are its own annotations, each
    plain (no ``ClassVar``, ``InitVar`` or ``KW_ONLY``), in order (none without a default after
    one with), with no ``field()`` and no default the dataclass refuses (a mutable one).  Any
    other class is made when defined, so the dataclass's own checks, and :func:`_check_order`,
    refuse its mistakes there as they did, and reading a ``field()``'s default on the class gives
    the default.  What a class made later lacks until then: ``__match_args__`` (nothing here
    matches records by position)."""
    if any(_FIELDS in vars(base) for base in cls.__mro__[1:]):
        return False  # fields inherited from a record
    annotations = inspect.get_annotations(cls)  # its own, in order
    defaulted = False
    for name, value in cls.__dict__.items():
        if isinstance(value, dataclasses.Field) and name not in annotations:
            return False  # a field() without an annotation: the dataclass refuses it
    for name, annotation in annotations.items():
        shown = annotation if isinstance(annotation, str) else repr(annotation)
        if any(word in shown for word in _NOT_PLAIN):
            return False
        value = cls.__dict__.get(name, dataclasses.MISSING)
        if isinstance(value, dataclasses.Field) or (
            value is not dataclasses.MISSING and type(value).__hash__ is None
        ):
            return False  # a field(), or a mutable default the dataclass refuses
        if value is not dataclasses.MISSING:
            defaulted = True
        elif defaulted:
            return False  # out of order: _check_order says so when the class is made, now
    return True


# -- __init__, compiled at the first record of each class --------------------------------------------
def _check_order(cls: type, fields: list[dataclasses.Field[Any]]) -> None:
    defaulted = None
    for f in fields:
        if f.kw_only:
            continue
        if _has_default(f):
            defaulted = f.name
        elif defaulted is not None:
            raise TypeError(f"{cls.__qualname__}: non-default argument {f.name!r} follows default argument")


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _first_init(cls: type) -> Callable[..., None]:
    """An ``__init__`` for ``cls`` that compiles the real one, puts it on ``cls`` and runs it.
    (Two threads racing here each compile the same function: harmless.)"""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls)
        type.__setattr__(cls, "__init__", init)
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _compile_init(cls: type) -> Callable[..., None]:
    """The ``__init__`` ``@dataclass(frozen=True)`` would have given ``cls``: each field set with
    ``object.__setattr__``, factories called for fields not given, then ``__post_init__``."""
    fields = dataclasses.fields(cls)
    if _is_plain(cls, fields):
        init = _from_template(cls, fields)
    else:
        init = _from_source(cls, fields)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _is_plain(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> bool:
    """Positional fields, each given or defaulted, and nothing else to run: most records."""
    return not hasattr(cls, "__post_init__") and all(
        f.init and not f.kw_only and f.default_factory is dataclasses.MISSING and f.name != "self"
        for f in fields
    )


@functools.cache
def _template(arity: int) -> CodeType:
    """The code of ``def __init__(self, _0, ..., _n): __record_set__(self, "_0", _0) ...`` for ``arity`` fields."""
    names = [f"_{i}" for i in range(arity)]
    body = "".join(f"  __record_set__(self, {n!r}, {n})\n" for n in names) or "  pass\n"
    scope: dict[str, Any] = {}
    exec(f"def __init__({', '.join(['self', *names])}):\n{body}", scope)
    code: CodeType = scope["__init__"].__code__
    return code


def _from_template(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """A plain record's ``__init__``: the template of its arity with the fields' names put in
    (compiling costs some 0.08 ms a class; this, a microsecond).  Arguments, defaults and the
    messages of a wrong call are then those of the compiled function."""
    template = _template(len(fields))
    named = {f"_{i}": f.name for i, f in enumerate(fields)}
    code = template.replace(
        co_varnames=("self", *(f.name for f in fields)),
        co_consts=tuple(named.get(c, c) if isinstance(c, str) else c for c in template.co_consts),
    )
    if sys.version_info >= (3, 11):  # Python 3.11+ names the function in a wrong call's message from it
        code = code.replace(co_qualname=f"{cls.__qualname__}.__init__")
    defaults = tuple(f.default for f in fields if f.default is not dataclasses.MISSING)
    return FunctionType(code, {"__record_set__": object.__setattr__}, "__init__", defaults or None)


_NO_VALUE = object()  # the default of a field whose default is made by a factory


def _from_source(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """Any record's ``__init__``, compiled from source: factories, keyword-only fields, fields
    not in ``__init__``, ``__post_init__``."""
    names = {f.name for f in fields}
    me = "__record_self__" if "self" in names else "self"
    scope: dict[str, Any] = {"__record_set__": object.__setattr__, "_NO_VALUE": _NO_VALUE}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        value = f.name
        if f.default_factory is not dataclasses.MISSING:
            scope[f"_factory_{i}"] = f.default_factory
            if f.init:
                body.append(f"  if {f.name} is _NO_VALUE: {f.name} = _factory_{i}()")
            else:
                value = f"_factory_{i}()"
            default = "=_NO_VALUE"
        elif f.default is not dataclasses.MISSING:
            scope[f"_default_{i}"] = f.default
            value = f.name if f.init else f"_default_{i}"
            default = f"=_default_{i}"
        else:
            default = ""
        if f.init:
            (keyword if f.kw_only else positional).append(f.name + default)
        body.append(f"  __record_set__({me}, {f.name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append(f"  {me}.__post_init__()")
    parameters = ", ".join([me, *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({parameters}) -> None:\n" + "\n".join(body or ["  pass"])
    exec(source, scope)  # the source is made above from the class's own field names
    init: Callable[..., None] = scope["__init__"]
    return init


# -- equality, hash and repr: the fields' values, read through one getter per class -------------------
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
