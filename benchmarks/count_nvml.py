"""The NVML calls one status refresh makes on the stand-in, per function: a cold one, then warm ones.

    .venv/bin/python benchmarks/count_nvml.py [GPUS] [PROCESSES]

The same set-up as ``vs_refresh.py`` (the real ``pynvml`` pointed at ``standin.py``'s simulated
server, real sleeping processes of several users); ``status.build_report`` as ``%gpu status``
builds it.  Counts, not times: prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["TFGPU_MAGIC_CLAIM_DIR"] = tempfile.mkdtemp(prefix="tfgpu-bench-claims-")

import standin


def main() -> None:
    gpus = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with standin.Sleepers(processes - 2) as sleepers:
        server = standin.server_listing([os.getpid(), *sleepers.pids], gpus, gone=sleepers.gone)
        calls = standin.install(server)
        from tfgpu_magic.gpus.nvml import Nvml
        from tfgpu_magic.kernel import status
        from tfgpu_magic.kernel.session import Session

        session = Session(nvml=Nvml(), env={})
        session.nvml.device_count()  # NVML started: its start is no refresh's
        result: dict[str, Any] = {}
        for name in ("cold", "warm", "warm again"):
            before = Counter(calls)
            status.build_report(session)
            made = Counter(calls)
            made.subtract(before)
            result[name] = {"total": sum(made.values()), "per_function": dict(sorted((+made).items()))}
    print(json.dumps({"gpus": gpus, "processes": processes, **result}))


if __name__ == "__main__":
    main()
