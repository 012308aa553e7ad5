"""How long `%gpu status` takes: our own code on the fake server, and beside nvidia-smi and gpustat.

Run by hand: `PYTHONPATH=. .venv/bin/python benchmarks/bench_status.py`.  Prints medians; no
assertions.  Part 1 always runs: 8 fake GPUs with 40 processes (``simulated.busy_server``),
timing build_report, render_text and render_html, and the share spent inside the fake NVML
itself.  Part 2 runs where NVML answers (a real NVIDIA machine): the same report on the real
driver with psutil owners, beside `nvidia-smi` and gpustat (library and command), each the
way a user would run it.  Needs neither IPython nor TensorFlow.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TFGPU_MAGIC_CLAIM_DIR", tempfile.mkdtemp(prefix="tfgpu-bench-claims-"))

from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

from tfgpu_magic.gpus.nvml import Nvml  # noqa: E402
from tfgpu_magic.gpus.simulated import busy_server  # noqa: E402
from tfgpu_magic.kernel import status  # noqa: E402
from tfgpu_magic.kernel.session import Session  # noqa: E402


def fake_part(runs: int = 300) -> None:
    server = busy_server(os.getpid())
    session = Session(nvml=Nvml(lib=server), env={})
    report = status.build_report(session)
    before = server.calls
    status.build_report(session)
    calls = server.calls - before
    build = median_ms(lambda: status.build_report(session), runs)
    text = median_ms(lambda: status.render_text(report), runs)
    page = median_ms(lambda: status.render_html(report), runs)
    per_call = median_ms(lambda: [server.nvmlDeviceGetMemoryInfo(0) for _ in range(1000)], 50) / 1000
    print("Part 1: fake server, 8 GPUs, 40 processes (5 users, one exited, one GPU without utilization)")
    print(f"  build_report            {build:7.2f} ms  ({calls} fake NVML calls, about {calls * per_call:.2f} ms of them)")
    print(f"  render_text             {text:7.2f} ms")
    print(f"  render_html             {page:7.2f} ms")
    print(f"  total                   {build + text + page:7.2f} ms  (our own code: about {build + text + page - calls * per_call:.2f} ms)")
    print(f"  text {len(status.render_text(report))} chars, HTML {len(status.render_html(report))} chars")


def real_part(runs: int = 20) -> None:
    nvml = Nvml()
    if not nvml.available():
        print("Part 2: skipped (no NVIDIA driver reachable through NVML)")
        return
    session = Session(nvml=nvml)
    print(f"Part 2: real driver, {nvml.device_count()} GPU(s), {sum(len(nvml.processes(i)) for i in range(nvml.device_count()))} process(es)")
    report_ms = median_ms(lambda: status.render_text(status.build_report(session)), runs)
    print(f"  %gpu status (build_report + render_text, in process)   {report_ms:8.2f} ms")
    html_ms = median_ms(lambda: status.render_html(status.build_report(session)), runs)
    print(f"  %gpu status (build_report + render_html, in process)   {html_ms:8.2f} ms")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    cli = [sys.executable, "-m", "tfgpu_magic"]
    print(f"  python -m tfgpu_magic (fresh process)                  {_command_ms(cli, env, runs // 2):8.2f} ms")
    if shutil.which("nvidia-smi"):
        print(f"  nvidia-smi (fresh process)                             {_command_ms(['nvidia-smi'], env, runs // 2):8.2f} ms")
        query = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
        print(f"  nvidia-smi --query-gpu ... (fresh process)             {_command_ms(query, env, runs // 2):8.2f} ms")
    else:
        print("  nvidia-smi: not installed")
    if importlib.util.find_spec("gpustat") is not None:
        import gpustat

        print(f"  gpustat.new_query() (in process)                       {median_ms(gpustat.new_query, runs):8.2f} ms")
    else:
        print("  gpustat library: not installed")
    if shutil.which("gpustat"):
        print(f"  gpustat (fresh process)                                {_command_ms(['gpustat'], env, runs // 2):8.2f} ms")
    else:
        print("  gpustat command: not installed")


def _command_ms(command: list[str], env: dict[str, str], runs: int) -> float:
    return median_ms(lambda: subprocess.run(command, env=env, capture_output=True, check=False), max(3, runs))


if __name__ == "__main__":
    print(f"Python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPU(s)")
    fake_part()
    real_part()
