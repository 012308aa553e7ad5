"""The words and figures of the JupyterLab extension (js/lab/format.ts), run in Node.

format.ts has no runtime imports, so its compiled form (lib/format.js, from `tsc`) runs as an ES
module on its own.  Each case is evaluated in one Node process and compared here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.typescript import run_in_node

GIB = 2**30
MIB = 2**20
NOW = 1_763_800_000.0  # the reply's generated_at (unix seconds)


def kernel(memory: dict, **fields) -> dict:
    base = {
        "id": "0123456789abcdef",
        "name": "python3",
        "path": "work/a.ipynb",
        "session_name": "a.ipynb",
        "session_type": "notebook",
        "execution_state": "idle",
        "last_activity": "2025-11-22T08:26:40.000Z",
        "pid": 1234,
        "child_pids": [],
        "gpu_memory_bytes": memory,
        "total_gpu_memory_bytes": None,
        "note": None,
    }
    return {**base, **fields}


def reply(kernels: list, available: bool = True, reason=None) -> dict:
    return {
        "ok": True,
        "receivedAt": 0,
        "reply": {
            "version": 1,
            "generated_at": NOW,
            "refresh_interval_s": 2,
            "driver": {"available": available, "reason": reason},
            "user": "me",
            "gpus": [],
            "kernels": kernels,
            "my_other_processes": [],
            "other_users": [],
            "unattributed": [],
            "notes": [],
        },
    }


def evaluate(tmp_path: Path, calls: list[tuple[str, list]]) -> list:
    return run_in_node(tmp_path, "format.js", calls)


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "n/a"),
        (0, "0 MiB"),
        (1000, "<1 MiB"),
        (512 * MIB, "512 MiB"),
        (1023 * MIB, "1023 MiB"),
        (1023.6 * MIB, "1.0 GiB"),
        (6.1 * GIB, "6.1 GiB"),
        (80 * GIB, "80.0 GiB"),
    ],
)
def test_bytes_in_mib_or_gib_chosen_from_the_value(tmp_path, value, text):
    assert evaluate(tmp_path, [("formatBytes", [value])]) == [text]


def test_figures_per_gpu_lowest_index_first_and_unknown_as_na(tmp_path):
    calls = [
        ("formatPerGpu", [kernel({"1": 2 * GIB, "0": GIB})]),
        ("formatPerGpu", [kernel({"1": int(6.1 * GIB)})]),
        ("formatPerGpu", [kernel({})]),
        ("formatPerGpu", [kernel({"3": None})]),
        ("holdsGpuMemory", [kernel({"3": None})]),
        ("holdsGpuMemory", [kernel({})]),
    ]
    assert evaluate(tmp_path, calls) == [
        "GPU 0: 1.0 GiB · GPU 1: 2.0 GiB",
        "GPU 1: 6.1 GiB",
        "",
        "GPU 3: n/a",
        True,
        False,
    ]


@pytest.mark.parametrize(
    "state, last_activity, text",
    [
        ("idle", "2025-11-22T08:26:40.000Z", "idle <1 min"),  # == NOW
        ("idle", "2025-11-22T08:14:40.000Z", "idle 12 min"),
        ("idle", "2025-11-22T05:21:40.000Z", "idle 3 h 5 min"),
        ("idle", "2025-11-20T05:26:40.000Z", "idle 2 d 3 h"),
        ("idle", None, "idle"),
        ("busy", "2025-11-22T08:14:40.000Z", "busy"),
        ("starting", None, "starting"),
    ],
)
def test_activity_is_measured_on_the_servers_clock(tmp_path, state, last_activity, text):
    k = kernel({}, execution_state=state, last_activity=last_activity)
    assert evaluate(tmp_path, [("formatActivity", [k, NOW])]) == [text]


@pytest.mark.parametrize(
    "due, text",
    [
        ("2025-11-22T09:06:40.000Z", "idle 12 min · culled in 40 min if idle"),
        ("2025-11-22T08:26:40.000Z", "idle 12 min · culling due"),  # == NOW
        (None, "idle 12 min"),
        ("not a time", "idle 12 min"),
    ],
)
def test_an_idle_kernel_says_when_the_gpu_culler_will_shut_it_down(tmp_path, due, text):
    k = kernel({"1": GIB}, last_activity="2025-11-22T08:14:40.000Z", cull_due_at=due)
    assert evaluate(tmp_path, [("formatActivity", [k, NOW])]) == [text]


def test_status_bar_text_and_reason_on_hover(tmp_path):
    one = kernel({"1": int(6.1 * GIB)}, id="k1")
    two = kernel({"0": GIB, "1": 2 * GIB}, id="k2", path="b.ipynb")
    none = kernel({}, id="k3")
    remote = kernel({}, id="k4", note="the kernel runs elsewhere (no local process)")
    unknown = kernel({"2": None}, id="k5")
    readings = reply([one, two, none, remote, unknown])
    calls = [
        ("statusText", [readings, "k1"]),
        ("statusText", [readings, "k2"]),
        ("statusText", [readings, "k3"]),
        ("statusText", [readings, "k4"]),
        ("statusText", [readings, "k5"]),
        ("statusText", [readings, "gone"]),
        ("statusText", [readings, None]),
        ("statusText", [reply([], available=False, reason="NVML Shared Library Not Found"), "k1"]),
        (
            "statusText",
            [
                {"ok": False, "error": "The tfgpu_magic server extension is not enabled", "receivedAt": 0},
                "k1",
            ],
        ),
        ("statusText", [None, "k1"]),
    ]
    got = evaluate(tmp_path, calls)
    assert [g["text"] for g in got] == [
        "GPU 1: 6.1 GiB",
        "GPU 0: 1.0 GiB · GPU 1: 2.0 GiB",
        "no GPU memory",
        "GPU n/a",
        "GPU 2: n/a",
        "GPU n/a",
        "GPU n/a",
        "GPU n/a",
        "GPU n/a",
        "GPU …",
    ]
    assert got[1]["title"].startswith("b.ipynb: its kernel holds GPU 0: 1.0 GiB · GPU 1: 2.0 GiB.")
    assert got[3]["title"].startswith("the kernel runs elsewhere")
    assert "not how much memory they hold" in got[4]["title"]
    assert got[7]["title"].startswith("No GPU readings: NVML Shared Library Not Found")
    assert got[8]["title"].startswith("The tfgpu_magic server extension is not enabled")
    assert all(g["title"].endswith("Click for the GPU panel.") for g in got)


def test_a_kernel_whose_spec_name_is_null_is_not_called_kernel_null(tmp_path):
    """Issue 17, item 11: the server may not know a kernel's spec name; the row's tooltip leaves it out."""
    named, unnamed = evaluate(
        tmp_path,
        [
            ("kernelDetails", [kernel({"1": GIB}), "idle 3 min"]),
            (
                "kernelDetails",
                [kernel({"1": GIB}, name=None, pid=None, path=None, session_name=None), "busy"],
            ),
        ],
    )
    assert named == "work/a.ipynb\nkernel python3, idle 3 min\npid 1234"
    assert unnamed == "0123456789abcdef\nbusy"


def test_utilization_per_gpu_said_per_device_or_na_and_why_on_hover(tmp_path):
    k = kernel(
        {"3": GIB, "1": GIB},
        gpu_utilization={
            "3": {"percent": 12, "scope": "device", "note": "per device: the driver gives none per process"},
            "1": {"percent": 0, "scope": "process", "note": None},
        },
    )
    unread = kernel({"1": GIB}, gpu_utilization={"1": {"percent": None, "scope": "process", "note": "boom"}})
    calls = [
        ("utilizationFigures", [k]),
        ("utilizationFigures", [unread]),
        ("utilizationFigures", [kernel({"1": GIB})]),  # an older server: nothing said
        ("kernelDetails", [unread, "idle"]),
    ]
    assert evaluate(tmp_path, calls) == [
        ["GPU 1: 0%", "GPU 3: 12% per device"],
        ["GPU 1: n/a"],
        [],
        "work/a.ipynb\nkernel python3, idle\npid 1234\nGPU 1 utilization: boom",
    ]


def test_the_status_bar_says_when_the_kernel_holds_memory_nobody_uses(tmp_path):
    notice = (
        "This kernel has held 6.1 GiB of GPU memory (the driver's figure) at 0% GPU utilization for 12 min"
    )
    idle = kernel({"1": int(6.1 * GIB)}, id="k1", gpu_idle_notice=notice)
    busy = kernel({"1": int(6.1 * GIB)}, id="k2", gpu_idle_notice=None)
    said = evaluate(
        tmp_path, [("statusText", [reply([idle, busy]), "k1"]), ("statusText", [reply([idle, busy]), "k2"])]
    )
    assert said[0]["text"] == "GPU 1: 6.1 GiB · unused" and said[0]["idle"] is True
    assert said[0]["title"].startswith(notice + ".\n")
    assert said[1]["text"] == "GPU 1: 6.1 GiB" and "idle" not in said[1]
