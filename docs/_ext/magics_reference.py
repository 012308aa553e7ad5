"""A Sphinx extension: the page ``reference/magics`` gets the magics' reference at build time.

The text is :func:`tfgpu_magic.command.reference.reference`, generated from ``grammar.TABLE``:
the same code prints the README's command table, so the two cannot drift apart.
"""

from __future__ import annotations

MARKER = "<!-- the magics' reference, generated from grammar.TABLE at build time -->"


def _insert(app, docname: str, source: list[str]) -> None:
    if MARKER not in source[0]:
        return
    from tfgpu_magic.command.reference import reference

    source[0] = source[0].replace(MARKER, reference())


def setup(app):
    app.connect("source-read", _insert)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
