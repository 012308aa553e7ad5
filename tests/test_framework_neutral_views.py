"""Issue 27, item 4: the panel and the trace name no framework (read from the source, with ast).

The rule for every module outside ``tfgpu_magic/frameworks/`` (tests/test_layout.py will hold the
whole package to it); here for the views this item made neutral: the sampler, the widget, the
trace and the allocator figures.  None (a) imports a framework's adapter module, (b) reaches an
attribute named ``tf``, ``torch`` or ``jax``, (c) compares with or subscripts by a framework's key or
name, (d) defines a name that carries one.  The two stable wire fields ``tf_in_use_bytes`` and
``tf_peak_bytes`` are the exception the lead allowed: their names are the panel's wire format.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tfgpu_magic"
VIEWS = ["kernel/monitor.py", "kernel/widget.py", "kernel/trace.py", "kernel/allocator_figures.py"]
ADAPTERS = {"tensorflow", "pytorch", "jax", "tensorflow_diagnosis"}
ATTRIBUTES = {"tf", "torch", "jax"}
LITERALS = {"tensorflow", "pytorch", "jax", "torch", "keras", "TensorFlow", "PyTorch", "JAX", "Keras"}
IN_NAMES = ("tf_", "torch", "jax", "tensorflow", "pytorch", "keras")
WIRE_FIELDS = {"tf_in_use_bytes", "tf_peak_bytes"}


def _literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in LITERALS


def faults(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = set(module.split(".")) | (
                {a.name for a in node.names} if module.endswith("frameworks") else set()
            )
            if parts & ADAPTERS and ("frameworks" in module or node.level):
                found.append(f"imports {module} {[a.name for a in node.names]}")
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if set(a.name.split(".")) & ADAPTERS]
        elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            found.append(f"reaches .{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.Compare) and any(map(_literal, [node.left, *node.comparators])):
            found.append(f"compares with a framework's name (line {node.lineno})")
        elif isinstance(node, ast.Subscript) and _literal(node.slice):
            found.append(f"subscripts by a framework's name (line {node.lineno})")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if any(word in node.name.lower() for word in IN_NAMES):
                found.append(f"defines {node.name} (line {node.lineno})")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if name and name not in WIRE_FIELDS and any(word in name.lower() for word in IN_NAMES):
                    found.append(f"defines {name} (line {node.lineno})")
    return found


@pytest.mark.parametrize("module", VIEWS)
def test_the_panel_and_the_trace_name_no_framework(module):
    assert faults(PACKAGE / module) == []


def test_the_check_finds_each_kind_of_fault(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from ..frameworks import tensorflow as tf_adapter\n"
        "x = session.tf\n"
        "if key == 'pytorch': pass\n"
        "y = windows['jax']\n"
        "def _tensorflow_lines(): pass\n"
    )
    assert sorted(faults(planted)) == sorted(
        [
            "imports frameworks ['tensorflow']",
            "reaches .tf (line 2)",
            "compares with a framework's name (line 3)",
            "subscripts by a framework's name (line 4)",
            "defines _tensorflow_lines (line 5)",
        ]
    )
