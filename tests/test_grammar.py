"""The %gpu command language: every form, every error message, and a property over all lines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu_magic.command import grammar
from tfgpu_magic.command.grammar import Auto, GrammarError, Percent

USE = grammar.usage("use")
LIMIT = grammar.usage("limit")
SPLIT = grammar.usage("split")


@pytest.mark.parametrize(
    "line, command",
    [
        ("", grammar.Status()),
        ("status", grammar.Status()),
        ("status --json", grammar.Status(json=True)),
        ("doctor", grammar.Doctor()),
        ("DOCTOR --json  # how this kernel shares", grammar.Doctor(json=True)),
        ("use 1", grammar.Use((1,))),
        ("use 0,2", grammar.Use((0, 2))),
        ("use all", grammar.Use("all")),
        ("use none", grammar.Use("none")),
        ("USE None", grammar.Use("none")),
        ("use auto", grammar.Use(Auto())),
        ("use auto:2", grammar.Use(Auto(count=2))),
        ("use auto --min-free 10G", grammar.Use(Auto(min_free_bytes=10 * 1024**3))),
        ("use auto:2 --wait 10m --min-free 512M", grammar.Use(Auto(2, 512 * 1024**2, 600.0))),
        ("grow", grammar.Grow(True)),
        ("grow on", grammar.Grow(True)),
        ("grow off", grammar.Grow(False)),
        ("limit 4096", grammar.Limit((4096,))),
        ("limit 4G", grammar.Limit((4096,))),
        ("limit 4GB", grammar.Limit((4096,))),
        ("limit 1.5GiB", grammar.Limit((1536,))),
        ("limit 512m", grammar.Limit((512,))),
        ("limit 50%", grammar.Limit((Percent(50.0),))),
        ("limit 4G,8G", grammar.Limit((4096, 8192))),
        ("limit off", grammar.Limit(None)),
        ("split 2", grammar.Split(count=2)),
        ("split 4G,4G", grammar.Split(sizes=(4096, 4096))),
        ("split 1024,2048", grammar.Split(sizes=(1024, 2048))),
        ("split off", grammar.Split()),
        ("allocator async", grammar.Allocator("async")),
        ("allocator default", grammar.Allocator("default")),
        ("precision mixed_float16", grammar.Precision("mixed_float16")),
        ("precision mixed_bfloat16", grammar.Precision("mixed_bfloat16")),
        ("precision float32", grammar.Precision("float32")),
        ("free", grammar.Free()),
        ("reset", grammar.Reset()),
        ("monitor", grammar.Monitor()),
        ("monitor --sidebar --interval 0.2 --window 10m", grammar.Monitor(True, 0.2, 600.0)),
        ("monitor off", grammar.Monitor(off=True)),
        ("trace", grammar.Trace(True)),
        ("trace off", grammar.Trace(False)),
    ],
)
def test_valid_forms(line, command):
    assert grammar.parse(line) == command


@pytest.mark.parametrize(
    "line, message",
    [
        ("bogus", f"unknown subcommand 'bogus'; {grammar.usage()}"),
        ("use", f"`%gpu use` needs GPUs; {USE}"),
        ("doctor now", f"unexpected 'now'; {grammar.usage('doctor')}"),
        ("doctor --json --json", f"--json given twice; {grammar.usage('doctor')}"),
        ("use -1", f"'-1' is not a GPU number or a comma list of them; {USE}"),
        ("use 1,1", f"'1,1' names a GPU twice; {USE}"),
        ("use 1,", f"'1,' is not a GPU number or a comma list of them; {USE}"),
        ("use 1 2", f"unexpected '2'; {USE}"),
        ("use auto:0", f"'auto:0': auto:N needs a whole number N of at least 1; {USE}"),
        ("use auto --min-free", f"--min-free needs a value; {USE}"),
        ("use auto --min-free 10%", f"'10%': a percentage is not allowed here; {USE}"),
        ("use auto --fast", f"unexpected '--fast'; {USE}"),
        ("limit", f"`%gpu limit` needs an argument; {LIMIT}"),
        ("limit -5", f"'-5' is not a size; {LIMIT}"),
        ("limit 0", f"'0': a size must be at least 1 MiB; {LIMIT}"),
        ("limit 12abc", f"'12abc' is not a size; {LIMIT}"),
        ("limit 101%", f"'101%': a percentage must be above 0 and at most 100; {LIMIT}"),
        ("limit 0%", f"'0%': a percentage must be above 0 and at most 100; {LIMIT}"),
        ("limit 1.5", f"'1.5': a bare number is whole MiB; {LIMIT}"),
        ("limit 4G,,8G", f"'4G,,8G' has an empty entry; {LIMIT}"),
        ("limit 4G extra", f"unexpected 'extra'; {LIMIT}"),
        ("split 0", f"'0': the number of logical GPUs must be 1 to 16; {SPLIT}"),
        ("split 2.5", f"'2.5' is neither a count nor a list of sizes; {SPLIT}"),
        ("split 50%,50%", f"'50%': a percentage is not allowed here; {SPLIT}"),
        ("precision fp8", f"unknown precision 'fp8'; {grammar.usage('precision')}"),
        ("allocator fast", f"unknown allocator 'fast'; {grammar.usage('allocator')}"),
        ("grow maybe", f"unexpected 'maybe'; {grammar.usage('grow')}"),
        ("free now", f"unexpected 'now'; {grammar.usage('free')}"),
        ("status --xml", f"unexpected '--xml'; {grammar.usage('status')}"),
        ("monitor --interval 0.01", f"--interval must be 0.1 s to 60 s; {grammar.usage('monitor')}"),
        (
            "monitor --window 0",  # a zero window is refused, not taken for "no --window"
            f"--window must be 5 s to 24 h and hold at least 10 samples; {grammar.usage('monitor')}",
        ),
        ("use 'unclosed", 'cannot read "use \'unclosed" (No closing quotation); ' + USE),
        ("'unclosed", 'cannot read "\'unclosed" (No closing quotation); ' + grammar.usage()),
        ("limit 4G\\", f"cannot read 'limit 4G\\\\' (No escaped character); {LIMIT}"),
    ],
)
def test_errors_name_the_valid_forms(line, message):
    with pytest.raises(GrammarError) as info:
        grammar.parse(line)
    assert str(info.value) == message
    assert "\n" not in message


def test_an_unknown_verb_is_answered_with_every_form():
    every = grammar.usage()
    assert every.startswith("valid: %gpu | %gpu status | %gpu status --json | %gpu use 1 | ")
    assert every.count(" | ") + 1 == sum(len(forms) for forms in grammar.FORMS.values())
    for forms in grammar.FORMS.values():
        assert all(form in every for form in forms)


# -- the table: each verb declared once, everything else read from it ---------------------------
def test_each_verb_is_declared_once_and_the_names_come_from_the_table():
    names = [verb.name for verb in grammar.TABLE]
    assert len(names) == len(set(names))
    assert grammar.VERBS == (
        "status",
        "use",
        "grow",
        "limit",
        "split",
        "allocator",
        "precision",
        "free",
        "monitor",
        "trace",
        "save",
        "doctor",
        "reset",
    )
    assert grammar.CELL_VERBS == ("budget", "on")
    assert tuple(grammar.FORMS) == grammar.VERBS
    assert grammar.CELL_FORMS == ("%%gpu budget 2G", "%%gpu on 1")


@pytest.mark.parametrize("verb", grammar.TABLE, ids=lambda verb: verb.name)
def test_every_declared_form_parses(verb):
    for form in verb.forms:
        if verb.cell:
            assert grammar.parse_cell(form.removeprefix("%%gpu"))
        else:
            assert type(grammar.parse(form.removeprefix("%gpu"))).__name__.lower() == verb.name
    for flag in verb.flags:  # every flag Tab offers is shown in (and so parsed by) a valid form
        assert f"--{flag}" in " ".join(verb.forms)


def test_the_manual_is_generated_from_the_table():
    manual = grammar.manual()
    assert manual.startswith(
        "GPU settings, memory and sharing for TensorFlow, PyTorch and JAX, from inside the notebook.\n"
    )
    for verb in grammar.TABLE:
        for form, text in verb.manual:
            assert f"  {form}" in manual and text in manual
    assert (
        "  %gpu limit 4096         cap each visible GPU at 4096 MiB (4G | 1.5GiB | 50% | 4G,8G | off)\n"
        in manual
    )
    assert (
        "  %gpu precision mixed_float16   the Keras global dtype policy (mixed_bfloat16 | float32)\n"
        in manual
    )
    assert "  %%gpu on 1              run the cell with new tensors and ops placed on GPU 1\n" in manual
    assert "TensorFlow's stage" not in manual  # each framework's, not one's
    assert "Sizes are binary: 4G = 4GiB = 4096 MiB" in manual
    assert "Examples:\n  %gpu use 1\n" in manual
    assert manual.endswith(
        'Defaults for every kernel (ipython_config.py):\n  c.GpuMagics.defaults = ["grow", "limit 50%"]\n'
    )


@pytest.mark.parametrize(
    "line, offered",
    [
        ("", list(grammar.VERBS)),
        ("%gpu", list(grammar.VERBS)),
        ("%gpu ", list(grammar.VERBS)),
        ("%gpu li", list(grammar.VERBS)),
        ("%gpu precision ", list(grammar.PRECISIONS)),
        ("%gpu precision mixed", list(grammar.PRECISIONS)),
        ("%gpu USE ", ["all", "none", "auto", "auto:2", "--min-free", "--min-cc", "--wait"]),
        ("%gpu use auto ", ["all", "none", "auto", "auto:2", "--min-free", "--min-cc", "--wait"]),
        ("%gpu monitor ", ["off", "--sidebar", "--interval", "--window"]),
        ("%gpu status ", ["--json"]),
        ("%gpu free ", []),
        ("%gpu bogus ", []),
        ("%%gpu ", ["budget", "on"]),
        ("%%gpu on 1 ", ["budget"]),
        ("%%gpu budget 2G on 1 ", []),
    ],
)
def test_completion_offers_verbs_then_the_verbs_words(line, offered):
    assert grammar.complete(line) == offered


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_any_text_is_a_command_or_a_grammar_error(line):
    try:
        grammar.parse(line)
    except GrammarError as err:
        assert "valid: " in str(err) and str(err).isprintable()  # printable: one line, always


words = st.sampled_from(
    [
        "use",
        "grow",
        "limit",
        "split",
        "precision",
        "allocator",
        "status",
        "free",
        "reset",
        "trace",
        "monitor",
        "off",
        "on",
        "all",
        "none",
        "auto",
        "auto:2",
        "1",
        "0,2",
        "1,1",
        "-1",
        "4G",
        "50%",
        "101%",
        "0",
        "12abc",
        "--json",
        "--wait",
        "10m",
        "--min-free",
        "--sidebar",
        "mixed_float16",
        "budget",
        "--interval",
        "--window",
        "0.1",
        "2",
        "²",
        "9" * 400,
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(words, max_size=5))
def test_any_sequence_of_keywords_is_a_command_or_a_grammar_error(tokens):
    try:
        grammar.parse(" ".join(tokens))
    except GrammarError as err:
        assert "valid: " in str(err) and str(err).isprintable()


# -- comments: `%gpu use 1   # only GPU 1` (IPython hands the magic its comment) --------------------
@pytest.mark.parametrize(
    "line, code",
    [
        ("use 1  # TensorFlow sees only nvidia-smi's GPU 1", "use 1  "),
        ("# just a comment", ""),
        ("limit 8G\t# and never more", "limit 8G\t"),
        ("use 1 #no space after the hash", "use 1 "),
        ("trace a#b", "trace a#b"),  # inside a word, `#` is text, as in a shell
        ("monitor '# not a comment' # a comment", "monitor '# not a comment' "),
        ('monitor "it\'s # quoted" # it is', 'monitor "it\'s # quoted" '),
        (r"monitor \# escaped # comment", r"monitor \# escaped "),
        ("status", "status"),
    ],
)
def test_a_comment_starts_at_a_hash_that_begins_a_word_outside_quotes(line, code):
    assert grammar.strip_comment(line) == code


@settings(max_examples=300, deadline=None)
@given(st.lists(words, max_size=4), st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_a_comment_never_changes_what_a_line_means(tokens, comment):
    """Whatever a comment holds (quotes, `#`, backslashes, other verbs), the line means what it meant."""
    line = " ".join(tokens)

    def meaning(text):
        try:
            return grammar.parse(text)
        except GrammarError as err:
            return str(err)

    assert meaning(f"{line}  # {comment}") == meaning(line)
    assert meaning(f"{line}\t#{comment}") == meaning(line)


def test_a_cell_line_takes_a_comment_too():
    assert grammar.parse_cell("budget 2G on 1  # this cell only") == {"budget": 2 * 1024**3, "on": 1}
    with pytest.raises(GrammarError, match="needs `budget SIZE` or `on GPU`"):
        grammar.parse_cell("# nothing but a comment")


@pytest.mark.parametrize("line", ["%gpu use 1  # ", "%gpu use 1 # gr", "%%gpu budget 2G # o", "%gpu # "])
def test_nothing_is_offered_inside_a_comment(line):
    assert grammar.complete(line) == []
