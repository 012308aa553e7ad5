"""On a real NVIDIA GPU (the `gpu`-marked tests of tests/test_gpu_frameworks.py): PyTorch and JAX
under `%gpu` with the real driver.  Prints JSON.  ``torch_cap``: a 4 GiB limit refuses a 5 GiB
tensor, explained; ``torch_free``: memory freed by PyTorch's cache is seen by the driver;
``jax_grow``: with `%gpu grow` JAX does not take 75% of the GPU at its first operation."""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(__file__))

from harness import run_gpu
from IPython.testing.globalipapp import start_ipython

case = sys.argv[1]
ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
from tfgpu_magic.kernel import oom  # noqa: E402
from tfgpu_magic.kernel.session import get_session  # noqa: E402

session = get_session()
result: dict = {}


def used_by_driver() -> int:
    """GPU 0's memory in use by every process, per NVML (the figure nvidia-smi shows)."""
    return session.nvml.gpu(0).memory.used_bytes


if case == "torch_cap":
    result["use"] = run_gpu(ip, "use 0")
    result["limit"] = run_gpu(ip, "limit 4G")
    import torch

    under_the_cap = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 5 GiB in all: over it
        result["refused"] = False
    except torch.OutOfMemoryError as err:
        result["refused"] = True
        result["explanation"] = oom.explain(session, err)
    result["fraction_set"] = session.adapter("pytorch").caps_set
elif case == "torch_free":
    import torch

    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    result["driver_with_tensor"] = used_by_driver()
    del x
    out = io.StringIO()
    with redirect_stdout(out):
        ip.run_line_magic("gpu", "free")
    result["free"] = out.getvalue()
    result["driver_after_free"] = used_by_driver()
elif case == "jax_grow":
    result["driver_before"] = used_by_driver()
    if sys.argv[2] == "grow":
        result["grow"] = run_gpu(ip, "grow")
    import jax.numpy as jnp

    (jnp.ones(1024) + 1).block_until_ready()
    result["driver_after_first_op"] = used_by_driver()
    result["total"] = session.nvml.gpu(0).memory.total_bytes
    result["started_with"] = json.loads(run_gpu(ip, "status --json"))["frameworks"]["jax"]["started_with"]
print(json.dumps(result))
