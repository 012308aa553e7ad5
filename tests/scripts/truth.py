"""Issue 9 in a fresh process with the real TensorFlow (CPU build); prints JSON for the tests.

Usage: python truth.py SCENARIO [ARG].  Where GPUs are needed, the CPU build lists fake CUDA
devices for the GPUs CUDA would show (tensorflow.md's contract recipe: never start the
runtime then), and NVML is the simulated four-GPU server.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

from harness import add_fake_cuda_gpus, run_gpu
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
result: dict = {}
seen_by_cuda: dict = {}  # the environment when the fake CUDA enumerated, recorded by this script


def gpu(line: str) -> str:
    return run_gpu(ip, line)


def report() -> dict:
    return json.loads(gpu("status --json"))


def session():
    from tfgpu_magic.kernel.session import get_session

    return get_session()


def gpu_options() -> dict:
    from tensorflow.python.eager import context

    options = context.context()._compute_gpu_options()
    return {
        "visible_device_list": options.visible_device_list,
        "allow_growth": options.allow_growth,
        "virtual_mib": [[int(m) for m in v.memory_limit_mb] for v in options.experimental.virtual_devices],
    }


def fake_cuda_gpus(module) -> None:
    """List the GPUs CUDA would show now (enumeration), noting what CUDA read."""
    add_fake_cuda_gpus(seen_by_cuda)


def simulated_server_with_fake_cuda() -> None:
    import tfgpu_magic
    from tfgpu_magic.frameworks.import_hooks import run_after_import
    from tfgpu_magic.gpus.simulated import shared_server

    tfgpu_magic.set_device_source(shared_server())
    run_after_import("tensorflow", fake_cuda_gpus)  # before the extension's hook
    ip.run_line_magic("load_ext", "tfgpu_magic")


def tensorflow_view() -> list[int]:
    """nvidia-smi indices of the GPUs TensorFlow would start with, worked out from TensorFlow's own
    GPUOptions and the environment this script saw at enumeration (not through tfgpu_magic's record)."""
    from tensorflow.python.eager import context

    from tfgpu_magic.gpus import numbering

    if context.context().config.device_count["GPU"] == 0:  # how TensorFlow says "no GPU visible"
        return []
    listed = gpu_options()["visible_device_list"]
    cuda_map = numbering.cuda_to_nvml(seen_by_cuda, session().machine.uuids())
    return sorted(cuda_map[int(k)] for k in listed.split(",")) if listed else sorted(cuda_map)


# -- scenarios ----------------------------------------------------------------------------------------
def late_cuda_visible_devices() -> None:
    """Defect 1: CUDA_VISIBLE_DEVICES changed after enumeration must not change our numbering."""
    simulated_server_with_fake_cuda()
    ip.run_cell("import tensorflow as tf")
    os.environ["CUDA_VISIBLE_DEVICES"] = "2"  # too late: CUDA has read it
    result["use"] = gpu("use 2")
    result["options"] = gpu_options()
    result["tensorflow_view"] = tensorflow_view()
    result["status_visible"] = report()["visible_gpus"]


def inherited_device_order() -> None:
    """Defect 2: an inherited FASTEST_FIRST is replaced before CUDA starts, and said once."""
    out = io.StringIO()
    with redirect_stdout(out):
        simulated_server_with_fake_cuda()
    result["said"] = out.getvalue().strip()
    result["order"] = os.environ.get("CUDA_DEVICE_ORDER")
    ip.run_cell("import tensorflow as tf")
    result["seen_by_cuda"] = seen_by_cuda
    result["notes"] = report()["notes"]


def allocation() -> None:
    """Defect 3: an inherited CUDA_VISIBLE_DEVICES=2,3 is the kernel's allocation."""
    simulated_server_with_fake_cuda()
    result["use_0"] = gpu("use 0")
    result["use_all"] = gpu("use all")
    result["env"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    ip.run_cell("import tensorflow as tf")
    result["tensorflow_view"] = tensorflow_view()
    result["status_visible"] = report()["visible_gpus"]
    result["use_3"] = gpu("use 3")
    result["tensorflow_view_3"] = tensorflow_view()
    result["in_force"] = report()["in_force"]


def start_facts() -> None:
    """Defect 4: what TensorFlow started with is recorded when it starts."""
    ip.run_line_magic("load_ext", "tfgpu_magic")
    ip.run_cell("import tensorflow as tf\nfrom tensorflow.python.client import device_lib")
    result["before"] = session().adapter("tensorflow").stage().name
    ip.run_cell("devices = device_lib.list_local_devices()")
    result["after_device_lib"] = session().adapter("tensorflow").stage().name
    ip.run_cell("x = tf.constant(1.0)")
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"  # by hand, after the first op
    os.environ["TF_GPU_ALLOCATOR"] = "cuda_malloc_async"
    result["started_with"] = dict(session().adapter("tensorflow").started_with.env)
    force = session().adapter("tensorflow").in_force(session().machine.cuda_map(), session().env)
    result["in_force"] = {"growth": force.growth, "allocator": force.allocator}
    result["grow_off"] = gpu("grow off")


def no_gpu_note() -> None:
    """Defect 9: any GPU setting that cannot take effect is said once, not only a limit."""
    import tfgpu_magic
    from tfgpu_magic.gpus.simulated import shared_server

    tfgpu_magic.set_device_source(shared_server())  # NVML sees GPUs; the CPU build finds none
    ip.run_line_magic("load_ext", "tfgpu_magic")
    result["grow"] = gpu("grow")
    err = io.StringIO()
    with redirect_stderr(err):
        ip.run_cell("import tensorflow as tf\nx = tf.constant(1.0)")
    result["stderr"] = [line for line in err.getvalue().splitlines() if line.startswith("tfgpu_magic")]
    result["precision"] = gpu("precision mixed_float16")


def reset_precision() -> None:
    """Defect 6: reset puts the Keras policy back, and says what it cannot undo."""
    ip.run_line_magic("load_ext", "tfgpu_magic")
    gpu("precision mixed_float16")
    gpu("use none")
    ip.run_cell("import keras\nimport tensorflow as tf\ncpus = tf.config.list_physical_devices('CPU')")
    import keras

    result["policy_before"] = keras.mixed_precision.global_policy().name
    result["reset"] = gpu("reset")
    result["policy_after"] = keras.mixed_precision.global_policy().name
    result["env"] = os.environ.get("CUDA_VISIBLE_DEVICES")


def steps(encoded: str) -> None:
    """The property: after random commands, hand-made environment changes and stages, what
    `%gpu status --json` says equals what TensorFlow would start with."""
    simulated_server_with_fake_cuda()
    result["said"] = []
    for kind, value in json.loads(encoded):
        if kind == "gpu":
            result["said"].append(gpu(value))
        elif kind == "env":
            name, _, text = value.partition("=")
            os.environ[name] = text
        elif kind == "import":
            ip.run_cell("import tensorflow as tf")
    ip.run_cell("import tensorflow as tf")
    data = report()
    options = gpu_options()
    result["status_visible"] = data["visible_gpus"]
    result["tensorflow_view"] = tensorflow_view()
    result["resolved"] = data["resolved"]
    result["notes"] = data["notes"]
    result["virtual_mib"] = options["virtual_mib"]
    result["env_growth"] = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    result["in_force"] = data["in_force"]
    result["requested"] = session().requested.growth


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result))
