"""An explanation under a framework's out-of-memory error: which device, how full, who else, what next.

:func:`explain` makes the text; :mod:`.oom_handler` shows it under the error's traceback in
IPython, importing this module only when the first out-of-memory error arrives.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ..command.units import MIB, format_size
from ..frameworks import tensorflow as tf_adapter
from ..safe_text import safe

__all__ = ["Facts", "OomSite", "explain", "gather", "is_out_of_memory", "next_steps", "parse_message", "render"]

# "OOM when allocating tensor with shape[268435456] and type float on
#  /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu_bfc"
_OOM = re.compile(
    r"OOM when allocating tensor with shape\[(?P<shape>[\d,\s]*)\] and type (?P<dtype>\w+)"
    r" on \S*?device:(?P<device>[A-Z_]+:\d+)(?: by allocator (?P<allocator>\S+))?"
)
_DEVICE = re.compile(r"device:(?P<device>(?:GPU|CPU):\d+)")
_DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}


def is_out_of_memory(framework: Any, error: BaseException) -> bool:
    """JAX's runtime error covers every failure: only its RESOURCE_EXHAUSTED kind is memory."""
    return framework.key != "jax" or "RESOURCE_EXHAUSTED" in str(error)


# -- facts ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OomSite:
    """What TensorFlow's message says about the failed allocation."""

    device: Optional[str]  # "GPU:0" (TensorFlow's numbering) or "CPU:0"; None when not named
    request_bytes: Optional[int]
    request_text: Optional[str]  # "float tensor of shape [268435456]"
    allocator: Optional[str]  # TensorFlow's allocator name, e.g. "GPU_0_bfc"


@dataclass
class Facts:
    site: OomSite
    label: str  # "GPU 1 (TF GPU:0, NVIDIA A100-SXM4-80GB)" or "CPU:0"
    gpu: Optional[int] = None  # NVML index
    in_use_bytes: Optional[int] = None  # TensorFlow's allocator, right after the failure
    limit_text: str = "unknown"
    gpu_used_bytes: Optional[int] = None  # all processes, per the driver
    gpu_total_bytes: Optional[int] = None
    others: list[str] = field(default_factory=list)  # one line per other process
    others_note: Optional[str] = None
    better_gpu: Optional[tuple[int, int]] = None  # (NVML index, free bytes) of a freer GPU
    precision: Optional[str] = None
    framework: str = "TensorFlow"
    allocator_text: Optional[str] = None  # the framework's figures where they are not TensorFlow's


def parse_message(message: str) -> OomSite:
    match = _OOM.search(message)
    if match is None:
        found = _DEVICE.search(message)
        return OomSite(found.group("device") if found else None, None, None, None)
    dims = [int(d) for d in match.group("shape").replace(" ", "").split(",") if d]
    dtype = match.group("dtype")
    count = 1
    for d in dims:
        count *= d
    size = _DTYPE_BYTES.get(dtype)
    text = f"{dtype} tensor of shape [{','.join(map(str, dims))}]"
    return OomSite(match.group("device"), count * size if size else None, text, match.group("allocator"))


def gather(session: Any, error: BaseException) -> Facts:
    """Everything the explanation says, read now (the allocator right after the failure)."""
    for framework in (session.torch, session.jax):
        oom_type = framework.oom_error_type()
        if oom_type is not None and isinstance(error, oom_type):
            return _gather_cuda_framework(session, framework, error)
    site = parse_message(str(error))
    device = site.device or (session.tf.memory_devices() or ("CPU:0",))[0]
    site = OomSite(device, site.request_bytes, site.request_text, site.allocator)
    facts = Facts(site, device, precision=getattr(session.requested, "precision", None))
    stats = session.tf.memory_info(device)
    if stats is not None:
        facts.in_use_bytes = stats.current_bytes
    if device.startswith("GPU:"):
        _gpu_facts(session, facts, device)
    else:
        facts.limit_text = _cpu_limit_text()
    return facts


# PyTorch: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ..."
_TORCH_OOM = re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)\.(?: GPU (?P<gpu>\d+))?")
# JAX (XLA): "Out of memory while trying to allocate 4294967296 bytes." or "Failed to allocate
# request for 1.00GiB (1073741824B) on device ordinal 1".
_JAX_OOM = re.compile(r"allocate (?P<bytes>\d+) bytes|\((?P<b>\d+)B\)")
_JAX_ORDINAL = re.compile(r"device ordinal (?P<ordinal>\d+)")


def _gather_cuda_framework(session: Any, framework: Any, error: BaseException) -> Facts:
    """PyTorch's or JAX's error: the device it names (its CUDA number), its allocator, its cap."""
    message = str(error)
    cuda_index, request = 0, None
    if framework.key == "pytorch":
        found = _TORCH_OOM.search(message)
        if found is not None:
            request = found.group("size")
            cuda_index = int(found.group("gpu") or 0)
    else:
        found = _JAX_OOM.search(message)
        if found is not None:
            request = format_size(int(found.group("bytes") or found.group("b")))
        ordinal = _JAX_ORDINAL.search(message)
        cuda_index = int(ordinal.group("ordinal")) if ordinal else 0
        start = framework.start()
        if start is None or not start.gpu:  # JAX on the CPU: no GPU to blame
            site = OomSite("CPU:0", None, request, None)
            return Facts(site, "the CPU (JAX has no GPU backend)", framework="JAX",
                         limit_text="none of JAX's own on the CPU (the system's memory)")
    prefix = "cuda" if framework.key == "pytorch" else "gpu"
    device = f"{prefix}:{cuda_index}"
    site = OomSite(f"GPU:{cuda_index}", None, f"{request}" if request else None, None)
    facts = Facts(site, f"{framework.name} {device}", framework=framework.name,
                  precision=getattr(session.requested, "precision", None))
    memory = framework.device_memory().get(device)
    if memory is not None:
        reserved = f", {format_size(memory.reserved_bytes)} reserved" if memory.reserved_bytes is not None else ""
        facts.allocator_text = f"{format_size(memory.in_use_bytes)} in use{reserved}"
    cuda_map = session.machine.cuda_map()
    index = cuda_map[cuda_index] if cuda_index < len(cuda_map) else None
    facts.gpu = index
    if index is None:
        facts.limit_text = "unknown (the GPU could not be mapped to nvidia-smi's numbering)"
        return facts
    _driver_facts(session, facts, index, f"{framework.name} {device}")
    facts.limit_text = _framework_limit_text(session, framework, cuda_index, memory)
    return facts


def _driver_facts(session: Any, facts: Facts, index: int, named: str) -> Any:
    """The driver's view of GPU ``index``: its name, how full, who else, a freer GPU.  Returns
    its memory reading (None without one)."""
    nvml = session.nvml
    info = nvml.gpu(index) if nvml.available() else None
    memory = info.memory if info is not None else None
    name = f", {info.name}" if info is not None and info.name else ""
    facts.label = f"GPU {index} ({named}{name})"
    if memory is not None:
        facts.gpu_used_bytes, facts.gpu_total_bytes = memory.used_bytes, memory.total_bytes
    if nvml.available():
        facts.others, facts.others_note = _other_processes(session, info)
        facts.better_gpu = _freer_gpu(nvml, index, memory)
    return memory


def _framework_limit_text(session: Any, framework: Any, cuda_index: int, memory: Any) -> str:
    """The cap as it was set (the adapter's record), never re-derived from the request."""
    if framework.key == "pytorch":
        fraction = framework.caps_set.get(cuda_index)
        if fraction is None:
            return "none set (PyTorch may take the whole GPU)"
        return f"{format_size(framework.caps_bytes[cuda_index])} (`%gpu limit`, set as fraction {fraction:.4f})"
    start = framework.start()
    fraction = "0.75, JAX's default" if start is None or start.memory_fraction is None else f"{start.memory_fraction:g}"
    pool = f"{format_size(memory.limit_bytes)}, " if memory is not None and memory.limit_bytes else ""
    return f"{pool}memory fraction {fraction} (read when JAX started)"


def _cpu_limit_text() -> str:
    if os.environ.get(tf_adapter.CPU_STATS_ENV, "").lower() != "true":
        return "none of TensorFlow's own (the default CPU allocator takes what the system gives)"
    raw = os.environ.get(tf_adapter.CPU_LIMIT_ENV)
    # '²'.isdigit() is True and int('²') fails; int() refuses over 4,300 digits, and TensorFlow
    # reads the value as an int64 (at most 19 digits), so a longer one is not a limit it uses.
    if raw and raw.isascii() and raw.isdigit() and len(raw.lstrip("0")) <= 18:
        return f"{format_size(int(raw) * MIB)} ({tf_adapter.CPU_LIMIT_ENV}={raw})"
    return f"{format_size(tf_adapter.CPU_DEFAULT_LIMIT_MIB * MIB)} (TensorFlow's default for the CPU BFC allocator)"


def _gpu_facts(session: Any, facts: Facts, device: str) -> None:
    index = session.gpu_by_tf_name().get(device)
    facts.gpu = index
    if index is None:
        facts.limit_text = "unknown (TensorFlow's GPU numbering could not be mapped to nvidia-smi's)"
        return
    cap = session.limit_bytes_by_gpu().get(index)
    memory = _driver_facts(session, facts, index, f"TF {device}")
    if cap is not None:
        facts.limit_text = f"{format_size(cap)} (`%gpu limit`)"
    elif memory is not None:
        facts.limit_text = f"none set (TensorFlow may take most of the GPU's {format_size(memory.total_bytes)})"
    else:
        facts.limit_text = "none set"


def _other_processes(session: Any, info: Any) -> tuple[list[str], Optional[str]]:
    """Other processes on the GPU with owners, largest first (the inventory's attribution)."""
    from ..gpus import holdings, owners  # psutil, only when there is something to explain

    table = owners.process_table_for(session.nvml)
    usage = holdings.attribute(session.nvml, info, table, os.getpid(), table.current_user())
    if usage.processes is None:
        return [], "; ".join(usage.notes) or "NVML could not list the processes"
    others = sorted(
        (e for e in usage.processes if e.whose != holdings.THIS_KERNEL),
        key=lambda e: -(e.used_memory_bytes or 0),
    )
    return [_process_line(e) for e in others], None


def _process_line(entry: Any) -> str:
    used = "memory n/a" if entry.used_memory_bytes is None else format_size(entry.used_memory_bytes)
    if not entry.alive:
        return f"pid {entry.pid}: {used} (exited, but the driver still lists it)"
    user = safe(entry.user) if entry.user else "unknown user"  # other users' text: never raw escapes
    command = f", {safe(entry.command)}" if entry.command else ""
    return f"pid {entry.pid}: {used} ({user}{command})"


def _freer_gpu(nvml: Any, index: int, memory: Any) -> Optional[tuple[int, int]]:
    here = memory.free_bytes if memory is not None else 0
    best: Optional[tuple[int, int]] = None
    for gpu in nvml.gpus():
        if gpu.index == index or gpu.memory is None or gpu.lost:
            continue
        free = gpu.memory.free_bytes
        if free > here and (best is None or free > best[1]):
            best = (gpu.index, free)
    return best


# -- the text -------------------------------------------------------------------------------------
def explain(session: Any, error: BaseException) -> str:
    """The explanation printed under an out-of-memory traceback (the one path to it)."""
    return render(gather(session, error))


def _framework_lines(facts: Facts) -> list[str]:
    """The failed request and the framework's own allocator figures (its view, not the driver's)."""
    site = facts.site
    if facts.framework != "TensorFlow":
        figures = facts.allocator_text or "no figures (CUDA has not started)"
        request = [f"  Failed request: {site.request_text}"] if site.request_text else []
        return [*request, f"  {facts.framework}'s allocator: {figures}; limit: {facts.limit_text}"]
    lines = []
    if site.request_text:
        size = f" = {format_size(site.request_bytes)}" if site.request_bytes is not None else ""
        by = f", allocator {site.allocator}" if site.allocator else ""
        lines.append(f"  Failed request: {site.request_text}{size}{by}")
    if facts.in_use_bytes is not None:
        lines.append(f"  TensorFlow's allocator: {format_size(facts.in_use_bytes)} in use; limit: {facts.limit_text}")
    else:
        lines.append(f"  TensorFlow's allocator keeps no statistics here; limit: {facts.limit_text}")
    return lines


def render(facts: Facts) -> str:
    lines = [f"tfgpu_magic: {facts.framework} ran out of memory on {facts.label}."]
    lines.extend(_framework_lines(facts))
    if facts.gpu_used_bytes is not None and facts.gpu_total_bytes is not None:
        lines.append(
            f"  GPU {facts.gpu}: {format_size(facts.gpu_used_bytes)} of {format_size(facts.gpu_total_bytes)} "
            "in use by all processes (nvidia-smi's view)"
        )
    lines.extend(_others_lines(facts))
    lines.append("  Next steps:")
    lines.extend(f"    - {step}" for step in next_steps(facts))
    return "\n".join(lines)


def _others_lines(facts: Facts) -> list[str]:
    if not facts.site.device or not facts.site.device.startswith("GPU:") or facts.gpu is None:
        return []
    if facts.others_note:
        return [f"  Other processes on GPU {facts.gpu}: unknown ({facts.others_note})"]
    if not facts.others:
        return [f"  Other processes on GPU {facts.gpu}: none"]
    return [f"  Other processes on GPU {facts.gpu}:"] + [f"    {line}" for line in facts.others]


def next_steps(facts: Facts) -> list[str]:
    if facts.framework == "PyTorch":
        return _cuda_framework_steps(facts, [
            "`del` the tensors you no longer need, then `%gpu free` (it empties PyTorch's cache), "
            "then run the cell again",
            "a smaller batch size (halve it until the cell fits)",
            "`with torch.autocast(\"cuda\", dtype=torch.float16):` around the forward pass: half the activations",
        ])
    if facts.framework == "JAX":
        return _cuda_framework_steps(facts, [
            "`del` the arrays you no longer need (JAX keeps every live array), then run the cell again",
            "a smaller batch size (halve it until the cell fits)",
        ])
    steps = [
        "`%gpu free`: drop Keras models and tensors left by earlier cells (their memory returns to "
        "TensorFlow's pool), then run the cell again",
        "a smaller batch size (halve it until the cell fits)",
    ]
    on_gpu = facts.site.device is not None and facts.site.device.startswith("GPU:")
    if on_gpu and facts.precision != "mixed_float16":
        steps.append(
            "`%gpu precision mixed_float16`, then rebuild the model: float16 activations take half the memory"
        )
    if on_gpu and facts.better_gpu is not None:
        index, free = facts.better_gpu
        steps.append(
            f"another GPU: `%gpu use {index}` ({format_size(free)} free) or a higher `%gpu limit`, "
            "at the top of the notebook, then restart the kernel"
        )
    elif on_gpu:
        steps.append("a higher `%gpu limit`, at the top of the notebook, then restart the kernel")
    else:
        steps.append(
            f"a higher {tf_adapter.CPU_LIMIT_ENV} (MiB) in the kernel's environment before TensorFlow "
            "starts, or a GPU"
        )
    return steps


def _cuda_framework_steps(facts: Facts, steps: list[str]) -> list[str]:
    if facts.better_gpu is not None:
        index, free = facts.better_gpu
        steps.append(
            f"another GPU: `%gpu use {index}` ({format_size(free)} free) or a higher `%gpu limit`, "
            "at the top of the notebook, then restart the kernel"
        )
    else:
        steps.append("a higher `%gpu limit`, at the top of the notebook, then restart the kernel")
    return steps
