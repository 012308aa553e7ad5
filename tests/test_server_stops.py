"""The server extension stops with the server (issue 29, item 5).

A real ``jupyter server`` subprocess with the extension on the simulated kernels server, the culler
and the metrics' keep-warm refresh running, a kernel started, the status and ``/metrics`` fetched;
then stopped the ways a user or a system stops one: Ctrl-C at a terminal, answered "y" at the
server's prompt; ``POST /api/shutdown``; SIGTERM (systemd, Docker, JupyterHub).  Its output must
say nothing of a task left pending or of an exception nobody retrieved, the extension must say it
stopped, and the server must exit within a bound (not a timing: a hang).

A Ctrl-C without a terminal (a script's SIGINT) makes jupyter_server skip its whole clean-up, its
kernels' shutdown included, so no extension is stopped then: that case is only checked for the
lines above and the exit.
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess

import pytest

from support.prometheus_stack import JupyterServer, wait_until

pytestmark = pytest.mark.slow

LEFT_BEHIND = ("Task was destroyed", "Task exception was never retrieved")
EXIT_WITHIN_S = 60  # a bound that only a hang exceeds


def stop_by(server: JupyterServer, how: str, terminal: int | None) -> None:
    assert server.proc is not None
    if how == "ctrl-c at a terminal":
        assert terminal is not None
        server.proc.send_signal(signal.SIGINT)
        wait_until("the server's prompt", lambda: "Shut down this Jupyter server" in server.log(), 30)
        os.write(terminal, b"y\n")
    elif how == "ctrl-c without a terminal":
        server.proc.send_signal(signal.SIGINT)
    elif how == "sigterm":
        server.proc.send_signal(signal.SIGTERM)
    else:
        assert server.request("POST", "api/shutdown")[0] == 200


@pytest.mark.parametrize(
    "how", ["ctrl-c at a terminal", "api-shutdown", "sigterm", "ctrl-c without a terminal"]
)
def test_the_server_stops_with_nothing_of_the_extension_left_pending(tmp_path, how):
    terminal, its_side = pty.openpty() if how == "ctrl-c at a terminal" else (None, None)
    server = JupyterServer(
        tmp_path,
        args=[
            "--TfgpuMagic.refresh_interval=0.5",
            "--TfgpuMagic.cull_idle_gpu_kernels_after=3600",
            "--TfgpuMagic.cull_interval=1",
        ],
    ).start(stdin=its_side)
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
        stop_by(server, how, terminal)
        assert server.proc is not None
        try:
            server.proc.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit within {EXIT_WITHIN_S} s of {how}:\n{server.log()[-3000:]}")
        log = server.log()
        said = [line for line in log.splitlines() if any(text in line for text in LEFT_BEHIND)]
        assert not said, log[-4000:]
        if how != "ctrl-c without a terminal":
            assert "tfgpu_magic: stopped (" in log, log[-4000:]  # the extension's own stop ran, and ended all
    finally:
        for fd in (terminal, its_side):
            if fd is not None:
                os.close(fd)
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)
        if kernel_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kernel_pid, signal.SIGKILL)  # the kernel this test started, if a stop left it
