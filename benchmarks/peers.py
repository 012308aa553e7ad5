"""The peers ``compare.py`` measures against, pinned, installed on first use into ``build/bench-deps/peers``.

None is a dependency of this project.  They are installed with ``pip install --no-deps --target``
(gpustat's blessed and jinxed with them; the rest, psutil, nvidia-ml-py, jupyter_server and
wcwidth, are already this project's or JupyterLab's) and put on ``sys.path`` of the benchmark's
processes only, so no other Python or Jupyter server of this checkout sees them.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_DIR = os.path.join(ROOT, "build", "bench-deps", "peers")

# The versions measured: the newest on PyPI on 2026-11-25.
PINNED = {
    "nvitop": "1.7.2",
    "gpustat": "1.1.1",
    "blessed": "1.52.0",  # gpustat's terminal library, and its terminfo reader:
    "jinxed": "1.3.0",
    "jupyterlab-nvdashboard": "0.15.0",
    "jupyter-resource-usage": "1.3.0",
}
SHOWN = ("nvitop", "gpustat", "jupyterlab-nvdashboard", "jupyter-resource-usage")


def ensure_installed() -> str:
    """The folder the peers import from (installed there on first use); put it on sys.path."""
    stamp = os.path.join(PEERS_DIR, ".pinned")
    wanted = " ".join(f"{name}=={version}" for name, version in sorted(PINNED.items()))
    try:
        with open(stamp) as f:
            installed = f.read().strip()
    except OSError:
        installed = ""
    if installed != wanted:
        print(
            f"Installing the peers into {os.path.relpath(PEERS_DIR, ROOT)} (first run only): {wanted}",
            flush=True,
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--upgrade",
                "--target",
                PEERS_DIR,
                *wanted.split(),
            ],
            check=True,
        )
        with open(stamp, "w") as f:
            f.write(wanted)
    if PEERS_DIR not in sys.path:
        sys.path.append(PEERS_DIR)  # after this checkout and the venv: the peers never shadow them
    return PEERS_DIR


def versions() -> str:
    return ", ".join(f"{name} {PINNED[name]}" for name in SHOWN)
