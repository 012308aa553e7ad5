"""Drive %gpu through one TensorFlow start-up scenario in this fresh process; print JSON.

Usage: python stages.py SCENARIO.  Each scenario records messages, errors and TensorFlow's
own view, and the test asserts on them.  Run by tests/test_tensorflow_stages.py.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stdout

from harness import add_fake_cuda_gpus, run_gpu
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
result: dict = {}


def gpu(line: str) -> str:
    return run_gpu(ip, line)


def cell(code: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        outcome = ip.run_cell(code)
    if not outcome.success:
        err = outcome.error_in_exec or outcome.error_before_exec
        return f"FAILED: {type(err).__name__}: {err}"
    return out.getvalue().strip()


def stage() -> str:
    from tfgpu_magic.kernel.session import get_session

    return get_session().adapter("tensorflow").stage().name


def gpu_options() -> dict:
    from tensorflow.python.eager import context

    options = context.context()._compute_gpu_options()
    return {
        "visible_device_list": options.visible_device_list,
        "allow_growth": options.allow_growth,
        "virtual_mib": [list(v.memory_limit_mb) for v in options.experimental.virtual_devices],
    }


def fake_cuda_gpus(module) -> None:
    """Make the CPU build list the GPUs CUDA would show (contract tests; never start TF)."""
    add_fake_cuda_gpus()


def not_imported() -> None:
    ip.run_line_magic("load_ext", "tfgpu_magic")
    result["limit"] = gpu("limit 4096")
    result["stage_after_magic"] = stage()
    # The magic, the import and the first op in one cell.
    result["cell"] = cell(
        "%gpu allocator async\nimport tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones([4, 4]))))"
    )
    result["stage_after_cell"] = stage()
    result["env"] = {k: os.environ.get(k) for k in ("CUDA_DEVICE_ORDER", "TF_GPU_ALLOCATOR")}
    result["same_again"] = gpu("limit 4096")
    result["different"] = gpu("limit 2048")
    result["use_none"] = gpu("use none")
    result["use_0"] = gpu("use 0")
    result["grow"] = gpu("grow")
    result["precision"] = gpu("precision mixed_float16")
    import keras

    result["policy"] = keras.mixed_precision.global_policy().name
    result["status"] = gpu("")
    cell("big = tf.ones([1024, 1024]); total = float(tf.reduce_sum(big))")
    cell("del big")
    result["free"] = gpu("free")
    result["policy_after_free"] = keras.mixed_precision.global_policy().name


def imported() -> None:
    import tensorflow  # noqa: F401  imported before the extension is loaded

    ip.run_line_magic("load_ext", "tfgpu_magic")
    result["stage_before"] = stage()
    result["use_none"] = gpu("use none")
    result["grow"] = gpu("grow")
    result["stage_after_env_settings"] = stage()  # the environment carried them: no enumeration
    result["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH")}
    result["precision_pending"] = gpu("precision mixed_bfloat16")
    result["cell"] = cell("import keras\nprint(keras.mixed_precision.global_policy().name)")


def enumerated() -> None:
    ip.run_line_magic("load_ext", "tfgpu_magic")
    cell("import tensorflow as tf\ncpus = tf.config.list_physical_devices('CPU')")
    result["stage_before"] = stage()
    result["use_none"] = gpu("use none")
    result["visible_gpus"] = cell("print(tf.config.get_visible_devices('GPU'))")
    result["cell"] = cell("print(float(tf.reduce_sum(tf.ones([2]))))")
    result["stage_after"] = stage()


def no_driver() -> None:
    """A CPU-only machine: no NVIDIA driver behind NVML, whatever this machine has."""
    import tfgpu_magic
    from tfgpu_magic.gpus.simulated import SimulatedNvml

    tfgpu_magic.set_device_source(SimulatedNvml([], driver=False))
    ip.run_line_magic("load_ext", "tfgpu_magic")
    result["before"] = gpu("")
    result["cell"] = cell("import tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones([2]))))")
    result["status"] = gpu("")
    result["json"] = json.loads(gpu("status --json"))
    from tfgpu_magic.kernel import status
    from tfgpu_magic.kernel.session import get_session

    result["html"] = status.render_html(status.build_report(get_session()))


def contract() -> None:
    """What TensorFlow would start with on a 4-GPU server (fake NVML, fake CUDA devices)."""
    import tfgpu_magic
    from tfgpu_magic.frameworks.import_hooks import run_after_import
    from tfgpu_magic.gpus.simulated import shared_server

    tfgpu_magic.set_device_source(shared_server())
    run_after_import("tensorflow", fake_cuda_gpus)  # before the extension's hook
    ip.run_line_magic("load_ext", "tfgpu_magic")
    result["use"] = gpu("use 1,2")
    result["limit"] = gpu("limit 4G")
    result["grow"] = gpu("grow")
    result["import"] = cell("import tensorflow as tf")
    result["stage"] = stage()
    result["at_import"] = gpu_options()
    result["growth_env"] = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    result["use_2"] = gpu("use 2")
    result["after_use_2"] = gpu_options()
    result["split"] = gpu("split 2")
    result["after_split"] = gpu_options()
    gpu("split off")
    result["limit_50"] = gpu("limit 50%")
    result["after_limit_50"] = gpu_options()
    gpu("limit off")
    result["after_limit_off"] = gpu_options()
    cell("tf.config.experimental.set_memory_growth(tf.config.get_visible_devices('GPU')[0], False)")
    result["grow_again"] = gpu("grow")
    result["after_grow"] = gpu_options()
    result["use_3_hidden"] = gpu("use 3")  # CUDA was told 1,2 before TensorFlow listed devices
    result["stage_end"] = stage()


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    print(json.dumps(result))
