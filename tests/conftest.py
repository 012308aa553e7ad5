"""Shared fixtures: a fresh session on a fake shared server, inside a real IPython shell.

TensorFlow's start-up is process-wide and cannot be undone, so no test may import TensorFlow
into the pytest process: tests that need it run a fresh Python (see ``run_scenario``).  The
guard below fails any test that breaks this rule, since it would change every later result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel.session import Session

pytest_plugins = ["pytester"]  # tests/test_browser_artifacts.py runs pytest itself

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# What TensorFlow, CUDA, XLA, JAX and PyTorch read when they start.  A fresh process never inherits
# these from the developer's shell or from an earlier test: a test that depends on one passes it.
START_UP_PREFIXES = ("TF_", "CUDA_", "XLA_", "JAX_", "PYTORCH_")

_running: list = [None]  # the test being set up or run: fresh processes check its markers


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _running[0] = item  # before its fixtures, which may start processes too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails saves each open page (screenshot, address, open dialogs' text)
    in test-artifacts/ before its fixtures close the browser, and the report says where."""
    report = (yield).get_result()
    if report.failed and report.when in ("setup", "call") and "browser" in item.keywords:
        from browser_support import save_failure_artifacts

        saved = save_failure_artifacts(item.nodeid)
        report.sections.append(("browser artefacts", "\n".join(map(str, saved)) or "no page was open"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a real NVIDIA GPU and driver: skip them where NVML cannot start."""
    if not any("gpu" in item.keywords for item in items):
        return
    if Nvml().available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU and driver (NVML is unavailable here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _environment_restored():
    """What a test, or the code it runs (`%gpu use 1` sets CUDA_VISIBLE_DEVICES), sets in
    ``os.environ`` never reaches the next test."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _tensorflow_stays_out(request):
    already = "tensorflow" in sys.modules
    yield
    if not already and "tensorflow" in sys.modules:
        pytest.fail(f"{request.node.nodeid} imported TensorFlow into the test process; use a subprocess")


@pytest.fixture(autouse=True)
def claim_dir(tmp_path, monkeypatch):
    """GPU claims go to a folder of the test's own, never the machine's shared one."""
    from tfgpu_magic.gpus import claims

    directory = tmp_path / "claims"
    monkeypatch.setenv(claims.ENV_DIR, str(directory))
    yield directory
    claims.release_all()


@pytest.fixture
def server():
    """A fake four-GPU shared server, this test process holding memory on GPU 1."""
    return shared_server(my_pid=os.getpid())


@pytest.fixture
def session(server):
    """A session on the simulated server, with TensorFlow behind the shared fake adapter."""
    from fakes import FakeTensorFlow

    return Session(nvml=Nvml(lib=server), env={}, frameworks=adapters(tensorflow=FakeTensorFlow()))


@pytest.fixture(scope="session")
def shell():
    from IPython.testing.globalipapp import start_ipython

    return start_ipython()


@pytest.fixture
def gpu(shell, session):
    """Run ``%gpu LINE`` against a fresh session; returns what it printed."""
    from tfgpu_magic.kernel.magics import GpuMagics

    shell.register_magics(GpuMagics(shell, session=session))

    def run(line: str) -> None:
        return shell.run_line_magic("gpu", line)

    run.session = session
    return run


def fresh_env(env: dict | None = None) -> dict:
    """The environment of a fresh Python: this checkout first, no inherited start-up settings."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith(START_UP_PREFIXES)}
    return {**clean, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}


def run_python(args: list[str], env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (see :func:`fresh_env`); the test must be marked `slow`.

    Fresh processes are where TensorFlow starts, so `make test-fast` (``-m "not slow ..."``) must
    never meet one: a test that starts one without the marker fails, saying so.
    """
    item = _running[0]
    if item is not None and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} starts a fresh Python ({' '.join(args)[:60]}) but is not marked "
            "`slow`: mark it, so that `make test-fast` never starts one",
            pytrace=False,
        )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=fresh_env(env), timeout=timeout, cwd=ROOT
    )


def run_scenario(name: str, *args: str, env: dict | None = None, timeout: int = 240) -> dict:
    """Run tests/scripts/<name>.py in a fresh Python and return the JSON it prints last."""
    proc = run_python([str(SCRIPTS / f"{name}.py"), *args], env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"scenario {name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.fixture
def no_leaked_sampler():
    """Stop every panel after the test, and fail it if a sampler thread outlived it."""
    from fakes import monitor_threads

    from tfgpu_magic.kernel import monitor

    yield
    monitor._hub.stop_all()
    assert monitor_threads() == [], "a sampler thread outlived its test"


def run_in_fresh_kernel(cells: list[str], cwd: Path) -> list[list[dict]]:
    """Run ``cells`` as one notebook in a fresh python3 kernel (nbclient); each cell's outputs.
    Use with the ``kernel_env`` fixture, and mark the test `slow`."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(
        nb, timeout=300, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return [cell["outputs"] for cell in nb.cells]


@pytest.fixture
def kernel_env(monkeypatch):
    """For a fresh kernel: this checkout on its path; no TensorFlow or CUDA setting from the shell."""
    for name in list(os.environ):
        if name.startswith(START_UP_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
