"""``%gpu status``: what was asked, what is in force, each framework's stage, and who holds what.

The report is plain data (JSON-ready) built by :func:`build_report`; :func:`render_text` and
:func:`render_html` turn it into a terminal table or a notebook card.  For each GPU: memory
split into this kernel, my other processes, other users and the unattributed rest; the
processes with owner and memory; claims by ``%gpu use auto``; each framework's allocator once
it has started.  What a framework has to say comes from its adapter (``frameworks/``, the
:class:`~tfgpu_magic.frameworks.base.Reporting` methods), handed a frozen view of the kernel:
this module loops over the session's frameworks and names none of them.  Reading it never
starts a framework.  A missing reading is ``None`` (n/a), never 0.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ..command.units import MIB, sizes_for
from ..frameworks.base import ReportView, Stage, environment_line
from ..gpus import claims, holdings, owners
from ..gpus.nvml import GpuInfo, GpuLost, NvmlUnavailable, ReadingFailed
from ..gpus.utilization import UtilizationReader, of_pids
from ..safe_text import safe_tree
from .session import Session, SessionError

__all__ = ["build_report", "header_rows", "render_html", "render_text"]

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
    process_table: owners.ProcessTable | None = None,
    my_pid: int | None = None,
    viewer: str = "this kernel",
) -> dict[str, Any]:
    """Everything ``%gpu status`` shows, as JSON-ready data.

    ``process_table`` gives owners and commands (default: the device source's own, else the
    process-wide psutil table, which remembers owners between refreshes); ``my_pid`` is the process whose memory counts as "this kernel" (default: this
    one); ``viewer`` names it in the rendering (the CLI says "this process").

    Each framework gives its entry under ``frameworks`` (and the top-level keys it has always
    had); ``display`` holds what the text and the card show of them, in their adapters' words.
    """
    session.meet_enumeration()  # a framework listed its GPUs after the request was accepted: say what CUDA found
    division = session.limit_division()  # how the kernel's limit is divided between its frameworks
    notes = [*session.notes, *session.hook_errors]
    if division is not None and division not in notes:
        notes.append(division)
    frameworks = session.frameworks()
    views = _views(session, notes)
    in_force = _in_force(session, views)
    entries = {f.key: f.report(views[f.key]) for f in frameworks}
    report: dict[str, Any] = {}
    for framework in frameworks:  # keys a framework has always had at the top (scripts read them there)
        report.update(framework.report_keys(entries[framework.key]))
    report.update(
        {
            "requested": session.requested.describe(),
            "resolved": None,
            "in_force": in_force,
            "allocation": None,
            "gpus": [],
            "nvml_error": None,
            "notes": notes,
            "me": {"pid": os.getpid() if my_pid is None else my_pid, "user": None, "label": viewer},
            "visible_gpus": None,
            "defaults": session.defaults_record.as_json(),
            # The notebook's saved settings as met at the kernel's start; None: it has none.
            "notebook_settings": None
            if session.notebook_record is None
            else session.notebook_record.as_json(),
        }
    )
    listing = next((f for f in frameworks if f.listed_gpus(views[f.key]) is not None), None)
    if listing is not None:
        # The framework's own list is what CUDA showed this kernel, known with or without NVML: the
        # card must not say "GPUs seen: unknown" beside "GPUs visible to ...: none".
        report["visible_gpus"] = session.visible_gpus()
    _add_resolution(report, session)
    report["platform_shares"] = _platform_shares(session)
    # Who holds the accepted limit: "soft (TensorFlow's allocator)", "hard (MPS)", "hard (MIG)"; None: no limit.
    report["limit_enforcement"] = session.limit_label()
    for entry in (report["resolved"] or {}).get("gpus", []):
        entry["enforcement"] = report["limit_enforcement"] if entry["limit_mib"] is not None else None
    report["frameworks"] = entries
    report["display"] = {
        "frameworks": [
            {"key": f.key, "name": f.name, "lines": f.status_lines(entries[f.key])} for f in frameworks
        ],
        "listed_by": None if listing is None else listing.name,  # whose listing says which GPUs are visible
    }
    try:
        _add_gpus(report, session, process_table, views)
    except NvmlUnavailable as err:
        report["nvml_error"] = str(err)
    return report


def _views(session: Session, notes: list[str]) -> dict[str, ReportView]:
    """Each framework's view of the kernel: the machine's facts, and what it was given."""
    shared = session.view(notes=notes)
    return {
        f.key: dataclasses.replace(shared, applied=session.applied.get(f.key)) for f in session.frameworks()
    }


def _add_resolution(report: dict[str, Any], session: Session) -> None:
    """The request as resolved on this machine (sizes per GPU), and the environment's allocation."""
    allocation = session.machine.allocation()
    if allocation.restricted:
        report["allocation"] = {
            "cuda_visible_devices": allocation.raw,
            "gpus": None if allocation.gpus is None else list(allocation.gpus),
            "note": allocation.note,
            "invalid_entry": None
            if allocation.invalid is None
            else {
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
            {
                "index": g.index,
                "limit_mib": g.cap_mib,
                "logical_mib": None if g.logical_mib is None else list(g.logical_mib),
                # No limit asked under a platform share: the cap is the share less a CUDA context.
                "within_share": g.within_share,
            }
            for g in resolution.gpus
        ],
    }


def _platform_shares(session: Session) -> list[dict[str, Any]]:
    """Each GPU's platform share as recorded from what the kernel inherited (gpus/platform.py)."""
    try:
        recorded = session.machine.platform_shares()
    except (NvmlUnavailable, GpuLost, ReadingFailed):
        return []
    return [share.as_json() for _, share in sorted(recorded.items())]


def _add_gpus(
    report: dict[str, Any], session: Session, table: owners.ProcessTable | None, views: dict[str, ReportView]
) -> None:
    me = report["me"]
    table = table or owners.process_table_for(session.nvml, me["pid"])
    me["user"] = table.current_user()
    gpus = session.nvml.gpus()  # raises NvmlUnavailable before anything else is read
    if session.nvml.count_note:
        report["notes"].append(session.nvml.count_note)
    visible = session.visible_gpus()
    exposed = session.exposed_gpus()  # what CUDA shows: a GPU a framework did not find was not hidden
    report["visible_gpus"] = visible
    frameworks = session.frameworks()
    shares = {f.key: f.gpu_shares(views[f.key]) for f in frameworks}
    holders = _holders(session, gpus, report["notes"])
    for gpu in gpus:
        parts = [(f, shares[f.key][gpu.index]) for f in frameworks if gpu.index in shares[f.key]]
        held = (
            next(  # where NVML lists no pid of ours: the first framework's allocator that holds memory there
                (
                    holdings.AllocatorShare(s.in_use_bytes, f.key, f.name)
                    for f, s in parts
                    if s.in_use_bytes is not None
                ),
                None,
            )
        )
        usage = holdings.attribute(session.nvml, gpu, table, me["pid"], me["user"], held)
        entry = _gpu_entry(gpu, visible)
        for framework in frameworks:
            entry.update(framework.gpu_keys(shares[framework.key].get(gpu.index)))
        entry["shown_to_cuda"] = None if exposed is None else gpu.index in exposed
        entry["share"] = next((s for s in report.get("platform_shares", []) if s["gpu"] == gpu.index), None)
        entry.update(_detail(gpu, usage, holders.get(gpu.index)))
        entry["frameworks"] = [  # each framework's names for its devices here, and its allocator's figures
            {
                "key": f.key,
                "name": f.name,
                "names": list(s.names),
                "in_use_bytes": s.in_use_bytes,
                "peak_bytes": s.peak_bytes,
            }
            for f, s in parts
        ]
        entry["mig_instances"] = _mig_rows(session, gpu, table, me) if gpu.mig_enabled else None
        report["gpus"].append(entry)
    _add_utilization(report, session)


def _add_utilization(report: dict[str, Any], session: Session) -> None:
    """``this_kernel_utilization`` of each GPU: this kernel's processes' utilization there (NVML's
    samples the driver still keeps: the last seconds), read only where NVML lists one of them
    holding memory, one call per such GPU; None elsewhere."""
    mine = {
        entry["index"]: [p["pid"] for p in entry.get("processes") or () if p["whose"] == holdings.THIS_KERNEL]
        for entry in report["gpus"]
    }
    readings = UtilizationReader(session.nvml).read(index for index, pids in mine.items() if pids)
    for entry in report["gpus"]:
        pids = mine[entry["index"]]
        entry["this_kernel_utilization"] = (
            of_pids(readings.get(entry["index"]), pids).as_json() if pids else None
        )


def _mig_rows(
    session: Session, gpu: GpuInfo, table: owners.ProcessTable, me: dict[str, Any]
) -> list[dict[str, Any]]:
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
            None
            if listing.processes is None
            else [_process(p) for p in holdings.entries(listing.processes, table, me["pid"], me["user"], key)]
        )
        rows.append(
            {
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
            }
        )
    return rows


def _in_force(session: Session, views: dict[str, ReportView]) -> list[str]:
    """What each imported framework runs with (its adapter says), or the environment the frameworks
    will read at their start; then the numbering and the settings that are no GPU's."""
    lines: list[str] = []
    allocation = session.machine.allocation()
    if allocation.restricted:
        lines.append(f"allocated by the environment: {allocation.describe()}")
    frameworks = session.frameworks()
    own = [f.in_force_lines(views[f.key]) for f in frameworks]
    if any(part is not None for part in own):
        lines += [line for part in own if part is not None for line in part]
    else:
        # The frameworks imported (else those installed) read these as they start; CUDA's are
        # read once per process, when the first of them starts it (the record, once made).
        reading = [f for f in frameworks if f.stage() is not Stage.NOT_IMPORTED] or [
            f for f in frameworks if f.installed()
        ]
        env = {"CUDA_VISIBLE_DEVICES": session.machine.cuda_env().get("CUDA_VISIBLE_DEVICES")}
        for framework in reading:  # as each read them once it did (the record), else as they are now
            env.update(framework.read_environment(session.machine.env))
        names = [f.name for f in reading]
        lines += environment_line(f"environment read at start by {_joined(names) if names else 'CUDA'}", env)
    note = session.machine.numbering_note() if session.nvml.available() else None
    if note:
        lines.append(f"numbering: {note}")
    for framework in frameworks:
        lines += framework.in_force_notes(views[framework.key])
    return lines


def _holders(session: Session, gpus: list[GpuInfo], notes: list[str]) -> dict[int, claims.Holder | None]:
    keys = {g.index: g.uuid for g in gpus if not g.lost and g.uuid}
    try:
        found = claims.holders(list(keys.values()), notes=notes)  # unusable claim files: a note each
    except (claims.ClaimError, OSError) as err:
        notes.append(f"claims could not be read: {err}")
        return {}
    return {index: found.get(key) for index, key in keys.items()}


def _gpu_entry(gpu: GpuInfo, visible: list[int] | None) -> dict[str, Any]:
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
    }


def _detail(gpu: GpuInfo, usage: holdings.GpuUsage, holder: claims.Holder | None) -> dict[str, Any]:
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
        "claim": None
        if holder is None
        else {
            "pid": holder.pid,
            "user": holder.user,
            "since": holder.since,
            "this_kernel": holder.this_process,
        },
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
    it leaves out the reading process's own settings, frameworks and memory (it holds none).
    """
    report = safe_tree(report)  # every string: commands, users, claims, GPU names, notes
    lines = _machine_header(report) if machine else _kernel_header(report)
    if report["nvml_error"]:
        lines.append(f"GPUs:       {report['nvml_error']}")
    label = None if machine else report.get("me", {}).get("label", "this kernel")
    if any(g.get("usage") for g in report["gpus"]):
        shown = [
            (ch, _segment_name(key, name, label))
            for key, name, ch, _colour in SEGMENTS
            if label is not None or key != "this_kernel_bytes"
        ]
        lines.append("Bars:       " + "  ".join(f"{ch} {name}" for ch, name in shown))
    display = report.get("display", {})
    names = _names(report)
    for gpu in report["gpus"]:
        lines.append(_gpu_line(gpu, machine, display.get("listed_by")))
        lines.extend("  " + line for line in _gpu_details(gpu, label, names))
    lines.extend(f"Note: {note}" for note in report["notes"])
    return "\n".join(lines)


def _names(report: dict[str, Any]) -> dict[str, str]:
    """Each framework's key -> its name as shown (its adapter's, recorded in the report)."""
    return {f["key"]: f["name"] for f in report.get("display", {}).get("frameworks", [])}


def _kernel_header(report: dict[str, Any]) -> list[str]:
    """The kernel's rows as text: a label padded to one column, continuations indented."""
    return [f"{label + ':':<11} {value}" if label else f"  {value}" for label, value in header_rows(report)]


def _notebook_rows(record: dict[str, Any] | None) -> list[tuple[str, str]]:
    """ "Notebook: from the notebook's settings (train.ipynb): needs 1 GPU with 4 GiB free, met (...)"."""
    if not record:
        return []
    if record.get("error"):
        return [("Notebook", f"from {record['source']}: {record['error']}")]
    text = f"from {record['source']}: {'; '.join(record.get('applied') or []) or 'nothing applied'}"
    rows = [("Notebook", text)]
    if record.get("met") is not None:
        state = "met" if record["met"] else "NOT met"
        rows.append(("", f"needs {record['requirements']}: {state} ({record.get('choice')})"))
    for item in record.get("not_applied", []):
        rows.append(("", f"{item['line']!r} not applied: {item['reason']}"))
    return rows


def header_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What this kernel asked for, what is in force, each imported framework's stage and allocator,
    who it is: ``(label, value)`` rows, a continuation's label empty.  The text and the HTML card
    are both made from these rows, so they say the same.  A framework's rows are its adapter's
    lines (``display``); one that is not imported has none (a PyTorch kernel reads nothing of
    TensorFlow); before any import one row names the installed ones, which the settings will reach."""
    frameworks = report.get("frameworks", {})
    shown = report.get("display", {}).get("frameworks", [])
    imported = [
        key for key, entry in frameworks.items() if entry.get("stage", "not_imported") != "not_imported"
    ]
    capped = any(g.get("within_share") for g in (report.get("resolved") or {}).get("gpus", []))
    defaults = "each framework's defaults, capped at the platform's share, see Share" if capped else None
    rows = [
        (
            "Requested",
            "; ".join(_requested(report)) or "nothing (" + (defaults or "each framework's defaults") + ")",
        ),
        ("In force", "; ".join(report["in_force"]) or defaults or "each framework's defaults"),
    ]
    label = report.get("limit_enforcement")
    if label:
        rows.append(
            ("Limit", f"{label}: {LIMIT_HELD[label.split(' ')[0] if label.startswith('soft') else label]}")
        )
    rows += _share_rows(report)
    for framework in shown:
        rows += _rows(framework["lines"])
    for k, default in enumerate(report.get("defaults", {}).get("not_applied", [])):
        rows.append(("Defaults" if k == 0 else "", f"{default['line']!r} not applied: {default['reason']}"))
    rows += _notebook_rows(report.get("notebook_settings"))
    if frameworks and not imported:
        names = [f["name"] for f in shown if frameworks.get(f["key"], {}).get("installed")]
        reach = (
            f"settings reach {_joined(names)} when {'it starts' if len(names) == 1 else 'they start'}"
            if names
            else ("none is installed in this kernel's environment")
        )
        rows.append(("Frameworks", f"none imported yet; {reach}"))
    if "me" in report:
        label, _, rest = _me_line(report).partition(":")
        rows.append((label, rest.strip()))
    return rows


# What each kind of limit holds, said beside its label.
LIMIT_HELD = {
    "soft": "their pools only; the CUDA context and libraries calling CUDA directly are outside it",
    "hard (MPS)": "the MPS server fails this process's allocations above it (set before CUDA started)",
    "hard (MIG)": "the MIG instance's memory holds for the whole process",
}


def _share_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """ "Share: GPU 0,1: 4096 MiB each, set by HAMi: CUDA_DEVICE_MEMORY_LIMIT=4g; soft (HAMi): ..."
    (GPUs with the same share on one row), with the cap a kernel that asked no limit gets under it."""
    within = {g["index"]: g for g in (report.get("resolved") or {}).get("gpus", []) if g.get("within_share")}
    grouped: dict[tuple[Any, ...], list[int]] = {}
    for share in report.get("platform_shares", []):
        cap = within[share["gpu"]]["limit_mib"] if share["gpu"] in within else None
        key = (share["bytes"], share["source"], share["evidence"], share["label"], share["enforced_by"], cap)
        grouped.setdefault(key, []).append(share["gpu"])
    rows: list[tuple[str, str]] = []
    for (size, source, evidence, label, enforced_by, cap), gpus in grouped.items():
        each = " each" if len(gpus) > 1 else ""
        text = f"GPU {','.join(map(str, gpus))}: {size // MIB} MiB{each}, set by {source}: {evidence}; {label}: {enforced_by}"
        if cap is not None:
            text += f"; no limit asked, so {cap} MiB{each} (the share less a CUDA context)"
        rows.append(("Share" if not rows else "", text))
    return rows


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


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


def _gpu_line(gpu: dict[str, Any], machine: bool = False, listed_by: str | None = None) -> str:
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
        seen = (
            f"not found by {listed_by or 'the framework'}"  # shown to CUDA, yet its listing has no GPU there
        )
    for part in gpu.get("frameworks", []):
        if part["names"]:
            seen += f" ({part['name']} {', '.join(part['names'])})"
    return f"{line}  {seen}"


def _allocator_lines(gpu: dict[str, Any], size: Callable[[int | None], str]) -> list[str]:
    """Each framework's allocator on this GPU, where it reports figures."""
    return [
        f"{part['name']} allocator: {size(part['in_use_bytes'])} in use, peak {size(part['peak_bytes'])}"
        for part in gpu.get("frameworks", [])
        if part["in_use_bytes"] is not None
    ]


def _gpu_details(gpu: dict[str, Any], label: str | None, names: dict[str, str]) -> list[str]:
    if "usage" not in gpu or gpu["lost"]:
        return []
    usage, size = gpu["usage"], sizes_for(gpu["memory_total_bytes"])
    lines = [f"[{_text_bar(usage, gpu['memory_total_bytes'])}] " + _legend(usage, label, size, names)]
    lines += _allocator_lines(gpu, size)
    if gpu.get("this_kernel_utilization"):
        lines.append(_utilization_line(gpu["this_kernel_utilization"], label))
    if gpu["processes"] is None:
        lines.append("processes: n/a")
    for proc in gpu["processes"] or []:
        lines.append(_process_line(proc, label, size))
    if gpu.get("claim"):
        lines.append("claimed by " + _claim_text(gpu["claim"], label))
    lines.extend(f"note: {note}" for note in gpu.get("notes", []))
    for row in gpu.get("mig_instances") or []:
        lines.append(_mig_line(gpu["index"], row, label))
        lines.extend(
            "  " + _process_line(proc, label, sizes_for(row.get("memory_total_bytes")))
            for proc in row.get("processes") or []
        )
        lines.extend(f"  note: {note}" for note in row.get("notes", []))
    return lines


def _utilization_line(figure: dict[str, Any], label: str | None) -> str:
    """``this kernel: 0% GPU utilization (...)``: whose figure it is, the driver's, said."""
    who = label or "this kernel"
    if figure["percent"] is None:
        return f"{who}: GPU utilization n/a ({figure['note']})"
    if figure["scope"] == "device":
        return f"{who}: {figure['percent']}% GPU utilization, the whole GPU's ({figure['note']})"
    return f"{who}: {figure['percent']}% GPU utilization (the driver's recent samples of its processes)"


def _mig_line(index: int, row: dict[str, Any], label: str | None) -> str:
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


def _used_of(size: Callable[[int | None], str], used: int | None, total: int | None) -> str:
    """'3.0 / 9.8 GiB': the unit said once where both figures share it."""
    used_text, total_text = size(used), size(total)
    unit = total_text.rpartition(" ")[2]
    if used_text.endswith(" " + unit) and total_text.endswith(" " + unit):
        used_text = used_text[: -len(unit) - 1]
    return f"{used_text} / {total_text}"


def _na(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _source(usage: dict[str, Any], names: dict[str, str]) -> str:
    """`` (TensorFlow allocator)`` where this kernel's share is a framework's allocator, not NVML's."""
    source = usage.get("this_kernel_source")
    return "" if source in (None, "nvml") else f" ({names.get(source, source)} allocator)"


def _legend(
    usage: dict[str, Any], label: str | None, size: Callable[[int | None], str], names: dict[str, str]
) -> str:
    parts = []
    for key, name, _ch, _colour in SEGMENTS:
        if usage[key] == 0 and key in ("my_other_bytes", "others_bytes", "unattributed_bytes"):
            continue  # a true zero; the JSON and the HTML legend still carry it
        if key == "this_kernel_bytes" and label is None:
            continue  # a terminal report: the reading process holds no GPU memory
        name = _segment_name(key, name, label)
        text = f"{name} {size(usage[key])}"
        if key == "this_kernel_bytes":
            text += _source(usage, names)
        parts.append(text)
    return " · ".join(parts)


def _segment_name(key: str, name: str, label: str | None) -> str:
    """A segment's name: the viewer's own label; in a terminal (no label), the user's processes."""
    if key == "this_kernel_bytes":
        return label or name
    if key == "my_other_bytes" and label is None:
        return "my processes"
    return name


def _widths(usage: dict[str, Any], total: int | None, width: int) -> list[int]:
    """Characters per segment: proportional, at least one for any non-zero share."""
    if not total:
        return [0] * len(SEGMENTS)
    raw = [max(0, usage[key] or 0) * width / total for key, *_ in SEGMENTS]
    cells = [max(1, round(r)) if r > 0 else 0 for r in raw]
    largest = max(range(len(cells)), key=lambda i: cells[i])
    cells[largest] += width - sum(cells)  # rounding drift goes to the widest segment
    return cells


def _text_bar(usage: dict[str, Any], total: int | None) -> str:
    if not total:
        return " " * BAR_WIDTH
    cells = _widths(usage, total, BAR_WIDTH)
    return "".join(ch * n for (_k, _l, ch, _c), n in zip(SEGMENTS, cells, strict=False))


def _process_line(proc: dict[str, Any], label: str | None, size: Callable[[int | None], str]) -> str:
    tag = {
        "this kernel": f"  ({label or 'this process'})",
        "unknown": "  (exited)",
        "hidden": "  (hidden by /proc: hidepid)",
    }.get(proc["whose"], "")
    if proc["note"] and proc["whose"] not in ("unknown", "hidden"):  # the GPU's note says it in full
        tag += f"  ({proc['note']})"
    command = _short(proc["command"] or "n/a", 48)
    return (
        f"pid {proc['pid']:<8} {proc['user'] or 'n/a':<10} {size(proc['used_memory_bytes']):>10}  "
        f"{command}{tag}"
    )


def _claim_text(claim: dict[str, Any], label: str | None) -> str:
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
    listed_by, names = report.get("display", {}).get("listed_by"), _names(report)
    parts.extend(
        _gpu_html(gpu, report.get("me", {}).get("label", "this kernel"), listed_by, names)
        for gpu in report["gpus"]
    )
    parts.extend(f'<div style="{_MUTED}">Note: {_e(note)}</div>' for note in report["notes"])
    parts.append("</div>")
    return "".join(parts)


def _summary_html(report: dict[str, Any]) -> str:
    body = "".join(
        f'<tr><th style="{_CELL}; font-weight: 600">{_e(k)}</th><td style="{_CELL}">{_e(v)}</td></tr>'
        for k, v in header_rows(report)
    )
    return f'<table style="border-collapse: collapse; margin: 0; color: inherit">{body}</table>'


def _gpu_html(gpu: dict[str, Any], label: str, listed_by: str | None, names: dict[str, str]) -> str:
    head = f'<div style="font-weight: 600">{_e(_gpu_line(gpu, listed_by=listed_by))}</div>'
    if gpu["lost"] or "usage" not in gpu:
        return f'<div style="{_CARD}">{head}</div>'
    size = sizes_for(gpu["memory_total_bytes"])
    parts = [head, _bar_html(gpu["usage"], gpu["memory_total_bytes"], label, size, names)]
    parts.extend(f"<div>{_e(line)}</div>" for line in _allocator_lines(gpu, size))
    if gpu.get("this_kernel_utilization"):
        parts.append(f"<div>{_e(_utilization_line(gpu['this_kernel_utilization'], label))}</div>")
    parts.append(_processes_html(gpu["processes"], label, size))
    if gpu.get("claim"):
        parts.append(f"<div>Claimed by {_e(_claim_text(gpu['claim'], label))}</div>")
    parts.extend(f'<div style="{_MUTED}">Note: {_e(n)}</div>' for n in gpu.get("notes", []))
    for row in gpu.get("mig_instances") or []:
        mig_size = sizes_for(row.get("memory_total_bytes"))
        parts.append(
            f'<div style="margin: 4px 0 0 12px"><div style="font-weight: 600">{_e(_mig_line(gpu["index"], row, label))}</div>'
        )
        if row.get("mig_index") is not None:
            parts.append(_processes_html(row["processes"], label, mig_size))
        parts.extend(f'<div style="{_MUTED}">Note: {_e(n)}</div>' for n in row.get("notes", []))
        parts.append("</div>")
    return f'<div style="{_CARD}">{"".join(parts)}</div>'


def _bar_html(
    usage: dict[str, Any],
    total: int | None,
    label: str,
    size: Callable[[int | None], str],
    names: dict[str, str],
) -> str:
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
        + "".join(segments)
        + "</div>"
    )
    return bar + _legend_html(usage, label, size, names)


def _legend_html(
    usage: dict[str, Any], label: str, size: Callable[[int | None], str], names: dict[str, str]
) -> str:
    items = []
    for key, name, _ch, colour in SEGMENTS:
        name = label if key == "this_kernel_bytes" else name
        if key == "free_bytes":
            colour = "var(--jp-layout-color2, #eeeeee)"
        text = f"{name} {size(usage[key])}"
        if key == "this_kernel_bytes":
            text += _source(usage, names)
        items.append(
            f'<span style="margin-right: 12px; white-space: nowrap"><span style="display: inline-block; '
            f"width: 9px; height: 9px; margin-right: 4px; background: {colour}; "
            f'border: 1px solid var(--jp-border-color1, #bdbdbd)"></span>{_e(text)}</span>'
        )
    return f'<div style="{_MUTED}">{"".join(items)}</div>'


def _processes_html(
    processes: list[dict[str, Any]] | None, label: str, size: Callable[[int | None], str]
) -> str:
    if processes is None:
        return f'<div style="{_MUTED}">processes: n/a</div>'
    if not processes:
        return f'<div style="{_MUTED}">no processes</div>'
    head = "".join(
        f'<th style="{_CELL}; font-weight: 600">{h}</th>' for h in ("pid", "user", "memory", "command", "")
    )
    rows = []
    for proc in processes:
        tag = {"this kernel": label, "unknown": "exited", "hidden": "hidden by /proc: hidepid"}.get(
            proc["whose"], ""
        )
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
    import html  # here: the text report (tfgpu, a terminal) needs no HTML

    return html.escape(str(text), quote=True)
