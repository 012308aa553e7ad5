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
"""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["safe", "safe_tree"]

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
