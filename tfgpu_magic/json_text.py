"""Indented JSON, the bytes ``json.dumps(value, indent=N, allow_nan=False)`` writes, at about half
its cost: :func:`indented`.

With an indent, the standard library's encoder leaves its C accelerator for a chain of Python
generators, one per level; a status of 64 GPUs and 1,000 processes spent about 7 ms there.  This
writer is one recursive function appending to a list, and leaves each string to the same C
escaping function (``ensure_ascii``), each int and float to their own ``repr``, as ``json`` does.
It takes what the reports hold (dicts with str, int, float, bool or None keys; lists; tuples;
str; int; float; bool; None); anything else raises :class:`NotPlainJson`, and the caller then
asks ``json`` (whose answer, or error, stays the reference).  ``tests/test_json_text.py`` checks
it byte for byte against ``json.dumps`` over generated trees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # the C function json.encoder itself uses; importing json would load its decoder too
    from _json import encode_basestring_ascii
except ImportError:  # an interpreter without json's accelerator
    from json.encoder import encode_basestring_ascii

__all__ = ["NotPlainJson", "indented"]


class NotPlainJson(TypeError):
    """A value outside what :func:`indented` writes (an object ``json`` would pass to ``default``)."""


def indented(value: Any, indent: int) -> str:
    """``json.dumps(value, indent=indent, allow_nan=False)``; raises ValueError for a NaN or an
    infinity, as it does, and :class:`NotPlainJson` for a value it would not write itself."""
    parts: list[str] = []
    _write(value, parts, "\n", " " * indent)
    return "".join(parts)


def _write(value: Any, out: list[str], newline: str, step: str) -> None:
    """``value`` appended to ``out``; ``newline``: a line break and the current level's indent."""
    leaf = _LEAVES.get(type(value))
    if leaf is not None:
        out.append(leaf(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + step
        lead = "[" + inner
        for item in value:
            leaf = _LEAVES.get(type(item))  # most items are leaves: written without a call of _write
            if leaf is not None:
                out.append(lead + leaf(item))
            else:
                out.append(lead)
                _write(item, out, inner, step)
            lead = "," + inner
        out.append(newline + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = newline + step
        lead = "{" + inner
        for key, item in value.items():
            name = _key(key) if type(key) is not str else encode_basestring_ascii(key)
            leaf = _LEAVES.get(type(item))
            if leaf is not None:
                out.append(lead + name + ": " + leaf(item))
            else:
                out.append(lead + name + ": ")
                _write(item, out, inner, step)
            lead = "," + inner
        out.append(newline + "}")
    else:
        _write_subclass(value, out, newline, step)


def _write_subclass(value: Any, out: list[str], newline: str, step: str) -> None:
    """A str, int or float of a subclass (an enum's member, say), written as ``json`` writes it."""
    if isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, (list, tuple, dict)):
        _write(list(value) if not isinstance(value, dict) else dict(value), out, newline, step)
    else:
        raise NotPlainJson(f"not written here: {type(value).__name__}")


def _float(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    return float.__repr__(value)


def _key(key: Any) -> str:
    """A dict key as ``json`` writes it: a string, or a number, bool or None as a string."""
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return '"' + int.__repr__(key) + '"'
    if isinstance(key, float):
        return '"' + _float(key) + '"'
    raise NotPlainJson(f"not a JSON key: {type(key).__name__}")


# Exact types only: a subclass (bool of int, an enum's member of str) takes :func:`_write_subclass`'s way.
_LEAVES: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    float: _float,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}
