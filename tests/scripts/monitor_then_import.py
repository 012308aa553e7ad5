"""`%gpu monitor --interval 0.1`, then `import tensorflow` and an op, in this fresh process.

Issue 10: the sampler thread once imported part of TensorFlow while the user's thread was
importing it, and the import failed with a _DeadlockError (4 runs in 10).  Prints JSON.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
from tfgpu_magic.kernel import panels  # noqa: E402

panels._has_front_end = lambda: True  # this test shell has no kernel; a notebook's would carry the panel
ip.run_line_magic("gpu", "monitor --interval 0.1")
time.sleep(0.25)  # the sampler is ticking
before = set(sys.modules)
outcome = ip.run_cell("import tensorflow as tf\ntotal = float(tf.reduce_sum(tf.ones([4, 4])))")
error = outcome.error_in_exec or outcome.error_before_exec
time.sleep(0.3)  # a few ticks after the cell: TensorFlow's allocator, read as it ended, is in the samples
from tfgpu_magic.kernel.monitor import active_sampler, stop_panels  # noqa: E402

sampler = active_sampler()
last = sampler.latest() if sampler is not None else None
stop_panels()
print(
    json.dumps(
        {
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "total": ip.user_ns.get("total"),
            "sampler_thread_seen": any(t.name == "tfgpu-monitor" for t in threading.enumerate())
            or sampler is not None,
            # TensorFlow's figures, read on this thread after the cell, reach the sampler's samples.
            "tf_device_sampled": last is not None
            and any(f[0] == "tensorflow" for d in last.devices for f in d.figures),
        }
    )
)
