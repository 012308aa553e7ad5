"""`%gpu status`: the report as data, as text and as HTML, on the fake shared server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest
from IPython.utils.capture import capture_output

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus import claims
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    busy_server,
    shared_server,
)
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.choosing import choose_gpus
from tfgpu_magic.kernel.session import Session

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
ME = 4242

EXPECTED_TEXT = """\
Requested:  nothing (each framework's defaults)
In force:   each framework's defaults
Frameworks: none imported yet; settings reach TensorFlow, PyTorch and JAX when they start
This kernel: pid 4242, user me; sees GPU 0,1,2,3
Bars:       # this kernel  = my other processes  x other users  : unattributed  . free
GPU 0  NVIDIA A100-SXM4-40GB  30.3 GiB / 40.0 GiB used (driver)  util 97%  visible
  [xxxxxxxxxxxxxxxxxxxxxxxxxxxxx:..........] this kernel 0.0 GiB · other users 30.0 GiB · unattributed 0.3 GiB · free 9.7 GiB
  pid 41001    alice        30.0 GiB  python train_resnet.py
GPU 1  NVIDIA A100-SXM4-80GB  22.3 GiB / 80.0 GiB used (driver)  util 35%  visible
  [#####==xxxx:............................] this kernel 10.0 GiB · my other processes 4.0 GiB · other users 8.0 GiB · unattributed 0.3 GiB · free 57.7 GiB
  this kernel: 0% GPU utilization (the driver's recent samples of its processes)
  pid 4242     me           10.0 GiB  python -m ipykernel_launcher  (this kernel)
  pid 41002    me            4.0 GiB  python -m ipykernel_launcher
  pid 41003    bob           8.0 GiB  python finetune.py
GPU 2  NVIDIA RTX A5000  0.3 GiB / 24.0 GiB used (driver)  util 0%  visible
  [:.......................................] this kernel 0.0 GiB · unattributed 0.3 GiB · free 23.7 GiB
GPU 3  Tesla T4  2.3 GiB / 15.0 GiB used (driver)  util n/a  visible
  [::::::..................................] this kernel 0.0 GiB · unattributed 2.3 GiB · free 12.7 GiB
  pid 41004    n/a           2.0 GiB  n/a  (exited)
  note: utilization: Not Supported
  note: pid 41004: exited, but NVML still lists it (or it lives in another pid namespace); counted as unattributed"""


@pytest.fixture(autouse=True)
def claim_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(claims.ENV_DIR, str(tmp_path / "claims"))
    yield
    claims.release_all()


def report_for(server: SimulatedNvml, **kwargs) -> dict:
    return status.build_report(Session(nvml=Nvml(lib=server), env={}), my_pid=ME, **kwargs)


# -- data ---------------------------------------------------------------------------------------
def test_report_keeps_its_keys_and_adds_the_inventory():
    report = report_for(shared_server(ME))
    old_keys = {"tensorflow", "requested", "in_force", "gpus", "nvml_error", "notes", "me", "visible_gpus"}
    # keys are added, never renamed; `display` is what the text and the card show (adapters' words)
    assert set(report) == old_keys | {
        "resolved",
        "allocation",
        "frameworks",
        "display",
        "defaults",
        "notebook_settings",
        "platform_shares",  # issue 31: each GPU's share as the kernel inherited it ([] without one)
        "limit_enforcement",  # issue 31: "soft (...)", "hard (MPS)", "hard (MIG)"; None without a limit
    }
    assert report["resolved"] == {
        "summary": [],
        "visible": [0, 1, 2, 3],
        "gpus": [
            {"index": i, "limit_mib": None, "logical_mib": None, "within_share": None, "enforcement": None}
            for i in range(4)
        ],
    }
    assert report["allocation"] is None  # nothing inherited: every GPU is this kernel's to use
    assert report["me"] == {"pid": ME, "user": "me", "label": "this kernel"}
    gpu = report["gpus"][1]
    assert {k: gpu[k] for k in ("index", "name", "lost", "visible", "tensorflow_names")} == {
        "index": 1,
        "name": "NVIDIA A100-SXM4-80GB",
        "lost": False,
        "visible": True,
        "tensorflow_names": [],
    }
    assert gpu["memory_total_bytes"] == 81920 * MIB and gpu["memory_free_bytes"] == (81920 - 22828) * MIB
    assert gpu["compute_capability"] == [8, 0] and gpu["mig_enabled"] is False
    assert gpu["pci_bus_id"] == "00000000:27:00.0"
    assert gpu["usage"] == {
        "this_kernel_bytes": 10240 * MIB,
        "this_kernel_source": "nvml",
        "my_other_bytes": 4096 * MIB,
        "others_bytes": 8192 * MIB,
        "unattributed_bytes": 300 * MIB,
        "free_bytes": (81920 - 22828) * MIB,
    }
    assert gpu["processes"][2] == {
        "pid": 41003,
        "user": "bob",
        "command": "python finetune.py",
        "used_memory_bytes": 8192 * MIB,
        "kind": "compute",
        "alive": True,
        "whose": "others",
        "note": None,
    }
    assert gpu["claim"] is None and gpu["tensorflow_in_use_bytes"] is None
    assert json.loads(json.dumps(report)) == report  # JSON-ready as it is


def test_unsupported_readings_are_missing_never_zero():
    server = shared_server(ME)
    server.gpus[2].unsupported = {"memory", "utilization", "name", "compute_capability", "mig"}
    gpu = report_for(server)["gpus"][2]
    assert (
        gpu["name"],
        gpu["memory_total_bytes"],
        gpu["utilization_percent"],
        gpu["compute_capability"],
    ) == (
        None,
        None,
        None,
        None,
    )
    assert gpu["usage"]["unattributed_bytes"] is None and gpu["usage"]["free_bytes"] is None
    line = status.render_text(report_for(server)).splitlines()[
        14
    ]  # after GPU 1's utilization line for this kernel
    assert line == "GPU 2  n/a  n/a / n/a used (driver)  util n/a  visible"


def test_a_lost_gpu_is_one_line_and_the_rest_still_shows():
    server = shared_server(ME)
    server.gpus[1].lost = True
    report = report_for(server)
    assert report["gpus"][1]["lost"] is True and report["gpus"][1]["processes"] is None
    text = status.render_text(report)
    assert "GPU 1  lost: the GPU stopped answering\nGPU 2  NVIDIA RTX A5000" in text
    assert "GPU 1" in status.render_html(report) and "GPU 3  Tesla T4" in text


def test_without_a_driver_the_report_says_so():
    report = report_for(SimulatedNvml([], driver=False))
    assert report["gpus"] == [] and report["visible_gpus"] is None
    assert report["nvml_error"].startswith(
        "no NVIDIA driver could be reached through NVML (Driver Not Loaded)"
    )
    assert "This kernel: pid 4242, user n/a; GPUs seen: unknown" in status.render_text(report)


def no_driver_started(gpus: dict[str, int], found: list[int]) -> dict:
    """TensorFlow started on a machine whose NVML cannot be reached (no NVIDIA driver)."""
    from tfgpu_magic.frameworks.tensorflow import Stage

    from support.fakes import FakeTensorFlow

    tf = FakeTensorFlow(Stage.STARTED, gpus=gpus, found=found)
    session = Session(
        nvml=Nvml(lib=SimulatedNvml([], driver=False)), env={}, frameworks=adapters(tensorflow=tf)
    )
    return status.build_report(session, my_pid=ME)


def test_without_a_driver_a_started_tensorflow_says_which_gpus_the_kernel_sees():
    """One answer per card: TensorFlow's list is what CUDA showed this kernel, NVML or not."""
    report = no_driver_started({}, [])
    assert report["in_force"][0] == "GPUs visible to TensorFlow: none"
    assert report["visible_gpus"] == [] and report["gpus"] == []
    assert report["nvml_error"].startswith("no NVIDIA driver could be reached through NVML")
    text = status.render_text(report)
    assert "This kernel: pid 4242, user n/a; sees no GPU" in text
    assert "GPUs seen: unknown" not in text and "GPUs seen: unknown" not in status.render_html(report)
    assert "pid 4242, user n/a; sees no GPU</td>" in status.render_html(report)


def test_without_nvml_gpus_tensorflow_lists_are_the_ones_seen():
    report = no_driver_started({"GPU:0": 0, "GPU:1": 1}, [0, 1])
    assert report["in_force"][0] == "GPUs visible to TensorFlow: 0,1"
    assert report["visible_gpus"] == [0, 1]
    assert "This kernel: pid 4242, user n/a; sees GPU 0,1" in status.render_text(report)


def test_hidden_gpus_are_marked():
    session = Session(nvml=Nvml(lib=shared_server(ME)), env={})
    session.configure(grammar.Use((1, 2)))
    report = status.build_report(session, my_pid=ME)
    assert report["visible_gpus"] == [1, 2]
    assert [g["visible"] for g in report["gpus"]] == [False, True, True, False]
    assert "This kernel: pid 4242, user me; sees GPU 1,2" in status.render_text(report)


def test_claims_are_shown_for_this_kernel_and_others():
    server = shared_server(ME)
    session = Session(nvml=Nvml(lib=server), env={})
    choose_gpus(session, grammar.Auto(), print)
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
            import sys
            from tfgpu_magic.gpus import claims
            with claims.choosing():
                claims.claim(sys.argv[1])
            print("claimed", flush=True)
            sys.stdin.read()
            """
            ),
            server.gpus[2].uuid,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert other.stdout.readline().strip() == "claimed"
        report = status.build_report(session, my_pid=ME)
    finally:
        other.stdin.close()
        other.wait(timeout=30)
        other.stdout.close()
    assert report["gpus"][1]["claim"]["this_kernel"] is True
    assert report["gpus"][2]["claim"]["pid"] == other.pid
    text = status.render_text(report)
    assert "  claimed by this kernel (`%gpu use auto`)\n" in text
    assert f"  claimed by pid {other.pid} (" in text


# -- text ---------------------------------------------------------------------------------------
def test_text_shows_bars_processes_and_notes():
    assert status.render_text(report_for(shared_server(ME))) == EXPECTED_TEXT


def test_text_names_the_tensorflow_fallback():
    report = report_for(shared_server(ME))
    usage = report["gpus"][1]["usage"]
    usage.update(this_kernel_bytes=6 * 1024 * MIB, this_kernel_source="tensorflow")
    assert "this kernel 6.0 GiB (TensorFlow allocator)" in status.render_text(report)
    assert "this kernel 6.0 GiB (TensorFlow allocator)" in status.render_html(report)


def test_bars_are_always_full_width():
    for gpu in report_for(busy_server(ME))["gpus"]:
        bar = status._text_bar(gpu["usage"], gpu["memory_total_bytes"])
        assert len(bar) == status.BAR_WIDTH


# -- HTML ---------------------------------------------------------------------------------------
class _Checker(HTMLParser):
    """Fails on unbalanced tags; collects text and style attributes."""

    VOID: ClassVar[set[str]] = {"br", "img", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []
        self.styles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.styles += [v for k, v in attrs if k == "style"]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        self.text.append(data)


def test_html_is_balanced_self_contained_and_themed():
    server = shared_server(ME)
    server.gpus[0].processes[0].command = "python <script>alert(1)</script>.py"
    checker = _Checker()
    page = status.render_html(report_for(server))
    checker.feed(page)
    assert checker.stack == []
    assert "<script" not in page and "&lt;script&gt;" in page  # commands are escaped
    assert "<style" not in page and "class=" in page  # inline styles only
    assert all(
        "var(--jp-" not in s or "," in s for s in checker.styles
    )  # every theme variable has a fallback
    text = " ".join(checker.text)
    for fragment in (
        "GPU 1  NVIDIA A100-SXM4-80GB",
        "this kernel 10.0 GiB",
        "other users 8.0 GiB",
        "bob",
        "exited",
    ):
        assert fragment in text


def test_html_bar_widths_follow_memory():
    page = status.render_html(report_for(shared_server(ME)))
    assert 'title="this kernel: 10.0 GiB" style="width: 12.50%' in page  # 10 GiB of 80 GiB
    assert 'title="other users: 30.0 GiB" style="width: 75.00%' in page  # alice on the 40 GiB GPU


# -- through the magic ----------------------------------------------------------------------------
def test_magic_displays_text_and_html(gpu):
    with capture_output() as captured:
        gpu("status")
    (output,) = captured.outputs
    assert output.data["text/plain"].startswith("Requested:  nothing (each framework's defaults)\n")
    assert f"This kernel: pid {os.getpid()}, user me; sees GPU 0,1,2,3" in output.data["text/plain"]
    assert output.data["text/html"].startswith('<div class="tfgpu-status"')


def test_magic_json_is_the_report(gpu, capsys):
    gpu("status --json")
    report = json.loads(capsys.readouterr().out)
    assert report["me"]["pid"] == os.getpid()
    assert report["gpus"][1]["usage"]["this_kernel_bytes"] == 10240 * MIB


def test_many_gpus_and_processes_render(gpu):
    report = report_for(busy_server(ME))
    assert len(report["gpus"]) == 8 and sum(len(g["processes"]) for g in report["gpus"]) == 40
    assert report["gpus"][7]["utilization_percent"] is None
    status.render_text(report), status.render_html(report)


def test_a_process_of_unknown_owner_counts_as_others():
    server = SimulatedNvml(
        [SimulatedGpu(processes=[SimulatedProcess(7, 1024, user=None, command=None)])]
    )  # psutil: AccessDenied
    gpu = report_for(server)["gpus"][0]
    assert gpu["processes"][0]["user"] is None and gpu["processes"][0]["whose"] == "others"
    assert gpu["usage"]["others_bytes"] == 1024 * MIB


def test_all_is_honest_and_the_package_import_stays_light():
    import tfgpu_magic.__main__ as cli
    from tfgpu_magic.command import plan
    from tfgpu_magic.frameworks import tensorflow as tf_runtime
    from tfgpu_magic.gpus import holdings, owners
    from tfgpu_magic.kernel import choosing, machine, session

    for module in (claims, choosing, holdings, machine, owners, plan, session, status, tf_runtime, cli):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfgpu_magic; "
            "print(sorted(m for m in ('psutil', 'pynvml', 'tensorflow', 'IPython') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert probe.stdout.strip() == "[]"


def test_gpus_tensorflow_did_not_find_are_not_called_hidden(gpu):
    """A CPU-only TensorFlow lists no GPU: the ones `%gpu use` left shown were not hidden (issue 16, item 5)."""
    from tfgpu_magic.frameworks.tensorflow import Stage

    gpu("use 1,2")
    gpu.session.adapter("tensorflow").fake_stage, gpu.session.adapter("tensorflow").found = (
        Stage.ENUMERATED,
        [],
    )
    report = status.build_report(gpu.session)
    lines = [line for line in status.render_text(report).splitlines() if line.startswith("GPU ")]
    assert [line.split("used (driver)")[1].split("  ")[-1] for line in lines] == [
        "hidden",
        "not found by TensorFlow",
        "not found by TensorFlow",
        "hidden",
    ]
    assert [g["shown_to_cuda"] for g in report["gpus"]] == [False, True, True, False]
    assert [g["visible"] for g in report["gpus"]] == [False] * 4  # the key scripts read is unchanged


def test_one_unit_per_gpu_chosen_from_its_total():
    from tfgpu_magic.command.units import GIB, MIB, sizes_for

    size = sizes_for(15 * GIB)  # every figure of a 15 GiB GPU reads in GiB (issue 16, item 8)
    assert [size(v) for v in (2348 * MIB, 15 * GIB, 0, 4 * MIB, None)] == [
        "2.3 GiB",
        "15.0 GiB",
        "0.0 GiB",
        "0.0039 GiB",
        "n/a",  # a small share keeps two digits
    ]
    assert [sizes_for(512 * MIB)(v) for v in (300 * MIB, 512 * MIB)] == ["300 MiB", "512 MiB"]
    assert sizes_for(None)(2048 * MIB) == "2,048 MiB"  # no total known: MiB, never a guess


def test_the_card_and_the_gpu_panel_colour_each_holder_alike():
    """One colour per meaning (issue 16, item 8): the card's segments take the panel's theme variables."""
    import re

    css = (Path(status.__file__).resolve().parents[2] / "js" / "lab" / "style" / "index.css").read_text()
    panel = {
        part: var
        for part, var in re.findall(r"\.tfgpu-lab-(\w+)[^{]*\{\s*background: var\((--[\w-]+)\)", css)
    }
    card = {
        key: re.match(r"var\((--[\w-]+)", colour).group(1)
        for key, _n, _c, colour in status.SEGMENTS
        if colour != "transparent"
    }
    assert card == {
        "this_kernel_bytes": panel["kernels"],  # this kernel, among this server's kernels
        "my_other_bytes": panel["my_other"],
        "others_bytes": panel["others"],
        "unattributed_bytes": panel["unattributed"],
    }


def test_this_kernels_utilization_only_where_it_holds_memory_said_per_device_where_the_driver_has_none():
    server = shared_server(ME)
    next(p for p in server.gpus[1].processes if p.pid == ME).sm_percent = 80
    report = report_for(server)
    assert [g["this_kernel_utilization"] for g in report["gpus"]] == [
        None,
        {"percent": 80, "scope": "process", "note": None},
        None,
        None,
    ]
    server.gpus[1].unsupported.add("process_utilization")
    figure = report_for(server)["gpus"][1]["this_kernel_utilization"]
    assert (figure["percent"], figure["scope"]) == (35, "device")  # the whole GPU's, everyone's
    assert "this kernel: 35% GPU utilization, the whole GPU's (per device:" in status.render_text(
        report_for(server)
    )
    assert "this kernel: 35% GPU utilization, the whole GPU&#x27;s (per device:" in status.render_html(
        report_for(server)
    )
