"""`tfgpu run NOTEBOOK` and papermill's `tfgpu` engine: a notebook run headless with its saved GPU
settings, on a simulated server that the runner and its kernel both read (a JSON file,
``TFGPU_MAGIC_SIMULATED_SOURCE=file:PATH``), with the test's own claim directory (conftest).

The in-process tests cover the flow's parts (settings, waiting and claiming, the kernel's
environment, what is written into the output); the `slow` ones run the command and papermill
with real kernels: the issue's scenarios, each exit status, and the claims released after a
success, a failed cell and Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tfgpu_magic.command import saved
from tfgpu_magic.command.units import GIB, MIB
from tfgpu_magic.gpus import claims, simulated
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.kernel.notebook_settings import CHOSEN_ENV, NOTEBOOK_ENV, RUNNER_ENV, SETTINGS_ENV
from tfgpu_magic.runner import flow, observing, run

from support.processes import run_python, start_python

ALICE, BOB = 4194305, 4194306  # above Linux's largest pid: no real process has them
UUIDS = [f"GPU-{i:08x}-file-0000-0000-{i:012x}" for i in range(2)]
SETTINGS = {
    "version": 1,
    "requirements": {"gpus": 1, "min_free_bytes": 4 * GIB},
    "policy": ["grow", "limit 4096MiB"],
}


# -- the simulated server and notebooks the tests run -------------------------------------------------
def write_server(path: Path, free_mib: tuple[int, int] = (10240, 81920), kernel_mib: int = 1536) -> Path:
    """Two GPUs (40 and 80 GiB), alice and bob using all but ``free_mib`` of them; written whole."""
    totals = (40960, 81920)
    gpus = [
        {
            "name": name,
            "total_mib": total,
            "processes": [{"pid": pid, "used_mib": total - free, "user": user}] if total > free else [],
        }
        for name, total, free, pid, user in zip(
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"),
            totals,
            free_mib,
            (ALICE, BOB),
            ("alice", "bob"),
            strict=True,
        )
    ]
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps({"gpus": gpus, "kernel_mib": kernel_mib}))
    os.replace(temporary, path)
    return path


@pytest.fixture
def file_server(tmp_path, monkeypatch):
    """The simulated server's file, named in this process's environment (and so in every runner's)."""
    path = write_server(tmp_path / "server.json")
    monkeypatch.setenv(simulated.SOURCE_ENV, f"file:{path}")
    return path


def notebook(path: Path, cells: list[str], tfgpu=None, tags: dict[int, list[str]] | None = None) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    for index, cell_tags in (tags or {}).items():
        nb.cells[index].metadata["tags"] = cell_tags
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if tfgpu is not None:
        nb.metadata["tfgpu"] = tfgpu
    nbformat.write(nb, path)
    return path


def lines_of(stderr: str) -> list[str]:
    """The runner's own lines (a kernel's warnings pass through the same stderr)."""
    return [
        line for line in stderr.splitlines() if line.startswith(("tfgpu run:", "tfgpu engine:", "Error:"))
    ]


def claim_files(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return sorted(
        p.name for p in directory.iterdir() if p.name.endswith(".lock") and p.name != claims.CHOOSE_LOCK
    )


def tfgpu_run(*args: str, timeout: int = 240):
    return run_python(["-m", "tfgpu_magic", "run", *args], timeout=timeout)


# -- the simulated server read from a file ---------------------------------------------------------------
def test_a_file_server_is_read_by_every_process_and_again_when_it_changes(file_server):
    nvml = Nvml(lib=simulated.from_environment())
    assert nvml.device_count() == 2 and nvml.uuid(1) == UUIDS[1]
    assert nvml.gpu(0).memory.free_bytes == 10240 * MIB
    write_server(file_server, free_mib=(1024, 2048))
    time.sleep(simulated.RELOAD_EVERY_S * 2)  # a reading looks at the file at most this often
    assert nvml.gpu(0).memory.free_bytes == 1024 * MIB
    assert nvml.processes(1)[0].pid == BOB


def test_a_file_that_cannot_be_read_makes_nvml_unavailable_saying_why(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for name in ("missing.json", "bad.json"):
        nvml = Nvml(lib=simulated.from_environment({simulated.SOURCE_ENV: f"file:{tmp_path / name}"}))
        assert not nvml.available()
        with pytest.raises(Exception, match=f"the simulated server's file {tmp_path / name} "):
            nvml.device_count()


@pytest.mark.timeout(60)  # the safety net: a reader that blocks on the FIFO fails here, not hangs
@pytest.mark.parametrize(
    "content",
    [
        '{"gpus": [{"compute_capability": "8"}]}',
        '{"gpus": [{"total_mib": 1e400}]}',
        '{"gpus": [{"processes": [{"pid": 1e400}]}]}',
        '{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "fifo",
    ],
)
def test_any_file_is_a_server_or_nvml_unavailable_saying_why(tmp_path, content):
    """Whatever the file holds (or is: a FIFO would block every reader), NVML is unavailable with
    the one line, never an exception out of the reading."""
    path = tmp_path / "server.json"
    if content == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(content)
    nvml = Nvml(lib=simulated.from_environment({simulated.SOURCE_ENV: f"file:{path}"}))
    assert not nvml.available()
    with pytest.raises(Exception, match=f"the simulated server's file {path} ") as info:
        nvml.device_count()
    assert "\n" not in str(info.value)


def test_a_file_replaced_by_a_fifo_later_keeps_the_last_good_server(file_server):
    nvml = Nvml(lib=simulated.from_environment())
    assert nvml.device_count() == 2
    file_server.unlink()
    os.mkfifo(file_server)
    time.sleep(simulated.RELOAD_EVERY_S * 2)  # a reading looks at the file at most this often
    assert nvml.gpu(0).memory.free_bytes == 10240 * MIB


def test_an_unknown_source_is_the_real_driver_and_imports_nothing():
    assert simulated.from_environment({simulated.SOURCE_ENV: "os:system"}) is None
    assert simulated.from_environment({simulated.SOURCE_ENV: "file:"}) is None


# -- the flow's parts, in this process -----------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [{"version": 1, "policy": "grow"}, {"version": "1"}, {"version": 1, "requirements": {"gpus": -1}}],
)
def test_malformed_metadata_is_exit_2_with_the_readers_one_line(value):
    with pytest.raises(flow.RunError) as info:
        flow.read_settings({"tfgpu": value})
    assert info.value.status == flow.EXIT_USAGE
    with pytest.raises(saved.SettingsError) as same:
        saved.read({"tfgpu": value})
    assert str(info.value) == str(same.value) and "\n" not in str(info.value)


def test_the_wait_reads_durations_and_refuses_others():
    assert flow.parse_wait("5s") == 5 and flow.parse_wait("10m") == 600 and flow.parse_wait(None) is None
    with pytest.raises(flow.RunError, match=r"--wait 'soon' is not a duration") as info:
        flow.parse_wait("soon")
    assert info.value.status == 2


def test_the_kernels_environment_names_this_run_and_nothing_inherited():
    inherited = {
        "PATH": "/bin",
        SETTINGS_ENV: "{}",
        CHOSEN_ENV: "3",
        RUNNER_ENV: "tfgpu run (pid 1)",
        NOTEBOOK_ENV: "/home/me/other.ipynb",  # `!tfgpu run` from a JupyterLab kernel: not this notebook
    }
    settings = saved.read({"tfgpu": SETTINGS})
    env = flow.kernel_environment(inherited, settings, (1,), "tfgpu run (pid 9)")
    assert env["PATH"] == "/bin" and NOTEBOOK_ENV not in env
    assert json.loads(env[SETTINGS_ENV]) == SETTINGS
    assert env[CHOSEN_ENV] == "1" and env[RUNNER_ENV] == "tfgpu run (pid 9)"
    bare = flow.kernel_environment(inherited, None, (), "tfgpu run (pid 9)")
    assert SETTINGS_ENV not in bare and CHOSEN_ENV not in bare


def test_the_kernel_is_given_the_settings_it_applies_not_what_was_observed():
    depth = 900  # as deep as the runner's parser reads; the kernel's may refuse it
    observed = json.loads('{"x": ' + "[" * depth + "]" * depth + "}")
    settings = saved.read({"tfgpu": {**SETTINGS, "observed": observed}})
    env = flow.kernel_environment({}, settings, (1,), "tfgpu run (pid 9)")
    assert json.loads(env[SETTINGS_ENV]) == SETTINGS


def test_the_gpus_are_claimed_for_the_run_and_released_after_it(file_server, claim_dir):
    said = []
    with flow.prepared(
        {"tfgpu": SETTINGS}, wait_s=None, say=said.append, runner="test", how_to_wait="wait"
    ) as ready:
        assert ready.chosen == (1,)  # GPU 0 has 10 GiB free, GPU 1 80 GiB
        assert claims.held() == {UUIDS[1]}
        assert ready.extra_arguments == ["--InteractiveShellApp.extra_extensions=tfgpu_magic.kernel.at_start"]
    assert claims.held() == set() and claim_files(claim_dir) == []
    assert said[0] == "the notebook needs 1 GPU with 4,096 MiB free"
    assert said[1].startswith("Chose GPU 1: ") and said[1].endswith("claimed for this run")


def test_the_claims_are_released_when_the_run_fails(file_server, claim_dir):
    with pytest.raises(RuntimeError, match="a cell"):
        with flow.prepared(
            {"tfgpu": SETTINGS}, wait_s=None, say=lambda line: None, runner="test", how_to_wait="wait"
        ):
            assert claim_files(claim_dir) != []
            raise RuntimeError("a cell")
    assert claims.held() == set() and claim_files(claim_dir) == []


def test_a_claim_held_before_the_run_is_kept(file_server):
    """Only the run's own claims are released: a kernel running papermill keeps its `%gpu use auto`."""
    assert claims.claim(UUIDS[0])
    with flow.prepared(
        {"tfgpu": SETTINGS}, wait_s=None, say=lambda line: None, runner="test", how_to_wait="wait"
    ):
        pass
    assert claims.held() == {UUIDS[0]}


def test_no_gpu_within_the_wait_is_exit_3_saying_what_it_waited_for_and_who_holds_them(file_server):
    write_server(file_server, free_mib=(1024, 2048))
    said = []
    with pytest.raises(flow.RunError) as info:
        with flow.prepared({"tfgpu": SETTINGS}, wait_s=1, say=said.append, runner="test", how_to_wait="wait"):
            pass
    assert info.value.status == flow.EXIT_NO_GPU
    assert said[0] == "the notebook needs 1 GPU with 4,096 MiB free; waiting up to 1s"
    assert said[1].startswith(
        "Waiting: no unclaimed GPU has 4,096 MiB free (the most free is 2,048 MiB, on GPU 1)"
    )
    assert "(Ctrl-C to stop); who holds the GPUs: GPU 0: alice 39.0 GiB; GPU 1: bob 78.0 GiB" in said[1]
    assert str(info.value).startswith(
        "the notebook needs 1 GPU with 4,096 MiB free, and no unclaimed GPU has 4,096 MiB free after waiting 1s"
    )
    assert str(info.value).endswith("who holds the GPUs: GPU 0: alice 39.0 GiB; GPU 1: bob 78.0 GiB")
    assert "wait longer (e.g. `--wait 30m`) or ask for less free memory" in str(info.value)
    assert claims.held() == set()


def test_a_wait_that_ran_out_names_the_runners_own_way_to_wait_longer(file_server):
    """papermill's command line has no --wait: its engine's advice is its environment variable."""
    write_server(file_server, free_mib=(1024, 2048))
    with pytest.raises(flow.RunError) as info:
        with flow.prepared(
            {"tfgpu": SETTINGS},
            wait_s=0.1,
            say=lambda line: None,
            runner="test",
            how_to_wait="wait",
            how_to_wait_longer="`TFGPU_MAGIC_WAIT=30m`",
        ):
            pass
    assert "wait longer (e.g. `TFGPU_MAGIC_WAIT=30m`) or ask" in str(info.value)
    assert "--wait" not in str(info.value)


def test_without_a_wait_the_advice_is_the_runners_own(file_server):
    write_server(file_server, free_mib=(1024, 2048))
    with pytest.raises(flow.RunError) as info:
        with flow.prepared(
            {"tfgpu": SETTINGS},
            wait_s=None,
            say=lambda line: None,
            runner="test",
            how_to_wait="add --wait 10m",
        ):
            pass
    assert info.value.status == flow.EXIT_NO_GPU
    assert "free now (the most free is 2,048 MiB, on GPU 1); add --wait 10m; who holds the GPUs: " in str(
        info.value
    )


def test_a_requirement_no_gpu_here_can_meet_is_exit_3_at_once(file_server):
    too_much = {"version": 1, "requirements": {"gpus": 1, "min_free_bytes": 100 * GIB}}
    started = time.monotonic()
    with pytest.raises(flow.RunError, match=r"no GPU here has 100\.0 GiB in all") as info:
        with flow.prepared(
            {"tfgpu": too_much}, wait_s=600, say=lambda line: None, runner="test", how_to_wait="wait"
        ):
            pass
    assert info.value.status == flow.EXIT_NO_GPU
    assert time.monotonic() - started < 60  # a safety net: it did not wait the 10 minutes


def test_a_policy_line_that_cannot_apply_is_said_and_the_run_goes_on(file_server):
    said = []
    metadata = {"tfgpu": {"version": 1, "policy": ["grow", "frob 3"]}}
    with flow.prepared(metadata, wait_s=None, say=said.append, runner="test", how_to_wait="wait") as ready:
        assert json.loads(ready.env[SETTINGS_ENV])["policy"] == [
            "grow",
            "frob 3",
        ]  # the kernel skips it itself
    assert said == [
        "the notebook's setting 'frob 3' will not be applied: \"frob\" is not a setting; "
        "the policy holds grow, limit, split, allocator, precision"
    ]


def test_a_notebook_without_requirements_claims_nothing(file_server):
    for metadata in (
        {},
        {"tfgpu": {"version": 1, "policy": ["grow"]}},
        {"tfgpu": {"version": 1, "requirements": {"gpus": "all"}}},
    ):
        with flow.prepared(
            metadata, wait_s=None, say=lambda line: None, runner="test", how_to_wait="wait"
        ) as ready:
            assert ready.chosen == () and claims.held() == set()


# -- what the output notebook gets ------------------------------------------------------------------
def _save_output(keys: dict) -> dict:
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {"text/plain": "Saved", saved.MIME_TYPE: keys},
    }


def test_every_save_is_written_in_order_and_the_last_one_wins():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%gpu save") for _ in range(3)])
    nb.metadata["colab"] = {"provenance": []}
    first = {"tfgpu": {"version": 1, "policy": ["grow"]}, "accelerator": "GPU", "colab": {"gpuType": "T4"}}
    second = {"tfgpu": {"version": 1, "policy": ["limit 4096MiB"]}, "kernelspec": {"name": "evil"}}
    broken = {"tfgpu": {"version": "x"}}
    for cell, keys in zip(nb.cells, (first, second, broken), strict=True):
        cell.outputs = [nbformat.from_dict(_save_output(keys))]
    assert observing.write_saved_keys(nb) == 2
    assert nb.metadata["tfgpu"] == {"version": 1, "policy": ["limit 4096MiB"]}
    assert nb.metadata["colab"] == {
        "provenance": [],
        "gpuType": "T4",
    }  # merged one level, as the front end does
    assert nb.metadata["accelerator"] == "GPU" and "kernelspec" not in nb.metadata  # only %gpu save's keys


def test_an_output_without_the_settings_key_writes_nothing_as_the_front_end_ignores_it():
    """An output under the MIME type with Colab's or Kaggle's keys alone is not %gpu save's:
    js/lab/settings.ts (readUpdate) writes nothing for it, and neither does the runner."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.metadata["accelerator"] = "GPU"
    nb.cells[0].outputs = [
        nbformat.from_dict(_save_output({"accelerator": "TPU", "colab": {"gpuType": "x"}}))
    ]
    assert observing.write_saved_keys(nb) == 0
    assert nb.metadata["accelerator"] == "GPU" and "colab" not in nb.metadata


def test_observed_joins_the_kernels_record_and_the_drivers_peaks():
    watch = observing.Watch(Nvml(lib=simulated.shared_server()), by="tfgpu run")
    watch.kernel = {
        "by": "tfgpu run",
        "allocator_peak_bytes": {"torch": {"cuda:0": 3 * GIB}},
        "gpus": [
            {"index": 1, "model": "NVIDIA A100-SXM4-80GB", "total_bytes": 80 * GIB, "driver_bytes": GIB}
        ],
    }
    watch.driver_peaks = {1: 5 * GIB, 2: GIB}
    observed = watch.observed()
    assert observed["allocator_peak_bytes"] == {"torch": {"cuda:0": 3 * GIB}}
    assert [(g["index"], g["model"], g["driver_peak_bytes"]) for g in observed["gpus"]] == [
        (1, "NVIDIA A100-SXM4-80GB", 5 * GIB),
        (2, "NVIDIA RTX A5000", GIB),  # a GPU only the driver saw the kernel on
    ]
    assert "not measured" in observed["driver"]  # no sample was taken here


def test_observed_without_the_kernels_record_says_why():
    watch = observing.Watch(Nvml(lib=simulated.shared_server()), by="tfgpu run")
    watch.why_not = "the kernel could not say (ModuleNotFoundError: No module named 'tfgpu_magic')"
    observed = watch.observed()
    assert observed["allocator_peak_bytes"] == {} and observed["gpus"] == []
    assert observed["allocator_note"] == f"no allocator peaks: {watch.why_not}"


def test_the_driver_peak_is_the_most_the_process_tree_held():
    lib = simulated.shared_server(my_pid=os.getpid())  # this process holds 10 GiB on GPU 1
    peaks = observing.DriverPeaks(Nvml(lib=lib), os.getpid())
    peaks.sample()
    lib.gpus[1].processes[0].used_mib = 4096  # it gave memory back: the peak stays
    assert peaks.stop() == {1: 10 * GIB} and peaks.samples == 2


def test_a_notebook_without_the_key_gets_none_written():
    nb = nbformat.v4.new_notebook()
    assert observing.write_observed(nb, observing.Watch(Nvml(lib=simulated.shared_server()), by="x")) is False
    assert "tfgpu" not in nb.metadata


# -- the command's arguments, in this process (no kernel starts) ---------------------------------------
def test_malformed_metadata_stops_the_run_with_one_line(tmp_path, capsys):
    path = notebook(tmp_path / "bad.ipynb", ["1"], tfgpu={"version": 1, "policy": "grow"})
    assert run.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "tfgpu run: the notebook's metadata `tfgpu.policy` is a string; give a list of %gpu setting lines, "
        'e.g. ["grow"]; nothing of it was applied; no output written (exit 2)'
    ]
    assert not (tmp_path / "bad.out.ipynb").exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["missing.ipynb"],
            "tfgpu run: cannot read missing.ipynb (No such file or directory); no output written (exit 2)",
        ),
        (
            ["nb.ipynb", "--wait", "soon"],
            "tfgpu run: --wait 'soon' is not a duration (like 30s, 10m, 1h); no output written (exit 2)",
        ),
        (
            ["nb.ipynb", "-o", "nowhere/out.ipynb"],
            "tfgpu run: the output's folder nowhere does not exist; no output written (exit 2)",
        ),
        (
            ["text.ipynb"],
            "tfgpu run: text.ipynb is not a notebook (Notebook does not appear to be JSON: 'hello'); no output written (exit 2)",
        ),
    ],
)
def test_bad_arguments_are_exit_2_in_one_line(tmp_path, monkeypatch, capsys, args, line):
    monkeypatch.chdir(tmp_path)
    notebook(tmp_path / "nb.ipynb", ["1"])
    (tmp_path / "text.ipynb").write_text("hello")
    assert run.main(args) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_without_nbclient_the_run_is_exit_2_with_the_install_line(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nbclient" else real(name, *a)
    )
    assert run.main([str(notebook(tmp_path / "nb.ipynb", ["1"]))]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tfgpu run: needs nbclient, which is not installed: pip install nbclient ipykernel; "
        "no output written (exit 2)"
    ]


def test_a_kernel_that_does_not_exist_is_exit_2(tmp_path, capsys):
    assert run.main([str(notebook(tmp_path / "nb.ipynb", ["1"])), "-k", "no-such-kernel"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tfgpu run: no kernel named 'no-such-kernel' (`jupyter kernelspec list` lists them; -k names one); "
        "no output written (exit 2)"
    )


def test_argparse_errors_are_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        run.main(["--wait"])
    assert info.value.code == 2


def test_parameters_without_papermill_are_exit_2_with_the_install_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "papermill.parameterize", None)  # as if papermill were not installed
    path = notebook(tmp_path / "nb.ipynb", ["1"])
    assert run.main([str(path), "-p", "alpha", "1"]) == 2
    assert "-p needs papermill, which is not installed: pip install papermill" in capsys.readouterr().err


def test_tfgpu_dispatches_run_and_its_help_names_it(capsys):
    from tfgpu_magic.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "tfgpu run NOTEBOOK" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0 and "usage: tfgpu run" in capsys.readouterr().out


def test_the_engine_is_declared_and_its_errors_are_one_line_for_papermills_command_line():
    import click
    from papermill.exceptions import PapermillException

    from tfgpu_magic.runner import engine

    project = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    section = project.split('[project.entry-points."papermill.engine"]\n')[1].split("\n\n")[0]
    assert section.splitlines() == ['tfgpu = "tfgpu_magic.runner.engine:TfgpuEngine"']
    error = engine.NoGpuError("tfgpu engine: no GPU")
    assert isinstance(error, PapermillException) and isinstance(error, click.ClickException)
    assert (engine.MetadataError("x").exit_code, error.exit_code) == (2, 3)


def _schema_errors(value: dict) -> list[str]:
    """What the shipped JSON Schema of the key finds wrong with ``value``."""
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("tfgpu_magic.command").joinpath("schema/notebook-settings.v1.json").read_text())
    return [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(value)]


def test_what_a_run_observes_is_valid_against_the_schema():
    watch = observing.Watch(Nvml(lib=simulated.shared_server()), by="tfgpu run")
    watch.why_not = "the kernel did not answer (TimeoutError)"
    watch.driver_peaks = {1: 5 * GIB}
    assert _schema_errors({**SETTINGS, "observed": watch.observed()}) == []


# -- the command and papermill, with real kernels --------------------------------------------------------
SAVE_CELLS = ["%load_ext tfgpu_magic", "%gpu limit 4G", "%gpu grow", "%gpu save"]
FIRST_CELL = (
    "import os, json\n"
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('CUDA_', 'TF_', 'XLA_'))}))\n"
    "%gpu status --json"
)


def _first_cell_saw(nb) -> tuple[dict, dict]:
    """The first cell's environment line and `%gpu status --json` (nbclient joins the two prints)."""
    text = "".join(output.text for output in nb.cells[0].outputs if output.get("name") == "stdout")
    env, status = text.split("\n", 1)
    return json.loads(env), json.loads(status)


@pytest.mark.slow
def test_a_notebook_saved_by_its_cells_comes_out_with_the_request_and_the_peaks(
    file_server, tmp_path, claim_dir
):
    path = notebook(tmp_path / "train.ipynb", SAVE_CELLS)
    done = tfgpu_run(str(path))
    assert done.returncode == 0, done.stderr
    assert (
        lines_of(done.stderr)[-1]
        == f"tfgpu run: wrote {tmp_path / 'train.out.ipynb'}: done, 4 cells (exit 0)"
    )
    out = nbformat.read(tmp_path / "train.out.ipynb", as_version=4)
    # The kernel loaded the extension as it started: the notebook's own %load_ext adds nothing,
    # not even IPython's "already loaded" lines.
    assert out.cells[0].outputs == []
    metadata = out.metadata
    assert metadata["tfgpu"]["policy"] == ["grow", "limit 4096MiB"]
    assert metadata["tfgpu"]["requirements"] == {}
    assert metadata["accelerator"] == "GPU" and metadata["colab"] == {"gpuType": "A100"}
    observed = metadata["tfgpu"]["observed"]
    assert observed["by"] == "tfgpu run" and observed["allocator_peak_bytes"] == {}
    # No GPU was chosen, so the kernel saw both; the file server's rule puts its 1,536 MiB on GPU 0.
    assert [(g["index"], g["model"], g["driver_peak_bytes"]) for g in observed["gpus"]] == [
        (0, "NVIDIA A100-SXM4-40GB", 1536 * MIB),
        (1, "NVIDIA A100-SXM4-80GB", None),
    ]
    assert "sampled by tfgpu run every 0.5 s" in observed["driver"]
    assert saved.read(metadata).policy == ("grow", "limit 4096MiB")  # it reads back
    assert _schema_errors(metadata["tfgpu"]) == []
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_the_settings_are_in_force_before_the_first_cell_under_tfgpu_run(file_server, tmp_path, claim_dir):
    path = notebook(tmp_path / "train.ipynb", [FIRST_CELL], tfgpu=SETTINGS)
    done = tfgpu_run(str(path), "-o", str(tmp_path / "out.ipynb"))
    assert done.returncode == 0, done.stderr
    said = lines_of(done.stderr)
    assert said[0] == "tfgpu run: the notebook needs 1 GPU with 4,096 MiB free"
    assert said[1].startswith("tfgpu run: Chose GPU 1: ")
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    env, status = _first_cell_saw(out)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert status["requested"] == ["use 1", "grow", "limit 4096MiB"]
    record = status["notebook_settings"]
    assert record["source"].startswith("tfgpu run (pid ") and record["met"] is True
    assert record["applied"] == ["use auto --min-free 4G", "grow", "limit 4096MiB"]
    gpus = {gpu["index"]: gpu for gpu in status["gpus"]}
    assert gpus[1]["claim"]["pid"] == int(record["source"].split("pid ")[1].rstrip(")"))  # the runner's claim
    observed = out.metadata["tfgpu"]["observed"]  # no %gpu save ran: the key is kept, observed updated
    assert out.metadata["tfgpu"]["policy"] == SETTINGS["policy"]
    assert [(g["index"], g["driver_peak_bytes"]) for g in observed["gpus"]] == [(1, 1536 * MIB)]
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_the_notebooks_own_use_auto_cell_keeps_the_gpu_the_runner_chose(file_server, tmp_path, claim_dir):
    """The documented workflow: `%gpu use auto --min-free 4G` in the notebook, `%gpu save`, then
    `tfgpu run`. Only GPU 1 has 4 GiB free; the runner claims it for the run, and the notebook's own
    cell must find it (as a kernel JupyterLab started finds its own start-time claim), not fail."""
    write_server(file_server, free_mib=(1024, 81920))
    path = notebook(
        tmp_path / "train.ipynb", ["%load_ext tfgpu_magic", "%gpu use auto --min-free 4G"], tfgpu=SETTINGS
    )
    done = tfgpu_run(str(path), "-o", str(tmp_path / "out.ipynb"))
    assert done.returncode == 0, lines_of(done.stderr)
    said = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[1].outputs[0].text
    assert said.startswith("Chose GPU 1:") and "the process that started this kernel" in said
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_the_settings_are_in_force_before_the_first_cell_under_papermills_engine(
    file_server, tmp_path, claim_dir, kernel_env
):
    import papermill
    from papermill.engines import papermill_engines

    from tfgpu_magic.runner.engine import TfgpuEngine

    papermill_engines.register("tfgpu", TfgpuEngine)  # the entry point, once the package is installed
    path = notebook(tmp_path / "train.ipynb", [FIRST_CELL], tfgpu=SETTINGS)
    papermill.execute_notebook(
        str(path), str(tmp_path / "out.ipynb"), engine_name="tfgpu", progress_bar=False
    )
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    env, status = _first_cell_saw(out)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert status["requested"] == ["use 1", "grow", "limit 4096MiB"]
    assert status["notebook_settings"]["source"] == f"papermill --engine tfgpu (pid {os.getpid()})"
    observed = out.metadata["tfgpu"]["observed"]
    assert observed["by"] == "papermill --engine tfgpu"
    assert [(g["index"], g["driver_peak_bytes"]) for g in observed["gpus"]] == [(1, 1536 * MIB)]
    assert claims.held() == set() and claim_files(claim_dir) == []


PAPERMILL_CLI = (
    "import sys\n"
    "from papermill.engines import papermill_engines\n"
    "from tfgpu_magic.runner.engine import TfgpuEngine\n"
    "papermill_engines.register('tfgpu', TfgpuEngine)\n"
    "from papermill.cli import papermill\n"
    "papermill(sys.argv[1:])\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "tfgpu, status, line",
    [
        (
            {"version": 1, "policy": "grow"},
            2,
            "Error: tfgpu engine: the notebook's metadata `tfgpu.policy` is a string; give a list of %gpu "
            'setting lines, e.g. ["grow"]; nothing of it was applied',
        ),
        (
            SETTINGS,
            3,
            "Error: tfgpu engine: the notebook needs 1 GPU with 4,096 MiB free, and no unclaimed GPU",
        ),
    ],
)
def test_papermills_command_line_says_one_line_not_a_traceback(file_server, tmp_path, tfgpu, status, line):
    write_server(file_server, free_mib=(1024, 2048))
    path = notebook(tmp_path / "train.ipynb", ["1"], tfgpu=tfgpu)
    done = run_python(
        ["-c", PAPERMILL_CLI, "--engine", "tfgpu", str(path), str(tmp_path / "out.ipynb")],
        env={"TFGPU_MAGIC_WAIT": "1s"},
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    error = next(text for text in lines_of(done.stderr) if text.startswith("Error:"))
    assert error.startswith(line)
    assert "--wait" not in error  # papermill has no such option; a wait is TFGPU_MAGIC_WAIT


@pytest.mark.slow
def test_no_gpu_with_enough_free_memory_within_the_wait_is_exit_3(file_server, tmp_path, claim_dir):
    write_server(file_server, free_mib=(1024, 2048))
    path = notebook(tmp_path / "train.ipynb", ["%gpu status"], tfgpu=SETTINGS)
    done = tfgpu_run(str(path), "--wait", "2s")
    assert done.returncode == 3, done.stderr
    said = lines_of(done.stderr)
    assert said[0] == "tfgpu run: the notebook needs 1 GPU with 4,096 MiB free; waiting up to 2s"
    assert said[1].startswith("tfgpu run: Waiting: no unclaimed GPU has 4,096 MiB free")
    assert said[1].endswith("who holds the GPUs: GPU 0: alice 39.0 GiB; GPU 1: bob 78.0 GiB")
    assert "after waiting 2s" in said[-1] and said[-1].endswith("no output written (exit 3)")
    assert not (tmp_path / "train.out.ipynb").exists() and claim_files(claim_dir) == []


def _claim_in_another_process(uuid: str):
    code = (
        "import sys, time\n"
        "from tfgpu_magic.gpus import claims\n"
        f"assert claims.claim({uuid!r})\n"
        "print('claimed', flush=True)\n"
        "time.sleep(120)\n"
    )
    process = start_python(["-c", code])
    assert process.stdout.readline().strip() == "claimed", process.stderr.read()
    return process


@pytest.mark.slow
def test_every_gpu_claimed_by_another_live_process_is_exit_3_naming_the_claims(file_server, tmp_path):
    holders = [_claim_in_another_process(uuid) for uuid in UUIDS]
    try:
        path = notebook(tmp_path / "train.ipynb", ["1"], tfgpu=SETTINGS)
        done = tfgpu_run(str(path), "--wait", "1s")
    finally:
        for holder in holders:
            holder.kill()
            holder.communicate()
    assert done.returncode == 3, done.stderr
    last = lines_of(done.stderr)[-1]
    assert "no unclaimed GPU has 4,096 MiB free after waiting 1s" in last
    for index, holder in enumerate(holders):
        assert f"GPU {index}: " in last and f"(claimed by pid {holder.pid} (" in last


def _wait_for_line(process, start: str, limit_s: float = 120) -> list[str]:
    """The runner's stderr lines up to the first that starts with ``start``."""
    seen = []
    deadline = time.monotonic() + limit_s  # a safety net, not a timing
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if line.startswith(start):
            return seen
    raise AssertionError(f"no line starting {start!r}: {seen}")


@pytest.mark.slow
def test_a_gpu_freed_within_the_wait_runs_the_notebook(file_server, tmp_path, claim_dir):
    write_server(file_server, free_mib=(1024, 2048))
    path = notebook(tmp_path / "train.ipynb", ["print('ran')"], tfgpu=SETTINGS)
    runner = start_python(["-m", "tfgpu_magic", "run", str(path), "--wait", "5m"])
    try:
        _wait_for_line(runner, "tfgpu run: Waiting:")
        write_server(file_server, free_mib=(1024, 8192))  # bob's job ends: GPU 1 has 8 GiB free
        _, stderr = runner.communicate(timeout=240)
    finally:
        runner.kill()
    assert runner.returncode == 0, stderr
    assert any(line.startswith("tfgpu run: Chose GPU 1: ") for line in lines_of(stderr))
    out = nbformat.read(tmp_path / "train.out.ipynb", as_version=4)
    assert out.cells[0].outputs[0].text == "ran\n"
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_a_failed_cell_is_exit_1_with_its_error_in_the_output_and_the_claims_released(
    file_server, tmp_path, claim_dir
):
    path = notebook(tmp_path / "train.ipynb", ["x = 1", "1 / 0", "print('never')"], tfgpu=SETTINGS)
    done = tfgpu_run(str(path))
    assert done.returncode == 1, done.stderr
    assert lines_of(done.stderr)[-1] == (
        f"tfgpu run: wrote {tmp_path / 'train.out.ipynb'}: cell 2 failed "
        "(ZeroDivisionError: division by zero) (exit 1)"
    )
    out = nbformat.read(tmp_path / "train.out.ipynb", as_version=4)
    assert out.cells[1].outputs[0].ename == "ZeroDivisionError" and out.cells[2].outputs == []
    assert out.metadata["tfgpu"]["observed"]["gpus"][0]["index"] == 1  # observed, even so
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_ctrl_c_during_a_cell_is_exit_130_with_the_claims_released(file_server, tmp_path, claim_dir):
    marker = tmp_path / "running"
    cell = f"open({str(marker)!r}, 'w').close()\nimport time\ntime.sleep(300)"
    path = notebook(tmp_path / "train.ipynb", [cell], tfgpu=SETTINGS)
    runner = start_python(["-m", "tfgpu_magic", "run", str(path)])
    try:
        deadline = time.monotonic() + 120  # a safety net
        while not marker.exists() and runner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists() and claim_files(claim_dir) != []  # running, with its GPU claimed
        runner.send_signal(signal.SIGINT)
        _, stderr = runner.communicate(timeout=120)
    finally:
        runner.kill()
    assert runner.returncode == 130, stderr
    assert lines_of(stderr)[-1].startswith("tfgpu run: interrupted; the claims are released; wrote ")
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_ctrl_c_while_waiting_is_exit_130(file_server, tmp_path, claim_dir):
    write_server(file_server, free_mib=(1024, 2048))
    path = notebook(tmp_path / "train.ipynb", ["1"], tfgpu=SETTINGS)
    runner = start_python(["-m", "tfgpu_magic", "run", str(path), "--wait", "10m"])
    try:
        _wait_for_line(runner, "tfgpu run: Waiting:")
        runner.send_signal(signal.SIGINT)
        _, stderr = runner.communicate(timeout=120)
    finally:
        runner.kill()
    assert runner.returncode == 130, stderr
    assert lines_of(stderr)[-1] == (
        "tfgpu run: stopped waiting (interrupted); no GPU was chosen or claimed; no output written (exit 130)"
    )
    assert claim_files(claim_dir) == []


@pytest.mark.slow
def test_parameters_reach_the_notebook(file_server, tmp_path):
    path = notebook(tmp_path / "train.ipynb", ["alpha = 1", "print(alpha * 2)"], tags={0: ["parameters"]})
    done = tfgpu_run(str(path), "-p", "alpha", "21")
    assert done.returncode == 0, done.stderr
    out = nbformat.read(tmp_path / "train.out.ipynb", as_version=4)
    assert out.cells[-1].outputs[0].text == "42\n"


# -- a careless or hostile caller: every bad input is one line, exit 2, before any kernel starts ----------
@pytest.mark.parametrize(
    "kernelspec, line",
    [
        ("python3", "the notebook's metadata `kernelspec` is not an object; give -k KERNEL"),
        (["python3"], "the notebook's metadata `kernelspec` is not an object; give -k KERNEL"),
        ({"name": 5}, "the notebook's metadata `kernelspec.name` is not a kernel's name; give -k KERNEL"),
        ({"name": "\x1b]0;pwned\x07"}, None),  # a string: looked up, and refused as a missing kernel
    ],
)
def test_an_odd_kernelspec_is_one_line(tmp_path, capsys, kernelspec, line):
    path = notebook(tmp_path / "nb.ipynb", ["1"])
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = kernelspec
    nbformat.write(nb, path)
    assert run.main([str(path)]) == 2
    said = capsys.readouterr().err.splitlines()
    assert len([s for s in said if s.startswith("tfgpu run:")]) == 1
    assert "\x1b" not in "".join(said)
    if line is not None:
        assert said == [f"tfgpu run: {line}; no output written (exit 2)"]


def test_a_fractional_timeout_is_whole_seconds_rounded_up():
    assert run.timeout_of(None) is None and run.timeout_of("1.5") == 2 and run.timeout_of("60") == 60


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_number_of_seconds_is_one_line(tmp_path, capsys, value):
    path = notebook(tmp_path / "nb.ipynb", ["1"])
    assert run.main([str(path), "--timeout", value]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tfgpu run: --timeout {value!r} is not a number of seconds above 0; no output written (exit 2)"
    ]


@pytest.mark.parametrize("name", [".", "/", "nb.ipynb/.."])
def test_a_notebook_path_without_a_name_is_one_line(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    assert run.main([name]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("tfgpu run: ") and line.endswith("; no output written (exit 2)")


@pytest.mark.timeout(60)  # the safety net: a reader that blocks on the FIFO fails here, not hangs
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_notebook_that_is_not_a_regular_file_is_not_read(tmp_path, capsys, kind):
    """A FIFO (a neighbour's, in a shared folder) would block the read for ever; /dev/zero would
    read until memory ran out: neither is opened for reading, each is one line."""
    path = tmp_path / "nb.ipynb"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    assert run.main([str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"tfgpu run: {path} is not a regular file; no output written (exit 2)"


def test_the_output_is_written_in_place_of_a_planted_link_never_through_it(tmp_path):
    """In a shared folder a neighbour can plant NAME.out.ipynb as a link to a file of the user's:
    the output replaces the link, and the file it pointed to is untouched."""
    victim = tmp_path / "bashrc"
    victim.write_text("mine\n")
    victim.chmod(0o600)
    output = tmp_path / "nb.out.ipynb"
    output.symlink_to(victim)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    assert run._write(nb, output) == output
    assert victim.read_text() == "mine\n"
    assert not output.is_symlink() and nbformat.read(output, as_version=4).cells[0].source == "1"
    assert output.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as an ordinary write makes it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_output_that_is_a_folder_is_one_line_before_the_run(tmp_path, capsys):
    path = notebook(tmp_path / "nb.ipynb", ["1"])
    (tmp_path / "out.ipynb").mkdir()
    assert run.main([str(path), "-o", str(tmp_path / "out.ipynb"), "-k", "no-such-kernel"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tfgpu run: the output {tmp_path / 'out.ipynb'} is a folder; no output written (exit 2)"
    ]


def test_a_cells_error_reaches_the_terminal_escaped():
    """The output's last line quotes the failed cell's error, whose text the notebook chose."""
    cell = nbformat.v4.new_code_cell("raise ValueError(...)")
    cell.outputs = [
        nbformat.v4.new_output("error", ename="ValueError", evalue="\x1b]0;pwned\x07\x1b[2J\nfake line")
    ]
    line = run._error_line(cell, RuntimeError())
    assert line == "ValueError: \\x1b]0;pwned\\x07\\x1b[2J\\nfake line"


def test_every_line_the_runner_says_is_escaped(capsys):
    run.say("the notebook's \x1b[2J line\nfake")
    assert capsys.readouterr().err == "tfgpu run: the notebook's \\x1b[2J line\\nfake\n"


@pytest.mark.parametrize("how", ["same", "link", "hard link"])
def test_the_output_is_never_the_input(tmp_path, monkeypatch, capsys, how):
    """The docs promise the input is never overwritten: `-o` naming the notebook itself (as it is
    named, or by a link) is one line, and the notebook is untouched."""
    monkeypatch.chdir(tmp_path)
    path = notebook(tmp_path / "nb.ipynb", ["1"])
    before = path.read_bytes()
    output = {"same": "nb.ipynb", "link": "other.ipynb", "hard link": "hard.ipynb"}[how]
    if how == "link":
        (tmp_path / output).symlink_to(path)
    elif how == "hard link":
        os.link(path, tmp_path / output)
    assert run.main(["nb.ipynb", "-o", output]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tfgpu run: the output {output} is the notebook itself, whose outputs it would replace; "
        "give -o another file; no output written (exit 2)"
    ]
    assert path.read_bytes() == before
