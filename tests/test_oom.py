"""The out-of-memory explanation: a real OOM on the CPU allocator (fresh process), then the GPU text."""

from __future__ import annotations

import weakref

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import tensorflow as tf_runtime
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, Stage
from tfgpu_magic.kernel import oom, oom_handler

from support.processes import run_scenario

MIB = 1024 * 1024
GIB = 1024 * MIB
CPU_EXPLANATION = """tfgpu_magic: TensorFlow ran out of memory on CPU:0.
  Failed request: float tensor of shape [268435456] = 1,024 MiB, allocator bfc_cpu_allocator_for_gpu
  TensorFlow's allocator: 64 MiB in use; limit: 256 MiB (TF_CPU_BFC_MEM_LIMIT_IN_MB=256)
  Next steps:
    - `%gpu free`: drop Keras models and tensors left by earlier cells (their memory returns to TensorFlow's pool), then run the cell again
    - a smaller batch size (halve it until the cell fits)
    - a higher TF_CPU_BFC_MEM_LIMIT_IN_MB (MiB) in the kernel's environment before TensorFlow starts, or a GPU
"""


@pytest.fixture(scope="module")
def kernel():
    # The BFC allocator refuses 1 GiB under a 256 MiB cap without asking the system for it.
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "256"}
    return run_scenario("oom_scenario", env=env)


@pytest.mark.slow
def test_installed_when_tensorflow_is_imported(kernel):
    assert kernel["types_before_import"] == []  # nothing imported TensorFlow for it
    # TensorFlow 2.21 imports jax itself where it is installed (tensorflow/lite/python/util.py), so
    # JAX's runtime error is hooked too (its handler explains only RESOURCE_EXHAUSTED).
    assert "ResourceExhaustedError" in kernel["types_after_import"]
    assert set(kernel["types_after_import"]) <= {"ResourceExhaustedError", "JaxRuntimeError"}


@pytest.mark.slow
def test_a_real_oom_shows_the_traceback_then_the_explanation(kernel):
    out = kernel["oom"]["out"]
    assert kernel["oom"]["error"].startswith(
        "ResourceExhaustedError: {{function_node __wrapped__Fill_device_"
    )
    assert "----> 1 huge = tf.ones([256 * 1024 * 1024])" in out
    traceback, explanation = out.split("tfgpu_magic: ", 1)
    assert traceback.rstrip().endswith("by allocator bfc_cpu_allocator_for_gpu [Op:Fill] name:")
    assert "tfgpu_magic: " + explanation == CPU_EXPLANATION
    assert kernel["last_value"] == "ResourceExhaustedError"  # %debug and %tb still work
    assert kernel["after"]["out"] == "16777216.0\n"  # the kernel goes on


@pytest.mark.slow
def test_other_errors_are_left_alone(kernel):
    assert "tfgpu_magic" not in kernel["other_error"]["out"]
    assert kernel["other_error"]["out"].rstrip().endswith("ValueError: not memory")


@pytest.mark.slow
def test_an_oom_inside_a_budget_cell_is_explained_too(kernel):
    out = kernel["budget_oom"]["out"]
    assert "tfgpu_magic: TensorFlow ran out of memory on CPU:0.\n" in out
    assert "  Failed request: half tensor of shape [1024,1024] = 2 MiB, allocator cpu\n" in out
    assert "BudgetExceeded" not in out


# -- the GPU text, on the fake shared server (TensorFlow's side simulated) -------------------------
def gpu_oom(device: str = "GPU:0") -> Exception:
    return Exception(
        f"OOM when allocating tensor with shape[64,512,512,64] and type float on "
        f"/job:localhost/replica:0/task:0/device:{device} by allocator GPU_0_bfc\n\t [[{{{{node conv}}}}]]"
    )


@pytest.fixture
def tensorflow_on(session):
    def on(mapping: dict[str, int], in_use: int = 11 * GIB) -> None:
        session.adapter("tensorflow").gpus = mapping
        session.adapter("tensorflow").found = sorted(
            set(mapping.values())
        )  # CUDA's numbers are nvidia-smi's here
        session._on_import(
            session.adapter("tensorflow"), None
        )  # `import tensorflow`: the request reaches TensorFlow
        session.adapter("tensorflow").fake_stage = Stage.STARTED
        session.adapter("tensorflow").stats = {name: AllocatorStats(in_use, in_use) for name in mapping}

    return on


def test_gpu_explanation_with_a_limit_and_other_users(session, tensorflow_on):
    session.configure(grammar.parse("limit 12G"))
    tensorflow_on({"GPU:0": 1})
    assert (
        oom.explain(session, gpu_oom())
        == """\
tfgpu_magic: TensorFlow ran out of memory on GPU 1 (TF GPU:0, NVIDIA A100-SXM4-80GB).
  Failed request: float tensor of shape [64,512,512,64] = 4,096 MiB, allocator GPU_0_bfc
  TensorFlow's allocator: 11.0 GiB in use; limit: 12.0 GiB (`%gpu limit`)
  GPU 1: 22.3 GiB of 80.0 GiB in use by all processes (nvidia-smi's view)
  Other processes on GPU 1:
    pid 41003: 8,192 MiB (bob, python finetune.py)
    pid 41002: 4,096 MiB (me, python -m ipykernel_launcher)
  Next steps:
    - `%gpu free`: drop Keras models and tensors left by earlier cells (their memory returns to TensorFlow's pool), then run the cell again
    - a smaller batch size (halve it until the cell fits)
    - `%gpu precision mixed_float16`, then rebuild the model: float16 activations take half the memory
    - a higher `%gpu limit`, at the top of the notebook, then restart the kernel"""
    )


def test_gpu_explanation_points_to_a_freer_gpu(session, tensorflow_on):
    session.configure(grammar.parse("precision mixed_float16"))
    tensorflow_on({"GPU:0": 0}, in_use=9 * GIB)
    text = oom.explain(session, gpu_oom())
    assert (
        text.splitlines()[0]
        == "tfgpu_magic: TensorFlow ran out of memory on GPU 0 (TF GPU:0, NVIDIA A100-SXM4-40GB)."
    )
    assert (
        "  TensorFlow's allocator: 9,216 MiB in use; limit: none set (TensorFlow may take most of the GPU's 40.0 GiB)"
        in text
    )
    assert "    pid 41001: 30.0 GiB (alice, python train_resnet.py)" in text
    assert "precision" not in text  # already mixed_float16
    assert text.endswith(
        "    - another GPU: `%gpu use 1` (57.7 GiB free) or a higher `%gpu limit`, at the top of the "
        "notebook, then restart the kernel"
    )


def test_a_message_without_details_still_names_a_device(session, tensorflow_on):
    tensorflow_on({"GPU:0": 2}, in_use=0)
    text = oom.explain(session, Exception("OOM on /job:localhost/replica:0/task:0/device:GPU:0"))
    assert text.splitlines()[:3] == [
        "tfgpu_magic: TensorFlow ran out of memory on GPU 2 (TF GPU:0, NVIDIA RTX A5000).",
        "  TensorFlow's allocator: 0 B in use; limit: none set (TensorFlow may take most of the GPU's 24.0 GiB)",
        "  GPU 2: 300 MiB of 24.0 GiB in use by all processes (nvidia-smi's view)",
    ]
    assert "  Other processes on GPU 2: none" in text


@pytest.mark.parametrize(
    "message, site",
    [
        (
            "OOM when allocating tensor with shape[2,3] and type double on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc",
            tf_runtime.OomSite("GPU:1", 48, "double tensor of shape [2,3]", "GPU_1_bfc"),
        ),
        (
            "OOM when allocating tensor with shape[] and type qint8 on /device:CPU:0",
            tf_runtime.OomSite("CPU:0", None, "qint8 tensor of shape []", None),
        ),
        ("Out of memory while trying to allocate 123 bytes.", tf_runtime.OomSite(None, None, None, None)),
    ],
)
def test_parse_message(message, site):
    assert tf_runtime.parse_oom_message(message) == site  # the adapter reads its own message


# -- the IPython handler (a stand-in error type: TensorFlow is not imported here) ---------------
class FakeOom(Exception):
    pass


@pytest.fixture
def installed(shell, session, monkeypatch):
    monkeypatch.setattr(oom_handler, "_installed", weakref.WeakSet())
    session.adapter("tensorflow").oom_error = FakeOom
    saved = (shell.custom_exceptions, shell.CustomTB)
    monkeypatch.setitem(shell.user_ns, "FakeOom", FakeOom)
    yield lambda: oom_handler.install(shell, session)
    shell.custom_exceptions, shell.CustomTB = saved


def test_handler_keeps_another_extensions_handler(installed, shell, capsys, monkeypatch):
    seen = []
    shell.set_custom_exc(
        (KeyError,), lambda self, etype, value, tb, tb_offset=None: seen.append(etype.__name__)
    )
    monkeypatch.setattr(oom, "gather", lambda session, error: "facts")
    monkeypatch.setattr(oom, "render", lambda facts: f"explained {facts}")
    installed()
    installed()  # idempotent
    assert shell.custom_exceptions == (KeyError, FakeOom)
    shell.run_cell("raise KeyError('theirs')")
    outcome = shell.run_cell("raise FakeOom('mine')")
    out = capsys.readouterr().out
    assert seen == ["KeyError"]
    assert isinstance(outcome.error_in_exec, FakeOom)
    assert out.index("FakeOom: mine") < out.index("explained facts")


def test_a_failing_explanation_leaves_the_traceback_and_the_handler(installed, shell, capsys, monkeypatch):
    def broken(session, error):
        raise RuntimeError("no NVML")

    monkeypatch.setattr(oom, "gather", broken)
    installed()
    shell.run_cell("raise FakeOom('mine')")
    out = capsys.readouterr().out
    assert "FakeOom: mine" in out
    assert out.endswith("tfgpu_magic: no out-of-memory explanation (RuntimeError('no NVML'))\n")
    assert FakeOom in shell.custom_exceptions  # IPython did not unregister it
