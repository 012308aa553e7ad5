"""The fenced code blocks of the project's Markdown pages, with where each starts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .paths import ROOT

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    language: str
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
