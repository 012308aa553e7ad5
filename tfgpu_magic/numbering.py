"""GPU numbering: NVML's indices (what nvidia-smi shows, what ``%gpu use`` takes) versus CUDA's.

CUDA numbers the GPUs it sees from 0, in ``CUDA_DEVICE_ORDER`` (FASTEST_FIRST by default),
after filtering by ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, read up to the first invalid
entry).  tfgpu_magic sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's own order, so that with it
CUDA's device k is the k-th entry of the visible list.  Pure functions, no NVML, no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

__all__ = ["cuda_to_nvml", "order_is_nvml", "visible_env_value"]


def visible_env_value(gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for these NVML indices; an empty list hides every GPU."""
    return ",".join(str(i) for i in gpus) if gpus else "-1"


def order_is_nvml(env: Mapping[str, str]) -> bool:
    return env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").upper() == "PCI_BUS_ID"


def cuda_to_nvml(env: Mapping[str, str], nvml_uuids: Sequence[Optional[str]]) -> list[int]:
    """NVML index of each CUDA device, CUDA's device k at position k.

    ``nvml_uuids`` lists every GPU's UUID in NVML order (None where unreadable).  Without
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` the result is right only for GPUs of one model
    (FASTEST_FIRST then ties on bus order); callers warn about that case.
    """
    count = len(nvml_uuids)
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    result: list[int] = []
    for entry in (e.strip() for e in raw.split(",")):
        index = _entry_index(entry, nvml_uuids)
        if index is None or index in result:
            break  # CUDA stops at the first invalid entry
        result.append(index)
    return result


def _entry_index(entry: str, nvml_uuids: Sequence[Optional[str]]) -> Optional[int]:
    if entry.isdigit():
        index = int(entry)
        return index if index < len(nvml_uuids) else None
    if entry.startswith("GPU-"):
        # CUDA accepts any unique prefix of a UUID.
        matches = [i for i, u in enumerate(nvml_uuids) if u and u.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None
