"""A PyTorch user and a JAX user, each through the README's quick start for their framework (issue 27).

Each runs in a fresh kernel with the real torch or jax (CPU builds here) on the simulated server,
TensorFlow installed but never imported, as on a machine shared with TensorFlow users.  The quick
start's cells, then the verbs a user tries next: no reply, no `%gpu` text and no HTML card names
TensorFlow or Keras, and the card carries exactly the text's lines.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from support.paths import ROOT
from support.processes import run_in_fresh_kernel

SETUP = (
    "import tfgpu_magic\n"
    "from tfgpu_magic.simulated import kernels_server\n"
    "tfgpu_magic.set_device_source(kernels_server())\n"
)
THEN = [
    "%gpu grow",
    "%gpu limit 50%",
    "%gpu free",
    "%gpu trace",
    "%gpu trace off",
    "%gpu reset",
    "%gpu",
    "%gpu status --json",
]
TH_TD = re.compile(r"<tr><th[^>]*>(.*?)</th><td[^>]*>(.*?)</td></tr>", re.S)


def quick_start(framework: str) -> str:
    """The README's quick start block for ``framework`` (the block after its bold heading)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"^\*\*{framework}\*\*\n\n```python\n(.*?)^```", text, re.S | re.M)
    assert found, f"the README has no quick start for {framework}"
    return found.group(1)


def texts(outputs: list[dict]) -> list[str]:
    found = []
    for output in outputs:
        if output["output_type"] == "error":
            found.append(f"{output['ename']}: {output['evalue']}")
        found.append("".join(output.get("text", "")))
        for kind in ("text/plain", "text/html"):
            found.append("".join(output.get("data", {}).get(kind, "")))
    return [t for t in found if t]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("framework", ["PyTorch", "JAX"])
def test_a_user_of_one_framework_never_reads_tensorflow(framework, kernel_env, tmp_path):
    block = quick_start(framework)
    cells = [SETUP, *block.strip().split("\n"), *THEN, "import sys; print('tensorflow' in sys.modules)"]
    outputs = run_in_fresh_kernel(cells, tmp_path)
    assert texts(outputs[-1]) == ["False\n"]  # nobody imported TensorFlow behind the user's back
    said = [
        (cell, text) for cell, out in zip(cells[1:-2], outputs[1:-2], strict=False) for text in texts(out)
    ]
    assert said, "the quick start printed nothing"
    for cell, text in said:
        assert "Traceback" not in text, (cell, text)
        assert "TensorFlow" not in text and "Keras" not in text, (cell, text)
    assert any(f"{framework}:" in text for _, text in said)  # its own line is there

    # The card (what JupyterLab and Notebook 7 show) carries every line of the text's header.
    status = next(out for cell, out in zip(cells, outputs, strict=False) if cell == "%gpu")
    shown = next(o["data"] for o in status if "text/html" in o.get("data", {}))
    rows = [(html.unescape(k), html.unescape(v)) for k, v in TH_TD.findall(shown["text/html"])]
    lines = shown["text/plain"].split("\n")
    header = lines[
        : lines.index(next(line for line in lines if line.startswith(("GPUs:", "Bars:", "GPU 0"))))
    ]
    as_text = [f"{k + ':':<11} {v}" if k else f"  {v}" for k, v in rows]
    assert as_text == header

    # --json says the same of every framework: this one imported, TensorFlow not.
    report = json.loads("".join(texts(outputs[cells.index("%gpu status --json")])))
    key = {"PyTorch": "pytorch", "JAX": "jax"}[framework]
    assert report["frameworks"][key]["imported"] is True
    assert report["frameworks"]["tensorflow"]["stage"] == "not_imported"
    assert any(line.startswith(f"{framework}:") for line in header)
