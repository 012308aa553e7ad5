"""What the distributions carry, and what `make setup` does about apt.

The sdist must hold everything needed to rebuild both front ends (js/, the npm manifest and lock,
tsconfig.json) and the licence; the wheel carries the licence in .dist-info/licenses/.
The tests that build distributions are slow (`python -m build` makes an isolated build
environment with JupyterLab in it); the ones on .ci/apt-install use a fake apt-get and are fast.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAME = "tfgpu_magic-0.1.0"
BUILT = [
    REPO / "tfgpu_magic" / "static" / "widget.js",
    REPO / "tfgpu_magic" / "labextension" / "package.json",
]
FRONT_END_SOURCES = [
    "package.json",
    "package-lock.json",
    "tsconfig.json",
    "install.json",
    "jupyter-config/server-config/tfgpu_magic.json",
    "js/widget.ts",
    "js/widget.css",
    "js/lab/index.ts",
    "js/lab/style/index.css",
]


def run(*args: object, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd)
    assert done.returncode == 0, (
        f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel `python -m build` makes from it (as a release would)."""
    pytest.importorskip("build", reason="`build` is not installed (it is in the test extra: make setup)")
    if not all(p.is_file() for p in BUILT) and not shutil.which("npm"):
        pytest.skip("the front ends are not built and npm is missing")
    out = tmp_path_factory.mktemp("dist")
    run(
        sys.executable, "-m", "build", "-o", out, REPO, env=dict(os.environ, npm_config_prefer_offline="true")
    )
    [sdist] = out.glob(f"{NAME}.tar.gz")
    [wheel] = out.glob(f"{NAME}-py3-none-any.whl")
    return {"sdist": sdist, "wheel": wheel}


def sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as tar:
        return {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}


def git_files(under: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", under], cwd=REPO, capture_output=True, text=True, check=True
    )
    return [n for n in listed.stdout.split("\0") if n]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_licence_is_in_the_wheel_and_the_sdist(dists):
    text = (REPO / "LICENSE").read_text()
    assert (
        text.startswith("BSD 3-Clause License") and "Copyright (c) 2026, the tfgpu_magic developers" in text
    )
    with zipfile.ZipFile(dists["wheel"]) as whl:
        assert whl.read(f"{NAME}.dist-info/licenses/LICENSE").decode() == text
        metadata = whl.read(f"{NAME}.dist-info/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata and "License-File: LICENSE" in metadata
    with tarfile.open(dists["sdist"]) as tar:
        assert tar.extractfile(f"{NAME}/LICENSE").read().decode() == text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_sdist_holds_the_front_end_sources_and_no_build_clutter(dists):
    names = sdist_names(dists["sdist"])
    for name in FRONT_END_SOURCES + git_files("js") + git_files("tests") + git_files("example_notebooks"):
        assert name in names, f"{name} is missing from the sdist"
    assert {"README.md", "LICENSE", "pyproject.toml", "Makefile", ".ci/apt-install"} <= names
    clutter = [
        n
        for n in names
        if re.match(r"(node_modules|\.venv|test-artifacts|lib|dist|build)/", n)
        or "__pycache__" in n
        or ".ipynb_checkpoints" in n
    ]
    assert not clutter, clutter


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_sdist_rebuilds_the_front_end(dists, tmp_path):
    """Unpacked, with its prebuilt front ends deleted, the sdist builds a wheel with both again (npm needed)."""
    if not shutil.which("npm"):
        pytest.skip("npm is not installed")
    with tarfile.open(dists["sdist"]) as tar:
        # The "data" filter where this Python has it (3.11.4+; Debian 12's 3.11.2 has not): our own sdist.
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = tmp_path / NAME
    for built in ("tfgpu_magic/static", "tfgpu_magic/labextension"):
        shutil.rmtree(src / built, ignore_errors=True)
    assert not (src / "node_modules").exists()
    # npm installs from the sdist's lock; its cache makes that quick where it is warm.
    env = dict(
        os.environ, npm_config_prefer_offline="true", npm_config_audit="false", npm_config_fund="false"
    )
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "wheels", src, env=env)
    [wheel] = (tmp_path / "wheels").glob(f"{NAME}-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    share = f"{NAME}.data/data/share/jupyter/labextensions/tfgpu-magic"
    assert "tfgpu_magic/static/widget.js" in names
    assert "tfgpu_magic/server/schema/status-reply.v1.json" in names  # the REST reply's schema
    assert "tfgpu_magic/command/schema/notebook-settings.v1.json" in names  # the notebook key's schema
    assert {f"{share}/package.json", f"{share}/install.json", f"{share}/static/style.js"} <= names
    assert any(re.fullmatch(rf"{re.escape(share)}/static/remoteEntry\.[0-9a-f]+\.js", n) for n in names), (
        sorted(names)
    )
    assert f"{NAME}.data/data/etc/jupyter/jupyter_server_config.d/tfgpu_magic.json" in names


# --- make setup and apt ---------------------------------------------------------------------------

LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)"


@pytest.fixture
def fake_apt(tmp_path):
    """A fake apt-get on PATH: `update` fails with a lock error while tmp/locked-updates counts down."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$*" >> "{tmp_path}/calls"
case "$*" in *" update"*)
  n=$(cat "{tmp_path}/locked-updates")
  if [ "$n" = forever ] || [ "$n" -gt 0 ]; then
    [ "$n" = forever ] || echo $((n - 1)) > "{tmp_path}/locked-updates"
    echo "{LOCKED}" >&2; exit 100
  fi
  [ -f "{tmp_path}/update-fails" ] && {{ echo "E: Failed to fetch http://deb.example/ 404" >&2; exit 100; }}
esac
exit 0
""")
    (bin_dir / "apt-get").chmod(0o755)

    def apt_install(locked_updates: int | str, *packages: str, wait: int = 60, update_fails: bool = False):
        (tmp_path / "locked-updates").write_text(str(locked_updates))
        if update_fails:
            (tmp_path / "update-fails").write_text("")
        env = dict(
            os.environ,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            APT_LOCK_WAIT=str(wait),
            APT_LOCK_POLL="0",
        )
        started = time.monotonic()
        done = subprocess.run(
            [REPO / ".ci" / "apt-install", *packages], capture_output=True, text=True, env=env
        )
        calls = (tmp_path / "calls").read_text().splitlines()
        return done, calls, time.monotonic() - started

    return apt_install


def test_apt_install_waits_for_the_lists_lock_then_installs_with_dpkgs_lock_timeout(fake_apt):
    done, calls, _ = fake_apt(2, "chromium", "nodejs")
    assert done.returncode == 0, done.stderr
    assert [c.split()[2] for c in calls] == ["update", "update", "update", "install"]
    assert all(re.match(r"-o DPkg::Lock::Timeout=\d+ ", c) for c in calls), calls
    assert calls[-1].endswith("install -y -q chromium nodejs")
    assert done.stderr.count("Could not get lock /var/lib/apt/lists/lock") == 2


def test_apt_install_gives_up_on_the_lock_after_its_bound(fake_apt):
    done, calls, seconds = fake_apt("forever", "chromium", wait=2)
    assert done.returncode == 1 and LOCKED in done.stderr
    assert not any("install" in c for c in calls)
    assert seconds < 10


def test_apt_install_does_not_retry_other_failures(fake_apt):
    done, calls, _ = fake_apt(0, "chromium", update_fails=True)
    assert done.returncode == 1 and "Failed to fetch" in done.stderr
    assert calls == [calls[0]] and calls[0].endswith("update -q")


def test_make_setup_uses_the_waiting_apt_and_reuses_an_existing_venv():
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    # APT_NEEDS forced non-empty so the apt line is shown; -n prints the commands without running them.
    plan = run("make", "-n", "setup", "APT_NEEDS=chromium", cwd=REPO).stdout
    assert ".ci/apt-install chromium" in plan
    assert not re.search(r"(^|[;&|]\s*)apt-get (update|install)", plan.replace("sudo apt-get", "")), plan
    assert "test -x .venv/bin/python || python3 -m venv .venv" in plan
