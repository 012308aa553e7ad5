"""The fenced code blocks of the project's Markdown pages (the README and docs/), with where each starts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .paths import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# A fence's info string: a language (```python), a MyST directive (```{toctree}), or nothing.
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    """Every page a reader reads: the README, then docs/ (its Markdown pages, in path order)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    language: str  # a MyST directive keeps its braces: "{toctree}"
    code: str
    line: int  # where it starts in its page
    page: Path = README

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(language: str | None = None, page: Path = README) -> list[Block]:
    """The page's fenced blocks (of one language, if given), in order."""
    text = page.read_text(encoding="utf-8")
    found = [
        Block(m.group(1), m.group(2), text[: m.start()].count("\n") + 1, page) for m in FENCE.finditer(text)
    ]
    return [b for b in found if language is None or b.language == language]


def all_blocks(language: str | None = None) -> list[Block]:
    """The blocks of every page (:func:`pages`), page by page."""
    return [block for page in pages() for block in blocks(language, page)]


def page_saying(text: str) -> Path | None:
    """The first page that holds ``text``, or None."""
    return next((page for page in pages() if text in page.read_text(encoding="utf-8")), None)
