"""``python -m tfgpu_magic`` / ``tfgpu``: the ``%gpu status`` picture in a terminal.

``tfgpu run NOTEBOOK ...`` runs a notebook headless with its saved GPU settings
(:mod:`tfgpu_magic.runner.run`, which has its own arguments and exit statuses).

Needs neither IPython nor TensorFlow.  Exit status: 0 with GPU readings, 1 when NVML cannot be
reached (the report still prints, saying why), 2 for a usage error, 141 when the reader of the
output went away (``tfgpu | head -n 0``; the status a shell gives a tool ended by SIGPIPE).

Other users' command lines and names are shown, never obeyed (:mod:`tfgpu_magic.safe_text`);
a terminal that cannot encode a character gets a ``\\x..`` escape rather than a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

from ._version import __version__

__all__ = ["main"]

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head -1` reports for `yes`


# The forms scripts and users type most, read without argparse (argparse and the gettext it
# imports cost about a tenth of a fresh `tfgpu --json`): (json, demo).  Anything else (help,
# --version, a mistake) is argparse's, so its answers and messages stay the same.
_PLAIN_FORMS: dict[tuple[str, ...], tuple[bool, bool]] = {
    (): (False, False),
    ("--json",): (True, False),
    ("--demo",): (False, True),
    ("--json", "--demo"): (True, True),
    ("--demo", "--json"): (True, True),
}


def _options(words: list[str]) -> tuple[bool, bool]:
    """(``--json``, ``--demo``) of the command line."""
    plain = _PLAIN_FORMS.get(tuple(words))
    if plain is not None:
        return plain
    args = _parser().parse_args(words)
    return args.json, args.demo


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="tfgpu",
        usage=(
            "tfgpu [-h] [--json] [--version] [--demo]\n"
            "       tfgpu run NOTEBOOK [-o OUTPUT] [--wait DURATION] [-p NAME VALUE] ..."
        ),
        description="Who holds what on this machine's GPUs: memory by owner, processes, claims.",
        epilog=(
            "In a notebook: %load_ext tfgpu_magic, then %gpu status (or %gpu use auto to claim a GPU). "
            "To run a notebook headless with its saved GPU settings: tfgpu run NOTEBOOK (tfgpu run --help)."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON, for scripts")
    parser.add_argument("--version", action="version", version=f"tfgpu {__version__}")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="read a simulated four-GPU shared server instead of the driver (to try the output)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
    except BrokenPipeError:
        # The reader went away (`tfgpu | head -3`): stop quietly.  As Python's documentation
        # advises, stdout is pointed at devnull so the interpreter's last flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # an ASCII or Latin-1 terminal: \\xb7, no traceback
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["run"]:  # `tfgpu run NOTEBOOK ...`: the runner has its own arguments
        from .runner.run import main as run

        return run(words[1:])
    as_json, demo = _options(words)
    from .gpus.nvml import Nvml
    from .kernel import status  # after parsing: `tfgpu --help` stays instant
    from .kernel.session import Session

    lib = table = None
    if demo:
        from .gpus.owners import OwnerLookupTable
        from .gpus.simulated import DEMO_KERNEL_PID, shared_server

        # The simulated server as its user "me" sees it from a terminal: one of my notebook
        # kernels holds memory on GPU 1; this process, like any terminal tool, holds none.
        lib = shared_server(my_pid=DEMO_KERNEL_PID)
        table = OwnerLookupTable(lib.owner_of, me="me")
    report = status.build_report(Session(nvml=Nvml(lib=lib)), process_table=table, viewer="this process")
    if as_json:
        from .safe_text import strict_json

        print(strict_json(report, indent=2))  # JSON.parse reads it: no NaN, no Infinity
    else:
        print(status.render_text(report, machine=True))
    return 1 if report["nvml_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
