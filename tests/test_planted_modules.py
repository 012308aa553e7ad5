"""A module that is not the framework (issue 28, item 9): `%gpu` keeps working, and says so once.

``sys.modules['torch']`` holds whatever ``import torch`` found first: a ``torch.py`` in the
notebook's folder, or any object a user or a library put there.  An adapter that took it for
PyTorch failed on every `%gpu` (``module 'torch' has no attribute 'version'``), and a command
that raised half-way was still recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from IPython.core.error import UsageError

from tfgpu_magic.command import grammar
from tfgpu_magic.kernel.session import SessionError

from support.paths import ROOT
from support.processes import fresh_env

COMMANDS = ("", "status --json", "limit 4G", "use 1", "grow", "allocator async", "free", "trace")


def planted(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"/home/alice/notebooks/{name}.py"
    module.version = "mine"  # half-convincing: some of what the adapter reads is there
    return module


@pytest.mark.parametrize(
    ("hook", "name", "framework"),
    [("pytorch", "torch", "PyTorch"), ("jax", "jax", "JAX")],
)
def test_every_command_works_after_a_planted_module_and_one_note_says_it_is_not_the_framework(
    gpu, capsys, hook, name, framework
):
    session = gpu.session
    session._on_import(session.adapter(hook), planted(name))  # what the post-import hook hands over
    for line in COMMANDS:
        gpu(line)
    gpu("reset")
    out = capsys.readouterr()
    note = (
        f"`import {name}` gave the module /home/alice/notebooks/{name}.py, which is not {framework} "
        f"(it has no `"
    )
    assert sum(n.startswith(note) for n in session.notes) == 1
    assert out.err.count(note) == 1  # said once, when the import happened
    assert f"{framework}:" not in out.out  # no framework line speaks for what is not there
    status = json.loads(_run(gpu, "status --json"))
    assert status["frameworks"][{"torch": "pytorch", "jax": "jax"}[name]]["stage"] == "not_imported"


def test_an_object_that_is_not_a_module_is_not_pytorch_either(gpu):
    gpu.session._on_import(gpu.session.adapter("pytorch"), 42)
    gpu("")
    assert any(n.startswith("`import torch` gave a int, which is not PyTorch") for n in gpu.session.notes)


def test_a_command_that_fails_half_way_changes_nothing(gpu, monkeypatch):
    session = gpu.session
    before_env = dict(session.env)
    # The last framework's step of a command, after the environment was written and the others
    # were given it: a framework that raises there (a bug, a broken install) must not leave half a
    # command behind.
    monkeypatch.setattr(
        session.adapter("jax"), "give", lambda *a: (_ for _ in ()).throw(RuntimeError("adapter bug"))
    )
    with pytest.raises(RuntimeError, match="adapter bug"):
        session.configure(grammar.parse("grow"))
    monkeypatch.undo()
    assert session.requested.describe() == []
    assert dict(session.env) == before_env
    assert gpu.session.reset().startswith("nothing to forget")


def test_a_refused_command_changes_nothing(gpu):
    session = gpu.session
    session.configure(grammar.parse("limit 4G"))
    before = (session.requested, dict(session.env))
    with pytest.raises(SessionError):
        session.configure(grammar.parse("use 9"))
    assert (session.requested, dict(session.env)) == before


@pytest.mark.slow
def test_a_torch_py_in_the_notebooks_folder_leaves_gpu_working(tmp_path):
    """The reported case, as a user meets it: a fresh kernel whose working folder has a torch.py."""
    (tmp_path / "torch.py").write_text("answer = 42\n")
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests' / 'scripts')!r})\n"
        "from harness import run_gpu\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'tfgpu_magic')\n"
        "import tfgpu_magic\n"
        "from tfgpu_magic.simulated import shared_server\n"
        "tfgpu_magic.set_device_source(shared_server())\n"
        "ip.run_cell('import torch')\n"
        "out = {line: run_gpu(ip, line) for line in ['limit 4G', 'use 1', 'grow', 'status --json', '']}\n"
        "print(json.dumps(out))\n"
    )
    env = fresh_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "which is not PyTorch" in proc.stderr and "Traceback" not in proc.stderr
    assert all(not text.startswith("UsageError") and "AttributeError" not in text for text in out.values())
    assert json.loads(out["status --json"])["frameworks"]["pytorch"]["stage"] == "not_imported"
    assert f"`import torch` gave the module {tmp_path / 'torch.py'}, which is not PyTorch" in out[""]


def _run(gpu, line: str) -> str:
    import io
    from contextlib import redirect_stdout

    buffer = io.StringIO()
    with redirect_stdout(buffer):
        try:
            gpu(line)
        except UsageError as err:
            return f"UsageError: {err}"
    return buffer.getvalue()


class Hostile:
    """Every attribute raises: what a half-built or hostile object in sys.modules can do."""

    def __getattr__(self, name):
        raise RuntimeError(f"boom {name}")


@pytest.mark.parametrize("hook", ["pytorch", "jax"])
def test_an_object_whose_every_attribute_raises_is_one_note(gpu, hook):
    gpu.session._on_import(
        gpu.session.adapter(hook), Hostile()
    )  # raised RuntimeError('boom __file__') before (review)
    assert any("gave a Hostile, which is not" in note for note in gpu.session.notes)
    gpu("")


def test_a_module_with_only_some_of_torch_cuda_is_not_pytorch(gpu):
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, _lazy_call=lambda f: None, device_count=lambda: 1
    )
    gpu.session._on_import(
        gpu.session.adapter("pytorch"), types.SimpleNamespace(version=types.SimpleNamespace(), cuda=cuda)
    )
    gpu("")
    gpu("free")  # both raised AttributeError: no memory_allocated (review)
    assert any("which is not PyTorch (it has no `cuda.memory_allocated`)" in n for n in gpu.session.notes)


def test_an_allocator_reading_that_fails_is_a_note(gpu, capsys):
    from support.stand_ins import GIB, cuda_torch

    torch = cuda_torch([80 * GIB])
    gpu.session._on_import(gpu.session.adapter("pytorch"), torch)
    torch.cuda.start()

    def refuse(k):
        raise RuntimeError("driver says no")

    torch.cuda.memory_allocated = refuse
    gpu("")
    gpu("free")
    out = capsys.readouterr().out
    assert "note: no allocator reading for cuda:0: RuntimeError: driver says no" in out
