"""What a flooded claim directory costs a reader (issue 17, item 3): run by hand.

A neighbour plants entries named like claims on this machine's GPUs in the shared claim
directory: older-version names, claim names of processes that do not run, and claim names of
running processes that hold no claim.  Timed, on a simulated 4-GPU server with one live claim:
``claims.holders`` for the 4 GPUs, the whole ``%gpu`` report in the kernel (build_report and
render_text), and the whole ``tfgpu --json`` in a fresh process.  (The server extension's reply
reads no claims.)  The figure should stay flat as the count grows,
but for the directory listing itself.

    .venv/bin/python benchmarks/bench_claims_flood.py [--counts 0,10000,100000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_ms

from tfgpu_magic.gpus import claims
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session

REPO = Path(__file__).resolve().parent.parent


def plant(directory: str, keys: list[str], count: int) -> None:
    live = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    for i in range(count):
        key = keys[i % len(keys)]
        name = (
            f"{key}.{1000 + i % 7}.{i:016x}.lock",
            f"{key}.{1000 + i % 7}.{100000 + i}.{i}.lock",
            f"{key}.{1000 + i % 7}.{live[i % len(live)]}.{i}.lock",
        )[i % 3]
        os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_WRONLY, 0o644))


def tfgpu_json_ms(directory: str, runs: int = 3) -> float:
    env = {**os.environ, claims.ENV_DIR: directory}
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tfgpu_magic", "--demo", "--json"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
        )
        samples.append((time.perf_counter() - began) * 1000)
    return sorted(samples)[len(samples) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="0,10000,100000")
    counts = [int(c) for c in parser.parse_args().counts.split(",")]
    keys = [gpu.uuid for gpu in shared_server().gpus]
    session = Session(nvml=Nvml(lib=shared_server(os.getpid())), env={})
    print(
        f"{'planted':>9}  {'holders(4 GPUs)':>16}  {'%gpu (in the kernel)':>21}  {'tfgpu --json (fresh process)':>29}"
    )
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="tfgpu-flood-") as directory:
            os.environ[claims.ENV_DIR] = directory
            with claims.choosing():
                claims.claim(keys[0])
            plant(directory, keys, count)
            holders = median_ms(lambda: claims.holders(keys), runs=5)
            magic = median_ms(lambda: status.render_text(status.build_report(session)), runs=5)
            whole = tfgpu_json_ms(directory)
            claims.release_all()
        print(f"{count:>9}  {holders:>13.1f} ms  {magic:>18.1f} ms  {whole:>26.0f} ms")


if __name__ == "__main__":
    main()
