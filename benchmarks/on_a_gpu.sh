#!/usr/bin/env bash
# What only a real NVIDIA GPU can show, in one short run on a machine that has one (a lent GPU
# machine has the driver, CuPy, PyTorch and JAX, but neither TensorFlow nor IPython):
#   1. the `gpu`-marked tests (PyTorch's and JAX's settings seen by the driver, numbering, the CLI);
#   2. how JAX reports its start on that GPU (what the adapter records, and what jax.devices() says);
#   3. MPS and per-process utilization as the driver gives them (nvidia-smi pmon beside NVML);
#   4. `tfgpu --json` beside `nvidia-smi` on the real driver (wall time of whole commands);
#   5. a status refresh beside nvitop on the real driver (real_refresh.py; nvitop travels as a wheel too).
# What the tests import beyond that (IPython, ipywidgets, jupyter_server, jsonschema and their
# dependencies) and nvitop travel as wheels in .whl/ on a machine that reaches no package index
# (`pip download --no-deps --only-binary=:all: --python-version 3.X -d .whl NAME==VERSION` elsewhere).
# Results go to $OUT (the device tool's folder) or ./build/on-a-gpu.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/on-a-gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  # Into the interpreter's own environment (a throwaway machine): the tests' fresh processes get a
  # clean environment, so a PYTHONPATH would not reach them.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD
export PYTHONUNBUFFERED=1
{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current --format=csv
  python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

echo "== 1. gpu-marked tests"
timeout 330 python3 -m pytest -p no:cacheprovider -m gpu -q -rs -o addopts="" \
  tests/test_gpu_frameworks.py tests/test_cli.py tests/test_monitor.py tests/test_inventory.py \
  tests/test_gpu_numbering.py tests/test_kernel_inventory.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -40

echo "== 2. JAX's start on this GPU, as the adapter records it"
timeout 60 python3 - <<'EOF' 2>&1 | tee "$OUT/jax-start.txt"
import os
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
from tfgpu_magic.frameworks.jax import Jax
adapter = Jax()
import jax
adapter.on_import(jax)
bridge = jax._src.xla_bridge
inside = {}
original = bridge.backends
def probe(*a, **k):
    result = original(*a, **k)
    try:
        inside["devices"] = [d.platform for d in jax.devices()]
    except Exception as err:  # what an adapter asking jax.devices() here would meet
        inside["devices"] = f"{type(err).__name__}: {err}"
    return result
bridge.backends = probe
jax.numpy.ones(3).block_until_ready()
bridge.backends = original
print("backends():", {k: getattr(v, "platform", None) for k, v in original().items()})
print("jax.devices() inside the first start:", inside.get("devices"))
print("adapter records:", adapter.start())
print("platforms:", adapter.platforms(), "devices:", jax.devices())
EOF

echo "== 3. MPS and per-process utilization"
{
  command -v nvidia-cuda-mps-control && (echo get_default_active_thread_percentage | timeout 5 nvidia-cuda-mps-control) || echo "no MPS control daemon"
  timeout 60 python3 - <<'EOF'
import subprocess, sys, time, pynvml
busy = subprocess.Popen([sys.executable, "-c", (
    "import torch,time\nx=torch.randn(8192,8192,device='cuda')\nprint('ready',flush=True)\n"
    "t=time.time()\nwhile time.time()-t<12: x@x\ntorch.cuda.synchronize()")], stdout=subprocess.PIPE, text=True)
busy.stdout.readline(); time.sleep(3)
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, int((time.time() - 2) * 1e6))
    print("NVML process utilization:", [(s.pid, s.smUtil, s.memUtil) for s in samples], "busy pid", busy.pid)
except pynvml.NVMLError as err:
    print("NVML process utilization:", err)
print(subprocess.run(["nvidia-smi", "pmon", "-c", "1", "-s", "um"], capture_output=True, text=True).stdout)
busy.wait()
EOF
} 2>&1 | tee "$OUT/utilization.txt"

# From compiled bytecode, as an installed package runs (pip compiles at install): on a machine
# whose tree or image holds no .pyc, each fresh process would otherwise compile its sources again
# (measured 2026-11-28 on a lent H100: 217 of 314 ms of one `tfgpu --json` was `compile`).
python3 -m compileall -q tfgpu_magic "$(python3 -c 'import pynvml; print(pynvml.__file__)')" >/dev/null

echo "== 4. tfgpu --json beside nvidia-smi (wall seconds, 7 runs each, interleaved)"
timeout 120 python3 - <<'EOF' 2>&1 | tee "$OUT/cli-timing.txt"
import statistics, subprocess, sys, time
runs = {"nvidia-smi": [], "tfgpu --json": []}
commands = {"nvidia-smi": ["nvidia-smi"], "tfgpu --json": [sys.executable, "-m", "tfgpu_magic", "--json"]}
for _ in range(7):
    for name, command in commands.items():
        t = time.perf_counter(); subprocess.run(command, capture_output=True, check=True)
        runs[name].append(time.perf_counter() - t)
for name, times in runs.items():
    print(f"{name}: median {statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f})")
EOF

echo "== 5. a status refresh on the real driver: tfgpu_magic against nvitop (one process holding 1 GiB)"
python3 -c "import torch, time; x = torch.empty(2**28, device='cuda'); print('holding', flush=True); time.sleep(90)" &
holder=$!
sleep 10
timeout 120 python3 benchmarks/real_refresh.py 60 2>&1 | tee "$OUT/refresh.json"
kill "$holder" 2>/dev/null
