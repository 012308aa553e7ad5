"""One kernel, one limit (issue 27): a limit is the kernel's, whatever runs in it.

TensorFlow and JAX in one kernel with `%gpu limit 50%` got 50% each, up to the whole GPU together,
and nothing said so.  The cap is now divided between the frameworks that take a part of it, or
named in shares (`%gpu limit 6G tensorflow, 2G jax`); a started framework keeps what it has, and
one arriving when nothing is left is told so."""

from __future__ import annotations

import os

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.command.units import GIB
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.base import Stage
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.kernel.session import Session, SessionError
from tfgpu_magic.simulated import shared_server

from support.fakes import FakeTensorFlow
from support.stand_ins import StandInJax, cuda_torch

GPU1_MIB = 81920  # shared_server's GPU 1


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in (
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
        "CUDA_VISIBLE_DEVICES",
    ):
        monkeypatch.delenv(name, raising=False)


def kernel(tf_stage: Stage = Stage.ENUMERATED) -> tuple[Session, FakeTensorFlow]:
    tf = FakeTensorFlow(stage=tf_stage, gpus={"GPU:0": 1}, found=[1])
    session = Session(nvml=Nvml(lib=shared_server()), env=os.environ, frameworks=adapters(tensorflow=tf))
    return session, tf


def test_tensorflow_and_jax_share_the_kernels_limit_instead_of_taking_it_twice():
    session, tf = kernel()
    session.configure(grammar.parse("use 1"))
    session._on_import(session.adapter("jax"), StandInJax())  # the notebook imports jax itself
    said = session.configure(grammar.parse("limit 50%"))
    half = GPU1_MIB // 2
    assert tf.applied[-1][1] == {1: (half // 2,)}  # TensorFlow's logical GPU: its half of the limit
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"  # JAX's fraction: the other half
    assert "one kernel, one limit: GPU 1's 40.0 GiB: TensorFlow 20.0 GiB, JAX 20.0 GiB" in said
    assert session.limit_bytes_by_gpu() == {1: half * 1024**2}  # the panel's line: the kernel's limit, once


def test_named_shares_give_each_framework_its_own():
    session, tf = kernel()
    session.configure(grammar.parse("use 1"))
    session._on_import(session.adapter("jax"), StandInJax())
    said = session.configure(grammar.parse("limit 6G tensorflow, 2G jax"))
    assert said.startswith("limit 6144MiB tensorflow, 2048MiB jax: ")
    assert tf.applied[-1][1] == {1: (6144,)}
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"{2048 / GPU1_MIB:.4f}".rstrip("0")
    assert session.requested.describe() == ["use 1", "limit 6144MiB tensorflow, 2048MiB jax"]
    assert session.limit_bytes_by_gpu() == {1: 8 * GIB}


def test_a_framework_imported_later_takes_its_part_and_the_others_are_given_theirs_again(capsys):
    session, tf = kernel(Stage.NOT_IMPORTED)
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 8G"))
    session._on_import(session.adapter("tensorflow"), None)
    assert tf.applied[-1][1] == {1: (8192,)}  # alone: the whole limit
    session._on_import(session.adapter("pytorch"), cuda_torch([80 * GIB] * 4))
    assert tf.applied[-1][1] == {1: (4096,)}  # given again, before its start
    assert session.adapter("pytorch").caps_bytes == {0: 4 * GIB}
    assert (
        "one kernel, one limit: GPU 1's 8,192 MiB: TensorFlow 4,096 MiB, PyTorch 4,096 MiB"
        in capsys.readouterr().err
    )


def test_a_started_framework_keeps_its_part_and_a_newcomer_is_told_nothing_is_left(capsys):
    session, tf = kernel(Stage.NOT_IMPORTED)
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 8G"))
    session._on_import(session.adapter("tensorflow"), None)
    tf.fake_stage = Stage.STARTED  # its first op ran with the whole limit
    session._on_import(session.adapter("pytorch"), cuda_torch([80 * GIB] * 4))
    assert session.adapter("pytorch").caps_bytes == {0: 1024**2}  # nothing left: the least it can be given
    assert "TensorFlow 8,192 MiB, PyTorch 1 MiB" in capsys.readouterr().err
    assert session.limit_bytes_by_gpu() == {1: 8 * GIB + 1024**2}


def test_jax_imported_by_tensorflow_for_its_own_use_takes_no_part():
    session, tf = kernel()
    session.configure(grammar.parse("use 1"))
    jax = session.adapter("jax")
    session._on_import(jax, StandInJax())
    jax.imported_by_tensorflow = True  # as on_import records when tensorflow is still initialising
    session.configure(grammar.parse("limit 8G"))
    assert tf.applied[-1][1] == {1: (8192,)}


def test_shares_are_one_line_errors():
    for line, message in [
        ("limit 6G tensorflow, 2G", "'2G' is not a share"),
        ("limit 6G tensorflow, 2G tf", "'tf' has two shares"),
        ("limit 6G keras", "unexpected"),
    ]:
        with pytest.raises(grammar.GrammarError, match=message):
            grammar.parse(line)
    assert grammar.parse("limit 50% torch, 2G jax") == grammar.Limit(
        None, (("pytorch", grammar.Percent(50)), ("jax", 2048))
    )


def test_named_shares_that_do_not_fit_are_refused_and_change_nothing():
    session, _tf = kernel()
    session.configure(grammar.parse("use 1"))
    before = dict(os.environ), session.requested
    with pytest.raises(SessionError, match="does not fit"):
        session.configure(grammar.parse("limit 60G tensorflow, 30G jax"))
    assert (dict(os.environ), session.requested) == before


def test_status_says_how_the_limit_is_divided():
    from tfgpu_magic.kernel import status

    session, _tf = kernel()
    session.configure(grammar.parse("use 1"))
    session._on_import(session.adapter("jax"), StandInJax())
    session.configure(grammar.parse("limit 50%"))
    report = status.build_report(session)
    assert "one kernel, one limit: GPU 1's 40.0 GiB: TensorFlow 20.0 GiB, JAX 20.0 GiB" in report["notes"]
    assert "one kernel, one limit" in status.render_text(report)


def test_jax_imported_by_tensorflow_takes_its_part_when_the_notebook_starts_it(capsys):
    """The issue's case: `import tensorflow` imports jax itself; `%gpu limit 50%`; then JAX's first
    operation: JAX's part is set just before it reads its variables, and TensorFlow's is given again."""
    session, tf = kernel()
    session.configure(grammar.parse("use 1"))
    jax_module = StandInJax()
    jax = session.adapter("jax")
    jax.imported_by_tensorflow = True  # what on_import records while tensorflow initialises
    session._on_import(jax, jax_module)
    jax.imported_by_tensorflow = True
    session.configure(grammar.parse("limit 50%"))
    assert (
        tf.applied[-1][1] == {1: (GPU1_MIB // 2,)} and os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    )
    jax_module.devices()  # the notebook's first JAX operation
    assert jax.start().memory_fraction == 0.25  # what JAX read: its half of the kernel's limit
    assert tf.applied[-1][1] == {1: (GPU1_MIB // 4,)}  # TensorFlow (not started) given its half again
    assert "TensorFlow 20.0 GiB, JAX 20.0 GiB" in capsys.readouterr().err


def test_jax_started_after_tensorflow_took_the_whole_limit_gets_the_least_and_says_so(capsys):
    session, tf = kernel()
    session.configure(grammar.parse("use 1"))
    jax_module = StandInJax()
    jax = session.adapter("jax")
    session._on_import(jax, jax_module)
    jax.imported_by_tensorflow = True
    session.configure(grammar.parse("limit 50%"))
    tf.fake_stage = Stage.STARTED  # TensorFlow ran its first op with the whole limit
    jax_module.devices()
    assert jax.start().memory_fraction == 0.0001  # nothing left: the smallest fraction JAX is given
    assert "TensorFlow 40.0 GiB, JAX 1 MiB" in capsys.readouterr().err


def test_a_cuda_build_of_torch_that_sees_no_gpu_takes_no_part():
    """torch's CUDA build on a machine without a GPU (the package index's default): no part of the
    limit goes to it, so JAX keeps the whole of it (found by a fresh-clone run with that build)."""
    session, _tf = kernel(Stage.NOT_IMPORTED)
    session.configure(grammar.parse("use 1"))
    session._on_import(session.adapter("pytorch"), cuda_torch([]))  # torch.cuda.device_count() == 0
    session._on_import(session.adapter("jax"), StandInJax())
    session.configure(grammar.parse("limit 25%"))
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
