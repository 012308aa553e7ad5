"""What a setting silently breaks is said (issue 27, item 6), checked against the adapters' stand-ins."""

from __future__ import annotations

from tfgpu_magic.command import grammar

from support.stand_ins import torch_session


def installed(monkeypatch, session, *names: str) -> None:
    """Which frameworks this kernel could import (the stand-in session's adapters are real)."""
    for framework in (session.adapter("tensorflow"), session.adapter("pytorch"), session.adapter("jax")):
        monkeypatch.setattr(framework, "installed", lambda module=framework.module: module in names)


def test_async_over_the_users_native_options_names_the_ones_pytorch_will_ignore(monkeypatch):
    session = torch_session(
        {
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,garbage_collection_threshold:0.8,pinned_use_cuda_host_register:True"
        }
    )
    installed(monkeypatch, session, "torch")
    said = session.configure(grammar.parse("allocator async"))
    assert said.endswith(
        "; PyTorch: cudaMallocAsync ignores your PYTORCH_CUDA_ALLOC_CONF options max_split_size_mb:128, "
        "garbage_collection_threshold:0.8 (they tune PyTorch's own caching allocator, which `allocator async` "
        "replaces)"
    )
    # The options stay (the user's), with the back end added.
    assert session.env["PYTORCH_CUDA_ALLOC_CONF"] == (
        "max_split_size_mb:128,garbage_collection_threshold:0.8,pinned_use_cuda_host_register:True,"
        "backend:cudaMallocAsync"
    )


def test_async_says_nothing_of_options_it_keeps_or_where_pytorch_is_not_installed(monkeypatch):
    session = torch_session({"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True"})
    installed(monkeypatch, session, "torch")
    assert "ignores" not in session.configure(grammar.parse("allocator async"))
    session = torch_session({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    installed(monkeypatch, session)
    assert "ignores" not in session.configure(grammar.parse("allocator async"))


def test_a_limit_below_jaxs_smallest_fraction_is_rounded_up_and_said(monkeypatch):
    """`%gpu limit 1` (1 MiB) gave JAX XLA_PYTHON_CLIENT_MEM_FRACTION=0."""
    session = torch_session()
    installed(monkeypatch, session, "jax")
    session.configure(grammar.parse("use 0"))
    said = session.configure(grammar.parse("limit 1"))
    assert session.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.0001"
    assert said.endswith(
        "; JAX: gets a memory fraction of 0.0001, the smallest it is given (4 MiB of GPU 0), above this limit"
    )
    session.configure(grammar.parse("limit 8G"))
    assert float(session.env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) > 0.0001


def test_a_percentage_below_jaxs_step_is_rounded_up_as_said(monkeypatch):
    """`limit 0.001%` gave JAX 1e-05 while the reply said it got the smallest step (review)."""
    session = torch_session()
    installed(monkeypatch, session, "jax")
    session.configure(grammar.parse("use 1"))
    said = session.configure(grammar.parse("limit 0.001%"))
    assert session.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.0001"
    assert said.endswith(
        "; JAX: gets a memory fraction of 0.0001, the smallest it is given (8 MiB of GPU 1), above this limit"
    )


def test_a_setting_that_undoes_one_names_only_the_imported_framework():
    """`use all` or `limit off` with torch imported fell back to naming all three frameworks; `split`
    with JAX imported said it takes effect when TensorFlow, PyTorch or JAX starts (review)."""
    from support.stand_ins import GIB, StandInJax, cuda_torch

    session = torch_session()
    session._on_import(session.adapter("pytorch"), cuda_torch([80 * GIB] * 4))
    assert session.configure(grammar.parse("use all")) == "use all: PyTorch: takes effect when it starts CUDA"
    assert (
        session.configure(grammar.parse("limit off"))
        == "limit off: PyTorch: takes effect when it starts CUDA"
    )
    session = torch_session()
    session._on_import(session.adapter("jax"), StandInJax())
    said = session.configure(grammar.parse("split 2"))
    assert (
        said.endswith(": JAX: has no logical GPUs, so `split` does not reach it") and "TensorFlow" not in said
    )
    said = session.configure(grammar.parse("allocator platform"))
    assert said.count("JAX") == 1  # said once, not again as JAX's part
