"""GPU numbering: nvidia-smi's indices (NVML's, what ``%gpu use`` takes) versus CUDA's.

CUDA numbers the GPUs it sees from 0, in ``CUDA_DEVICE_ORDER`` (FASTEST_FIRST by default),
after filtering by ``CUDA_VISIBLE_DEVICES`` (indices, GPU UUIDs or MIG UUIDs, read up to the
first invalid entry).  tfgpu_magic sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's own order,
before CUDA starts, so that CUDA's device k is the k-th entry of the visible list.
Pure functions, no NVML, no TensorFlow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

__all__ = ["Allocation", "allocation_from", "cuda_to_nvml", "order_is_nvml", "visible_env_value"]

_INDEX = re.compile(r"[0-9]+", re.ASCII)  # never str.isdigit: it accepts '²', which int() refuses
MAX_INDEX_DIGITS = 9  # no machine has a billion GPUs: a longer index names none (and int() refuses 4,301 digits)


def index_value(entry: str) -> Optional[int]:
    """The GPU index an all-digit entry names, as CUDA reads it (leading zeros ignored);
    None when it is too long to name any GPU.  Never int() on the whole: an inherited value
    may hold thousands of digits, which int() refuses with a ValueError."""
    significant = entry.lstrip("0") or "0"
    return int(significant) if len(significant) <= MAX_INDEX_DIGITS else None


def visible_env_value(gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for these nvidia-smi indices; an empty list hides every GPU."""
    return ",".join(str(i) for i in gpus) if gpus else "-1"


def order_is_nvml(env: Mapping[str, Optional[str]]) -> bool:
    return (env.get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID"


def cuda_to_nvml(env: Mapping[str, Optional[str]], nvml_uuids: Sequence[Optional[str]]) -> list[int]:
    """nvidia-smi index of each CUDA device, CUDA's device k at position k.

    ``nvml_uuids`` lists every GPU's UUID in NVML order (None where unreadable).  Right when
    CUDA orders devices by PCI bus (``order_is_nvml``), or for GPUs of one model.  MIG
    instances are counted as their parent GPU.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(len(nvml_uuids)))
    result: list[int] = []
    for entry in (e.strip() for e in raw.split(",")):
        index = _entry_index(entry, nvml_uuids)
        if index is None or (index in result and not entry.startswith("MIG-")):
            break  # CUDA stops at the first invalid entry
        result.append(index)
    return result


def _entry_index(entry: str, nvml_uuids: Sequence[Optional[str]]) -> Optional[int]:
    if _INDEX.fullmatch(entry):
        index = index_value(entry)
        return index if index is not None and index < len(nvml_uuids) else None
    if entry.startswith("MIG-GPU-"):  # legacy MIG form: MIG-GPU-<parent uuid>/<gi>/<ci>
        return _uuid_index(entry[4:].split("/", 1)[0], nvml_uuids)
    if entry.startswith("GPU-"):
        return _uuid_index(entry, nvml_uuids)
    return None


def _uuid_index(prefix: str, nvml_uuids: Sequence[Optional[str]]) -> Optional[int]:
    # CUDA accepts any unique prefix of a UUID.
    matches = [i for i, u in enumerate(nvml_uuids) if u and u.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Allocation:
    """The GPUs the environment gave this kernel: an inherited ``CUDA_VISIBLE_DEVICES``.

    A scheduler (Slurm, Kubernetes' device plugin, a JupyterHub spawner) or an administrator
    set it before the kernel started: tfgpu_magic keeps the kernel inside it.  ``gpus`` are
    nvidia-smi indices, as CUDA will read the value; ``None`` when they cannot be known (no
    NVML to match UUIDs, or MIG instances whose parent GPU is unknown).
    """

    raw: Optional[str]  # None: nothing inherited, every GPU is allocated
    gpus: Optional[tuple[int, ...]]
    note: Optional[str] = None  # what was odd about the value, for `%gpu`

    @property
    def restricted(self) -> bool:
        return self.raw is not None

    def describe(self) -> str:
        if self.gpus is None:
            return f"CUDA_VISIBLE_DEVICES={self.raw!r}"
        shown = ", ".join(map(str, self.gpus)) if self.gpus else "none"
        return f"GPU {shown}" if self.gpus else "no GPU"


def allocation_from(raw: Optional[str], nvml_uuids: Optional[Sequence[Optional[str]]]) -> Allocation:
    """Read an inherited ``CUDA_VISIBLE_DEVICES`` the way CUDA will (up to its first invalid entry)."""
    if raw is None:
        return Allocation(None, None if nvml_uuids is None else tuple(range(len(nvml_uuids))))
    entries = [e.strip() for e in raw.split(",")]
    if any(e.startswith("MIG-") and not e.startswith("MIG-GPU-") for e in entries):
        return Allocation(raw, None, "MIG instances: their GPUs cannot be numbered here")
    if nvml_uuids is None:
        indices = []
        for entry in entries:
            index = index_value(entry) if _INDEX.fullmatch(entry) else None
            if index is None or index in indices:
                break
            indices.append(index)
        if len(indices) != len([e for e in entries if e]) and any(e.startswith(("GPU-", "MIG-")) for e in entries):
            return Allocation(raw, None, "GPU UUIDs cannot be matched without NVML")
        return Allocation(raw, tuple(indices), _ignored_note(raw, entries, len(indices)))
    gpus = tuple(cuda_to_nvml({"CUDA_VISIBLE_DEVICES": raw}, nvml_uuids))
    return Allocation(raw, gpus, _ignored_note(raw, entries, len(gpus)))


def _ignored_note(raw: str, entries: list[str], used: int) -> Optional[str]:
    rest = [e for e in entries[used:] if e]
    if not rest:
        return None
    return f"CUDA reads CUDA_VISIBLE_DEVICES={raw!r} up to its first invalid entry ({rest[0]!r}), so the rest is ignored"
