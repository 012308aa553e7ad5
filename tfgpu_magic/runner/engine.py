"""papermill's ``tfgpu`` engine: ``papermill --engine tfgpu IN.ipynb OUT.ipynb``, as ``tfgpu run`` runs.

Registered by the entry point ``papermill.engine: tfgpu``.  It waits for and claims the GPUs the
notebook's settings require, starts the kernel with them in force before the first cell, writes
the run's observations into the output's ``tfgpu`` metadata, and releases the claims after, as
:mod:`tfgpu_magic.runner.run` does (the same flow, :mod:`tfgpu_magic.runner.flow`).

papermill's command line passes an engine no options of its own, so the wait comes from the
environment, ``TFGPU_MAGIC_WAIT=10m`` (default: no wait), or from ``tfgpu_wait="10m"`` given to
``papermill.execute_notebook``.  A run that cannot go on raises :class:`EngineError`: a
``PapermillException`` for Python callers, and a ``click.ClickException`` that papermill's
command line prints as one line (``Error: ...``) with the exit status ``tfgpu run`` gives (2
malformed metadata, 3 no GPU in time), never a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine
from papermill.exceptions import PapermillException
from papermill.log import logger
from papermill.utils import merge_kwargs, remove_args

from ..safe_text import safe
from . import flow, observing

__all__ = ["WAIT_ENV", "EngineError", "MetadataError", "NoGpuError", "TfgpuEngine"]

WAIT_ENV = "TFGPU_MAGIC_WAIT"
BY = "papermill --engine tfgpu"


class EngineError(PapermillException, click.ClickException):
    """The run could not go on: one line, and the exit status papermill's command line ends with."""

    def __init__(self, message: str) -> None:
        PapermillException.__init__(self, message)
        click.ClickException.__init__(self, message)


class MetadataError(EngineError):
    exit_code = flow.EXIT_USAGE


class NoGpuError(EngineError):
    exit_code = flow.EXIT_NO_GPU


class StoppedError(EngineError):
    exit_code = flow.EXIT_INTERRUPTED


_ERRORS: dict[int, type[EngineError]] = {
    flow.EXIT_USAGE: MetadataError,
    flow.EXIT_NO_GPU: NoGpuError,
    flow.EXIT_INTERRUPTED: StoppedError,
}


def _say(line: str) -> None:
    print(f"tfgpu engine: {safe(line)}", file=sys.stderr, flush=True)


class _WatchedClient(PapermillNotebookClient):
    """papermill's client, with the run watched from the kernel's start until before its shutdown."""

    def __init__(self, nb_man: Any, watch: observing.Watch, **kwargs: Any) -> None:
        super().__init__(nb_man, **kwargs)
        self.tfgpu_watch = watch

    def papermill_execute_cells(self) -> None:
        self.tfgpu_watch.started(self)
        try:
            super().papermill_execute_cells()
        except BaseException:
            self.tfgpu_watch.finish(None)  # interrupted or the kernel died: nothing to ask it
            raise
        self.tfgpu_watch.finish(self)


class TfgpuEngine(NBClientEngine):
    """papermill's nbclient engine, with the notebook's GPU settings waited for, claimed and applied."""

    @classmethod
    def execute_managed_notebook(
        cls,
        nb_man: Any,
        kernel_name: str,
        log_output: bool = False,
        stdout_file: Any = None,
        stderr_file: Any = None,
        start_timeout: int = 60,
        execution_timeout: Any = None,
        tfgpu_wait: str | None = None,
        **kwargs: Any,
    ) -> Any:
        try:
            wait_s = flow.parse_wait(
                tfgpu_wait or os.environ.get(WAIT_ENV), "the wait" if tfgpu_wait else WAIT_ENV
            )
            runner = f"{BY} (pid {os.getpid()})"
            how_to_wait = f"set {WAIT_ENV}=10m to wait for one"
            with flow.prepared(
                nb_man.nb.metadata,
                wait_s=wait_s,
                say=_say,
                runner=runner,
                how_to_wait=how_to_wait,
                # papermill's command line has no --wait
                how_to_wait_longer='`tfgpu_wait="30m"`' if tfgpu_wait else f"`{WAIT_ENV}=30m`",
            ) as run:
                # As NBClientEngine passes its options on, plus the kernel's argument.
                timeout = execution_timeout if execution_timeout else kwargs.get("timeout")
                kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
                options = merge_kwargs(
                    kwargs,
                    timeout=timeout,
                    startup_timeout=start_timeout,
                    kernel_name=kernel_name,
                    log=logger,
                    log_output=log_output,
                    stdout_file=stdout_file,
                    stderr_file=stderr_file,
                    extra_arguments=run.extra_arguments,
                )
                watch = observing.Watch(run.nvml, by=BY)
                try:
                    return _WatchedClient(nb_man, watch, **options).execute(env=run.env)
                finally:
                    observing.write_saved_keys(nb_man.nb)
                    observing.write_observed(nb_man.nb, watch)
        except flow.RunError as err:  # papermill's command line prints it as one line, `Error: ...`
            raise _ERRORS.get(err.status, EngineError)(f"tfgpu engine: {safe(str(err))}") from None
