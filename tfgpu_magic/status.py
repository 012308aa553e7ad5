"""``%gpu status``: what was asked, what is in force, TensorFlow's stage, and the GPUs.

The report is plain data (JSON-ready) built by :func:`build_report`; renderers turn it into
text.  Reading it never starts TensorFlow.
"""

from __future__ import annotations

from typing import Any, Optional

from . import tf_runtime
from .nvml import GpuInfo, NvmlUnavailable
from .session import Session
from .tf_runtime import Stage
from .units import format_bytes

__all__ = ["build_report", "render_text"]


def build_report(session: Session) -> dict[str, Any]:
    stage = tf_runtime.stage()
    report: dict[str, Any] = {
        "tensorflow": {"stage": stage.name.lower(), "description": stage.describe()},
        "requested": session.requested.describe(),
        "in_force": _in_force(session, stage),
        "gpus": [],
        "nvml_error": None,
        "notes": list(session.hook_errors),
    }
    if stage is Stage.STARTED:
        report["tensorflow"]["allocator"] = {
            device: {"current_bytes": s.current_bytes, "peak_bytes": s.peak_bytes}
            for device, s in tf_runtime.allocator_stats().items()
        }
    try:
        visible = session.visible_gpus()
        tf_names = _tf_names(session)
        report["gpus"] = [_gpu_entry(g, visible, tf_names) for g in session.nvml.gpus()]
    except NvmlUnavailable as err:
        report["nvml_error"] = str(err)
    return report


def _in_force(session: Session, stage: Stage) -> list[str]:
    lines: list[str] = []
    if stage is Stage.STARTED:
        force = tf_runtime.in_force(session.cuda_map())
        shown = ",".join(map(str, force.visible_nvml)) or "none"
        lines.append(f"GPUs visible to TensorFlow: {shown}")
        if force.visible_nvml:
            lines.append(f"memory growth: {'on' if force.growth else 'off'}")
            for index, sizes in force.logical_mib.items():
                if sizes:
                    lines.append(f"GPU {index}: logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}")
            lines.append(f"allocator: {force.allocator}")
    else:
        env = {k: v for k, v in tf_runtime.start_env().items() if v is not None}
        if env:
            lines.append("environment for TensorFlow's start: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    policy = tf_runtime.keras_policy()
    if policy is not None:
        lines.append(f"Keras precision: {policy}")
    return lines


def _tf_names(session: Session) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for tf_name, index in tf_runtime.tf_gpu_to_nvml(session.cuda_map()).items():
        names.setdefault(index, []).append(tf_name)
    return names


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


def render_text(report: dict[str, Any]) -> str:
    lines = [
        "Requested:  " + ("; ".join(report["requested"]) or "nothing (TensorFlow's defaults)"),
        "In force:   " + ("; ".join(report["in_force"]) or "TensorFlow's defaults"),
        "TensorFlow: " + report["tensorflow"]["description"],
    ]
    for device, stats in report["tensorflow"].get("allocator", {}).items():
        lines.append(
            f"  {device} TensorFlow allocator: {format_bytes(stats['current_bytes'])} in use, "
            f"peak {format_bytes(stats['peak_bytes'])}"
        )
    if report["nvml_error"]:
        lines.append(f"GPUs:       {report['nvml_error']}")
    for gpu in report["gpus"]:
        lines.append(_gpu_line(gpu))
    lines.extend(f"Note: {note}" for note in report["notes"])
    return "\n".join(lines)


def _gpu_line(gpu: dict[str, Any]) -> str:
    if gpu["lost"]:
        return f"GPU {gpu['index']}  lost: the GPU stopped answering"
    util = gpu["utilization_percent"]
    seen = {True: "visible", False: "hidden", None: "visibility unknown"}[gpu["visible"]]
    if gpu["tensorflow_names"]:
        seen += f" (TensorFlow {', '.join(gpu['tensorflow_names'])})"
    return (
        f"GPU {gpu['index']}  {gpu['name'] or 'n/a'}  "
        f"{format_bytes(gpu['memory_used_bytes'])} / {format_bytes(gpu['memory_total_bytes'])} used (driver)  "
        f"util {'n/a' if util is None else f'{util}%'}  {seen}"
    )
