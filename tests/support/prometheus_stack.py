"""A real ``jupyter server`` on the simulated driver and a real Prometheus scraping it.

Shared by tests/test_prometheus.py and tests/scripts/render_dashboard.py.  Everything runs on loopback, in a throwaway folder, and is stopped
by its own process id: nothing here touches a process it did not start.

The Jupyter server's environment is this checkout's (``PYTHONPATH``), with no ``TF_*``,
``CUDA_*``, ``XLA_*``, ``JAX_*``, ``PYTORCH_*``, ``JUPYTER*``, ``JPY_*`` or ``IPYTHON*``
variable from the caller's shell, its Jupyter and IPython folders under the throwaway folder,
and the extension enabled by the very file the wheel ships.

The Prometheus configurations are the documentation's (docs/administration.md): :func:`readme_scrape_configs` reads its
```yaml blocks, and the callers change only the target address, the token file and the
interval.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from .paths import ROOT

DASHBOARD = ROOT / "jupyter-config" / "grafana" / "tfgpu-dashboard.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SIMULATED = "tfgpu_magic.simulated:kernels_server"

# What a fresh process must never inherit from the caller's shell (conftest.START_UP_PREFIXES, and
# Jupyter's and IPython's own folders and settings).
LEAKY_PREFIXES = ("TF_", "CUDA_", "XLA_", "JAX_", "PYTORCH_", "JUPYTER", "JPY_", "IPYTHON")


def has_prometheus() -> bool:
    return os.access(PROMETHEUS, os.X_OK)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(home: Path, pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a server started here: this checkout first, nothing leaked (see the module)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(LEAKY_PREFIXES)}
    env.pop("PYTHONPATH", None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *pythonpath]),
        TF_CPP_MIN_LOG_LEVEL="3",
        JUPYTER_CONFIG_DIR=str(home / "config-dir"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
    )
    return env


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """``check()``'s first truthy value, polled; an error naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError) as err:
            last_error = err
        time.sleep(interval)
    raise TimeoutError(
        f"{what}: not within {timeout} s" + (f" (last error: {last_error})" if last_error else "")
    )


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop one process we started, by its pid; killed if it does not go."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# -- the Jupyter server -----------------------------------------------------------------------
class JupyterServer:
    """``jupyter server`` on loopback with a token, the extension on, reading ``device_source``.

    ``base_url`` "/user/alice/" serves everything, ``/metrics`` included, under that prefix, as a
    JupyterHub single-user server does.
    """

    def __init__(
        self,
        home: Path,
        *,
        base_url: str = "/",
        device_source: str | None = SIMULATED,
        args: Sequence[str] = (),
        pythonpath: Sequence[str] = (),
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.home = home
        self.root = home / "notebooks"
        self.base_url = base_url
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        config = home / "config-path" / "jupyter_server_config.d"
        config.mkdir(parents=True)
        self.root.mkdir()
        shutil.copy(ROOT / "jupyter-config" / "server-config" / "tfgpu_magic.json", config)
        if extra_config:
            (config / "extra.json").write_text(json.dumps(extra_config))
        self.env = clean_env(home, pythonpath)
        self.env["JUPYTER_CONFIG_PATH"] = str(config.parent)
        self.command = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            f"--ServerApp.base_url={base_url}",
            *args,
        ]
        if device_source is not None:
            self.command.append(f"--TfgpuMagic.device_source={device_source}")
        if os.geteuid() == 0:
            self.command.append("--allow-root")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, stdin: int | None = None) -> JupyterServer:
        """``stdin``: a file descriptor for the server's input (a terminal's, to answer its Ctrl-C prompt)."""
        log = open(self.home / "server.log", "w")
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdin=stdin, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
        )
        log.close()
        return self

    def wait_until_up(self, timeout: float = 60) -> None:
        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Jupyter server exited:\n{self.log()[-3000:]}")
            return self.request("GET", "api/status")[0] == 200

        wait_until("the Jupyter server answering", up, timeout)

    def log(self) -> str:
        return (self.home / "server.log").read_text(errors="replace")

    def url(self, path: str) -> str:
        return f"http://{self.address}{self.base_url}{path.lstrip('/')}"

    def request(
        self, method: str, path: str, body: Any = None, authorization: str | None = "token"
    ) -> tuple[int, bytes]:
        """``(status, body)``; ``authorization``: the scheme to send the token with, or None for none."""
        headers = {"Authorization": f"{authorization} {self.token}"} if authorization else {}
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(path), data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def start_session(self, notebook: str) -> dict[str, Any]:
        body = {"path": notebook, "name": notebook, "type": "notebook", "kernel": {"name": "python3"}}
        status, reply = self.request("POST", "api/sessions", body)
        assert status == 201, (status, reply)
        return json.loads(reply)

    def status(self) -> dict[str, Any]:
        status, reply = self.request("GET", "tfgpu/api/status")
        assert status == 200, (status, reply)
        return json.loads(reply)

    def execute(self, kernel_id: str, code: str, timeout: float = 60) -> None:
        """Run ``code`` in a kernel through its connection file: the server sees it busy, then idle."""
        from jupyter_client import BlockingKernelClient

        client = BlockingKernelClient(connection_file=str(self.home / "runtime" / f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=timeout)
            reply = client.execute_interactive(code, timeout=timeout, output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()

    def stop(self) -> None:
        """Shut down (the kernels with it), by the API, then by signal to the server's own pid."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.request("POST", "api/shutdown")
            self.proc.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            _stop(self.proc, signal.SIGINT)


# -- Prometheus -------------------------------------------------------------------------------
def readme_scrape_configs() -> dict[str, dict[str, Any]]:
    """The documentation's Prometheus scrape configurations (the ```yaml blocks of the README and
    docs/; they are in docs/administration.md), by job name."""
    import yaml

    from .markdown import all_blocks

    jobs: dict[str, dict[str, Any]] = {}
    for block in all_blocks("yaml"):
        for job in yaml.safe_load(block.code).get("scrape_configs", []):
            jobs[job["job_name"]] = job
    return jobs


def as_tested(job: dict[str, Any], address: str, token_file: Path, interval: str = "1s") -> dict[str, Any]:
    """A documented job pointed here: every target at ``address``, the token from ``token_file``, scraped every ``interval``."""
    job = json.loads(json.dumps(job))  # a deep copy
    job["scrape_interval"] = interval
    job["scrape_timeout"] = interval
    job["authorization"]["credentials_file"] = str(token_file)
    for group in job["static_configs"]:
        group["targets"] = [address]
    return job


class Prometheus:
    """The real ``prometheus`` binary with a config of our own, on a free loopback port, in a temp folder."""

    def __init__(self, home: Path, scrape_configs: list[dict[str, Any]]) -> None:
        import yaml

        self.home = home
        self.port = free_port()
        self.config = home / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump({"global": {"evaluation_interval": "1s"}, "scrape_configs": scrape_configs})
        )
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        log = open(self.home / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.home,
        )
        log.close()
        return self

    def log(self) -> str:
        return (self.home / "prometheus.log").read_text(errors="replace")

    def wait_until_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log()[-3000:]}")
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=5) as response:
                return response.status == 200

        wait_until("Prometheus ready", ready, timeout)

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            reply = json.load(response)
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def wait_for(self, expr: str, count: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
        """``expr``'s result once it has at least ``count`` series."""
        return wait_until(
            f"{expr!r} with {count} series",
            lambda: (r := self.query(expr)) and len(r) >= count and r,
            timeout,
            interval=0.5,
        )

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


# -- the dashboard ------------------------------------------------------------------------------
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, those inside rows included."""
    found = []
    for panel in (board or dashboard())["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p.get("type") != "row"]


def as_grafana_sends(expr: str, values: dict[str, str] | None = None) -> str:
    """A panel's query as Grafana sends it with every variable at "All" (the dashboard's allValue, ``.*``)."""
    values = values or {}

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, ".*")

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


# -- the whole stack: two Jupyter servers, three notebooks, Prometheus with the documented jobs -----------
class Stack:
    """``plain`` at ``/`` and ``alice`` at ``/user/alice/`` (a single-user server's prefix), on the
    simulated driver, read every second; Prometheus scrapes them every second with the documented
    ``jupyter`` and ``jupyterhub`` jobs, and a ``wrong-token`` job scrapes ``plain`` with a wrong token.

    ``culler``: the servers run the GPU idle culler with an hour's idle time (nothing is culled
    while a test runs, but every idle kernel holding memory has a due time).
    """

    NOTEBOOKS: ClassVar[list[tuple[str, str]]] = [
        ("plain", "explore.ipynb"),
        ("alice", "train.ipynb"),
        ("alice", "eval.ipynb"),
    ]

    def __init__(self, home: Path, culler: bool = True) -> None:
        self.home = home
        args = ["--TfgpuMagic.refresh_interval=1"]
        if culler:
            args.append("--TfgpuMagic.cull_idle_gpu_kernels_after=3600")
        self.plain = JupyterServer(home / "plain", args=args)
        self.alice = JupyterServer(home / "alice", base_url="/user/alice/", args=args)
        self.servers = [self.plain, self.alice]
        self.prometheus: Prometheus | None = None
        self.instance = {
            id(self.plain): self.plain.address,
            id(self.alice): f"{self.alice.address}/user/alice",
        }
        self.kernels: dict[str, tuple[JupyterServer, str]] = {}  # notebook -> (server, kernel id)

    def start(self) -> None:
        """The servers, then Prometheus (no notebook yet)."""
        for server in self.servers:
            server.start()
        for server in self.servers:
            server.wait_until_up()
        jobs = readme_scrape_configs()
        (self.home / "plain-token").write_text(self.plain.token)
        (self.home / "alice-token").write_text(self.alice.token)
        (self.home / "wrong-token").write_text("not-the-token")
        wrong = as_tested(jobs["jupyter"], self.plain.address, self.home / "wrong-token")
        wrong["job_name"] = "wrong-token"
        self.prometheus = Prometheus(
            self.home,
            [
                as_tested(jobs["jupyter"], self.plain.address, self.home / "plain-token"),
                as_tested(jobs["jupyterhub"], self.alice.address, self.home / "alice-token"),
                wrong,
            ],
        ).start()
        self.prometheus.wait_until_ready()

    def open_notebook(self, server_name: str, notebook: str, code: str = "x = 1") -> str:
        """A session (a real kernel) for ``notebook``, which then runs ``code``: busy, then idle."""
        server = self.plain if server_name == "plain" else self.alice
        kernel_id = server.start_session(notebook)["kernel"]["id"]
        server.execute(kernel_id, code)
        self.kernels[notebook] = (server, kernel_id)
        return kernel_id

    def run_notebooks(self) -> None:
        for server_name, notebook in self.NOTEBOOKS:
            self.open_notebook(server_name, notebook)

    def wait_for_every_kernel(self, timeout: float = 30) -> None:
        """The first scrape starts the servers' reading: poll until each kernel's series are stored."""
        assert self.prometheus is not None
        self.prometheus.wait_for("tfgpu_kernel_gpu_memory_bytes", count=len(self.kernels), timeout=timeout)
        self.prometheus.wait_for("tfgpu_kernel_idle_seconds", count=len(self.kernels), timeout=timeout)

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        for server in self.servers:
            server.stop()

    def logs(self) -> str:
        parts = [
            f"--- {s.base_url} ---\n{s.log()[-2000:]}"
            for s in self.servers
            if (s.home / "server.log").exists()
        ]
        if self.prometheus is not None:
            parts.append(f"--- prometheus ---\n{self.prometheus.log()[-2000:]}")
        return "\n".join(parts)
