"""On a real NVIDIA machine: our numbering is nvidia-smi's, and `%gpu use` lands there.

Marked `gpu`: skipped where NVML cannot start (see conftest.py).  CUDA is exercised through
PyTorch or CuPy, whichever is installed (TensorFlow is not needed to check CUDA's numbering).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.kernel.session import Session

pytestmark = pytest.mark.gpu

CUDA_UUID = """
import sys
try:
    import torch
    torch.cuda.init()
    print("GPU-" + str(torch.cuda.get_device_properties(0).uuid))
except ImportError:
    import cupy, uuid
    raw = cupy.cuda.runtime.getDeviceProperties(0)["uuid"]
    print("GPU-" + str(uuid.UUID(bytes=bytes(raw))))
"""


def nvidia_smi_rows() -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in out.strip().splitlines()]


def test_nvml_numbering_is_nvidia_smis():
    nvml = Nvml()
    rows = nvidia_smi_rows()
    assert nvml.device_count() == len(rows)
    for index, uuid, bus_id, total_mib in rows:
        gpu = nvml.gpu(int(index))
        assert gpu.uuid == uuid
        assert gpu.pci_bus_id.lower().endswith(bus_id.lower()[-12:])
        assert gpu.memory.total_bytes // 2**20 == int(total_mib)


@pytest.mark.parametrize("position", [0, -1])
def test_use_makes_a_cuda_process_land_on_that_gpu(position):
    if not (_has("torch") or _has("cupy")):
        pytest.skip("needs PyTorch or CuPy to start CUDA")
    nvml = Nvml()
    index = range(nvml.device_count())[position]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    session = Session(nvml=nvml, env=env)
    session.configure(grammar.Use((index,)))
    out = subprocess.run(
        [sys.executable, "-c", CUDA_UUID], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == nvml.gpu(index).uuid


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
