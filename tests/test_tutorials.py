"""The tutorials in example_notebooks/: small, free of widget state, and runnable to the end.

nbval (``pytest --nbval example_notebooks``) compares their outputs cell by cell.  These tests check
what nbval cannot: that the two usual batch tools, ``jupyter nbconvert --execute`` (what JupyterLab's
*Run All* does, through nbclient) and papermill, run every cell, going on past the cells that are
meant to fail (tagged ``raises-exception``), in an environment without ``TF_CPP_MIN_LOG_LEVEL``, so
that the notebooks' own first cells have to keep TensorFlow's start-up messages out of the outputs.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "example_notebooks").glob("*.ipynb"))
MAX_BYTES = 72 * 1024  # tutorial 2, with two status cards (about 20 KiB each as HTML), is the largest
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# What TensorFlow 2.21's C++ core writes at start-up when nothing quiets it (see tutorial 1).
STARTUP_LINES = (
    "oneDNN custom operations",
    "absl::InitializeLog",
    "cpu_feature_guard",
    "This TensorFlow binary",
)


def test_there_are_six_tutorials() -> None:
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_"]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _code_cells(nb: dict) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _tagged(cell: dict) -> bool:
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def _failure(output: dict) -> bool:
    """An error output, or IPython's one-line UsageError (a stderr stream, no error output)."""
    if output["output_type"] == "error":
        return True
    text = "".join(output.get("text", ""))
    return output.get("name") == "stderr" and text.startswith("UsageError:")


def _text(output: dict) -> str:
    return json.dumps(output)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_widget_state_and_small(path: Path) -> None:
    raw = path.read_text(encoding="utf-8")
    nb = json.loads(raw)
    assert "widgets" not in nb["metadata"], "widget state in the notebook's metadata"
    assert WIDGET_STATE not in raw
    assert "_esm" not in raw, "a widget's JavaScript bundle is in the notebook"
    # A widget view without its state cannot be drawn (JupyterLab shows an error in its place).
    for i, cell in _code_cells(nb):
        assert not any(WIDGET_VIEW in o.get("data", {}) for o in cell["outputs"]), f"cell {i}: a widget view"
    assert len(raw.encode()) < MAX_BYTES, f"{path.name} is {len(raw.encode())} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_failing_cells_are_tagged_not_commented(path: Path) -> None:
    """A cell meant to fail carries the tag every Jupyter tool reads; nbval reads it too, and still
    compares its output unless told otherwise.  Its stored output shows the failure."""
    nb = _load(path)
    for i, cell in _code_cells(nb):
        source = "".join(cell["source"])
        assert "NBVAL_RAISES_EXCEPTION" not in source, f"cell {i}: use the raises-exception tag"
        failed = any(_failure(o) for o in cell["outputs"])
        assert failed == _tagged(cell), f"cell {i}: stored failure {failed}, tagged {_tagged(cell)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_have_no_tensorflow_startup_lines(path: Path) -> None:
    nb = _load(path)
    for i, cell in _code_cells(nb):
        for output in cell["outputs"]:
            assert not any(line in _text(output) for line in STARTUP_LINES), (
                f"cell {i}: {_text(output)[:300]}"
            )


# -- running them: nbconvert and papermill ----------------------------------------------------------


def _environment(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # `make test` sets it; a learner's JupyterLab does not
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    claims = tmp / "claims"
    claims.mkdir(exist_ok=True)
    env["TFGPU_MAGIC_CLAIM_DIR"] = str(claims)
    # The kernel imports this checkout's package, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _run(tool: str, path: Path, tmp: Path) -> dict:
    out_dir = tmp / f"{tool}-{path.stem}"
    out_dir.mkdir()
    out = out_dir / path.name
    if tool == "nbconvert":  # no --allow-errors: only the tagged cells may fail
        args = [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.timeout=300",
            "--output-dir",
            str(out_dir),
            str(path),
        ]
    else:
        args = [
            sys.executable,
            "-m",
            "papermill",
            "--no-progress-bar",
            "--execution-timeout",
            "300",
            "--cwd",
            str(out_dir),
            str(path),
            str(out),
        ]
    scratch = out_dir / "tmp"  # the run's TMPDIR: what a tutorial leaves in /tmp is left here
    scratch.mkdir()
    env = {**_environment(tmp), "TMPDIR": str(scratch)}
    start = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, cwd=out_dir, env=env, timeout=480)
    return {
        "rc": done.returncode,
        "log": done.stdout[-3000:] + done.stderr[-5000:],
        "out": out,
        "seconds": time.monotonic() - start,
        "scratch": scratch,
    }


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    """Every tutorial through both tools, a few at a time (each run is one kernel, mostly waiting)."""
    tools = ["nbconvert"] + (["papermill"] if importlib.util.find_spec("papermill") else [])
    tmp = tmp_path_factory.mktemp("tutorials")
    jobs = [(tool, path) for path in NOTEBOOKS for tool in tools]
    workers = max(2, min(len(jobs), 2 * (os.cpu_count() or 1)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {(tool, path.stem): pool.submit(_run, tool, path, tmp) for tool, path in jobs}
        return {key: future.result() for key, future in futures.items()}


def _check_ran_to_the_end(result: dict) -> dict:
    assert result["out"].is_file(), result["log"]
    left = sorted(p.name for p in result["scratch"].glob("tfgpu*"))
    assert left == [], f"the tutorial left {left} in its TMPDIR"
    nb = _load(result["out"])
    for i, cell in _code_cells(nb):
        if not "".join(cell["source"]).strip():
            continue
        assert cell.get("execution_count") is not None, f"cell {i} never ran:\n{result['log']}"
        failed = any(o["output_type"] == "error" for o in cell["outputs"])
        assert not failed or _tagged(cell), f"cell {i} failed and is not tagged raises-exception"
        for output in cell["outputs"]:
            assert not any(line in _text(output) for line in STARTUP_LINES), (
                f"cell {i}: TensorFlow's start-up messages were not quieted: {_text(output)[:300]}"
            )
    return nb


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_nbconvert_runs_to_the_end(path: Path, executed: dict) -> None:
    result = executed[("nbconvert", path.stem)]
    assert result["rc"] == 0, result["log"]
    _check_ran_to_the_end(result)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_runs_to_the_end(path: Path, executed: dict) -> None:
    if ("papermill", path.stem) not in executed:
        pytest.skip("papermill is not installed")
    result = executed[("papermill", path.stem)]
    nb = _check_ran_to_the_end(result)
    # papermill runs on past a tagged cell (nbclient honours the tag), but after the last cell it
    # reports any cell that left an *error output*, tagged or not, and exits 1.  A failed magic's
    # UsageError is a stderr line, not an error output; `%%gpu budget`'s BudgetExceeded is one.
    errors = [(i, c) for i, c in _code_cells(nb) if any(o["output_type"] == "error" for o in c["outputs"])]
    if not errors:
        assert result["rc"] == 0, result["log"]
    else:
        assert all(_tagged(c) for _, c in errors)
        assert result["rc"] != 0 and "PapermillExecutionError" in result["log"], result["log"]
