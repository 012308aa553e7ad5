"""What the JupyterLab extension writes into a notebook for `%gpu save` (js/lab/settings.ts), run in Node.

settings.ts has only type imports, so its compiled form (lib/settings.js) runs as an ES module on
its own.  Its merge must be saved.merge_metadata's rule exactly (the kernel, `tfgpu run` and the
front end write the same metadata): generated cases are merged by both and compared.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tfgpu_magic.command import saved

from support.typescript import run_in_node

SETTINGS = {"version": 1, "requirements": {"gpus": 1}, "policy": ["grow"]}
KEYS = ["tfgpu", "accelerator", "colab", "kaggle", "kernelspec", "__proto__", "1"]


def evaluate(tmp_path: Path, calls: list[tuple[str, list]]) -> list:
    return run_in_node(tmp_path, "settings.js", calls)


def a_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = (
        ["object", "object", "list", "text", "number", "null", "bool"] if depth < 2 else ["text", "number"]
    )
    kind = rng.choice(kinds)
    if kind == "object":
        return {
            rng.choice([*KEYS, "gpuType", "isGpuEnabled"]): a_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))
        }
    if kind == "list":
        return [a_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {"text": "GPU", "number": rng.randint(-3, 3), "null": None, "bool": rng.random() < 0.5}[kind]


def a_metadata(rng: random.Random) -> dict[str, Any]:
    return {key: a_value(rng) for key in rng.sample(KEYS, rng.randint(0, len(KEYS)))}


def test_the_merge_is_saved_merge_metadata_on_generated_cases(tmp_path):
    rng = random.Random(20261127)
    cases = [(a_metadata(rng), a_metadata(rng)) for _ in range(400)]
    merged = evaluate(tmp_path, [("mergeMetadata", [old, new]) for old, new in cases])
    for (old, new), theirs in zip(cases, merged, strict=True):
        ours = saved.merge_metadata(old, new)
        # Compared as JSON with sorted keys: JavaScript lists integer-like keys first.
        assert json.dumps(theirs, sort_keys=True) == json.dumps(ours, sort_keys=True), (old, new)


def test_the_merge_keeps_what_others_wrote_and_replaces_the_settings_whole(tmp_path):
    old = {
        "tfgpu": {"version": 1, "policy": ["grow"], "observed": {"at": "then"}},
        "colab": {"provenance": [], "gpuType": "T4"},
        "kaggle": {"accelerator": "none", "dataSources": [1]},
        "accelerator": "TPU",
    }
    new = {
        "tfgpu": SETTINGS,
        "colab": {"gpuType": "A100"},
        "kaggle": {"accelerator": "gpu"},
        "accelerator": "GPU",
    }
    [merged] = evaluate(tmp_path, [("mergeMetadata", [old, new])])
    assert merged == {
        "tfgpu": SETTINGS,
        "colab": {"provenance": [], "gpuType": "A100"},
        "kaggle": {"accelerator": "gpu", "dataSources": [1]},
        "accelerator": "GPU",
    }
    assert merged == saved.merge_metadata(old, new)


def bundle(keys: Any) -> dict[str, Any]:
    return {"text/plain": "Saved ...", saved.MIME_TYPE: keys}


def test_a_bundle_from_gpu_save_is_read_and_keys_it_never_writes_are_ignored(tmp_path):
    keys = {
        "tfgpu": SETTINGS,
        "accelerator": "GPU",
        "kaggle": {"accelerator": "gpu"},
        "kernelspec": {"name": "x"},
    }
    [update] = evaluate(tmp_path, [("readUpdate", [bundle(keys)])])
    assert update == {"tfgpu": SETTINGS, "accelerator": "GPU", "kaggle": {"accelerator": "gpu"}}


def test_what_gpu_save_displays_is_read_whole(tmp_path):
    """The kernel's own bundle (notebook_settings.bundle), not a hand-written one."""
    from tfgpu_magic.kernel import notebook_settings

    keys = {
        "tfgpu": SETTINGS,
        **saved.accelerator_keys(saved.read({"tfgpu": SETTINGS}), ["NVIDIA A100-SXM4-80GB"]),
    }
    data = json.loads(json.dumps(notebook_settings.bundle("Saved", keys)))
    [update] = evaluate(tmp_path, [("readUpdate", [data])])
    assert update == keys and update["accelerator"] == "GPU" and update["colab"] == {"gpuType": "A100"}


def test_anything_else_a_kernel_displays_is_ignored(tmp_path):
    wrong = [
        None,
        "text",
        [],
        {"text/plain": "no keys"},
        bundle(None),
        bundle([SETTINGS]),
        bundle({"accelerator": "GPU"}),  # no settings
        bundle({"tfgpu": "grow"}),
        bundle({"tfgpu": {"policy": ["grow"]}}),  # no version
        bundle({"tfgpu": {"version": "1"}}),
        bundle({"tfgpu": {"version": 1.5}}),
        bundle({"tfgpu": []}),
        bundle(
            {"tfgpu": {"version": 1, "observed": {"note": "x" * 200_000}}}
        ),  # far past what %gpu save writes
    ]
    assert evaluate(tmp_path, [("readUpdate", [data]) for data in wrong]) == [None] * len(wrong)


def message(msg_type: str, data: Any) -> dict[str, Any]:
    return {"header": {"msg_type": msg_type}, "content": {"data": data, "metadata": {}}}


def test_display_execute_result_and_update_carry_it_and_nothing_else_does(tmp_path):
    data = bundle({"tfgpu": SETTINGS})
    kinds = ["display_data", "execute_result", "update_display_data", "stream", "error", "status"]
    found = evaluate(tmp_path, [("updateFromMessage", [message(kind, data)]) for kind in kinds])
    assert found == [{"tfgpu": SETTINGS}] * 3 + [None] * 3
    assert evaluate(
        tmp_path, [("updateFromMessage", [{"header": {"msg_type": "display_data"}, "content": None}])]
    ) == [None]


# -- the question at a notebook's open: did its saved settings hold? -------------------------------
def answer(data: Any, status: str = "ok") -> dict[str, Any]:
    return {"status": "ok", "user_expressions": {"tfgpu": {"status": status, "data": data, "metadata": {}}}}


def test_the_question_is_silent_and_asks_the_kernels_start_notice(tmp_path):
    [request] = evaluate(tmp_path, [("noticeRequest", [])])
    assert request["silent"] is True and request["store_history"] is False and request["code"] == ""
    assert "notebook_settings" in request["user_expressions"]["tfgpu"]
    assert "'start_notice'" in request["user_expressions"]["tfgpu"]


def test_the_notice_is_read_from_the_json_answer_and_nothing_else(tmp_path):
    line = "tfgpu_magic: the notebook needs 1 GPU with 1,024 MiB free, and no GPU here has that much"
    replies = [
        answer({"application/json": {"notice": line}, "text/plain": "<StartNotice>"}),
        answer({"application/json": {"notice": None}}),
        answer({"application/json": {"notice": ""}}),
        answer({"application/json": {"notice": 3}}),
        answer({"text/plain": repr(line)}),  # a repr is never parsed
        answer({"application/json": {"notice": line}}, status="error"),
        {"status": "error"},
        None,
    ]
    assert evaluate(tmp_path, [("readNotice", [reply]) for reply in replies]) == [line] + [None] * 7


def test_a_long_line_is_a_headline_with_the_line_as_details_a_short_one_is_itself(tmp_path):
    short = "tfgpu_magic: the notebook's setting 'grow' was not applied: no"
    long = "tfgpu_magic: the notebook needs 1 GPU with 1,048,576.0 GiB free, and " + "x" * 100
    found = evaluate(tmp_path, [("noticeMessage", [short]), ("noticeMessage", [long])])
    assert found[0] == {"message": short, "details": None}
    assert found[1]["details"] == long and len(found[1]["message"]) <= 140
    assert found[1]["message"].startswith("tfgpu_magic: this notebook's saved GPU settings did not all hold")
