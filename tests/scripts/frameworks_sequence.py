"""One drawn sequence of `%gpu` commands, imports and first operations of TensorFlow, PyTorch and
JAX, in a fresh IPython shell; prints JSON for tests/test_frameworks_property.py.

Each framework's own reading is taken here, by the test, from the framework: the allocator
settings torch parsed at import (``torch._C._accelerator_getAllocatorSettings``), and the options
JAX's CUDA plugin made of the environment at its start (``generate_pjrt_gpu_plugin_options``,
called right after the start, before any later command).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from harness import run_gpu
from IPython.testing.globalipapp import start_ipython

steps = json.loads(sys.argv[1])
ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
import tfgpu_magic  # noqa: E402
from tfgpu_magic.simulated import shared_server  # noqa: E402

tfgpu_magic.set_device_source(shared_server())
result: dict = {"replies": [], "own": {}}
FIRST_OP = {
    "jax": "import jax.numpy as _jnp\n_ = (_jnp.ones(4) + 1).block_until_ready()",
    "tensorflow": "_ = tf.constant([1.0]) + 1",
}
IMPORT = {"jax": "import jax", "torch": "import torch", "tensorflow": "import tensorflow as tf"}
for kind, what in steps:
    if kind == "cmd":
        result["replies"].append(run_gpu(ip, what))
        continue
    if kind == "import":
        assert ip.run_cell(IMPORT[what]).success
        if what == "torch":
            import torch

            result["own"]["torch_settings"] = torch._C._accelerator_getAllocatorSettings()
        continue
    assert ip.run_cell(FIRST_OP[what]).success
    if what == "jax":
        from jaxlib import xla_client

        result["own"]["jax_options"] = xla_client.generate_pjrt_gpu_plugin_options()
        result["own"]["jax_cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
status = json.loads(run_gpu(ip, "status --json"))
result["frameworks"] = status["frameworks"]
result["requested"] = status["requested"]
result["jax_imported"] = "jax" in sys.modules
print(json.dumps(result))
