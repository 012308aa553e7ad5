"""tfgpu_magic against its peers, every figure in one run: the README's performance table.

    .venv/bin/python benchmarks/compare.py [--quick] [--only refresh,scaling,monitor,endpoint,startup]

Peers (pinned in ``peers.py``, installed on first use into ``build/bench-deps/peers``): nvitop,
gpustat, jupyterlab-nvdashboard and jupyter-resource-usage.  Every contender reads the same
stand-in NVML (``standin.py``: the real ``pynvml`` pointed at a simulated server) listing real
processes of several users (created when run as root), and runs as its users run it; within a
section the contenders alternate, round by round, so a slow spell of the machine falls on all.
Each section runs in its own process (``vs_*.py``), which prints JSON; this prints medians and
95th percentiles per section, then the ratios, and writes everything to
``build/bench-results/compare-DATE.json``, with the table as README.md shows it.  No assertion.

Sections:
  refresh   a status refresh, warm and cold, 8 GPUs and 40 processes: ours, nvitop, gpustat
  scaling   the same at 64 GPUs and 1,000 processes
  monitor   the live chart at 10 samples/s on 8 GPUs, whole-process CPU: ours, nvdashboard
  endpoint  the server's status with 1, 10 and 20 real kernels: ours, jupyter-resource-usage
  startup   ``%load_ext tfgpu_magic`` in a fresh kernel: ours, ``import nvitop``, ``import gpustat``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peers  # noqa: E402

ROOT = os.path.dirname(HERE)
SECTIONS = ("refresh", "scaling", "monitor", "endpoint", "startup")


def run_section(script: str, *args: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


class Table:
    """The rows of one run: (section, what, ours, peer, peer's), each a (median, p95) or one figure."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        section: str,
        what: str,
        ours: tuple[float, float],
        peer: str,
        theirs: tuple[float, float],
        unit: str,
        spread: str = "p95",
    ) -> None:
        """``ours`` and ``theirs``: (median, ``spread``), the spread being the 95th percentile or the largest window."""
        self.rows.append(
            {
                "section": section,
                "what": what,
                "ours": ours,
                "peer": peer,
                "theirs": theirs,
                "unit": unit,
                "spread": spread,
                "ratio": ours[0] / theirs[0] if theirs[0] else None,
            }
        )
        print(
            f"  {what:<44} ours {_figure(ours, unit, spread):>22}   {peer:<24} {_figure(theirs, unit, spread):>22}",
            flush=True,
        )

    def markdown(self) -> str:
        """The rows as README.md's table (what, ours, peer and theirs, ratio)."""
        lines = ["| what | tfgpu_magic | peer | peer's | ratio |", "| --- | --- | --- | --- | --- |"]
        for row in self.rows:
            ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}×"
            ours, theirs = (_figure(row[k], row["unit"], row["spread"]) for k in ("ours", "theirs"))
            lines.append(f"| {row['what']} | {ours} | {row['peer']} | {theirs} | {ratio} |")
        return "\n".join(lines)

    def print_ratios(self) -> None:
        print("\nRatios (ours / peer, medians; below 1: ours costs less):")
        for row in self.rows:
            ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}x"
            print(f"  {row['section']:<9} {row['what']:<44} vs {row['peer']:<24} {ratio:>7}")


def _figure(pair: tuple[float, float], unit: str, spread: str = "p95") -> str:
    median, second = pair
    return f"{median:.3g} {unit} ({spread} {second:.3g})"


# -- sections -------------------------------------------------------------------------------------
def refresh(table: Table, gpus: int, processes: int, rounds: int, section: str) -> dict[str, Any]:
    result = run_section("vs_refresh.py", gpus, processes, rounds)
    found = result["contenders"]
    print(
        f"\n[{section}] a status refresh, {gpus} GPUs, {processes} processes of {', '.join(result['owners'])} "
        f"(stand-in NVML call {result['standin_call_ms'] * 1000:.1f} us each)"
    )
    for name, data in found.items():
        print(
            f"  {name}: {data['nvml_calls']} NVML calls a refresh, {data['processes_shown']} processes shown"
        )
    for case in ("warm", "cold"):
        for peer in ("nvitop", "gpustat"):
            table.add(
                section,
                f"refresh, {case}, {gpus} GPUs / {processes} procs",
                tuple(found["tfgpu_magic"][case]),
                peer,
                tuple(found[peer][case]),
                "ms",
            )
    return result


def monitor(table: Table, rounds: int, seconds: float) -> dict[str, Any]:
    result = run_section("vs_monitor.py", rounds, seconds)
    print(
        f"\n[monitor] 10 samples/s on {result['gpus']} busy GPUs, {rounds} rounds of {seconds:g} s windows, "
        "whole-process CPU less the same process idle"
    )
    found = result["contenders"]
    for name, data in found.items():
        print(
            f"  {name}: {data['messages_per_s']:.1f} messages/s sent, idle {statistics.median(data['idle_percent_core']):.3f} % of a core"
        )
    ours, theirs = found["tfgpu_magic"], found["jupyterlab-nvdashboard"]
    for key, what, unit in (
        ("percent_core", "monitor, % of a core at 10 Hz", "%"),
        ("us_per_tick", "monitor, CPU per tick", "us"),
    ):
        table.add(
            "monitor", what, _spread(ours[key]), "jupyterlab-nvdashboard", _spread(theirs[key]), unit, "max"
        )
    return result


def _spread(values: list[float]) -> tuple[float, float]:
    """(median, largest) of a few windows (too few for a 95th percentile)."""
    return statistics.median(values), max(values)


def endpoint(table: Table, rounds: int) -> dict[str, Any]:
    results = {}
    for interval in (0.0, 2.0):
        result = run_section("vs_endpoint.py", rounds, interval)
        results[str(interval)] = result
        mode = "every request a new reading" if interval == 0 else "refresh_interval 2 s (the default)"
        print(f"\n[endpoint] a real jupyter server, real kernels, {mode}")
        for size, data in result["sizes"].items():
            found = data["contenders"]
            print(
                f"  {size} kernels: {data['new_readings']} of {rounds} replies new readings, "
                f"{data['kernels_holding_memory']} kernels holding memory, {data['other_users']} other users' processes"
            )
            table.add(
                "endpoint",
                f"GET status, {size} kernels, {'read each' if interval == 0 else 'cached 2 s'}",
                tuple(found["tfgpu_magic"]),
                "jupyter-resource-usage",
                tuple(found["jupyter-resource-usage"]),
                "ms",
            )
    return results


def startup(table: Table, rounds: int) -> dict[str, Any]:
    result = run_section("vs_startup.py", rounds)
    found = result["contenders"]
    print(
        f"\n[startup] in a fresh kernel, {rounds} kernels each; `import tfgpu_magic` alone "
        f"{_figure(tuple(found['tfgpu_magic (import only)']['fresh']), 'ms')}; the first `%gpu` after "
        f"`%load_ext` (the session built) "
        f"{_figure(tuple(found['tfgpu_magic: the first %gpu (grow)']['fresh']), 'ms')}"
    )
    for peer, line in (("nvitop", "import nvitop"), ("gpustat", "import gpustat")):
        table.add(
            "startup",
            "%load_ext tfgpu_magic, fresh kernel",
            tuple(found["tfgpu_magic"]["fresh"]),
            line,
            tuple(found[peer]["fresh"]),
            "ms",
        )
    return result


# -- the run --------------------------------------------------------------------------------------
def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds and 5 s monitor windows: a smoke run, not figures"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections of: {', '.join(SECTIONS)}"
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    peers.ensure_installed()
    from tfgpu_magic import __version__

    today = datetime.date.today().isoformat()
    print(f"{today}, {machine()}")
    print(
        f"tfgpu_magic {__version__} against {peers.versions()}; NVML: the stand-in of benchmarks/standin.py"
    )
    quick = args.quick
    table, raw = Table(), {"date": today, "machine": machine(), "peers": peers.PINNED}
    if "refresh" in only:
        raw["refresh"] = refresh(table, 8, 40, 60 if quick else 300, "refresh")
    if "scaling" in only:
        raw["scaling"] = refresh(table, 64, 1000, 10 if quick else 40, "scaling")
    if "monitor" in only:
        raw["monitor"] = monitor(table, 1 if quick else 3, 5.0 if quick else 20.0)
    if "endpoint" in only:
        raw["endpoint"] = endpoint(table, 30 if quick else 200)
    if "startup" in only:
        raw["startup"] = startup(table, 2 if quick else 9)
    print("\nFor README.md:\n" + table.markdown())
    table.print_ratios()
    raw["rows"] = table.rows
    out = os.path.join(ROOT, "build", "bench-results", f"compare-{today}{'-quick' if quick else ''}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(raw, f, indent=1)
    print(f"\nAll figures: {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
