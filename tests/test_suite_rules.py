"""The suite's own rules: fresh processes inherit no start-up setting, and only `slow` tests start them."""

from __future__ import annotations

import ast

import pytest

from support.paths import TESTS
from support.processes import run_python


def test_a_test_not_marked_slow_may_not_start_a_fresh_python():
    with pytest.raises(pytest.fail.Exception, match="is not marked `slow`"):
        run_python(["-c", "pass"])


@pytest.mark.slow
def test_a_fresh_python_inherits_no_start_up_setting(monkeypatch):
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")  # as an earlier test or a shell might leave it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    code = "import os; print(sorted(k for k in os.environ if k.startswith(('TF_', 'CUDA_', 'XLA_'))))"
    assert run_python(["-c", code]).stdout.strip() == "['TF_CPP_MIN_LOG_LEVEL']"
    passed = run_python(["-c", code], env={"CUDA_VISIBLE_DEVICES": "0"}).stdout.strip()
    assert passed == "['CUDA_VISIBLE_DEVICES', 'TF_CPP_MIN_LOG_LEVEL']"  # what a test passes, it gets


def _test_imports(source: str) -> list[str]:
    """The modules of the test suite itself that ``source`` imports (conftest, test_*, old helpers)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    top_level = {path.stem for path in TESTS.glob("*.py")}
    return sorted(name for name in names if name.split(".")[0] in top_level)


def test_no_test_module_imports_another_test_module_or_conftest():
    offences = {
        str(path.relative_to(TESTS)): found
        for path in sorted([*TESTS.glob("*.py"), *TESTS.glob("support/*.py"), *TESTS.glob("scripts/*.py")])
        if (found := _test_imports(path.read_text(encoding="utf-8")))
    }
    assert offences == {}, "move what is shared into tests/support/ and import it from there"


def test_the_rule_above_sees_an_import_of_a_test_module():
    assert _test_imports(
        "import os\nfrom conftest import ROOT\n\ndef f():\n    from test_jax import X\n"
    ) == [
        "conftest",
        "test_jax",
    ]
