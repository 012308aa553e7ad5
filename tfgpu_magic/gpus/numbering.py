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

from ..command.units import format_bytes
from ..records import Record
from ..safe_text import safe

__all__ = [
    "Allocation",
    "InvalidEntry",
    "MigInstance",
    "Reading",
    "allocation_from",
    "cuda_to_nvml",
    "order_is_nvml",
    "read_visible",
    "visible_env_value",
]

_INDEX = r"(?a)[0-9]+"  # for re.fullmatch (compiled at its first use); never str.isdigit: it accepts '²', which int() refuses
MAX_INDEX_DIGITS = (
    9  # no machine has a billion GPUs: a longer index names none (and int() refuses 4,301 digits)
)


def index_value(entry: str) -> int | None:
    """The GPU index an all-digit entry names, as CUDA reads it (leading zeros ignored);
    None when it is too long to name any GPU.  Never int() on the whole: an inherited value
    may hold thousands of digits, which int() refuses with a ValueError."""
    significant = entry.lstrip("0") or "0"
    return int(significant) if len(significant) <= MAX_INDEX_DIGITS else None


def visible_env_value(gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for these nvidia-smi indices; an empty list hides every GPU."""
    return ",".join(str(i) for i in gpus) if gpus else "-1"


def order_is_nvml(env: Mapping[str, str | None]) -> bool:
    return (env.get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID"


SHOWN_CHARS = 40  # an entry echoed back is cut to this many characters (a value may be megabytes)
NOT_AN_ENTRY = "not a GPU index, GPU UUID or MIG instance UUID"


class MigInstance(Record):
    """A MIG instance as NVML lists it under its GPU (what an entry ``MIG-<uuid>`` names)."""

    uuid: str  # "MIG-..."
    gpu: int  # nvidia-smi index of its GPU
    gpu_instance_id: int
    compute_instance_id: int
    total_bytes: int | None = None  # the instance's own memory

    def describe(self) -> str:
        memory = "" if self.total_bytes is None else f", {format_bytes(self.total_bytes)}"
        return f"MIG instance {self.gpu_instance_id}/{self.compute_instance_id} ({self.uuid}{memory})"


class InvalidEntry(Record):
    """The first entry CUDA cannot use: CUDA uses the entries before it and ignores the rest."""

    position: int  # 1 for the first entry
    entry: str  # as shown: control characters escaped, cut to SHOWN_CHARS
    why: str  # "is not a GPU index, ...", "names no GPU (...)", "repeats GPU 1"

    def explain(self, used: str) -> str:
        return (
            f"entry {self.position} ('{self.entry}') {self.why}, so CUDA uses {used}: it uses the entries "
            "before the first invalid one and ignores that entry and everything after it"
        )


class Reading(Record):
    """``CUDA_VISIBLE_DEVICES`` read as CUDA reads it: CUDA's device k is ``gpus[k]``."""

    gpus: tuple[int, ...]  # nvidia-smi index of each CUDA device (a MIG instance: its GPU's)
    mig: tuple[MigInstance | None, ...]  # per CUDA device, the MIG instance an entry named
    invalid: InvalidEntry | None = None  # where CUDA stopped
    unknown: str | None = None  # why the rest cannot be read here (no NVML, no MIG readings)


def shown(text: str, most: int = SHOWN_CHARS) -> str:
    """Someone else's text, safe to echo: control characters escaped, cut to ``most`` characters."""
    return safe(text if len(text) <= most else text[: most - 3] + "...")


def read_visible(
    raw: str | None,
    nvml_uuids: Sequence[str | None] | None,
    mig: Sequence[MigInstance] | None = None,
) -> Reading:
    """Read ``CUDA_VISIBLE_DEVICES`` as CUDA does: entry by entry, up to the first invalid one.

    ``nvml_uuids``: every GPU's UUID in NVML order (None: no NVML, so only indices can be read);
    ``mig``: every MIG instance on the machine (None: unknown, so ``MIG-`` entries cannot be read).
    """
    if raw is None:
        count = len(nvml_uuids or ())
        return Reading(tuple(range(count)), (None,) * count)
    gpus: list[int] = []
    instances: list[MigInstance | None] = []
    for position, entry in enumerate((e.strip() for e in raw.split(",")), start=1):
        found = _read_entry(entry, nvml_uuids, mig)
        if isinstance(found, _Unknown):
            return Reading(tuple(gpus), tuple(instances), unknown=found.why)
        if isinstance(found, str):
            return Reading(tuple(gpus), tuple(instances), InvalidEntry(position, shown(entry), found))
        index, instance = found
        if instance is None and index in gpus and instances[gpus.index(index)] is None:
            return Reading(
                tuple(gpus), tuple(instances), InvalidEntry(position, shown(entry), f"repeats GPU {index}")
            )
        if instance is not None and instance in instances:
            return Reading(
                tuple(gpus),
                tuple(instances),
                InvalidEntry(position, shown(entry), f"repeats {instance.describe()}"),
            )
        gpus.append(index)
        instances.append(instance)
    return Reading(tuple(gpus), tuple(instances))


class _Unknown(Record):
    """An entry that cannot be read without NVML's answer (why)."""

    why: str


def _read_entry(
    entry: str, nvml_uuids: Sequence[str | None] | None, mig: Sequence[MigInstance] | None
) -> tuple[int, MigInstance | None] | str | _Unknown:
    """(GPU, MIG instance or None) for a usable entry; why not (a str) for an invalid one."""
    if re.fullmatch(_INDEX, entry):
        index = index_value(entry)
        if nvml_uuids is None:
            return (index, None) if index is not None else "names no GPU"
        if index is None or index >= len(nvml_uuids):
            return f"names no GPU ({_machine(len(nvml_uuids))})"
        return index, None
    if entry.startswith("MIG-GPU-"):  # legacy MIG form: MIG-GPU-<GPU uuid>/<gi>/<ci>
        return _legacy_mig(entry, nvml_uuids, mig)
    if entry.startswith("MIG-"):
        if mig is None:
            return _Unknown(
                "MIG instances: their GPUs cannot be numbered here (NVML does not list MIG instances)"
            )
        named = [m for m in mig if m.uuid == entry]
        return (named[0].gpu, named[0]) if named else "names no MIG instance on this machine"
    if entry.startswith("GPU-"):
        if nvml_uuids is None:
            return _Unknown("GPU UUIDs cannot be matched without NVML")
        found = _uuid_index(entry, nvml_uuids)
        return (found, None) if isinstance(found, int) else found
    return f"is {NOT_AN_ENTRY}"


def _legacy_mig(
    entry: str, nvml_uuids: Sequence[str | None] | None, mig: Sequence[MigInstance] | None
) -> tuple[int, MigInstance | None] | str | _Unknown:
    parts = entry[4:].split("/")
    if nvml_uuids is None:
        return _Unknown("GPU UUIDs cannot be matched without NVML")
    found = _uuid_index(parts[0], nvml_uuids)
    if not isinstance(found, int):
        return found
    if mig is None:
        return found, None  # the GPU is known; its instances are not
    ids = [index_value(p) if re.fullmatch(_INDEX, p) else None for p in parts[1:]]
    named = [
        m
        for m in mig
        if m.gpu == found and len(ids) == 2 and (m.gpu_instance_id, m.compute_instance_id) == tuple(ids)
    ]
    return (found, named[0]) if named else f"names no MIG instance of GPU {found}"


def _uuid_index(prefix: str, nvml_uuids: Sequence[str | None]) -> int | str:
    # CUDA accepts any unique prefix of a UUID.
    matches = [i for i, u in enumerate(nvml_uuids) if u and u.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    return "is the start of several GPUs' UUIDs" if matches else "is the UUID of no GPU on this machine"


def _machine(count: int) -> str:
    return f"this machine has {count}, numbers 0-{count - 1}" if count else "this machine has none"


def cuda_to_nvml(
    env: Mapping[str, str | None],
    nvml_uuids: Sequence[str | None],
    mig: Sequence[MigInstance] | None = None,
) -> list[int]:
    """nvidia-smi index of each CUDA device, CUDA's device k at position k.

    ``nvml_uuids`` lists every GPU's UUID in NVML order (None where unreadable).  Right when
    CUDA orders devices by PCI bus (``order_is_nvml``), or for GPUs of one model.  MIG
    instances are counted as their parent GPU.
    """
    return list(read_visible(env.get("CUDA_VISIBLE_DEVICES"), nvml_uuids, mig).gpus)


class Allocation(Record):
    """The GPUs the environment gave this kernel: an inherited ``CUDA_VISIBLE_DEVICES``.

    A scheduler (Slurm, Kubernetes' device plugin, a JupyterHub spawner) or an administrator
    set it before the kernel started: tfgpu_magic keeps the kernel inside it.  ``gpus`` are
    nvidia-smi indices, as CUDA will read the value; ``None`` when they cannot be known (no
    NVML to match UUIDs, or MIG instances whose parent GPU is unknown).  ``mig`` are the MIG
    instances it names: on their GPUs, the kernel has the instance, never the whole GPU.
    """

    raw: str | None  # None: nothing inherited, every GPU is allocated
    gpus: tuple[int, ...] | None
    note: str | None = None  # what was odd about the value, for `%gpu`
    invalid: InvalidEntry | None = None  # the first entry CUDA cannot use
    mig: tuple[MigInstance, ...] = ()

    @property
    def restricted(self) -> bool:
        return self.raw is not None

    def describe(self) -> str:
        if self.gpus is None:
            return f"CUDA_VISIBLE_DEVICES='{shown(self.raw or '', 60)}'"
        if not self.gpus:
            return "no GPU"
        if not self.mig:
            return "GPU " + ", ".join(map(str, self.gpus))
        return "; ".join(
            f"GPU {index}" + "".join(f", {m.describe()}" for m in self.mig if m.gpu == index)
            for index in sorted(set(self.gpus), key=self.gpus.index)
        )

    def instances_on(self, index: int) -> tuple[MigInstance, ...]:
        return tuple(m for m in self.mig if m.gpu == index)

    def env_value(self, gpus: Sequence[int]) -> str:
        """``CUDA_VISIBLE_DEVICES`` for these allocated GPUs: a GPU allocated as MIG instances
        keeps their UUIDs (its index would be the whole GPU, other tenants' instances included)."""
        entries: list[str] = []
        for index in gpus:
            instances = self.instances_on(index)
            entries.extend([m.uuid for m in instances] if instances else [str(index)])
        return ",".join(entries) if entries else "-1"


def allocation_from(
    raw: str | None,
    nvml_uuids: Sequence[str | None] | None,
    mig: Sequence[MigInstance] | None = None,
) -> Allocation:
    """Read an inherited ``CUDA_VISIBLE_DEVICES`` the way CUDA will (up to its first invalid entry)."""
    if raw is None:
        return Allocation(None, None if nvml_uuids is None else tuple(range(len(nvml_uuids))))
    reading = read_visible(raw, nvml_uuids, mig)
    if reading.unknown is not None:
        return Allocation(raw, None, reading.unknown)
    gpus = tuple(dict.fromkeys(reading.gpus))  # two instances of one GPU: the GPU once
    instances = tuple(m for m in reading.mig if m is not None)
    allocation = Allocation(raw, gpus, None, reading.invalid, instances)
    if reading.invalid is None:
        return allocation
    note = "CUDA_VISIBLE_DEVICES was set before the kernel started, and its " + reading.invalid.explain(
        allocation.describe()
    )
    return Allocation(raw, gpus, note, reading.invalid, instances)
