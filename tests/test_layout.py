"""The package's folders are its architecture: each layer imports only the layers below it.

    command/     the %gpu language and the plan          (imports nothing of the package)
    gpus/        NVML, numbering, owners, claims, ...    (command/)
    frameworks/  the adapters to TensorFlow, PyTorch, JAX (command/, gpus/)
    kernel/      what runs in the user's kernel          (anything but server/)
    server/      the Jupyter server extension            (command/, gpus/)

Read from the source (ast), so a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tfgpu_magic"
SHARED = {"safe_text", "__init__"}  # the top-level helpers every layer may use (and __version__)
ALLOWED = {
    "command": {"command"},
    "gpus": {"command", "gpus"},
    "frameworks": {"command", "gpus", "frameworks"},
    "kernel": {"command", "gpus", "frameworks", "kernel"},
    "server": {"command", "gpus", "server"},
}


def _imported_parts(path: Path) -> set[str]:
    """The package's top-level parts (``gpus``, ``safe_text``, ...) a module imports."""
    relative = path.relative_to(PACKAGE).with_suffix("").parts
    parts: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(relative[: len(relative) - node.level])  # the package the dots point at
            target = base + (node.module.split(".") if node.module else [])
            if target:
                parts.add(target[0])
            else:  # `from .. import x`: x is a part itself
                parts.update(alias.name for alias in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                if name.startswith("tfgpu_magic."):
                    parts.add(name.split(".")[1])
    return parts


LAYERED = sorted(p for p in PACKAGE.glob("*/*.py") if p.parent.name in ALLOWED)


@pytest.mark.parametrize("path", LAYERED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_layer_imports_only_the_layers_below_it(path):
    layer = path.parent.name
    wrong = _imported_parts(path) - ALLOWED[layer] - SHARED - {"__version__"}
    assert not wrong, f"{path.relative_to(PACKAGE)} ({layer}/) imports {sorted(wrong)}"


def test_every_module_lives_in_a_layer_or_is_a_documented_top_level_name():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "claims", "keras", "monitor", "safe_text", "simulated", "testing"]
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(ALLOWED)


def test_the_rule_reads_a_lazy_import_too():
    """The check itself: an import inside a function, written with dots, is found."""
    source = PACKAGE / "gpus" / "simulated.py"
    assert "gpus" in _imported_parts(source)  # `from .process_tree import ...` inside a method


@pytest.mark.parametrize(
    ("old", "new"),
    [("simulated", "gpus.simulated"), ("monitor", "kernel.monitor"), ("claims", "gpus.claims")],
)
def test_a_documented_old_path_is_the_same_module(old, new):
    """`from tfgpu_magic.monitor import open_panel` (README, tutorials) keeps working, and is the
    module itself, not a copy: a sampler started through one name is seen through the other.
    (``tfgpu_magic.keras`` imports Keras: tests/scripts/keras_scenario.py imports it by that name.)"""
    import importlib

    assert importlib.import_module(f"tfgpu_magic.{old}") is importlib.import_module(f"tfgpu_magic.{new}")


def test_the_stage_comes_from_the_protocol_not_from_an_adapter():
    """`Stage` is every framework's (frameworks/base.py): no kernel module takes it from one adapter."""
    for path in sorted((PACKAGE / "kernel").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(("tensorflow", "pytorch", "jax")):
                names = {alias.name for alias in node.names}
                assert not names & {"Stage", "CUDA_ENV"}, f"{path.name} takes {names & {'Stage', 'CUDA_ENV'}} from {node.module}"
