"""Real JAX (the CPU build) under `%gpu`, in a fresh IPython shell; prints JSON for tests/test_jax.py.

What JAX starts with is read from JAX itself: ``jaxlib.xla_client.generate_pjrt_gpu_plugin_options()``
is the function JAX's CUDA plugin uses to read its variables, called here by the test after the
start, never through tfgpu_magic's record.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from harness import run_gpu
from IPython.testing.globalipapp import start_ipython

XLA = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "CUDA_VISIBLE_DEVICES",
)

ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
import tfgpu_magic  # noqa: E402
from tfgpu_magic.simulated import shared_server  # noqa: E402

tfgpu_magic.set_device_source(shared_server())  # GPUs 0, 1: 80 GiB; 2: 24 GiB; 3: 16 GiB
result: dict = {}
result["use"] = run_gpu(ip, "use 0,1")
result["grow"] = run_gpu(ip, "grow")
result["limit"] = run_gpu(ip, "limit 50%")
result["allocator"] = run_gpu(ip, "allocator platform")
result["env_before_import"] = {k: os.environ.get(k) for k in XLA}
result["jax_imported_by_magic"] = "jax" in sys.modules
ip.run_cell("import jax")
from jax._src import xla_bridge  # noqa: E402

result["started_by_import"] = xla_bridge.backends_are_initialized()
result["limit_differing"] = run_gpu(ip, "limit 8G,8G")  # 20% and 10%: one fraction cannot say it
result["fraction_differing"] = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
result["status_differing"] = run_gpu(ip, "status")
result["limit_same_share"] = run_gpu(ip, "limit 4G,8G")  # 10% of a 40 GiB and of an 80 GiB GPU
result["status_imported"] = json.loads(run_gpu(ip, "status --json"))["frameworks"]["jax"]
ip.run_cell("import jax.numpy as jnp\nx = jnp.ones((256, 256)) @ jnp.ones((256, 256))")
result["started"] = xla_bridge.backends_are_initialized()
from jaxlib import xla_client  # noqa: E402

result["jax_read"] = xla_client.generate_pjrt_gpu_plugin_options()  # JAX's own reading
result["grow_off_after"] = run_gpu(ip, "grow off")
result["free"] = run_gpu(ip, "free")
result["x_still_there"] = ip.user_ns["x"].shape == (256, 256)  # free never deletes the user's arrays
status = json.loads(run_gpu(ip, "status --json"))
result["frameworks"] = status["frameworks"]
result["text"] = run_gpu(ip, "status")
from tfgpu_magic.kernel.session import get_session  # noqa: E402

result["hook_errors"] = get_session().hook_errors
print(json.dumps(result))
