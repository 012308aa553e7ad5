"""The one flow of ``tfgpu run`` and papermill's ``tfgpu`` engine, up to the kernel's start.

Read the notebook's settings (strictly: malformed metadata is one line, exit status 2); when they
ask for GPUs by what they offer (``requirements.gpus`` a count), wait for and claim such GPUs in
the runner's process, saying what it waits for and who holds the GPUs; give the kernel its
environment (the settings, the GPUs chosen, who started it) and the argument that loads the
extension at its start, so the settings are in force before the first cell; and release the
claims whatever happens (done, a failed cell, Ctrl-C, an error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..command import grammar, saved
from ..gpus.nvml import Nvml
from ..kernel import choosing
from ..kernel.notebook_settings import CHOSEN_ENV, NOTEBOOK_ENV, RUNNER_ENV, SETTINGS_ENV
from ..kernel.session import Session

__all__ = [
    "EXIT_CELL_FAILED",
    "EXIT_DONE",
    "EXIT_INTERRUPTED",
    "EXIT_NO_GPU",
    "EXIT_USAGE",
    "EXTENSION_ARGUMENT",
    "Prepared",
    "RunError",
    "parse_wait",
    "prepared",
    "read_settings",
]

EXIT_DONE = 0
EXIT_CELL_FAILED = 1  # a cell raised, timed out, or the kernel died
EXIT_USAGE = 2  # bad arguments, a notebook that cannot be read, malformed `tfgpu` metadata
EXIT_NO_GPU = 3  # no GPU met the requirements within the wait (or none here ever could)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT, what a shell reports)

# IPython's trait for extensions named on the command line: the kernel loads tfgpu_magic as it
# starts, which applies the settings before the first cell (ipykernel 7 / IPython 9 checked).
# The same argument as the Jupyter server's (saved.KERNEL_ARGUMENT says why its module is named so).
EXTENSION_ARGUMENT = saved.KERNEL_ARGUMENT
POLL_S = 0.5  # how often a wait looks again (a `--wait 5s` looks ten times)
PROGRESS_EVERY_S = 5.0  # how often a wait says it is still waiting
# What the runner's own environment may hold from where it was started (a notebook's `!tfgpu run`,
# a kernel another runner started) and must not reach this run's kernel: it names another notebook.
NOT_INHERITED = (SETTINGS_ENV, CHOSEN_ENV, RUNNER_ENV, NOTEBOOK_ENV)


class RunError(Exception):
    """The run cannot go on: ``str()`` is one line for the user, ``status`` the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def read_settings(metadata: Any) -> saved.NotebookSettings | None:
    """The notebook's ``tfgpu`` key, read strictly; RunError (exit 2) with the reader's one line."""
    try:
        return saved.read(metadata)
    except saved.SettingsError as err:
        raise RunError(str(err), EXIT_USAGE) from None


def parse_wait(text: str | None, where: str = "--wait") -> float | None:
    """``5s``, ``10m``, ``1h`` or seconds; None (no wait) for None or empty."""
    if text is None or not text.strip():
        return None
    try:
        return grammar.parse_duration(text, "use")
    except grammar.GrammarError:
        raise RunError(f"{where} {text!r} is not a duration (like 30s, 10m, 1h)", EXIT_USAGE) from None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What the kernel is started with: its whole environment and its extra arguments."""

    settings: saved.NotebookSettings | None
    chosen: tuple[int, ...]  # nvidia-smi indices claimed for this run (none when nothing was asked)
    env: dict[str, str]
    extra_arguments: list[str]
    nvml: Nvml  # the runner's reading of the GPUs (the same simulated server as its kernel's)


@contextlib.contextmanager
def prepared(
    metadata: Any,
    *,
    wait_s: float | None,
    say: Callable[[str], None],
    runner: str,
    how_to_wait: str,
    how_to_wait_longer: str = "`--wait 30m`",
) -> Iterator[Prepared]:
    """Settings read, GPUs claimed, the kernel's environment made; claims released on leaving.

    ``runner`` names who starts the kernel ("tfgpu run (pid 12)"), as the kernel reports it;
    ``how_to_wait`` says how to ask it for a wait ("run again with `--wait 10m`"), and
    ``how_to_wait_longer`` for a longer one when a wait ran out (```--wait 30m```).
    Raises RunError: exit 2 for malformed metadata, 3 when no GPU met the requirements in time,
    130 when the wait was interrupted."""
    settings = read_settings(metadata)
    for line, command, why in settings.commands() if settings is not None else ():
        if command is None:  # the kernel skips it too, applies the others, and says so under cell 1
            say(f"the notebook's setting {line!r} will not be applied: {why}")
    session = Session()  # reads the simulated server named in the environment, as the kernel will
    chosen: tuple[int, ...] = ()
    try:
        chosen = _choose(session, settings, wait_s, say, how_to_wait, how_to_wait_longer)
        env = kernel_environment(os.environ, settings, chosen, runner)
        yield Prepared(settings, chosen, env, [EXTENSION_ARGUMENT], session.nvml)
    finally:
        for index in chosen:  # only this run's claims: a process may hold others (a kernel running papermill)
            choosing.release(session, index)


def kernel_environment(
    base: Mapping[str, str], settings: saved.NotebookSettings | None, chosen: tuple[int, ...], runner: str
) -> dict[str, str]:
    """The kernel's environment: the runner's, with the settings, the GPUs chosen and who started it."""
    env = {name: value for name, value in base.items() if name not in NOT_INHERITED}
    if settings is not None:
        # Without `observed`: information the kernel never applies, and the one part of the key
        # whose size and depth the notebook chose (up to 64 KiB, as deep as the runner's parser
        # allowed, which the kernel's, a few calls deeper, might refuse).
        env[SETTINGS_ENV] = json.dumps({k: v for k, v in settings.as_json().items() if k != "observed"})
    if chosen:
        env[CHOSEN_ENV] = ",".join(map(str, chosen))
    env[RUNNER_ENV] = runner
    return env


def _choose(
    session: Session,
    settings: saved.NotebookSettings | None,
    wait_s: float | None,
    say: Callable[[str], None],
    how_to_wait: str,
    how_to_wait_longer: str,
) -> tuple[int, ...]:
    """Choose and claim the GPUs the requirements ask for; () when they name no count (the kernel
    then applies ``use all`` or ``use none`` itself, or takes the GPUs it is given)."""
    command = settings.requirements.use_command() if settings is not None else None
    if command is None or not isinstance(command.gpus, grammar.Auto):
        return ()
    assert settings is not None
    auto = dataclasses.replace(command.gpus, wait_seconds=wait_s)
    needs = settings.requirements.describe()
    say(f"the notebook needs {needs}" + (f"; waiting up to {_seconds(wait_s)}" if wait_s else ""))

    def progress(line: str) -> None:
        say(f"{line}; who holds the GPUs: {who_holds(session.nvml)}")

    try:
        chosen, reason = choosing.choose_gpus(
            session,
            auto,
            progress,
            poll_s=POLL_S,
            progress_every_s=PROGRESS_EVERY_S,
            how_to_stop="Ctrl-C to stop",
            how_to_wait=how_to_wait,
            how_to_wait_longer=how_to_wait_longer,
        )
    except choosing.Interrupted as err:
        raise RunError(str(err), EXIT_INTERRUPTED) from None
    except choosing.NeverMet as err:
        raise RunError(f"the notebook needs {needs}, and {err}", EXIT_NO_GPU) from None
    except choosing.ChoiceError as err:
        raise RunError(
            f"the notebook needs {needs}, and {err}; who holds the GPUs: {who_holds(session.nvml)}",
            EXIT_NO_GPU,
        ) from None
    say(reason.replace("this kernel's lifetime", "this run"))  # the runner holds them, not a kernel
    return chosen


def who_holds(nvml: Nvml) -> str:
    """Who holds each GPU, in one line; a reading that fails is said, never a failed run."""
    try:
        return choosing.who_holds(nvml, range(nvml.device_count()))
    except Exception as err:
        return f"unknown ({type(err).__name__}: {err})"


def _seconds(seconds: float) -> str:
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:g}m"
