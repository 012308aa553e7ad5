"""The kernel's GPU session: what was asked, and getting it into TensorFlow at the right moment.

One :class:`Session` per process (:func:`get_session`).  It validates commands against the
machine (NVML), sets what must precede CUDA start-up in the environment, applies the rest
through ``tf.config`` as soon as TensorFlow is imported (a post-import hook, so ``import
tensorflow`` and the first op may share a cell), and refuses, with the exact remedy, what a
started TensorFlow can no longer change.  Works without IPython; messages are plain strings.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from . import grammar, numbering, tf_runtime
from .nvml import Nvml
from .plan import Plan, PlanError, limit_mib, logical_sizes_mib
from .tf_runtime import Stage
from .units import MIB, format_bytes, format_change

__all__ = ["Session", "SessionError", "get_session", "set_device_source"]

# Variables the session manages.  Their values when the session began are restored on reset.
MANAGED_ENV = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")


class SessionError(ValueError):
    """A command that cannot be carried out; the message (one line) says what to do."""


class Session:
    def __init__(self, nvml: Optional[Nvml] = None, env: Optional[dict[str, str]] = None) -> None:
        self.nvml = nvml if nvml is not None else Nvml()
        self.env = os.environ if env is None else env
        self.inherited = {name: self.env.get(name) for name in MANAGED_ENV}
        self.defaults = Plan()  # an administrator's defaults (traitlets); `reset` returns here
        self.requested = Plan()
        self.owned_logical: set[int] = set()  # NVML indices whose logical devices we configured
        self.hook_errors: list[str] = []
        self._lock = threading.RLock()

    def prepare(self) -> None:
        """At extension load: number CUDA's GPUs as nvidia-smi does, and watch for TensorFlow."""
        if tf_runtime.stage() < Stage.ENUMERATED and self.inherited["CUDA_DEVICE_ORDER"] is None:
            self.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if tf_runtime.stage() is Stage.NOT_IMPORTED:
            install_import_hooks()

    # -- machine facts ----------------------------------------------------------------------
    def gpu_uuids(self) -> Optional[list[Optional[str]]]:
        """Every GPU's UUID in NVML order, or None without NVML."""
        if not self.nvml.available():
            return None
        return [self.nvml.uuid(i) for i in range(self.nvml.device_count())]

    def cuda_map(self) -> list[int]:
        """NVML index of each CUDA device (TensorFlow's physical GPU k is entry k)."""
        uuids = self.gpu_uuids()
        if uuids is None:  # no NVML: trust the indices as written
            raw = self.env.get("CUDA_VISIBLE_DEVICES")
            if raw is None:
                return list(range(64))
            return numbering.cuda_to_nvml(self.env, [None] * 64)
        return numbering.cuda_to_nvml(self.env, uuids)

    def totals_mib(self) -> dict[int, Optional[int]]:
        if not self.nvml.available():
            return {}
        totals: dict[int, Optional[int]] = {}
        for i in range(self.nvml.device_count()):
            total = self.nvml.total_bytes(i)
            totals[i] = None if total is None else total // MIB
        return totals

    def planned_visible(self, plan: Optional[Plan] = None) -> Optional[list[int]]:
        """NVML indices the plan shows TensorFlow, in order; None when unknown (no NVML)."""
        plan = plan or self.requested
        if plan.visible == "none":
            return []
        if isinstance(plan.visible, tuple):
            return sorted(plan.visible)
        uuids = self.gpu_uuids()
        if uuids is None:
            return None
        if plan.visible == "all":
            return list(range(len(uuids)))
        return sorted(numbering.cuda_to_nvml(self.inherited_env(), uuids))

    def inherited_env(self) -> dict[str, str]:
        return {k: v for k, v in self.inherited.items() if v is not None}

    def visible_gpus(self) -> Optional[list[int]]:
        """NVML indices this kernel sees now (TensorFlow's view once it enumerated)."""
        if tf_runtime.stage() >= Stage.ENUMERATED:
            return sorted(set(tf_runtime.tf_gpu_to_nvml(self.cuda_map()).values()))
        return self.planned_visible()

    def limit_bytes_by_gpu(self) -> dict[int, int]:
        """The configured cap of each visible GPU, in bytes (for the monitor's limit line)."""
        visible = self.visible_gpus() or []
        totals = self.totals_mib()
        caps: dict[int, int] = {}
        for position, index in enumerate(visible):
            try:
                sizes = logical_sizes_mib(self.requested, position, totals.get(index))
            except PlanError:
                continue
            if sizes:
                caps[index] = sum(sizes) * MIB
        return caps

    # -- configuration ----------------------------------------------------------------------
    def configure(self, command: Any) -> str:
        """Carry out a configuration command; returns what happened, raises SessionError."""
        with self._lock:
            try:
                plan = self.requested.with_command(command)
            except PlanError as err:
                raise SessionError(str(err)) from None
            self._validate(plan)
            stage = tf_runtime.stage()
            what = _describe_command(command)
            if stage is Stage.STARTED:
                if plan == self.requested:  # a notebook re-run: the same request, quietly
                    return f"{what}: already requested; nothing changed (TensorFlow has started)"
                if isinstance(command, grammar.Precision):  # Keras policy is never frozen
                    self._apply(plan, stage)
                    self.requested = plan
                    return f"{what}: {self._when(plan, command, stage)}"
                self._check_in_force(plan, command, what)
                self.requested = plan
                return f"{what}: already in force (TensorFlow has started); nothing changed"
            self._apply(plan, stage)
            self.requested = plan
            return f"{what}: {self._when(plan, command, stage)}"

    def _when(self, plan: Plan, command: Any, stage: Stage) -> str:
        if isinstance(command, grammar.Precision):
            if tf_runtime.keras_policy() is not None:
                return "Keras global policy set now"
            return "set when Keras is imported"
        if stage is Stage.NOT_IMPORTED:
            return "takes effect when TensorFlow is imported (before its first op)"
        return "applied to TensorFlow now (imported, not started)"

    def _validate(self, plan: Plan) -> None:
        """Check a plan against the machine; raises SessionError without changing anything."""
        count = self.nvml.device_count() if self.nvml.available() else None
        if isinstance(plan.visible, tuple) and count is not None:
            missing = [i for i in plan.visible if i >= count]
            if missing:
                valid = f"0-{count - 1}" if count else "none"
                raise SessionError(
                    f"no GPU {','.join(map(str, missing))}: this machine has {count} GPU"
                    f"{'s' if count != 1 else ''} (numbers {valid}, as nvidia-smi shows); "
                    f"{grammar.usage('use')}"
                )
        visible = self.planned_visible(plan)
        if visible is None:
            visible = list(range(len(plan.limits))) if plan.limits else []
        totals = self.totals_mib()
        if plan.limits is not None and len(plan.limits) > 1 and len(plan.limits) != len(visible):
            raise SessionError(
                f"`%gpu limit` gives {len(plan.limits)} sizes but {len(visible)} GPU"
                f"{'s are' if len(visible) != 1 else ' is'} visible; give one size for all GPUs "
                "or one per visible GPU"
            )
        for position, index in enumerate(visible):
            try:
                sizes = logical_sizes_mib(plan, position, totals.get(index))
                cap = limit_mib(plan, position, totals.get(index))
            except PlanError as err:
                raise SessionError(str(err)) from None
            total = totals.get(index)
            asked = cap if cap is not None else sum(sizes or [])
            if total is not None and asked > total:
                raise SessionError(
                    f"GPU {index} has {total} MiB; {asked} MiB does not fit "
                    f"(use a smaller size or a percentage, e.g. `%gpu limit 90%`)"
                )

    def _apply(self, plan: Plan, stage: Stage) -> None:
        """Environment first (read at CUDA start-up), then tf.config once TensorFlow is here."""
        saved = {name: self.env.get(name) for name in MANAGED_ENV}
        try:
            self._set_environment(plan, stage)
            if Stage.IMPORTED <= stage < Stage.STARTED:
                self._apply_tf(plan, stage)
            if plan.precision is not None and tf_runtime.keras_policy() is not None:
                tf_runtime.set_keras_policy(plan.precision)
        except (tf_runtime.ApplyError, PlanError, ValueError, RuntimeError) as err:
            for name, value in saved.items():
                _set_env(self.env, name, value)
            if isinstance(err, (tf_runtime.ApplyError, PlanError)):
                raise SessionError(str(err)) from None
            raise SessionError(f"TensorFlow refused it: {err}") from None
        if stage is Stage.NOT_IMPORTED:
            install_import_hooks()

    def _set_environment(self, plan: Plan, stage: Stage) -> None:
        env = self.env
        if stage is Stage.STARTED:
            return  # TensorFlow read these at start-up; changing them now would only mislead
        if stage < Stage.ENUMERATED:
            if self.inherited["CUDA_DEVICE_ORDER"] is None:
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as nvidia-smi does
            if plan.visible is None:
                _set_env(env, "CUDA_VISIBLE_DEVICES", self.inherited["CUDA_VISIBLE_DEVICES"])
            elif plan.visible == "all":
                env.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                gpus = [] if plan.visible == "none" else sorted(plan.visible)
                env["CUDA_VISIBLE_DEVICES"] = numbering.visible_env_value(gpus)
        growth = None if plan.growth is None else ("true" if plan.growth else "false")
        _set_env(env, "TF_FORCE_GPU_ALLOW_GROWTH", growth or self.inherited["TF_FORCE_GPU_ALLOW_GROWTH"])
        allocator = {"async": tf_runtime.ASYNC_ALLOCATOR, "default": None}
        _set_env(
            env,
            "TF_GPU_ALLOCATOR",
            allocator[plan.allocator] if plan.allocator else self.inherited["TF_GPU_ALLOCATOR"],
        )

    def _apply_tf(self, plan: Plan, stage: Stage) -> None:
        """tf.config work.  Before enumeration only what the environment cannot carry."""
        needs_tf = plan.needs_logical_devices or self.owned_logical
        if stage >= Stage.ENUMERATED or needs_tf:
            tf_runtime.apply_before_start(plan, self.cuda_map(), self.totals_mib(), self.owned_logical)

    def _check_in_force(self, plan: Plan, command: Any, what: str) -> None:
        """After start-up: an identical setting passes, a different one gets the remedy."""
        force = tf_runtime.in_force(self.cuda_map())
        differs, now = self._difference(plan, command, force)
        if differs:
            raise SessionError(
                f"TensorFlow has already started with {now}, and cannot change it in a running "
                f"kernel. Put `%gpu {what}` at the top of the notebook, before `import tensorflow`, "
                "and restart the kernel"
            )

    def _difference(self, plan: Plan, command: Any, force: tf_runtime.InForce) -> tuple[bool, str]:
        visible = force.visible_nvml
        shown = "GPU " + ",".join(map(str, visible)) if visible else "no GPU"
        if isinstance(command, grammar.Use):
            wanted = self.planned_visible(plan)
            return (wanted is not None and tuple(wanted) != visible), f"{shown} visible"
        if not visible:
            return True, "no GPU visible (so GPU memory settings cannot take effect)"
        if isinstance(command, grammar.Grow):
            return bool(force.growth) != command.on, f"memory growth {'on' if force.growth else 'off'}"
        if isinstance(command, grammar.Allocator):
            return force.allocator != command.name, f"the {force.allocator} allocator"
        totals = self.totals_mib()
        for position, index in enumerate(visible):
            sizes = logical_sizes_mib(plan, position, totals.get(index))
            current = force.logical_mib.get(index)
            if (tuple(sizes) if sizes else None) != current:
                return True, f"GPU {index} at {_logical_text(current)}"
        return False, ""

    # -- reset, free ------------------------------------------------------------------------
    def reset(self) -> str:
        with self._lock:
            stage = tf_runtime.stage()
            if stage is Stage.STARTED:
                return "nothing to forget: TensorFlow has started, so every accepted setting is in force"
            dropped = self.requested.describe()
            self._apply(self.defaults, stage)
            self.requested = self.defaults
            from . import claims  # GPUs claimed by `%gpu use auto` go back to the pool

            claims.release_all()
            if not dropped:
                return "nothing was requested"
            return "forgot: " + "; ".join(dropped)

    def free(self) -> str:
        """Keras clear_session and garbage collection, with before/after readings."""
        with self._lock:
            started = tf_runtime.stage() is Stage.STARTED
            before_tf, before_nvml = tf_runtime.allocator_stats(), self._my_device_memory()
            keras_cleared = tf_runtime.clear_session()
            policy = self.requested.precision
            if policy is not None and tf_runtime.keras_policy() not in (None, policy):
                tf_runtime.set_keras_policy(policy)  # clear_session resets the global policy
            after_tf, after_nvml = tf_runtime.allocator_stats(), self._my_device_memory()
            allocator = tf_runtime.in_force(self.cuda_map()).allocator if started else None
            return _free_report(
                keras_cleared, started, allocator, policy, before_tf, after_tf, before_nvml, after_nvml
            )

    def _my_device_memory(self) -> dict[int, Optional[int]]:
        """Bytes this process holds on each GPU according to the driver (NVML)."""
        if not self.nvml.available():
            return {}
        mine: dict[int, Optional[int]] = {}
        pid = os.getpid()
        for index in range(self.nvml.device_count()):
            try:
                for proc in self.nvml.processes(index):
                    if proc.pid == pid:
                        mine[index] = proc.used_memory_bytes
            except Exception:  # a lost GPU: no reading, not zero
                continue
        return mine

    # -- import hooks (registered once per process, see install_import_hooks) ---------------
    def _on_tensorflow_import(self, module: Any) -> None:
        with self._lock:
            stage = tf_runtime.stage()
            if stage is Stage.STARTED:
                return
            try:
                self._apply_tf(self.requested, stage)
            except Exception as err:  # never break the user's import
                self._hook_failed(f"could not apply {'; '.join(self.requested.describe())}: {err}")

    def _on_keras_import(self, module: Any) -> None:
        policy = self.requested.precision
        if policy is None:
            return
        try:
            module.mixed_precision.set_global_policy(policy)
        except Exception as err:
            self._hook_failed(f"could not set precision {policy}: {err}")

    def _hook_failed(self, message: str) -> None:
        self.hook_errors.append(message)
        print(f"tfgpu_magic: {message}. Run `%gpu` for details.", file=sys.stderr)


# -- helpers --------------------------------------------------------------------------------------
def _set_env(env: Any, name: str, value: Optional[str]) -> None:
    if value is None:
        env.pop(name, None)
    else:
        env[name] = value


def _describe_command(command: Any) -> str:
    plan = Plan().with_command(command) if not isinstance(command, grammar.Use) else Plan(visible=command.gpus)
    described = plan.describe()
    if described:
        return described[0]
    if isinstance(command, grammar.Limit):
        return "limit off"
    if isinstance(command, grammar.Split):
        return "split off"
    return str(command)


def _logical_text(sizes: Optional[tuple[int, ...]]) -> str:
    if not sizes:
        return "no limit"
    if len(sizes) == 1:
        return f"a limit of {sizes[0]} MiB"
    return f"{len(sizes)} logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}"


def _free_report(
    keras_cleared: bool,
    started: bool,
    allocator: Optional[str],
    policy: Optional[str],
    before_tf: dict[str, tf_runtime.AllocatorStats],
    after_tf: dict[str, tf_runtime.AllocatorStats],
    before_nvml: dict[int, Optional[int]],
    after_nvml: dict[int, Optional[int]],
) -> str:
    lines = [
        "Ran Keras clear_session and garbage collection."
        if keras_cleared
        else "Ran garbage collection (Keras is not imported: no Keras session to clear)."
    ]
    if policy is not None and keras_cleared:
        lines[0] += f" Re-applied precision {policy} (clear_session resets it)."
    if not started:
        lines.append("TensorFlow has not started, so it holds no memory to free.")
    for device in sorted(set(before_tf) | set(after_tf)):
        b, a = before_tf.get(device), after_tf.get(device)
        b_cur, a_cur = (b.current_bytes if b else None), (a.current_bytes if a else None)
        lines.append(
            f"{device}  TensorFlow allocator in use: {format_bytes(b_cur)} -> {format_bytes(a_cur)} "
            f"({format_change(b_cur, a_cur)})"
        )
    if started and not before_tf:
        lines.append("TensorFlow's allocator keeps no statistics on these devices (nothing to compare).")
    returned = 0
    for index in sorted(set(before_nvml) | set(after_nvml)):
        b_n, a_n = before_nvml.get(index), after_nvml.get(index)
        lines.append(
            f"GPU {index}  this process per the driver (NVML): {format_bytes(b_n)} -> "
            f"{format_bytes(a_n)} ({format_change(b_n, a_n)})"
        )
        if b_n is not None and a_n is not None and a_n < b_n:
            returned += b_n - a_n
    if returned:
        lines.append(f"{format_bytes(returned)} went back to the driver (NVML reading).")
    elif started:
        lines.append(_kept_memory_note(allocator, driver_read=bool(before_nvml)))
    return "\n".join(lines)


def _kept_memory_note(allocator: Optional[str], driver_read: bool) -> str:
    reading = "The driver's reading shows nothing returned" if driver_read else "No driver reading (NVML unavailable)"
    if allocator == "async":
        return f"{reading}; the async allocator returns freed memory as CUDA trims its pool."
    return (
        f"{reading}: TensorFlow keeps the memory it reserved until the kernel restarts; what "
        "clear_session frees is reusable by this kernel only. For memory that goes back, put "
        "`%gpu allocator async` before TensorFlow starts."
    )


_SESSION: Optional[Session] = None
_SESSION_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def install_import_hooks() -> None:
    """Apply the process session's plan the moment TensorFlow (and Keras) finish importing.

    Hooks are process-wide and idempotent; they always act on :func:`get_session`.
    """
    global _HOOKS_INSTALLED
    with _SESSION_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
    import wrapt

    wrapt.register_post_import_hook(lambda m: get_session()._on_tensorflow_import(m), "tensorflow")
    wrapt.register_post_import_hook(lambda m: get_session()._on_keras_import(m), "keras")


def get_session() -> Session:
    """The process's session, created on first use (creating it reads nothing)."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = Session()
        return _SESSION


def set_device_source(lib: Any) -> None:
    """Read GPUs through ``lib`` (a pynvml-like object, e.g. ``tfgpu_magic.simulated.shared_server()``)."""
    get_session().nvml = Nvml(lib=lib)

