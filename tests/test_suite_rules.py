"""The suite's own rules: fresh processes inherit no start-up setting, and only `slow` tests start them."""

from __future__ import annotations

import pytest
from conftest import run_python


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
