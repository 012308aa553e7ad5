"""A notebook's saved GPU settings: the `tfgpu` metadata key read strictly, `%gpu save`, and the
settings applied when the extension loads (from a runner's environment or the notebook's file).

The runner (`tfgpu run`, papermill's engine) is tested in test_runner.py, the front end's part
in the browser tests.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tfgpu_magic.command import grammar, saved
from tfgpu_magic.command.plan import Plan
from tfgpu_magic.command.units import GIB, MIB
from tfgpu_magic.kernel import magics, notebook_settings
from tfgpu_magic.kernel.notebook_settings import CHOSEN_ENV, RUNNER_ENV, SETTINGS_ENV, apply_at_start


def settings_of(**value):
    return {"tfgpu": {"version": 1, **value}}


# -- reading the key: strict, one line, never anything but SettingsError ------------------------------
def test_a_notebook_without_the_key_has_no_settings():
    assert saved.read({}) is None
    assert saved.read({"kernelspec": {"name": "python3"}}) is None
    assert saved.read(None) is None


def test_the_documented_example_reads_back():
    read = saved.read(
        settings_of(
            requirements={"gpus": 1, "min_free_bytes": 4 * GIB, "min_compute_capability": "8.0"},
            policy=["grow", "limit 4096MiB"],
            observed={"by": "%gpu save"},
        )
    )
    assert read.requirements == saved.Requirements(1, 4 * GIB, (8, 0))
    assert read.requirements.use_command() == grammar.Use(grammar.Auto(1, 4 * GIB, None, (8, 0)))
    assert read.requirements.describe() == "1 GPU with 4,096 MiB free (compute capability 8.0+)"
    assert [command for _, command, _ in read.commands()] == [grammar.Grow(True), grammar.Limit((4096,))]
    assert read.observed == {"by": "%gpu save"}


@pytest.mark.parametrize(
    "value, message",
    [
        ("grow", "the notebook's metadata `tfgpu` is a string, not an object; nothing of it was applied"),
        (
            {},
            "the notebook's metadata `tfgpu.version` is null; this tfgpu_magic reads version 1; nothing of it was applied",
        ),
        (
            {"version": "1"},
            "the notebook's metadata `tfgpu.version` is a string; this tfgpu_magic reads version 1; nothing of it was applied",
        ),
        (
            {"version": True},
            "the notebook's metadata `tfgpu.version` is true or false; this tfgpu_magic reads version 1; nothing of it was applied",
        ),
        (
            {"version": 2},
            "the notebook's GPU settings (metadata `tfgpu`) are version 2, written by a newer tfgpu_magic; "
            "this one reads version 1: upgrade it (pip install -U tfgpu_magic)",
        ),
        (
            {"version": 1, "requirements": []},
            "the notebook's metadata `tfgpu.requirements` is a list, not an object; nothing of it was applied",
        ),
        (
            {"version": 1, "requirements": {"gpus": -1}},
            'the notebook\'s metadata `tfgpu.requirements.gpus` is -1; give a count from 0 to 1024, or "all"; nothing of it was applied',
        ),
        (
            {"version": 1, "requirements": {"gpus": 1, "min_free_bytes": "4G"}},
            'the notebook\'s metadata `tfgpu.requirements.min_free_bytes` is "4G"; give a whole number of bytes; nothing of it was applied',
        ),
        (
            {"version": 1, "requirements": {"gpus": 1, "min_compute_capability": 8}},
            'the notebook\'s metadata `tfgpu.requirements.min_compute_capability` is 8; give one such as "8.0"; nothing of it was applied',
        ),
        (
            {"version": 1, "requirements": {"min_free_bytes": 1}},
            "the notebook's metadata `tfgpu.requirements` asks for free memory or a compute capability of null GPUs; "
            'give "gpus" a count of at least 1; nothing of it was applied',
        ),
        (
            {"version": 1, "policy": "grow"},
            'the notebook\'s metadata `tfgpu.policy` is a string; give a list of %gpu setting lines, e.g. ["grow"]; nothing of it was applied',
        ),
        (
            {"version": 1, "policy": ["grow"] * 33},
            "the notebook's metadata `tfgpu.policy` has 33 lines; at most 32; nothing of it was applied",
        ),
    ],
)
def test_a_malformed_key_is_one_line_naming_the_key_and_the_fix(value, message):
    with pytest.raises(saved.SettingsError) as info:
        saved.read({"tfgpu": value})
    assert str(info.value) == message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "version": st.one_of(st.just(1), JSON),
        "requirements": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "gpus": st.one_of(st.integers(-2, 2000), st.just("all"), JSON),
                    "min_free_bytes": st.one_of(st.integers(-1, 2**60), JSON),
                    "min_compute_capability": st.one_of(st.sampled_from(["8.0", "7.5", "x", "10.0"]), JSON),
                },
            ),
            JSON,
        ),
        "policy": st.one_of(
            st.lists(st.sampled_from(["grow", "limit 4G", "use 1", "frob", "split 2", ""])), JSON
        ),
        "observed": JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(FIELDS, JSON))
def test_any_hand_edit_is_read_or_refused_in_one_line(value):
    """Whatever a hand (or a neighbour) writes under the key: settings, or one SettingsError line."""
    try:
        read = saved.read({"tfgpu": value})
    except saved.SettingsError as err:
        assert "\n" not in str(err) and str(err)
        return
    for _line, command, why in read.commands():
        assert (command is None) == (why is not None)
        assert why is None or "\n" not in why
    if read.requirements.gpus not in (None, 0, "all"):
        assert isinstance(read.requirements.use_command().gpus, grammar.Auto)


# -- what %gpu save records ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "plan, auto, requirements, policy",
    [
        (Plan(growth=True, limits=(4096,)), None, {}, ["grow", "limit 4096MiB"]),
        (
            Plan(visible=(1,), limits=(4096,)),
            grammar.Auto(1),
            {"gpus": 1, "min_free_bytes": 4 * GIB},
            ["limit 4096MiB"],
        ),
        (Plan(visible=(0, 2)), None, {"gpus": 2}, []),
        (
            Plan(visible=(3,)),
            grammar.Auto(1, 10 * GIB, 60.0, (8, 0)),
            {"gpus": 1, "min_free_bytes": 10 * GIB, "min_compute_capability": "8.0"},
            [],
        ),
        (Plan(visible="none"), None, {"gpus": 0}, []),
        (Plan(visible="all", allocator="async"), None, {"gpus": "all"}, ["allocator async"]),
        (Plan(visible=(1,), limits=(grammar.Percent(50),)), None, {"gpus": 1}, ["limit 50%"]),
        (
            Plan(visible=(1,), shares=(("tensorflow", 6144), ("jax", 2048))),
            None,
            {"gpus": 1, "min_free_bytes": 8 * GIB},
            ["limit 6144MiB tensorflow, 2048MiB jax"],
        ),
    ],
)
def test_save_keeps_requirements_and_policy_never_gpu_numbers(plan, auto, requirements, policy):
    kept = saved.settings_from_plan(plan, auto).as_json()
    assert kept == {"version": 1, "requirements": requirements, "policy": policy}
    again = saved.read({"tfgpu": kept})
    assert again.requirements.as_json() == requirements
    assert all(why is None for _, _, why in again.commands())
    replanned = Plan()
    for _, command, _ in again.commands():
        replanned = replanned.with_command(command)
    assert replanned.describe() == [line for line in plan.describe() if not line.startswith("use ")]


@pytest.mark.parametrize(
    "models, colab",
    [
        (["NVIDIA A100-SXM4-80GB"], {"gpuType": "A100"}),
        (["Tesla T4"], {"gpuType": "T4"}),
        (["NVIDIA H100 80GB HBM3"], {"gpuType": "H100"}),
        (["NVIDIA RTX A5000"], None),
        ([], None),
    ],
)
def test_colab_and_kaggle_keys_open_the_notebook_on_a_gpu(models, colab):
    keys = saved.accelerator_keys(saved.settings_from_plan(Plan(visible=(1,)), None), models)
    assert keys["accelerator"] == "GPU"
    assert keys["kaggle"] == {"accelerator": "gpu", "isGpuEnabled": True}
    assert keys.get("colab") == colab
    assert saved.accelerator_keys(saved.settings_from_plan(Plan(visible="none"), None), models) == {}


def test_merging_replaces_the_key_and_keeps_what_others_wrote():
    metadata = {"tfgpu": {"version": 1, "policy": ["grow"]}, "colab": {"provenance": []}, "kaggle": "odd"}
    update = {
        "tfgpu": {"version": 1, "policy": []},
        "colab": {"gpuType": "T4"},
        "kaggle": {"accelerator": "gpu"},
    }
    assert saved.merge_metadata(metadata, update) == {
        "tfgpu": {"version": 1, "policy": []},
        "colab": {"provenance": [], "gpuType": "T4"},
        "kaggle": {"accelerator": "gpu"},
    }
    assert metadata["colab"] == {"provenance": []}  # the caller's dict is not changed


def test_gpu_save_displays_the_keys_for_the_front_end_and_says_where(gpu, shell, monkeypatch):
    from IPython.utils.capture import capture_output

    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/train.ipynb")
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    gpu("use auto --min-free 8G")
    gpu("limit 4G")
    gpu("grow")
    with capture_output() as captured:
        gpu("save")
    (output,) = captured.outputs
    text, keys = output.data["text/plain"], output.data[saved.MIME_TYPE]
    assert text == (
        "Saved this notebook's GPU settings: needs 1 GPU with 8,192 MiB free; policy: grow, limit 4096MiB.\n"
        "tfgpu_magic's extension writes them into train.ipynb's metadata (`tfgpu`); save the notebook to keep them."
    )
    tfgpu = keys["tfgpu"]
    assert tfgpu["requirements"] == {"gpus": 1, "min_free_bytes": 8 * GIB}
    assert tfgpu["policy"] == ["grow", "limit 4096MiB"]
    observed = tfgpu["observed"]
    assert observed["by"] == "%gpu save"
    # GPU 1 of the simulated server: the freest, where this process holds 10 GiB (the driver's figure).
    assert observed["gpus"] == [
        {"index": 1, "model": "NVIDIA A100-SXM4-80GB", "total_bytes": 80 * GIB, "driver_bytes": 10 * GIB}
    ]
    assert keys["accelerator"] == "GPU" and keys["colab"] == {"gpuType": "A100"}
    assert saved.read(keys).requirements.gpus == 1  # what the front end writes reads back


def test_gpu_save_without_a_notebook_names_tfgpu_run(gpu, monkeypatch):
    from IPython.utils.capture import capture_output

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    with capture_output() as captured:
        gpu("save")
    assert (
        captured.outputs[0]
        .data["text/plain"]
        .endswith(
            "No notebook is open for this kernel, so they went nowhere: run the notebook with "
            "`tfgpu run NOTEBOOK`, which writes them into its output."
        )
    )


def test_naming_gpus_after_use_auto_forgets_its_floor(gpu):
    gpu("use auto --min-free 8G")
    assert gpu.session.auto_request == grammar.Auto(1, 8 * GIB)
    gpu("use 2")
    assert gpu.session.auto_request is None


# -- applied when the extension loads -----------------------------------------------------------------
def use(session, command, progress):
    return magics.use(session, command, progress)


def test_a_runners_settings_apply_before_any_cell(session):
    said = []
    env = {
        SETTINGS_ENV: json.dumps(
            {
                "version": 1,
                "requirements": {"gpus": 1, "min_free_bytes": 4 * GIB},
                "policy": ["grow", "limit 4G"],
            }
        )
    }
    record = apply_at_start(session, use, env, said.append)
    assert said == []
    assert record.met is True and record.applied == ("use auto --min-free 4G", "grow", "limit 4G")
    assert record.choice.startswith(
        "Chose GPU 1: the GPU with the most free memory with at least 4,096 MiB free"
    )
    assert session.env["CUDA_VISIBLE_DEVICES"] == "1" and session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert session.requested.limits == (4096,)
    assert session.claimed == (1,)
    assert session.notebook_record is record


def test_gpus_the_runner_claimed_are_used_not_chosen_again(session):
    env = {
        SETTINGS_ENV: json.dumps({"version": 1, "requirements": {"gpus": 1}, "policy": []}),
        CHOSEN_ENV: "2",
        RUNNER_ENV: "tfgpu run (pid 7)",
    }
    record = apply_at_start(session, use, env, print)
    assert record.choice == "GPU 2 chosen and claimed for this run by tfgpu run (pid 7)"
    assert session.env["CUDA_VISIBLE_DEVICES"] == "2"
    assert session.claimed == ()  # the runner holds the claim, for as long as the run lasts


def test_the_notebooks_own_file_is_read_when_jupyter_started_the_kernel(session, tmp_path):
    notebook = tmp_path / "train.ipynb"
    notebook.write_text(
        json.dumps(
            {
                "cells": [],
                "metadata": settings_of(policy=["allocator async"]),
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    record = apply_at_start(session, use, {"JPY_SESSION_NAME": str(notebook)}, print)
    assert record.source == "the notebook's metadata (train.ipynb)"
    assert record.applied == ("allocator async",) and record.met is None
    assert session.env["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"


def test_a_link_planted_as_the_notebook_is_not_followed(session, tmp_path):
    real = tmp_path / "someone_elses.ipynb"
    real.write_text(json.dumps({"metadata": settings_of(policy=["grow"])}))
    link = tmp_path / "mine.ipynb"
    link.symlink_to(real)
    assert apply_at_start(session, use, {"JPY_SESSION_NAME": str(link)}, print) is None
    assert session.requested == Plan()


@pytest.mark.parametrize("content", ["", "{not json", json.dumps([1, 2]), json.dumps({"metadata": "x"})])
def test_a_notebook_that_is_not_one_has_no_settings(session, tmp_path, content):
    notebook = tmp_path / "odd.ipynb"
    notebook.write_text(content)
    assert apply_at_start(session, use, {"JPY_SESSION_NAME": str(notebook)}, print) is None


def test_a_malformed_key_changes_nothing_and_says_one_line(session):
    said = []
    env = {SETTINGS_ENV: json.dumps({"version": 1, "policy": "grow"})}
    record = apply_at_start(session, use, env, said.append)
    assert said == [f"tfgpu_magic: {record.error}"] and "\n" not in said[0]
    assert session.requested == Plan() and session.env == {}


def test_a_bad_line_is_skipped_and_the_others_apply(session):
    env = {
        SETTINGS_ENV: json.dumps({"version": 1, "policy": ["grow", "use 3", "limit 999T", "allocator async"]})
    }
    said = []
    record = apply_at_start(session, use, env, said.append)
    assert record.applied == ("grow", "allocator async")
    assert [line for line, _ in record.not_applied] == ["use 3", "limit 999T"]
    assert said == [
        "tfgpu_magic: the notebook's setting 'use 3' was not applied: \"use\" is not a setting; "
        "the policy holds grow, limit, split, allocator, precision (and 1 more)"
    ]


def test_a_requirement_no_gpu_here_can_ever_meet_is_one_line_at_once(session):
    env = {
        SETTINGS_ENV: json.dumps(
            {"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 100 * GIB}, "policy": ["grow"]}
        )
    }
    said = []
    record = apply_at_start(session, use, env, said.append)
    assert record.met is False and record.applied == ("grow",)
    assert said == [
        "tfgpu_magic: the notebook needs 1 GPU with 100.0 GiB free, and no GPU here has 100.0 GiB in all "
        "(the largest is GPU 1, 80.0 GiB), so no wait would help; ask for less (`--min-free`, `%gpu limit`)"
    ]
    assert session.claimed == ()


def test_requirements_unmet_now_say_who_holds_the_gpus(session, server):
    """Every GPU with 30 GiB free is claimed by another live process: the notebook is told at once."""
    from tfgpu_magic.gpus import claims

    # GPU 1 is the only one with 30 GiB free; another process of mine claims it.
    holder = _claim_in_another_process(server.gpus[1].uuid)
    try:
        env = {
            SETTINGS_ENV: json.dumps({"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 30 * GIB}})
        }
        said = []
        record = apply_at_start(session, use, env, said.append)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert record.met is False
    assert said[0].startswith(
        "tfgpu_magic: the notebook needs 1 GPU with 30.0 GiB free, and no unclaimed GPU has 30.0 GiB free now"
    )
    assert said[0].endswith(
        "who holds the GPUs: GPU 0: alice 30.0 GiB; GPU 1: me 14.0 GiB, bob 8,192 MiB (claimed by pid "
        f"{holder.pid} ({_me()})); GPU 2: nobody; GPU 3: exited pid 41004 2,048 MiB"
    )
    assert claims.held() == set()


def _me():
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _claim_in_another_process(uuid):
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from tfgpu_magic.gpus import claims\n"
        f"assert claims.claim({uuid!r})\n"
        "print('claimed', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert process.stdout.readline().strip() == "claimed"
    return process


def test_status_says_where_the_settings_came_from(gpu, shell):
    env = {
        SETTINGS_ENV: json.dumps({"version": 1, "policy": ["grow", "frob"]}),
        RUNNER_ENV: "tfgpu run (pid 7)",
    }
    apply_at_start(gpu.session, use, env, lambda line: None)
    from tfgpu_magic.kernel import status

    report = status.build_report(gpu.session)
    assert report["notebook_settings"]["source"] == "tfgpu run (pid 7)"
    assert report["notebook_settings"]["applied"] == ["grow"]
    text = status.render_text(report)
    assert "Notebook:   from tfgpu run (pid 7): grow" in text
    assert "'frob' not applied: \"frob\" is not a setting" in text


def test_the_notice_is_said_under_the_first_cell_only(shell, session, monkeypatch):
    from IPython.utils.capture import capture_output

    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"version": 9}))
    loaded = magics.GpuMagics(shell, session=session)
    with capture_output():
        loaded.apply_notebook_settings()
    with capture_output() as first:
        shell.run_cell("1 + 1")
    with capture_output() as second:
        shell.run_cell("2 + 2")
    assert "version 9, written by a newer tfgpu_magic" in first.stdout
    assert "tfgpu_magic" not in second.stdout


def test_mib_constant_is_what_limits_are_saved_in():
    assert (
        saved.settings_from_plan(Plan(visible=(0,), limits=(1536,)), None).requirements.min_free_bytes
        == 1536 * MIB
    )


def test_record_notice_is_none_when_everything_held():
    assert notebook_settings.SettingsRecord("x", "1 GPU", True, "chose", ("use auto",)).notice() is None


# -- the JSON Schema others read: it agrees with the reader ----------------------------------------------
def _schema():
    from importlib.resources import files

    return json.loads(files("tfgpu_magic.command").joinpath("schema/notebook-settings.v1.json").read_text())


def test_everything_save_writes_is_valid_against_the_schema(gpu):
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    gpu("use auto:2 --min-free 4G --min-cc 8.0")
    gpu("limit 4G")
    _text, keys = notebook_settings.save(gpu.session, env={})
    validator.validate(keys["tfgpu"])


@settings(max_examples=400, deadline=None)
@given(value=FIELDS)
@example(
    {"version": 1, "requirements": {"gpus": 1024, "min_free_bytes": 2**53, "min_compute_capability": "10.0"}}
)
@example({"version": 1, "requirements": {"gpus": 1025}})
@example({"version": 1, "requirements": {"gpus": 11}, "policy": ["grow"] * 32})
@example({"version": 1, "policy": ["grow"] * 33})
@example({"version": 1, "policy": ["x" * 201]})
@example({"version": 1, "requirements": {"gpus": "all", "min_free_bytes": 1}})
@example({"version": 1, "requirements": {"gpus": 0, "min_compute_capability": "8.0"}})
@example({"version": 1, "requirements": {"gpus": 1, "bandwidth": 1}})
@example({"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 2**53 + 1}})
@example({"version": 2})
@example({"version": 1.0, "requirements": {"gpus": 2.0, "min_free_bytes": 1e9}})  # JSON's one number
@example({"version": 1.5})
def test_the_schema_and_the_reader_agree_on_every_key(value):
    """What the schema allows reads (its policy lines may still each be refused one by one); and,
    ``observed`` aside (information the reader keeps as written), what reads is what it allows."""
    import jsonschema

    valid = jsonschema.Draft202012Validator(_schema()).is_valid(value)
    try:
        saved.read({"tfgpu": value})
        read = True
    except saved.SettingsError:
        read = False
    if valid:
        assert read
    if "observed" not in value:
        assert read == valid


def test_a_load_ext_after_the_start_changes_nothing(shell, session, monkeypatch):
    """The kernel loaded the extension at its start (kernel.at_start); the notebook's own
    `%load_ext tfgpu_magic` cell must neither apply the settings again nor undo what came since."""
    from IPython.utils.capture import capture_output

    import tfgpu_magic
    from tfgpu_magic.kernel import at_start
    from tfgpu_magic.kernel import session as session_module

    monkeypatch.setattr(session_module, "_SESSION", session)
    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"version": 1, "policy": ["grow"]}))
    with capture_output():
        at_start.load_ipython_extension(shell)
    shell.run_line_magic("gpu", "grow off")
    with capture_output() as again:
        tfgpu_magic.load_ipython_extension(shell)
    assert again.stdout == "" and again.outputs == []
    assert session.requested.growth is False
    assert saved.KERNEL_ARGUMENT == "--InteractiveShellApp.extra_extensions=tfgpu_magic.kernel.at_start"


# -- a hostile notebook: whatever its file holds, the kernel starts and says at most one line ---------------
DEEP = 100_000  # far past any JSON parser's recursion limit


def _deep_settings() -> str:
    return '{"version": 1, "observed": {"x": ' + "[" * DEEP + "]" * DEEP + "}}"


def test_metadata_nested_too_deep_to_read_is_no_traceback_at_load_ext(shell, session, tmp_path, monkeypatch):
    """`%load_ext tfgpu_magic` in a notebook whose file nests its metadata past the parser's limit:
    the notebook has no settings this kernel can read, and the extension loads."""
    from tfgpu_magic.kernel import session as session_module

    notebook = tmp_path / "deep.ipynb"
    notebook.write_text('{"cells": [], "metadata": {"tfgpu": ' + _deep_settings() + "}}")
    monkeypatch.setattr(session_module, "_SESSION", session)
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook))
    assert apply_at_start(session, use, {"JPY_SESSION_NAME": str(notebook)}, print) is None
    magics.load(shell)
    assert session.loaded_into is shell and session.requested == Plan()


def test_a_runners_settings_nested_too_deep_are_one_line(session):
    said = []
    record = apply_at_start(session, use, {SETTINGS_ENV: _deep_settings()}, said.append)
    assert record.error is not None and said == [f"tfgpu_magic: {record.error}"] and "\n" not in said[0]
    assert session.requested == Plan()


def test_observed_nested_as_deep_as_the_parser_allows_is_one_line_or_read():
    """saved.read raises only SettingsError, however deep the parser let `observed` be: at the
    deepest the parser reads here, measuring `observed` (a few calls deeper) must not overflow."""
    value = None
    for depth in range(900, 3000):
        try:
            value = json.loads('{"version": 1, "observed": {"x": ' + "[" * depth + "]" * depth + "}}")
        except RecursionError:
            break
    assert value is not None
    try:
        saved.read({"tfgpu": value})
    except saved.SettingsError as err:
        assert "\n" not in str(err)


def test_the_notebooks_name_is_shown_escaped(gpu, session, monkeypatch, tmp_path):
    """A notebook's file name is chosen by whoever wrote the file (a shared folder): `%gpu save` and
    the record name it with its control characters escaped."""
    from IPython.utils.capture import capture_output

    name = str(tmp_path / "x\x1b]0;pwned\x07\u202e.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", name)
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    with capture_output() as captured:
        gpu("save")
    text = captured.outputs[0].data["text/plain"]
    assert "\x1b" not in text and "\u202e" not in text and "x\\x1b]0;pwned\\x07\\u202e.ipynb" in text
    with open(name, "w") as handle:
        json.dump({"metadata": settings_of(policy=["grow"])}, handle)
    record = apply_at_start(session, use, {"JPY_SESSION_NAME": name}, print)
    assert record.source == "the notebook's metadata (x\\x1b]0;pwned\\x07\\u202e.ipynb)"
