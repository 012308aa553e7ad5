"""The notebook's saved GPU settings in this kernel: ``%gpu save``, and applying them at its start.

Where the settings come from, read once when the extension loads (:func:`apply_at_start`):

* ``TFGPU_MAGIC_NOTEBOOK_SETTINGS``: the ``tfgpu`` key as JSON, put in the kernel's environment
  by ``tfgpu run`` and papermill's ``tfgpu`` engine (a headless kernel has no notebook path:
  jupyter/nbconvert#2213).  ``TFGPU_MAGIC_CHOSEN_GPUS`` then names the GPUs the runner chose and
  claimed for this run, and ``TFGPU_MAGIC_RUNNER`` who it is.
* otherwise ``JPY_SESSION_NAME``, the notebook jupyter_server started this kernel for (JupyterLab,
  Notebook 7), read by :func:`tfgpu_magic.command.saved.metadata_from_file` (bounded, no links).

What was applied is recorded once (:class:`SettingsRecord`, ``session.notebook_record``); ``%gpu``,
``--json`` and the first cell's notice read that record.  ``%gpu save`` builds the key from the
accepted request (:func:`tfgpu_magic.command.saved.settings_from_plan`) and displays it under
:data:`~tfgpu_magic.command.saved.MIME_TYPE`: the JupyterLab / Notebook 7 extension writes it into
the open notebook's model, ``tfgpu run`` into its output notebook.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..command import grammar, saved
from ..command.plan import PlanError
from ..safe_text import safe
from . import choosing
from .session import Session, SessionError, get_session

__all__ = [
    "CHOSEN_ENV",
    "RUNNER_ENV",
    "SETTINGS_ENV",
    "SettingsRecord",
    "StartNotice",
    "apply_at_start",
    "observed",
    "save",
    "start_notice",
]

SETTINGS_ENV = "TFGPU_MAGIC_NOTEBOOK_SETTINGS"
CHOSEN_ENV = "TFGPU_MAGIC_CHOSEN_GPUS"
RUNNER_ENV = "TFGPU_MAGIC_RUNNER"
NOTEBOOK_ENV = saved.NOTEBOOK_ENV  # set by jupyter_server for a session's kernel
MAX_NOTEBOOK_BYTES = saved.MAX_NOTEBOOK_BYTES  # a larger notebook is not read at start


@dataclass(frozen=True)
class SettingsRecord:
    """The notebook's settings as this kernel met them at its start (read by ``%gpu``)."""

    source: str  # "the notebook's metadata (train.ipynb)", "tfgpu run (pid 123)"
    requirements: str = ""  # in words
    met: bool | None = None  # None: nothing required of the GPUs
    choice: str | None = None  # how the GPUs were chosen (the chooser's line), or why none could be
    applied: tuple[str, ...] = ()
    not_applied: tuple[tuple[str, str], ...] = ()  # (line, why)
    error: str | None = None  # the key could not be read: nothing was applied

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "requirements": self.requirements,
            "met": self.met,
            "choice": self.choice,
            "applied": list(self.applied),
            "not_applied": [{"line": line, "reason": why} for line, why in self.not_applied],
            "error": self.error,
        }

    def notice(self) -> str | None:
        """One line for the user when something of the settings did not hold, else None."""
        if self.error is not None:
            return f"tfgpu_magic: {self.error}"
        if self.met is False:
            return f"tfgpu_magic: the notebook needs {self.requirements}, and {self.choice}"
        if self.not_applied:
            line, why = self.not_applied[0]
            more = f" (and {len(self.not_applied) - 1} more)" if len(self.not_applied) > 1 else ""
            return f"tfgpu_magic: the notebook's setting {line!r} was not applied: {why}{more}"
        return None


# -- reading the settings ---------------------------------------------------------------------------
def _from_environment(env: Mapping[str, str]) -> tuple[str, Any] | None:
    """``(source, the notebook's metadata)`` from where the kernel's starter put them, or None."""
    text = env.get(SETTINGS_ENV)
    if text is not None:
        source = env.get(RUNNER_ENV) or "the runner that started this kernel"
        try:
            return safe(source), {saved.KEY: json.loads(text)}
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
            return safe(source), {saved.KEY: "not JSON"}
    path = env.get(NOTEBOOK_ENV)
    if not path or not path.endswith(".ipynb"):
        return None
    # The file's name is whoever wrote it's choice (a shared folder): shown escaped.
    return f"the notebook's metadata ({safe(os.path.basename(path))})", saved.metadata_from_file(path)


# -- applying them --------------------------------------------------------------------------------
def apply_at_start(
    session: Session,
    use: Callable[[Session, Any, Callable[[str], None]], str],
    env: Mapping[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> SettingsRecord | None:
    """Apply the notebook's saved settings (see the module's docstring); None when it has none.

    ``use`` is the magic's own ``use`` (``use auto`` chooses and claims there).  The requirements
    first, then each policy line; a line that cannot apply is skipped and recorded, the others
    apply.  Never raises: a kernel must start whatever its notebook's metadata says."""
    found = _from_environment(os.environ if env is None else env)
    if found is None:
        return None
    source, metadata = found
    try:
        settings = saved.read(metadata)
    except saved.SettingsError as err:
        record = SettingsRecord(source, error=str(err))
    else:
        if settings is None:
            return None
        record = _apply(session, settings, source, use, os.environ if env is None else env)
    session.notebook_record = record
    notice = record.notice()
    if notice is not None:
        say(notice)
    return record


def _apply(
    session: Session,
    settings: saved.NotebookSettings,
    source: str,
    use: Callable[[Session, Any, Callable[[str], None]], str],
    env: Mapping[str, str],
) -> SettingsRecord:
    requirements = settings.requirements
    met: bool | None = None
    choice = None
    applied: list[str] = []
    not_applied: list[tuple[str, str]] = []
    command = requirements.use_command()
    if command is not None:
        chosen = _chosen_by_runner(env)
        try:
            if chosen is not None and isinstance(command.gpus, grammar.Auto):
                session.configure(grammar.Use(chosen))
                choice = f"GPU {','.join(map(str, chosen))} chosen and claimed for this run by {source}"
            else:
                choice = use(session, command, lambda line: None).splitlines()[0]
            met = True
            applied.append(_line(command))
        except (SessionError, PlanError, grammar.GrammarError) as err:
            met, choice = False, str(err)
            if isinstance(err.__cause__, choosing.ChoiceError) and not isinstance(
                err.__cause__, choosing.NeverMet
            ):
                choice += f"; who holds the GPUs: {_who_holds(session)}"
        except Exception as err:  # a kernel must start whatever happens here
            met, choice = False, f"{type(err).__name__}: {err}"
    for line, parsed, why in settings.commands():
        if parsed is None:
            not_applied.append((line, why or "not a setting"))
            continue
        try:
            use(session, parsed, lambda text: None)
            applied.append(line)
        except (SessionError, PlanError, grammar.GrammarError) as err:
            not_applied.append((line, str(err)))
        except Exception as err:
            not_applied.append((line, f"{type(err).__name__}: {err}"))
    return SettingsRecord(source, requirements.describe(), met, choice, tuple(applied), tuple(not_applied))


def _who_holds(session: Session) -> str:
    try:
        return choosing.who_holds(session.nvml, range(session.nvml.device_count()))
    except Exception as err:  # a reading that failed is a note, never a failed start
        return f"unknown ({type(err).__name__})"


def _chosen_by_runner(env: Mapping[str, str]) -> tuple[int, ...] | None:
    text = env.get(CHOSEN_ENV, "")
    try:
        chosen = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return None
    return chosen or None


def _line(command: grammar.Use) -> str:
    gpus = command.gpus
    if isinstance(gpus, grammar.Auto):
        return ("use auto" if gpus.count == 1 else f"use auto:{gpus.count}") + choosing.min_text(gpus)
    return f"use {gpus}" if isinstance(gpus, str) else f"use {','.join(map(str, gpus))}"


# -- %gpu save ------------------------------------------------------------------------------------
def observed(session: Session, by: str = "%gpu save") -> dict[str, Any]:
    """What this kernel sees now: each imported framework's allocator peak per device, and per GPU
    it holds or was given, the model, its total memory and the driver's figure for this kernel."""
    peaks: dict[str, dict[str, int]] = {}
    for framework in session.imported_frameworks():
        try:
            memory = framework.device_memory()
        except Exception:  # a framework that cannot say: no figure, not zero
            continue
        if memory:
            peaks[framework.key] = {device: m.peak_bytes for device, m in memory.items()}
    mine = session._my_device_memory()
    gpus = []
    indices = sorted(set(mine.by_gpu) | set(session.visible_gpus() or ()))
    for index in indices:
        try:
            info = session.nvml.gpu(index)
        except Exception:
            continue
        gpus.append(
            {
                "index": index,  # nvidia-smi's, on the machine of that run (the runner adds its peaks by it)
                "model": info.name,
                "total_bytes": None if info.memory is None else info.memory.total_bytes,
                "driver_bytes": mine.by_gpu.get(index),
            }
        )
    return {
        "at": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "by": by,
        "allocator_peak_bytes": peaks,
        "gpus": gpus,
        "driver": "this kernel's memory per the driver (NVML), read when the settings were saved",
    }


def save(session: Session, env: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """``%gpu save``: what to print (what was saved, then where it goes: two short lines, which a
    notebook's output area shows unbroken) and the metadata keys to write (``{key: value}``)."""
    env = os.environ if env is None else env
    auto = getattr(session, "auto_request", None)
    seen = observed(session)
    settings = saved.settings_from_plan(session.requested, auto, seen)
    models = [gpu["model"] for gpu in seen["gpus"] if gpu.get("model")]
    keys = {saved.KEY: settings.as_json(), **saved.accelerator_keys(settings, models)}
    what = "; ".join(
        [f"needs {settings.requirements.describe()}"]
        + (["policy: " + ", ".join(settings.policy)] if settings.policy else [])
    )
    return f"Saved this notebook's GPU settings: {what}.\n{_where(env)}", keys


def _where(env: Mapping[str, str]) -> str:
    # A runner names itself even for a notebook that had no settings yet (its first `%gpu save`).
    if env.get(SETTINGS_ENV) is not None or env.get(RUNNER_ENV):
        return f"{safe(env.get(RUNNER_ENV) or 'The runner')} writes them into its output notebook."
    if env.get(NOTEBOOK_ENV):
        return (
            f"tfgpu_magic's extension writes them into {safe(os.path.basename(env[NOTEBOOK_ENV]))}'s metadata "
            f"(`{saved.KEY}`); save the notebook to keep them."
        )
    return (
        "No notebook is open for this kernel, so they went nowhere: run the notebook with "
        "`tfgpu run NOTEBOOK`, which writes them into its output."
    )


def bundle(text: str, keys: dict[str, Any]) -> dict[str, Any]:
    """The display bundle: the line for people, the keys for a front end or a runner."""
    return {"text/plain": text, saved.MIME_TYPE: keys}


# -- the front end's question at a notebook's open ---------------------------------------------------
class StartNotice:
    """What the JupyterLab / Notebook 7 extension asks a notebook's kernel as it opens (a silent
    request's ``user_expressions``, js/lab/settings.ts): ``{"notice": line or null}``, the line
    the kernel says under the first cell when the notebook's settings did not hold at its start.
    Formatted as JSON (``_repr_json_``), so the page reads it without parsing a Python repr."""

    def __init__(self, notice: str | None) -> None:
        self.notice = notice

    def _repr_json_(self) -> dict[str, Any]:
        return {"notice": self.notice}


def start_notice() -> StartNotice:
    """This kernel's :class:`StartNotice` (``notice`` null: no settings, or they all held)."""
    record = get_session().notebook_record
    return StartNotice(None if record is None else record.notice())
