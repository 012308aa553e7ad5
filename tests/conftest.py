"""pytest's hooks and the shared fixtures: a fresh session on a fake shared server, inside a real
IPython shell.  Helpers live in the ``support`` package, never here.

TensorFlow's start-up is process-wide and cannot be undone, so no test may import TensorFlow
into the pytest process: tests that need it run a fresh Python (see ``run_scenario``).  The
guard below fails any test that breaks this rule, since it would change every later result.
"""

from __future__ import annotations

import os
import sys

import pytest

from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel.session import Session

from support import processes
from support.paths import ROOT
from support.processes import START_UP_PREFIXES

pytest_plugins = ["pytester"]  # tests/test_browser_artifacts.py runs pytest itself


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    processes.running[0] = item  # before its fixtures, which may start processes too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails saves each open page (screenshot, address, open dialogs' text)
    in test-artifacts/ before its fixtures close the browser, and the report says where."""
    report = (yield).get_result()
    if report.failed and report.when in ("setup", "call") and "browser" in item.keywords:
        from support.browser import save_failure_artifacts

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
    from support.fakes import FakeTensorFlow

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


@pytest.fixture
def no_leaked_sampler():
    """Stop every panel after the test, and fail it if a sampler thread outlived it."""
    from tfgpu_magic.kernel import monitor

    from support.fakes import monitor_threads

    yield
    monitor._hub.stop_all()
    assert monitor_threads() == [], "a sampler thread outlived its test"


@pytest.fixture
def kernel_env(monkeypatch):
    """For a fresh kernel: this checkout on its path; no TensorFlow or CUDA setting from the shell."""
    for name in list(os.environ):
        if name.startswith(START_UP_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
