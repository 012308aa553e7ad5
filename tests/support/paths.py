"""Where things are: this checkout, its tests and the fresh-process scenarios."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
SCRIPTS = TESTS / "scripts"
