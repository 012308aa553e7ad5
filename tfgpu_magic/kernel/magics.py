"""The ``%gpu`` magic: parse, dispatch to one small handler per verb, print the answer.

The logic lives in :mod:`session`, :mod:`status` and friends; this class only turns their
errors into IPython's one-line ``UsageError``.  ``%gpu?`` shows :data:`MANUAL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from IPython.core.completer import SimpleCompletion, context_matcher
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from traitlets import List, Unicode, observe

from ..command import grammar
from ..command.plan import Plan, PlanError
from . import allocator_figures
from .session import DefaultsRecord, Session, SessionError, get_session

__all__ = ["COMPLETION_ID", "MANUAL", "GpuMagics", "complete", "load", "register_completion"]

MANUAL = grammar.manual()  # generated from grammar.TABLE, where each verb is declared once


@magics_class
class GpuMagics(Magics):
    defaults = List(
        Unicode(),
        default_value=[],
        help="%gpu commands applied when the extension loads, e.g. ['grow', 'limit 50%'].",
    ).tag(config=True)

    def __init__(self, shell: Any = None, session: Session | None = None, **kwargs: Any) -> None:
        self.session = session or get_session()
        self._loaded = False  # config values set during __init__ wait for apply_defaults()
        super().__init__(shell, **kwargs)
        self._handlers: dict[type, Callable[[Any], str | None]] = {
            grammar.Status: self._status,
            grammar.Use: self._use,
            grammar.Grow: self._configure,
            grammar.Limit: self._configure,
            grammar.Split: self._configure,
            grammar.Allocator: self._configure,
            grammar.Precision: self._configure,
            grammar.Free: lambda _: self.session.free(),
            grammar.Reset: lambda _: self.session.reset(),
            grammar.Monitor: self._monitor,
            grammar.Trace: self._trace,
            grammar.Save: self._save,
        }

    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        __tracebackhide__ = True  # an error in the user's cell should not show this frame
        if cell is not None:
            return self._cell(line, cell)
        try:
            command = grammar.parse(line)
            handler = self._handlers.get(type(command))
            if handler is None:
                raise UsageError(f"`%gpu {line.split()[0]}` is not available in this version")
            answer = handler(command)
        except (grammar.GrammarError, SessionError) as err:
            raise UsageError(str(err)) from err
        finally:
            allocator_figures.publish(self.session)  # the panel's figures, read here on the user's thread
        if answer:
            print(answer)

    gpu.__doc__ = MANUAL

    def _configure(self, command: Any) -> str:
        return self.session.configure(command)

    def _use(self, command: grammar.Use) -> str:
        return use(self.session, command, progress=print)

    def _monitor(self, command: grammar.Monitor) -> str | None:
        from . import monitor, panels

        if command.off:
            return monitor.stop_panels()
        panels.open_panel(
            interval=command.interval, window=command.window, sidebar=command.sidebar, session=self.session
        )
        return None  # the panel displays itself; returning it would show it twice

    def _trace(self, command: grammar.Trace) -> str:
        from . import trace

        return trace.set_tracing(self.shell, self.session, command.on)

    def _save(self, command: grammar.Save) -> None:
        from IPython.display import display

        from . import notebook_settings

        text, keys = notebook_settings.save(self.session)
        display(notebook_settings.bundle(text, keys), raw=True)  # the front end or the runner writes it

    def apply_notebook_settings(self) -> None:
        """The notebook's saved settings, when its kernel was started for one (after the defaults)."""
        from . import notebook_settings

        record = notebook_settings.apply_at_start(self.session, use)
        notice = None if record is None else record.notice()
        if notice is not None and self.shell is not None:
            _notice_under_first_cell(self.shell, notice)

    def _cell(self, line: str, cell: str) -> Any:
        """``%%gpu budget 2G`` and ``%%gpu on 1``: run the cell under a condition."""
        __tracebackhide__ = True
        from . import cells

        try:
            return cells.run_cell_magic(self.shell, self.session, line, cell)
        except (grammar.GrammarError, SessionError) as err:
            raise UsageError(str(err)) from err

    def _status(self, command: grammar.Status) -> None:
        from . import status  # not at import: keeps `%load_ext` light

        report = status.build_report(self.session)
        if command.json:
            from ..safe_text import strict_json

            print(strict_json(report, indent=2))  # JSON.parse reads it: no NaN, no Infinity
            return
        from IPython.display import display

        # Rich HTML in a notebook, plain text in a terminal: IPython picks from the bundle.
        bundle = {"text/plain": status.render_text(report)}
        if hasattr(status, "render_html"):
            bundle["text/html"] = status.render_html(report)
        display(bundle, raw=True)

    # -- administrator defaults ---------------------------------------------------------------
    @observe("defaults")
    def _defaults_changed(self, change: dict[str, Any]) -> None:
        if self._loaded:  # `%config GpuMagics.defaults = [...]` in a running kernel
            self.apply_defaults()

    def apply_defaults(self) -> None:
        """Run the configured default commands; a bad one is one line and skipped, the rest apply.

        The defaults are what ``%gpu reset`` returns to: the plan the good lines make on their
        own, not whatever else was requested before them.
        """
        self._loaded = True  # whatever happens below, later `%config` changes are honoured
        session = self.session
        defaults = Plan()
        not_applied: list[tuple[str, str]] = []
        for line in self.defaults:
            try:
                command = grammar.parse(str(line))
                if type(command) not in SETTINGS:
                    raise grammar.GrammarError(
                        f"{line!r} is not a setting; defaults take {', '.join(SETTING_VERBS)}"
                    )
                use(session, command, progress=print)
                defaults = defaults.with_command(_planned(session, command))
                continue
            except (grammar.GrammarError, SessionError, PlanError) as err:
                why = str(err)
            except Exception as err:  # a default must never stop the extension from loading
                why = f"{type(err).__name__}: {err}"
            print(f"tfgpu_magic: ignored default {line!r}: {why}")
            not_applied.append((str(line), why))
        session.defaults = defaults
        session.defaults_record = DefaultsRecord(tuple(map(str, self.defaults)), tuple(not_applied))


SETTINGS = (grammar.Grow, grammar.Limit, grammar.Split, grammar.Use, grammar.Allocator, grammar.Precision)
SETTING_VERBS = ("use", "grow", "limit", "split", "allocator", "precision")


def load(ipython: Any) -> None:
    """What loading the extension does: ``%gpu`` and its completion, the out-of-memory explanation,
    the panel's figures after each cell, the defaults, then the notebook's saved settings.

    Once per session and shell: a kernel started for a notebook's settings loaded it already
    (:mod:`.at_start`), and the notebook's own ``%load_ext tfgpu_magic`` cell then changes nothing,
    where a second load would apply the defaults and the settings over what the user did since."""
    from .allocator_figures import install as publish_after_each_cell  # for the memory panel
    from .oom_handler import install as explain_out_of_memory  # hooks in when a framework is imported

    session = get_session()
    if session.loaded_into is ipython:
        return
    magics = GpuMagics(ipython, session=session)
    ipython.register_magics(magics)
    register_completion(ipython)  # %gpu's words first and alone, ahead of Jedi's names
    ipython.set_hook("complete_command", complete, str_key="%gpu")  # `gpu ...` without the %
    session.prepare()
    explain_out_of_memory(ipython, session)
    publish_after_each_cell(ipython, session)
    session.loaded_into = ipython
    magics.apply_defaults()
    magics.apply_notebook_settings()  # the notebook's saved settings, after (over) the defaults


def _notice_under_first_cell(shell: Any, notice: str) -> None:
    """Say ``notice`` under the first cell the user runs: said at start-up, it reaches no notebook."""

    def once(result: Any = None) -> None:
        shell.events.unregister("post_run_cell", once)
        print(notice)

    shell.events.register("post_run_cell", once)


def use(session: Session, command: Any, progress: Any = print) -> str:
    """A configuration command; ``use auto`` chooses and claims first.

    A refused choice changes nothing: GPUs claimed for it are given back, and the claims the
    kernel held before stay (the session releases them only once it accepts the new request).
    """
    if not (isinstance(command, grammar.Use) and isinstance(command.gpus, grammar.Auto)):
        answer = session.configure(command)
        if isinstance(command, grammar.Use):
            session.auto_request = None  # GPUs named: nothing of `use auto` stays in force
        return answer
    from ..gpus import claims
    from . import choosing  # the chooser and its claims

    held_before = claims.held()
    try:
        gpus, reason = choosing.choose_gpus(session, command.gpus, progress=progress)
    except choosing.ChoiceError as err:
        raise SessionError(str(err)) from err
    try:
        answer = session.configure(grammar.Use(gpus), chosen_by_auto=True)
    except SessionError:
        for index in gpus:
            key = choosing.claim_key(session.nvml, index)
            if key is not None and key not in held_before:
                claims.release(key)  # chosen but not used: let others have them
        raise
    session.auto_request = command.gpus
    return f"{reason}\n{answer}"


def _planned(session: Session, command: Any) -> Any:
    """The command as the session planned it (``use auto`` became GPU numbers)."""
    if isinstance(command, grammar.Use) and isinstance(command.gpus, grammar.Auto):
        visible = session.requested.visible
        if visible is not None:  # the GPUs `use auto` chose
            return grammar.Use(visible)
    return command


def complete(shell: Any, event: Any) -> list[str]:
    """Tab completion: verbs after ``%gpu``, then each verb's words (see grammar.complete)."""
    return grammar.complete(event.line)


COMPLETION_ID = "tfgpu_magic.gpu"  # the matcher's name in IPCompleter.suppress_competing_matchers
# `%gpu ...` on any line (also `x = %gpu ...`), `%%gpu ...` on the cell's first line.
_GPU_LINE = re.compile(r"^\s*(?:[A-Za-z_]\w*\s*=\s*)?(%gpu)\s|^\s*(%%gpu)\s")


def register_completion(shell: Any) -> None:
    """Complete ``%gpu``/``%%gpu`` lines with our words only, ahead of Jedi and file names.

    The ``complete_command`` hook (kept for ``gpu ...`` typed without ``%``) cannot do this:
    IPython lists Jedi's names before any hook's words, so ``%gpu monitor --s`` offered
    ``set``, ``setattr``, ... first.  A matcher of our own asks IPython to suppress the others
    whenever it has words to offer.  Registering twice (a second ``%load_ext``) adds nothing.
    """
    completer = getattr(shell, "Completer", None)
    matchers = getattr(completer, "custom_matchers", None)
    if matchers is None:  # not an IPCompleter (IPython < 8.6 or a stand-in shell)
        return
    if not any(getattr(m, "matcher_identifier", None) == COMPLETION_ID for m in matchers):
        matchers.insert(0, gpu_matcher)


@context_matcher(identifier=COMPLETION_ID, priority=10)
def gpu_matcher(context: Any) -> dict[str, Any]:
    """IPython's matcher API v2: the words for the ``%gpu`` line the cursor is on."""
    none: dict[str, Any] = {"completions": [], "suppress": False}
    line = context.text_until_cursor
    match = _GPU_LINE.match(line)
    if match is None or (match.group(2) and context.cursor_line != 0):
        return none
    typed = line[match.start(1) if match.group(1) else match.start(2) :]
    fragment = "" if typed[-1].isspace() else typed.split()[-1]
    words = grammar.complete(typed)
    found = [w for w in words if w.startswith(fragment)] or [
        w
        for w in words
        if w.lower().startswith(fragment.lower())  # IPython's rule for hooks
    ]
    return {
        "completions": [SimpleCompletion(word, type="param") for word in found],
        "matched_fragment": fragment,
        "suppress": bool(found),
        "ordered": True,
    }
