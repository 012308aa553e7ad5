"""A notebook with saved GPU settings: its kernel loads tfgpu_magic at start (server/notebook_kernels.py).

On a real Jupyter server with real kernels, as in test_server_extension.py (pytest-jupyter's server
fixtures imported into this module, the loop driven through :func:`run`).  The kernel's command
line is read from the process itself; whether the extension loaded, and what it applied, from the
kernel.  No assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  the fixtures: jp_serverapp, jp_fetch, ...

from tfgpu_magic.command import notebook_file, saved
from tfgpu_magic.kernel import notebook_settings
from tfgpu_magic.server import notebook_kernels
from tfgpu_magic.server.notebook_kernels import (
    EXTENSION_ARGUMENT,
    NotebookSettingsLoader,
    has_settings,
    runs_ipykernel,
)

from support.typescript import run_in_node

SETTINGS = {"version": 1, "requirements": {}, "policy": ["grow", "limit 1024MiB"]}
LOADED = "print('gpu' in get_ipython().magics_manager.magics['line'])"  # %gpu is there: loaded at start
STATUS = "get_ipython().run_line_magic('gpu', 'status --json')"  # no %load_ext: loaded at start


def notebook(metadata: dict[str, Any]) -> str:
    return json.dumps(
        {
            "cells": [],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}, **metadata},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


# -- which notebooks and which kernels -----------------------------------------------------------
@pytest.mark.parametrize(
    "argv, runs",
    [
        (["/venv/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], True),
        (["python3", "-m", "ipykernel", "-f", "{connection_file}"], True),
        (["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"], False),
        (["python", "-m", "some_wrapper", "ipykernel_launcher"], False),  # not the module it runs
        (["python", "-m"], False),
        ([], False),
    ],
)
def test_only_a_kernelspec_that_runs_ipykernel_gets_the_argument(argv, runs):
    assert runs_ipykernel(argv) is runs


@pytest.mark.parametrize(
    "metadata, wanted",
    [
        ({"tfgpu": SETTINGS}, True),
        ({"tfgpu": {"version": "one"}}, True),  # malformed: the kernel then says what is wrong
        ({"tfgpu": {"version": 99}}, True),  # newer: the kernel says to upgrade
        ({"colab": {"gpuType": "T4"}}, False),
        ({}, False),
    ],
)
def test_the_key_read_by_saved_decides(tmp_path, metadata, wanted):
    path = tmp_path / "a.ipynb"
    path.write_text(notebook(metadata))
    assert has_settings(str(path)) is wanted


def test_a_link_a_folder_a_large_file_or_not_json_have_no_settings(tmp_path, monkeypatch):
    real = tmp_path / "real.ipynb"
    real.write_text(notebook({"tfgpu": SETTINGS}))
    (tmp_path / "link.ipynb").symlink_to(real)
    (tmp_path / "folder.ipynb").mkdir()
    (tmp_path / "half.ipynb").write_text(notebook({"tfgpu": SETTINGS})[:40])
    for name in ("link.ipynb", "folder.ipynb", "half.ipynb", "gone.ipynb"):
        assert not has_settings(str(tmp_path / name)), name
    monkeypatch.setattr(notebook_file, "MAX_NOTEBOOK_BYTES", 100)
    assert not has_settings(str(real))


def test_a_notebook_nested_past_the_parsers_limit_or_a_fifo_has_no_settings(tmp_path):
    """As the kernel reads them (no settings it can read), without an error in the server's log;
    a FIFO planted under the notebook's name does not block the worker thread."""
    deep = tmp_path / "deep.ipynb"
    deep.write_text('{"metadata": {"tfgpu": {"version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}}}")
    assert has_settings(str(deep)) is False
    assert saved.metadata_from_file(str(deep)) == {}
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    assert has_settings(str(fifo)) is False


def test_a_session_named_by_its_api_path_is_found_under_the_servers_root():
    class Manager:
        root_dir = "/srv/notebooks"

    loader = NotebookSettingsLoader(Manager(), logging.getLogger("test"))
    assert loader.notebook_path("/home/me/a.ipynb") == "/home/me/a.ipynb"
    assert loader.notebook_path("work/a.ipynb") == "/srv/notebooks/work/a.ipynb"


def test_the_server_reads_the_notebook_as_the_kernel_does():
    """One reader (saved.metadata_from_file) and one bound for both: the server loads the extension
    for exactly the notebooks whose settings the kernel will find."""
    assert (
        notebook_kernels.MAX_NOTEBOOK_BYTES
        == notebook_settings.MAX_NOTEBOOK_BYTES
        == saved.MAX_NOTEBOOK_BYTES
    )
    assert notebook_kernels.NOTEBOOK_ENV == notebook_settings.NOTEBOOK_ENV


# -- on a real server ----------------------------------------------------------------------------
@pytest.fixture
def jp_server_config():
    return {
        "ServerApp": {"jpserver_extensions": {"tfgpu_magic": True}},
        "TfgpuMagic": {"device_source": "tfgpu_magic.simulated:kernels_server"},
    }


@pytest.fixture
def run(jp_asyncio_loop):
    return jp_asyncio_loop.run_until_complete


@pytest.fixture
def open_notebook(jp_fetch, run, jp_root_dir):
    """Write a notebook with this metadata and open a session on it, as JupyterLab does; the kernel id."""

    def open_(name: str, metadata: dict[str, Any]) -> str:
        (Path(jp_root_dir) / name).write_text(notebook(metadata))
        body = json.dumps({"path": name, "name": name, "type": "notebook", "kernel": {"name": "python3"}})
        return json.loads(run(jp_fetch("api", "sessions", method="POST", body=body)).body)["kernel"]["id"]

    return open_


def command_line(serverapp, kernel_id: str) -> list[str]:
    return psutil.Process(serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid).cmdline()


async def execute(serverapp, kernel_id: str, code: str) -> str:
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        said: list[str] = []
        reply = await client.execute_interactive(
            code, timeout=60, output_hook=lambda msg: said.append(msg["content"].get("text", ""))
        )
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(said)


def test_a_notebook_with_settings_gets_a_kernel_that_applied_them_before_any_cell(
    jp_serverapp, open_notebook, run
):
    kernel_id = open_notebook("train.ipynb", {"tfgpu": SETTINGS})
    assert EXTENSION_ARGUMENT in command_line(jp_serverapp, kernel_id)
    report = json.loads(run(execute(jp_serverapp, kernel_id, STATUS)))
    record = report["notebook_settings"]
    assert record["source"] == "the notebook's metadata (train.ipynb)"
    assert record["applied"] == ["grow", "limit 1024MiB"] and not record["not_applied"]


def test_a_restarted_kernel_loads_it_again(jp_serverapp, open_notebook, run):
    kernel_id = open_notebook("train.ipynb", {"tfgpu": SETTINGS})
    run(jp_serverapp.kernel_manager.restart_kernel(kernel_id))
    assert EXTENSION_ARGUMENT in command_line(jp_serverapp, kernel_id)
    assert run(execute(jp_serverapp, kernel_id, LOADED)).strip() == "True"


def test_a_notebook_without_settings_gets_a_kernel_as_before(jp_serverapp, open_notebook, run):
    kernel_id = open_notebook("plain.ipynb", {"colab": {"gpuType": "T4"}})
    assert EXTENSION_ARGUMENT not in command_line(jp_serverapp, kernel_id)
    assert run(execute(jp_serverapp, kernel_id, LOADED)).strip() == "False"


def test_a_malformed_key_loads_it_and_the_kernel_says_the_one_line(jp_serverapp, open_notebook, run):
    kernel_id = open_notebook("bad.ipynb", {"tfgpu": {"version": 1, "policy": "grow"}})
    assert EXTENSION_ARGUMENT in command_line(jp_serverapp, kernel_id)
    said = run(execute(jp_serverapp, kernel_id, STATUS))
    # The notice the kernel printed as it started comes with the first output (its stdout's flush).
    notice = next(line for line in said.splitlines() if line.startswith("tfgpu_magic: "))
    assert "the notebook's metadata `tfgpu.policy` is a string" in notice
    report, _ = json.JSONDecoder().raw_decode(said[said.index("{") :])
    assert report["notebook_settings"]["error"] == notice.removeprefix("tfgpu_magic: ")


def test_the_page_asks_at_open_and_reads_the_kernels_line_when_the_settings_did_not_hold(
    jp_serverapp, open_notebook, run, tmp_path
):
    """The JupyterLab extension's question (js/lab/settings.ts: noticeRequest, readNotice), asked
    of a real kernel: a requirement no GPU here can meet is the kernel's line; all held, none."""
    [request] = run_in_node(tmp_path, "settings.js", [("noticeRequest", [])])
    unmet = {"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 2**50}, "policy": ["grow"]}
    answers = {}
    for name, settings in (("unmet.ipynb", unmet), ("train.ipynb", SETTINGS)):
        kernel_id = open_notebook(name, {"tfgpu": settings})
        answers[name] = run(ask(jp_serverapp, kernel_id, request))
    plain = open_notebook("plain.ipynb", {})  # e.g. its key saved after its kernel started
    answers["plain.ipynb"] = run(ask(jp_serverapp, plain, request))
    notices = run_in_node(tmp_path, "settings.js", [("readNotice", [answers[n]]) for n in answers])
    assert notices[0].startswith("tfgpu_magic: the notebook needs 1 GPU with ")
    assert notices[1:] == [None, None]
    # The question imports nothing into a kernel that did not load tfgpu_magic.
    imported = "import sys; print(any(name.startswith('tfgpu_magic') for name in sys.modules))"
    assert run(execute(jp_serverapp, plain, imported)).strip() == "False"


async def ask(serverapp, kernel_id: str, request: dict[str, Any]) -> dict[str, Any]:
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(**request, timeout=60)
    finally:
        client.stop_channels()
    return reply["content"]


def test_a_fault_is_a_warning_and_the_kernel_starts_all_the_same(
    jp_serverapp, open_notebook, run, monkeypatch, caplog
):
    def broken(path: str) -> bool:
        raise PermissionError("no")

    monkeypatch.setattr(notebook_kernels, "has_settings", broken)
    with caplog.at_level(logging.WARNING):
        kernel_id = open_notebook("train.ipynb", {"tfgpu": SETTINGS})
    assert EXTENSION_ARGUMENT not in command_line(jp_serverapp, kernel_id)
    assert "could not tell whether train.ipynb has saved GPU settings (PermissionError: no)" in caplog.text
    assert run(execute(jp_serverapp, kernel_id, LOADED)).strip() == "False"


def test_the_notebook_is_read_off_the_event_loop(jp_serverapp, open_notebook, run, monkeypatch):
    """A slow disk never blocks the server: the reading runs in a worker thread."""
    loops: list[bool] = []
    real = notebook_kernels.has_settings

    def watched(path: str) -> bool:
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        return real(path)

    monkeypatch.setattr(notebook_kernels, "has_settings", watched)
    open_notebook("train.ipynb", {"tfgpu": SETTINGS})
    assert loops == [False]


def test_stopping_the_extension_gives_the_manager_its_own_start_kernel_back(jp_serverapp, run):
    manager = jp_serverapp.kernel_manager
    assert "start_kernel" in vars(manager)  # wrapped
    run(jp_serverapp.tfgpu_extension.stop())
    assert "start_kernel" not in vars(manager)
