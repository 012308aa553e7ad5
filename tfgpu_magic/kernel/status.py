"""``%gpu status``: what was asked, what is in force, TensorFlow's stage, and who holds what.

The report is plain data (JSON-ready) built by :func:`build_report`; :func:`render_text` and
:func:`render_html` turn it into a terminal table or a notebook card.  For each GPU: memory
split into this kernel, my other processes, other users and the unattributed rest; the
processes with owner and memory; claims by ``%gpu use auto``; TensorFlow's allocator once it
has started.  Reading it never starts TensorFlow.  A missing reading is ``None`` (n/a), never 0.
"""

from __future__ import annotations

import html
import os
from typing import Any, Callable, Optional

from ..command.units import format_bytes, sizes_for
from ..frameworks.base import Stage
from ..gpus import claims, holdings, owners
from ..gpus.numbering import shown as _cut
from ..gpus.nvml import GpuInfo, GpuLost, NvmlUnavailable, ReadingFailed
from ..safe_text import safe_tree
from .session import Session, SessionError

__all__ = ["build_report", "render_html", "render_text"]

BAR_WIDTH = 40  # characters of the text bar
SEGMENTS = (  # report key, label, text bar character, HTML colour (JupyterLab variable, fallback)
    ("this_kernel_bytes", "this kernel", "#", "var(--jp-brand-color1, #1976d2)"),
    ("my_other_bytes", "my other processes", "=", "var(--jp-brand-color3, #90caf9)"),
    ("others_bytes", "other users", "x", "var(--jp-warn-color1, #f57c00)"),
    ("unattributed_bytes", "unattributed", ":", "var(--jp-layout-color4, #9e9e9e)"),
    ("free_bytes", "free", ".", "transparent"),
)


# -- the report ---------------------------------------------------------------------------------
def build_report(
    session: Session,
    *,
    process_table: Optional[owners.ProcessTable] = None,
    my_pid: Optional[int] = None,
    viewer: str = "this kernel",
) -> dict[str, Any]:
    """Everything ``%gpu status`` shows, as JSON-ready data.

    ``process_table`` gives owners and commands (default: the device source's own, else the
    process-wide psutil table, which remembers owners between refreshes); ``my_pid`` is the process whose memory counts as "this kernel" (default: this
    one); ``viewer`` names it in the rendering (the CLI says "this process").
    """
    stage = session.tf.stage()
    session.meet_enumeration()  # TensorFlow listed its GPUs after the request was accepted: say what CUDA found
    notes = [*session.notes, *session.hook_errors]
    report: dict[str, Any] = {
        "tensorflow": {"stage": stage.name.lower(), "description": stage.describe()},
        "requested": session.requested.describe(),
        "resolved": None,
        "in_force": [],
        "allocation": None,
        "gpus": [],
        "nvml_error": None,
        "notes": notes,
        "me": {"pid": os.getpid() if my_pid is None else my_pid, "user": None, "label": viewer},
        "visible_gpus": None,
    }
    if stage is Stage.STARTED:
        report["tensorflow"]["allocator"] = {
            device: {"current_bytes": s.current_bytes, "peak_bytes": s.peak_bytes}
            for device, s in session.tf.allocator_stats().items()
        }
    report["in_force"] = _in_force(session, stage)
    if stage >= Stage.ENUMERATED:
        report["tensorflow"]["found_no_gpu"] = _no_gpu(session, notes)
        # TensorFlow's own list is what CUDA showed this kernel, known with or without NVML: the
        # card must not say "GPUs seen: unknown" beside "GPUs visible to TensorFlow: none".
        report["visible_gpus"] = session.visible_gpus()
    _add_resolution(report, session)
    report["frameworks"] = _frameworks(session, report)
    try:
        _add_gpus(report, session, process_table)
    except NvmlUnavailable as err:
        report["nvml_error"] = str(err)
    return report


def _frameworks(session: Session, report: dict[str, Any]) -> dict[str, Any]:
    """Each framework's stage and what it was given (read from the session's record), with
    PyTorch's allocator per device once it started CUDA.  TensorFlow's other keys stay where
    they were (``tensorflow``, ``in_force``): scripts read them there."""
    frameworks: dict[str, Any] = {"tensorflow": {
        **report["tensorflow"], "applied": _applied(session, "tensorflow"), "installed": session.tf.installed(),
    }}
    torch = session.torch
    stage = torch.stage()
    entry: dict[str, Any] = {
        "stage": stage.name.lower(), "imported": stage is not Stage.NOT_IMPORTED, "installed": torch.installed(),
    }
    if stage is not Stage.NOT_IMPORTED:
        entry.update({
            "cuda_build": torch.cuda_build(),
            "allocator": torch.backend(),
            "cuda_started": stage is Stage.STARTED,
            "applied": _applied(session, "pytorch"),
            "caps": {f"cuda:{k}": {"bytes": b, "fraction_set": torch.caps_set.get(k)} for k, b in torch.caps_bytes.items()},
            "cap_errors": list(torch.cap_errors),
            "memory": {
                device: {"allocated_bytes": m.allocated_bytes, "peak_allocated_bytes": m.peak_allocated_bytes,
                         "reserved_bytes": m.reserved_bytes}
                for device, m in torch.memory().items()
            },
        })
        entry["memory_error"] = torch.memory_error  # after the reading, which records a failure
    frameworks["pytorch"] = entry
    frameworks["jax"] = _jax(session)
    return frameworks


def _jax(session: Session) -> dict[str, Any]:
    """JAX's stage and, once its backends started, what it started with: the variables as they
    were then and the options its CUDA plugin made of them (JAX's own reading)."""
    jax = session.jax
    stage = jax.stage()
    entry: dict[str, Any] = {
        "stage": stage.name.lower(), "imported": stage is not Stage.NOT_IMPORTED, "installed": jax.installed(),
    }
    if stage is Stage.NOT_IMPORTED:
        return entry
    start = jax.start()
    seen = jax.started_with
    memory = jax.device_memory()  # before memory_error: a failed reading is recorded by it
    entry.update({
        "started": stage is Stage.STARTED,
        "applied": _applied(session, "jax"),
        "platforms": jax.platforms(),
        "started_with": None if start is None else {
            "preallocate": start.preallocate,
            "memory_fraction": start.memory_fraction,
            "allocator": start.allocator,
            "cuda_visible_devices": start.cuda_visible_devices,
            "gpu": start.gpu,
        },
        "environment_at_start": None if seen is None else dict(seen.env),
        # True: JAX had started before tfgpu_magic loaded; the variables are the ones found then.
        "recorded_late": None if seen is None else seen.late,
        "plugin_error": jax.plugin_error,
        "no_fraction": session.jax_limit_problem(),
        "memory_error": jax.memory_error,
        "memory": {
            device: {"in_use_bytes": m.in_use_bytes, "peak_bytes": m.peak_bytes,
                     "reserved_bytes": m.reserved_bytes, "limit_bytes": m.limit_bytes}
            for device, m in memory.items()
        },
    })
    return entry


def _applied(session: Session, framework: str) -> Optional[list[str]]:
    resolution = session.applied.get(framework)
    return None if resolution is None else resolution.describe()


def _no_gpu(session: Session, notes: list[str]) -> Optional[dict[str, Any]]:
    """Why TensorFlow found no GPU while the driver lists some for this kernel (None: it found them)."""
    try:
        diagnosis = session.no_gpu_diagnosis()
    except Exception as err:  # one reading's fault is a note, never a broken %gpu
        notes.append(f"could not tell why TensorFlow found no GPU ({type(err).__name__}: {err})")
        return None
    return None if diagnosis is None else diagnosis.as_json()


def _add_resolution(report: dict[str, Any], session: Session) -> None:
    """The request as resolved on this machine (sizes per GPU), and the environment's allocation."""
    allocation = session.machine.allocation()
    if allocation.restricted:
        report["allocation"] = {
            "cuda_visible_devices": allocation.raw,
            "gpus": None if allocation.gpus is None else list(allocation.gpus),
            "note": allocation.note,
            "invalid_entry": None if allocation.invalid is None else {
                "position": allocation.invalid.position,  # 1 for the first entry
                "entry": allocation.invalid.entry,  # control characters escaped, cut to 40 characters
                "why": allocation.invalid.why,
            },
        }
        report["allocation"]["mig_instances"] = [  # the MIG instances it names, each CUDA device of its own
            {
                "uuid": m.uuid,
                "gpu": m.gpu,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "memory_total_bytes": m.total_bytes,
            }
            for m in allocation.mig
        ]
        if allocation.note:
            report["notes"].append(allocation.note)
    try:
        resolution = session.resolved()  # as resolved when accepted, not re-derived from the driver now
    except SessionError as err:
        report["notes"].append(f"the request cannot hold on this machine: {err}")
        return
    report["resolved"] = {
        "summary": resolution.describe(),  # `requested`, with percentages and splits worked out per GPU
        "visible": None if resolution.visible is None else list(resolution.visible),
        "gpus": [
            {"index": g.index, "limit_mib": g.cap_mib, "logical_mib": None if g.logical_mib is None else list(g.logical_mib)}
            for g in resolution.gpus
        ],
    }


def _add_gpus(report: dict[str, Any], session: Session, table: Optional[owners.ProcessTable]) -> None:
    me = report["me"]
    table = table or owners.process_table_for(session.nvml, me["pid"])
    me["user"] = table.current_user()
    gpus = session.nvml.gpus()  # raises NvmlUnavailable before anything else is read
    if session.nvml.count_note:
        report["notes"].append(session.nvml.count_note)
    visible = session.visible_gpus()
    exposed = session.exposed_gpus()  # what CUDA shows: a GPU TensorFlow did not find was not hidden
    report["visible_gpus"] = visible
    tf_gpus = session.gpu_by_tf_name()
    tf_names = _tf_names(tf_gpus)
    stats = session.tf.allocator_stats() if session.tf.stage() is Stage.STARTED else {}
    tf_stats = holdings.tf_by_gpu(stats, tf_gpus)
    holders = _holders(session, gpus, report["notes"])
    for gpu in gpus:
        in_use = tf_stats[gpu.index][0] if gpu.index in tf_stats else None
        usage = holdings.attribute(session.nvml, gpu, table, me["pid"], me["user"], in_use)
        entry = _gpu_entry(gpu, visible, tf_names)
        entry["shown_to_cuda"] = None if exposed is None else gpu.index in exposed
        entry.update(_detail(gpu, usage, holders.get(gpu.index), tf_stats.get(gpu.index)))
        entry["mig_instances"] = _mig_rows(session, gpu, table, me) if gpu.mig_enabled else None
        report["gpus"].append(entry)


def _mig_rows(session: Session, gpu: GpuInfo, table: owners.ProcessTable, me: dict[str, Any]) -> list[dict[str, Any]]:
    """A GPU in MIG mode: one row per instance (its memory, the processes NVML lists on it), as nvitop shows them."""
    allocated = {m.uuid for m in session.machine.allocation().mig}
    try:
        listings = holdings.mig_listings(session.nvml, gpu.index)
    except (GpuLost, ReadingFailed) as err:
        return [{"mig_index": None, "notes": [f"the MIG instances could not be listed ({err})"]}]
    rows = []
    for listing in listings:
        device, memory = listing.device, listing.device.memory
        key = holdings.mig_listing_key(device)  # the table answers an unchanged listing from memory
        processes = (
            None if listing.processes is None
            else [_process(p) for p in holdings.entries(listing.processes, table, me["pid"], me["user"], key)]
        )
        rows.append({
            "mig_index": device.mig_index,
            "uuid": device.uuid,
            "name": device.name,
            "gpu_instance_id": device.gpu_instance_id,
            "compute_instance_id": device.compute_instance_id,
            "memory_total_bytes": memory.total_bytes if memory else None,
            "memory_used_bytes": memory.used_bytes if memory else None,
            "memory_free_bytes": memory.free_bytes if memory else None,
            "allocated": device.uuid in allocated,  # this kernel's allocation names it
            "processes": processes,
            "notes": list(listing.notes),
        })
    return rows


def _in_force(session: Session, stage: Stage) -> list[str]:
    """What TensorFlow runs with (started), or the environment it will read at its start."""
    lines: list[str] = []
    allocation = session.machine.allocation()
    if allocation.restricted:
        lines.append(f"allocated by the environment: {allocation.describe()}")
    if stage is Stage.STARTED:
        force = session.in_force()
        assert force is not None
        shown = ",".join(map(str, force.visible_nvml)) or "none"
        lines.append(f"GPUs visible to TensorFlow: {shown}")
        if force.visible_nvml:
            lines.append(f"memory growth: {'on' if force.growth else 'off'}")
            for index, sizes in force.logical_mib.items():
                if sizes:
                    lines.append(f"GPU {index}: logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}")
            lines.append(f"allocator: {force.allocator}")
    elif stage is not Stage.NOT_IMPORTED:
        # The variables as TensorFlow will read them: CUDA's as CUDA read them once it listed devices.
        env = dict(session.tf.start_env(session.env))
        cuda = session.machine.cuda_env() if stage is Stage.ENUMERATED else session.env
        env["CUDA_VISIBLE_DEVICES"] = cuda.get("CUDA_VISIBLE_DEVICES")
        lines += _environment_line("environment for TensorFlow's start", env)
    else:
        # The frameworks imported (else those installed) read these as they start; CUDA's are
        # read once per process, when the first of them starts it (the record, once made).
        frameworks = session.imported_frameworks() or [f for f in session.frameworks() if f.installed()]
        env = {"CUDA_VISIBLE_DEVICES": session.machine.cuda_env().get("CUDA_VISIBLE_DEVICES")}
        for framework in frameworks:  # as each read them once it did (the record), else as they are now
            env.update(framework.read_environment(session.env))
        names = [f.name for f in frameworks]
        lines += _environment_line(f"environment read at start by {_joined(names) if names else 'CUDA'}", env)
    note = session.machine.numbering_note() if session.nvml.available() else None
    if note:
        lines.append(f"numbering: {note}")
    policy = session.tf.keras_policy()
    if policy is not None:
        lines.append(f"Keras precision: {policy}")
    return lines


def _environment_line(label: str, env: dict[str, Optional[str]]) -> list[str]:
    """``label: NAME=value, ...`` for the variables set; an inherited value may be megabytes of
    anything: shown escaped and cut."""
    shown = [f"{k}={_cut(v, 80)}" for k, v in env.items() if v is not None]
    return [f"{label}: " + ", ".join(shown)] if shown else []


def _tf_names(tf_gpus: dict[str, int]) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for tf_name, index in tf_gpus.items():
        names.setdefault(index, []).append(tf_name)
    return names


def _holders(session: Session, gpus: list[GpuInfo], notes: list[str]) -> dict[int, Optional[claims.Holder]]:
    keys = {g.index: g.uuid for g in gpus if not g.lost and g.uuid}
    try:
        found = claims.holders(list(keys.values()), notes=notes)  # unusable claim files: a note each
    except (claims.ClaimError, OSError) as err:
        notes.append(f"claims could not be read: {err}")
        return {}
    return {index: found.get(key) for index, key in keys.items()}


def _gpu_entry(gpu: GpuInfo, visible: Optional[list[int]], tf_names: dict[int, list[str]]) -> dict[str, Any]:
    memory = gpu.memory
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "lost": gpu.lost,
        "memory_total_bytes": memory.total_bytes if memory else None,
        "memory_used_bytes": memory.used_bytes if memory else None,
        "utilization_percent": gpu.utilization_percent,
        "visible": None if visible is None else gpu.index in visible,
        "tensorflow_names": tf_names.get(gpu.index, []),
    }


def _detail(
    gpu: GpuInfo,
    usage: holdings.GpuUsage,
    holder: Optional[claims.Holder],
    tf: Optional[tuple[int, int]],
) -> dict[str, Any]:
    memory = gpu.memory
    return {
        "pci_bus_id": gpu.pci_bus_id,
        "memory_free_bytes": memory.free_bytes if memory else None,
        "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
        "mig_enabled": gpu.mig_enabled,
        "usage": {
            "this_kernel_bytes": usage.this_kernel_bytes,
            "this_kernel_source": usage.this_kernel_source,
            "my_other_bytes": usage.my_other_bytes,
            "others_bytes": usage.others_bytes,
            "unattributed_bytes": usage.unattributed_bytes,
            "free_bytes": memory.free_bytes if memory else None,
        },
        "processes": None if usage.processes is None else [_process(p) for p in usage.processes],
        "claim": None if holder is None else {
            "pid": holder.pid, "user": holder.user, "since": holder.since, "this_kernel": holder.this_process,
        },
        "tensorflow_in_use_bytes": tf[0] if tf else None,
        "tensorflow_peak_bytes": tf[1] if tf else None,
        "notes": _notes(gpu, usage),
    }


def _notes(gpu: GpuInfo, usage: holdings.GpuUsage) -> list[str]:
    """Why readings are missing, then who-holds-what notes; a reading's note said twice is said once."""
    readings = [n for n in gpu.notes if not any(n in other for other in usage.notes)]
    return [*readings, *usage.notes]


def _process(p: holdings.ProcessEntry) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "user": p.user,
        "command": p.command,
        "used_memory_bytes": p.used_memory_bytes,
        "kind": p.kind,
        "alive": p.alive,
        "whose": p.whose,
        "note": p.note,
    }


# -- text ---------------------------------------------------------------------------------------
def render_text(report: dict[str, Any], *, machine: bool = False) -> str:
    """The report as a terminal table; other users' text is shown, never obeyed (see :mod:`.safe_text`).

    ``machine=True`` is the terminal's report (``tfgpu``): about the machine and its user, so
    it leaves out the reading process's own settings, TensorFlow and memory (it holds none).
    """
    report = safe_tree(report)  # every string: commands, users, claims, GPU names, notes
    lines = _machine_header(report) if machine else _kernel_header(report)
    if report["nvml_error"]:
        lines.append(f"GPUs:       {report['nvml_error']}")
    label = None if machine else report.get("me", {}).get("label", "this kernel")
    if any(g.get("usage") for g in report["gpus"]):
        shown = [(ch, _segment_name(key, name, label))
                 for key, name, ch, _colour in SEGMENTS if label is not None or key != "this_kernel_bytes"]
        lines.append("Bars:       " + "  ".join(f"{ch} {name}" for ch, name in shown))
    for gpu in report["gpus"]:
        lines.append(_gpu_line(gpu, machine))
        lines.extend("  " + line for line in _gpu_details(gpu, label))
    lines.extend(f"Note: {note}" for note in report["notes"])
    return "\n".join(lines)


def _kernel_header(report: dict[str, Any]) -> list[str]:
    """The kernel's rows as text: a label padded to one column, continuations indented."""
    return [f"{label + ':':<11} {value}" if label else f"  {value}" for label, value in header_rows(report)]


FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "pytorch": "PyTorch", "jax": "JAX"}


def header_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What this kernel asked for, what is in force, each imported framework's stage and allocator,
    who it is: ``(label, value)`` rows, a continuation's label empty.  The text and the HTML card
    are both made from these rows, so they say the same.  A framework that is not imported has no
    row (a PyTorch kernel reads nothing of TensorFlow); before any import one row names the
    installed ones, which the settings will reach."""
    frameworks = report.get("frameworks", {})
    imported = [key for key, entry in frameworks.items() if entry.get("stage", "not_imported") != "not_imported"]
    rows = [
        ("Requested", "; ".join(_requested(report)) or "nothing (each framework's defaults)"),
        ("In force", "; ".join(report["in_force"]) or "each framework's defaults"),
    ]
    if "tensorflow" in imported or not frameworks:  # a report without `frameworks` (an old script's)
        rows += _tensorflow_rows(report["tensorflow"])
    rows += _pytorch_rows(frameworks.get("pytorch"))
    rows += _jax_rows(frameworks.get("jax"))
    if frameworks and not imported:
        names = [FRAMEWORK_NAMES[key] for key, entry in frameworks.items() if entry.get("installed")]
        reach = f"settings reach {_joined(names)} when {'it starts' if len(names) == 1 else 'they start'}" if names else (
            "none is installed in this kernel's environment"
        )
        rows.append(("Frameworks", f"none imported yet; {reach}"))
    if "me" in report:
        label, _, rest = _me_line(report).partition(":")
        rows.append((label, rest.strip()))
    return rows


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _tensorflow_rows(tf: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("TensorFlow", tf["description"])]
    no_gpu = tf.get("found_no_gpu")
    if no_gpu:
        rows += [("", f"found no GPU: {no_gpu['why']}"), ("", f"fix: {no_gpu['fix']}")]
    for device, stats in tf.get("allocator", {}).items():
        rows.append((
            "", f"{device} TensorFlow allocator: {format_bytes(stats['current_bytes'])} in use, "
            f"peak {format_bytes(stats['peak_bytes'])}",
        ))
    return rows


def _pytorch_rows(torch: Optional[dict[str, Any]]) -> list[tuple[str, str]]:
    return _rows(_pytorch_lines(torch))


def _jax_rows(jax: Optional[dict[str, Any]]) -> list[tuple[str, str]]:
    return _rows(_jax_lines(jax))


def _rows(lines: list[str]) -> list[tuple[str, str]]:
    """``Label:    value`` and ``  continuation`` lines as rows."""
    rows = []
    for line in lines:
        if line.startswith("  "):
            rows.append(("", line[2:]))
        else:
            label, _, value = line.partition(":")
            rows.append((label, value.strip()))
    return rows


def _pytorch_lines(torch: Optional[dict[str, Any]]) -> list[str]:
    """PyTorch's stage, allocator and caps: shown once it is imported."""
    if not torch or not torch.get("imported"):
        return []
    if not torch["cuda_build"]:
        return ["PyTorch:    imported; a CPU build (torch.version.cuda is None): it uses no GPU"]
    started = "CUDA started: GPU settings other than `limit` are frozen" if torch["cuda_started"] else "CUDA not started"
    lines = [f"PyTorch:    imported, {started}; the {torch['allocator']} allocator"]
    for device, cap in torch["caps"].items():
        fraction = cap["fraction_set"]
        when = f"set as fraction {fraction:.4f}" if fraction is not None else "set when CUDA starts"
        lines.append(f"  {device} cap: {format_bytes(cap['bytes'])} ({when})")
    lines.extend(f"  cap not set: {error}" for error in torch["cap_errors"])
    if torch.get("memory_error"):
        lines.append(f"  note: no allocator reading for {torch['memory_error']}")
    for device, memory in torch["memory"].items():
        lines.append(
            f"  {device} PyTorch allocator: {format_bytes(memory['allocated_bytes'])} allocated, "
            f"{format_bytes(memory['reserved_bytes'])} reserved, peak {format_bytes(memory['peak_allocated_bytes'])}"
        )
    return lines


def _jax_lines(jax: Optional[dict[str, Any]]) -> list[str]:
    """JAX's stage and what it started with: shown once it is imported."""
    if not jax or not jax.get("imported"):
        return []
    if not jax["started"]:
        lines = ["JAX:        imported, backends not started: every GPU setting still applies"]
        if jax.get("no_fraction"):
            lines.append(f"  no memory fraction for JAX: {jax['no_fraction']}")
        return lines
    start = jax["started_with"]
    platforms = ", ".join(jax["platforms"]) or "unknown"
    refused = [f"  its CUDA plugin refuses the variables: {jax['plugin_error']}"] if jax["plugin_error"] else []
    if start is None or not start["gpu"]:
        return [f"JAX:        started on {platforms}: no GPU backend, so GPU settings do not reach it", *refused]
    fraction = "0.75 (default)" if start["memory_fraction"] is None else f"{start['memory_fraction']:g}"
    late = " (as found when tfgpu_magic loaded: JAX had started before)" if jax["recorded_late"] else ""
    lines = [
        f"JAX:        started on {platforms} with preallocation {'on' if start['preallocate'] else 'off'}, "
        f"memory fraction {fraction}, the {start['allocator']} allocator{late}",
        *refused,
    ]
    if jax["memory_error"]:
        lines.append(f"  note: no memory reading for {jax['memory_error']}")
    for device, memory in jax["memory"].items():
        lines.append(
            f"  {device} JAX allocator: {format_bytes(memory['in_use_bytes'])} in use, "
            f"peak {format_bytes(memory['peak_bytes'])}, pool {format_bytes(memory['reserved_bytes'])}"
        )
    return lines


def _machine_header(report: dict[str, Any]) -> list[str]:
    """The terminal's first line: how many GPUs, and whose processes count as "my processes"."""
    count = len(report["gpus"])
    gpus = "GPUs unknown" if report["nvml_error"] else f"{count} GPU{'' if count == 1 else 's'}"
    return [f"Machine:    {gpus}; user {report['me']['user'] or 'n/a'}"]


def _requested(report: dict[str, Any]) -> list[str]:
    """What was asked, with sizes resolved per GPU where the request left them relative."""
    resolved = report.get("resolved")
    return resolved["summary"] if resolved else report["requested"]


def _me_line(report: dict[str, Any]) -> str:
    me = report["me"]
    label = me["label"][0].upper() + me["label"][1:]
    user = me["user"] or "n/a"
    visible = report.get("visible_gpus")
    if visible is None:
        sees = "GPUs seen: unknown" if report["nvml_error"] else "sees every GPU"
    else:
        sees = f"sees GPU {','.join(map(str, visible))}" if visible else "sees no GPU"
    return f"{label + ':':<11} pid {me['pid']}, user {user}; {sees}"


def _gpu_line(gpu: dict[str, Any], machine: bool = False) -> str:
    if gpu["lost"]:
        return f"GPU {gpu['index']}  lost: the GPU stopped answering"
    util = gpu["utilization_percent"]
    size = sizes_for(gpu["memory_total_bytes"])
    line = (
        f"GPU {gpu['index']}  {gpu['name'] or 'n/a'}  "
        f"{size(gpu['memory_used_bytes'])} / {size(gpu['memory_total_bytes'])} used (driver)  "
        f"util {'n/a' if util is None else f'{util}%'}"
    )
    if machine:  # whether the reading process sees a GPU says nothing about the machine
        return line
    seen = {True: "visible", False: "hidden", None: "visibility unknown"}[gpu["visible"]]
    if gpu["visible"] is False and gpu.get("shown_to_cuda"):
        seen = "not found by TensorFlow"  # shown to CUDA, yet TensorFlow listed no GPU there
    if gpu["tensorflow_names"]:
        seen += f" (TensorFlow {', '.join(gpu['tensorflow_names'])})"
    return f"{line}  {seen}"


def _gpu_details(gpu: dict[str, Any], label: Optional[str]) -> list[str]:
    if "usage" not in gpu or gpu["lost"]:
        return []
    usage, size = gpu["usage"], sizes_for(gpu["memory_total_bytes"])
    lines = [f"[{_text_bar(usage, gpu['memory_total_bytes'])}] " + _legend(usage, label, size)]
    if gpu.get("tensorflow_in_use_bytes") is not None:
        lines.append(
            f"TensorFlow allocator: {size(gpu['tensorflow_in_use_bytes'])} in use, "
            f"peak {size(gpu['tensorflow_peak_bytes'])}"
        )
    if gpu["processes"] is None:
        lines.append("processes: n/a")
    for proc in gpu["processes"] or []:
        lines.append(_process_line(proc, label, size))
    if gpu.get("claim"):
        lines.append("claimed by " + _claim_text(gpu["claim"], label))
    lines.extend(f"note: {note}" for note in gpu.get("notes", []))
    for row in gpu.get("mig_instances") or []:
        lines.append(_mig_line(gpu["index"], row, label))
        lines.extend("  " + _process_line(proc, label, sizes_for(row.get("memory_total_bytes"))) for proc in row.get("processes") or [])
        lines.extend(f"  note: {note}" for note in row.get("notes", []))
    return lines


def _mig_line(index: int, row: dict[str, Any], label: Optional[str]) -> str:
    """A MIG instance under its GPU, nvitop's `3:0`: ids, UUID, its own memory, whose allocation."""
    if row.get("mig_index") is None:
        return f"MIG {index}:?  instances unknown"
    size = sizes_for(row["memory_total_bytes"])
    ids = f"{_na(row['gpu_instance_id'])}/{_na(row['compute_instance_id'])}"
    line = (
        f"MIG {index}:{row['mig_index']}  instance {ids}  {row['uuid'] or 'n/a'}  "
        f"{_used_of(size, row['memory_used_bytes'], row['memory_total_bytes'])} used"
    )
    if row["processes"] is None:
        line += "  processes: n/a"
    if row["allocated"]:
        line += f"  allocated to {label or 'this process'}"
    return line


def _used_of(size: Callable[[Optional[int]], str], used: Optional[int], total: Optional[int]) -> str:
    """'3.0 / 9.8 GiB': the unit said once where both figures share it."""
    used_text, total_text = size(used), size(total)
    unit = total_text.rpartition(" ")[2]
    if used_text.endswith(" " + unit) and total_text.endswith(" " + unit):
        used_text = used_text[: -len(unit) - 1]
    return f"{used_text} / {total_text}"


def _na(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _legend(usage: dict[str, Any], label: Optional[str], size: Callable[[Optional[int]], str]) -> str:
    parts = []
    for key, name, _ch, _colour in SEGMENTS:
        if usage[key] == 0 and key in ("my_other_bytes", "others_bytes", "unattributed_bytes"):
            continue  # a true zero; the JSON and the HTML legend still carry it
        if key == "this_kernel_bytes" and label is None:
            continue  # a terminal report: the reading process holds no GPU memory
        name = _segment_name(key, name, label)
        text = f"{name} {size(usage[key])}"
        if key == "this_kernel_bytes" and usage["this_kernel_source"] == "tensorflow":
            text += " (TensorFlow allocator)"
        parts.append(text)
    return " · ".join(parts)


def _segment_name(key: str, name: str, label: Optional[str]) -> str:
    """A segment's name: the viewer's own label; in a terminal (no label), the user's processes."""
    if key == "this_kernel_bytes":
        return label or name
    if key == "my_other_bytes" and label is None:
        return "my processes"
    return name


def _widths(usage: dict[str, Any], total: Optional[int], width: int) -> list[int]:
    """Characters per segment: proportional, at least one for any non-zero share."""
    if not total:
        return [0] * len(SEGMENTS)
    raw = [max(0, usage[key] or 0) * width / total for key, *_ in SEGMENTS]
    cells = [max(1, round(r)) if r > 0 else 0 for r in raw]
    largest = max(range(len(cells)), key=lambda i: cells[i])
    cells[largest] += width - sum(cells)  # rounding drift goes to the widest segment
    return cells


def _text_bar(usage: dict[str, Any], total: Optional[int]) -> str:
    if not total:
        return " " * BAR_WIDTH
    cells = _widths(usage, total, BAR_WIDTH)
    return "".join(ch * n for (_k, _l, ch, _c), n in zip(SEGMENTS, cells))


def _process_line(proc: dict[str, Any], label: Optional[str], size: Callable[[Optional[int]], str]) -> str:
    tag = {"this kernel": f"  ({label or 'this process'})", "unknown": "  (exited)",
           "hidden": "  (hidden by /proc: hidepid)"}.get(proc["whose"], "")
    if proc["note"] and proc["whose"] not in ("unknown", "hidden"):  # the GPU's note says it in full
        tag += f"  ({proc['note']})"
    command = _short(proc["command"] or "n/a", 48)
    return (
        f"pid {proc['pid']:<8} {proc['user'] or 'n/a':<10} {size(proc['used_memory_bytes']):>10}  "
        f"{command}{tag}"
    )


def _claim_text(claim: dict[str, Any], label: Optional[str]) -> str:
    if claim["this_kernel"]:
        return (label or "this process") + " (`%gpu use auto`)"
    who = f"pid {claim['pid']}" if claim["pid"] is not None else "another process"
    return f"{who} ({claim['user']})" if claim["user"] else who


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# -- HTML ---------------------------------------------------------------------------------------
_BOX = (
    "font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px); "
    "color: var(--jp-ui-font-color1, inherit); line-height: 1.4"
)
_MUTED = "color: var(--jp-ui-font-color2, #757575)"
_CARD = (
    "border: 1px solid var(--jp-border-color2, #e0e0e0); border-radius: 4px; padding: 6px 8px; margin: 6px 0; "
    "background: var(--jp-layout-color0, transparent)"
)
_CELL = (  # tables inherit no font in some hosts (quirks mode, old notebook CSS): say it explicitly
    "padding: 1px 10px 1px 0; text-align: left; border: none; background: transparent; "
    "color: inherit; font-family: inherit; font-size: inherit"
)


def render_html(report: dict[str, Any]) -> str:
    """A self-contained card (inline styles, JupyterLab theme variables with fallbacks).

    Every string is made safe (:mod:`.safe_text`: no bidi override reorders the card, no lone
    surrogate breaks the kernel's message) and then HTML-escaped.
    """
    report = safe_tree(report)
    parts = [f'<div class="tfgpu-status" style="{_BOX}">', _summary_html(report)]
    if report["nvml_error"]:
        parts.append(f'<div style="{_MUTED}">GPUs: {_e(report["nvml_error"])}</div>')
    parts.extend(_gpu_html(gpu, report.get("me", {}).get("label", "this kernel")) for gpu in report["gpus"])
    parts.extend(f'<div style="{_MUTED}">Note: {_e(note)}</div>' for note in report["notes"])
    parts.append("</div>")
    return "".join(parts)


def _summary_html(report: dict[str, Any]) -> str:
    body = "".join(
        f'<tr><th style="{_CELL}; font-weight: 600">{_e(k)}</th><td style="{_CELL}">{_e(v)}</td></tr>'
        for k, v in header_rows(report)
    )
    return f'<table style="border-collapse: collapse; margin: 0; color: inherit">{body}</table>'


def _gpu_html(gpu: dict[str, Any], label: str) -> str:
    head = f'<div style="font-weight: 600">{_e(_gpu_line(gpu))}</div>'
    if gpu["lost"] or "usage" not in gpu:
        return f'<div style="{_CARD}">{head}</div>'
    size = sizes_for(gpu["memory_total_bytes"])
    parts = [head, _bar_html(gpu["usage"], gpu["memory_total_bytes"], label, size)]
    if gpu.get("tensorflow_in_use_bytes") is not None:
        parts.append(
            f"<div>TensorFlow allocator: {_e(size(gpu['tensorflow_in_use_bytes']))} in use, "
            f"peak {_e(size(gpu['tensorflow_peak_bytes']))}</div>"
        )
    parts.append(_processes_html(gpu["processes"], label, size))
    if gpu.get("claim"):
        parts.append(f"<div>Claimed by {_e(_claim_text(gpu['claim'], label))}</div>")
    parts.extend(f'<div style="{_MUTED}">Note: {_e(n)}</div>' for n in gpu.get("notes", []))
    for row in gpu.get("mig_instances") or []:
        mig_size = sizes_for(row.get("memory_total_bytes"))
        parts.append(f'<div style="margin: 4px 0 0 12px"><div style="font-weight: 600">{_e(_mig_line(gpu["index"], row, label))}</div>')
        if row.get("mig_index") is not None:
            parts.append(_processes_html(row["processes"], label, mig_size))
        parts.extend(f'<div style="{_MUTED}">Note: {_e(n)}</div>' for n in row.get("notes", []))
        parts.append("</div>")
    return f'<div style="{_CARD}">{"".join(parts)}</div>'


def _bar_html(usage: dict[str, Any], total: Optional[int], label: str, size: Callable[[Optional[int]], str]) -> str:
    segments = []
    for key, name, _ch, colour in SEGMENTS[:-1]:  # free is the empty track behind them
        value = usage[key]
        if total and value:
            title = f"{label if key == 'this_kernel_bytes' else name}: {size(value)}"
            segments.append(
                f'<div title="{_e(title)}" style="width: {100 * value / total:.2f}%; background: {colour}"></div>'
            )
    bar = (
        '<div style="display: flex; height: 12px; margin: 4px 0; border-radius: 2px; overflow: hidden; '
        'background: var(--jp-layout-color2, #eeeeee); border: 1px solid var(--jp-border-color1, #bdbdbd)">'
        + "".join(segments) + "</div>"
    )
    return bar + _legend_html(usage, label, size)


def _legend_html(usage: dict[str, Any], label: str, size: Callable[[Optional[int]], str]) -> str:
    items = []
    for key, name, _ch, colour in SEGMENTS:
        name = label if key == "this_kernel_bytes" else name
        if key == "free_bytes":
            colour = "var(--jp-layout-color2, #eeeeee)"
        text = f"{name} {size(usage[key])}"
        if key == "this_kernel_bytes" and usage["this_kernel_source"] == "tensorflow":
            text += " (TensorFlow allocator)"
        items.append(
            f'<span style="margin-right: 12px; white-space: nowrap"><span style="display: inline-block; '
            f"width: 9px; height: 9px; margin-right: 4px; background: {colour}; "
            f'border: 1px solid var(--jp-border-color1, #bdbdbd)"></span>{_e(text)}</span>'
        )
    return f'<div style="{_MUTED}">{"".join(items)}</div>'


def _processes_html(processes: Optional[list[dict[str, Any]]], label: str, size: Callable[[Optional[int]], str]) -> str:
    if processes is None:
        return f'<div style="{_MUTED}">processes: n/a</div>'
    if not processes:
        return f'<div style="{_MUTED}">no processes</div>'
    head = "".join(f'<th style="{_CELL}; font-weight: 600">{h}</th>' for h in ("pid", "user", "memory", "command", ""))
    rows = []
    for proc in processes:
        tag = {"this kernel": label, "unknown": "exited", "hidden": "hidden by /proc: hidepid"}.get(proc["whose"], "")
        if proc["note"] and proc["whose"] not in ("unknown", "hidden"):
            tag = f"{tag}; {proc['note']}" if tag else proc["note"]
        cells = (
            str(proc["pid"]),
            proc["user"] or "n/a",
            size(proc["used_memory_bytes"]),
            _short(proc["command"] or "n/a", 60),
            tag,
        )
        weight = "; font-weight: 600" if proc["whose"] == "this kernel" else ""
        rows.append("<tr>" + "".join(f'<td style="{_CELL}{weight}">{_e(c)}</td>' for c in cells) + "</tr>")
    return f'<table style="border-collapse: collapse; margin: 2px 0; color: inherit"><tr>{head}</tr>{"".join(rows)}</table>'


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)
