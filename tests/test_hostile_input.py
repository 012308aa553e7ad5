"""Hostile input: whatever follows `%gpu VERB` or `%%gpu`, the answer is a command or one GrammarError.

A GrammarError is what the magic turns into IPython's one-line UsageError; anything else
(OverflowError, ValueError, a TraitError from the panel later) would be a traceback.  Every
GrammarError names the valid forms (``valid: ...``) and is one printable line.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from tfgpu_magic.command import grammar
from tfgpu_magic.command.grammar import GrammarError
from tfgpu_magic.kernel.cells import parse_cell_line

USE = grammar.usage("use")
LIMIT = grammar.usage("limit")
SPLIT = grammar.usage("split")
MONITOR = grammar.usage("monitor")
CELL = "valid: %%gpu budget 2G | %%gpu on 1"

NINES_309 = "9" * 309  # float() of this is inf: int(inf) raised OverflowError
NINES_400 = "9" * 400
NINES_5000 = "9" * 5000  # int() refuses over 4300 digits with a ValueError


def shown(text: str) -> str:
    """How a message quotes what the user typed: long input by its first 37 characters."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


# -- the reported cases, each with its exact message ----------------------------------------------
@pytest.mark.parametrize(
    "line, message",
    [
        (f"limit {NINES_309}", f"{shown(NINES_309)}: a size must be at most 1 PiB; {LIMIT}"),
        (f"limit {NINES_309}G", f"{shown(NINES_309 + 'G')}: a size must be at most 1 PiB; {LIMIT}"),
        ("limit 1025T", f"'1025T': a size must be at most 1 PiB; {LIMIT}"),
        (
            f"limit {NINES_309}%",
            f"{shown(NINES_309 + '%')}: a percentage must be above 0 and at most 100; {LIMIT}",
        ),
        ("limit ٤G", f"'٤G' is not a size; {LIMIT}"),  # Arabic-Indic 4: float() would take it
        ("limit ４G", f"'４G' is not a size; {LIMIT}"),  # fullwidth 4
        ("limit 1024\u212a", f"'1024\u212a' is not a size; {LIMIT}"),  # Kelvin sign folds to k
        (f"split {NINES_309}", f"{shown(NINES_309)}: the number of logical GPUs must be 1 to 16; {SPLIT}"),
        (f"split {NINES_5000}", f"{shown(NINES_5000)}: the number of logical GPUs must be 1 to 16; {SPLIT}"),
        (f"split {NINES_309}G", f"{shown(NINES_309 + 'G')}: a size must be at most 1 PiB; {SPLIT}"),
        ("split ²", f"'²' is neither a count nor a list of sizes; {SPLIT}"),
        ("use auto:²", f"'auto:²': auto:N needs a whole number N of at least 1; {USE}"),
        ("use auto:1025", f"'auto:1025': auto:N asks for at most 1024 GPUs; {USE}"),
        (
            f"use auto:{NINES_5000}",
            f"{shown('auto:' + NINES_5000)}: auto:N asks for at most 1024 GPUs; {USE}",
        ),
        ("use ١", f"'١' is not a GPU number or a comma list of them; {USE}"),  # int('١') is 1
        (f"use {NINES_5000}", f"{shown(NINES_5000)}: a GPU number is at most 1023; {USE}"),
        ("use 0,1024", f"'0,1024': a GPU number is at most 1023; {USE}"),
        (f"use auto --wait {NINES_400}", f"{shown(NINES_400)}: a duration must be at most 365 days; {USE}"),
        ("use auto --wait 8761h", f"'8761h': a duration must be at most 365 days; {USE}"),
        (f"use auto --min-free {NINES_400}", f"{shown(NINES_400)}: a size must be at most 1 PiB; {USE}"),
        (
            f"monitor --interval {NINES_400}",
            f"{shown(NINES_400)}: a duration must be at most 365 days; {MONITOR}",
        ),
        (
            f"monitor --window {NINES_400}",
            f"{shown(NINES_400)}: a duration must be at most 365 days; {MONITOR}",
        ),
        (
            "monitor --interval 0.1 --window 2",
            f"--window must be 5 s to 24 h and hold at least 10 samples; {MONITOR}",
        ),
        ("monitor --window 4.9", f"--window must be 5 s to 24 h and hold at least 10 samples; {MONITOR}"),
        (
            "monitor --interval 1 --window 9",
            f"--window must be 5 s to 24 h and hold at least 10 samples; {MONITOR}",
        ),
        ("monitor --interval 99ms", f"--interval must be 0.1 s to 60 s; {MONITOR}"),
        ("limit \x1b[31m", f"'\\x1b[31m' is not a size; {LIMIT}"),
        ("use 'unclosed", f'cannot read "use \'unclosed" (No closing quotation); {USE}'),
        ("'unclosed", f'cannot read "\'unclosed" (No closing quotation); {grammar.usage()}'),
        (
            "budget 2G",
            f"`%gpu budget` is a cell magic: put `%%gpu budget 2G` on the cell's first line; {CELL}",
        ),
    ],
)
def test_reported_lines_are_one_grammar_error(line, message):
    with pytest.raises(GrammarError) as info:
        grammar.parse(line)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "line, message",
    [
        (f"budget {NINES_309}", f"{shown(NINES_309)}: a size must be at most 1 PiB; {CELL}"),
        (f"budget {NINES_5000}", f"{shown(NINES_5000)}: a size must be at most 1 PiB; {CELL}"),
        ("budget 0", f"'0': a size must be at least 1 MiB; {CELL}"),
        ("budget ٤G", f"'٤G' is not a size (like 512M, 2G or 1.5GiB; a bare number is MiB); {CELL}"),
        ("on ²", f"'²' is not a GPU number (as nvidia-smi shows them); {CELL}"),
        ("on ١", f"'١' is not a GPU number (as nvidia-smi shows them); {CELL}"),
        (f"on {NINES_5000}", f"{shown(NINES_5000)}: a GPU number is at most 1023; {CELL}"),
    ],
)
def test_reported_cell_lines_are_one_grammar_error(line, message):
    with pytest.raises(GrammarError) as info:
        parse_cell_line(line)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "line, command",
    [
        ("limit 1024T", grammar.Limit((1024**3,))),  # exactly 1 PiB is allowed
        ("use auto --wait 8760h", grammar.Use(grammar.Auto(wait_seconds=365 * 86400.0))),
        ("use 1023", grammar.Use((1023,))),
        ("use 007", grammar.Use((7,))),
        ("use auto:1024", grammar.Use(grammar.Auto(count=1024))),
        ("monitor --interval 100ms --window 5", grammar.Monitor(interval=0.1, window=5.0)),
        ("monitor --interval 60 --window 24h", grammar.Monitor(interval=60.0, window=86400.0)),
    ],
)
def test_the_bounds_themselves_are_accepted(line, command):
    assert grammar.parse(line) == command


def test_the_grammar_refuses_what_the_panel_would_refuse():
    """The panel's traits are the bounds that matter: a line it would refuse must not get past parsing."""
    from tfgpu_magic.kernel import monitor
    from tfgpu_magic.kernel.widget import MemoryPanel

    traits = MemoryPanel.class_traits()
    assert traits["interval"].min == monitor.MIN_INTERVAL_S == grammar.MIN_INTERVAL_S
    assert traits["window"].min == grammar.MIN_WINDOW_S
    assert traits["interval"].max >= grammar.MAX_INTERVAL_S and traits["window"].max >= grammar.MAX_WINDOW_S


def test_a_refused_hostile_line_changes_nothing(gpu):
    gpu("limit 4G")
    before_plan, before_env = gpu.session.requested, dict(gpu.session.env)
    for line in (
        f"limit {NINES_309}",
        "split ²",
        f"use auto --wait {NINES_400}",
        "monitor --interval 0.1 --window 2",
    ):
        with pytest.raises(UsageError) as info:
            gpu(line)
        assert "valid: " in str(info.value) and str(info.value).isprintable()
    assert gpu.session.requested == before_plan
    assert gpu.session.env == before_env


# -- a fixed corpus over every verb, flag and cell word ---------------------------------------------
PREFIXES = (
    "",
    "status",
    "status --json",
    "use",
    "use auto",
    "use auto:2",
    "use auto --min-free",
    "use auto --wait",
    "grow",
    "limit",
    "split",
    "allocator",
    "precision",
    "free",
    "monitor",
    "monitor --sidebar",
    "monitor --interval",
    "monitor --window",
    "monitor --interval 0.1 --window",
    "monitor off",
    "trace",
    "doctor",
    "doctor --json",
    "reset",
)
CELL_PREFIXES = ("", "budget", "on", "on 1 budget", "budget 1G on")

FRAGMENTS = (
    "",
    "0",
    "00",
    "1",
    "007",
    "-1",
    "+1",
    "1.",
    ".5",
    "0.0",
    "0.1",
    "1.5",
    "1_000",
    "0x10",
    "1e3",
    "1e309",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "²",
    "auto:²",
    "١",
    "٤G",
    "４",
    "1²",
    "𝟙",
    "1024\u212a",
    NINES_309,
    NINES_400,
    NINES_5000,
    "1" + "0" * 308,
    NINES_309 + "G",
    NINES_309 + "%",
    NINES_400 + "ms",
    "0." + "0" * 400 + "1",
    "9" * 20 + "T",
    "1024T",
    "1025T",
    "1K",
    "4G",
    "4G,",
    "4G,,8G",
    ",",
    "1,1",
    "0,2",
    "50%",
    "0%",
    "101%",
    "99999%",
    "1ms",
    "100ms",
    "99ms",
    "10m",
    "1h",
    "8761h",
    "2",
    "5",
    "4.9",
    "60",
    "61",
    "24h",
    "25h",
    "auto",
    "auto:0",
    "auto:1025",
    "all",
    "none",
    "on",
    "off",
    "OFF",
    "async",
    "float32",
    "--json",
    "--wait",
    "--min-free",
    "--interval",
    "--window",
    "--sidebar",
    "--",
    "-",
    "\x00",
    "\x1b[31m",
    "\u2028",
    "\u0085",
    "\t",
    "\udc80",
    "İ",
    "ß",
    "'",
    '"',
    "'unclosed",
    '"a b"',
    "''",
    "\\",
    "a\\",
    "budget",
    "on",
)


def hostile_lines() -> list[tuple[str, str]]:
    """("line" or "cell", text): every prefix with one and with two fragments, some quoted."""
    out = []
    for kind, prefixes in (("line", PREFIXES), ("cell", CELL_PREFIXES)):
        for prefix, fragment in itertools.product(prefixes, FRAGMENTS):
            out.append((kind, f"{prefix} {fragment}"))
            out.append((kind, f"{prefix} '{fragment}' 1"))
    for interval, window in itertools.product(
        ("0.1", "100ms", "99ms", "60", "61", NINES_400), ("2", "5", "1", "10m", "25h", NINES_400)
    ):
        out.append(("line", f"monitor --interval {interval} --window {window}"))
    return out


def outcome(kind: str, line: str) -> str:
    """'ok', 'grammar' (a proper one-line GrammarError), or what went wrong instead."""
    try:
        (grammar.parse if kind == "line" else parse_cell_line)(line)
    except GrammarError as err:
        message = str(err)
        if "valid: " not in message or not message.isprintable():
            return f"bad message: {message[:80]!r}"
        return "grammar"
    except Exception as err:
        return type(err).__name__
    return "ok"


def test_the_corpus_gives_only_commands_and_grammar_errors():
    lines = hostile_lines()
    assert len(lines) > 4000
    wrong = [
        (kind, line[:60], result)
        for kind, line in lines
        if (result := outcome(kind, line)) not in ("ok", "grammar")
    ]
    assert wrong == []


def test_accepted_monitor_lines_suit_the_panel():
    """Every monitor line the grammar accepts gives values the panel's traits accept."""
    for kind, line in hostile_lines():
        if kind == "line" and line.startswith("monitor") and outcome(kind, line) == "ok":
            command = grammar.parse(line)
            if not command.off:
                interval = (
                    0.5 if command.interval is None else command.interval
                )  # None: the running sampler's
                assert interval >= grammar.MIN_INTERVAL_S
                assert grammar.MIN_WINDOW_S <= command.window and interval * 10 <= command.window


# -- a property over arbitrary text after every verb ------------------------------------------------
fragment = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Cc", "Zs", "Zl", "Cs"]), max_size=6),
    st.integers(300, 5000).map(lambda n: "9" * n),
    st.tuples(st.integers(300, 500), st.sampled_from(["", "G", "%", "ms", "h", ".5"])).map(
        lambda t: "9" * t[0] + t[1]
    ),
    st.sampled_from(FRAGMENTS),
)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(PREFIXES), st.lists(fragment, max_size=3), st.booleans())
def test_any_text_after_any_verb_is_a_command_or_a_grammar_error(prefix, fragments, quoted):
    words = [repr(f) if quoted else f for f in fragments]
    assert outcome("line", " ".join([prefix, *words])) in ("ok", "grammar")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CELL_PREFIXES), st.lists(fragment, max_size=3))
def test_any_text_after_a_cell_word_is_a_command_or_a_grammar_error(prefix, fragments):
    assert outcome("cell", " ".join([prefix, *fragments])) in ("ok", "grammar")
