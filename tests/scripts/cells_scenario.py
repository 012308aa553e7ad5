"""`%%gpu budget` and `%%gpu on` in a fresh kernel on the CPU build; prints JSON for tests/test_cells.py.

Run with TF_CPU_ALLOCATOR_USE_BFC=true in the environment (the CPU allocator keeps statistics).
"""

from __future__ import annotations

from memory_shell import cell, finish, results

results["on_not_imported"] = cell("%%gpu on 0\nx = 1")
# TensorFlow imported and started inside a budget cell: the budget still applies.
results["budget_first_cell"] = cell("%%gpu budget 8M\nimport tensorflow as tf\nsmall = tf.ones([1024, 1024])")
results["too_small_first"] = cell("%%gpu budget 1M\nsmall2 = tf.ones([1024, 1024])")
# A big free region first, so TensorFlow's BFC allocator splits it and counts exactly what is
# asked (rounded to 256 bytes) rather than whole chunks.  `tf.ones` also holds a 256-byte scalar.
cell("warm = tf.ones([128 * 1024 * 1024])\ndel warm")
M = 16 * 1024 * 1024  # float32 elements in 64 MiB
results["at_budget"] = cell(f"%%gpu budget 64M\nat = tf.ones([{M} - 64])")  # 64 MiB exactly, with the scalar
results["just_over"] = cell(f"%%gpu budget 64M\nover = tf.ones([{M} - 63])")  # 256 bytes more
results["over_kept"] = cell("print(over.shape)")
results["well_over"] = cell(f"%%gpu budget 64M\nbig = tf.ones([2 * {M}])")
# Memory held before the cell does not count against its budget; a temporary peak does.
results["held_before"] = cell("%%gpu budget 1M\nn = int(tf.size(big))")
results["temporary"] = cell("%%gpu budget 16M\ntotal = float(tf.reduce_sum(tf.ones([8 * 1024 * 1024])))")
results["value"] = cell("%%gpu budget 1G\n1 + 1")
results["silenced"] = cell("%%gpu budget 1G\n1 + 1;")
results["error_inside"] = cell("%%gpu budget 1G\nraise KeyError('inside')")
results["bad_size"] = cell("%%gpu budget lots\nx = 1")
results["on_no_gpu"] = cell("%%gpu on 1\nx = 1")
results["on_and_budget"] = cell("%%gpu on 0 budget 1G\nx = 1")
finish()
