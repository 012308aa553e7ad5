"""A driver lists four GPUs and TensorFlow finds none: what `%gpu` and `%gpu trace` say.

Run in a fresh process with `--four-gpus` (memory_shell's simulated driver) on the CPU build.
`--as-cuda-build-install`: pretend the installed distribution is `tensorflow` (the CUDA build
on Linux) instead of `tensorflow-cpu`, so tfgpu_magic expects GPUs until TensorFlow lists none,
the case where the CPU allocator's statistics must be turned on just before the runtime starts.
Prints JSON for tests/test_no_gpu_found.py.
"""

from __future__ import annotations

import os
import sys

os.environ.pop("TF_CPU_ALLOCATOR_USE_BFC", None)  # before anything reads it

from tfgpu_magic.frameworks import tensorflow as tf_runtime

if "--as-cuda-build-install" in sys.argv:

    def as_cuda_build_install(distribution: str) -> bool:
        return distribution == "tensorflow"

    tf_runtime.TensorFlow.cpu_only_build = lambda self: False  # what a `tensorflow` install answers
    tf_runtime.distribution_installed = as_cuda_build_install  # what the diagnosis names

from memory_shell import cell, finish, ip, results

results["on"] = cell("%gpu trace")
results["env_after_on"] = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
results["import"] = cell("import tensorflow as tf\nfirst = tf.ones([1024, 1024])")  # 4 MiB
results["env_after_start"] = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
results["alloc"] = cell("big = tf.ones([16 * 1024 * 1024])")  # 64 MiB
results["status"] = cell("%gpu")
results["json"] = cell("%%capture captured\n%gpu status --json")
results["status_json"] = ip.user_ns["captured"].stdout
finish()
