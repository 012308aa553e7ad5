"""Node.js and the compiled JupyterLab extension (lib/, from `tsc`) for the tests that run its TypeScript.

Such a test fails, never skips, when it cannot run: `make setup` installs Node.js and builds lib/
(`npm install`, then pip's build of the front ends), so a missing one is a broken setup that a
skip would hide (issue 29).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .paths import ROOT

COMPILED = ROOT / "lib"


def node() -> str:
    """The path of `node`; the test fails when there is none."""
    found = shutil.which("node")
    if found is None:
        pytest.fail("no Node.js on PATH: `make setup` installs it (apt's nodejs), and these tests need it")
    return found


def compiled_module(name: str) -> Path:
    """lib/NAME, the compiled form of js/lab/NAME's TypeScript; the test fails when it is not built."""
    node()
    path = COMPILED / name
    if not path.is_file():
        pytest.fail(f"{path.relative_to(ROOT)} is not built: run `npm run build:lab` (make setup does)")
    return path


def run_in_node(tmp_path: Path, module: str, calls: list[tuple[str, list]]) -> list:
    """Each call (a function lib/MODULE exports, and its arguments) in one Node process: their results.

    The module runs on its own as an ES module (.mjs), so it must have no runtime imports."""
    (tmp_path / "module.mjs").write_text(compiled_module(module).read_text())
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    script = tmp_path / "run.mjs"
    script.write_text(
        "import * as m from './module.mjs';\n"
        "import { readFileSync } from 'node:fs';\n"
        "const calls = JSON.parse(readFileSync(new URL('./calls.json', import.meta.url)));\n"
        "console.log(JSON.stringify(calls.map(([name, args]) => m[name](...args))));\n"
    )
    done = subprocess.run([node(), str(script)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)
