"""The server extension stops with the server (issue 29, item 5).

A real ``jupyter server`` subprocess with the extension on the simulated kernels server, the culler
and the metrics' keep-warm refresh running, a kernel started, the status and ``/metrics`` fetched;
then stopped the ways a user or a system stops one: Ctrl-C (SIGINT; without a terminal jupyter_server
skips its clean-up, so the extension stops at the interpreter's exit), ``POST /api/shutdown``, and
SIGTERM (systemd, Docker, JupyterHub).  Its output must say nothing of a task left pending or of an
exception nobody retrieved, and it must exit within a bound (not a timing: a hang).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest

from support.prometheus_stack import JupyterServer, wait_until

pytestmark = pytest.mark.slow

LEFT_BEHIND = ("Task was destroyed", "Task exception was never retrieved")
EXIT_WITHIN_S = 60  # a bound that only a hang exceeds


def stop_by(server: JupyterServer, how: str) -> None:
    assert server.proc is not None
    if how == "ctrl-c":
        server.proc.send_signal(signal.SIGINT)
    elif how == "sigterm":
        server.proc.send_signal(signal.SIGTERM)
    else:
        assert server.request("POST", "api/shutdown")[0] == 200


@pytest.mark.parametrize("how", ["ctrl-c", "api-shutdown", "sigterm"])
def test_the_server_stops_with_nothing_of_the_extension_left_pending(tmp_path, how):
    server = JupyterServer(
        tmp_path,
        args=[
            "--TfgpuMagic.refresh_interval=0.5",
            "--TfgpuMagic.cull_idle_gpu_kernels_after=3600",
            "--TfgpuMagic.cull_interval=1",
        ],
    ).start()
    kernel_pid = None
    try:
        server.wait_until_up()
        kernel_id = server.start_session("a.ipynb")["kernel"]["id"]
        mine = wait_until(
            "the kernel in the status",
            lambda: [k for k in server.status()["kernels"] if k["id"] == kernel_id and k["pid"]],
            60,
        )
        kernel_pid = mine[0]["pid"]
        server.execute(kernel_id, "x = 1")  # started, and busy then idle as a notebook's kernel is
        # The first scrape starts the keep-warm refresh; the second is served from it.
        for _ in range(2):
            status, body = server.request("GET", "metrics")
            assert status == 200
        assert b"tfgpu_kernel_gpu_memory_bytes" in body
        wait_until("a culler pass", lambda: server.status()["culler"], 10)
        stop_by(server, how)
        assert server.proc is not None
        try:
            server.proc.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit within {EXIT_WITHIN_S} s of {how}:\n{server.log()[-3000:]}")
        log = server.log()
        said = [line for line in log.splitlines() if any(text in line for text in LEFT_BEHIND)]
        assert not said, log[-4000:]
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)
        if kernel_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kernel_pid, signal.SIGKILL)  # the kernel this test started, if a stop left it
