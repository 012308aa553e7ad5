"""Issue 17: an inherited CUDA_VISIBLE_DEVICES read as CUDA reads it, whatever it holds.

Every test goes through the real entry points: ``%load_ext`` (``load_ipython_extension`` on a
real IPython shell, with the process's session replaced by one on the simulated server), the
``%gpu`` magic, and ``tfgpu``'s ``main``.  The inherited value is hostile input: a scheduler
or a neighbour's spawner may have written anything into it.
"""

from __future__ import annotations

import json
import os

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import tfgpu_magic
from fakes import FakeTensorFlow
from tfgpu_magic import session as session_module
from tfgpu_magic.__main__ import main
from tfgpu_magic.nvml import Nvml
from tfgpu_magic.session import Session
from tfgpu_magic.simulated import SimulatedNvml, shared_server

ME = os.getpid()
LONG = "1" * 4301  # int() refuses over 4,300 digits with a ValueError


def loaded(shell, monkeypatch, env: dict, server: SimulatedNvml | None = None) -> tuple[Session, str]:
    """`%load_ext tfgpu_magic` in a kernel that inherited ``env``; returns the session and what it said."""
    session = Session(nvml=Nvml(lib=server or shared_server(ME)), env=dict(env), tf=FakeTensorFlow())
    monkeypatch.setattr(session_module, "_SESSION", session)
    with capture_output() as captured:
        tfgpu_magic.load_ipython_extension(shell)  # what `%load_ext tfgpu_magic` runs
    return session, captured.stdout


def gpu(shell, line: str) -> str:
    """`%gpu LINE`: what it printed (text and displayed plain text), or the one-line UsageError."""
    with capture_output() as captured:
        try:
            shell.run_line_magic("gpu", line)
        except UsageError as err:
            return f"UsageError: {err}"
    shown = [o.data.get("text/plain", "") for o in captured.outputs]
    return captured.stdout + "".join(shown)


def status_json(shell) -> dict:
    return json.loads(gpu(shell, "status --json"))


# -- (2) a 4,301-digit entry ------------------------------------------------------------------------
def test_a_4301_digit_entry_is_an_invalid_entry_not_a_traceback(shell, monkeypatch):
    session, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": LONG})
    assert "ValueError" not in said
    report = status_json(shell)
    assert report["allocation"]["gpus"] == []  # CUDA stops at the first entry: no GPU
    assert "allocated by the environment: no GPU" in report["in_force"]
    text = gpu(shell, "status")
    assert "allocated by the environment: no GPU" in text and "Traceback" not in text
    refused = gpu(shell, "use 0")
    assert refused.startswith("UsageError: GPU 0 is outside this kernel's allocation") and "\n" not in refused
    assert session.env["CUDA_VISIBLE_DEVICES"] == LONG and session.requested.visible is None
    assert gpu(shell, "use all").startswith("use all: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "-1"  # all of nothing: CUDA still shows no GPU


def test_a_long_index_with_leading_zeros_is_read_as_cuda_reads_it(shell, monkeypatch):
    loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": "0" * 5000 + "2"})
    assert status_json(shell)["allocation"]["gpus"] == [2]


def test_tfgpu_demo_reads_a_4301_digit_value(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", LONG)
    assert main(["--demo"]) == 0
    assert main(["--demo", "--json"]) == 0
    assert "GPU 3  Tesla T4" in capsys.readouterr().out


def test_an_absurd_cpu_limit_is_read_as_no_limit_of_its_own(monkeypatch):
    from tfgpu_magic import oom, tf_runtime

    monkeypatch.setenv(tf_runtime.CPU_STATS_ENV, "true")
    monkeypatch.setenv(tf_runtime.CPU_LIMIT_ENV, LONG)
    assert "TensorFlow's default for the CPU BFC allocator" in oom._cpu_limit_text()
