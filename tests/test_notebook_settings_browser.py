"""A notebook's saved GPU settings in a real JupyterLab and Notebook 7, in Chromium.

A notebook whose metadata has the `tfgpu` key is opened: its kernel applied the settings before the
first cell (the server started it with tfgpu_magic loaded; no `%load_ext` cell).  Then
`%gpu limit 2G` and `%gpu save`: the extension writes the displayed keys into the notebook's model,
the user saves (Ctrl+S), and the file on disk has them.  The server reads the simulated kernels
server (``kernels_server``), whose GPUs the kernels see too.  Screenshots go to
test-artifacts/notebook-settings-*.png.
"""

from __future__ import annotations

import json
import time

import pytest

from support.browser import (
    REPO,
    chromium,
    has_chromium,
    has_labextension,
    jupyter_server,
    notebook,
    run_cell,
    shot,
    wait_for_kernel,
    wait_for_output,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not has_chromium(), reason="no Chromium at /usr/bin/chromium (apt-get install -y chromium)"
    ),
    pytest.mark.skipif(
        not has_labextension() or not (REPO / "lib" / "settings.js").is_file(),
        reason="the front ends are not built (npm install && npm run build)",
    ),
]

SETTINGS = {"version": 1, "requirements": {}, "policy": ["limit 4096MiB", "grow"]}
# The first cell: what is in force, before any `%load_ext` (the report's JSON, read back in a few lines).
FIRST = """\
import contextlib, io, json, os
print("TF_FORCE_GPU_ALLOW_GROWTH =", os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))
with contextlib.redirect_stdout(io.StringIO()) as out:
    get_ipython().run_line_magic("gpu", "status --json")
report = json.loads(out.getvalue())
print("requested:", ", ".join(report["requested"]))
print("from:", report["notebook_settings"]["source"])"""
SAVE = "%gpu limit 2G\n%gpu save"


# No GPU of the simulated server has a PiB free: the requirement cannot be met.
UNMET = {"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 2**50}, "policy": ["grow"]}


def notebook_with_settings(settings: dict = SETTINGS) -> str:
    document = json.loads(notebook(FIRST, SAVE))
    document["metadata"]["tfgpu"] = settings
    document["metadata"]["colab"] = {"provenance": []}  # another tool's key: kept by the merge
    return json.dumps(document)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    home = tmp_path_factory.mktemp("settings-home")
    for name in ("lab.ipynb", "nb7.ipynb"):
        (root / name).write_text(notebook_with_settings())
    for name in ("unmet-lab.ipynb", "unmet-nb7.ipynb"):
        (root / name).write_text(notebook_with_settings(UNMET))
    args = [
        "--TfgpuMagic.device_source=tfgpu_magic.gpus.simulated:kernels_server",
        "--ServerApp.jpserver_extensions=tfgpu_magic=True",
        "--TfgpuMagic.refresh_interval=0.5",  # the status bar has the kernel by the screenshot
    ]
    with jupyter_server(root, home, log_name="notebook-settings-server.log", args=args) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright.sync_api")
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    yield page
    page.close()
    ours = [text for text in errors if "tfgpu" in text.lower() or "renderer" in text.lower()]
    assert not ours, f"the page logged: {ours}"


def wait_for_saved_settings(path, timeout: float = 30.0) -> dict:
    """The notebook's metadata on disk once it has the saved limit (the save is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = json.loads(path.read_text())["metadata"]
        if "limit 2048MiB" in metadata.get("tfgpu", {}).get("policy", []) or time.monotonic() > deadline:
            return metadata
        time.sleep(0.25)


def open_notebook(page, server, front_end: str, name: str) -> None:
    if front_end == "lab":
        page.goto(server.url(f"lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}", reset=""))
    else:
        page.goto(server.url(f"notebooks/{name}"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)


@pytest.mark.parametrize("front_end", ["lab", "nb7"])
def test_settings_apply_before_the_first_cell_and_gpu_save_is_kept_by_a_save(server, page, front_end):
    name = f"{front_end}.ipynb"
    open_notebook(page, server, front_end, name)

    run_cell(page, 0)
    said = wait_for_output(page, 0, "from:")
    assert "TF_FORCE_GPU_ALLOW_GROWTH = true" in said
    assert "requested: grow, limit 4096MiB" in said
    assert f"from: the notebook's metadata ({name})" in said

    run_cell(page, 1)
    line = wait_for_output(page, 1, "Saved this notebook's GPU settings")
    assert "policy: grow, limit 2048MiB" in line and f"writes them into {name}'s metadata" in line
    outputs = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
    assert "No renderer" not in " ".join(outputs.all_inner_texts())
    # The bundle's text line is what is shown: its other type has no renderer, and needs none.
    shown = outputs.filter(has_text="Saved this notebook's GPU settings")
    assert shown.get_attribute("data-mime-type") == "text/plain"
    shot(page, f"notebook-settings-{front_end}-saved.png")

    page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+s")
    metadata = wait_for_saved_settings(server.root / name)
    assert metadata["tfgpu"]["version"] == 1
    assert metadata["tfgpu"]["policy"] == ["grow", "limit 2048MiB"]
    assert metadata["accelerator"] == "GPU"
    assert metadata["kaggle"] == {"accelerator": "gpu", "isGpuEnabled": True}
    assert metadata["colab"]["provenance"] == []  # another tool's key under colab: kept
    assert metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("front_end", ["lab", "nb7"])
def test_settings_that_did_not_hold_are_said_as_the_notebook_opens(server, page, front_end):
    """Before any cell runs: a warning with the kernel's line, which stays until closed; the
    question was silent (the first cell the user runs is still [1])."""
    open_notebook(page, server, front_end, f"unmet-{front_end}.ipynb")
    # The kernel's line is longer than a notification shows (140 characters): a headline, and Details.
    toast = page.locator(".jp-toast-message", has_text="saved GPU settings did not all hold")
    toast.wait_for(timeout=30_000)
    shot(page, f"notebook-settings-{front_end}-unmet.png")
    page.locator(".jp-toast-button", has_text="Details").click()
    dialog = page.locator(".jp-Dialog", has_text="GPU settings")
    dialog.wait_for(timeout=10_000)
    said = dialog.locator(".jp-Dialog-body").inner_text()
    assert said.startswith("tfgpu_magic: the notebook needs 1 GPU with 1,048,576.0 GiB free, and "), said
    shot(page, f"notebook-settings-{front_end}-unmet-details.png")
    dialog.locator("button.jp-mod-accept").click()
    dialog.wait_for(state="detached", timeout=10_000)
    run_cell(page, 0)
    wait_for_output(page, 0, "from:")
    assert (
        page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputPrompt").inner_text().strip() == "[1]:"
    )
    # Asked once per kernel start: no second notification after a cell; a restart asks again.
    toasts = page.locator(".jp-toast-message", has_text="saved GPU settings")
    assert toasts.count() <= 1
    while page.locator(".Toastify__close-button").count():
        page.locator(".Toastify__close-button").first.click()
    toasts.first.wait_for(state="detached", timeout=10_000)
    if front_end == "lab":  # a second view of the notebook shares its kernel: still one question
        open_second_view(page)
    restart_kernel(page)
    toasts.first.wait_for(timeout=30_000)
    run_cell(page, 0)  # the notebook in front settled: any second answer has arrived by now
    wait_for_output(page, 0, "from:")
    assert toasts.count() == 1


def open_second_view(page) -> None:
    """The tab's context menu, *New View for Notebook*: a second panel on the same notebook."""
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").click(button="right")
    page.locator(".lm-Menu-itemLabel", has_text="New View for").first.click()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").nth(1).wait_for(timeout=10_000)


def restart_kernel(page) -> None:
    """Restart the notebook's kernel as a user does: 0, 0 in command mode, then Restart."""
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("0")
    page.keyboard.press("0")
    dialog = page.locator(".jp-Dialog", has_text="Restart")
    dialog.locator("button.jp-mod-accept").click()
    dialog.wait_for(state="detached", timeout=10_000)
