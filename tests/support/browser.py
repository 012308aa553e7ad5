"""What the browser tests share: a Jupyter server on loopback, Chromium through Playwright, and
helpers that drive a notebook (run a cell, read its output, take a screenshot).

The server is started from this checkout: ``PYTHONPATH`` puts its ``tfgpu_magic`` first (for the
server extension and for the kernels), and ``JUPYTER_PATH`` points JupyterLab and Notebook 7 at
its built extension (``tfgpu_magic/labextension``), whatever is installed in the environment.
Everything the server writes (settings, workspaces, runtime files) goes to a throwaway home.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .paths import ROOT

CHROMIUM = "/usr/bin/chromium"
REPO = ROOT
ARTIFACTS = REPO / "test-artifacts"
LABEXTENSION = REPO / "tfgpu_magic" / "labextension"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def has_chromium() -> bool:
    return os.path.exists(CHROMIUM)


def has_labextension() -> bool:
    return (LABEXTENSION / "package.json").is_file() and (LABEXTENSION / "static" / "style.js").is_file()


def notebook(*sources: str) -> str:
    """An nbformat 4 notebook (JSON) with one code cell per source, on the python3 kernel."""
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"c{i}",
            "metadata": {},
            "outputs": [],
            "source": source,
        }
        for i, source in enumerate(sources)
    ]
    return json.dumps(
        {
            "cells": cells,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    base: str  # http://127.0.0.1:PORT
    token: str
    pid: int
    root: pathlib.Path

    def url(self, path: str, **query: str) -> str:
        params = "&".join([f"token={self.token}", *(f"{k}={v}" if v else k for k, v in query.items())])
        return f"{self.base}/{path.lstrip('/')}?{params}"

    def get_json(self, path: str) -> dict:
        with urllib.request.urlopen(self.url(path), timeout=10) as response:
            return json.loads(response.read())


@contextlib.contextmanager
def jupyter_server(
    root: pathlib.Path, home: pathlib.Path, *, log_name: str, args: Sequence[str] = (), app: str = "lab"
) -> Iterator[Server]:
    """``jupyter lab`` (or ``notebook``) on loopback with a token; stopped by its pid at the end."""
    port, token = free_port(), secrets.token_hex(16)
    data = home / "data"
    (data / "labextensions").mkdir(parents=True, exist_ok=True)
    link = data / "labextensions" / "tfgpu-magic"
    if not link.exists():
        link.symlink_to(LABEXTENSION, target_is_directory=True)
    env = dict(
        os.environ,
        JUPYTER_PATH=str(data),  # before the environment's own: this checkout's extension wins
        JUPYTER_CONFIG_DIR=str(home / "config"),  # the developer's ~/.jupyter settings stay out
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        IPYTHONDIR=str(home / "ipython"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    # No "get notified about Jupyter news?" toast over the panels in screenshots.
    notes = home / "settings" / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True, exist_ok=True)
    (notes / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / log_name, "w")
    command = [
        sys.executable,
        "-m",
        "jupyter",
        app,
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
    ]
    if app == "lab":
        command += [
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    proc = subprocess.Popen([*command, *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(f"{base}/api/status?token={token}", proc, log_name)
        yield Server(base, token, proc.pid, root)
    finally:
        proc.send_signal(signal.SIGINT)  # lets the server shut its kernels down
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def wait_for_server(url: str, proc: subprocess.Popen, log_name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Jupyter server exited ({proc.returncode}); see {ARTIFACTS / log_name}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the Jupyter server did not answer within {timeout} s")


_LIVE_BROWSERS: list = []  # every Chromium open now: a failing test's pages are saved from here


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """Chromium driven by Playwright (imported here: the module is optional for the other tests)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        _LIVE_BROWSERS.append(browser)
        try:
            yield browser
        finally:
            _LIVE_BROWSERS.remove(browser)
            browser.close()


def save_failure_artifacts(test_id: str) -> list[pathlib.Path]:
    """A screenshot of every open page, and a text file with its address and the text of any open
    JupyterLab dialog (a dialog over the page is the usual reason a click never lands)."""
    ARTIFACTS.mkdir(exist_ok=True)
    stem = "FAILED-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in test_id)[-120:]
    saved = []
    pages = [page for browser in _LIVE_BROWSERS for context in browser.contexts for page in context.pages]
    for n, page in enumerate(pages):
        picture, text = ARTIFACTS / f"{stem}-page{n}.png", ARTIFACTS / f"{stem}-page{n}.txt"
        lines = [f"url: {page.url}"]
        try:
            page.screenshot(path=str(picture), timeout=10_000)
            saved.append(picture)
        except Exception as err:  # a crashed page still gets its text file
            lines.append(f"no screenshot: {type(err).__name__}: {err}")
        try:
            dialogs = page.locator(".jp-Dialog").all_inner_texts()
        except Exception as err:
            dialogs = [f"(dialogs unreadable: {type(err).__name__}: {err})"]
        lines += [f"open dialog: {' '.join(d.split())}" for d in dialogs] or ["no open dialog"]
        text.write_text("\n".join(lines) + "\n")
        saved.append(text)
    return saved


# -- helpers that drive a notebook --------------------------------------------------------------
def run_cell(page, index: int) -> None:
    """Run one cell, and make sure it was queued (a key press can land before the editor is ready)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    for _ in range(3):
        if accept_kernel_choice(page):
            wait_for_kernel(page)
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


def wait_for_kernel(page, timeout: float = 60_000) -> None:
    """The kernel of the notebook in front is up and idle (JupyterLab's and Notebook 7's toolbar
    indicator), with no dialog in the way."""
    deadline = time.monotonic() + timeout / 1000
    # The notebook in front: a hidden tab's indicator (another notebook's kernel) does not count.
    idle = page.locator(".jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator[data-status='idle']")
    while time.monotonic() < deadline:
        if accept_kernel_choice(page):
            continue
        if idle.count() and not page.locator(".jp-Dialog").count():
            time.sleep(1.0)  # a failed kernel start shows its dialog just after the indicator: look again
            if not page.locator(".jp-Dialog").count():
                return
        time.sleep(0.2)
    raise AssertionError("the notebook's kernel did not become idle")


def accept_kernel_choice(page) -> bool:
    """Answer JupyterLab's "Select Kernel" dialog as a user would: the preferred kernel (Select).

    JupyterLab and Notebook 7 ask when starting a notebook's kernel failed on the page's side,
    which a loaded two-core machine does now and then although the server started the kernel.
    """
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if not dialog.count():
        return False
    dialog.locator("button.jp-mod-accept").first.click()
    dialog.wait_for(state="detached", timeout=10_000)
    return True


def shot(target, name: str) -> pathlib.Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    target.screenshot(path=str(path))
    return path


def switch_theme(page, name: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text=name).first.click()


def child_kernels(server_pid: int) -> list[int]:
    """The server's kernel processes, by pid (what the simulated driver numbers them by)."""
    import psutil

    kernels = []
    for child in psutil.Process(server_pid).children():
        try:
            if "kernel" in " ".join(child.cmdline()):
                kernels.append(child.pid)
        except psutil.Error:
            continue
    return sorted(kernels)


def run_from_palette(page, label: str, until) -> None:
    """Run a command from JupyterLab's command palette (Ctrl+Shift+C from the notebook, in command
    mode) until its effect, the locator ``until``, is visible.

    Tries again when the palette closes under the test's hands (a notebook that takes the focus
    back as its kernel settles closes the modal palette, and may swallow the Enter).
    """
    from playwright.sync_api import TimeoutError as playwright_timeout

    palette = page.locator(".lm-CommandPalette-input")
    for _ in range(5):
        page.locator(".jp-NotebookPanel:visible .jp-InputPrompt").first.click()
        page.keyboard.press("Control+Shift+C")
        try:
            palette.fill(label, timeout=3_000)
            page.locator(".lm-CommandPalette-item.lm-mod-active", has_text=label).wait_for(timeout=3_000)
            palette.press("Enter", timeout=3_000)
            until.wait_for(timeout=5_000)
            return
        except playwright_timeout:
            page.keyboard.press("Escape")
    raise AssertionError(f"could not run {label!r} from the command palette")


def status_text(page) -> str:
    return page.locator(".tfgpu-lab-status-text").inner_text()
