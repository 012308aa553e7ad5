"""``tfgpu run NOTEBOOK``: execute a notebook headless with its saved GPU settings.

Waits (``--wait``) until GPUs meet the notebook's requirements, claims them for the run, starts
the kernel with the settings in force before the first cell, executes every cell (nbclient;
papermill's parameters with ``-p``), writes the output notebook with this run's observations in
its ``tfgpu`` metadata, and releases the claims whatever happens.

Progress and outcome go to stderr, each line starting ``tfgpu run:``; the last line says where the
output notebook is and why the run ended.  Exit status: 0 done, 1 a cell failed (the output
notebook holds its error), 2 bad arguments or malformed metadata, 3 no GPU met the requirements
within ``--wait``, 130 interrupted (Ctrl-C or SIGTERM).

The output goes to ``-o OUTPUT``, by default ``NAME.out.ipynb`` beside ``NAME.ipynb``: a runner
that overwrote its input would lose the notebook's outputs of the last interactive session.
The kernel runs in the notebook's folder, as ``jupyter nbconvert --execute`` runs it, so the
notebook's relative paths mean what they meant when it was written.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..safe_text import bounded, safe
from . import flow, observing
from .flow import EXIT_CELL_FAILED, EXIT_DONE, EXIT_INTERRUPTED, EXIT_USAGE, RunError

__all__ = ["main"]

PREFIX = "tfgpu run: "
MAX_NOTEBOOK_BYTES = 256 * 1024 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfgpu run",
        description="Execute a notebook headless with its saved GPU settings (its `tfgpu` metadata).",
        epilog=(
            "Exit status: 0 done, 1 a cell failed, 2 bad arguments or metadata, 3 no GPU met the "
            "requirements within --wait, 130 interrupted."
        ),
    )
    parser.add_argument("notebook", help="the notebook to run (.ipynb)")
    parser.add_argument(
        "-o", "--output", help="where to write the executed notebook (default: NAME.out.ipynb beside it)"
    )
    parser.add_argument(
        "--wait",
        metavar="DURATION",
        help="wait this long (30s, 10m, 1h) for GPUs that meet the requirements (default: no wait)",
    )
    parser.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        default=[],
        help="a papermill parameter (needs papermill); repeat for more",
    )
    parser.add_argument(
        "-k", "--kernel", help="the kernel to start (default: the notebook's kernelspec, or python3)"
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        help="fail a cell that runs longer than this (default: never)",
    )
    return parser


@dataclass
class _Outcome:
    status: int
    reason: str


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # a usage error exits 2, as argparse does
    if threading.current_thread() is not threading.main_thread():
        return _main(args)  # only the main thread may handle signals (a caller's worker thread)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _main(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: the claims are released, the kernel shut down


def say(line: str) -> None:
    """One line on stderr; what the notebook, its path or its cells chose is shown, never obeyed."""
    print(PREFIX + safe(line), file=sys.stderr, flush=True)


def _main(args: argparse.Namespace) -> int:
    nb = None
    output = None
    try:
        _check_installed()
        source = Path(args.notebook)
        if not source.name:  # `tfgpu run .`, `tfgpu run /`: no notebook is named
            raise RunError(f"{source} names no notebook file", EXIT_USAGE)
        output = Path(args.output) if args.output else source.with_name(source.stem + ".out.ipynb")
        if not output.parent.is_dir():
            raise RunError(f"the output's folder {output.parent} does not exist", EXIT_USAGE)
        if output.is_dir():  # said now, not after the run
            raise RunError(f"the output {output} is a folder", EXIT_USAGE)
        if _same_file(source, output):  # the docs promise the input is never overwritten
            raise RunError(
                f"the output {output} is the notebook itself, whose outputs it would replace; "
                "give -o another file",
                EXIT_USAGE,
            )
        wait_s = flow.parse_wait(args.wait)
        timeout = timeout_of(args.timeout)
        nb = _read_notebook(source)
        kernel = args.kernel or _kernel_of(nb.metadata)
        if args.parameter:
            nb = _parameterize(nb, args.parameter, kernel)
        runner = f"tfgpu run (pid {os.getpid()})"
        how_to_wait = "run again with `--wait 10m` to wait for one"
        with flow.prepared(
            nb.metadata, wait_s=wait_s, say=say, runner=runner, how_to_wait=how_to_wait
        ) as run:
            outcome = _execute(nb, run, kernel, source.resolve().parent, timeout)
    except RunError as err:
        say(f"{err}; no output written (exit {err.status})")
        return err.status
    except KeyboardInterrupt:
        where = "no output written"
        if nb is not None and output is not None and _ran(nb):
            try:
                where = f"wrote {_write(nb, output)}"
            except RunError as err:
                where = str(err)
        say(f"interrupted; the claims are released; {where} (exit {EXIT_INTERRUPTED})")
        return EXIT_INTERRUPTED
    try:
        written = _write(nb, output)
    except RunError as err:
        say(f"{outcome.reason}, but {err} (exit {err.status})")
        return err.status
    say(f"wrote {written}: {outcome.reason} (exit {outcome.status})")
    return outcome.status


def _check_installed() -> None:
    """nbformat and nbclient are the `run` extra's, not the package's: their absence is one line."""
    import importlib.util

    missing = [name for name in ("nbformat", "nbclient") if importlib.util.find_spec(name) is None]
    if missing:
        raise RunError(
            f"needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            f"installed: pip install {' '.join(missing)} ipykernel",
            EXIT_USAGE,
        )


def _same_file(source: Path, output: Path) -> bool:
    try:
        return os.path.samefile(source, output)
    except OSError:  # either is not there (yet): not the same file
        return False


def timeout_of(text: str | None) -> int | None:
    """``--timeout``: seconds above 0, rounded up to whole seconds (nbclient counts in them)."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RunError(f"--timeout {text!r} is not a number of seconds above 0", EXIT_USAGE)
    return math.ceil(seconds)


def _kernel_of(metadata: Any) -> str:
    """The notebook's kernelspec name (python3 where it names none); RunError for one that is odd."""
    spec = metadata.get("kernelspec")
    if spec is None:
        return "python3"
    if not isinstance(spec, dict):
        raise RunError("the notebook's metadata `kernelspec` is not an object; give -k KERNEL", EXIT_USAGE)
    name = spec.get("name")
    if name is None or name == "":
        return "python3"
    if not isinstance(name, str):
        raise RunError(
            "the notebook's metadata `kernelspec.name` is not a kernel's name; give -k KERNEL", EXIT_USAGE
        )
    return name


def _read_notebook(path: Path) -> Any:
    """The notebook, read through one descriptor: never a FIFO (whose open would block) or a device
    (/dev/zero reads for ever), at most MAX_NOTEBOOK_BYTES."""
    import nbformat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise RunError(f"cannot read {path} ({err.strerror or err})", EXIT_USAGE) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RunError(f"{path} is not a regular file", EXIT_USAGE)
        if info.st_size > MAX_NOTEBOOK_BYTES:
            raise RunError(f"{path} is over {MAX_NOTEBOOK_BYTES // 2**20} MiB; not read", EXIT_USAGE)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_NOTEBOOK_BYTES + 1)
    except OSError as err:
        raise RunError(f"cannot read {path} ({err.strerror or err})", EXIT_USAGE) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_NOTEBOOK_BYTES:  # it grew as it was read
        raise RunError(f"{path} is over {MAX_NOTEBOOK_BYTES // 2**20} MiB; not read", EXIT_USAGE)
    try:
        return nbformat.reads(raw.decode("utf-8"), as_version=4)
    except Exception as err:  # not UTF-8, nbformat's NotJSONError, nested too deep, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunError(f"{path} is not a notebook ({first[:200]})", EXIT_USAGE) from None


def _parameterize(nb: Any, pairs: list[list[str]], kernel: str) -> Any:
    """papermill's parameters cell, injected as papermill does (after the cell tagged `parameters`)."""
    try:
        from papermill.parameterize import parameterize_notebook
    except ImportError:
        raise RunError(
            "-p needs papermill, which is not installed: pip install papermill",
            EXIT_USAGE,
        ) from None
    from papermill import __version__ as version

    # What papermill's own reader (papermill.iorw.load_notebook_node) adds, and its parameterizing reads.
    nb.metadata.setdefault(
        "papermill",
        {"default_parameters": {}, "parameters": {}, "environment_variables": {}, "version": version},
    )
    for cell in nb.cells:
        cell.metadata.setdefault("tags", [])
        cell.metadata.setdefault("papermill", {})
    parameters = {name: _value(text) for name, text in pairs}
    return parameterize_notebook(nb, parameters, kernel_name=kernel)


def _value(text: str) -> Any:
    """A parameter's value as papermill's `-p` reads it: a number, True/False/None, or the text."""
    words: dict[str, Any] = {"True": True, "False": False, "None": None}
    if text in words:
        return words[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _execute(nb: Any, run: flow.Prepared, kernel: str, cwd: Path, timeout: float | None) -> _Outcome:
    """Every cell in one kernel, stopping at the first that fails; the observations written in."""
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    client = NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=timeout,
        extra_arguments=run.extra_arguments,
        resources={"metadata": {"path": str(cwd)}},
    )
    watch = observing.Watch(run.nvml, by="tfgpu run")
    outcome = _Outcome(EXIT_DONE, "done")
    client.reset_execution_trackers()
    try:
        with client.setup_kernel(env=run.env):
            watch.started(client)
            asked = False
            try:
                outcome = _cells(client, nb, (CellExecutionError, CellTimeoutError))
                watch.finish(client)
                asked = True
            finally:
                if not asked:
                    watch.finish(None)  # interrupted or the kernel died: stop sampling, ask nothing
    except NoSuchKernel:
        raise RunError(
            f"no kernel named {kernel!r} (`jupyter kernelspec list` lists them; -k names one)", EXIT_USAGE
        ) from None
    except DeadKernelError:
        outcome = _Outcome(EXIT_CELL_FAILED, "the kernel died")
    finally:
        _observations_into(nb, watch)
    return outcome


def _cells(client: Any, nb: Any, failures: tuple[type[BaseException], ...]) -> _Outcome:
    for index, cell in enumerate(nb.cells):
        try:
            client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except failures as err:
            return _Outcome(EXIT_CELL_FAILED, f"cell {index + 1} failed ({_error_line(cell, err)})")
    return _Outcome(EXIT_DONE, f"done, {len(nb.cells)} cell{'s' if len(nb.cells) != 1 else ''}")


def _error_line(cell: Any, err: BaseException) -> str:
    """The failed cell's error in one line, escaped: the notebook chose its text."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return bounded(f"{output.get('ename')}: {output.get('evalue')}", 200)
    return type(err).__name__


def _observations_into(nb: Any, watch: observing.Watch) -> None:
    observing.write_saved_keys(nb)
    observing.write_observed(nb, watch)


def _ran(nb: Any) -> bool:
    """Whether any cell ran (an interrupted wait ran none: there is nothing to write)."""
    return any(cell.get("outputs") or cell.get("execution_count") for cell in nb.cells)


def _write(nb: Any, output: Path) -> Path:
    """Write the notebook whole under a new name beside ``output``, then rename it over ``output``:
    a link planted there (a neighbour's, in a shared folder) is replaced, never written through,
    and a reader never sees half a notebook."""
    import nbformat

    try:
        text = nbformat.writes(nb)
        fd, temporary = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    except OSError as err:
        raise RunError(f"cannot write {output} ({err.strerror or err})", EXIT_USAGE) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # as an ordinary write would make it
            handle.write(text)
            if not text.endswith("\n"):
                handle.write("\n")
        os.replace(temporary, output)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise RunError(f"cannot write {output} ({err.strerror or err})", EXIT_USAGE) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return output


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    sys.exit(main())
