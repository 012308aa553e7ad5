"""Tab completion in a real IPython shell: `%gpu`'s own words come first, and alone.

IPython 9 asks Jedi and its other matchers too; the `complete_command` hook alone is merged
after Jedi's names (`%gpu monitor --s` offered `set`, `setattr`, ... before `--sidebar`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
from IPython.core.completer import provisionalcompleter

from tfgpu_magic.command import grammar
from tfgpu_magic.kernel.magics import register_completion

from support.paths import ROOT

CASES = [
    ("%gpu mon", ["monitor"]),
    ("%gpu monitor --s", ["--sidebar"]),
    ("%gpu use ", ["all", "none", "auto", "auto:2", "--min-free", "--min-cc", "--wait"]),
    ("%%gpu b", ["budget"]),
    ("%gpu ", list(grammar.VERBS)),
    ("%gpu trace o", ["on", "off"]),
    ("%gpu precision ", list(grammar.PRECISIONS)),
    ("%gpu STA", ["status"]),  # IPython's own rule: any case when no exact-case match
    ("x = 1\n  %gpu mon", ["monitor"]),  # a line magic on a later line of the cell
    ("%%gpu budget 2G o", ["on"]),
    ("report = %gpu status --j", ["--json"]),  # IPython's `name = %magic` form
]


@pytest.fixture
def completer(shell):
    register_completion(shell)
    register_completion(shell)  # a second %load_ext must not add a second matcher
    return shell.Completer


def offered(completer, text: str) -> list[tuple[str, int]]:
    with provisionalcompleter():
        return [(c.text, c.start) for c in completer.completions(text, len(text))]


@pytest.mark.parametrize("text, words", CASES)
def test_completions_are_ours_alone_in_order(completer, text, words):
    fragment = text.split("\n")[-1].split(" ")[-1]
    start = len(text) - len(fragment)
    assert offered(completer, text) == [(word, start) for word in words]


@pytest.mark.parametrize("text, words", CASES)
def test_the_legacy_complete_call_agrees(shell, completer, text, words):
    line = text.split("\n")[-1]
    with warnings.catch_warnings():  # IPython's own call (its terminal's) is pending deprecation
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        assert shell.complete("", line, len(line))[1] == words


def test_one_matcher_however_often_it_is_registered(completer):
    ours = [m for m in completer.custom_matchers if getattr(m, "matcher_identifier", "") == "tfgpu_magic.gpu"]
    assert len(ours) == 1


def test_the_magics_own_name_is_left_to_ipython(gpu, completer):
    assert "%gpu" in [word for word, _ in offered(completer, "%gp")]


@pytest.mark.parametrize("text", ["%gpux s", "x = '%gpu s", "%%time\n%%gpu s", "%%gpu budget 2G\nst"])
def test_other_lines_are_left_to_ipython(completer, text):
    assert "status" not in [word for word, _ in offered(completer, text)]


def test_load_ext_registers_the_completion():
    code = (
        "from IPython.testing.globalipapp import start_ipython\n"
        "from IPython.core.completer import provisionalcompleter\n"
        "ip = start_ipython(); ip.run_line_magic('load_ext', 'tfgpu_magic')\n"
        "with provisionalcompleter():\n"
        "    print([c.text for c in ip.Completer.completions('%gpu monitor --s', 16)])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    )
    assert out.stdout.strip().splitlines()[-1] == "['--sidebar']"


@pytest.mark.parametrize("text", ["%gpu use 1  # sees only GPU ", "%gpu grow # gr", "%%gpu budget 2G  # on"])
def test_inside_a_comment_nothing_of_ours_is_offered_and_nothing_breaks(completer, text):
    ours = set(grammar.VERBS) | set(grammar.CELL_VERBS) | {"on", "off", "all", "none", "auto"}
    assert not ours & {word for word, _ in offered(completer, text)}
