"""The ``%gpu`` magic: parse, dispatch to one small handler per verb, print the answer.

The logic lives in :mod:`session`, :mod:`status` and friends; this class only turns their
errors into IPython's one-line ``UsageError``.  ``%gpu?`` shows :data:`MANUAL`.

Importing this module imports no part of the command language, the session or the adapters:
``%load_ext`` registers the magic, its completion and the import hooks, and the rest is built
at the first ``%gpu`` (see :func:`load`).
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from IPython.core.completer import SimpleCompletion, context_matcher
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from traitlets import Float, List, Unicode, observe

from . import deferred

if TYPE_CHECKING:
    from .session import Session

    MANUAL: str

__all__ = ["COMPLETION_ID", "MANUAL", "GpuMagics", "complete", "load", "register_completion"]


def __getattr__(name: str) -> Any:
    """``MANUAL``: ``%gpu?``, generated from grammar.TABLE (where each verb is declared once) when first read."""
    if name == "MANUAL":
        return _manual()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MANUAL: list[str] = []


def _manual() -> str:
    if not _MANUAL:
        from ..command import grammar

        _MANUAL.append(grammar.manual())
    return _MANUAL[0]


class _GpuMagic(functools.partial):
    # ``%gpu`` as IPython calls it: the magics' ``gpu``, bound (a partial adds no frame to a
    # traceback), whose docstring (``%gpu?``, the manual) is generated when first read rather
    # than at ``%load_ext``.

    @property
    def __doc__(self) -> str:  # type: ignore[override]
        return _manual()

    def getdoc(self) -> str:
        """What IPython's ``?`` asks first."""
        return _manual()


@magics_class
class GpuMagics(Magics):
    defaults = List(
        Unicode(),
        default_value=[],
        help="%gpu commands applied when the extension loads, e.g. ['grow', 'limit 50%'].",
    ).tag(config=True)
    idle_notice_after = Float(
        600.0,
        help="Seconds between two cells after which the next cell says, under it, that the kernel "
        "holds GPU memory it has not used since (its processes at 0%, the driver's samples).",
    ).tag(config=True)
    idle_notice_min_memory = Unicode(
        "1G",
        help='The least GPU memory (the driver\'s figure, all GPUs) the kernel must hold for that line ("1G", "512M").',
    ).tag(config=True)

    def __init__(self, shell: Any = None, session: Session | None = None, **kwargs: Any) -> None:
        self._session = session  # None: the kernel's, built when first needed
        self._loaded = False  # config values set during __init__ wait for apply_defaults()
        super().__init__(shell, **kwargs)
        for kind in ("line", "cell"):
            self.magics[kind]["gpu"] = _GpuMagic(GpuMagics.gpu, self)
        self._handler_table: dict[type, Callable[[Any], str | None]] | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            from .session import get_session

            self._session = get_session()
        return self._session

    @session.setter
    def session(self, session: Session) -> None:
        self._session = session

    @property
    def _handlers(self) -> dict[type, Callable[[Any], str | None]]:
        if self._handler_table is not None:
            return self._handler_table
        from ..command import grammar

        self._handler_table = {
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
            grammar.Doctor: self._doctor,
        }
        return self._handler_table

    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        __tracebackhide__ = True  # an error in the user's cell should not show this frame
        if cell is not None:
            return self._cell(line, cell)
        from ..command import grammar
        from . import allocator_figures
        from .session import SessionError

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

    def idle_thresholds(self) -> Any:
        """The idle notice's thresholds as configured now (a size that is not one: 1 GiB)."""
        from ..command import grammar
        from ..command.units import MIB
        from .idle_notice import Thresholds

        try:
            least = int(grammar.parse_size(self.idle_notice_min_memory, percent=False)) * MIB
        except grammar.GrammarError:
            least = 1024 * MIB
        after = float(self.idle_notice_after)
        if not math.isfinite(after):  # NaN would read the driver after every cell
            after = float(GpuMagics.idle_notice_after.default_value)
        return Thresholds(max(after, 0.0), least)

    def _configure(self, command: Any) -> str:
        return self.session.configure(command)

    def _use(self, command: Any) -> str:
        return use(self.session, command, progress=print)

    def _monitor(self, command: Any) -> str | None:
        from . import monitor, panels

        if command.off:
            return monitor.stop_panels()
        panels.open_panel(
            interval=command.interval, window=command.window, sidebar=command.sidebar, session=self.session
        )
        return None  # the panel displays itself; returning it would show it twice

    def _trace(self, command: Any) -> str:
        from . import trace

        return trace.set_tracing(self.shell, self.session, command.on)

    def _save(self, command: Any) -> None:
        from IPython.display import display

        from . import notebook_settings

        text, keys = notebook_settings.save(self.session)
        display(notebook_settings.bundle(text, keys), raw=True)  # the front end or the runner writes it

    def _doctor(self, command: Any) -> str:
        from . import doctor  # not at import: keeps `%load_ext` light

        data = doctor.report(self.session)
        if command.json:
            from ..safe_text import strict_json

            return strict_json(data, indent=2)
        return doctor.render_text(data)

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
        from ..command import grammar
        from . import cells
        from .session import SessionError

        try:
            return cells.run_cell_magic(self.shell, self.session, line, cell)
        except (grammar.GrammarError, SessionError) as err:
            raise UsageError(str(err)) from err

    def _status(self, command: Any) -> None:
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
        from ..command import grammar
        from ..command.plan import Plan, PlanError
        from .session import DefaultsRecord, SessionError

        session = self.session
        defaults = Plan()
        not_applied: list[tuple[str, str]] = []
        for line in self.defaults:
            try:
                command = grammar.parse(str(line))
                if type(command) not in _settings():
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


def _settings() -> tuple[type, ...]:
    """The commands a default may be."""
    from ..command import grammar

    return (grammar.Grow, grammar.Limit, grammar.Split, grammar.Use, grammar.Allocator, grammar.Precision)


SETTING_VERBS = ("use", "grow", "limit", "split", "allocator", "precision")


def load(ipython: Any) -> None:
    """What loading the extension does: ``%gpu`` and its completion, the import hooks, the
    out-of-memory explanation, the panel's figures after each cell, the defaults, then the
    notebook's saved settings.

    Once per session and shell: a kernel started for a notebook's settings loaded it already
    (:mod:`.at_start`), and the notebook's own ``%load_ext tfgpu_magic`` cell then changes nothing,
    where a second load would apply the defaults and the settings over what the user did since.

    Light when nothing needs the session now (:func:`_session_needed_now`): the magic, its
    completion and a hook per framework module are registered, ``CUDA_DEVICE_ORDER`` is set, and
    the session (the command language, the adapters, their dataclasses) is built at the first
    ``%gpu`` or framework import, which finishes the load then (:mod:`.deferred`)."""
    if _loaded_into(ipython):
        return
    magics = GpuMagics(ipython)
    ipython.register_magics(magics)
    register_completion(ipython)  # %gpu's words first and alone, ahead of Jedi's names
    ipython.set_hook("complete_command", complete, str_key="%gpu")  # `gpu ...` without the %
    if not _session_needed_now(magics, os.environ):
        _load_lightly(ipython, magics)
        return
    from .allocator_figures import install as publish_after_each_cell  # for the memory panel
    from .idle_notice import install as notice_idle_memory
    from .oom_handler import install as explain_out_of_memory  # hooks in when a framework is imported

    session = magics.session
    session.prepare()
    explain_out_of_memory(ipython, session)
    publish_after_each_cell(ipython, session)
    notice_idle_memory(ipython, session, magics.idle_thresholds)
    session.loaded_into = ipython
    magics.apply_defaults()
    magics.apply_notebook_settings()  # the notebook's saved settings, after (over) the defaults


def _loaded_into(ipython: Any) -> bool:
    """Whether the extension is loaded into ``ipython`` already (its session built or not)."""
    if deferred.pending(ipython):
        return True
    session_module = sys.modules.get(f"{__package__}.session")
    built = getattr(session_module, "_SESSION", None)
    return built is not None and built.loaded_into is ipython


def _session_needed_now(magics: GpuMagics, env: Mapping[str, str]) -> bool:
    """Whether loading has work for the session: a session built already (a script's device
    source), an administrator's defaults, the notebook's saved settings, a CUDA variable
    inherited (said or met at load), or a framework imported before the extension."""
    from ..frameworks import WATCHED_MODULES

    session_module = sys.modules.get(f"{__package__}.session")
    if getattr(session_module, "_SESSION", None) is not None or magics.defaults:
        return True
    if "CUDA_VISIBLE_DEVICES" in env or "CUDA_DEVICE_ORDER" in env:
        return True
    if any(name in sys.modules for name in WATCHED_MODULES):
        return True
    return _may_have_saved_settings(env)


def _may_have_saved_settings(env: Mapping[str, str]) -> bool:
    """Whether notebook_settings.apply_at_start could find settings: a runner's, or a notebook
    file holding the ``tfgpu`` key (read as the kernel would read it, not parsed)."""
    if "TFGPU_MAGIC_NOTEBOOK_SETTINGS" in env:
        return True
    path = env.get("JPY_SESSION_NAME")
    if not path or not path.endswith(".ipynb"):
        return False
    from ..command.notebook_file import keyed_bytes

    return keyed_bytes(path) is not None


def _load_lightly(ipython: Any, magics: GpuMagics) -> None:
    """The load without its session: what the session's prepare() does to the environment now
    (before anything starts CUDA), a hook per framework module, the rest when the session is built."""
    from ..frameworks import WATCHED_MODULES
    from ..frameworks.import_hooks import run_after_import

    environment = dict(os.environ)  # as the kernel inherited it (the machine's record, later)
    written = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA numbers the GPUs as nvidia-smi does
    os.environ.update(written)
    magics._loaded = True  # no defaults: a later `%config GpuMagics.defaults = [...]` applies them

    def finish(session: Session) -> None:
        from .allocator_figures import install as publish_after_each_cell
        from .idle_notice import install as notice_idle_memory
        from .oom_handler import install as explain_out_of_memory

        session.machine.met_at_load(environment, written)
        session.install_import_hooks()
        explain_out_of_memory(ipython, session)
        publish_after_each_cell(ipython, session)
        notice_idle_memory(ipython, session, magics.idle_thresholds)
        session.loaded_into = ipython

    deferred.defer(ipython, finish)
    for name in WATCHED_MODULES:
        run_after_import(name, _build_session)  # the session hears of the import from its own hooks


def _build_session(module: Any) -> None:
    """A framework was imported after a light load: build the session (it finishes the load)."""
    from .session import get_session

    get_session()


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
    from ..command import grammar
    from .session import SessionError

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
    from ..command import grammar

    if isinstance(command, grammar.Use) and isinstance(command.gpus, grammar.Auto):
        visible = session.requested.visible
        if visible is not None:  # the GPUs `use auto` chose
            return grammar.Use(visible)
    return command


def complete(shell: Any, event: Any) -> list[str]:
    """Tab completion: verbs after ``%gpu``, then each verb's words (see grammar.complete)."""
    from ..command import grammar

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
    from ..command import grammar

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
