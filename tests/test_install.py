"""Installing the package into a fresh environment gives a working JupyterLab extension and server
extension, with no `jupyter lab build` and (for the wheel) no npm.

Slow: each test makes a virtual environment and installs JupyterLab into it from the package index.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILT = [
    REPO / "tfgpu_magic" / "static" / "widget.js",
    REPO / "tfgpu_magic" / "labextension" / "package.json",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not all(p.is_file() for p in BUILT), reason="the front ends are not built (npm run build)"
    ),
]


def run(*args: object, env: dict | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd)
    assert done.returncode == 0, (
        f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return ANSI.sub("", done.stdout + done.stderr)


def fresh_env(tmp_path: Path) -> dict:
    """An environment that sees only the new venv: no checkout on PYTHONPATH, no extra Jupyter paths."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "VIRTUAL_ENV", "PYTHONHOME"}
    }
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"), JUPYTER_DATA_DIR=str(tmp_path / "jupyter-data")
    )
    return env


def venv(tmp_path: Path) -> Path:
    # The interpreter this venv is made from (not the test run's venv: a venv of a venv is fine,
    # but must not see the test run's site-packages).
    base = getattr(sys, "_base_executable", sys.executable)
    run(base, "-m", "venv", tmp_path / "venv")
    return tmp_path / "venv" / "bin"


def assert_extensions_enabled(bin_dir: Path, env: dict) -> None:
    labext = run(bin_dir / "jupyter", "labextension", "list", env=env)
    assert re.search(r"tfgpu-magic v0\.1\.0 enabled OK \(python, tfgpu_magic\)", labext), labext
    assert "jupyter lab build" not in labext and "Build recommended" not in labext, labext
    serverext = run(bin_dir / "jupyter", "server", "extension", "list", env=env)
    assert re.search(
        r"tfgpu_magic enabled\s+- Validating tfgpu_magic\.\.\.\s+tfgpu_magic 0\.1\.0 OK", serverext
    ), serverext


def test_the_wheel_installs_both_extensions_without_npm_or_a_build(tmp_path):
    # An npm that fails: building the wheel from a checkout whose front ends are built must not need it.
    fake = tmp_path / "no-npm"
    fake.mkdir()
    (fake / "npm").write_text("#!/bin/sh\necho 'npm was called' >&2\nexit 97\n")
    (fake / "npm").chmod(0o755)
    env = fresh_env(tmp_path)
    build_env = dict(env, PATH=f"{fake}{os.pathsep}{env['PATH']}")
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-q",
        "-w",
        tmp_path / "wheels",
        REPO,
        env=build_env,
    )
    [wheel] = (tmp_path / "wheels").glob("tfgpu_magic-*.whl")

    bin_dir = venv(tmp_path)
    run(bin_dir / "python", "-m", "pip", "install", "-q", "jupyterlab>=4,<5", wheel, env=env)
    assert_extensions_enabled(bin_dir, env)
    share = tmp_path / "venv" / "share" / "jupyter" / "labextensions" / "tfgpu-magic"
    assert (share / "install.json").is_file() and list((share / "static").glob("remoteEntry.*.js"))


def test_an_editable_install_of_a_fresh_checkout_puts_the_extension_in_place(tmp_path):
    """What `make setup` does (pip install -e): hatchling copies the shared data into the venv too."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    checkout = tmp_path / "checkout"
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    if (REPO / "node_modules").is_dir():  # the packages npm would fetch, without fetching them again
        (checkout / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    assert not (
        checkout / "tfgpu_magic" / "labextension"
    ).exists()  # built by the install, as on a fresh clone

    env = fresh_env(tmp_path)
    bin_dir = venv(tmp_path)
    run(bin_dir / "python", "-m", "pip", "install", "-q", "jupyterlab>=4,<5", "-e", checkout, env=env)
    assert (checkout / "tfgpu_magic" / "labextension" / "package.json").is_file()
    assert_extensions_enabled(bin_dir, env)
