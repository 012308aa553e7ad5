"""Text that others chose, made safe to show: :func:`safe` and :func:`safe_tree`.

Command lines, user names, claim records and GPU names come from other users and the OS.
Printed as they are, an escape sequence in a command line could clear the screen, retitle
the terminal, plant a hyperlink or write to the clipboard; a newline could start a line that
looks like one of ours; a bidi override could reverse what follows; bytes that are not UTF-8
(Python's surrogate escapes) would make ``print`` raise.  :func:`safe` shows every such
character as a visible escape instead, in the style of ``repr``: ``\\n``, ``\\r``, ``\\t``,
``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\U000e0041``; a byte that was not UTF-8 shows as
``\\xff``.  Printable text of any script stays as it is.  A backslash is left alone, so a
shown ``\\x1b`` may also be those four characters typed; either way nothing acts on the
terminal.

:func:`bounded` is :func:`safe` cut to a number of characters, with a trailing "…" when cut: what
other users' command lines and names are made at the source (``gpus.owners``).  :func:`strict_json`
is how every JSON this product writes is written (the server's reply, ``%gpu status --json``,
``tfgpu --json``): non-finite floats become null (said in the value's ``notes``), never the bare
``NaN`` / ``Infinity`` that ``JSON.parse`` refuses.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

__all__ = ["CUT", "bounded", "finite_tree", "safe", "safe_tree", "strict_json"]

CUT = "…"  # ends a text that was cut

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def safe(text: str) -> str:
    """``text`` with every control, format, separator and surrogate character escaped.

    Escaped: C0 and C1 controls and DEL (category Cc, which covers ESC and so every CSI, OSC
    and DCS sequence), format characters (Cf: bidi overrides and isolates, zero-width
    characters, tags), line and paragraph separators (Zl, Zp), surrogates (Cs), private-use
    (Co) and unassigned (Cn) code points.  Spaces of any kind (Zs) stay.
    """
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(ch if ch.isprintable() or unicodedata.category(ch) == "Zs" else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: a byte that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_tree(value: Any) -> Any:
    """A copy of JSON-like data (dicts, lists, tuples) with :func:`safe` applied to every string, keys too."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, dict):
        return {safe_tree(k): safe_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [safe_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(safe_tree(v) for v in value)
    return value


def bounded(text: str, most: int, cut: bool = False) -> str:
    """``safe(text)`` in at most ``most`` characters: a longer one (or one already ``cut`` where it
    was read) ends with "…".  Costs O(most), whatever the length of ``text``."""
    head = text[: most + 1]  # escaping only lengthens: more than `most` characters stays more
    shown = safe(head)
    if not (cut or len(text) > len(head) or len(shown) > most):
        return shown
    room, kept, used = max(most - 1, 0), [], 0
    for ch in head:  # whole escapes only: never a "\u202" that reads as a broken one
        piece = ch if ch.isprintable() or unicodedata.category(ch) == "Zs" else _escape(ch)
        if used + len(piece) > room:
            break
        kept.append(piece)
        used += len(piece)
    return "".join(kept) + CUT


def finite_tree(value: Any, path: str = "") -> tuple[Any, list[tuple[str, float]]]:
    """A copy of JSON-like data with every NaN and infinity made None, and where each one was
    (``"gpus[0].utilization_percent"``) with its value."""
    found: list[tuple[str, float]] = []

    def walk(item: Any, where: str) -> Any:
        if isinstance(item, float):
            if math.isfinite(item):
                return item
            found.append((where, item))
            return None
        if isinstance(item, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(item)]
        return item

    return walk(value, path), found


NOTED_PLACES = 8  # places named in the note about non-finite numbers; the rest counted


def strict_json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON that a strict parser (``JSON.parse``) reads: NaN and infinities are null.

    Where ``value`` is a dict with a ``notes`` list, a note says which figures were not finite
    numbers.  Raises ValueError only for what JSON cannot hold at all (a float key that is NaN).
    """
    try:  # the usual case, every number finite: the encoder alone, no copy of the tree
        return _dumps(value, indent)
    except ValueError:
        pass  # a NaN or an infinity somewhere: copied with None there, and said where, below
    tree, found = finite_tree(value)
    if found and isinstance(tree, dict) and isinstance(tree.get("notes"), list):
        places = ", ".join(f"{bounded(where, 120)} ({number!r})" for where, number in found[:NOTED_PLACES])
        more = f" and {len(found) - NOTED_PLACES} more" if len(found) > NOTED_PLACES else ""
        tree["notes"] = [*tree["notes"], f"not a finite number, written as null: {places}{more}"]
    return _dumps(tree, indent)


def _dumps(value: Any, indent: int | None) -> str:
    """``json.dumps(value, indent=indent, allow_nan=False)``; indented, by the quicker writer
    (:mod:`tfgpu_magic.json_text`) where it can."""
    if indent is not None:
        from .json_text import NotPlainJson, indented

        try:
            return indented(value, indent)
        except NotPlainJson:
            pass
    import json  # here: a status written by the writer above loads no more than its encoding function

    return json.dumps(value, indent=indent, allow_nan=False)
