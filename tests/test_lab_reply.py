"""The JupyterLab extension reads the server's reply by checking it (js/lab/reply.ts), run in Node.

reply.ts has no runtime imports, so its compiled form (lib/reply.js) runs as an ES module on its
own.  Issue 17, item 11: a reply is validated field by field instead of cast to its type.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from support.typescript import run_in_node


def parse(tmp_path: Path, bodies: list) -> list:
    """parseReply over each body, in one Node process."""
    return run_in_node(tmp_path, "reply.js", [("parseReply", [body]) for body in bodies])


def a_reply(**fields) -> dict:
    base = {
        "version": 1,
        "generated_at": 1_763_800_000.5,
        "refresh_interval_s": 0.5,
        "driver": {"available": True, "reason": None},
        "user": "me",
        "gpus": [
            {
                "index": 0,
                "name": "A100",
                "uuid": "GPU-0",
                "memory_used_bytes": 10,
                "memory_total_bytes": 100,
                "utilization_percent": 5,
                "lost": False,
                "notes": [],
                "split": None,
                "mig_instances": None,
                "share": None,
            }
        ],
        "kernels": [
            {
                "id": "k1",
                "name": "python3",
                "path": "a.ipynb",
                "session_name": "a.ipynb",
                "session_type": "notebook",
                "execution_state": "idle",
                "last_activity": None,
                "pid": 7,
                "child_pids": [8],
                "gpu_memory_bytes": {"0": 10},
                "total_gpu_memory_bytes": 10,
                "note": None,
                "cull_due_at": "2025-11-22T09:26:40.500000Z",
            }
        ],
        "my_other_processes": [],
        "other_users": [],
        "unattributed": [],
        "notes": [],
        "pids_visible": True,
        "hidden_processes": [],
    }
    return {**base, **fields}


def test_a_well_formed_reply_comes_back_as_sent(tmp_path):
    (got,) = parse(tmp_path, [a_reply()])
    assert got == a_reply()


def test_a_null_kernel_name_stays_null_and_wrong_types_become_null(tmp_path):
    kernel = {
        **a_reply()["kernels"][0],
        "name": None,
        "pid": "7",
        "gpu_memory_bytes": {"0": "lots", "x": 1},
        "child_pids": [1, "2", 3.5],
        "path": 42,
    }
    (got,) = parse(tmp_path, [a_reply(kernels=[kernel])])
    (k,) = got["kernels"]
    assert k["name"] is None and k["pid"] is None and k["path"] is None
    assert k["gpu_memory_bytes"] == {"0": None}  # a non-numeric figure is unknown; a non-index key is dropped
    assert k["child_pids"] == [1]


def test_entries_without_their_identity_are_dropped_with_a_note(tmp_path):
    (got,) = parse(
        tmp_path,
        [
            a_reply(
                kernels=[{"name": "x"}, "junk", a_reply()["kernels"][0]],
                gpus=[{"index": "0"}],
                other_users=[{"gpu": 0, "pid": 5}, {"gpu": 0}],
            )
        ],
    )
    assert [k["id"] for k in got["kernels"]] == ["k1"] and got["gpus"] == []
    assert [p["pid"] for p in got["other_users"]] == [5]
    assert got["notes"] == [
        "1 GPU entry of the reply could not be read and is not shown.",
        "2 kernel entries of the reply could not be read and are not shown.",
        "1 process entry of the reply could not be read and is not shown.",
    ]


def test_a_mig_gpus_instances_are_read(tmp_path):
    gpu = {
        **a_reply()["gpus"][0],
        "mig_instances": [
            {
                "mig_index": 0,
                "uuid": "MIG-a",
                "gpu_instance_id": 1,
                "compute_instance_id": 0,
                "memory_used_bytes": 3,
                "memory_total_bytes": 9,
                "process_count": 1,
                "kernel_ids": ["k1", 5],
                "notes": [],
            },
            {"mig_index": None, "notes": ["the MIG instances could not be listed (lost)"]},
        ],
    }
    (got,) = parse(tmp_path, [a_reply(gpus=[gpu])])
    first, unknown = got["gpus"][0]["mig_instances"]
    assert first["kernel_ids"] == ["k1"] and first["memory_total_bytes"] == 9
    assert unknown["mig_index"] is None and unknown["process_count"] is None and unknown["kernel_ids"] is None


def test_what_is_not_a_reply_is_one_line(tmp_path):
    got = parse(
        tmp_path,
        [None, [], "<html>", {"version": 2}, {"version": "1"}, a_reply(gpus=None), a_reply(generated_at="x")],
    )
    assert got[0] == got[1] == got[2] == "The GPU status reply is not a JSON object."
    assert got[3].startswith("The GPU status reply has version 2, this page understands 1")
    assert got[4].startswith('The GPU status reply has version "1"')
    assert (
        got[5]
        == got[6]
        == (
            "The GPU status reply lacks its time, GPUs, kernels or driver state: it is not from the tfgpu_magic server extension."
        )
    )


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "index",
    "name",
    "id",
    "pid",
    "gpu",
    "notes",
    "split",
    "mig_instances",
    "gpu_memory_bytes",
    "kernel_ids",
]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6), max_size=4), st.data())
def test_any_json_gives_a_reply_of_the_declared_types_or_one_line(tmp_path_factory, entries, data):
    """Whatever sits in the lists, what comes out has the types IStatusReply declares."""
    body = a_reply(
        gpus=entries,
        kernels=data.draw(st.lists(st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6), max_size=4)),
    )
    (got,) = parse(tmp_path_factory.mktemp("reply"), [body])
    assert isinstance(got, dict)
    for gpu in got["gpus"]:
        assert isinstance(gpu["index"], int) and isinstance(gpu["notes"], list)
        assert all(isinstance(n, str) for n in gpu["notes"])
        assert gpu["name"] is None or isinstance(gpu["name"], str)
    for kernel in got["kernels"]:
        assert isinstance(kernel["id"], str) and kernel["id"]
        assert kernel["name"] is None or isinstance(kernel["name"], str)
        assert all(v is None or isinstance(v, (int, float)) for v in kernel["gpu_memory_bytes"].values())
