"""The commands' Markdown, generated from grammar.TABLE: the README's table and the docs' reference
(tfgpu_magic/command/reference.py, docs/_ext/magics_reference.py), and the README's links."""

from __future__ import annotations

import re
import sys

import pytest

from tfgpu_magic.command import grammar, reference

from support.markdown import README
from support.paths import ROOT


def test_each_manual_line_is_one_row_and_a_bar_does_not_end_its_cell():
    rows = reference.command_table().splitlines()[2:]
    assert len(rows) == sum(len(verb.manual) for verb in grammar.TABLE)
    row = next(r for r in rows if r.startswith("| `%gpu use 1`"))
    assert row.count(" | ") == 1 and "0,2 \\| all \\| none" in row  # two cells, the bars escaped


def test_the_reference_has_every_form_and_what_tab_offers():
    text = reference.reference()
    for verb in grammar.TABLE:
        assert f"## `{'%%gpu' if verb.cell else '%gpu'} {verb.name}`" in text
        assert all(f"`{form}`" in text for form in verb.forms), verb.name
        assert all(f"`{word}`" in text for word in verb.completions), verb.name
    assert grammar.manual() in text  # %gpu? as the magic prints it


def test_the_table_is_rewritten_between_its_markers_only():
    old = f"before\n{reference.BEGIN}\n| stale |\n{reference.END}\nafter\n"
    new = reference.replace_table(old)
    assert new == f"before\n{reference.BEGIN}\n\n{reference.command_table()}\n{reference.END}\nafter\n"
    assert reference.replace_table(new) == new


@pytest.mark.parametrize(
    "text",
    ["no markers", f"{reference.END}\n{reference.BEGIN}\n", f"{reference.BEGIN}\n" * 2 + reference.END],
)
def test_a_file_without_its_markers_is_one_line_and_left_alone(text, tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(text)
    assert reference.main(["--write", str(page)]) == 1
    assert page.read_text() == text
    err = capsys.readouterr().err
    assert err.startswith("python -m tfgpu_magic.command.reference: the command table's markers")


def test_printing_the_table_and_the_reference(capsys):
    assert reference.main([]) == 0
    assert capsys.readouterr().out == reference.command_table()
    assert reference.main(["--reference"]) == 0
    assert capsys.readouterr().out == reference.reference()


def test_the_docs_page_gets_the_reference_at_build_time(monkeypatch):
    """docs/_ext/magics_reference.py: Sphinx's source-read hook puts the reference at its marker."""
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "_ext"))
    monkeypatch.delitem(sys.modules, "magics_reference", raising=False)
    import magics_reference

    page = (ROOT / "docs" / "reference" / "magics.md").read_text(encoding="utf-8")
    assert magics_reference.MARKER in page
    source = [page]
    magics_reference._insert(None, "reference/magics", source)
    assert reference.reference() in source[0] and magics_reference.MARKER not in source[0]
    other = ["# another page\n"]
    magics_reference._insert(None, "index", other)
    assert other == ["# another page\n"]


# -- the README's links: Sphinx checks the docs' own, nothing builds the README ------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page) -> set[str]:
    """GitHub's anchors for a Markdown page's headings (lower case, punctuation dropped, spaces as -)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_of_the_readme_reaches_a_file_and_its_heading():
    broken = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert broken == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_built_reference_says_each_form_and_line_as_typed(tmp_path):
    """Sphinx's own build (as `make docs`): every form, every manual line and `%gpu?` come
    out as the grammar has them (no dash for `--`, no quote made curly)."""
    import os
    import subprocess

    from support.processes import START_UP_PREFIXES

    env = {k: v for k, v in os.environ.items() if not k.startswith(START_UP_PREFIXES)}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    argv = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
    done = subprocess.run(
        [*argv, str(ROOT / "docs"), str(tmp_path)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import html

    page = (tmp_path / "reference" / "magics.html").read_text(encoding="utf-8")
    shown = html.unescape(re.sub(r"<[^>]+>", "", page))  # the text a reader sees
    flat = " ".join(shown.split())
    for verb in grammar.TABLE:
        assert all(form in flat for form in verb.forms), verb.name
        assert all(" ".join(f"{form}: {text}".split()) in flat for form, text in verb.manual), verb.name
    assert all(line in shown for line in grammar.manual().splitlines())  # %gpu? verbatim
