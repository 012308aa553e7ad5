"""MemoryCallback in a real Keras fit on the CPU build; prints JSON for tests/test_keras_callback.py.

Usage: python keras_scenario.py LOG_DIR.  Run with TF_CPU_ALLOCATOR_USE_BFC=true.
"""

from __future__ import annotations

import glob
import json
import sys

import numpy as np

log_dir = sys.argv[1]
modules_before = "tensorflow" in sys.modules
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfgpu_magic.keras import MemoryCallback  # noqa: E402  (imports Keras; the documented name)

results: dict = {"tensorflow_before": modules_before}
keras.utils.set_random_seed(0)
x = np.random.rand(512, 256).astype("float32")
y = np.random.rand(512, 1).astype("float32")


def model(width: int) -> keras.Model:
    return keras.Sequential([keras.Input((256,)), keras.layers.Dense(width), keras.layers.Dense(1)])


small = model(64)
small.compile(optimizer="sgd", loss="mse")
history = small.fit(x, y, epochs=2, batch_size=64, verbose=0, callbacks=[MemoryCallback(log_dir=log_dir)])
results["keys"] = sorted(history.history)
results["small"] = history.history.get("cpu0_peak_bytes")

# A model 16 times as wide holds more weights and activations: its epoch peaks are higher.
wide = model(1024)
wide.compile(optimizer="sgd", loss="mse")
results["wide"] = wide.fit(
    x, y, epochs=1, batch_size=64, verbose=0, callbacks=[MemoryCallback()]
).history.get("cpu0_peak_bytes")
results["small_weights_bytes"] = int(sum(np.prod(w.shape) * 4 for w in small.weights))
results["wide_weights_bytes"] = int(sum(np.prod(w.shape) * 4 for w in wide.weights))
import tfgpu_magic.keras as memory_keras  # noqa: E402
from tfgpu_magic.keras import log_key  # noqa: E402

results["all_honest"] = all(hasattr(memory_keras, name) for name in memory_keras.__all__)
results["log_keys"] = [log_key("GPU:0"), log_key("GPU:12"), log_key("CPU:0")]

# What TensorBoard would read: the scalars written under log_dir.
scalars: dict = {}
for path in glob.glob(f"{log_dir}/**/events.out.tfevents.*", recursive=True):
    for raw in tf.data.TFRecordDataset(path):
        record = tf.compat.v1.Event.FromString(raw.numpy())
        for value in record.summary.value:
            number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
            scalars.setdefault(value.tag, []).append([record.step, number])
results["tensorboard"] = scalars
print(json.dumps(results))
