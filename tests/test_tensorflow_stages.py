"""Real TensorFlow (CPU build) at every start-up stage, each scenario in a fresh process.

The scenarios live in tests/scripts/stages.py; each returns what the magic printed and what
TensorFlow itself reports.  The contract scenario shows what TensorFlow would start with on a
four-GPU server, by listing fake CUDA devices in the CPU build (never starting the runtime).
"""

from __future__ import annotations

import pytest

from support.processes import run_scenario

pytestmark = pytest.mark.slow

REMEDY = "and cannot change it in a running kernel. Put `%gpu {}` at the top of the notebook, before `import tensorflow`, and restart the kernel"


@pytest.fixture(scope="module")
def not_imported():
    return run_scenario("stages", "not_imported", env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})


def test_settings_wait_for_the_import_then_land_before_the_first_op(not_imported):
    r = not_imported
    assert r["limit"] == "limit 4096MiB: takes effect when TensorFlow, PyTorch or JAX starts in this kernel"
    assert r["stage_after_magic"] == "NOT_IMPORTED"  # the magic never imports TensorFlow
    # magic, import and first op in one cell
    assert (
        r["cell"]
        == "allocator async: takes effect when TensorFlow, PyTorch or JAX starts in this kernel\n16.0"
    )
    assert r["stage_after_cell"] == "STARTED"
    assert r["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}


def test_after_start_the_same_request_is_quiet_and_a_different_one_gets_the_remedy(not_imported):
    r = not_imported
    assert r["same_again"] == "limit 4096MiB: already requested; nothing changed (TensorFlow has started)"
    assert r["use_none"] == "use none: already in force (TensorFlow has started); nothing changed"
    assert r["use_0"] == "UsageError: TensorFlow has already started with no GPU visible, " + REMEDY.format(
        "use 0"
    )
    assert r["different"] == (
        "UsageError: TensorFlow has already started with no GPU visible (so GPU memory settings "
        "cannot take effect), " + REMEDY.format("limit 2048MiB")
    )


def test_precision_applies_any_time_and_survives_free(not_imported):
    r = not_imported
    assert r["precision"] == "precision mixed_float16: Keras global policy set now"
    assert r["policy"] == "mixed_float16"
    assert r["free"].startswith(
        "Ran Keras clear_session and garbage collection. Re-applied precision mixed_float16 (clear_session resets it).\n"
        "CPU:0  TensorFlow allocator in use: "
    )
    assert r["free"].endswith("the async allocator returns freed memory as CUDA trims its pool.")
    assert r["policy_after_free"] == "mixed_float16"


def test_status_reports_request_force_stage_and_allocator(not_imported):
    status = not_imported["status"].splitlines()
    assert status[0] == "Requested:  use none; limit 4096MiB; allocator async; precision mixed_float16"
    assert status[1] == "In force:   GPUs visible to TensorFlow: none; Keras precision: mixed_float16"
    assert status[2] == "TensorFlow: started (first op ran); GPU settings are frozen"
    assert status[3].startswith("  CPU:0 TensorFlow allocator: ")
    assert "no NVIDIA driver could be reached through NVML" in not_imported["status"]


def test_imported_but_not_enumerated_uses_the_environment_without_enumerating():
    r = run_scenario("stages", "imported")
    assert r["stage_before"] == "IMPORTED"
    assert r["use_none"] == "use none: applied to TensorFlow now (imported, not started)"
    assert r["stage_after_env_settings"] == "IMPORTED"
    assert r["env"] == {"CUDA_VISIBLE_DEVICES": "-1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert r["cell"] == "mixed_bfloat16"


def test_enumerated_uses_tf_config():
    r = run_scenario("stages", "enumerated")
    assert r["stage_before"] == "ENUMERATED"
    assert r["use_none"] == "use none: applied to TensorFlow now (imported, not started)"
    assert r["visible_gpus"] == "[]"
    assert r["cell"] == "2.0" and r["stage_after"] == "STARTED"


def test_without_a_driver_the_card_gives_one_answer_about_the_gpus_seen():
    r = run_scenario("stages", "no_driver")
    assert r["cell"] == "2.0"
    assert "; GPUs seen: unknown\n" in r["before"]  # nothing has looked yet: no NVML, no TensorFlow
    lines = r["status"].splitlines()
    assert lines[1] == "In force:   GPUs visible to TensorFlow: none; Keras precision: float32"
    # (the CPU allocator's line comes between them only where TF_CPU_ALLOCATOR_USE_BFC is set)
    kernel = next(line for line in lines if line.startswith("This kernel: pid "))
    assert kernel.endswith("; sees no GPU")
    assert lines[lines.index(kernel) + 1].startswith(
        "GPUs:       no NVIDIA driver could be reached through NVML"
    )
    assert "GPUs seen: unknown" not in r["status"] + r["html"]
    assert r["json"]["visible_gpus"] == [] and r["json"]["in_force"][0] == "GPUs visible to TensorFlow: none"


@pytest.fixture(scope="module")
def contract():
    return run_scenario("stages", "contract")


def test_contract_settings_made_before_import_reach_gpu_options(contract):
    assert contract["import"] == ""  # nothing printed, nothing failed at import
    assert contract["stage"] == "ENUMERATED"  # applying enumerated, but never started TensorFlow
    # CUDA was told GPUs 1,2 (CUDA numbers them 0,1); each gets a 4096 MiB logical device.
    assert contract["at_import"] == {
        "visible_device_list": "0,1",
        "allow_growth": False,
        "virtual_mib": [[4096.0], [4096.0]],
    }
    # TensorFlow drops the growth flag beside a limit, so the variable carries it.
    assert contract["growth_env"] == "true"


def test_contract_changes_after_enumeration_go_through_tf_config(contract):
    assert contract["use_2"] == "use 2: applied to TensorFlow now (imported, not started)"
    assert contract["after_use_2"]["visible_device_list"] == "1"
    assert contract["after_use_2"]["virtual_mib"] == [[4096.0]]
    assert contract["after_split"]["virtual_mib"] == [[2048.0, 2048.0]]
    assert contract["after_limit_50"]["virtual_mib"] == [[12288.0]]  # 50% of GPU 2's 24 GiB
    # Without a limit, the requested growth goes back into GPUOptions itself.
    assert contract["after_limit_off"] == {
        "visible_device_list": "1",
        "allow_growth": True,
        "virtual_mib": [],
    }


def test_contract_growth_is_made_uniform(contract):
    # The user turned growth off on one GPU by hand; `%gpu grow` sets every visible GPU.
    assert contract["grow_again"] == "grow: applied to TensorFlow now (imported, not started)"
    assert contract["after_grow"]["allow_growth"] is True


def test_contract_gpu_hidden_before_enumeration_is_explained(contract):
    assert contract["use_3_hidden"] == (
        "UsageError: TensorFlow did not find GPU 3 (it found: 1,2); it was hidden by "
        "CUDA_VISIBLE_DEVICES before TensorFlow listed its devices. Restart the kernel and put "
        "the `%gpu use` line before `import tensorflow`"
    )
    assert contract["stage_end"] == "ENUMERATED"


@pytest.fixture(scope="module")
def imported_first():
    return run_scenario("imported_first")


def test_status_never_starts_tensorflow(imported_first):
    assert imported_first["stage_after_status"] == "IMPORTED"
    assert imported_first["reported_stage"] == "imported"


def test_after_tensorflow_started_auto_gives_the_restart_remedy(imported_first):
    assert imported_first["auto_after_start"] == (
        "TensorFlow has already started with no GPU visible and cannot change it in a running kernel; "
        "put `%gpu use auto` at the top of the notebook, before `import tensorflow`, and restart the kernel"
    )
