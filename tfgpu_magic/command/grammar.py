"""The ``%gpu`` command language: a line in, a typed command out, or a :class:`GrammarError`.

Parsing is pure: it knows nothing of GPUs present, TensorFlow or IPython.  Checks that need
the machine (``use 9`` on a 4-GPU server, a limit above a GPU's memory) happen in
:mod:`tfgpu_magic.kernel.session`.  Every error message names the valid forms of its verb.

Each verb, ``%%gpu`` cell words included, is declared once, in :data:`TABLE`: its parser, its
valid forms, its lines in the manual and its Tab completions.  Error messages (:func:`usage`),
the manual (:func:`manual`, which is ``%gpu?``), :data:`VERBS` and :func:`complete` are all
read from that table, so a verb cannot be added, renamed or changed in one place and not another.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import replace
from typing import Literal, TypeVar, overload

from ..records import Record
from .commands import (  # the values a line becomes, named here too (grammar.Use, ...)
    Allocator,
    Auto,
    Command,
    Doctor,
    Everything,
    Free,
    Grow,
    Limit,
    Monitor,
    Percent,
    Precision,
    Reset,
    Save,
    Size,
    Split,
    Status,
    Trace,
    Use,
)

__all__ = [
    "CELL_FORMS",
    "CELL_VERBS",
    "FORMS",
    "FRAMEWORK_WORDS",
    "PRECISIONS",
    "TABLE",
    "VERBS",
    "Allocator",
    "Auto",
    "Command",
    "Doctor",
    "Everything",
    "Free",
    "GrammarError",
    "Grow",
    "Limit",
    "Monitor",
    "Percent",
    "Precision",
    "Reset",
    "Save",
    "Size",
    "Split",
    "Status",
    "Trace",
    "Use",
    "Verb",
    "cell_usage",
    "complete",
    "manual",
    "parse",
    "parse_bytes",
    "parse_capability",
    "parse_cell",
    "parse_duration",
    "parse_size",
    "split_line",
    "strip_comment",
    "usage",
]

MIB = 1024 * 1024


class GrammarError(ValueError):
    """A line that is not a valid ``%gpu`` command; the message is shown as one line."""


T = TypeVar("T")

# The words `%gpu limit 6G tensorflow, 2G jax` accepts for a framework, and the key each names.
FRAMEWORK_WORDS = {
    "tensorflow": "tensorflow",
    "tf": "tensorflow",
    "pytorch": "pytorch",
    "torch": "pytorch",
    "jax": "jax",
}


PRECISIONS = ("mixed_float16", "mixed_bfloat16", "float32")
MAX_SPLIT = 16

# Upper bounds, checked before any int() or float() result is used: hostile input (a 400-digit
# limit, say) must be refused in one line, never overflow.  Each is far beyond real use.
MAX_SIZE_MIB = 1024**3  # 1 PiB
MAX_DURATION_S = 365 * 24 * 3600.0
MAX_GPU_INDEX = 1023  # GPU numbers (nvidia-smi's) 0..1023
MAX_GPUS = MAX_GPU_INDEX + 1

# The memory panel's own bounds (monitor.MIN_INTERVAL_S; widget.MemoryPanel's `window` trait):
# a line the panel would refuse with a TraitError must be refused here, with the valid forms.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 60.0
MIN_WINDOW_S, MAX_WINDOW_S = 5.0, 24 * 3600.0
MIN_SAMPLES_SHOWN = 10  # a window holds at least this many intervals


def _fail(verb: str, what: str) -> GrammarError:
    return GrammarError(f"{what}; {usage(verb)}")


def _shown(text: str) -> str:
    """What the user typed, quoted for a message: repr() escapes control characters and line
    breaks (the message stays one line), and long input shows its first 37 characters."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


class _Refused(Exception):
    """Why a value was refused; the caller adds its verb's valid forms (see :func:`_fail`)."""


class _NotASize(_Refused):
    """Not written as a size at all (``%%gpu budget`` words this its own way)."""


# -- numbers ------------------------------------------------------------------------------------
# ASCII digits only: str.isdigit() and a Unicode \d also take '²' (which int() refuses) and
# '١' or '４' (which int() and float() read as 1 and 4): neither belongs in a command.
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def _bounded_int(digits: str, most: int) -> int:
    """The value of ASCII ``digits``; a string too long to be at most ``most`` gives ``most + 1``.

    So long strings never reach int(), which refuses more than 4,300 digits with a ValueError.
    """
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(most)):
        return most + 1
    return int(significant)


# -- sizes and durations ------------------------------------------------------------------------
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b?|%)?", re.IGNORECASE | re.ASCII)
_UNIT_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


@overload
def parse_size(text: str, verb: str = ..., *, percent: Literal[False]) -> int: ...
@overload
def parse_size(text: str, verb: str = ..., percent: bool = ...) -> Size: ...
def parse_size(text: str, verb: str = "limit", percent: bool = True) -> Size:
    """``4096`` (MiB), ``512M``, ``4G``, ``1.5GiB``, ``50%`` -> MiB as int, or :class:`Percent`.

    Units are binary, as nvidia-smi and TensorFlow count: ``G``, ``GB`` and ``GiB`` all mean
    1024 MiB.  A bare number is MiB, like TensorFlow's ``memory_limit``.  At most 1 PiB.
    """
    try:
        return _size(text, percent)
    except _Refused as refused:
        raise _fail(verb, str(refused)) from None


@overload
def _size(text: str, percent: Literal[False]) -> int: ...
@overload
def _size(text: str, percent: bool) -> Size: ...
def _size(text: str, percent: bool) -> Size:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise _NotASize(f"{_shown(text)} is not a size")
    # float() of a digit string is finite or inf, never an error; inf fails the bounds below,
    # so int() never sees it.
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit == "%":
        if not percent:
            raise _NotASize(f"{_shown(text)}: a percentage is not allowed here")
        if not 0 < number <= 100:
            raise _Refused(f"{_shown(text)}: a percentage must be above 0 and at most 100")
        return Percent(number)
    if not unit and "." in match.group(1):
        raise _Refused(f"{_shown(text)}: a bare number is whole MiB")
    mib = number * _UNIT_MIB[unit[0]] if unit else number
    if mib > MAX_SIZE_MIB:
        raise _Refused(f"{_shown(text)}: a size must be at most 1 PiB")
    if int(mib) < 1:
        raise _Refused(f"{_shown(text)}: a size must be at least 1 MiB")
    return int(mib)


def parse_bytes(text: str, verb: str) -> int:
    """A size without percentages, in bytes (for ``--min-free``)."""
    return int(parse_size(text, verb, percent=False)) * MIB


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?", re.IGNORECASE | re.ASCII)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "": 1}


def parse_duration(text: str, verb: str) -> float:
    """``30``, ``30s``, ``10m``, ``1h``, ``200ms`` -> seconds, at most 365 days."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise _fail(verb, f"{_shown(text)} is not a duration (like 30s, 10m, 1h)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "").lower()]
    if seconds > MAX_DURATION_S:  # inf included: a float of 309+ digits
        raise _fail(verb, f"{_shown(text)}: a duration must be at most 365 days")
    return seconds


@overload
def _size_list(text: str, verb: str, percent: Literal[False]) -> tuple[int, ...]: ...
@overload
def _size_list(text: str, verb: str, percent: bool = ...) -> tuple[Size, ...]: ...
def _size_list(text: str, verb: str, percent: bool = True) -> tuple[Size, ...]:
    parts = text.split(",")
    if any(not p.strip() for p in parts):
        raise _fail(verb, f"{_shown(text)} has an empty entry")
    return tuple(parse_size(p, verb, percent) for p in parts)


_CAPABILITY = re.compile(r"([0-9]{1,2})\.([0-9])", re.ASCII)


def parse_capability(text: str, verb: str) -> tuple[int, int]:
    """A CUDA compute capability, ``8.0`` or ``8.6``: (major, minor)."""
    found = _CAPABILITY.fullmatch(text.strip())
    if not found:
        raise _fail(verb, f"{_shown(text)} is not a compute capability such as 8.0")
    return int(found.group(1)), int(found.group(2))


# -- options ------------------------------------------------------------------------------------
def _options(
    verb: str, tokens: list[str], allowed: dict[str, Callable[[str], object] | None]
) -> dict[str, object]:
    """``--name value`` pairs (or ``--flag`` when the converter is None), each at most once."""
    found: dict[str, object] = {}
    items = iter(tokens)
    for token in items:
        name = token[2:] if token.startswith("--") else None
        if name not in allowed:
            raise _fail(verb, f"unexpected {_shown(token)}")
        if name in found:
            raise _fail(verb, f"{token} given twice")
        convert = allowed[name]
        if convert is None:
            found[name] = True
            continue
        value = next(items, None)
        if value is None:
            raise _fail(verb, f"{token} needs a value")
        found[name] = convert(value)
    return found


def _given(found: dict[str, object], name: str, kind: type[T]) -> T | None:
    """Option ``name`` as its converter made it (a ``kind``); None when it was not given."""
    value = found.get(name)
    if value is None or isinstance(value, kind):
        return value
    raise TypeError(f"--{name} converted to {type(value).__name__}, not {kind.__name__}")  # a bug


def _no_more(verb: str, tokens: list[str]) -> None:
    if tokens:
        raise _fail(verb, f"unexpected {_shown(' '.join(tokens))}")


def _one(verb: str, tokens: list[str]) -> str:
    if not tokens:
        raise _fail(verb, f"`%gpu {verb}` needs an argument")
    _no_more(verb, tokens[1:])
    return tokens[0]


# -- line verbs ---------------------------------------------------------------------------------
_INDEX_LIST = re.compile(r"[0-9]+(,[0-9]+)*", re.ASCII)
_AUTO_OPTIONS: dict[str, Callable[[str], object] | None] = {
    "min-free": lambda v: parse_bytes(v, "use"),
    "min-cc": lambda v: parse_capability(v, "use"),
    "wait": lambda v: parse_duration(v, "use"),
}
_STATUS_OPTIONS: dict[str, Callable[[str], object] | None] = {"json": None}
_DOCTOR_OPTIONS: dict[str, Callable[[str], object] | None] = {"json": None}
_MONITOR_OPTIONS: dict[str, Callable[[str], object] | None] = {
    "sidebar": None,
    "interval": lambda v: parse_duration(v, "monitor"),
    "window": lambda v: parse_duration(v, "monitor"),
}


def _use(tokens: list[str]) -> Use:
    if not tokens:
        raise _fail("use", "`%gpu use` needs GPUs")
    first, rest = tokens[0].lower(), tokens[1:]
    if first in ("all", "none"):
        _no_more("use", rest)
        return Use("all" if first == "all" else "none")
    if first == "auto" or first.startswith("auto:"):
        return Use(_auto(first, rest))
    _no_more("use", rest)
    if not _INDEX_LIST.fullmatch(first):
        raise _fail("use", f"{_shown(tokens[0])} is not a GPU number or a comma list of them")
    gpus = tuple(_bounded_int(x, MAX_GPU_INDEX) for x in first.split(","))
    if max(gpus) > MAX_GPU_INDEX:
        raise _fail("use", f"{_shown(tokens[0])}: a GPU number is at most {MAX_GPU_INDEX}")
    if len(set(gpus)) != len(gpus):
        raise _fail("use", f"{_shown(tokens[0])} names a GPU twice")
    return Use(gpus)


def _auto(first: str, rest: list[str]) -> Auto:
    count = 1
    if first.startswith("auto:"):
        text = first[5:]
        count = _bounded_int(text, MAX_GPUS) if _DIGITS.fullmatch(text) else 0
        if count < 1:
            raise _fail("use", f"{_shown(first)}: auto:N needs a whole number N of at least 1")
        if count > MAX_GPUS:
            raise _fail("use", f"{_shown(first)}: auto:N asks for at most {MAX_GPUS} GPUs")
    opts = _options("use", rest, _AUTO_OPTIONS)
    return Auto(
        count, _given(opts, "min-free", int), _given(opts, "wait", float), _given(opts, "min-cc", tuple)
    )


def _on_off(verb: str, tokens: list[str]) -> bool:
    if not tokens:
        return True
    word = _one(verb, tokens).lower()
    if word not in ("on", "off"):
        raise _fail(verb, f"unexpected {_shown(word)}")
    return word == "on"


def _grow(tokens: list[str]) -> Grow:
    return Grow(_on_off("grow", tokens))


def _trace(tokens: list[str]) -> Trace:
    return Trace(_on_off("trace", tokens))


def _limit(tokens: list[str]) -> Limit:
    flags = [t for t in tokens if t.startswith("--")]
    if flags:
        _options("limit", flags, _LIMIT_OPTIONS)
        sized = _limit([t for t in tokens if not t.startswith("--")])
        if sized.sizes is None and sized.shares is None:
            raise _fail("limit", "--hard needs a size: `%gpu limit off` has nothing to hold")
        return replace(sized, hard=True)
    if any(t.strip(",").lower() in FRAMEWORK_WORDS for t in tokens[1:]):  # `limit 6G tensorflow, 2G jax`
        return Limit(None, _shares(" ".join(tokens)))
    text = _one("limit", tokens)
    if text.lower() == "off":
        return Limit(None)
    return Limit(_size_list(text, "limit"))


_LIMIT_OPTIONS: dict[str, Callable[[str], object] | None] = {"hard": None}


def _shares(text: str) -> tuple[tuple[str, Size], ...]:
    """``6G tensorflow, 2G jax`` -> (("tensorflow", 6144), ("jax", 2048)): each framework once."""
    shares: dict[str, Size] = {}
    for part in text.split(","):
        words = part.split()
        if len(words) != 2 or words[1].lower() not in FRAMEWORK_WORDS:
            raise _fail(
                "limit", f"{_shown(part.strip())} is not a share: give a size and a framework, e.g. `4G jax`"
            )
        key = FRAMEWORK_WORDS[words[1].lower()]
        if key in shares:
            raise _fail("limit", f"{_shown(words[1])} has two shares: give each framework one")
        shares[key] = parse_size(words[0], "limit")
    return tuple(shares.items())


def _split(tokens: list[str]) -> Split:
    text = _one("split", tokens)
    if text.lower() == "off":
        return Split()
    if _DIGITS.fullmatch(text):
        count = _bounded_int(text, MAX_SPLIT)
        if not 1 <= count <= MAX_SPLIT:
            raise _fail("split", f"{_shown(text)}: the number of logical GPUs must be 1 to {MAX_SPLIT}")
        return Split(count=count)
    if not any(c.isalpha() for c in text) and "," not in text:
        raise _fail("split", f"{_shown(text)} is neither a count nor a list of sizes")
    sizes = _size_list(text, "split", percent=False)
    if len(sizes) > MAX_SPLIT:
        raise _fail("split", f"at most {MAX_SPLIT} logical GPUs per GPU")
    return Split(sizes=tuple(int(s) for s in sizes))


ALLOCATORS = ("async", "default", "platform")


def _allocator(tokens: list[str]) -> Allocator:
    name = _one("allocator", tokens).lower()
    if name not in ALLOCATORS:
        raise _fail("allocator", f"unknown allocator {_shown(name)}")
    return Allocator(name)


def _precision(tokens: list[str]) -> Precision:
    policy = _one("precision", tokens)
    if policy not in PRECISIONS:
        raise _fail("precision", f"unknown precision {_shown(policy)}")
    return Precision(policy)


def _status(tokens: list[str]) -> Status:
    return Status(json=bool(_options("status", tokens, _STATUS_OPTIONS)))


def _doctor(tokens: list[str]) -> Doctor:
    return Doctor(json=bool(_options("doctor", tokens, _DOCTOR_OPTIONS)))


def _monitor(tokens: list[str]) -> Monitor:
    if tokens and tokens[0].lower() == "off":
        _no_more("monitor", tokens[1:])
        return Monitor(off=True)
    opts = _options("monitor", tokens, _MONITOR_OPTIONS)
    given = _given(opts, "interval", float)
    # No --interval: the panel joins the running sampler at its interval; 0.5 s bounds the window.
    interval = 0.5 if given is None else given
    window = _given(opts, "window", float)
    window = 300.0 if window is None else window
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise _fail("monitor", f"--interval must be {MIN_INTERVAL_S:g} s to {MAX_INTERVAL_S:g} s")
    if not (MIN_WINDOW_S <= window <= MAX_WINDOW_S and interval * MIN_SAMPLES_SHOWN <= window):
        raise _fail(
            "monitor",
            f"--window must be {MIN_WINDOW_S:g} s to {MAX_WINDOW_S / 3600:g} h "
            f"and hold at least {MIN_SAMPLES_SHOWN} samples",
        )
    return Monitor(bool(opts.get("sidebar", False)), None if given is None else interval, window)


def _save(tokens: list[str]) -> Save:
    _no_more("save", tokens)
    return Save()


def _free(tokens: list[str]) -> Free:
    _no_more("free", tokens)
    return Free()


def _reset(tokens: list[str]) -> Reset:
    _no_more("reset", tokens)
    return Reset()


# -- cell words (`%%gpu budget 2G`, `%%gpu on 1`) --------------------------------------------------
# Each takes exactly one value; :func:`parse_cell` reads the words of a line in any order.
def _budget(tokens: list[str]) -> int:
    """The budget in bytes."""
    if not tokens:
        raise _fail("budget", "`%%gpu budget` needs a size")
    try:
        mib = _size(tokens[0], percent=False)
    except _NotASize:
        raise _fail(
            "budget", f"{_shown(tokens[0])} is not a size (like 512M, 2G or 1.5GiB; a bare number is MiB)"
        ) from None
    except _Refused as refused:  # a size, but out of bounds
        raise _fail("budget", str(refused)) from None
    return int(mib) * MIB


def _on(tokens: list[str]) -> int:
    """The GPU's NVML index, as nvidia-smi and `%gpu use` number GPUs."""
    if not tokens:
        raise _fail("on", "`%%gpu on` needs a GPU number")
    if not _DIGITS.fullmatch(tokens[0]):
        raise _fail("on", f"{_shown(tokens[0])} is not a GPU number (as nvidia-smi shows them)")
    gpu = _bounded_int(tokens[0], MAX_GPU_INDEX)
    if gpu > MAX_GPU_INDEX:
        raise _fail("on", f"{_shown(tokens[0])}: a GPU number is at most {MAX_GPU_INDEX}")
    return gpu


# -- the table: each verb declared once ----------------------------------------------------------
class Verb(Record):
    """One verb of ``%gpu`` (or one word of ``%%gpu`` when ``cell``), declared once.

    ``parse`` gets the tokens after the verb and returns its command (a cell word: its value),
    or raises :class:`GrammarError`.  ``forms`` are the valid forms every error message names;
    ``manual`` the ``(form, what it does)`` lines of ``%gpu?``; ``words`` and ``flags`` (without
    their ``--``) what Tab offers after the verb.
    """

    name: str
    parse: Callable[[list[str]], object]
    forms: tuple[str, ...]
    manual: tuple[tuple[str, str], ...]
    words: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    cell: bool = False

    @property
    def completions(self) -> tuple[str, ...]:
        return self.words + tuple(f"--{flag}" for flag in self.flags)


# In the manual's order; the line verbs' order is also that of usage() and VERBS.
TABLE: tuple[Verb, ...] = (
    Verb(
        "status",
        _status,
        forms=("%gpu", "%gpu status", "%gpu status --json"),
        manual=(
            ("%gpu, %gpu status", "what was asked, what is in force, each framework's stage, the GPUs"),
            ("%gpu status --json", "the same as JSON, for scripts"),
        ),
        flags=tuple(_STATUS_OPTIONS),
    ),
    Verb(
        "use",
        _use,
        forms=(
            "%gpu use 1",
            "%gpu use 0,2",
            "%gpu use all",
            "%gpu use none",
            "%gpu use auto",
            "%gpu use auto:2 --min-free 10G --wait 10m",
            "%gpu use auto --min-cc 8.0",
        ),
        manual=(
            ("%gpu use 1", "show the frameworks only GPU 1 (also: 0,2 | all | none)"),
            ("%gpu use auto", "pick the freest GPU and claim it (auto:2, --min-free 10G, --wait 10m)"),
            ("%gpu use auto --min-cc 8.0", "only GPUs of CUDA compute capability 8.0 or above"),
        ),
        words=("all", "none", "auto", "auto:2"),
        flags=tuple(_AUTO_OPTIONS),
    ),
    Verb(
        "grow",
        _grow,
        forms=("%gpu grow", "%gpu grow off"),
        manual=(("%gpu grow [off]", "memory growth on every visible GPU (JAX: no preallocation)"),),
        words=("on", "off"),
    ),
    Verb(
        "limit",
        _limit,
        forms=(
            "%gpu limit 4096",
            "%gpu limit 4G",
            "%gpu limit 1.5GiB",
            "%gpu limit 50%",
            "%gpu limit 4G,8G",
            "%gpu limit 6G tensorflow, 2G jax",
            "%gpu limit 8G --hard",
            "%gpu limit off",
        ),
        manual=(
            ("%gpu limit 4096", "cap each visible GPU at 4096 MiB (4G | 1.5GiB | 50% | 4G,8G | off)"),
            (
                "%gpu limit 6G tensorflow, 2G jax",
                "the kernel's limit in shares, one per framework (tf | torch | jax)",
            ),
            ("%gpu limit 8G --hard", "a limit the whole process cannot exceed (needs MPS or MIG)"),
        ),
        words=("off", "50%", "4G"),
        flags=tuple(_LIMIT_OPTIONS),
    ),
    Verb(
        "split",
        _split,
        forms=("%gpu split 2", "%gpu split 4G,4G", "%gpu split off"),
        manual=(("%gpu split 2", "TensorFlow: two logical GPUs on each visible GPU (split 4G,4G | off)"),),
        words=("2", "off"),
    ),
    Verb(
        "allocator",
        _allocator,
        forms=("%gpu allocator async", "%gpu allocator default", "%gpu allocator platform"),
        manual=(
            ("%gpu allocator async", "CUDA's async allocator in each framework, which returns freed memory"),
            ("%gpu allocator platform", "JAX only: allocates on demand and hands memory back (slow)"),
        ),
        words=ALLOCATORS,
    ),
    Verb(
        "precision",
        _precision,
        forms=tuple(f"%gpu precision {p}" for p in PRECISIONS),
        manual=(
            ("%gpu precision mixed_float16", "the Keras global dtype policy (mixed_bfloat16 | float32)"),
        ),
        words=PRECISIONS,
    ),
    Verb(
        "free",
        _free,
        forms=("%gpu free",),
        manual=(
            (
                "%gpu free",
                "empty the frameworks' caches (and Keras's session), with the driver's before/after",
            ),
        ),
    ),
    Verb(
        "monitor",
        _monitor,
        forms=(
            "%gpu monitor",
            "%gpu monitor --sidebar --interval 0.2 --window 10m",
            "%gpu monitor off",
        ),
        manual=(
            ("%gpu monitor", "a live memory chart (--sidebar, --interval 0.2, --window 10m)"),
            ("%gpu monitor off", "stop every panel of this kernel and its sampling thread"),
        ),
        words=("off",),
        flags=tuple(_MONITOR_OPTIONS),
    ),
    Verb(
        "budget",
        _budget,
        forms=("%%gpu budget 2G",),
        manual=(
            ("%%gpu budget 2G", "run the cell; fail it if a framework's peak rose more than 2 GiB during it"),
        ),
        cell=True,
    ),
    Verb(
        "on",
        _on,
        forms=("%%gpu on 1",),
        manual=(("%%gpu on 1", "run the cell with new tensors and ops placed on GPU 1"),),
        cell=True,
    ),
    Verb(
        "trace",
        _trace,
        forms=("%gpu trace", "%gpu trace off"),
        manual=(
            ("%gpu trace [off]", "after each cell: each framework's allocator peak and retained change"),
        ),
        words=("on", "off"),
    ),
    Verb(
        "save",
        _save,
        forms=("%gpu save",),
        manual=(
            (
                "%gpu save",
                "keep this notebook's GPU needs and settings in its metadata, applied when its kernel starts",
            ),
        ),
    ),
    Verb(
        "doctor",
        _doctor,
        forms=("%gpu doctor", "%gpu doctor --json"),
        manual=(
            (
                "%gpu doctor",
                "how this kernel shares its GPUs: each finding, its evidence and the fix (--json)",
            ),
        ),
        flags=tuple(_DOCTOR_OPTIONS),
    ),
    Verb(
        "reset",
        _reset,
        forms=("%gpu reset",),
        manual=(("%gpu reset", "forget requested settings not yet in force"),),
    ),
)

_LINE_VERBS = {verb.name: verb for verb in TABLE if not verb.cell}
_CELL_VERBS = {verb.name: verb for verb in TABLE if verb.cell}

VERBS = tuple(_LINE_VERBS)  # the words after `%gpu`
CELL_VERBS = tuple(_CELL_VERBS)  # the words of a `%%gpu` line
FORMS: dict[str, tuple[str, ...]] = {name: verb.forms for name, verb in _LINE_VERBS.items()}
CELL_FORMS = tuple(form for verb in _CELL_VERBS.values() for form in verb.forms)


def usage(verb: str | None = None) -> str:
    """The valid forms of one verb, or of every ``%gpu`` verb, as one line.

    Cell words share one line (``%%gpu on 1 budget 2G``), so each names the forms of all of them.
    """
    if verb is None:  # a line whose verb is unknown: every form, so the right one is in sight
        return "valid: " + " | ".join(form for forms in FORMS.values() for form in forms)
    if verb in _CELL_VERBS:
        return cell_usage()
    return "valid: " + " | ".join(_LINE_VERBS[verb].forms)


def cell_usage() -> str:
    """The valid forms of a ``%%gpu`` line."""
    return "valid: " + " | ".join(CELL_FORMS)


# -- parsing -------------------------------------------------------------------------------------
def strip_comment(line: str) -> str:
    """The line without its comment: a ``#`` that starts a word, outside quotes, and what follows.

    IPython hands a line magic its whole line, comment included (``%gpu use 1  # GPU 1 only``),
    and so does the shell for a cell magic's first line.  As in a POSIX shell, ``#`` inside a
    word (``a#b``) or inside quotes is text, and a backslash escapes the next character.
    """
    quote = ""
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def split_line(line: str) -> list[str]:
    """The words of a ``%gpu`` line, its comment left out, quotes read as a shell reads them."""
    code = strip_comment(line)
    try:
        return shlex.split(code)
    except ValueError as err:  # an unclosed quote, a trailing backslash
        raise GrammarError(
            f"cannot read {_shown(code.strip())} ({err}); {usage(_first_verb(code))}"
        ) from None


def parse(line: str) -> Command:
    """Parse the text after ``%gpu``.  An empty line (or a comment alone) is ``status``."""
    tokens = split_line(line)
    if not tokens:
        return Status()
    word = tokens[0].lower()
    if word in _CELL_VERBS:
        form = _CELL_VERBS[word].forms[0]
        raise GrammarError(
            f"`%gpu {word}` is a cell magic: put `{form}` on the cell's first line; {cell_usage()}"
        )
    verb = _LINE_VERBS.get(word)
    if verb is None:
        raise GrammarError(f"unknown subcommand {_shown(tokens[0])}; {usage()}")
    command = verb.parse(tokens[1:])
    if not isinstance(command, Command):  # a line verb's parser returns its command: a bug otherwise
        raise TypeError(f"%gpu {word} parsed to {type(command).__name__}, not a command")
    return command


def _first_verb(line: str) -> str | None:
    """The verb a line that shlex cannot read starts with, if it is one: its forms help most."""
    words = line.split(maxsplit=1)
    return words[0].lower() if words and words[0].lower() in _LINE_VERBS else None


def parse_cell(line: str) -> dict[str, int]:
    """The words of a ``%%gpu`` line, in any order, each once: ``{"budget": bytes, "on": gpu}``."""
    tokens = split_line(line)
    if not tokens:
        raise GrammarError(f"`%%gpu` needs `budget SIZE` or `on GPU`; {cell_usage()}")
    found: dict[str, int] = {}
    while tokens:
        word, tokens = tokens[0].lower(), tokens[1:]
        verb = _CELL_VERBS.get(word)
        if verb is None:
            raise GrammarError(f"unknown cell subcommand {_shown(word)}; {cell_usage()}")
        if word in found:
            raise GrammarError(f"`{word}` given twice; {cell_usage()}")
        value = verb.parse(tokens[:1])  # each word takes one value
        if not isinstance(value, int):  # a cell word's parser returns a number: a bug otherwise
            raise TypeError(f"%%gpu {word} parsed to {type(value).__name__}, not a number")
        found[word] = value
        tokens = tokens[1:]
    return found


# -- what the table shows ------------------------------------------------------------------------
_INTRO = """GPU settings, memory and sharing for TensorFlow, PyTorch and JAX, from inside the notebook.

GPU numbers are nvidia-smi's.  Settings land before each framework reads them (TensorFlow's and
JAX's first operation, PyTorch's first CUDA call), even when the import comes later in the same
cell; once a framework has started, an identical setting is accepted quietly and a different one
is refused with the line to put at the top of the notebook.
"""

_NOTES = """Sizes are binary: 4G = 4GiB = 4096 MiB; a bare number is MiB, like TensorFlow's memory_limit.

Examples:
  %gpu use 1
  %gpu grow
  %gpu limit 50%
  import torch                 # or jax, or tensorflow: the settings above reach it as it starts

Defaults for every kernel (ipython_config.py):
  c.GpuMagics.defaults = ["grow", "limit 50%"]
"""


def manual() -> str:
    """The ``%gpu?`` text: the intro, one line per form in :data:`TABLE`, sizes and examples."""
    lines = [_manual_line(form, text) for verb in TABLE for form, text in verb.manual]
    return _INTRO + "\n" + "\n".join(lines) + "\n\n" + _NOTES


def _manual_line(form: str, text: str) -> str:
    gap = max(24 - len(form), 3)  # descriptions line up; a long form keeps three spaces
    return f"  {form}{' ' * gap}{text}"


def complete(line: str) -> list[str]:
    """Tab completion for a ``%gpu`` (or ``%%gpu``) line: the verbs, then the verb's words.

    Nothing is offered inside the line's comment.
    """
    if strip_comment(line) != line:
        return []
    typed = line.split()
    typing_new_word = not line or line[-1].isspace()
    done = typed[1:] if typing_new_word else typed[1:-1]  # the words already complete
    if typed and typed[0].startswith("%%"):
        return _complete_cell(done)
    if not done:
        return list(VERBS)
    verb = _LINE_VERBS.get(done[0].lower())
    return list(verb.completions) if verb else []


def _complete_cell(done: list[str]) -> list[str]:
    """Cell words alternate with their values: offer the unused words, or the word's values."""
    if len(done) % 2 == 0:
        used = {word.lower() for word in done[::2]}
        return [name for name in CELL_VERBS if name not in used]
    verb = _CELL_VERBS.get(done[-1].lower())
    return list(verb.completions) if verb else []
