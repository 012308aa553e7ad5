"""What the fresh-process scenarios share: running `%gpu`, and fake CUDA devices for the CPU build."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from typing import Any

from IPython.core.error import UsageError


def run_gpu(ip: Any, line: str) -> str:
    """Run `%gpu LINE`; return what it printed, or 'UsageError: ...'."""
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            ip.run_line_magic("gpu", line)
    except UsageError as err:
        return f"UsageError: {err}"
    return out.getvalue().strip()


def add_fake_cuda_gpus(seen: dict | None = None) -> None:
    """List the GPUs CUDA would show for the environment now (tensorflow.md's contract recipe).

    Call from a post-import hook registered before the extension's.  ``seen`` receives the CUDA
    variables at this moment, so a test can check tfgpu_magic's record against its own.
    """
    from tensorflow.python.eager import context

    from tfgpu_magic.gpus import numbering
    from tfgpu_magic.kernel.session import get_session

    if seen is not None:
        seen.update({k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")})
    ctx = context.context()
    ctx._initialize_physical_devices()
    for k in range(len(numbering.cuda_to_nvml(os.environ, get_session().machine.uuids()))):
        device = context.PhysicalDevice(f"/physical_device:GPU:{k}", "GPU")
        ctx._physical_devices.append(device)
        ctx._visible_device_list.append(device)
        ctx._memory_growth_map[device] = None
