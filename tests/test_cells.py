"""`%%gpu budget` and `%%gpu on`: the line, the boundary, a real kernel on the CPU build, GPU numbering."""

from __future__ import annotations

import pytest

from tfgpu_magic.command.grammar import GrammarError
from tfgpu_magic.frameworks.tensorflow import Stage
from tfgpu_magic.kernel import cells
from tfgpu_magic.kernel.cells import BudgetExceeded, CellCommand, check_budget, parse_cell_line

from support.processes import run_scenario

MIB = 1024 * 1024
VALID = "valid: %%gpu budget 2G | %%gpu on 1"


# -- the line ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, expected",
    [
        ("budget 2G", CellCommand(budget_bytes=2048 * MIB)),
        ("budget 512", CellCommand(budget_bytes=512 * MIB)),
        ("BUDGET 1.5GiB", CellCommand(budget_bytes=1536 * MIB)),
        ("on 1", CellCommand(gpu=1)),
        ("on 0 budget 4G", CellCommand(budget_bytes=4096 * MIB, gpu=0)),
        ("budget 4G on 3", CellCommand(budget_bytes=4096 * MIB, gpu=3)),
    ],
)
def test_valid_lines(line, expected):
    assert parse_cell_line(line) == expected


@pytest.mark.parametrize(
    "line, message",
    [
        ("", "`%%gpu` needs `budget SIZE` or `on GPU`"),
        ("limit 2G", "unknown cell subcommand 'limit'"),
        ("budget", "`%%gpu budget` needs a size"),
        ("on", "`%%gpu on` needs a GPU number"),
        ("budget lots", "'lots' is not a size (like 512M, 2G or 1.5GiB; a bare number is MiB)"),
        ("budget 50%", "'50%' is not a size (like 512M, 2G or 1.5GiB; a bare number is MiB)"),
        ("on gpu1", "'gpu1' is not a GPU number (as nvidia-smi shows them)"),
        ("on 1 on 2", "`on` given twice"),
    ],
)
def test_invalid_lines_name_the_valid_forms(line, message):
    with pytest.raises(GrammarError) as err:
        parse_cell_line(line)
    assert str(err.value) == f"{message}; {VALID}"


def test_the_magic_turns_a_bad_line_into_one_usage_line(shell, gpu, capsys):
    outcome = shell.run_cell("%%gpu budget\nx = 1")
    assert type(outcome.error_in_exec).__name__ == "UsageError"
    assert capsys.readouterr().err == f"UsageError: `%%gpu budget` needs a size; {VALID}\n"


# -- the boundary, exactly -------------------------------------------------------------------------
def test_a_peak_equal_to_the_budget_passes_one_byte_more_fails():
    check_budget(64 * MIB, {"CPU:0": (4 * MIB, 68 * MIB, "TensorFlow")})
    with pytest.raises(BudgetExceeded) as err:
        check_budget(64 * MIB, {"CPU:0": (4 * MIB, 68 * MIB + 1, "TensorFlow")})
    assert str(err.value) == (
        "CPU:0: the cell's peak was 67,108,865 bytes, over its budget of 67,108,864 bytes "
        "(TensorFlow's allocator held 4 MiB when the cell started and 68 MiB at the peak)"
    )
    assert err.value._render_traceback_() == [f"BudgetExceeded: {err.value}"]  # no traceback


def test_every_device_is_checked():
    with pytest.raises(
        BudgetExceeded,
        match=r"^GPU 2 \(TF GPU:1\): the cell's peak was 3,072 MiB, over its budget of 2,048 MiB",
    ):
        check_budget(
            2048 * MIB,
            {"GPU 1 (TF GPU:0)": (0, MIB, "TensorFlow"), "GPU 2 (TF GPU:1)": (MIB, 3073 * MIB, "TensorFlow")},
        )


# -- a real kernel ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel():
    return run_scenario("cells_scenario", env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})


@pytest.mark.slow
def test_budget_passes_at_the_boundary_and_fails_just_over_it(kernel):
    assert kernel["budget_first_cell"]["ok"]  # TensorFlow started inside the cell
    assert kernel["at_budget"] == {"out": "", "err": "", "ok": True, "error": None, "result": None}
    assert kernel["just_over"]["out"] == (
        "BudgetExceeded: CPU:0: the cell's peak was 67,109,120 bytes, over its budget of 67,108,864 bytes "
        "(TensorFlow's allocator held 72 MiB when the cell started and 136 MiB at the peak)\n"
    )
    assert kernel["just_over"]["error"].startswith("BudgetExceeded: ")
    assert kernel["over_kept"]["out"] == "(16777153,)\n"  # the cell ran; its variables stay


@pytest.mark.slow
def test_budget_counts_the_cells_own_peak(kernel):
    assert kernel["too_small_first"]["error"] == (
        "BudgetExceeded: CPU:0: the cell's peak was 4 MiB, over its budget of 1 MiB "
        "(TensorFlow's allocator held 4 MiB when the cell started and 8 MiB at the peak)"
    )
    assert kernel["well_over"]["error"] == (
        "BudgetExceeded: CPU:0: the cell's peak was 128 MiB, over its budget of 64 MiB "
        "(TensorFlow's allocator held 136 MiB when the cell started and 264 MiB at the peak)"
    )
    assert kernel["held_before"]["ok"]  # memory held before the cell is not its own
    assert kernel["temporary"]["error"] == (
        "BudgetExceeded: CPU:0: the cell's peak was 32 MiB, over its budget of 16 MiB "
        "(TensorFlow's allocator held 264 MiB when the cell started and 296 MiB at the peak)"
    )


@pytest.mark.slow
def test_the_cell_behaves_like_a_plain_cell(kernel):
    assert (kernel["value"]["result"], kernel["value"]["out"]) == ("2", "Out[11]: 2\n")
    assert (kernel["silenced"]["result"], kernel["silenced"]["out"]) == (None, "")
    inside = kernel["error_inside"]
    assert inside["error"] == "KeyError: 'inside'"
    assert "----> 1 raise KeyError('inside')" in inside["out"]
    assert "[... skipping hidden 5 frame]" in inside["out"]  # the magic's and cells.py's own frames


@pytest.mark.slow
def test_on_explains_what_it_needs(kernel):
    assert kernel["on_not_imported"]["err"] == (
        "UsageError: `%%gpu on` runs the cell under TensorFlow's tf.device, and TensorFlow is not "
        "imported: run `import tensorflow as tf` in an earlier cell (or `import torch`, or a first JAX "
        "operation, for torch.cuda.device, jax.default_device)\n"
    )
    # Issue 27: the refusal no longer offers `%%gpu on 1` as a valid form where no GPU number would do.
    no_gpu = "it sees no GPU, so `%%gpu on` has nothing to run the cell on here; `%%gpu budget 2G` still measures the cell"
    assert kernel["on_no_gpu"]["err"] == f"UsageError: GPU 1 is not visible to TensorFlow: {no_gpu}\n"
    assert kernel["on_and_budget"]["err"] == f"UsageError: GPU 0 is not visible to TensorFlow: {no_gpu}\n"
    assert "%%gpu on 1" not in kernel["on_no_gpu"]["err"]
    assert kernel["bad_size"]["err"] == (
        f"UsageError: 'lots' is not a size (like 512M, 2G or 1.5GiB; a bare number is MiB); {VALID}\n"
    )


# -- `%%gpu on` numbering (TensorFlow simulated: a CPU build cannot run ops on a GPU) -----------
@pytest.fixture
def two_gpus(gpu):
    """TensorFlow sees nvidia-smi's GPUs 1 and 2 as its GPU:0 and GPU:1 (`%gpu use 1,2`)."""
    tf = gpu.session.adapter("tensorflow")
    tf.fake_stage = Stage.ENUMERATED
    tf.gpus = {"GPU:0": 1, "GPU:1": 2}
    return tf.scopes  # the device scopes the cells entered


def test_on_uses_nvidia_smi_numbers(shell, gpu, two_gpus, capsys):
    outcome = shell.run_cell("%%gpu on 2\nplaced = 'inside'\nplaced")
    assert outcome.success and outcome.result == "inside"
    assert two_gpus == ["GPU:1", "exit"]


def test_on_a_gpu_tensorflow_does_not_see(shell, gpu, two_gpus, capsys):
    outcome = shell.run_cell("%%gpu on 0\nplaced = 'never'")
    assert type(outcome.error_in_exec).__name__ == "UsageError"
    assert capsys.readouterr().err == (
        f"UsageError: GPU 0 is not visible to TensorFlow (visible: GPU 1, 2, as nvidia-smi numbers them); {VALID}\n"
    )
    assert two_gpus == []


def test_on_leaves_the_device_when_the_cell_fails(shell, gpu, two_gpus, capsys):
    outcome = shell.run_cell("%%gpu on 1\nraise ValueError('inside')")
    assert type(outcome.error_in_exec) is ValueError
    assert two_gpus == ["GPU:0", "exit"]


def test_budget_refuses_to_run_when_it_cannot_be_checked(shell, gpu, capsys):
    gpu.session.adapter("tensorflow").fake_stage = Stage.STARTED  # and no allocator statistics
    outcome = shell.run_cell("%%gpu budget 1G\nran = True")
    assert type(outcome.error_in_exec).__name__ == "UsageError"
    assert capsys.readouterr().err.startswith(
        "UsageError: cannot check a budget: TensorFlow's allocator keeps no statistics in this kernel"
    )
    assert "ran" not in shell.user_ns
    assert cells.CELL_FORMS == ("%%gpu budget 2G", "%%gpu on 1")
