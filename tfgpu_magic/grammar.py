"""The ``%gpu`` command language: a line in, a typed command out, or a :class:`GrammarError`.

Parsing is pure: it knows nothing of GPUs present, TensorFlow or IPython.  Checks that need
the machine (``use 9`` on a 4-GPU server, a limit above a GPU's memory) happen in
:mod:`tfgpu_magic.session`.  Every error message names the valid forms of its verb.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable, Optional, Union

__all__ = [
    "Allocator",
    "Auto",
    "Free",
    "GrammarError",
    "Grow",
    "Limit",
    "Monitor",
    "Percent",
    "Precision",
    "Reset",
    "Split",
    "Status",
    "Trace",
    "Use",
    "FORMS",
    "PRECISIONS",
    "parse",
    "parse_duration",
    "parse_size",
    "usage",
]

MIB = 1024 * 1024


class GrammarError(ValueError):
    """A line that is not a valid ``%gpu`` command; the message is shown as one line."""


# -- values -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Percent:
    """A share of each GPU's total memory, 0 < value <= 100."""

    value: float

    def __str__(self) -> str:
        return f"{self.value:g}%"


Size = Union[int, Percent]  # an int is MiB


@dataclass(frozen=True)
class Auto:
    """``use auto``: let the product choose GPUs (see :mod:`tfgpu_magic.inventory`)."""

    count: int = 1
    min_free_bytes: Optional[int] = None
    wait_seconds: Optional[float] = None


# -- commands -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Use:
    gpus: Union[tuple[int, ...], str, Auto]  # NVML indices, "all", "none", or Auto


@dataclass(frozen=True)
class Grow:
    on: bool


@dataclass(frozen=True)
class Limit:
    sizes: Optional[tuple[Size, ...]]  # None: off; one size for every GPU, or one per GPU


@dataclass(frozen=True)
class Split:
    count: Optional[int] = None  # n equal logical GPUs on each visible GPU
    sizes: Optional[tuple[int, ...]] = None  # explicit MiB of each logical GPU

    @property
    def off(self) -> bool:
        return self.count is None and self.sizes is None


@dataclass(frozen=True)
class Allocator:
    name: str  # "async" or "default"


@dataclass(frozen=True)
class Precision:
    policy: str


@dataclass(frozen=True)
class Free:
    pass


@dataclass(frozen=True)
class Status:
    json: bool = False


@dataclass(frozen=True)
class Reset:
    pass


@dataclass(frozen=True)
class Monitor:
    sidebar: bool = False
    interval: float = 0.5  # seconds between samples
    window: float = 300.0  # seconds of history shown
    off: bool = False  # `%gpu monitor off`: stop every panel of this kernel and its sampler


@dataclass(frozen=True)
class Trace:
    on: bool


Command = Union[Use, Grow, Limit, Split, Allocator, Precision, Free, Status, Reset, Monitor, Trace]

PRECISIONS = ("mixed_float16", "mixed_bfloat16", "float32")
MAX_SPLIT = 16

# The valid forms of each verb: error messages and the manual (%gpu?) are built from this.
FORMS: dict[str, tuple[str, ...]] = {
    "status": ("%gpu", "%gpu status", "%gpu status --json"),
    "use": (
        "%gpu use 1",
        "%gpu use 0,2",
        "%gpu use all",
        "%gpu use none",
        "%gpu use auto",
        "%gpu use auto:2 --min-free 10G --wait 10m",
    ),
    "grow": ("%gpu grow", "%gpu grow off"),
    "limit": (
        "%gpu limit 4096",
        "%gpu limit 4G",
        "%gpu limit 1.5GiB",
        "%gpu limit 50%",
        "%gpu limit 4G,8G",
        "%gpu limit off",
    ),
    "split": ("%gpu split 2", "%gpu split 4G,4G", "%gpu split off"),
    "allocator": ("%gpu allocator async", "%gpu allocator default"),
    "precision": tuple(f"%gpu precision {p}" for p in PRECISIONS),
    "free": ("%gpu free",),
    "monitor": (
        "%gpu monitor",
        "%gpu monitor --sidebar --interval 0.2 --window 10m",
        "%gpu monitor off",
    ),
    "trace": ("%gpu trace", "%gpu trace off"),
    "reset": ("%gpu reset",),
}


def usage(verb: Optional[str] = None) -> str:
    """The valid forms of one verb, or every verb, as one line."""
    if verb is None:
        return "valid: " + " | ".join(f"%gpu {v}" if v != "status" else "%gpu" for v in FORMS)
    return "valid: " + " | ".join(FORMS[verb])


def _fail(verb: str, what: str) -> GrammarError:
    return GrammarError(f"{what}; {usage(verb)}")


# -- sizes and durations ------------------------------------------------------------------------
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]i?b?|%)?$", re.IGNORECASE)
_UNIT_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_size(text: str, verb: str = "limit", percent: bool = True) -> Size:
    """``4096`` (MiB), ``512M``, ``4G``, ``1.5GiB``, ``50%`` -> MiB as int, or :class:`Percent`.

    Units are binary, as nvidia-smi and TensorFlow count: ``G``, ``GB`` and ``GiB`` all mean
    1024 MiB.  A bare number is MiB, like TensorFlow's ``memory_limit``.
    """
    match = _SIZE.match(text.strip())
    if not match:
        raise _fail(verb, f"{text!r} is not a size")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit == "%":
        if not percent:
            raise _fail(verb, f"{text!r}: a percentage is not allowed here")
        if not 0 < number <= 100:
            raise _fail(verb, f"{text!r}: a percentage must be above 0 and at most 100")
        return Percent(number)
    if not unit and "." in match.group(1):
        raise _fail(verb, f"{text!r}: a bare number is whole MiB")
    mib = int(number * _UNIT_MIB[unit[0]] if unit else number)
    if mib < 1:
        raise _fail(verb, f"{text!r}: a size must be at least 1 MiB")
    return mib


def parse_bytes(text: str, verb: str) -> int:
    """A size without percentages, in bytes (for ``--min-free``)."""
    return int(parse_size(text, verb, percent=False)) * MIB


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "": 1}


def parse_duration(text: str, verb: str) -> float:
    """``30``, ``30s``, ``10m``, ``1h``, ``200ms`` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise _fail(verb, f"{text!r} is not a duration (like 30s, 10m, 1h)")
    return float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "").lower()]


def _size_list(text: str, verb: str, percent: bool = True) -> tuple[Size, ...]:
    parts = text.split(",")
    if any(not p.strip() for p in parts):
        raise _fail(verb, f"{text!r} has an empty entry")
    return tuple(parse_size(p, verb, percent) for p in parts)


# -- options ------------------------------------------------------------------------------------
def _options(
    verb: str, tokens: list[str], allowed: dict[str, Optional[Callable[[str], object]]]
) -> dict[str, object]:
    """``--name value`` pairs (or ``--flag`` when the converter is None), each at most once."""
    found: dict[str, object] = {}
    items = iter(tokens)
    for token in items:
        name = token[2:] if token.startswith("--") else None
        if name not in allowed:
            raise _fail(verb, f"unexpected {token!r}")
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


def _no_more(verb: str, tokens: list[str]) -> None:
    if tokens:
        raise _fail(verb, f"unexpected {' '.join(tokens)!r}")


def _one(verb: str, tokens: list[str]) -> str:
    if not tokens:
        raise _fail(verb, f"`%gpu {verb}` needs an argument")
    _no_more(verb, tokens[1:])
    return tokens[0]


# -- verbs --------------------------------------------------------------------------------------
_INDEX_LIST = re.compile(r"^\d+(,\d+)*$")


def _use(tokens: list[str]) -> Use:
    if not tokens:
        raise _fail("use", "`%gpu use` needs GPUs")
    first, rest = tokens[0].lower(), tokens[1:]
    if first in ("all", "none"):
        _no_more("use", rest)
        return Use(first)
    if first == "auto" or first.startswith("auto:"):
        return Use(_auto(first, rest))
    _no_more("use", rest)
    if not _INDEX_LIST.match(first):
        raise _fail("use", f"{tokens[0]!r} is not a GPU number or a comma list of them")
    gpus = tuple(int(x) for x in first.split(","))
    if len(set(gpus)) != len(gpus):
        raise _fail("use", f"{tokens[0]!r} names a GPU twice")
    return Use(gpus)


def _auto(first: str, rest: list[str]) -> Auto:
    count = 1
    if first.startswith("auto:"):
        text = first[5:]
        if not text.isdigit() or int(text) < 1:
            raise _fail("use", f"{first!r}: auto:N needs a whole number N of at least 1")
        count = int(text)
    opts = _options(
        "use",
        rest,
        {
            "min-free": lambda v: parse_bytes(v, "use"),
            "wait": lambda v: parse_duration(v, "use"),
        },
    )
    return Auto(count, opts.get("min-free"), opts.get("wait"))  # type: ignore[arg-type]


def _on_off(verb: str, tokens: list[str]) -> bool:
    if not tokens:
        return True
    word = _one(verb, tokens).lower()
    if word not in ("on", "off"):
        raise _fail(verb, f"unexpected {word!r}")
    return word == "on"


def _limit(tokens: list[str]) -> Limit:
    text = _one("limit", tokens)
    if text.lower() == "off":
        return Limit(None)
    return Limit(_size_list(text, "limit"))


def _split(tokens: list[str]) -> Split:
    text = _one("split", tokens)
    if text.lower() == "off":
        return Split()
    if text.isdigit():
        count = int(text)
        if not 1 <= count <= MAX_SPLIT:
            raise _fail("split", f"{text!r}: the number of logical GPUs must be 1 to {MAX_SPLIT}")
        return Split(count=count)
    if not any(c.isalpha() for c in text) and "," not in text:
        raise _fail("split", f"{text!r} is neither a count nor a list of sizes")
    sizes = _size_list(text, "split", percent=False)
    if len(sizes) > MAX_SPLIT:
        raise _fail("split", f"at most {MAX_SPLIT} logical GPUs per GPU")
    return Split(sizes=tuple(int(s) for s in sizes))


def _allocator(tokens: list[str]) -> Allocator:
    name = _one("allocator", tokens).lower()
    if name not in ("async", "default"):
        raise _fail("allocator", f"unknown allocator {name!r}")
    return Allocator(name)


def _precision(tokens: list[str]) -> Precision:
    policy = _one("precision", tokens)
    if policy not in PRECISIONS:
        raise _fail("precision", f"unknown precision {policy!r}")
    return Precision(policy)


def _status(tokens: list[str]) -> Status:
    return Status(**{"json": bool(_options("status", tokens, {"json": None}))})


def _monitor(tokens: list[str]) -> Monitor:
    if tokens and tokens[0].lower() == "off":
        _no_more("monitor", tokens[1:])
        return Monitor(off=True)
    opts = _options(
        "monitor",
        tokens,
        {
            "sidebar": None,
            "interval": lambda v: parse_duration(v, "monitor"),
            "window": lambda v: parse_duration(v, "monitor"),
        },
    )
    interval = float(opts.get("interval", 0.5))  # type: ignore[arg-type]
    window = float(opts.get("window", 300.0))  # type: ignore[arg-type]
    if not 0.1 <= interval <= 60:
        raise _fail("monitor", "--interval must be 0.1 s to 60 s")
    if not interval * 10 <= window <= 24 * 3600:
        raise _fail("monitor", "--window must hold at least 10 samples and at most 24 h")
    return Monitor(bool(opts.get("sidebar", False)), interval, window)


def _bare(command: Command) -> Callable[[list[str]], Command]:
    def parse_bare(tokens: list[str]) -> Command:
        _no_more(_verb_of(command), tokens)
        return command

    return parse_bare


def _verb_of(command: Command) -> str:
    return type(command).__name__.lower()


_PARSERS: dict[str, Callable[[list[str]], Command]] = {
    "use": _use,
    "grow": lambda t: Grow(_on_off("grow", t)),
    "limit": _limit,
    "split": _split,
    "allocator": _allocator,
    "precision": _precision,
    "free": _bare(Free()),
    "status": _status,
    "reset": _bare(Reset()),
    "monitor": _monitor,
    "trace": lambda t: Trace(_on_off("trace", t)),
}

VERBS = tuple(_PARSERS)


def parse(line: str) -> Command:
    """Parse the text after ``%gpu``.  An empty line is ``status``."""
    try:
        tokens = shlex.split(line)
    except ValueError as err:
        raise GrammarError(f"cannot read {line!r} ({err}); {usage()}") from None
    if not tokens:
        return Status()
    verb = tokens[0].lower()
    parser = _PARSERS.get(verb)
    if parser is None:
        raise GrammarError(f"unknown subcommand {tokens[0]!r}; {usage()}")
    return parser(tokens[1:])
