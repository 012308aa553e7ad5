"""`%load_ext tfgpu_magic` registers the magic, its completion and the import hooks, and builds the
session (the command language, the adapters, their dataclasses) only when loading has work for it:
an administrator's defaults, a notebook's saved settings, an inherited CUDA variable, a framework
imported already.  Otherwise the first `%gpu` (or framework import) builds it and finishes the load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tfgpu_magic import frameworks
from tfgpu_magic.command import saved
from tfgpu_magic.frameworks import import_hooks
from tfgpu_magic.kernel import deferred, magics
from tfgpu_magic.kernel import session as session_module

LOAD_TIME_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "TFGPU_MAGIC_NOTEBOOK_SETTINGS",
    "JPY_SESSION_NAME",
)


def test_the_watched_modules_are_the_adapters_imports():
    named = []
    for adapter in frameworks.adapters():
        named += [adapter.module, *adapter.side_imports()]
    assert sorted(frameworks.WATCHED_MODULES) == sorted(named)


def test_a_light_load_asks_whether_the_notebook_holds_settings_without_the_command_language(tmp_path):
    keyed = tmp_path / "keyed.ipynb"
    keyed.write_text('{"metadata": {"tfgpu": {"version": 1}}}')
    plain = tmp_path / "plain.ipynb"
    plain.write_text('{"metadata": {}}')
    assert magics._may_have_saved_settings({"JPY_SESSION_NAME": str(keyed)})
    assert not magics._may_have_saved_settings({"JPY_SESSION_NAME": str(plain)})
    assert saved.metadata_from_file(str(keyed)) == {"tfgpu": {"version": 1}}


@pytest.fixture
def light(monkeypatch):
    """No session yet, nothing deferred, no load-time variable, no framework watched is imported."""
    monkeypatch.setattr(session_module, "_SESSION", None)
    monkeypatch.setattr(deferred, "_finish", None)
    monkeypatch.setattr(deferred, "_shell", None)
    monkeypatch.setattr(frameworks, "WATCHED_MODULES", ("tfgpu_test_never_imported",))
    # the hooks a session built here installs (for jax, torch...) must not outlive the test
    monkeypatch.setattr(import_hooks, "_waiting", {k: list(v) for k, v in import_hooks._waiting.items()})
    for name in LOAD_TIME_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_load_builds_no_session_until_the_first_gpu(shell, light):
    magics.load(shell)
    assert session_module._SESSION is None and deferred.pending(shell)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # before anything can start CUDA
    assert shell.find_line_magic("gpu").__doc__ == magics.MANUAL
    magics.load(shell)  # a second load adds nothing
    assert session_module._SESSION is None

    shell.run_line_magic("gpu", "grow")
    session = session_module._SESSION
    assert session is not None and not deferred.pending(shell)
    assert session.loaded_into is shell and session.requested.growth is True
    # What the kernel inherited is the environment at load, not what loading set since.
    assert session.machine.inherited["CUDA_DEVICE_ORDER"] is None
    assert session.machine.unmanaged_value("CUDA_DEVICE_ORDER") is None
    magics.load(shell)  # loaded: nothing again
    assert session_module._SESSION is session and session.requested.growth is True


@pytest.mark.parametrize(
    "variable, value",
    [
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
        ("TFGPU_MAGIC_NOTEBOOK_SETTINGS", "{}"),
    ],
)
def test_what_needs_the_session_at_load(light, variable, value):
    gpu = magics.GpuMagics(None, session=None)
    assert not magics._session_needed_now(gpu, {})
    assert magics._session_needed_now(gpu, {variable: value})


def test_a_framework_imported_before_load_needs_the_session(light, monkeypatch):
    gpu = magics.GpuMagics(None, session=None)
    monkeypatch.setattr(frameworks, "WATCHED_MODULES", ("os",))
    assert magics._session_needed_now(gpu, {})


def test_defaults_need_the_session(light):
    gpu = magics.GpuMagics(None, session=None)
    gpu._loaded = True  # not applied by the observer here
    gpu.defaults = ["grow"]
    assert magics._session_needed_now(gpu, {})


def test_a_notebook_is_read_for_the_key_only(light, tmp_path):
    gpu = magics.GpuMagics(None, session=None)
    plain, with_key = tmp_path / "plain.ipynb", tmp_path / "saved.ipynb"
    plain.write_text('{"cells": [], "metadata": {}}')
    with_key.write_text('{"cells": [], "metadata": {"tfgpu": {"version": 1}}}')
    assert not magics._session_needed_now(gpu, {"JPY_SESSION_NAME": str(plain)})
    assert not magics._session_needed_now(gpu, {"JPY_SESSION_NAME": str(tmp_path / "gone.ipynb")})
    assert magics._session_needed_now(gpu, {"JPY_SESSION_NAME": str(with_key)})
    link = tmp_path / "link.ipynb"
    link.symlink_to(with_key)
    assert not magics._session_needed_now(gpu, {"JPY_SESSION_NAME": str(link)})  # as saved: no links


@pytest.mark.slow
def test_load_ext_in_a_fresh_python_imports_no_command_language_nor_session():
    code = (
        "import json, sys\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython(); ip.run_line_magic('load_ext', 'tfgpu_magic')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tfgpu_magic.'))\n"
        "ip.run_line_magic('gpu', 'grow')\n"
        "print(json.dumps([loaded, 'tfgpu_magic.kernel.session' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in LOAD_TIME_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    loaded, built_at_first_gpu = json.loads(out.stdout.strip().splitlines()[-1])
    assert built_at_first_gpu
    assert loaded == [
        "tfgpu_magic._version",
        "tfgpu_magic.frameworks",
        "tfgpu_magic.frameworks.import_hooks",
        "tfgpu_magic.kernel",
        "tfgpu_magic.kernel.deferred",
        "tfgpu_magic.kernel.magics",
    ]


# What a status must not import: another process's reading needs none of these (no timing here:
# the counts and figures are benchmarks/vs_fresh.py's).
NOT_FOR_A_STATUS = (
    "psutil",  # owners and commands come from /proc
    "secrets",  # only a claim written needs a random name
    "tfgpu_magic.gpus.simulated",  # only when the environment names a simulated server
    "tfgpu_magic.command.saved",
    "tfgpu_magic.kernel.magics",
    "tfgpu_magic.kernel.monitor",
    "tfgpu_magic.frameworks.tensorflow_diagnosis",
    "IPython",
    "tensorflow",
    "torch",
    "jax",
)


def _imported_by(code: str) -> set[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in (*LOAD_TIME_VARIABLES, "TFGPU_MAGIC_SIMULATED_SOURCE")
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_tfgpu_json_in_a_fresh_python_imports_only_what_a_status_reads(tmp_path):
    code = (
        "import json, os, sys\n"
        "from tfgpu_magic.__main__ import main\n"
        "saved = sys.stdout\n"
        "with open(os.devnull, 'w') as sys.stdout:\n"
        "    main(['--json'])\n"
        "sys.stdout = saved\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    imported = _imported_by(code)
    assert "tfgpu_magic.kernel.status" in imported  # the report was built
    assert not {name for name in (*NOT_FOR_A_STATUS, "argparse") if name in imported}  # --json: no parser


@pytest.mark.slow
def test_the_dataclasses_a_status_defines_are_records():
    """Each dataclass of a fresh `tfgpu --json` is a Record, so defining it compiles nothing
    (records.py says why)."""
    code = (
        "import dataclasses, json, os, sys\n"
        "from tfgpu_magic.__main__ import main\n"
        "from tfgpu_magic.records import Record\n"
        "saved = sys.stdout\n"
        "with open(os.devnull, 'w') as sys.stdout:\n"
        "    main(['--json'])\n"
        "sys.stdout = saved\n"
        "found = {f'{c.__module__}.{c.__qualname__}': issubclass(c, Record)\n"
        "         for name, module in list(sys.modules.items()) if name.startswith('tfgpu_magic.')\n"
        "         for c in vars(module).values()\n"
        "         if isinstance(c, type) and c.__module__ == name and dataclasses.is_dataclass(c)}\n"
        "print(json.dumps(found))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in LOAD_TIME_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(found) > 40  # the status path's records were found
    assert [name for name, is_record in found.items() if not is_record] == []


@pytest.mark.slow
def test_a_first_status_listing_real_processes_imports_no_psutil():
    # Processes of this machine listed (this one and its parent), owners and commands read as a
    # terminal's status reads them: the simulated server has no owner table of its own.
    code = (
        "import json, os, sys\n"
        "from tfgpu_magic.gpus.simulated import shared_server\n"
        "lib = shared_server(my_pid=os.getppid())\n"
        "lib.owner_of = None\n"
        "from tfgpu_magic.gpus.nvml import Nvml\n"
        "from tfgpu_magic.kernel import status\n"
        "from tfgpu_magic.kernel.session import Session\n"
        "report = status.build_report(Session(nvml=Nvml(lib=lib), env={}))\n"
        "users = [p['user'] for g in report['gpus'] for p in g['processes'] or []]\n"
        "assert any(users), report\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    imported = _imported_by(code)
    assert "psutil" not in imported and "secrets" not in imported
    assert not any(name.startswith(("tensorflow", "torch", "jax", "IPython")) for name in imported)
