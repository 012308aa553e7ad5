"""A notebook's GPU settings, saved in its metadata under ``tfgpu`` (version 1), read back once.

The format is documented for others to read (docs/notebook-settings.md), with a JSON Schema shipped
in the package (``command/schema/notebook-settings.v1.json``)::

    "tfgpu": {
      "version": 1,
      "requirements": {"gpus": 1, "min_free_bytes": 4294967296, "min_compute_capability": "8.0"},
      "policy": ["grow", "limit 4096MiB"],
      "observed": {"at": "2026-11-27T02:30:00+00:00", "by": "%gpu save", ...}
    }

* ``requirements``: what a GPU must offer, never which GPU: ``gpus`` (a count, 0 for none, or
  ``"all"``), ``min_free_bytes`` (free on each chosen GPU), ``min_compute_capability``.  Absent
  ``gpus``: the notebook takes the GPUs its kernel is given, and nothing is chosen or claimed.
* ``policy``: the accepted ``%gpu`` settings as the lines that set them (``grow``, ``limit``,
  ``split``, ``allocator``, ``precision``), applied in order when the notebook's kernel starts.
* ``observed``: what the last run saw (allocator peaks per framework, each GPU's model and the
  driver's peak for the kernel); information for people, never applied.

Reading is strict and never raises anything but :class:`SettingsError`, whose message is one
line: a hand-edited key must not stop a kernel from starting.  This module knows nothing of the
machine; whether a GPU can meet the requirements is the kernel's and the runner's question.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import grammar, notebook_file
from .plan import Plan
from .units import MIB, format_bytes

__all__ = [
    "KERNEL_ARGUMENT",
    "KEY",
    "MIME_TYPE",
    "NOTEBOOK_ENV",
    "VERSION",
    "NotebookSettings",
    "Requirements",
    "SettingsError",
    "accelerator_keys",
    "merge_metadata",
    "metadata_from_file",
    "read",
    "settings_from_plan",
]

KEY = notebook_file.KEY  # the notebook metadata key
VERSION = 1
# What `%gpu save` displays for a front end or a runner to write into the notebook's metadata: the
# top-level metadata keys to set (see merge_metadata).
MIME_TYPE = "application/vnd.tfgpu.notebook-metadata+json"
# How a kernel's starter (`tfgpu run`, papermill's engine, the Jupyter server for a notebook with
# the key) has an IPython kernel load the extension as it starts, so the settings are in force
# before the first cell.  The start-up module has a name of its own: a notebook's own
# `%load_ext tfgpu_magic` cell then finds nothing loaded under that name, and adds nothing (the
# session is loaded once) instead of IPython's "already loaded" lines.
KERNEL_ARGUMENT = "--InteractiveShellApp.extra_extensions=tfgpu_magic.kernel.at_start"
MAX_POLICY_LINES = 32
MAX_LINE_CHARS = 200
MAX_BYTES = 2**53  # a JSON number every reader (JavaScript's included) holds exactly
REQUIREMENT_KEYS = ("gpus", "min_free_bytes", "min_compute_capability")
SETTING_VERBS = ("grow", "limit", "split", "allocator", "precision")  # what `policy` may hold
_SETTINGS = (grammar.Grow, grammar.Limit, grammar.Split, grammar.Allocator, grammar.Precision)
# Colab's `colab.gpuType` values, by a word of NVIDIA's model name (what Colab can open it on).
_COLAB_TYPES = ("T4", "L4", "A100", "H100", "V100")


# Where jupyter_server names the notebook a session's kernel was started for (JupyterLab,
# Notebook 7); the server and the kernel both read the notebook's settings from that file.
NOTEBOOK_ENV = "JPY_SESSION_NAME"
# A notebook larger than this is not read when its kernel starts (its settings apply with `tfgpu run`).
MAX_NOTEBOOK_BYTES = notebook_file.MAX_NOTEBOOK_BYTES


class SettingsError(ValueError):
    """Metadata that cannot be applied; the message is one line naming the key and the fix."""


@dataclass(frozen=True)
class Requirements:
    """What a GPU must offer this notebook (never which GPU)."""

    gpus: int | str | None = None  # a count, or "all"; None: not asked (the kernel's GPUs as given)
    min_free_bytes: int | None = None
    min_capability: tuple[int, int] | None = None

    def use_command(self) -> grammar.Use | None:
        """The ``%gpu use`` that meets them: ``use auto:N --min-free ... --min-cc ...``, ``use none``,
        ``use all``; None where no GPU choice is asked."""
        if self.gpus is None:
            return None
        if self.gpus == "all":
            return grammar.Use("all")
        if self.gpus == 0:
            return grammar.Use("none")
        assert isinstance(self.gpus, int)
        return grammar.Use(grammar.Auto(self.gpus, self.min_free_bytes, None, self.min_capability))

    def describe(self) -> str:
        """In words: "1 GPU with 4 GiB free (compute capability 8.0+)"."""
        if self.gpus is None:
            return "the GPUs the kernel is given"
        if self.gpus == "all":
            return "every GPU the kernel is given"
        if self.gpus == 0:
            return "no GPU"
        text = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        if self.min_free_bytes is not None:
            text += f" with {format_bytes(self.min_free_bytes)} free{' each' if self.gpus != 1 else ''}"
        if self.min_capability is not None:
            text += " (compute capability {}.{}+)".format(*self.min_capability)
        return text

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.gpus is not None:
            found["gpus"] = self.gpus
        if self.min_free_bytes is not None:
            found["min_free_bytes"] = self.min_free_bytes
        if self.min_capability is not None:
            found["min_compute_capability"] = "{}.{}".format(*self.min_capability)
        return found


@dataclass(frozen=True)
class NotebookSettings:
    """The ``tfgpu`` key, read: requirements, the policy's lines, and what was observed."""

    requirements: Requirements = field(default_factory=Requirements)
    policy: tuple[str, ...] = ()
    observed: dict[str, Any] | None = None

    def commands(self) -> list[tuple[str, grammar.Command | None, str | None]]:
        """``(line, command, why not)`` per policy line: the command, or None with why it cannot apply."""
        found: list[tuple[str, grammar.Command | None, str | None]] = []
        for line in self.policy:
            words = line.split()
            if not words or words[0].lower() not in SETTING_VERBS:
                shown = _shown(words[0] if words else line)
                found.append(
                    (line, None, f"{shown} is not a setting; the policy holds {', '.join(SETTING_VERBS)}")
                )
                continue
            try:
                command = grammar.parse(line)
            except grammar.GrammarError as err:
                found.append((line, None, str(err)))
                continue
            if not isinstance(command, _SETTINGS):
                found.append((line, None, f"not a setting; the policy holds {', '.join(SETTING_VERBS)}"))
                continue
            found.append((line, command, None))
        return found

    @property
    def uses_gpu(self) -> bool:
        """Whether the notebook runs on a GPU (what Colab's and Kaggle's keys say)."""
        gpus = self.requirements.gpus
        if gpus == 0:
            return False
        return gpus is not None or bool(self.policy) or bool(self.observed and self.observed.get("gpus"))

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "version": VERSION,
            "requirements": self.requirements.as_json(),
            "policy": list(self.policy),
        }
        if self.observed is not None:
            found["observed"] = self.observed
        return found


# -- reading ------------------------------------------------------------------------------------
def read(metadata: Any) -> NotebookSettings | None:
    """The ``tfgpu`` key of a notebook's metadata, checked; None when the notebook has none.

    Raises :class:`SettingsError` (one line) for a key that cannot be read as version 1."""
    if not isinstance(metadata, Mapping) or KEY not in metadata:
        return None
    value = metadata[KEY]
    if not isinstance(value, Mapping):
        raise _bad("", f"is {_kind(value)}, not an object")
    version = _whole(value.get("version"))
    if not _is_int(version):
        raise _bad(".version", f"is {_kind(version)}; this tfgpu_magic reads version {VERSION}")
    if version > VERSION:
        raise SettingsError(
            f"the notebook's GPU settings (metadata `{KEY}`) are version {version}, written by a newer "
            f"tfgpu_magic; this one reads version {VERSION}: upgrade it (pip install -U tfgpu_magic)"
        )
    if version < 1:
        raise _bad(".version", f"is {version}; versions start at 1")
    try:
        return NotebookSettings(
            _requirements(value.get("requirements", {})),
            _policy(value.get("policy", [])),
            _observed(value.get("observed")),
        )
    except RecursionError:  # a value nested as deep as the parser allowed, measured a few calls deeper
        raise _bad("", "is nested too deep to read") from None


def _requirements(value: Any) -> Requirements:
    if not isinstance(value, Mapping):
        raise _bad(".requirements", f"is {_kind(value)}, not an object")
    unknown = sorted(str(key) for key in value if key not in REQUIREMENT_KEYS)
    if unknown:  # ignoring a requirement would hand the notebook a GPU that does not meet it
        raise _bad(
            ".requirements",
            f"names {_shown(unknown[0])}, which this version does not know; it knows {', '.join(REQUIREMENT_KEYS)}",
        )
    if any(value[key] is None for key in value):  # written out as null: absent is how to say "not asked"
        key = next(str(key) for key in value if value[key] is None)
        raise _bad(f".requirements.{key}", "is null; leave it out when it is not asked")
    gpus = _whole(value.get("gpus"))
    if gpus is not None and gpus != "all" and not (_is_int(gpus) and 0 <= gpus <= grammar.MAX_GPUS):
        raise _bad(
            ".requirements.gpus", f'is {_shown(gpus)}; give a count from 0 to {grammar.MAX_GPUS}, or "all"'
        )
    free = _whole(value.get("min_free_bytes"))
    if free is not None and not (_is_int(free) and 0 <= free <= MAX_BYTES):
        raise _bad(".requirements.min_free_bytes", f"is {_shown(free)}; give a whole number of bytes")
    capability = value.get("min_compute_capability")
    parsed = None
    if capability is not None:
        try:
            parsed = grammar.parse_capability(capability if isinstance(capability, str) else "?", "use")
        except grammar.GrammarError:
            raise _bad(
                ".requirements.min_compute_capability", f'is {_shown(capability)}; give one such as "8.0"'
            ) from None
    if (free is not None or parsed is not None) and (gpus is None or gpus == "all" or gpus == 0):
        raise _bad(
            ".requirements",
            f"asks for free memory or a compute capability of {_shown(gpus)} GPUs; "
            'give "gpus" a count of at least 1',
        )
    return Requirements(gpus, free, parsed)


def _policy(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        raise _bad(".policy", f'is {_kind(value)}; give a list of %gpu setting lines, e.g. ["grow"]')
    if len(value) > MAX_POLICY_LINES:
        raise _bad(".policy", f"has {len(value)} lines; at most {MAX_POLICY_LINES}")
    long = next((line for line in value if len(line) > MAX_LINE_CHARS), None)
    if long is not None:
        raise _bad(".policy", f"has a line of {len(long)} characters; at most {MAX_LINE_CHARS}")
    return tuple(value)


def _observed(value: Any) -> dict[str, Any] | None:
    """Kept as written (it is information); only its size is bounded, so it cannot grow the notebook."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _bad(".observed", f"is {_kind(value)}, not an object")
    if len(json.dumps(value, default=str)) > 64 * 1024:
        raise _bad(".observed", "is over 64 KiB; delete it (the next run writes it again)")
    return dict(value)


def _whole(value: Any) -> Any:
    """``1.0`` as ``1``: JSON has one kind of number, and the schema (like JavaScript, which may
    write it) counts 1.0 as the integer 1; other values unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "a number" if isinstance(value, int | float) else type(value).__name__


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(where: str, what: str) -> SettingsError:
    return SettingsError(f"the notebook's metadata `{KEY}{where}` {what}; nothing of it was applied")


def metadata_from_file(path: str) -> Any:
    """The metadata of the notebook file at ``path``, as a kernel's starter and the kernel read it at
    its start: {} for a file :func:`.notebook_file.keyed_bytes` does not read (gone, a link, not a
    regular file, too large, without the key), not JSON (a notebook being written) or nested past
    the parser's limit."""
    raw = notebook_file.keyed_bytes(path)
    if raw is None:
        return {}
    try:
        notebook = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return notebook.get("metadata", {}) if isinstance(notebook, dict) else {}


# -- writing ------------------------------------------------------------------------------------
def settings_from_plan(
    plan: Plan, auto: grammar.Auto | None, observed: dict[str, Any] | None = None
) -> NotebookSettings:
    """The settings ``%gpu save`` records: the accepted plan as requirements and policy lines.

    GPU numbers become a count (``use 0,2`` needs two GPUs, whichever); ``use auto``'s own
    ``--min-free`` and ``--min-cc`` are kept; without ``--min-free``, a limit in bytes is the
    free memory each GPU needs."""
    visible = plan.visible
    gpus: int | str | None
    if isinstance(visible, tuple):
        gpus = len(visible)
    elif visible == "all":
        gpus = "all"
    elif visible == "none":
        gpus = 0
    else:
        gpus = None
    free = capability = None
    if isinstance(gpus, int) and gpus > 0:
        free = auto.min_free_bytes if auto is not None else None
        capability = auto.min_capability if auto is not None else None
        if free is None:
            free = _limit_bytes(plan)
    lines = [line for line in plan.describe() if not line.startswith("use ")]
    return NotebookSettings(Requirements(gpus, free, capability), tuple(lines), observed)


def _limit_bytes(plan: Plan) -> int | None:
    """The most a plan's limit takes on one GPU, in bytes; None for no limit or one in percent."""
    if plan.limits is not None:
        sizes = list(plan.limits)
    elif plan.shares is not None:  # the kernel's limit is the shares' sum on each GPU
        parts = [size for _, size in plan.shares]
        sizes = (
            [sum(p for p in parts if isinstance(p, int))] if all(isinstance(p, int) for p in parts) else []
        )
    else:
        return None
    mib = [size for size in sizes if isinstance(size, int)]
    return max(mib) * MIB if mib and len(mib) == len(sizes) else None


def accelerator_keys(settings: NotebookSettings, models: list[str]) -> dict[str, Any]:
    """Colab's and Kaggle's keys, so the notebook opens with a GPU there too (none when it uses none).

    Colab: ``accelerator: "GPU"`` and ``colab.gpuType`` when the observed model is one Colab offers;
    Kaggle: ``kaggle.accelerator: "gpu"`` and ``isGpuEnabled``."""
    if not settings.uses_gpu:
        return {}
    keys: dict[str, Any] = {"accelerator": "GPU", "kaggle": {"accelerator": "gpu", "isGpuEnabled": True}}
    words = [word for model in models for word in model.upper().replace("-", " ").split()]
    colab_type = next((t for word in words for t in _COLAB_TYPES if word == t), None)
    if colab_type is not None:
        keys["colab"] = {"gpuType": colab_type}
    return keys


def merge_metadata(metadata: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with ``update``'s keys written in: ``tfgpu`` replaced whole; another key whose old
    and new values are both objects (``colab``, ``kaggle``) merged one level, so keys others wrote
    there stay.  The front end (js/lab/settings.ts) applies the same rule."""
    merged = dict(metadata)
    for key, value in update.items():
        old = merged.get(key)
        if key != KEY and isinstance(old, dict) and isinstance(value, Mapping):
            merged[key] = {**old, **value}
        else:
            merged[key] = value
    return merged
