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

from json.encoder import encode_basestring_ascii
from typing import Any

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
    if isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + step
        lead = "[" + inner
        for item in value:
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
            out.append(lead)
            out.append(_key(key))
            out.append(": ")
            _write(item, out, inner, step)
            lead = "," + inner
        out.append(newline + "}")
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
