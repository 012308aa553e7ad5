"""The JupyterLab / Notebook 7 extension in a real browser, against the real server extension.

One Jupyter server on loopback, with ``--TfgpuMagic.device_source=tfgpu_magic.gpus.simulated:kernels_server``:
simulated GPUs on which this server's own kernels hold memory (kernel ``n``, numbered as the server started it, holds
``n + 1`` GiB on GPU ``n % 2``, plus 256 MiB per process below it).  The same server serves
JupyterLab (``/lab``) and Notebook 7 (``/tree``, ``/notebooks/NAME.ipynb``).  Screenshots go to
test-artifacts/extension-*.png.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time

import psutil
import pytest

from tfgpu_magic.gpus.simulated import KERNEL_NUMBER_ENV

from support.browser import (
    REPO,
    child_kernels,
    chromium,
    has_chromium,
    has_labextension,
    jupyter_server,
    notebook,
    run_cell,
    run_from_palette,
    shot,
    status_text,
    switch_theme,
    wait_for_kernel,
    wait_for_output,
)

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the browser fixture skips these tests without Playwright
    PlaywrightTimeout = TimeoutError

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not has_chromium(), reason="no Chromium at /usr/bin/chromium (apt-get install -y chromium)"
    ),
    pytest.mark.skipif(
        not has_labextension() or not (REPO / "tfgpu_magic" / "static" / "widget.js").is_file(),
        reason="the front ends are not built (npm install && npm run build)",
    ),
]

GIB = 2**30
MIB = 2**20
SOURCE = "--TfgpuMagic.device_source=tfgpu_magic.gpus.simulated:kernels_server"

# `%gpu monitor --sidebar` on a simulated server inside the kernel (the magic's own path).
MONITOR = """\
%load_ext tfgpu_magic
import tfgpu_magic
from tfgpu_magic.gpus.simulated import shared_server
tfgpu_magic.set_device_source(shared_server())
%gpu monitor --sidebar --interval 0.2"""
OFF = "%gpu monitor off"
# Issue 16, item 4: the simulated server, TensorFlow started (it finds no GPU), then `%gpu monitor`.
AFTER_TF = (
    "import tfgpu_magic\nfrom tfgpu_magic.gpus.simulated import shared_server\n"
    "tfgpu_magic.set_device_source(shared_server())\n%load_ext tfgpu_magic",
    "import tensorflow as tf\nx = tf.ones([256, 256])",
    "%gpu monitor --interval 0.2",
    OFF,
    "%gpu monitor --sidebar --interval 0.2",
    OFF,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ext")
    home = tmp_path_factory.mktemp("ext-home")
    for name in ("alpha", "beta", "gamma"):
        (root / f"{name}.ipynb").write_text(notebook("x = 1"))
    (root / "monitor.ipynb").write_text(notebook(MONITOR, OFF))
    (root / "monitor7.ipynb").write_text(notebook(MONITOR, OFF))
    (root / "after_tf7.ipynb").write_text(notebook(*AFTER_TF))
    args = [
        SOURCE,
        "--TfgpuMagic.refresh_interval=0.5",
        "--ServerApp.jpserver_extensions=tfgpu_magic=True",
        "--TfgpuMagic.cull_idle_gpu_kernels_after=3600",  # the rows say when the GPU culler would act
    ]
    with jupyter_server(root, home, log_name="extension-server.log", args=args) as running:
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
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "tfgpu" in m.text.lower() else None,
    )
    yield page
    page.close()
    assert not errors, f"the extension logged errors: {errors}"


# -- what the simulated driver attributes, computed here from the process table ------------------
def expected_figures(server) -> dict[str, list[str]]:
    """Notebook path -> the panel's per-GPU figures, from the simulated driver's rule."""
    reply = server.get_json("tfgpu/api/status")
    by_pid = {k["pid"]: k["path"] for k in reply["kernels"]}
    figures = {}
    for pid in child_kernels(server.pid):
        # Its number, given when the server started it (kernels_server's rule: kept while it lives).
        n = int(psutil.Process(pid).environ()[KERNEL_NUMBER_ENV])
        below = len(psutil.Process(pid).children(recursive=True))
        held = (n + 1) * GIB + below * 256 * MIB
        if pid in by_pid:  # a kernel newer than the server's last reading is numbered all the same
            figures[by_pid[pid]] = [f"GPU {n % 2}: {held / GIB:.1f} GiB"]
    return figures


def panel_rows(page) -> dict[str, list[str]]:
    """Notebook -> its GPU figures, read in one go: the panel re-renders its rows on every reading,
    so rows found first and read one by one may be gone by then."""
    rows = page.locator(".tfgpu-lab-kernel").evaluate_all(
        """rows => rows.map(row => [
            row.querySelector('.tfgpu-lab-kernel-name')?.innerText ?? '',
            Array.from(row.querySelectorAll('.tfgpu-lab-kernel-gpu'), gpu => gpu.innerText),
        ])"""
    )
    return {name: gpus for name, gpus in rows}


def wait_for_rows(page, names: set[str], timeout: float = 30.0) -> dict[str, list[str]]:
    """The panel lists exactly these notebooks' kernels."""
    return wait_until(lambda: panel_rows(page), lambda rows: set(rows) == names, timeout)


def wait_for_attribution(page, server, names: set[str], timeout: float = 30.0) -> dict[str, list[str]]:
    """The panel lists these kernels with what the simulated driver attributes to them now.

    Waits, since the numbering moves when a kernel starts or stops and the server and the
    simulated driver each keep a reading for half a second.
    """

    def both():
        return panel_rows(page), expected_figures(server)

    rows, _ = wait_until(
        both, lambda got: set(got[0]) == names and all(got[0][n] == got[1].get(n) for n in names), timeout
    )
    return rows


def wait_until(read, ok, timeout: float):
    deadline = time.monotonic() + timeout
    value = read()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        time.sleep(0.25)
        value = read()
    return value


def open_in_lab(page, server, workspace: str, name: str) -> None:
    page.goto(server.url(f"lab/workspaces/{workspace}/tree/{name}", reset=""))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)


def open_beside(page, name: str) -> None:
    """Open another notebook from the file browser (a second tab in the same JupyterLab)."""
    page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text=name).wait_for(timeout=30_000)
    wait_for_kernel(page)


def wait_for_status(page, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status_text(page) == text:
            return
        time.sleep(0.2)
    raise AssertionError(f"the status bar says {status_text(page)!r}, not {text!r}")


def assert_kept_across_a_poll(page, locator, timeout: float = 30.0) -> None:
    """The node ``locator`` finds is not replaced when the panel draws its next reading."""
    locator.evaluate("el => { el.dataset.probe = 'kept'; }")
    updated = page.locator(".tfgpu-lab-updated").inner_text()
    page.wait_for_function(
        "old => document.querySelector('.tfgpu-lab-updated').innerText !== old",
        arg=updated,
        timeout=timeout * 1000,
    )
    assert locator.get_attribute("data-probe") == "kept", (
        "the panel redrew a node whose part of the reading was unchanged"
    )


# -- JupyterLab --------------------------------------------------------------------------------
def test_lab_panel_status_bar_and_shutdown(server, page):
    open_in_lab(page, server, "kernels", "alpha.ipynb")
    open_beside(page, "beta.ipynb")

    # The panel, from the command palette: both kernels, with what the driver attributes to their pids.
    run_from_palette(page, "GPU Memory Panel", until=page.locator("#jp-right-stack .tfgpu-lab-panel"))
    wait_for_attribution(page, server, {"alpha.ipynb", "beta.ipynb"})
    expected = expected_figures(server)
    gpus = page.locator(".tfgpu-lab-gpu")
    assert gpus.count() == 4
    assert gpus.nth(0).locator(".tfgpu-lab-gpu-name").inner_text() == "NVIDIA A100-SXM4-40GB"
    # GPU 0: this server's kernels, other users (alice's 30 GiB), unattributed (the driver's own), free.
    parts = gpus.nth(0).locator(".tfgpu-lab-segment").evaluate_all("els => els.map(e => e.dataset.part)")
    assert parts[0] == "kernels" and "others" in parts and parts[-1] == "free"
    assert "alice" in gpus.nth(0).locator("[data-part='others']").get_attribute("title")
    legend = page.locator(".tfgpu-lab-legend-item").all_inner_texts()
    assert legend[0] == "this server's kernels" and legend[1].startswith("my other processes (")
    # The server may still call a kernel 'starting' for a moment after the page shows it idle.
    # With the GPU idle culler on (an hour), each idle kernel holding memory says when it would act.
    wait_until(
        lambda: page.locator(".tfgpu-lab-kernel-activity").all_inner_texts(),
        lambda texts: (
            len(texts) == 2
            and all(re.fullmatch(r"idle (<1|\d+) min · culled in (\d+ min|1 h) if idle", t) for t in texts)
        ),
        timeout=15,
    )
    # The notebook in front (beta) is marked in the list.
    assert (
        page.locator(".tfgpu-lab-kernel.tfgpu-lab-current .tfgpu-lab-kernel-name").inner_text()
        == "beta.ipynb"
    )
    shot(page, "extension-lab-panel.png")
    shot(page.locator(".tfgpu-lab-panel"), "extension-lab-panel-only.png")

    # The status bar follows the notebook in front.
    wait_for_status(page, expected["beta.ipynb"][0])
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="alpha.ipynb").click()
    wait_for_status(page, expected["alpha.ipynb"][0])
    assert "alpha.ipynb: its kernel holds" in page.locator(".tfgpu-lab-status").get_attribute("title")
    shot(page.locator(".jp-StatusBar-Left"), "extension-lab-statusbar.png")

    # Dark theme: the panel takes JupyterLab's colours.
    light = page.locator(".tfgpu-lab-panel").evaluate("el => getComputedStyle(el).backgroundColor")
    switch_theme(page, "JupyterLab Dark")
    page.wait_for_function(
        "bg => getComputedStyle(document.querySelector('.tfgpu-lab-panel')).backgroundColor !== bg",
        arg=light,
        timeout=15_000,
    )
    time.sleep(0.5)
    shot(page, "extension-lab-panel-dark.png")
    switch_theme(page, "JupyterLab Light")
    page.wait_for_function(
        "bg => getComputedStyle(document.querySelector('.tfgpu-lab-panel')).backgroundColor === bg",
        arg=light,
        timeout=15_000,
    )

    # A poll redraws only what changed: the row's Open button is the same node after a new reading,
    # so a click that lands while a reading arrives is not lost.
    open_beta = page.locator(".tfgpu-lab-kernel", has_text="beta.ipynb").locator("button[data-action='open']")
    assert_kept_across_a_poll(page, open_beta)

    # Open: beta's row brings beta's notebook to the front (JupyterLab's current widget: jp-mod-current).
    open_beta.click()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current", has_text="beta.ipynb").wait_for(
        timeout=10_000
    )
    wait_for_status(page, expected["beta.ipynb"][0])

    # Shut down beta's kernel: a confirmation first, then it leaves the panel (and the server).
    beta = page.locator(".tfgpu-lab-kernel", has_text="beta.ipynb")
    beta_id = beta.get_attribute("data-kernel-id")
    beta.locator("button[data-action='shutdown']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10_000)
    assert "beta.ipynb" in dialog.inner_text() and expected["beta.ipynb"][0] in dialog.inner_text()
    shot(page, "extension-lab-shutdown-dialog.png")
    dialog.locator("button.jp-mod-warn").click()
    wait_for_rows(page, {"alpha.ipynb"})
    assert beta_id not in [k["id"] for k in server.get_json("api/kernels")]
    shot(page.locator(".tfgpu-lab-panel"), "extension-lab-after-shutdown.png")


def test_lab_monitor_sidebar_magic(server, page):
    open_in_lab(page, server, "monitor", "monitor.ipynb")
    run_cell(page, 0)
    assert wait_for_output(page, 0, "side area").startswith("GPU monitor opened in the right side area")
    side = page.locator("#jp-right-stack .tfgpu-lab-side-area .tfgpu-monitor")
    side.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => +document.querySelector('.tfgpu-lab-side-area .tfgpu-monitor')?.dataset.points >= 3",
        timeout=30_000,
    )
    assert side.locator(".tfgpu-device").count() == 4
    assert page.locator(".jp-Notebook .tfgpu-monitor").count() == 0
    shot(page, "extension-lab-monitor-sidebar.png")
    # The side tab belongs to the panel: asking for it again brings it forward, never a second one.
    page.locator(".tfgpu-lab-side-note .tfgpu-lab-link").click()
    time.sleep(1)
    assert page.locator(".tfgpu-lab-side-area").count() == 1
    run_cell(page, 1)  # %gpu monitor off: the model closes, and the side tab with it
    page.locator(".tfgpu-lab-side-area").wait_for(state="detached", timeout=15_000)

    # Closing the notebook closes its widgets, the side tab with them.
    run_cell(page, 0)
    page.locator(".tfgpu-lab-side-area .tfgpu-monitor").wait_for(timeout=30_000)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon").click()
    discard = page.locator(".jp-Dialog button", has_text=re.compile("Discard|Don.t Save", re.I))
    try:
        discard.first.click(timeout=5_000)  # the outputs changed: JupyterLab asks about saving
    except PlaywrightTimeout:
        pass
    page.locator(".tfgpu-lab-side-area").wait_for(state="detached", timeout=15_000)


# -- Notebook 7 ----------------------------------------------------------------------------------
def open_panel_from_view_menu(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
    page.locator(".lm-Menu-itemLabel", has_text="GPU Memory Panel").click()
    page.locator(".tfgpu-lab-panel").wait_for(state="visible", timeout=15_000)


def status_requests(page) -> list[str]:
    """The page's requests to the server extension, appended as Playwright hands them over (it
    does so while the test waits through Playwright: page.wait_for_timeout, not time.sleep)."""
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url) if "/tfgpu/api/status" in r.url else None)
    return urls


def set_hidden(page, hidden: bool) -> None:
    """What the browser does when its tab goes to the background (or comes back)."""
    page.evaluate(
        "hidden => { Object.defineProperty(document, 'hidden', {value: hidden, configurable: true});"
        " Object.defineProperty(document, 'visibilityState', {value: hidden ? 'hidden' : 'visible', configurable: true});"
        " document.dispatchEvent(new Event('visibilitychange')); }",
        hidden,
    )


def test_notebook7_tree_and_notebook_pages_reach_the_panel(server, page):
    asked = status_requests(page)
    # A kernel of its own (gamma), started from Notebook 7's notebook page.
    page.goto(server.url("notebooks/gamma.ipynb"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)
    page.wait_for_timeout(2_000)
    assert asked == []  # nothing on screen shows GPU memory (no status bar here, panel closed): no polling
    open_panel_from_view_menu(page)
    expected = expected_figures(server)
    wait_for_attribution(page, server, set(expected))
    assert "gamma.ipynb" in expected
    assert (
        page.locator(".tfgpu-lab-kernel.tfgpu-lab-current .tfgpu-lab-kernel-name").inner_text()
        == "gamma.ipynb"
    )
    assert (
        page.locator(".tfgpu-lab-status").count() == 0
    )  # Notebook 7 has no status bar: the item is simply absent
    shot(page, "extension-nb7-notebook-panel.png")

    # While shown, the panel polls (every 0.5 s here); a hidden browser tab does not; shown again, it goes on.
    before = len(asked)
    page.wait_for_timeout(1_500)
    assert len(asked) > before
    set_hidden(page, True)
    page.wait_for_timeout(500)  # a request already under way may still go out
    hidden = len(asked)
    page.wait_for_timeout(2_000)
    assert len(asked) == hidden
    set_hidden(page, False)
    page.wait_for_timeout(1_000)
    assert len(asked) > hidden

    page.goto(server.url("tree"))
    page.locator(".jp-DirListing-item", has_text="gamma.ipynb").first.wait_for(timeout=60_000)
    open_panel_from_view_menu(page)
    wait_for_attribution(page, server, set(expected_figures(server)))
    shot(page, "extension-nb7-tree-panel.png")


def test_a_failing_server_is_asked_less_and_less_often(server, page):
    """Issue 17, item 12: the poller is @lumino/polling's Poll, which backs off after failures.

    Poll draws each wait at random between the interval and three times the last wait, so one
    run's count varies: in 2 million simulated runs of an 8 s window at a 0.5 s interval, none
    made more than 12 requests (about one in ten made more than 6); without back-off it makes about 16.
    """
    page.goto(server.url("tree"))
    page.locator(".jp-DirListing-item", has_text="alpha.ipynb").first.wait_for(timeout=60_000)
    open_panel_from_view_menu(page)
    page.locator(".tfgpu-lab-panel .tfgpu-lab-gpu").first.wait_for(timeout=15_000)
    times: list[float] = []

    def fail(route):
        times.append(time.monotonic())
        route.fulfill(status=500, body="down")

    page.route("**/tfgpu/api/status*", fail)
    page.locator(".tfgpu-lab-panel .tfgpu-lab-message", has_text="HTTP 500").wait_for(timeout=15_000)
    page.wait_for_timeout(8_500)
    window = [t for t in times if t - times[0] <= 8.0]
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(times)]
    assert len(window) <= 12, f"{len(window)} requests in 8 s at a 0.5 s interval: no back-off ({gaps})"
    page.unroute("**/tfgpu/api/status*")
    page.locator(".tfgpu-lab-panel .tfgpu-lab-message").wait_for(
        state="detached", timeout=60_000
    )  # and recovers


def test_notebook7_monitor_sidebar_magic(server, page):
    page.goto(server.url("notebooks/monitor7.ipynb"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)
    run_cell(page, 0)
    assert wait_for_output(page, 0, "side area").startswith("GPU monitor opened in the right side area")
    page.wait_for_function(
        "() => +document.querySelector('.tfgpu-lab-side-area .tfgpu-monitor')?.dataset.points >= 3",
        timeout=30_000,
    )
    side = page.locator(".tfgpu-lab-side-area .tfgpu-monitor")
    assert side.is_visible() and side.locator(".tfgpu-device").count() == 4
    assert page.locator(".jp-Notebook .tfgpu-monitor").count() == 0
    shot(page, "extension-nb7-monitor-sidebar.png")
    run_cell(page, 1)
    page.locator(".tfgpu-lab-side-area").wait_for(state="detached", timeout=15_000)


@pytest.mark.slow  # TensorFlow starts in the kernel
def test_notebook7_monitor_after_tensorflow_started_charts_and_stops(server, page):
    page.goto(server.url("notebooks/after_tf7.ipynb"))
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_kernel(page)
    for index in (0, 1):
        run_cell(page, index)
        wait_for_kernel(page, timeout=120_000)
    run_cell(page, 2)
    chart = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".tfgpu-monitor")
    chart.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => +document.querySelector('.jp-Notebook .tfgpu-monitor')?.dataset.points >= 3", timeout=30_000
    )
    # The driver's GPUs, though TensorFlow found none (a chart of TensorFlow's CPU:0 allocator may
    # follow: whether TensorFlow's default CPU allocator keeps statistics depends on the machine).
    assert chart.locator('.tfgpu-device[data-key^="gpu"]').count() == 4
    assert "stopped" not in chart.inner_text().lower()
    assert "hidden" not in chart.inner_text()
    shot(page, "extension-nb7-monitor-after-tensorflow.png")
    run_cell(page, 3)
    assert wait_for_output(page, 3, "Stopped").startswith("Stopped 1 memory panel")
    run_cell(page, 4)  # the same in Notebook 7's right side area
    page.wait_for_function(
        "() => +document.querySelector('.tfgpu-lab-side-area .tfgpu-monitor')?.dataset.points >= 3",
        timeout=30_000,
    )
    assert page.locator('.tfgpu-lab-side-area .tfgpu-monitor .tfgpu-device[data-key^="gpu"]').count() == 4
    run_cell(page, 5)
    assert wait_for_output(page, 5, "Stopped").startswith("Stopped 1 memory panel")
    page.locator(".tfgpu-lab-side-area").wait_for(state="detached", timeout=15_000)


# -- servers of their own: no driver, a GPU in MIG mode ---------------------------------------------
@contextlib.contextmanager
def solo_lab(tmp_path, browser, source: str, workspace: str):
    """A Jupyter server of its own with ``source`` as its device source, and JupyterLab open on
    its one notebook (solo.ipynb), its kernel started; yields the page."""
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "solo.ipynb").write_text(notebook("x = 1"))
    args = [f"--TfgpuMagic.device_source={source}", "--ServerApp.jpserver_extensions=tfgpu_magic=True"]
    log = f"extension-{workspace}.log"
    with jupyter_server(tmp_path / "root", tmp_path / "home", log_name=log, args=args) as srv:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            open_in_lab(page, srv, workspace, "solo.ipynb")
            yield page
        except Exception:
            shot(page, f"FAILED-extension-lab-{workspace}.png")  # the page is closed before the report hook
            raise
        finally:
            page.close()


def test_without_a_driver_the_status_bar_and_panel_say_why(tmp_path, browser):
    with solo_lab(tmp_path, browser, "tfgpu_magic.no_such_module:source", "no-driver") as page:
        wait_for_status(page, "GPU n/a")
        title = page.locator(".tfgpu-lab-status").get_attribute("title")
        assert "No GPU readings" in title and "no_such_module" in title
        page.locator(".tfgpu-lab-status").click()  # the status bar opens the panel
        message = page.locator(".tfgpu-lab-panel .tfgpu-lab-message")
        message.wait_for(timeout=15_000)
        assert "no_such_module" in message.inner_text()
        wait_for_kernel(page)
        quiet = page.locator(".tfgpu-lab-panel .tfgpu-lab-quiet")
        quiet.filter(has_text="1 kernel running; its GPU memory cannot be read.").wait_for(timeout=15_000)
        assert panel_rows(page) == {}  # not listed as holding nothing: nothing is known
        shot(page, "extension-lab-no-driver.png")


def test_lab_panel_lists_a_mig_gpus_instances_under_it(tmp_path, browser):
    """Issue 17, item 8: GPU 3 of `mig_server` is in MIG mode with three tenants' instances; the
    panel lists them under its card (ids, own memory, process count), as `%gpu` and nvitop do."""
    with solo_lab(tmp_path, browser, "tfgpu_magic.gpus.simulated:mig_server", "mig") as page:
        page.locator(".tfgpu-lab-status").click()  # the status bar opens the panel
        rows = page.locator('.tfgpu-lab-gpu[data-index="3"] .tfgpu-lab-mig-row')
        rows.nth(2).wait_for(timeout=15_000)
        read = rows.evaluate_all(
            "rows => rows.map(r => [r.querySelector('.tfgpu-lab-mig-label').innerText,"
            " r.querySelector('.tfgpu-lab-mig-usage').innerText, r.querySelector('.tfgpu-lab-mig-who').innerText])"
        )
        assert read == [
            ["MIG 3:0  instance 1/0", "3.0 GiB of 9.8 GiB used", "1 process"],
            ["MIG 3:1  instance 2/0", "6.0 GiB of 9.8 GiB used", "1 process"],
            ["MIG 3:2  instance 5/0", "13 MiB of 4.8 GiB used", "0 processes"],  # its own overhead
        ]
        assert page.locator('.tfgpu-lab-gpu[data-index="0"] .tfgpu-lab-mig').count() == 0  # not in MIG mode
        shot(page, "extension-lab-mig.png")


def test_lab_panel_shows_each_gpus_platform_share_and_whether_it_holds(tmp_path, browser, monkeypatch):
    """Issue 31, item 1: a server (and its kernels) that inherited a HAMi share shows it on each GPU
    card, labelled soft, with the variable it came from and who enforces it in the tooltip."""
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT", "4g")
    with solo_lab(tmp_path, browser, "tfgpu_magic.simulated:kernels_server", "share") as page:
        page.locator(".tfgpu-lab-status").click()  # the status bar opens the panel
        share = page.locator('.tfgpu-lab-gpu[data-index="0"] .tfgpu-lab-gpu-share')
        share.wait_for(timeout=15_000)
        assert share.inner_text() == "share 4.0 GiB, soft (HAMi)"
        title = share.get_attribute("title") or ""
        assert "CUDA_DEVICE_MEMORY_LIMIT=4g" in title and "libvgpu.so" in title
        shot(page, "extension-lab-share.png")


# -- memory nobody uses (issue 31, item 4) ---------------------------------------------------------
IDLE_CELLS = (
    '%load_ext tfgpu_magic\n%config GpuMagics.idle_notice_after = 3\n%config GpuMagics.idle_notice_min_memory = "512M"\n'
    "%gpu status --json",
    "x = 2",
)
UNUSED = "of GPU memory (the driver's figure) at 0% GPU utilization for"


def test_a_kernel_holding_memory_at_zero_is_told_under_its_next_cell_in_the_panel_and_status_bar(
    tmp_path, browser
):
    """The simulated server gives per-process utilization: this kernel (kernels_server's kernel 0,
    1 GiB on GPU 0) runs nothing on the GPU.  Past the thresholds (3 s and 512 MiB in the kernel, 2 s
    and 512 MiB on the server) its next cell says so under it, and the panel's row and the status bar
    say so from the server's readings, with when the idle culler can act."""
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "idle.ipynb").write_text(notebook(*IDLE_CELLS))
    args = [
        SOURCE,
        "--ServerApp.jpserver_extensions=tfgpu_magic=True",
        "--TfgpuMagic.refresh_interval=0.5",
        "--TfgpuMagic.idle_notice_after=2",
        "--TfgpuMagic.idle_notice_min_memory=512M",
        "--TfgpuMagic.cull_idle_gpu_kernels_after=3600",
    ]
    with jupyter_server(
        tmp_path / "root", tmp_path / "home", log_name="extension-idle.log", args=args
    ) as srv:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            open_in_lab(page, srv, "idle", "idle.ipynb")
            run_cell(page, 0)
            wait_for_output(page, 0, '"this_kernel_utilization"')
            time.sleep(4)  # longer than GpuMagics.idle_notice_after: the next cell follows a pause
            run_cell(page, 1)
            said = wait_for_output(page, 1, "tfgpu_magic: This kernel holds")
            assert (
                "the driver's samples show no GPU work by it since its last cell ended" in said
                and "`%gpu free` gives it back" in said
            )
            assert re.search(r"the idle culler can shut it down from \d\d:\d\d UTC if it stays idle", said)
            shot(page, "extension-idle-notice-under-cell.png")

            page.locator(".tfgpu-lab-status").click()  # the status bar opens the panel
            row = page.locator(".tfgpu-lab-kernel", has_text="idle.ipynb")
            notice = row.locator(".tfgpu-lab-kernel-idle")
            notice.wait_for(timeout=20_000)
            text = notice.inner_text()
            assert text.startswith("This kernel has held") and UNUSED in text
            assert re.search(r"the idle culler shuts it down at \d\d:\d\d UTC if it stays idle", text)
            assert row.locator(".tfgpu-lab-kernel-utilization").inner_text() == "utilization GPU 0: 0%"
            wait_for_status(page, "GPU 0: 1.0 GiB · unused")
            assert UNUSED in page.locator(".tfgpu-lab-status").get_attribute("title")
            shot(page, "extension-idle-notice-panel.png")
            status = srv.get_json("tfgpu/api/status")
            [kernel] = status["kernels"]
            assert kernel["gpu_utilization"] == {"0": {"percent": 0, "scope": "process", "note": None}}
            assert kernel["gpu_idle_since"] and kernel["idle_gpu_memory_byte_seconds"] > 0
        except Exception:
            shot(page, "FAILED-extension-idle-notice.png")
            raise
        finally:
            page.close()
