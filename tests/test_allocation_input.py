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


# -- (9) a malformed value is explained ----------------------------------------------------------------
NOT_AN_ENTRY = "not a GPU index, GPU UUID or MIG instance UUID"


@pytest.mark.parametrize(
    "inherited, gpus, explanation",
    [
        ("²", [], f"entry 1 ('²') is {NOT_AN_ENTRY}, so CUDA uses no GPU: it uses the entries before the "
                  "first invalid one and ignores that entry and everything after it"),
        ("0,x", [0], f"entry 2 ('x') is {NOT_AN_ENTRY}, so CUDA uses GPU 0: it uses the entries before the "
                     "first invalid one and ignores that entry and everything after it"),
        ("2,7,3", [2], "entry 2 ('7') names no GPU (this machine has 4, numbers 0-3), so CUDA uses GPU 2: "
                       "it uses the entries before the first invalid one and ignores that entry and everything after it"),
        ("1,1", [1], "entry 2 ('1') repeats GPU 1, so CUDA uses GPU 1: it uses the entries before the "
                     "first invalid one and ignores that entry and everything after it"),
        ("GPU-0000000,0", [], "entry 1 ('GPU-0000000') is the start of several GPUs' UUIDs, so CUDA uses no GPU: "
                              "it uses the entries before the first invalid one and ignores that entry and everything after it"),
        (LONG, [], f"entry 1 ('{'1' * 37}...') names no GPU (this machine has 4, numbers 0-3), so CUDA uses no GPU: "
                   "it uses the entries before the first invalid one and ignores that entry and everything after it"),
    ],
)
def test_a_malformed_value_says_which_entry_is_invalid_and_what_cuda_does(shell, monkeypatch, inherited, gpus, explanation):
    note = f"CUDA_VISIBLE_DEVICES was set before the kernel started, and its {explanation}"
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": inherited})
    assert said == f"tfgpu_magic: {note}\n"  # %load_ext says it once, in one line
    report = status_json(shell)
    assert report["allocation"]["gpus"] == gpus
    assert report["allocation"]["note"] == note
    position = int(explanation.split()[1])
    assert report["allocation"]["invalid_entry"]["position"] == position
    assert note in report["notes"]
    assert f"Note: {note}" in gpu(shell, "status").splitlines()


def test_a_value_with_nothing_odd_says_nothing(shell, monkeypatch):
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert said == ""
    report = status_json(shell)
    assert report["allocation"]["invalid_entry"] is None and report["allocation"]["note"] is None


def test_the_echoed_entry_is_neutralised_and_capped(shell, monkeypatch):
    hostile = "0,\x1b]0;pwned\x07\u202e" + "y" * 5000
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": hostile})
    assert said.startswith("tfgpu_magic: CUDA_VISIBLE_DEVICES was set before the kernel started, and its "
                           "entry 2 ('\\x1b]0;pwned\\x07\\u202eyyyyyyyyyyyyyyyyyyyyyyyyyy...') is ")
    assert len(said) < 400 and "\x1b" not in said and "\u202e" not in said
    report = status_json(shell)
    assert report["allocation"]["invalid_entry"]["entry"] == "\\x1b]0;pwned\\x07\\u202e" + "y" * 26 + "..."
    text = gpu(shell, "status")
    assert "\x1b" not in text and "y" * 100 not in text
