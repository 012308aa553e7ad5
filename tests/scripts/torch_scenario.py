"""Real PyTorch (the CPU build) under `%gpu`, in a fresh IPython shell; prints JSON for
tests/test_pytorch.py.  What PyTorch loaded with is read from torch itself
(``torch._C._accelerator_getAllocatorSettings``), never from tfgpu_magic's own record."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from harness import run_gpu
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
import tfgpu_magic  # noqa: E402
from tfgpu_magic.simulated import shared_server  # noqa: E402

tfgpu_magic.set_device_source(shared_server())
result: dict = {}
result["allocator"] = run_gpu(ip, "allocator async")
result["limit"] = run_gpu(ip, "limit 4G")
result["env_before_import"] = {
    k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
}
result["torch_imported_by_magic"] = "torch" in sys.modules
ip.run_cell("import torch")
import torch  # noqa: E402

result["torch_read"] = torch._C._accelerator_getAllocatorSettings()
result["cuda_initialized"] = torch.cuda.is_initialized()
result["torch_version_cuda"] = (
    torch.version.cuda
)  # None on the CPU build; a CUDA build runs here too, with no GPU
result["allocator_after"] = run_gpu(ip, "allocator default")
result["allocator_same"] = run_gpu(ip, "allocator async")
result["grow"] = run_gpu(ip, "grow")
result["free"] = run_gpu(ip, "free")
status = json.loads(run_gpu(ip, "status --json"))
result["frameworks"] = status["frameworks"]
result["status_keys"] = sorted(status)
result["text"] = run_gpu(ip, "status")
from tfgpu_magic.kernel.session import get_session  # noqa: E402

result["hook_errors"] = get_session().hook_errors
print(json.dumps(result))
