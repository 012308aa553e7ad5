"""Real Jupyter servers and kernels for the benchmarks: started, polled and ended by the same helpers.

A server runs on loopback with a token, the extension enabled by the very file the wheel ships
(``jupyter-config/server-config/tfgpu_magic.json`` in a ``jupyter_server_config.d`` on
``JUPYTER_CONFIG_PATH``).  Other settings, other extensions included, and code go in a
``jupyter_server_config.py`` in the same folder, run before any extension loads (where
``compare.py`` installs the stand-in NVML): a JSON file in ``config.d`` is read for
``jpserver_extensions`` only.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Client:
    """One keep-alive HTTP connection, as a browser tab polls."""

    def __init__(self, port: int, token: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"token {token}"}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body)
        self.connection.request(method, path, body=data, headers=self.headers)
        response = self.connection.getresponse()
        return response.status, response.read()


class JupyterServer:
    """``jupyter server`` in a temporary folder; ``with`` ends it (kernels included) and removes the folder."""

    def __init__(
        self,
        settings: Sequence[str] = (),
        config: dict[str, Any] | None = None,
        config_py: str = "",
        pythonpath: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = tempfile.mkdtemp(prefix="tfgpu-bench-server-")
        self.port, self.token = free_port(), secrets.token_hex(16)
        config_dir = os.path.join(self.workdir, "config")
        config_d = os.path.join(config_dir, "jupyter_server_config.d")
        os.makedirs(config_d)
        shutil.copy(os.path.join(ROOT, "jupyter-config", "server-config", "tfgpu_magic.json"), config_d)
        # Settings go in the .py file: jupyter_server reads only jpserver_extensions from config.d.
        settings_py = "".join(
            f"c.{section}.{name} = {value!r}\n"
            for section, values in (config or {}).items()
            for name, value in values.items()
        )
        with open(os.path.join(config_dir, "jupyter_server_config.py"), "w") as f:
            f.write(settings_py + config_py)
        path = [ROOT, BENCHMARKS, *pythonpath, os.environ.get("PYTHONPATH", "")]
        self.env = {
            **os.environ,
            **(env or {}),
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "JUPYTER_CONFIG_PATH": config_dir,
            "JUPYTER_RUNTIME_DIR": os.path.join(self.workdir, "runtime"),  # the kernels' connection files
        }
        command = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.workdir}",
            *settings,
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")
        self.log_path = os.path.join(self.workdir, "server.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.client = self._wait_until_up()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_until_up(self, timeout: float = 60) -> Client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Jupyter server exited; see {self.log_path}")
            try:
                client = Client(self.port, self.token)
                if client.call("GET", "/api/status")[0] == 200:
                    return client
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the Jupyter server did not answer in time")

    def start_kernels(self, count: int, first: int = 0) -> None:
        """``count`` notebook kernels through ``POST api/sessions``, as opening notebooks does."""
        for n in range(first, first + count):
            body = {
                "path": f"notebook_{n}.ipynb",
                "name": f"notebook_{n}.ipynb",
                "type": "notebook",
                "kernel": {"name": "python3"},
            }
            status, reply = self.client.call("POST", "/api/sessions", body)
            if status != 201:
                raise RuntimeError(f"could not start a kernel: {status} {reply[:200]!r}")

    def kernel_pids(self) -> list[int]:
        import psutil

        return [
            child.pid
            for child in psutil.Process(self.pid).children()
            if any("ipykernel" in part for part in child.cmdline())
        ]

    def wait_until_quiet(self, timeout: float = 300) -> None:
        """Until the kernels have finished starting (together less than 5 % of a core for a second)."""
        import psutil

        def cpu_seconds() -> float:
            total = 0.0
            for child in psutil.Process(self.pid).children(recursive=True):
                try:
                    times = child.cpu_times()
                    total += times.user + times.system
                except psutil.Error:
                    pass
            return total

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = cpu_seconds()
            time.sleep(1.0)
            if cpu_seconds() - before < 0.05:
                return
        raise RuntimeError("the kernels kept the CPU busy")

    def __enter__(self) -> JupyterServer:
        return self

    def __exit__(self, *_exc: Any) -> None:
        try:
            self.client.call("POST", "/api/shutdown")  # shuts the kernels down too
            self.process.wait(timeout=60)
        except Exception:
            pass
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        shutil.rmtree(self.workdir, ignore_errors=True)
