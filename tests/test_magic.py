"""The %gpu magic through a real IPython shell, before TensorFlow is imported.

Stages after the import run in fresh processes: see test_tensorflow_stages.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from traitlets.config import Config

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedNvml
from tfgpu_magic.kernel.magics import MANUAL, GpuMagics, complete
from tfgpu_magic.kernel.session import Session

USE = grammar.usage("use")


def test_use_sets_cuda_variables_in_nvml_order(gpu, capsys):
    gpu("use 0,2")
    assert (
        capsys.readouterr().out
        == "use 0,2: takes effect when TensorFlow, PyTorch or JAX starts in this kernel\n"
    )
    assert gpu.session.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,2"}
    gpu("use none")
    assert gpu.session.env["CUDA_VISIBLE_DEVICES"] == "-1"
    gpu("use all")
    assert "CUDA_VISIBLE_DEVICES" not in gpu.session.env


def test_grow_and_allocator_set_their_variables(gpu):
    gpu("grow")
    gpu("allocator async")
    assert gpu.session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert gpu.session.env["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    gpu("grow off")
    gpu("allocator default")
    assert gpu.session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert "TF_GPU_ALLOCATOR" not in gpu.session.env


@pytest.mark.parametrize(
    "setup, line, message",
    [
        ("use 1", "use 9", f"no GPU 9: this machine has 4 GPUs (numbers 0-3, as nvidia-smi shows); {USE}"),
        ("use 1", "use 3,4", f"no GPU 4: this machine has 4 GPUs (numbers 0-3, as nvidia-smi shows); {USE}"),
        (
            "grow",
            "limit 30G",
            "GPU 2 has 24576 MiB; 30720 MiB does not fit (use a smaller size or a percentage, e.g. `%gpu limit 90%`)",
        ),
        (
            "use all",
            "limit 4G,8G",
            "`%gpu limit` gives 2 sizes but 4 GPUs are visible; give one size for all GPUs or one per visible GPU",
        ),
        # issue 17, item 11: the remedy names the verb the user typed
        (
            "use 2,3",
            "split 16G,16G",
            "GPU 2 has 24576 MiB; 32768 MiB does not fit (use sizes that add up to at most 24576 MiB, or a count, e.g. `%gpu split 2`)",
        ),
        (
            "use 2",
            "split 1T",
            "GPU 2 has 24576 MiB; 1048576 MiB does not fit (use sizes that add up to at most 24576 MiB, or a count, e.g. `%gpu split 2`)",
        ),
        ("limit 1G", "limit 12abc", f"'12abc' is not a size; {grammar.usage('limit')}"),
        ("grow", "frobnicate", f"unknown subcommand 'frobnicate'; {grammar.usage()}"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(gpu, setup, line, message):
    gpu(setup)
    before_plan, before_env = gpu.session.requested, dict(gpu.session.env)
    with pytest.raises(UsageError) as info:
        gpu(line)
    assert str(info.value) == message
    assert gpu.session.requested == before_plan
    assert gpu.session.env == before_env


def test_usage_error_prints_one_line_without_traceback(shell, gpu, capsys):
    shell.run_cell("%gpu use 9")
    captured = capsys.readouterr()
    text = (captured.out + captured.err).strip()
    assert text == f"UsageError: no GPU 9: this machine has 4 GPUs (numbers 0-3, as nvidia-smi shows); {USE}"


def test_limit_per_gpu_follows_the_visible_gpus(gpu):
    gpu("use 1,2")
    gpu("limit 4G,8G")
    assert gpu.session.requested.describe() == ["use 1,2", "limit 4096MiB,8192MiB"]
    assert gpu.session.limit_bytes_by_gpu() == {1: 4096 * 2**20, 2: 8192 * 2**20}


def test_percentage_is_of_each_gpus_own_memory(gpu):
    gpu("limit 50%")
    assert gpu.session.limit_bytes_by_gpu() == {
        0: 20480 * 2**20,
        1: 40960 * 2**20,
        2: 12288 * 2**20,
        3: 7680 * 2**20,
    }


def test_without_a_driver_what_needs_nvml_says_so_and_the_rest_works(shell):
    session = Session(nvml=Nvml(lib=SimulatedNvml([], driver=False)), env={})
    shell.register_magics(GpuMagics(shell, session=session))
    shell.run_line_magic("gpu", "grow")
    shell.run_line_magic("gpu", "limit 4096")
    with pytest.raises(
        UsageError, match=r"^a limit of 50% needs each GPU's total memory, which NVML cannot read here"
    ):
        shell.run_line_magic("gpu", "limit 50%")
    assert session.requested.describe() == ["grow", "limit 4096MiB"]


def test_status_without_a_driver_is_one_line_about_it(shell, capsys):
    session = Session(nvml=Nvml(lib=SimulatedNvml([], driver=False)), env={})
    shell.register_magics(GpuMagics(shell, session=session))
    shell.run_line_magic("gpu", "")
    out = capsys.readouterr().out
    assert "GPUs:       no NVIDIA driver could be reached through NVML (Driver Not Loaded)" in out
    assert "Frameworks: none imported yet" in out and "TensorFlow: not imported" not in out


def test_reset_forgets_requests_and_restores_the_environment(gpu, capsys):
    gpu.session.env["CUDA_VISIBLE_DEVICES"] = "1,3"  # a scheduler allocated GPUs 1 and 3
    session = Session(
        nvml=gpu.session.nvml,
        env=gpu.session.env,
        frameworks=adapters(tensorflow=gpu.session.adapter("tensorflow")),
    )
    gpu.__dict__["session"] = session
    session.configure(grammar.Use((1,)))
    session.configure(grammar.Grow(True))
    assert session.reset() == "forgot: use 1; grow\nrequested now: nothing (each framework's defaults)"
    assert session.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,3"}
    assert session.reset() == "nothing to forget\nrequested now: nothing (each framework's defaults)"


def test_free_before_any_framework_is_honest_and_names_none(gpu, capsys):
    gpu("free")
    out = capsys.readouterr().out
    assert out.startswith(
        "Ran garbage collection.\nNo framework is imported in this kernel, so none holds GPU memory to free.\n"
    )
    assert "TensorFlow" not in out and "Keras" not in out
    assert "GPU 1  this process per the driver (NVML): 10.0 GiB -> 10.0 GiB (unchanged)" in out
    assert "went back" not in out


def test_manual_is_the_docstring_with_examples(shell):
    assert shell.find_line_magic("gpu").__doc__ == MANUAL
    for verb in grammar.FORMS:
        assert f"%gpu {verb}" in MANUAL or verb == "status"
    assert "Examples:" in MANUAL


def test_tab_completion_offers_verbs_then_words():
    class Event:
        def __init__(self, line):
            self.line = line

    assert "limit" in complete(None, Event("%gpu li"))
    assert complete(None, Event("%gpu precision ")) == list(grammar.PRECISIONS)


def test_administrator_defaults_from_config(shell, session):
    config = Config()
    config.GpuMagics.defaults = ["grow", "limit 50%", "limit nonsense"]
    magics = GpuMagics(shell, session=session, config=config)
    magics.apply_defaults()
    assert session.requested.describe() == ["grow", "limit 50%"]
    assert session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    session.configure(grammar.Use((1,)))
    session.reset()
    assert session.requested.describe() == ["grow", "limit 50%"]  # reset returns to the defaults


def test_a_default_that_cannot_be_applied_is_shown_by_status_with_why(shell):
    """A default that cannot be resolved (a percentage without NVML) is not dropped in silence:
    `%gpu` shows it, with the reason, beside the defaults that were applied (issue 29, item 8)."""
    session = Session(nvml=Nvml(lib=SimulatedNvml([], driver=False)), env={})
    config = Config()
    config.GpuMagics.defaults = ["grow", "limit 50%", "precision fast"]
    magics = GpuMagics(shell, session=session, config=config)
    with capture_output() as loaded:
        magics.apply_defaults()
    assert "ignored default 'limit 50%'" in loaded.stdout  # said at kernel start, as before
    assert session.requested.describe() == ["grow"]
    shell.register_magics(magics)
    report = json.loads(_run(shell, "status --json"))
    not_applied = report["defaults"]["not_applied"]
    assert report["defaults"]["configured"] == ["grow", "limit 50%", "precision fast"]
    assert [d["line"] for d in not_applied] == ["limit 50%", "precision fast"]
    assert "NVML cannot read" in not_applied[0]["reason"]
    text = _run(shell, "")
    rows = [line for line in text.splitlines() if "not applied" in line]
    assert len(rows) == 2 and "limit 50%" in rows[0] and "NVML cannot read" in rows[0], text
    config.GpuMagics.defaults = ["grow"]  # `%config` in a running kernel: applied again, all good
    magics.update_config(config)
    assert json.loads(_run(shell, "status --json"))["defaults"]["not_applied"] == []


def _run(shell, line: str) -> str:
    """What ``%gpu LINE`` shows: printed text, or the text of what it displayed (the status card)."""
    with capture_output() as out:
        shell.run_line_magic("gpu", line)
    return out.stdout + "".join(shown.data.get("text/plain", "") for shown in out.outputs)


def test_importing_the_package_and_loading_it_stay_light():
    code = (
        "import sys, tfgpu_magic\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython(); ip.run_line_magic('load_ext', 'tfgpu_magic')\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'pynvml') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


commands = st.sampled_from(
    [
        "use 1",
        "use 0,2",
        "use 9",
        "use 1,1",
        "use all",
        "use none",
        "grow",
        "grow off",
        "limit 4G",
        "limit 50%",
        "limit 101%",
        "limit 30G",
        "limit 4G,8G",
        "limit off",
        "split 2",
        "split 4G,4G",
        "split 0",
        "split off",
        "allocator async",
        "precision float32",
        "precision fp8",
        "bogus 1",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(commands, min_size=1, max_size=6))
def test_an_error_never_changes_the_request(server, lines):
    session = Session(nvml=Nvml(lib=server), env={})
    for line in lines:
        plan, env = session.requested, dict(session.env)
        try:
            session.configure(grammar.parse(line))
        except (grammar.GrammarError, ValueError):
            assert session.requested == plan and session.env == env


def test_use_auto_gives_its_claim_back_when_the_session_refuses(gpu, server):
    from tfgpu_magic.gpus import claims

    gpu("use 1")
    gpu("limit 30G")  # fits GPU 1 (80 GiB)
    server.gpus[1].processes[2].used_mib = 60000  # now GPU 2 (24 GiB) is the freest
    with pytest.raises(UsageError, match=r"^GPU 2 has 24576 MiB; 30720 MiB does not fit"):
        gpu("use auto")
    assert claims.held() == set()
    assert gpu.session.requested.visible == (1,)


def test_reset_releases_claims(gpu):
    from tfgpu_magic.gpus import claims

    gpu("use auto")
    assert claims.held()
    gpu("reset")
    assert claims.held() == set()


def test_monitor_off_without_a_panel_says_so(gpu, capsys):
    gpu("monitor off")
    assert capsys.readouterr().out == "No memory panel is running in this kernel.\n"
    with pytest.raises(UsageError, match="unexpected 'now'"):
        gpu("monitor off now")


def test_a_comment_after_a_command_is_a_comment_in_a_real_cell(shell, gpu, capsys):
    """The README's own lines, as pasted: IPython hands `%gpu` the comment, which must not count."""
    result = shell.run_cell(
        "%gpu use 1          # TensorFlow sees only nvidia-smi's GPU 1\n"
        "%gpu grow           # memory growth instead of taking the whole GPU\n"
        "%gpu limit 8G       # and never more than 8 GiB of it\n"
        "%gpu # the status, with a comment alone\n"
    )
    assert result.success, result.error_in_exec or result.error_before_exec
    assert gpu.session.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert gpu.session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "UsageError" not in capsys.readouterr().err


def test_a_comment_on_a_cell_magics_line_is_a_comment(shell, gpu):
    """With or without the comment, the same answer (here: `on` needs TensorFlow imported)."""
    plain = shell.run_cell("%%gpu on 1\nanswer = 42\n")
    commented = shell.run_cell("%%gpu on 1  # this cell on GPU 1 only\nanswer = 42\n")
    assert repr(commented.error_in_exec) == repr(plain.error_in_exec)
    assert "tf.device" in str(commented.error_in_exec)
