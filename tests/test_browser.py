"""`%gpu monitor` in a real browser: JupyterLab on loopback, driven by Chromium through Playwright.

A notebook opens the panel on the fake NVML server, then a cell stays busy for ten seconds
while it changes the readings (and loses GPU 3 for a while).  The chart must receive and
draw new points while that cell still runs.  Screenshots go to test-artifacts/ for a look.
"""

from __future__ import annotations

import re
import time

import pytest

from support.browser import (
    REPO,
    chromium,
    has_chromium,
    has_labextension,
    jupyter_server,
    notebook,
    prompt,
    run_cell,
    shot,
    switch_theme,
    wait_for_kernel,
    wait_for_output,
)

LEGEND = [
    "Time",
    "Total",
    "Used (all)",
    "This kernel",
    "Limit",
    "TensorFlow allocator: in use",
    "TensorFlow allocator: peak",
    "GPU util",
]
TITLES = [
    "GPU 0 · NVIDIA A100-SXM4-40GB",
    "GPU 1 · NVIDIA A100-SXM4-80GB",
    "GPU 2 · NVIDIA RTX A5000",
    "GPU 3 · Tesla T4",
    "TensorFlow CPU:0",  # a few MiB: charted in MiB
]
CLOCK = r"^\d{1,2}:\d{2}:\d{2}( [AP]M)?$"  # the browser's locale: en-US in headless Chromium

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not has_chromium(), reason="no Chromium at /usr/bin/chromium (apt-get install -y chromium)"
    ),
    pytest.mark.skipif(
        not (REPO / "tfgpu_magic" / "static" / "widget.js").is_file() or not has_labextension(),
        reason="the front ends are not built (npm install && npm run build)",
    ),
]

SETUP = """\
import sys, time
sys.path.insert(0, REPO)
from tfgpu_magic.kernel import monitor, panels
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from types import SimpleNamespace
from tfgpu_magic.frameworks.base import DeviceMemory, Stage
from tfgpu_magic.frameworks.tensorflow import TensorFlow
from tfgpu_magic.kernel.allocator_figures import Board
server = shared_server()  # four fake GPUs; this kernel holds 10 GiB on GPU 1
GIB = 2**30
tf = SimpleNamespace(current_bytes=6 * GIB, peak_bytes=6 * GIB)  # a stand-in for TF's allocator
cpu = SimpleNamespace(current_bytes=4 * 2**20, peak_bytes=5 * 2**20)  # 4 MiB on TensorFlow's CPU

class StandIn(TensorFlow):  # TensorFlow's adapter (its name and figures), its allocator plain state
    def stage(self): return Stage.STARTED
    def device_memory(self):
        return {d: DeviceMemory(s.current_bytes, s.peak_bytes) for d, s in {"GPU:0": tf, "CPU:0": cpu}.items()}
    def gpu_numbering(self, cuda_map): return {"GPU:0": 1}

board, standin = Board(), StandIn()
publish = lambda: board.publish(lambda: [standin], lambda: [0, 1, 2, 3])  # as the kernel does after each cell
publish()
sources = dict(figures=board.latest, limits=lambda: {1: 36 * GIB})
""".replace("REPO", repr(str(REPO)), 1)
OPEN = "panel = panels.open_panel(interval=0.2, window=60, nvml=Nvml(lib=server), **sources)"
OPEN_SIDEBAR = OPEN.replace("window=60", "window=60, sidebar=True")
SECOND = "second = panels.open_panel(interval=1, window=60)  # in the notebook; shares the sampler"
BUSY = """\
for k in range(40):  # ten seconds that hold the kernel, like model.fit
    server.gpus[1].processes[0].used_mib += 512
    tf.current_bytes = (6 + 0.4 * k if k < 30 else 8) * GIB  # frees inside what it holds
    tf.peak_bytes = max(tf.peak_bytes, tf.current_bytes)
    publish()  # read on this (the user's) thread; the sampler thread only takes the snapshot
    server.gpus[3].lost = 12 <= k < 24
    time.sleep(0.25)
print("busy cell done")
"""
CHECK = 'print("sampler running:", monitor.sampler_running(), monitor.active_sampler())'
# `%gpu use auto` on the simulated server, through the session (the real path of the magic).
USE_AUTO = [
    """\
import os, sys, tempfile
sys.path.insert(0, REPO)
os.environ["TFGPU_MAGIC_CLAIM_DIR"] = tempfile.mkdtemp()  # claims of this test only
import tfgpu_magic
from tfgpu_magic.gpus.simulated import shared_server
tfgpu_magic.set_device_source(shared_server())
%load_ext tfgpu_magic""".replace("REPO", repr(str(REPO)), 1),
    "%gpu monitor --interval 0.2 --window 60",
    "%gpu use auto",
    "%gpu monitor",
]
# Issue 27, item 4: real PyTorch and JAX in the kernel (CPU builds here, or CUDA builds without a
# GPU): each framework without allocator figures is named in the panel, not drawn as zero.  Then
# PyTorch's adapter answers as if its CUDA had started on a GPU (the real adapter's figures and
# name, its readings plain state): after the cell, its series are drawn.
FRAMEWORKS = [
    USE_AUTO[0],
    """import torch, jax, jax.numpy as jnp
x = torch.zeros(1000)
y = jnp.ones(1000).block_until_ready()
print("torch", torch.version.cuda, torch.cuda.is_available(), "jax", jax.devices()[0].platform)""",
    "%gpu monitor --interval 0.2 --window 60",
    """from tfgpu_magic.frameworks.base import DeviceMemory, Stage
from tfgpu_magic.kernel.session import get_session

# The session's PyTorch adapter, as if CUDA had started: 3 GiB allocated, 5 GiB reserved on cuda:0.
(torch_adapter,) = [f for f in get_session().frameworks() if f.key == "pytorch"]
torch_adapter.stage = lambda: Stage.STARTED
torch_adapter.device_memory = lambda: {"cuda:0": DeviceMemory(3 * 2**30, 4 * 2**30, reserved_bytes=5 * 2**30)}
print("swapped")""",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on loopback with a token and a throwaway root and settings."""
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("lab-home")
    (root / "monitor.ipynb").write_text(notebook(SETUP, OPEN, BUSY, CHECK))
    (root / "sidebar.ipynb").write_text(notebook(SETUP, OPEN_SIDEBAR, SECOND, CHECK))
    (root / "useauto.ipynb").write_text(notebook(*USE_AUTO))
    (root / "frameworks.ipynb").write_text(notebook(*FRAMEWORKS))
    with jupyter_server(root, home, log_name="jupyterlab.log") as server:
        yield server.base, server.token


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright.sync_api")
    with chromium() as browser:
        yield browser


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
        wait_for_kernel(page)
        return page

    yield open_one
    for page in pages:
        page.close()


# -- what the chart holds ----------------------------------------------------------------------
def received(page) -> int:
    return int(page.locator(".tfgpu-monitor").first.get_attribute("data-received") or 0)


def draws(page) -> int:
    return int(page.locator(".tfgpu-monitor").first.get_attribute("data-draws") or 0)


def series(page, key: str, name: str) -> list:
    """One series of one device as the chart holds it (bytes or percent, null = gap)."""
    return page.evaluate(
        """([key, name]) => {
            const panel = document.querySelector('.tfgpu-monitor').__tfgpuPanel;
            return Array.from(panel.store.dev.get(key)[name]);
        }""",
        [key, name],
    )


def chart_view(page, key: str, index: int = 0) -> dict:
    """What one chart shows: its x range, axis tick labels, legend values, and the header line."""
    return page.evaluate(
        """([key, index]) => {
            const root = document.querySelectorAll('.tfgpu-monitor')[index];
            const panel = root.__tfgpuPanel;
            const u = panel.cards.get(key).chart;
            const card = root.querySelector(`.tfgpu-device[data-key='${key}']`);
            return {
                x: [u.scales.x.min, u.scales.x.max], first: panel.store.t[0], last: panel.store.t.at(-1),
                xTicks: u.axes[0]._values, yTicks: u.axes[1]._values,
                legend: [...card.querySelectorAll('.u-legend .u-series .u-value')].map(e => e.textContent),
                state: root.querySelector('.tfgpu-state').textContent,
            };
        }""",
        [key, index],
    )


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

    # The x range grows with the data: a 60 s window, a few seconds of samples, no sliver.
    young = chart_view(page, "gpu1")
    assert young["x"][0] == pytest.approx(young["first"]) and young["x"][1] == pytest.approx(young["last"])
    assert young["last"] - young["first"] < 30

    # Series and legend match the GPUs of the fake server.
    devices = panel.locator(".tfgpu-device")
    assert devices.count() == 5
    assert panel.locator(".tfgpu-device-title").all_inner_texts() == TITLES
    for i in range(4):
        legend = devices.nth(i).locator(".u-legend .u-series th")
        assert [t.strip() for t in legend.all_inner_texts()] == LEGEND
        assert devices.nth(i).locator("canvas").count() == 1
    shot(panel, "monitor-light.png")

    # Sizes in a unit chosen per chart: GiB on a GPU, MiB for 4 MiB on TensorFlow's CPU.
    cpu = chart_view(page, "tensorflow:CPU:0")
    assert cpu["legend"][5] == "4.00 MiB" and cpu["legend"][6] == "5.00 MiB"  # TensorFlow's in use, peak
    assert cpu["yTicks"] and all(t.endswith(" MiB") for t in cpu["yTicks"]) and len(set(cpu["yTicks"])) > 1
    gpu1 = chart_view(page, "gpu1")
    assert gpu1["legend"][1] == "80.0 GiB" and all(t.endswith(" GiB") for t in gpu1["yTicks"])

    # One clock: the header, the x axis and the legend's time read alike (the browser's locale).

    header = gpu1["state"].removeprefix("last sample ").split(" · ")[0]
    assert re.match(CLOCK, header) and re.match(CLOCK, gpu1["legend"][0]), gpu1
    assert all(re.match(CLOCK, t) for t in gpu1["xTicks"]), gpu1["xTicks"]
    assert len(set(gpu1["xTicks"])) == len(gpu1["xTicks"]), gpu1["xTicks"]  # no tick label twice
    assert {"M" in t for t in [header, gpu1["legend"][0], *gpu1["xTicks"]]} == {"M" in header}

    # GPU utilization, a gap where NVML has none (the T4), never 0.
    assert set(series(page, "gpu0", "util")) == {97} and set(series(page, "gpu3", "util")) == {None}
    assert chart_view(page, "gpu3")["legend"][7] == "—" and gpu1["legend"][7] == "35 %"

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
    gib = 2**30
    held_at_end = 10.0 + 39 * 0.5
    # The busy cell's last step reaches the chart with the hand-on after it, up to HAND_ON_S
    # after the cell printed its end: wait for it (or 10 s) before reading.
    deadline = time.monotonic() + 10
    while True:
        mine = [v / gib for v in series(page, "gpu1", "mine") if v is not None]
        if (mine and mine[-1] >= held_at_end - 1e-9) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert mine[0] == pytest.approx(10.0) and mine[-1] >= held_at_end - 1e-9
    used3 = series(page, "gpu3", "used")
    assert None in used3 and used3[-1] is not None  # a gap, then readings again
    assert series(page, "gpu1", "limit")[-1] == 36 * gib
    assert series(page, "gpu1", "tf")[-1] == 8 * gib and series(page, "gpu1", "peak")[-1] > 17 * gib
    assert series(page, "gpu1", "fw:tensorflow.in_use")[-1] == 8 * gib  # what the chart draws
    assert series(page, "gpu1", "fw:tensorflow.peak")[-1] > 17 * gib
    assert series(page, "gpu0", "tf")[-1] is None  # no TensorFlow there: a gap, not 0
    assert series(page, "gpu0", "fw:tensorflow.in_use")[-1] is None
    shot(panel, "monitor-final.png")

    # Hover shows each series' value in the legend.
    plot = panel.locator(".tfgpu-device[data-key='gpu1'] .u-over")
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.97, box["y"] + box["height"] / 2)
    values = panel.locator(".tfgpu-device[data-key='gpu1'] .u-legend .u-series .u-value")
    assert values.nth(3).inner_text().endswith("GiB")  # "This kernel"
    assert values.nth(7).inner_text().endswith("%")  # "GPU util"
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
    # The grid stays faint in the dark theme (issue 16, item 8: it was bright white).
    grid = panel.evaluate("el => el.dataset.gridColor")
    assert re.fullmatch(r"rgba\(\d+,\d+,\d+,0\.15\)", grid.replace(" ", "")), grid
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
    assert panel.locator(".tfgpu-device").count() == 5
    # Laid out for the side bar's width: the narrow layout, nothing wider than the panel.
    page.wait_for_function("() => document.querySelector('#jp-right-stack .tfgpu-narrow')", timeout=10_000)
    width = panel.evaluate("el => el.clientWidth")
    assert width < 480
    widest = panel.evaluate(
        "el => Math.max(...[...el.querySelectorAll('.u-legend, canvas, .tfgpu-head')]"
        ".map(e => e.getBoundingClientRect().right)) - el.getBoundingClientRect().right"
    )
    assert widest <= 1, f"something sticks out of the {width} px side bar by {widest} px"
    shot(panel, "monitor-sidebar-panel.png")
    assert page.locator(".jp-Notebook .tfgpu-monitor").count() == 0  # not in the notebook
    assert wait_for_output(page, 1, "side area").startswith("GPU monitor opened in the right side area")
    page.evaluate("() => window.dispatchEvent(new Event('resize'))")

    # A second panel in the notebook shares the sampler: the sidebar's control follows its interval.
    run_cell(page, 2)
    page.locator(".jp-Notebook .tfgpu-monitor").wait_for(timeout=30_000)
    time.sleep(0.5)  # its ResizeObserver has run
    assert "tfgpu-narrow" not in page.locator(".jp-Notebook .tfgpu-monitor").get_attribute(
        "class"
    )  # 1200 px wide
    interval = panel.locator(".tfgpu-select").first
    page.wait_for_function("el => el.value === '1'", arg=interval.element_handle(), timeout=15_000)
    shot(page, "monitor-two-panels.png")
    run_cell(page, 3)
    assert wait_for_output(page, 3, "sampler running:").startswith("sampler running: True")


def test_use_auto_hides_gpus_with_a_note_and_a_later_panel_titles_the_visible_ones(open_notebook):
    page = open_notebook("useauto.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    page.wait_for_function(
        "() => +document.querySelector('.tfgpu-monitor')?.dataset.points >= 3", timeout=60_000
    )
    first = page.locator(".tfgpu-monitor").first
    assert first.locator(".tfgpu-device-title").all_inner_texts() == TITLES[:4]
    run_cell(page, 2)
    wait_for_output(page, 2, "Chose GPU")
    notes = first.locator(".tfgpu-device-note")
    page.wait_for_function(
        "() => document.querySelectorAll('.tfgpu-monitor')[0].querySelectorAll('.tfgpu-gone').length === 3",
        timeout=15_000,
    )
    assert [n.strip() for n in notes.all_inner_texts()].count(
        "hidden from this kernel's frameworks by %gpu use; no longer sampled"
    ) == 3
    shot(first, "monitor-use-auto-first.png")

    run_cell(page, 3)  # a panel opened after `%gpu use auto`, without --interval
    page.wait_for_function("() => document.querySelectorAll('.tfgpu-monitor').length === 2", timeout=30_000)
    later = page.locator(".tfgpu-monitor").nth(1)
    page.wait_for_function(
        "() => +document.querySelectorAll('.tfgpu-monitor')[1].dataset.points >= 3", timeout=30_000
    )
    assert later.locator(".tfgpu-device-title").all_inner_texts() == ["GPU 1 · NVIDIA A100-SXM4-80GB"]
    # One GPU takes the whole width, not one column of two (issue 16, item 8).
    card, row = later.locator(".tfgpu-device").bounding_box(), later.locator(".tfgpu-devices").bounding_box()
    assert card["width"] > 0.9 * row["width"], (card, row)
    assert "joined the running sampler at its 0.2 s" in later.locator(".tfgpu-state").inner_text()
    assert later.locator(".tfgpu-select").first.input_value() == "0.2"
    assert first.locator(".tfgpu-select").first.input_value() == "0.2"  # the first panel kept its interval
    shot(later, "monitor-use-auto-later.png")


def test_frameworks_without_allocator_figures_are_named_and_a_started_one_is_drawn(open_notebook):
    """Issue 27, item 4: real torch and jax without a GPU: a note per framework, no zero line; then a
    PyTorch whose CUDA started: its allocator's allocated and reserved series, named as PyTorch's."""
    page = open_notebook("frameworks.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    printed = wait_for_output(page, 1, "jax").strip()
    assert printed.endswith("jax cpu") and " False " in printed, printed  # no GPU for either
    run_cell(page, 2)
    panel = page.locator(".tfgpu-monitor").first
    figures = panel.locator(".tfgpu-figures")
    try:
        figures.filter(has_text="JAX: no allocator figures").wait_for(timeout=60_000)
    finally:
        shot(page, "frameworks-without-figures.png")
    cuda = "CPU only: no CUDA allocator" if "torch None" in printed else "until it starts CUDA"
    assert (
        figures.inner_text().strip()
        == (
            f"PyTorch: no allocator figures on this build ({cuda})"
            if cuda.startswith("CPU")
            else f"PyTorch: no allocator figures {cuda} (not started in this kernel)"
        )
        + " · JAX: no allocator figures on this build (its CPU backend keeps none)"
    )
    legend = [
        t.strip()
        for t in panel.locator(".tfgpu-device").first.locator(".u-legend .u-series th").all_inner_texts()
    ]
    assert legend == [
        "Time",
        "Total",
        "Used (all)",
        "This kernel",
        "Limit",
        "GPU util",
    ]  # no framework line at all
    shot(panel, "frameworks-notes.png")

    run_cell(page, 3)
    wait_for_output(page, 3, "swapped")
    try:
        page.wait_for_function(
            "() => [...document.querySelectorAll('.tfgpu-monitor .u-legend th')]"
            ".some(th => th.textContent.includes('PyTorch allocator: reserved'))",
            timeout=30_000,
        )
        page.wait_for_function(
            "() => +document.querySelector('.tfgpu-monitor').dataset.draws > 0", timeout=10_000
        )
        time.sleep(1.0)  # a few more samples drawn with the new series
    finally:
        shot(page, "frameworks-pytorch-drawn.png")
    card = panel.locator(".tfgpu-device").first
    legend = [t.strip() for t in card.locator(".u-legend .u-series th").all_inner_texts()]
    assert legend == [
        "Time",
        "Total",
        "Used (all)",
        "This kernel",
        "Limit",
        "PyTorch allocator: allocated",
        "PyTorch allocator: reserved",
        "GPU util",
    ]
    key = card.get_attribute("data-key")
    gib = 2**30
    assert series(page, key, "fw:pytorch.reserved")[-1] == 5 * gib
    assert series(page, key, "fw:pytorch.allocated")[-1] == 3 * gib
    values = card.locator(".u-legend .u-series .u-value")
    assert values.nth(6).inner_text() == "5.00 GiB" and values.nth(5).inner_text() == "3.00 GiB"
    text = figures.inner_text()
    assert "Allocator figures (each framework's own count) read " in text
    assert "PyTorch: no allocator figures" not in text and "JAX: no allocator figures" in text
    shot(panel, "frameworks-pytorch-series.png")
