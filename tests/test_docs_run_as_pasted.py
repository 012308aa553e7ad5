"""Every code block of the README and of the pages under docs/ runs as pasted (issues 16 and 29).

- A ```python block is one notebook cell, run in a fresh kernel on the simulated server
  (``kernels_server``, the README's own recipe) after a first cell that sets that server up (and
  loads the extension, when the block does not).  The block may fail only where EXPECTED_FAILURES
  says, and then it must: a stale entry fails too.  A block whose first line names a
  configuration file (``# ipython_config.py``) is loaded by traitlets and applied instead.
- Each line of a ```bash block is run here (RUN_HERE), or named with the test that runs it
  (RUN_BY), or with the reason it runs nowhere (NOT_RUN).  A new line fails until it is one of them.
- A ```text block is output, not code.  An untagged block fails: choose one.
- A ```json block must parse; one with a ``tfgpu`` key is a notebook's metadata, which the
  notebook-settings schema allows and tfgpu_magic reads.
- A ```yaml block is a Prometheus configuration: it must parse, and tests/test_prometheus.py
  runs its scrape jobs against a real Prometheus and Jupyter servers (YAML_RUN_BY).
- A MyST directive (```{toctree}, ```{eval-rst}, ```{include}) is Sphinx's: `make docs` builds it, warnings as
  errors.  Any other is untagged.

The README's command table is what ``python -m tfgpu_magic.command.reference`` prints from the
grammar, and the Layout names what exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.markdown import README, Block, all_blocks, pages
from support.paths import ROOT
from support.processes import START_UP_PREFIXES, run_in_fresh_kernel

# The line that fails on purpose -> what its one-line answer starts with.
EXPECTED_FAILURES = {
    "%gpu limit 4G              # too late: one line says what is in force and what to do": "UsageError: TensorFlow has already started",
    # TensorFlow's CPU build (this machine, CI) sees no GPU, so it cannot place a cell on GPU 1.
    "%%gpu on 1": "UsageError: GPU 1 is not visible to TensorFlow",
}

# What the page says must come before a block, run as earlier cells (the block's first line -> cells).
EARLIER_CELLS = {
    "%%gpu on 1": ["import tensorflow as tf"],  # "TensorFlow must be imported in an earlier cell"
}

RUN_HERE = {  # bash lines this file runs (with the venv's bin first on PATH)
    "tfgpu --demo": "Machine:    4 GPUs; user me",
    "tfgpu": "Machine:    ",
    "tfgpu --json": '"gpus"',
    "tfgpu --version": "tfgpu 0.1.0",
}
RUN_BY = {  # bash lines another test runs, and which
    "make setup": ".ci/run (CI runs the README's two commands in a fresh clone)",
    "make test": ".ci/run",
    "make test-fast": "tests/test_docs_run_as_pasted.py::test_make_test_fast_selects_no_slow_browser_or_gpu_test (its selection)",
    ".venv/bin/python -m tfgpu_magic.command.reference --write README.md": "tests/test_docs_run_as_pasted.py::test_the_readme_command_table_is_the_generators (on a copy of the README)",
    "python -m build": "tests/test_packaging.py (python -m build: the sdist, and the wheel made from it)",
    "jupyterhub -f jupyterhub_config.py": "tests/test_jupyterhub.py (a real hub, with the docs' block and the test's own lines after it)",
    ".venv/bin/jupyter lab": "tests/test_browser.py, tests/test_extension_browser.py (jupyter lab in Chromium)",
    ".venv/bin/jupyter notebook": "tests/test_extension_browser.py (Notebook 7 in Chromium)",
    "jupyter lab --TfgpuMagic.device_source=tfgpu_magic.simulated:kernels_server": "tests/test_extension_browser.py (the GPU panel on kernels_server)",
    'pip install ".[cpu,lab]"': "make setup (pip install -e .[cpu,test,docs]: the test extra holds jupyterlab)",
    'pip install ".[lab]"': "tests/test_install.py::test_the_wheel_installs_both_extensions_without_npm_or_a_build (without the extra: jupyterlab is the test environment's)",
    'pip install -e ".[cpu,test,docs]"': "make setup; tests/test_install.py::test_an_editable_install_of_a_fresh_checkout_puts_the_extension_in_place",
    "pip wheel --no-deps . -w dist": "tests/test_install.py (pip wheel --no-deps)",
    "tfgpu run train.ipynb --wait 30m": "tests/test_runner.py::test_a_gpu_freed_within_the_wait_runs_the_notebook (the same form, on a simulated server)",
    "tfgpu run train.ipynb -o runs/lr.ipynb -p lr 0.01": "tests/test_runner.py::test_parameters_reach_the_notebook and ::test_the_settings_are_in_force_before_the_first_cell_under_tfgpu_run (-o)",
    "TFGPU_MAGIC_WAIT=30m papermill --engine tfgpu train.ipynb runs/out.ipynb": "tests/test_runner.py::test_papermills_command_line_says_one_line_not_a_traceback (papermill's command line with TFGPU_MAGIC_WAIT and the engine registered in-process: an editable install's entry point appears only after `pip install -e .`)",
}
NOT_RUN = {  # bash lines no test runs, and why
    'pip install ".[gpu,lab]"': "tensorflow[and-cuda] brings several GB of CUDA libraries; the install without it is tested",
    'pip install "dist/tfgpu_magic-0.1.0-py3-none-any.whl[gpu,lab]"': "the same; the wheel without the extra is tested",
    "npm install -g configurable-http-proxy": "installs into the system's Node prefix; tests/test_jupyterhub.py runs the same npm package from node_modules (make setup's npm install)",
}
DIRECTIVES = ("{toctree}", "{eval-rst}", "{include}")  # MyST's, built by `make docs`


def commands(block: Block) -> list[str]:
    """The block's command lines, comments and blank lines left out."""
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in block.code.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_every_block_says_what_it_is():
    untagged = [
        b.name
        for b in all_blocks()
        if b.language not in ("python", "bash", "text", "yaml", "json", *DIRECTIVES)
    ]
    assert untagged == [], "tag each block python, bash, yaml (Prometheus), json or text (output)"


def test_every_json_block_parses_and_notebook_metadata_reads():
    from importlib.resources import files

    import jsonschema

    from tfgpu_magic.command import saved

    schema = json.loads(files("tfgpu_magic.command").joinpath("schema/notebook-settings.v1.json").read_text())
    blocks = all_blocks("json")
    assert blocks, "docs/notebook-settings.md shows the metadata format"
    for block in blocks:
        value = json.loads(block.code)
        if isinstance(value, dict) and saved.KEY in value:
            jsonschema.Draft202012Validator(schema).validate(value[saved.KEY])
            assert saved.read(value) is not None


def test_the_pages_are_the_readme_and_docs():
    """What the checks below read: a page moved out of docs/ would be read by none of them."""
    names = [page.relative_to(ROOT).as_posix() for page in pages()]
    assert (
        names[0] == "README.md" and "docs/administration.md" in names and "docs/reference/magics.md" in names
    )


# The jobs of the ```yaml blocks (Prometheus scrape configurations) -> the test that runs them.
YAML_RUN_BY = {
    "jupyter": "tests/test_prometheus.py (a real Prometheus scraping a jupyter server at /)",
    "jupyterhub": "tests/test_prometheus.py (the same, a jupyter server at /user/alice/)",
}


def test_every_yaml_block_is_a_scrape_configuration_a_named_test_runs():
    import yaml

    jobs = [job["job_name"] for b in all_blocks("yaml") for job in yaml.safe_load(b.code)["scrape_configs"]]
    assert sorted(jobs) == sorted(YAML_RUN_BY), "a new job needs a test that runs it; a stale entry goes"


def test_every_bash_line_is_run_here_or_by_a_named_test():
    lines = [line for block in all_blocks("bash") for line in commands(block)]
    unaccounted = [line for line in lines if line not in {**RUN_HERE, **RUN_BY, **NOT_RUN}]
    assert unaccounted == []
    stale = [line for line in {**RUN_HERE, **RUN_BY, **NOT_RUN} if line not in lines]
    assert stale == [], "listed here but no longer in the README or docs/"


@pytest.mark.slow
@pytest.mark.parametrize("line", sorted(RUN_HERE))
def test_the_bash_lines_run_here(line):
    env = {k: v for k, v in os.environ.items() if not k.startswith(START_UP_PREFIXES)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode in (0, 1), done.stderr  # 1: no driver here, and the report says so
    assert RUN_HERE[line] in done.stdout and done.stderr == ""


def test_make_test_fast_selects_no_slow_browser_or_gpu_test():
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "not slow and not browser and not gpu"' in makefile.split("test-fast:")[1].split("\n\n")[0]


# -- python blocks -------------------------------------------------------------------------------
CONFIG_FILE = re.compile(r"^# (ipython_config|jupyter_server_config|jupyterhub_config)\.py\n")
SIMULATED_SERVER = (
    "import os\n"
    "import tfgpu_magic\n"
    "from tfgpu_magic.simulated import kernels_server\n"
    "tfgpu_magic.set_device_source(kernels_server())\n"
)


def notebook_blocks() -> list[Block]:
    return [b for b in all_blocks("python") if not CONFIG_FILE.match(b.code)]


def _failure_text(outputs: list[dict]) -> str | None:
    """The cell's failure as one line: an error output, or IPython's one-line UsageError."""
    for output in outputs:
        if output["output_type"] == "error":
            return f"{output['ename']}: {output['evalue']}"
        text = "".join(output.get("text", ""))
        if output.get("name") == "stderr" and "UsageError:" in text:
            return text[text.index("UsageError:") :].splitlines()[0]
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", notebook_blocks(), ids=lambda b: b.name)
def test_each_python_block_runs_as_pasted_in_a_fresh_notebook(block, kernel_env, tmp_path):
    setup = SIMULATED_SERVER
    if "%load_ext tfgpu_magic" not in block.code:
        setup += "%load_ext tfgpu_magic\n"
    earlier = EARLIER_CELLS.get(block.code.splitlines()[0], [])
    outputs = run_in_fresh_kernel([setup, *earlier, block.code], tmp_path)
    for before in outputs[:-1]:
        assert _failure_text(before) is None, before
    failure = _failure_text(outputs[-1])
    expected = [EXPECTED_FAILURES[line] for line in block.code.splitlines() if line in EXPECTED_FAILURES]
    if expected:
        assert failure is not None and failure.startswith(expected[0]), failure
    else:
        assert failure is None, f"{block.name} fails as pasted: {failure}"
    assert "Traceback" not in json.dumps(outputs[-1]) or expected, outputs[-1]


def test_every_expected_failure_is_still_in_a_block():
    lines = {line for block in notebook_blocks() for line in block.code.splitlines()}
    assert [line for line in EXPECTED_FAILURES if line not in lines] == []


# -- configuration files ------------------------------------------------------------------------
def _load_config(block: Block, tmp_path: Path):
    from traitlets.config.loader import PyFileConfigLoader

    name = CONFIG_FILE.match(block.code).group(1) + ".py"
    (tmp_path / name).write_text(block.code)
    return name, PyFileConfigLoader(name, str(tmp_path)).load_config()


@pytest.mark.parametrize(
    "block", [b for b in all_blocks("python") if CONFIG_FILE.match(b.code)], ids=lambda b: b.name
)
def test_each_configuration_block_loads_and_applies(block, tmp_path, shell):
    name, config = _load_config(block, tmp_path)
    if name == "jupyter_server_config.py":
        from tfgpu_magic.server.extension import TfgpuMagic

        settings = TfgpuMagic(config=config)
        for trait, value in config.TfgpuMagic.items():
            assert getattr(settings, trait) == value
        return
    if (
        name == "jupyterhub_config.py"
    ):  # tests/test_jupyterhub.py runs it in a real hub; here, each setting exists
        from jupyterhub.app import JupyterHub
        from jupyterhub.auth import Authenticator
        from jupyterhub.proxy import ConfigurableHTTPProxy
        from jupyterhub.spawner import LocalProcessSpawner

        configurables = {
            "JupyterHub": JupyterHub,
            "Spawner": LocalProcessSpawner,
            "Authenticator": Authenticator,
            "ConfigurableHTTPProxy": ConfigurableHTTPProxy,
        }
        for section, values in config.items():
            built = configurables[section](config=config)
            assert set(values) <= set(built.trait_names(config=True)), f"{section}: no such setting"
            for trait, value in values.items():
                assert getattr(built, trait) == value or (
                    trait == "spawner_class" and built.spawner_class is LocalProcessSpawner
                )
        return
    from tfgpu_magic.gpus.nvml import Nvml
    from tfgpu_magic.gpus.simulated import shared_server
    from tfgpu_magic.kernel.magics import GpuMagics
    from tfgpu_magic.kernel.session import Session

    assert "tfgpu_magic" in config.InteractiveShellApp.extensions
    magics = GpuMagics(shell, session=Session(nvml=Nvml(lib=shared_server()), env={}), config=config)
    magics.apply_defaults()
    assert magics.session.requested.describe() == list(config.GpuMagics.defaults)  # each default applied


# -- the JupyterHub block, as a new user meets it (issue 29) ---------------------------------------
def _hub_block() -> Block:
    (block,) = [b for b in all_blocks("python") if b.code.startswith("# jupyterhub_config.py\n")]
    return block


def test_the_hub_block_lets_its_users_log_in(tmp_path):
    """JupyterHub 5 lets nobody in without an allow setting ("User '...' not allowed" at the login):
    the block's users pass JupyterHub's own check, and someone else does not (unless it allows all)."""
    import asyncio
    import inspect

    from jupyterhub.auth import PAMAuthenticator  # the default authenticator

    _, config = _load_config(_hub_block(), tmp_path)
    authenticator = PAMAuthenticator(config=config)

    def allowed(name: str) -> bool:
        answer = authenticator.check_allowed(name, None)
        return asyncio.run(answer) if inspect.isawaitable(answer) else answer

    users = sorted(authenticator.allowed_users) or ["anyone"]
    assert authenticator.allow_all or authenticator.allowed_users, "the block lets nobody log in"
    assert all(allowed(name) for name in users), users
    assert authenticator.allow_all or not allowed("not-" + users[0])


def test_the_hub_block_names_the_proxy_the_page_installs(tmp_path):
    """The hub stops at start with `Failed to find proxy ['configurable-http-proxy']` when the proxy is
    not on PATH: the page that holds the block says how to put it there, and the block names the
    command that npm package installs (the `bin` of the package make setup installs)."""
    block = _hub_block()
    _, config = _load_config(block, tmp_path)
    command = config.ConfigurableHTTPProxy.command
    package = json.loads((ROOT / "node_modules" / "configurable-http-proxy" / "package.json").read_text())
    assert command == [next(iter(package["bin"]))]
    page_lines = [line for b in all_blocks("bash") if b.page == block.page for line in commands(b)]
    assert f"npm install -g {package['name']}" in page_lines


# -- what is generated or named: the command table, the layout ----------------------------------------
@pytest.mark.slow
def test_the_readme_command_table_is_the_generators(tmp_path):
    """The README's table is what the documented command writes from grammar.TABLE (run here on a copy)."""
    from tfgpu_magic.command.reference import REGENERATE

    copy = tmp_path / "README.md"
    copy.write_text(README.read_text(encoding="utf-8"), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(START_UP_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "tfgpu_magic.command.reference", "--write", str(copy)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert copy.read_text(encoding="utf-8") == README.read_text(encoding="utf-8"), (
        f"the README's command table is not what the grammar says: run `{REGENERATE}`"
    )


def test_the_readme_command_table_has_every_manual_line():
    """In process: every line of `%gpu?` is a row of the README's table, and nothing else is."""
    from tfgpu_magic.command import grammar
    from tfgpu_magic.command.reference import BEGIN, END, REGENERATE

    text = README.read_text(encoding="utf-8")
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    forms = [re.match(r"\| `(.*?)` \|", row).group(1).replace("\\|", "|") for row in rows]
    expected = [form for verb in grammar.TABLE for form, _ in verb.manual]
    assert forms == expected, f"run `{REGENERATE}`"


LAYOUT_PAGE = ROOT / "docs" / "development.md"


def _layout_entries(text: str) -> list[str]:
    """The paths a Layout block names: an entry is a line's first word at an indentation of 0, 2 or 4
    (a folder ends with `/`; `a.py, b.py` names several); deeper lines are descriptions."""
    (block,) = [m for m in re.findall(r"^## Layout\n\n```text\n(.*?)^```", text, re.S | re.M)]
    entries, parents = [], {}
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if indent not in (0, 2, 4) or not line.strip():
            continue
        names = re.match(r"((?:[\w.\-/]+,\s)*[\w.\-/]+)", line.strip()).group(1).split(", ")
        base = parents.get(indent - 2, "") if indent else ""
        for name in names:
            entries.append(base + name)
        if names[-1].endswith("/"):
            parents[indent] = base + names[-1]
    return entries


@pytest.mark.parametrize("page", [README, LAYOUT_PAGE], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_layout_names_only_what_exists(page):
    entries = _layout_entries(page.read_text(encoding="utf-8"))
    assert entries, "no Layout block"
    missing = [entry for entry in entries if not (ROOT / entry).exists()]
    assert missing == []


def test_the_full_layout_names_every_module_of_the_package():
    named = set(_layout_entries(LAYOUT_PAGE.read_text(encoding="utf-8")))
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tfgpu_magic").rglob("*.py")}
    # a layer's __init__.py is its folder's entry (frameworks/__init__.py, which holds code, is named too)
    modules = {m for m in modules if m.count("/") == 1 or not m.endswith("/__init__.py")}
    assert sorted(modules - named) == [], f"name each module in {LAYOUT_PAGE.relative_to(ROOT)}'s Layout"


@pytest.mark.parametrize("module", ["simulated", "monitor", "keras", "claims"])
def test_the_python_reference_documents_every_public_name(module):
    """docs/reference/python.md names each object a public module lists in ``__all__`` (autodoc then
    reads its docstring), and nothing it does not list.  ``__all__`` is read from the source:
    importing tfgpu_magic.keras would import TensorFlow into this process."""
    import ast

    tree = ast.parse((ROOT / "tfgpu_magic" / f"{module}.py").read_text(encoding="utf-8"))
    (listed,) = [
        node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "__all__"
    ]
    public = ast.literal_eval(listed)
    page = (ROOT / "docs" / "reference" / "python.md").read_text(encoding="utf-8")
    section = page.split(f".. currentmodule:: tfgpu_magic.{module}\n")[1].split("```")[0]
    documented = re.findall(r"^\.\. auto(?:class|function|data):: (\w+)", section, re.M)
    assert documented == list(public)
