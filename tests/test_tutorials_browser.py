"""Run All on the tutorials in a real JupyterLab and Notebook 7: every cell runs, past the ones that fail on purpose.

The failing cells carry the ``raises-exception`` tag; JupyterLab then asks the kernel not to
stop on that error, so the cells queued after it still run.  A cell that never ran keeps the
prompt ``[ ]:``; one still running shows ``[*]:``.  Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from support.browser import (
    REPO,
    accept_kernel_choice,
    chromium,
    has_chromium,
    jupyter_server,
    shot,
    wait_for_kernel,
)

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # has_chromium() skips these tests without Playwright
    PlaywrightTimeout = TimeoutError

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # TensorFlow starts in each kernel
    pytest.mark.skipif(
        not has_chromium(), reason="no Chromium at /usr/bin/chromium (apt-get install -y chromium)"
    ),
]

TUTORIALS = [  # those with cells that fail on purpose (tutorial 5 has none; nbconvert runs it)
    "01_first_steps.ipynb",
    "02_sharing_a_server.ipynb",
    "03_memory_that_comes_back.ipynb",
    "04_several_devices.ipynb",
    "06_pytorch_and_jax.ipynb",
]


def render_every_cell(home) -> None:
    """JupyterLab 4 draws only the cells in view (windowing): off, so every cell's prompt can be read."""
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))


def prompts(page) -> list[str]:
    cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-CodeCell .jp-InputPrompt")
    return [text.strip() for text in cells.all_inner_texts()]


def make_current(page, app: str, name: str) -> None:
    """JupyterLab's Run menu acts on the shell's current widget, which follows the keyboard focus.

    Until the notebook has had the focus, the menu reads "Run All" and "Restart Kernel and Run
    All" (for no notebook); clicking a cell's prompt gives the notebook the focus, and the shell
    marks its tab ``jp-mod-current``.  Notebook 7 shows one notebook per page: it is current.
    """
    if app != "lab":
        return
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current", has_text=name)
    for _ in range(3):
        page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell .jp-InputPrompt").first.click()
        try:
            tab.wait_for(timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"JupyterLab never made {name} its current widget")


def open_dialog(page) -> str | None:
    dialogs = page.locator(".jp-Dialog")
    return " / ".join(dialogs.all_inner_texts()) if dialogs.count() else None


def run_all(page) -> None:
    """Run > Run All Cells (the exact item: "Restart Kernel and Run All Cells…" contains the words too)."""
    if accept_kernel_choice(page):
        wait_for_kernel(page)
    if (dialog := open_dialog(page)) is not None:
        raise AssertionError(f"a dialog is open before Run All: {dialog!r}")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(r"^Run All Cells$")).click()


def started(page, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p != "[ ]:" for p in prompts(page)):
            return True
        time.sleep(0.5)
    return False


def wait_until_every_cell_ran(page, timeout: float = 420, still: float = 60) -> list[str]:
    """The prompts once every cell ran, or when nothing changed for ``still`` seconds (Run All stopped)."""
    deadline = time.monotonic() + timeout
    seen, changed_at = prompts(page), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - changed_at < still:
        if seen and all(p.startswith("[") and p[1:-2].isdigit() for p in seen):
            return seen
        time.sleep(1)
        now = prompts(page)
        if now != seen:
            seen, changed_at = now, time.monotonic()
    return seen


def cleared(source, target) -> None:
    """The tutorial as a learner's fresh copy would run it: no stored outputs or prompt numbers."""
    notebook = json.loads(source.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    target.write_text(json.dumps(notebook))


def code_cells(path) -> int:
    return sum(cell["cell_type"] == "code" for cell in json.loads(path.read_text())["cells"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("app, path", [("lab", "lab/tree/{name}"), ("notebook", "notebooks/{name}")])
@pytest.mark.parametrize("name", TUTORIALS)
def test_run_all_runs_every_cell(tmp_path, monkeypatch, app, path, name):
    root = tmp_path / "root"
    root.mkdir()
    cleared(REPO / "example_notebooks" / name, root / name)
    monkeypatch.setenv("TFGPU_MAGIC_CLAIM_DIR", str(tmp_path / "claims"))
    render_every_cell(tmp_path / "home")
    with (
        jupyter_server(root, tmp_path / "home", log_name=f"tutorial-{app}.log", app=app) as server,
        chromium() as browser,
    ):
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(server.url(path.format(name=name)))
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
        wait_for_kernel(page)
        make_current(page, app, name)
        run_all(page)
        if not started(page):  # the menu can miss a click while the page is still settling
            run_all(page)
        seen = wait_until_every_cell_ran(page)
        shot(page, f"tutorial-run-all-{app}-{name.split('_')[0]}.png")
        assert len(seen) == code_cells(root / name), seen
        numbers = [int(p[1:-2]) for p in seen]  # raises on "[ ]:" or "[*]:": a cell that never ran
        assert numbers == sorted(numbers) and numbers[-1] >= len(numbers), seen  # in order, past the failures
