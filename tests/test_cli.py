"""`python -m tfgpu_magic` / `tfgpu`: the status picture in a terminal, and as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfgpu_magic.__main__ import main
from tfgpu_magic.gpus.nvml import Nvml

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-W", "error", "-m", "tfgpu_magic", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


def test_demo_prints_the_machine_not_the_terminals_own_process(capsys):
    assert main(["--demo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The first lines are about the machine (`tfgpu | head -3` is useful): no "Requested",
    # no "TensorFlow: not imported", no "this process" holding memory it never held.
    assert lines[:3] == [
        "Machine:    4 GPUs; user me",
        "Bars:       = my processes  x other users  : unattributed  . free",
        "GPU 0  NVIDIA A100-SXM4-40GB  30.3 GiB / 40.0 GiB used (driver)  util 97%",
    ]
    assert lines[5] == "GPU 1  NVIDIA A100-SXM4-80GB  22.3 GiB / 80.0 GiB used (driver)  util 35%"
    assert lines[7] == "  pid 4194404  me           10.0 GiB  python -m ipykernel_launcher"
    out = "\n".join(lines)
    assert "this process" not in out and "TensorFlow" not in out and str(os.getpid()) not in out


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "tfgpu 0.1.0"


def test_json_is_the_same_report(capsys):
    assert main(["--demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["me"]["label"] == "this process"
    assert [g["index"] for g in report["gpus"]] == [0, 1, 2, 3]


def test_runs_as_a_module_without_ipython_or_tensorflow():
    proc = run_cli("--demo", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"][3]["processes"][0]["alive"] is False
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfgpu_magic.__main__ as m; m.main(['--demo']); "
            "print(sorted(k for k in ('IPython', 'tensorflow', 'pynvml') if k in sys.modules))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert probe.stdout.splitlines()[-1] == "[]"


def test_without_a_driver_it_says_so_and_exits_1():
    if Nvml().available():
        pytest.skip("this machine has an NVIDIA driver")
    proc = run_cli()
    assert proc.returncode == 1
    assert "GPUs:       no NVIDIA driver could be reached through NVML" in proc.stdout
    proc = run_cli("--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["nvml_error"]


@pytest.mark.gpu
def test_on_a_real_machine_it_lists_every_gpu():
    proc = run_cli("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert len(report["gpus"]) == Nvml().device_count() and report["nvml_error"] is None


def test_usage_errors_exit_2():
    proc = run_cli("--frobnicate")
    assert proc.returncode == 2 and "unrecognized arguments: --frobnicate" in proc.stderr
    assert run_cli("--help").returncode == 0


@pytest.mark.parametrize("words", [[], ["--json"], ["--demo"], ["--json", "--demo"], ["--demo", "--json"]])
def test_the_plain_forms_read_as_argparse_reads_them(words):
    from tfgpu_magic import __main__ as cli

    args = cli._parser().parse_args(words)
    assert cli._options(words) == (args.json, args.demo)
    assert tuple(words) in cli._PLAIN_FORMS  # read without argparse


def test_other_forms_are_argparse_s():
    from tfgpu_magic import __main__ as cli

    assert (
        cli._options(["--jso"]) == cli._options(["--json", "--json"]) == (True, False)
    )  # as argparse allows
    for words in (["--json", "x"], ["-h"]):
        with pytest.raises(SystemExit):
            cli._options(words)
