"""A status refresh on a real NVIDIA driver: tfgpu_magic against nvitop, warm and cold, interleaved.

Run on a GPU machine by ``on_a_gpu.sh`` (``python benchmarks/real_refresh.py [ROUNDS]``), which
prints one JSON line: per contender the warm and cold refresh, (median, 95th percentile) in ms.
The contenders are ``vs_refresh.py``'s, reading the real driver instead of the stand-in: what
``%gpu status`` builds (``status.build_report``), and nvitop's devices with their processes'
user names, commands and GPU memory.  Cold empties what each remembers about processes and users
(the first refresh of a new kernel or tool, NVML already started).  nvitop must be importable
(on a lent GPU machine it travels as a wheel in ``.whl/``); without it only ours is timed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vs_refresh
from timing import interleaved, summary


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    made = {"tfgpu_magic": vs_refresh.ours()}
    try:
        made["nvitop"] = vs_refresh.nvitop(stand_in=False)
    except ImportError as err:  # said in the output: only ours was timed
        print(f"nvitop not importable ({err}): only tfgpu_magic is timed", file=sys.stderr)
    refreshes = {name: pair[0] for name, pair in made.items()}
    forgets = {name: pair[1] for name, pair in made.items()}
    result: dict[str, Any] = {name: {} for name in made}
    for case, prepare in (("warm", None), ("cold", forgets)):
        samples = interleaved(refreshes, rounds if case == "warm" else max(10, rounds // 3), prepare)
        for name, ms in samples.items():
            result[name][case] = summary(ms)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
