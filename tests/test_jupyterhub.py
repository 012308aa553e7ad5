"""The server extension and the JupyterLab extension under a real JupyterHub (issue 19).

A real hub (``jupyterhub`` from this venv, ``configurable-http-proxy`` from npm in
``node_modules``, the local-process spawner) on loopback spawns single-user servers for two
real users, ``tfgpu-alice`` and ``tfgpu-bob`` (created here when missing; the tests run as
root, which the local-process spawner needs to start each server as its user).  Each server
reads ``tfgpu_magic.simulated:host_kernels_server``: simulated GPUs on which every IPython
kernel of the two users holds memory by a rule of its pid alone, so both servers read the same
figures; ``TFGPU_MAGIC_SIMULATED_USERS`` (the servers' environment) names the two, so whatever
other kernels run on the machine (another test's, another user's) count for nothing here.  Each user's server lists only that user's kernel, the other's kernel as another
user's process, and answers ``/tfgpu/api/status`` and ``/metrics`` under ``/user/NAME/`` to
that user's token only; in Chromium, alice's JupyterLab shows her kernel in the GPU panel, bob's
memory as another user's, and the figures in the status bar (jupyterlab-nvdashboard's panels
went blank behind such a prefix, their #194).

The users must be able to run this venv's Python.  Where they cannot (here the venv's Python
is pyenv's, under ``/root``, mode 700), nothing outside the repository is changed: the servers
run a throwaway venv made by the system's Python of the same minor version (``--without-pip``),
whose ``.pth`` file adds this venv's site-packages and whose ``share/jupyter`` and
``etc/jupyter`` are links to this venv's, with a ``python3`` kernel spec of its own.  Where the
venv's Python is reachable (e.g. ``chmod o+x /root`` here, or a venv from Debian's
``/usr/bin/python3``), its own ``jupyterhub-singleuser`` runs.

Everything the hub and the servers write goes to one temporary folder, removed at the end; the
hub's log, the servers' included, is test-artifacts/jupyterhub.log.  The hub, the proxy and
the servers are stopped by their pids; users this module created are removed again.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tfgpu_magic.gpus.simulated import HOST_KERNEL_MIB, MIB

from support.browser import (
    ARTIFACTS,
    CHROMIUM,
    LABEXTENSION,
    REPO,
    chromium,
    free_port,
    has_chromium,
    has_labextension,
    notebook,
    shot,
    wait_for_kernel,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

USERS = ("tfgpu-alice", "tfgpu-bob")
ALICE, BOB = USERS
GIB = 2**30
VENV = Path(sys.prefix)
SOURCE = "--TfgpuMagic.device_source=tfgpu_magic.simulated:host_kernels_server"
CHP_IN_REPO = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


def proxy_command() -> str | None:
    if os.access(CHP_IN_REPO, os.X_OK):
        return str(CHP_IN_REPO)
    return shutil.which("configurable-http-proxy")


# -- users and their Python ----------------------------------------------------------------------
# useradd, userdel and runuser live in sbin, which a non-login shell's or CI's PATH may leave out.
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def tool(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def ensure_users() -> list[str]:
    """Create the test users that are missing (system users, no home, no login shell); returns those created."""
    created = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                [
                    tool("useradd") or "useradd",
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/usr/sbin/nologin",
                    "--comment",
                    "tfgpu_magic test user",
                    name,
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
            created.append(name)
    return created


def remove_users(names: list[str]) -> None:
    for name in names:
        subprocess.run([tool("userdel") or "userdel", name], capture_output=True, timeout=30)


def runs_as(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("runuser") or "runuser", "-u", user, "--", *argv],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )


PROBE = ["-c", "import jupyterhub.singleuser, jupyterlab, tfgpu_magic.server.extension"]


def python_for_users(base: Path) -> tuple[list[str], str]:
    """The single-user server's command, runnable by both users, and how it was found.

    This venv's ``jupyterhub-singleuser`` when the users can run the venv's Python; else a bridge
    venv (see the module's docstring) in ``base``.  Skips when neither works.
    """
    direct = [str(VENV / "bin" / "python"), *PROBE]
    if all(runs_as(user, direct).returncode == 0 for user in USERS):
        return [str(VENV / "bin" / "jupyterhub-singleuser")], "this venv"
    refused = runs_as(ALICE, direct).stderr.strip().splitlines()[-1:]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next(
        (p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)), None
    )
    if system is None:
        pytest.skip(
            f"the test users cannot run {VENV}/bin/python ({refused}) and there is no system {version} "
            "to make a bridge venv with; make the venv's Python reachable by other users"
        )
    bridge = base / "python"
    subprocess.run(
        [system, "-m", "venv", "--without-pip", str(bridge)], check=True, capture_output=True, timeout=60
    )
    site = bridge / "lib" / version / "site-packages"
    packages = str(VENV / "lib" / version / "site-packages")
    (site / "tfgpu_venv.pth").write_text(f"import site; site.addsitedir({packages!r})\n")
    # This venv's Jupyter data (JupyterLab's app, the prebuilt extensions) and configuration (the
    # enabled server extensions), but a kernel spec that starts the bridge's Python.
    (bridge / "etc").symlink_to(VENV / "etc", target_is_directory=True)
    data = bridge / "share" / "jupyter"
    data.mkdir(parents=True)
    for entry in (VENV / "share" / "jupyter").iterdir():
        if entry.name != "kernels":
            (data / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    spec = data / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [
                    str(bridge / "bin" / "python"),
                    "-Xfrozen_modules=off",
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                ],
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
                "metadata": {"debugger": True},
            }
        )
    )
    probe = runs_as(ALICE, [str(bridge / "bin" / "python"), *PROBE])
    if probe.returncode != 0:
        pytest.skip(
            f"the test users cannot run {VENV}/bin/python ({refused}), nor a bridge venv made with {system} "
            f"({probe.stderr.strip().splitlines()[-1:]})"
        )
    return [
        str(bridge / "bin" / "python"),
        "-m",
        "jupyterhub.singleuser",
    ], f"a bridge venv made with {system}"


# -- the hub ----------------------------------------------------------------------------------------
def readme_hub_config() -> str:
    """The docs' ``# jupyterhub_config.py`` block (docs/administration.md), as pasted: the hub's
    configuration starts with it."""
    from support.markdown import all_blocks

    (block,) = [b for b in all_blocks("python") if b.code.startswith("# jupyterhub_config.py\n")]
    return block.code


# The test's own lines, after the docs' block: its ports, login, folders, and this checkout's command;
# the two lines the docs ask the reader to fill in (allowed_users, the proxy's path) with the test's.
CONFIG = """\
# tests/test_jupyterhub.py
TMP = {tmp!r}
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.db_url = "sqlite:///" + TMP + "/hub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = TMP + "/hub/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = TMP + "/hub/jupyterhub.pid"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = TMP + "/hub/proxy.pid"

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allowed_users = {users!r}

# A service whose token lets the test start servers and make the users' API tokens.
c.JupyterHub.services = [{{"name": "tfgpu-test", "api_token": {service_token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "tfgpu-test",
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "read:users"],
    "services": ["tfgpu-test"],
}}]

# (The spawner class and the default URL are the docs' block's.)
c.Spawner.cmd = {cmd!r}
c.Spawner.args = {args!r}
c.Spawner.notebook_dir = TMP + "/users/{{username}}/notebooks"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120


def _in_home(*parts):
    return lambda spawner: "/".join([TMP, "users", spawner.user.name, *parts])


# The test users have no home: everything Jupyter writes goes to the user's folder in TMP.
c.Spawner.environment = {{
    "PATH": {path!r},
    "PYTHONPATH": {repo!r},
    "JUPYTER_PATH": TMP + "/shared/data",
    "JUPYTER_CONFIG_DIR": _in_home("jupyter", "config"),
    "JUPYTER_DATA_DIR": _in_home("jupyter", "data"),
    "JUPYTER_RUNTIME_DIR": _in_home("jupyter", "runtime"),
    "JUPYTERLAB_SETTINGS_DIR": _in_home("jupyter", "lab-settings"),
    "JUPYTERLAB_WORKSPACES_DIR": _in_home("jupyter", "lab-workspaces"),
    "IPYTHONDIR": _in_home("ipython"),
    "XDG_CACHE_HOME": _in_home("cache"),
    # host_kernels_server places only these users' kernels: the test's, whatever else runs here.
    "TFGPU_MAGIC_SIMULATED_USERS": {simulated_users!r},
}}
"""


class Hub:
    def __init__(self, base: str, service_token: str, password: str, proc: subprocess.Popen, tmp: Path):
        self.base = base  # http://127.0.0.1:PORT, the proxy
        self.service_token = service_token
        self.password = password
        self.proc = proc
        self.tmp = tmp
        self.tokens: dict[str, str] = {}
        self.kernels: dict[str, dict[str, Any]] = {}  # user -> the session's kernel

    def request(
        self,
        path: str,
        token: str | None,
        method: str = "GET",
        body: Any = None,
        timeout: float = 30,
        scheme: str = "token",
    ) -> tuple[int, bytes, dict[str, str]]:
        """One HTTP request through the proxy, redirects not followed: (status, body, headers)."""
        headers = {"Authorization": f"{scheme} {token}"} if token else {}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=timeout) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)

    def api(self, path: str, method: str = "GET", body: Any = None) -> Any:
        status, data, _ = self.request(f"/hub/api/{path}", self.service_token, method, body)
        assert status < 300, f"{method} /hub/api/{path}: {status} {data[:500]!r}"
        return json.loads(data) if data else None

    def as_user(self, user: str, path: str, method: str = "GET", body: Any = None) -> Any:
        status, data, _ = self.request(f"/user/{user}/{path}", self.tokens[user], method, body)
        assert status < 300, f"{method} /user/{user}/{path}: {status} {data[:500]!r}"
        return json.loads(data) if data else None

    def status(self, user: str) -> dict[str, Any]:
        return self.as_user(user, "tfgpu/api/status")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def wait_until(read, ok, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    value = read()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout} s")
        time.sleep(0.25)
        value = read()
    return value


def _processes_left(hub_pid: int, tmp: Path) -> list:
    """What the hub started, as psutil processes taken now (a signal to one of them later is refused
    by psutil if its pid has been reused meanwhile): the hub's descendants, the test users'
    processes (the servers run in sessions of their own, below the hub) and the proxy (its pid file)."""
    import psutil

    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process(hub_pid).children(recursive=True))
    found.update((p.pid, p) for p in psutil.process_iter(["username"]) if p.info["username"] in USERS)
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        proxy = psutil.Process(int((tmp / "hub" / "proxy.pid").read_text()))
        found[proxy.pid] = proxy
    return list(found.values())


def _stop(processes: list) -> None:
    """SIGTERM, then SIGKILL what is left: only the processes this test started, each by its own pid."""
    import psutil

    alive = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
            alive.append(proc)
    _, left = psutil.wait_procs(alive, timeout=10)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@contextlib.contextmanager
def running_hub() -> Iterator[Hub]:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root: the local-process spawner starts each user's server as that user "
            f"(and the users {', '.join(USERS)} are created here when missing)"
        )
    proxy = proxy_command()
    if proxy is None:
        pytest.skip(
            f"no configurable-http-proxy (not at {CHP_IN_REPO} nor on PATH): make setup runs npm install"
        )
    if tool("runuser") is None or tool("useradd") is None:
        pytest.skip("runuser and useradd are needed to make and check the test users")
    created = ensure_users()
    tmp = Path(tempfile.mkdtemp(prefix="tfgpu-hub-"))
    hub_proc: subprocess.Popen | None = None
    log = None
    try:
        tmp.chmod(0o755)  # the users reach their own folders and the shared data through it
        (tmp / "hub").mkdir(mode=0o700)
        data = tmp / "shared" / "data" / "labextensions"
        data.mkdir(parents=True)
        (data / "tfgpu-magic").symlink_to(LABEXTENSION, target_is_directory=True)  # this checkout's build
        for user in USERS:
            _make_home(tmp / "users" / user, user)
        cmd, how = python_for_users(tmp)
        port, hub_port, proxy_api_port = free_port(), free_port(), free_port()
        password, service_token = secrets.token_hex(12), secrets.token_hex(24)
        args = [
            SOURCE,
            "--TfgpuMagic.refresh_interval=0.5",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        path = os.pathsep.join([str(Path(cmd[0]).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        config = tmp / "hub" / "jupyterhub_config.py"
        config.write_text(
            readme_hub_config()
            + "\n\n"
            + CONFIG.format(
                tmp=str(tmp),
                port=port,
                hub_port=hub_port,
                proxy=proxy,
                proxy_api_port=proxy_api_port,
                password=password,
                users=set(USERS),
                service_token=service_token,
                cmd=cmd,
                args=args,
                path=path,
                repo=str(REPO),
                simulated_users=",".join(USERS),
            )
        )
        ARTIFACTS.mkdir(exist_ok=True)
        log = open(ARTIFACTS / "jupyterhub.log", "w")
        log.write(f"single-user servers run {how}: {cmd}\n")
        log.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "TF_", "CUDA_", "XLA_"))}
        env["PATH"] = os.pathsep.join([str(VENV / "bin"), str(Path(proxy).parent), env.get("PATH", "")])
        hub_proc = subprocess.Popen(
            [str(VENV / "bin" / "jupyterhub"), "-f", str(config)],
            cwd=tmp / "hub",
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        hub = Hub(f"http://127.0.0.1:{port}", service_token, password, hub_proc, tmp)
        _wait_for_hub(hub)
        # Side by side: the hub answers a spawn when the server is ready (or after 10 s).
        with ThreadPoolExecutor(len(USERS)) as spawns:
            list(spawns.map(lambda user: hub.api(f"users/{user}/server", "POST"), USERS))
        for user in USERS:
            wait_until(
                lambda user=user: hub.api(f"users/{user}")["servers"].get("", {}).get("ready"),
                bool,
                120,
                f"{user}'s server ready",
            )
            hub.tokens[user] = hub.api(
                f"users/{user}/tokens", "POST", {"note": "tfgpu test", "expires_in": 3600}
            )["token"]
        for user in USERS:
            name = f"{user.split('-')[1]}.ipynb"
            session = hub.as_user(
                user,
                "api/sessions",
                "POST",
                {"path": name, "name": name, "type": "notebook", "kernel": {"name": "python3"}},
            )
            hub.kernels[user] = session["kernel"]
        yield hub
    finally:
        if hub_proc is not None:
            _stop_hub(hub_proc, tmp)
        if log is not None:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        remove_users(created)


def _make_home(home: Path, user: str) -> None:
    """The user's folder: notebooks (the server's root) and Jupyter's own folders, all the user's."""
    entry = pwd.getpwnam(user)
    settings = home / "jupyter" / "lab-settings" / "@jupyterlab" / "apputils-extension"
    for folder in (home / "notebooks", settings):
        folder.mkdir(parents=True)
    # No "get notified about Jupyter news?" toast over the panel in screenshots.
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    (home / "notebooks" / f"{user.split('-')[1]}.ipynb").write_text(notebook("x = 1"))
    for path in [home, *home.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    home.chmod(0o700)


def _wait_for_hub(hub: Hub, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.proc.poll() is not None:
            raise RuntimeError(f"the hub exited ({hub.proc.returncode}); see {ARTIFACTS / 'jupyterhub.log'}")
        with contextlib.suppress(OSError):
            if hub.request("/hub/api/", None, timeout=2)[0] == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"the hub did not answer within {timeout} s; see {ARTIFACTS / 'jupyterhub.log'}")


def _stop_hub(proc: subprocess.Popen, tmp: Path) -> None:
    """The hub stops the servers it spawned and the proxy it started when it gets SIGTERM; whatever
    it left (see :func:`_processes_left`) is stopped here."""
    left = _processes_left(proc.pid, tmp)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    _stop(left)


@pytest.fixture(scope="module")
def hub():
    with running_hub() as running:
        yield running


# -- the server extension under /user/NAME/ ---------------------------------------------------------
def kernel_pid(hub: Hub, user: str) -> int:
    (kernel,) = [k for k in hub.status(user)["kernels"] if k["id"] == hub.kernels[user]["id"]]
    return kernel["pid"]


def test_each_user_sees_only_their_own_kernel_and_the_other_as_another_user(hub):
    for me, other in ((ALICE, BOB), (BOB, ALICE)):
        mine, theirs = hub.kernels[me]["id"], hub.kernels[other]["id"]
        reply = wait_until(
            lambda me=me: hub.status(me),
            lambda r, other=other: any(p["user"] == other for p in r["other_users"]),
            30,
            f"{other}'s kernel among {me}'s other users",
        )
        assert reply["user"] == me and reply["driver"]["available"]
        assert [k["id"] for k in reply["kernels"]] == [mine]  # only this user's kernel, not the other's
        (kernel,) = reply["kernels"]
        pid = kernel["pid"]
        assert pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name == me  # the kernel runs as its user
        assert kernel["path"] == f"{me.split('-')[1]}.ipynb" and kernel["note"] is None
        assert kernel["gpu_memory_bytes"] == {
            str(pid % 2): HOST_KERNEL_MIB[pid % 4] * MIB
        }  # host_kernels_server's rule
        # The other user's kernel: another user's process, with the figure its own server gives it.
        their_pid = kernel_pid(hub, other)
        (entry,) = [p for p in reply["other_users"] if p["pid"] == their_pid]
        assert entry["user"] == other and entry["gpu"] == their_pid % 2
        assert entry["used_memory_bytes"] == HOST_KERNEL_MIB[their_pid % 4] * MIB
        # (Its command line, the connection file's name with the kernel's id in it, is what ps shows anyone.)
        assert theirs not in [k["id"] for k in reply["kernels"]]
        assert not [p for p in reply["my_other_processes"] if p["pid"] == their_pid]


def test_metrics_answer_under_each_users_prefix(hub):
    for me, other in ((ALICE, BOB), (BOB, ALICE)):
        mine = hub.kernels[me]["id"]

        def scrape(me=me):
            status, body, _ = hub.request(
                f"/user/{me}/metrics", hub.tokens[me], scheme="Bearer"
            )  # as Prometheus sends it
            assert status == 200, f"/user/{me}/metrics: {status}"
            return body.decode()

        # The first scrape starts the reading that later scrapes serve.
        series = re.compile(rf'^tfgpu_kernel_gpu_memory_bytes{{[^}}]*kernel_id="{mine}"', re.M)
        text = wait_until(
            scrape, lambda t, series=series: series.search(t), 30, f"{me}'s kernel in /user/{me}/metrics"
        )
        assert hub.kernels[other]["id"] not in text
        assert re.search(rf'^tfgpu_server_info{{[^}}]*user="{me}"', text, re.M)


def test_the_prefix_answers_no_one_else(hub):
    """Without a token, or with the other user's, neither the status nor the metrics are served."""
    for path in ("tfgpu/api/status", "metrics"):
        for token in (None, hub.tokens[BOB]):
            status, body, _ = hub.request(f"/user/{ALICE}/{path}", token)
            assert status == 403, (path, status)
            assert b"tfgpu_" not in body and hub.kernels[ALICE]["id"].encode() not in body
        assert hub.request(f"/user/{ALICE}/{path}", hub.tokens[ALICE])[0] == 200
        assert (
            hub.request(f"/user/{ALICE}/{path}", hub.service_token)[0] == 200
        )  # a service allowed access:servers


# -- JupyterLab under /user/tfgpu-alice/ in Chromium --------------------------------------------------
def panel_rows(page) -> dict[str, list[str]]:
    rows = page.locator(".tfgpu-lab-kernel").evaluate_all(
        """rows => rows.map(row => [
            row.querySelector('.tfgpu-lab-kernel-name')?.innerText ?? '',
            Array.from(row.querySelectorAll('.tfgpu-lab-kernel-gpu'), gpu => gpu.innerText),
        ])"""
    )
    return {name: gpus for name, gpus in rows}


@pytest.mark.browser
@pytest.mark.skipif(not has_chromium(), reason=f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
@pytest.mark.skipif(not has_labextension(), reason="the JupyterLab extension is not built (npm run build)")
def test_alices_lab_shows_her_kernel_and_bobs_memory_under_the_prefix(hub):
    pytest.importorskip("playwright.sync_api")
    from support.browser import run_from_palette, status_text

    pid, bob_pid = kernel_pid(hub, ALICE), kernel_pid(hub, BOB)
    held = HOST_KERNEL_MIB[pid % 4] * MIB
    figure = f"GPU {pid % 2}: {held / GIB:.1f} GiB"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/tfgpu/api/status" in r.url else None)
        page.goto(f"{hub.base}/hub/login")
        page.fill("#username_input", ALICE)
        page.fill("#password_input", hub.password)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r".*/(hub/(home|spawn)|user/).*"), timeout=30_000)
        page.goto(f"{hub.base}/user/{ALICE}/lab/workspaces/hub/tree/alice.ipynb?reset")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        wait_for_kernel(page)

        run_from_palette(page, "GPU Memory Panel", until=page.locator("#jp-right-stack .tfgpu-lab-panel"))
        wait_until(
            lambda: panel_rows(page),
            lambda rows: rows == {"alice.ipynb": [figure]},
            30,
            "the panel's rows (alice's kernel alone, with its figure)",
        )
        gpus = page.locator(".tfgpu-lab-gpu")
        assert gpus.count() == 4
        # Bob's kernel: a share of 'other users' on its GPU, named in the segment's title.
        others = gpus.nth(bob_pid % 2).locator("[data-part='others']")
        wait_until(
            lambda: (others.count() and others.first.get_attribute("title")) or "",
            lambda t: f"{BOB} pid {bob_pid}: {HOST_KERNEL_MIB[bob_pid % 4] * MIB / GIB:.1f} GiB" in t,
            30,
            "bob's kernel among other users, on hover",
        )
        wait_until(lambda: status_text(page), lambda t: t == figure, 30, "the status bar's figures")
        shot(page, "jupyterhub-alice-lab.png")
        shot(page.locator(".tfgpu-lab-panel"), "jupyterhub-alice-panel.png")

    # Every request of the panel and the status bar went to alice's server, under her prefix.
    assert asked and all(url.startswith(f"{hub.base}/user/{ALICE}/tfgpu/api/status") for url in asked), asked[
        :5
    ]
