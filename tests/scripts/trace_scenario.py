"""`%gpu trace` in a fresh kernel on the CPU build; prints JSON for tests/test_trace.py.

Started WITHOUT TF_CPU_ALLOCATOR_USE_BFC: `%gpu trace` must set it before TensorFlow starts.
"""

from __future__ import annotations

import os

os.environ.pop("TF_CPU_ALLOCATOR_USE_BFC", None)  # before anything reads it

from memory_shell import cell, finish, ip, results

results["env_before"] = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
results["on"] = cell("%gpu trace")
results["env_after"] = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
results["again"] = cell("%gpu trace")
results["before_tf"] = cell("x = 1")
# TensorFlow starts inside a traced cell: the cell's peak counts from the allocator's birth.
results["import"] = cell("import tensorflow as tf\nfirst = tf.ones([1024, 1024])")  # 4 MiB
results["alloc"] = cell("big = tf.ones([16 * 1024 * 1024])")  # 64 MiB, kept
results["temporary"] = cell("total = float(tf.reduce_sum(tf.ones([8 * 1024 * 1024])))")  # 32 MiB, dropped
results["free"] = cell("del big")
results["python_only"] = cell("y = [0] * 1000")
results["error"] = cell("tmp = tf.ones([4 * 1024 * 1024])\nraise ValueError('boom')")
# A nested measurement resets TensorFlow's peak mid-cell: the trace still sees the 32 MiB.
results["nested_reset"] = cell(
    "scratch = tf.ones([8 * 1024 * 1024])\ndel scratch\n"
    "from tfgpu_magic.kernel.session import get_session\nget_session().adapter('tensorflow').open_peak_window().close()"
)
# Tutorial 2's pattern: %%capture runs its body as a cell of its own; the line stays outside.
results["capture"] = cell("%%capture status_json\n%gpu status --json")
results["captured"] = ip.user_ns["status_json"].stdout
results["on_when_started"] = cell("%gpu trace")
results["off"] = cell("%gpu trace off")
results["after_off"] = cell("big = tf.ones([16 * 1024 * 1024])")
results["off_again"] = cell("%gpu trace off")
finish()
