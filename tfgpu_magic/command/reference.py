"""The ``%gpu`` commands as Markdown, generated from :data:`.grammar.TABLE` (each verb declared once).

The README's command table and the magics' reference in the documentation are both this module's
text, so neither can drift from the parser, the error messages, ``%gpu?`` and Tab completion::

    python -m tfgpu_magic.command.reference                    # print the README's command table
    python -m tfgpu_magic.command.reference --write README.md  # rewrite it there, between its markers
    python -m tfgpu_magic.command.reference --reference        # the whole reference (the docs' page)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import grammar

REGENERATE = "python -m tfgpu_magic.command.reference --write README.md"
BEGIN = f"<!-- the command table: generated from grammar.TABLE by `{REGENERATE}` -->"
END = "<!-- end of the generated command table -->"


def _cell(text: str) -> str:
    """Text for one cell of a Markdown table: a ``|`` would end the cell."""
    return text.replace("|", "\\|")


def _code(text: str, in_table: bool = True) -> str:
    return f"`{_cell(text) if in_table else text}`"


def command_table() -> str:
    """One row per line of ``%gpu?``: the command, and what it does."""
    rows = [f"| {_code(form)} | {_cell(text)} |" for verb in grammar.TABLE for form, text in verb.manual]
    return "\n".join(["| command | what it does |", "| --- | --- |", *rows]) + "\n"


def reference() -> str:
    """The magics' reference: each verb's manual lines, its valid forms and what Tab offers after it,
    then the whole ``%gpu?`` text."""
    parts = [
        "Every verb of `%gpu` (and every word of a `%%gpu` cell line), in the order of `%gpu?`. "
        "A command that is not one of the valid forms is one `UsageError` line naming them, "
        "and changes nothing.\n"
    ]
    for verb in grammar.TABLE:
        magic = "%%gpu" if verb.cell else "%gpu"
        lines = [f"## `{magic} {verb.name}`", ""]
        lines += [f"- {_code(form, False)}: {text}" for form, text in verb.manual]
        lines += ["", "Valid forms: " + ", ".join(_code(form, False) for form in verb.forms) + "."]
        if verb.completions:
            lines += ["", "Tab offers: " + ", ".join(_code(word, False) for word in verb.completions) + "."]
        parts.append("\n".join(lines) + "\n")
    parts.append(
        "## `%gpu?`\n\nThe manual, as the magic prints it:\n\n```text\n" + grammar.manual() + "\n```\n"
    )
    return "\n".join(parts)


def replace_table(text: str) -> str:
    """``text`` (the README) with the table between :data:`BEGIN` and :data:`END` regenerated."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(
            f"the command table's markers are missing or out of order; put\n{BEGIN}\n{END}\nwhere it goes"
        )
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n\n{command_table()}\n{END}{tail}"  # blank lines: the table is a block of its own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfgpu_magic.command.reference", description=__doc__.split("\n")[0]
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--write", metavar="FILE", help="rewrite the command table in FILE, between its markers"
    )
    what.add_argument(
        "--reference", action="store_true", help="print the whole reference instead of the table"
    )
    args = parser.parse_args(argv)
    if args.write:
        path = Path(args.write)
        try:
            new = replace_table(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            print(f"{parser.prog}: {err}", file=sys.stderr)
            return 1
        path.write_text(new, encoding="utf-8")
        return 0
    sys.stdout.write(reference() if args.reference else command_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
