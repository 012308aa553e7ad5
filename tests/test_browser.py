"""`%gpu monitor` in a real browser: JupyterLab on loopback, driven by Chromium through Playwright.

A notebook opens the panel on the fake NVML server, then a cell stays busy for ten seconds
while it changes the readings (and loses GPU 3 for a while).  The chart must receive and
draw new points while that cell still runs.  Screenshots go to test-artifacts/ for a look.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

CHROMIUM = "/usr/bin/chromium"
REPO = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
LEGEND = ["Time", "Total", "Used (all)", "This kernel", "TF in use", "TF peak", "Limit"]
TITLES = [
    "GPU 0 · NVIDIA A100-SXM4-40GB",
    "GPU 1 · NVIDIA A100-SXM4-80GB",
    "GPU 2 · NVIDIA RTX A5000",
    "GPU 3 · Tesla T4",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"no Chromium at {CHROMIUM} (apt-get install -y chromium)",
    ),
    pytest.mark.skipif(
        not (REPO / "tfgpu_magic" / "static" / "widget.js").is_file(),
        reason="the panel's front end is not built (npm install && npm run build)",
    ),
]

SETUP = """\
import sys, time
sys.path.insert(0, REPO)
from tfgpu_magic import monitor
from tfgpu_magic.nvml import Nvml
from tfgpu_magic.simulated import shared_server
from types import SimpleNamespace
server = shared_server()  # four fake GPUs; this kernel holds 10 GiB on GPU 1
GIB = 2**30
tf = SimpleNamespace(current_bytes=6 * GIB, peak_bytes=6 * GIB)  # a stand-in for TF's allocator
sources = dict(tf_stats=lambda: {"GPU:0": tf}, tf_map=lambda: {"GPU:0": 1}, limits=lambda: {1: 36 * GIB})
""".replace("REPO", repr(str(REPO)), 1)
OPEN = "panel = monitor.open_panel(interval=0.2, window=60, nvml=Nvml(lib=server), **sources)"
OPEN_SIDEBAR = OPEN.replace("window=60", "window=60, sidebar=True")
SECOND = "second = monitor.open_panel(interval=1, window=60)  # in the notebook; shares the sampler"
BUSY = """\
for k in range(40):  # ten seconds that hold the kernel, like model.fit
    server.gpus[1].processes[0].used_mib += 512
    tf.current_bytes = (6 + 0.4 * k if k < 30 else 8) * GIB  # frees inside what it holds
    tf.peak_bytes = max(tf.peak_bytes, tf.current_bytes)
    server.gpus[3].lost = 12 <= k < 24
    time.sleep(0.25)
print("busy cell done")
"""
CHECK = 'print("sampler running:", monitor.sampler_running(), monitor.active_sampler())'


def notebook(*sources: str) -> str:
    cells = [
        {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
         "outputs": [], "source": source}
        for i, source in enumerate(sources)
    ]
    return json.dumps({
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    })


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on loopback with a token and a throwaway root and settings."""
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("lab-home")
    (root / "monitor.ipynb").write_text(notebook(SETUP, OPEN, BUSY, CHECK))
    (root / "sidebar.ipynb").write_text(notebook(SETUP, OPEN_SIDEBAR, SECOND, CHECK))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        IPYTHONDIR=str(home / "ipython"),
    )
    # No "get notified about Jupyter news?" toast over the panel in screenshots.
    notes = home / "settings" / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)
    (notes / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
         "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(f"{base}/api/status?token={token}", proc)
        yield base, token
    finally:
        proc.send_signal(signal.SIGINT)  # lets the server shut its kernels down
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def wait_for_server(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({proc.returncode}); see {ARTIFACTS}/jupyterlab.log")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer within {timeout} s")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_notebook(lab, browser):
    base, token = lab
    pages = []

    def open_one(name: str):
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        pages.append(page)
        # A workspace of its own, reset: no tab of an earlier test is restored beside it.
        workspace = name.removesuffix(".ipynb")
        page.goto(f"{base}/lab/workspaces/{workspace}/tree/{name}?token={token}&reset")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        return page

    yield open_one
    for page in pages:
        page.close()


# -- helpers that drive the notebook -------------------------------------------------------
def run_cell(page, index: int) -> None:
    """Run one cell, and make sure it was queued (a key press can land before the editor is ready)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    for _ in range(3):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if prompt(page, index) != "[ ]:":
                return
            time.sleep(0.1)
    shot(page, f"run-cell-{index}-failed.png")
    raise AssertionError(f"cell {index} did not start; see {ARTIFACTS}/run-cell-{index}-failed.png")


def prompt(page, index: int) -> str:
    text = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputPrompt").inner_text()
    return text.strip()


def wait_for_output(page, index: int, text: str, timeout: float = 60_000) -> str:
    output = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea-output")
    output.filter(has_text=text).first.wait_for(timeout=timeout)
    return output.all_inner_texts()[-1]


def received(page) -> int:
    return int(page.locator(".tfgpu-monitor").first.get_attribute("data-received") or 0)


def draws(page) -> int:
    return int(page.locator(".tfgpu-monitor").first.get_attribute("data-draws") or 0)


def series(page, key: str, name: str) -> list:
    """One series of one device as the chart holds it (GiB, null = gap)."""
    return page.evaluate(
        """([key, name]) => {
            const panel = document.querySelector('.tfgpu-monitor').__tfgpuPanel;
            return Array.from(panel.store.dev.get(key)[name]);
        }""",
        [key, name],
    )


def shot(target, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    target.screenshot(path=str(ARTIFACTS / name))


# -- the tests -------------------------------------------------------------------------------
def test_the_chart_moves_while_a_cell_runs_and_stop_ends_the_sampler(open_notebook):
    page = open_notebook("monitor.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    panel = page.locator(".tfgpu-monitor")
    try:
        page.wait_for_function(
            "() => +document.querySelector('.tfgpu-monitor')?.dataset.points >= 5",
            timeout=60_000,
        )
    finally:
        shot(page, "monitor-page.png")

    # Series and legend match the GPUs of the fake server.
    devices = panel.locator(".tfgpu-device")
    assert devices.count() == 4
    assert panel.locator(".tfgpu-device-title").all_inner_texts() == TITLES
    for i in range(4):
        legend = devices.nth(i).locator(".u-legend .u-series th")
        assert [t.strip() for t in legend.all_inner_texts()] == LEGEND
        assert devices.nth(i).locator("canvas").count() == 1
    shot(panel, "monitor-light.png")

    # A cell holds the kernel for ten seconds; the chart must keep receiving and drawing.
    run_cell(page, 2)
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[2]"
        ".querySelector('.jp-InputPrompt').textContent.includes('*')",
        timeout=10_000,
    )
    time.sleep(1.0)
    counts = []
    for _ in range(3):
        counts.append((received(page), draws(page), prompt(page, 2)))
        time.sleep(1.5)
    assert all(p == "[*]:" for _, _, p in counts), f"the busy cell ended too early: {counts}"
    got, drawn = [c[0] for c in counts], [c[1] for c in counts]
    assert got[0] < got[1] < got[2], f"no new points while the cell ran: {counts}"
    assert drawn[0] < drawn[1] < drawn[2], f"no redraw while the cell ran: {counts}"

    # GPU 3 is lost for three seconds: a gap in its chart and a message on its card.
    error = panel.locator(".tfgpu-device[data-key='gpu3'] .tfgpu-device-error")
    error.filter(has_text="stopped answering").wait_for(timeout=10_000)
    shot(panel, "monitor-busy-gpu-lost.png")
    assert error.inner_text().startswith("GPU 3 stopped answering (GPU is lost)")
    assert prompt(page, 2) == "[*]:"

    wait_for_output(page, 2, "busy cell done", timeout=30_000)
    page.wait_for_function(
        "() => !document.querySelector(\"[data-key='gpu3'] .tfgpu-device-error\").offsetParent",
        timeout=10_000,
    )
    mine = [v for v in series(page, "gpu1", "mine") if v is not None]
    assert mine[0] == pytest.approx(10.0) and mine[-1] >= 10.0 + 39 * 0.5 - 1e-9
    used3 = series(page, "gpu3", "used")
    assert None in used3 and used3[-1] is not None  # a gap, then readings again
    assert series(page, "gpu1", "limit")[-1] == 36.0
    assert series(page, "gpu1", "tf")[-1] == 8.0 and series(page, "gpu1", "peak")[-1] > 17.0
    assert series(page, "gpu0", "tf")[-1] is None  # no TensorFlow there: a gap, not 0
    shot(panel, "monitor-final.png")

    # Hover shows each series' value in the legend.
    plot = panel.locator(".tfgpu-device[data-key='gpu1'] .u-over")
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.97, box["y"] + box["height"] / 2)
    values = panel.locator(".tfgpu-device[data-key='gpu1'] .u-legend .u-series .u-value")
    assert values.nth(3).inner_text().endswith("GiB")  # "This kernel"
    shot(panel, "monitor-hover.png")
    page.mouse.move(0, 0)

    # Dark theme: the panel takes JupyterLab's colours.
    light_bg = panel.evaluate("el => getComputedStyle(el).backgroundColor")
    page.evaluate("() => document.body.dataset.jpThemeLight")
    switch_theme(page, "JupyterLab Dark")
    page.wait_for_function(
        "bg => getComputedStyle(document.querySelector('.tfgpu-monitor')).backgroundColor !== bg",
        arg=light_bg,
        timeout=15_000,
    )
    time.sleep(1.0)  # the charts re-read the theme's colours
    shot(panel, "monitor-dark.png")
    switch_theme(page, "JupyterLab Light")

    # Stop: the last panel's stop ends the kernel's sampler thread.
    panel.locator(".tfgpu-stop").click()
    page.wait_for_function(
        "() => document.querySelector('.tfgpu-monitor').classList.contains('tfgpu-stopped')"
    )
    time.sleep(0.5)
    run_cell(page, 3)
    assert wait_for_output(page, 3, "sampler running:").strip() == "sampler running: False None"


def test_the_sidebar_opens_beside_the_notebook(open_notebook):
    page = open_notebook("sidebar.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    try:
        page.wait_for_function(
            "() => +document.querySelector('.tfgpu-monitor')?.dataset.points >= 3",
            timeout=60_000,
        )
    finally:
        shot(page, "monitor-sidebar.png")
    panel = page.locator("#jp-right-stack .tfgpu-monitor")  # JupyterLab's right side panel
    assert panel.locator(".tfgpu-device").count() == 4
    assert page.locator(".jp-Notebook .tfgpu-monitor").count() == 0  # not in the notebook
    page.evaluate("() => window.dispatchEvent(new Event('resize'))")

    # A second panel in the notebook shares the sampler: the sidebar's control follows its interval.
    run_cell(page, 2)
    page.locator(".jp-Notebook .tfgpu-monitor").wait_for(timeout=30_000)
    interval = panel.locator(".tfgpu-select").first
    page.wait_for_function(
        "el => el.value === '1'", arg=interval.element_handle(), timeout=15_000
    )
    shot(page, "monitor-two-panels.png")
    run_cell(page, 3)
    assert wait_for_output(page, 3, "sampler running:").startswith("sampler running: True")


def switch_theme(page, name: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text=name).first.click()
