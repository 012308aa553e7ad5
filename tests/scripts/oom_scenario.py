"""A real out-of-memory error on TensorFlow's CPU allocator, explained; JSON for tests/test_oom.py.

Run with TF_CPU_ALLOCATOR_USE_BFC=true and TF_CPU_BFC_MEM_LIMIT_IN_MB=256: the BFC allocator
refuses a 1 GiB tensor without asking the system for it, so the error is real and harmless.
"""

from __future__ import annotations

import sys

from memory_shell import cell, finish, ip, results

from tfgpu_magic.kernel import oom_handler
from tfgpu_magic.kernel.session import get_session

oom_handler.install(ip, get_session())  # before TensorFlow is imported: installed when it is
oom_handler.install(ip, get_session())  # idempotent
results["types_before_import"] = [t.__name__ for t in ip.custom_exceptions]
cell("import tensorflow as tf\nheld = tf.ones([16 * 1024 * 1024])")  # 64 MiB in use
results["types_after_import"] = [t.__name__ for t in ip.custom_exceptions]
results["oom"] = cell("huge = tf.ones([256 * 1024 * 1024])")  # 1 GiB > 256 MiB
results["last_value"] = type(sys.last_value).__name__
results["other_error"] = cell("raise ValueError('not memory')")
# Each real OOM costs 10 s (the allocator waits for memory to be freed), so this one is raised.
results["budget_oom"] = cell(
    "%%gpu budget 2G\nraise tf.errors.ResourceExhaustedError(None, None, 'OOM when allocating tensor with "
    "shape[1024,1024] and type half on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu')"
)
results["after"] = cell("print(float(tf.reduce_sum(held)))")
finish()
