"""The platform's share of each GPU: memory a scheduler or a sharing layer granted this kernel.

Not to be confused with :mod:`tfgpu_magic.kernel.shares`, which divides the kernel's *own* limit
between its frameworks.  A platform share is set from outside the kernel, before it started, and
is read from the environment the kernel *inherited* (``Machine.inherited_environment``), once;
``%gpu``, the panel, the server's reply and ``/metrics`` read that record.

Sources, tightest first when several grant the same GPU (sharing.md has the references):

* **MIG**: a MIG instance's memory; the hardware enforces it (hard).
* **MPS**: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=6G,1=4G``, or one value for every device),
  or the control daemon's default pinned limit when its pipe directory is there; the MPS server
  fails allocations above it (hard).
* **HAMi**: ``CUDA_DEVICE_MEMORY_LIMIT`` / ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (``4g``, ``4096m``),
  enforced by ``libvgpu.so`` loaded into this very process.  It intercepts CUDA's allocation calls,
  so it holds for the frameworks, but code that reaches the driver another way is not held and
  the driver itself knows nothing of it: labelled soft, with HAMi named as the one enforcing it,
  because "hard" here means what neither this process nor its libraries can exceed.
* **Alibaba gpushare**: ``ALIYUN_COM_GPU_MEM_CONTAINER`` (granted) of ``ALIYUN_COM_GPU_MEM_DEV``
  (the device), in GiB (or MiB, told apart by the figures' size: no GPU has 1024 GiB); it
  schedules by this figure and isolates nothing (soft: cooperative).
* **Slurm**: ``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS`` name the node's GPU indices.  Whole GPUs:
  each allocated GPU's share is its memory.  Under a device cgroup CUDA and NVML renumber the
  job's GPUs from 0, so the node's indices are matched to NVML's only when NVML sees the whole
  node; under the cgroup every GPU NVML sees is the job's.  Each share is keyed by the GPU's UUID,
  never by a node index.

Nothing here opens the MPS control FIFO: the pipe directory is checked with ``lstat`` (a planted
link is not followed), and the daemon's default is asked of ``nvidia-cuda-mps-control`` only when
that binary is on the PATH, with a timeout.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ..records import Record
from . import numbering

__all__ = [
    "MPS_LIMIT_ENV",
    "SHARE_VARIABLES",
    "GpuFacts",
    "MpsPipe",
    "PlatformShare",
    "ShareRecord",
    "SlurmGpus",
    "inherited_variables",
    "may_grant_a_share",
    "mps_pipe",
    "mps_pipe_directory",
    "parse_amount",
    "read_shares",
    "slurm_gpus",
]

MIB = 1024**2
GIB = 1024**3
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_CONTROL_TIMEOUT_S = 2.0
HAMI_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT"
ALIYUN_CONTAINER_ENV = "ALIYUN_COM_GPU_MEM_CONTAINER"
ALIYUN_DEVICE_ENV = "ALIYUN_COM_GPU_MEM_DEV"
SLURM_ENVS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")  # the step's GPUs, when set, are the narrower
# The variables read, as the kernel inherited them (HAMi's per-device names end in ``_<i>``).
SHARE_VARIABLES = (
    MPS_LIMIT_ENV,
    MPS_PIPE_ENV,
    HAMI_LIMIT_ENV,
    ALIYUN_CONTAINER_ENV,
    ALIYUN_DEVICE_ENV,
    *SLURM_ENVS,
)
SHOWN_CHARS = 40  # an inherited value echoed back is cut to this (a neighbour may plant megabytes)

# Patterns for re.fullmatch, compiled at their first use (re's own cache): most processes have no share to read.
_AMOUNT = r"(?ai)([0-9]{1,15})(?:\.([0-9]{1,6}))?\s*([kmgt]?)(i?b?)"
_NUMBER = r"(?a)[0-9]{1,12}"  # int() of a planted 5,000-digit value would raise
_UNIT = {"": 1, "k": 1024, "m": MIB, "g": GIB, "t": 1024**4}


class GpuFacts(Record):
    """One GPU as NVML numbers it: what matching a share to it needs."""

    index: int  # nvidia-smi's
    uuid: str | None
    total_bytes: int | None


class PlatformShare(Record):
    """The memory the platform granted this kernel on one GPU, and who holds it to that."""

    gpu: int  # nvidia-smi index when read (the record is keyed by ``uuid`` where NVML gave one)
    uuid: str | None
    bytes: int
    source: str  # "MIG", "MPS", "HAMi", "Alibaba gpushare", "Slurm"
    hard: bool  # True only where neither this process nor its libraries can exceed it
    enforced_by: str  # who enforces it, in words
    evidence: str  # the variable (or reading) it came from, as ``NAME=value``

    @property
    def label(self) -> str:
        """``hard (MPS)``, ``soft (Alibaba gpushare)``: the word every report uses."""
        return f"{'hard' if self.hard else 'soft'} ({self.source})"

    def short(self) -> str:
        """ "4 GiB, set by HAMi: CUDA_DEVICE_MEMORY_LIMIT=4g": the share and its source."""
        return f"{_format(self.bytes)}, set by {self.source}: {self.evidence}"

    def describe(self) -> str:
        """One line: "4 GiB, set by HAMi (CUDA_DEVICE_MEMORY_LIMIT=4g), enforced by ..."."""
        return f"{_format(self.bytes)} share, set by {self.source} ({self.evidence}); {self.label}: {self.enforced_by}"

    def as_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "bytes": self.bytes,
            "source": self.source,
            "hard": self.hard,
            "label": self.label,
            "enforced_by": self.enforced_by,
            "evidence": self.evidence,
        }


class ShareRecord:
    """The shares of one process's inherited environment (a Jupyter server's, read at its start),
    made the first time the GPUs are known and kept: each reading shows the record."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.variables = inherited_variables(environ)
        # MPS's and HAMi's device numbers are CUDA's under this inherited value (the kernels inherit it too)
        self.visible_devices = environ.get("CUDA_VISIBLE_DEVICES")
        self._made: tuple[tuple[str | None, ...], dict[int, PlatformShare]] | None = None

    def shares(self, gpus: Sequence[GpuFacts]) -> dict[int, PlatformShare]:
        """Each GPU's share; made again only if the GPUs themselves changed (their UUIDs)."""
        key = tuple(g.uuid for g in gpus)
        made = self._made
        if made is None or made[0] != key:
            cuda_map = None
            if self.visible_devices is not None:
                cuda_map = numbering.cuda_to_nvml({"CUDA_VISIBLE_DEVICES": self.visible_devices}, list(key))
            made = (key, read_shares(self.variables, gpus, cuda_map))
            self._made = made
        return made[1]


def inherited_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables :func:`read_shares` reads, copied from ``environ`` (the kernel's at its start)."""
    prefix = HAMI_LIMIT_ENV + "_"
    return {
        name: value
        for name, value in environ.items()
        if name in SHARE_VARIABLES or (name.startswith(prefix) and name[len(prefix) :].isdigit())
    }


def may_grant_a_share(environ: Mapping[str, str | None], cuda_visible_devices: str | None) -> bool:
    """Whether the inherited variables could grant a share (checked without NVML): a share
    variable, a MIG instance in ``CUDA_VISIBLE_DEVICES``, or an MPS daemon's pipe (lstat only)."""
    if any(value for name, value in environ.items() if name != MPS_PIPE_ENV):
        return True
    if cuda_visible_devices and "MIG-" in cuda_visible_devices:
        return True
    return mps_pipe(environ) is not None


def parse_amount(text: str, bare: int = 1) -> int | None:
    """``4g``, ``4096m``, ``6G``, ``1.5GiB``, ``512MB`` -> bytes (binary units); a bare number
    counts ``bare`` bytes each.  None for anything else (an inherited value is never trusted)."""
    match = re.fullmatch(_AMOUNT, text.strip())
    if not match:
        return None
    whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3).lower()
    scale = _UNIT[unit] if unit else bare
    if match.group(4) and not unit and match.group(4).lower() != "b":
        return None  # "4i"
    value = (
        int(whole) * scale + (int(fraction) * scale) // 10 ** len(fraction)
        if fraction
        else int(whole) * scale
    )
    return value if value > 0 else None


def read_shares(
    environ: Mapping[str, str | None],
    gpus: Sequence[GpuFacts],
    cuda_map: Sequence[int] | None = None,
    mig_bytes: Mapping[int, int] | None = None,
    ask_mps_daemon: bool = True,
) -> dict[int, PlatformShare]:
    """Each GPU's platform share (nvidia-smi index -> the tightest one), read from ``environ``,
    the environment the kernel inherited.

    ``gpus``: every GPU NVML sees.  ``cuda_map``: nvidia-smi index of each CUDA device as CUDA
    numbers them under the inherited ``CUDA_VISIBLE_DEVICES`` (MPS's and HAMi's device numbers are
    CUDA's); identity when omitted.  ``mig_bytes``: the memory of the MIG instance this kernel was
    allocated on a GPU (the tightest when several).  ``ask_mps_daemon``: ask the MPS control
    daemon its default when its pipe directory is there (tests turn it off or put a fake on PATH).
    A public entry point: ``%gpu doctor`` reads the same record.
    """
    by_index = {g.index: g for g in gpus}
    cuda = list(cuda_map) if cuda_map is not None else [g.index for g in gpus]
    found: list[PlatformShare] = []
    for index, size in (mig_bytes or {}).items():
        if index in by_index:
            found.append(
                _share(by_index[index], size, "MIG", True, "the GPU (a MIG instance)", "MIG instance")
            )
    found += _mps(environ, by_index, cuda, ask_mps_daemon)
    found += _hami(environ, by_index, cuda)
    found += _aliyun(environ, gpus, cuda)
    found += _slurm(environ, gpus)
    tightest: dict[int, PlatformShare] = {}
    for share in found:
        held = tightest.get(share.gpu)
        if held is None or (share.bytes, not share.hard) < (held.bytes, not held.hard):
            tightest[share.gpu] = share
    return tightest


def _share(
    gpu: GpuFacts, size: int, source: str, hard: bool, enforced_by: str, evidence: str
) -> PlatformShare:
    if gpu.total_bytes:  # a share above the GPU's memory grants the whole GPU, no more
        size = min(size, gpu.total_bytes)
    return PlatformShare(gpu.index, gpu.uuid, size, source, hard, enforced_by, evidence)


def _evidence(name: str, value: str) -> str:
    shown = value if len(value) <= SHOWN_CHARS else value[: SHOWN_CHARS - 3] + "..."
    return f"{name}={''.join(c if c.isprintable() else '?' for c in shown)}"


def _per_device(value: str) -> dict[int | None, int] | None:
    """``6G`` (every device: key None) or ``0=6G,1=4G``; None when unreadable."""
    if "=" not in value:
        size = parse_amount(value)
        return None if size is None else {None: size}
    found: dict[int | None, int] = {}
    for part in value.split(",")[:64]:
        device, _, amount = part.partition("=")
        size = parse_amount(amount)
        if not re.fullmatch(_NUMBER, device.strip()) or size is None:
            return None
        found[int(device.strip())] = size
    return found


def _on_cuda_devices(
    sizes: dict[int | None, int], by_index: Mapping[int, GpuFacts], cuda: Sequence[int]
) -> list[tuple[GpuFacts, int]]:
    if None in sizes:
        return [(by_index[i], sizes[None]) for i in dict.fromkeys(cuda) if i in by_index]
    return [
        (by_index[cuda[k]], size)
        for k, size in sizes.items()
        if k is not None and k < len(cuda) and cuda[k] in by_index
    ]


# -- MPS ------------------------------------------------------------------------------------------
MPS_ENFORCED = "the MPS server fails allocations above it"


def _mps(
    environ: Mapping[str, str | None], by_index: Mapping[int, GpuFacts], cuda: Sequence[int], ask: bool
) -> list[PlatformShare]:
    value = environ.get(MPS_LIMIT_ENV)
    if value:
        sizes = _per_device(value)
        if sizes is not None:
            evidence = _evidence(MPS_LIMIT_ENV, value)
            return [
                _share(g, s, "MPS", True, MPS_ENFORCED, evidence)
                for g, s in _on_cuda_devices(sizes, by_index, cuda)
            ]
    if not ask or mps_pipe_directory(environ) is None:
        return []
    found = []
    for k, index in enumerate(cuda):
        try:
            size = _mps_daemon_default(k)
        except _NoAnswer:  # it will not answer the next device either: one timeout, not one per GPU
            break
        if size is not None and index in by_index:
            evidence = f"the MPS control daemon's default pinned limit (device {k})"
            found.append(_share(by_index[index], size, "MPS", True, MPS_ENFORCED, evidence))
    return found


class MpsPipe(NamedTuple):
    """An MPS control daemon's pipe, as lstat saw it."""

    directory: str
    owner_uid: int


def mps_pipe(environ: Mapping[str, str | None], me: int | None = None) -> MpsPipe | None:
    """The MPS control pipe when a daemon appears to run there: a real directory (not a link)
    holding a FIFO named ``control``, both owned by root or by ``me`` (this user by default).

    Checked with lstat only: the FIFO is never opened (an open blocks until the daemon answers).
    Anyone may create /tmp/nvidia-mps, so a directory or FIFO of another user proves nothing: a
    neighbour's planted FIFO must not make a limit be called hard."""
    directory = environ.get(MPS_PIPE_ENV) or MPS_DEFAULT_PIPE_DIRECTORY
    trusted = {0, os.getuid() if me is None else me}
    try:
        folder = os.lstat(directory)
        pipe = os.lstat(os.path.join(directory, "control"))
    except (OSError, ValueError):  # absent, unreadable, or a name with a NUL
        return None
    if not (stat.S_ISDIR(folder.st_mode) and stat.S_ISFIFO(pipe.st_mode)):
        return None
    if folder.st_uid not in trusted or pipe.st_uid not in trusted:
        return None
    return MpsPipe(directory, pipe.st_uid)


def mps_pipe_directory(environ: Mapping[str, str | None]) -> str | None:
    """The directory of :func:`mps_pipe`, or None."""
    found = mps_pipe(environ)
    return None if found is None else found.directory


class _NoAnswer(Exception):
    """The control binary could not be run, or did not answer within the timeout."""


def _mps_daemon_default(device: int) -> int | None:
    """The control daemon's default pinned memory limit for CUDA device ``device``; None when no
    control binary or no limit set; :class:`_NoAnswer` when it cannot be run or does not answer
    within the timeout."""
    import shutil  # only where an MPS pipe directory is there
    import subprocess

    binary = shutil.which(MPS_CONTROL)
    if binary is None:
        return None
    try:
        answer = subprocess.run(
            [binary],
            input=f"get_default_device_pinned_mem_limit {device}\n",
            capture_output=True,
            text=True,
            timeout=MPS_CONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        raise _NoAnswer from None
    words = answer.stdout.strip()[:64].split()
    return parse_amount(words[-1]) if answer.returncode == 0 and words else None


# -- HAMi -----------------------------------------------------------------------------------------
# libvgpu.so intercepts CUDA's allocation calls in this process: the frameworks are held, but code
# that reaches the driver another way is not, and the driver itself does not know the limit.
HAMI_ENFORCED = "HAMi's libvgpu.so in this process; direct driver calls bypass it"


def _hami(
    environ: Mapping[str, str | None], by_index: Mapping[int, GpuFacts], cuda: Sequence[int]
) -> list[PlatformShare]:
    found = []
    common = environ.get(HAMI_LIMIT_ENV)
    for k, index in enumerate(cuda):
        if index not in by_index:
            continue
        name = f"{HAMI_LIMIT_ENV}_{k}"
        value = environ.get(name)
        if not value:
            name, value = HAMI_LIMIT_ENV, common
        size = parse_amount(value, bare=1) if value else None
        if size is not None and value is not None:
            found.append(_share(by_index[index], size, "HAMi", False, HAMI_ENFORCED, _evidence(name, value)))
    return found


# -- Alibaba gpushare -----------------------------------------------------------------------------
ALIYUN_ENFORCED = "nobody: gpushare schedules by it and isolates nothing"


def _aliyun(
    environ: Mapping[str, str | None], gpus: Sequence[GpuFacts], cuda: Sequence[int]
) -> list[PlatformShare]:
    granted = environ.get(ALIYUN_CONTAINER_ENV)
    if not granted or not re.fullmatch(_NUMBER, granted.strip()):
        return []
    device = environ.get(ALIYUN_DEVICE_ENV) or ""
    found = []
    for gpu in gpus:
        if gpu.index not in cuda:
            continue
        size = int(granted.strip()) * _aliyun_unit(device.strip(), int(granted.strip()))
        if size > 0:
            found.append(
                _share(
                    gpu,
                    size,
                    "Alibaba gpushare",
                    False,
                    ALIYUN_ENFORCED,
                    _evidence(ALIYUN_CONTAINER_ENV, granted),
                )
            )
    return found


def _aliyun_unit(device: str, granted: int) -> int:
    """GiB, unless the figures count MiB (``--memory-unit=MiB``): no GPU has 1024 GiB, so a device
    (or, without ``ALIYUN_COM_GPU_MEM_DEV``, a grant) of more than 1024 units counts MiB."""
    figure = int(device) if re.fullmatch(_NUMBER, device) else granted
    return MIB if figure > 1024 else GIB


# -- Slurm ----------------------------------------------------------------------------------------
class SlurmGpus(NamedTuple):
    """A Slurm job's GPUs as the node numbers them."""

    variable: str  # SLURM_STEP_GPUS, else SLURM_JOB_GPUS
    value: str
    node_indices: tuple[int, ...] | None  # None: not a list of indices


def slurm_gpus(environ: Mapping[str, str | None]) -> SlurmGpus | None:
    """The job's GPUs from Slurm's variable (the step's, the narrower, when set)."""
    name, value = next(((n, environ.get(n)) for n in SLURM_ENVS if environ.get(n)), ("", None))
    if not value:
        return None
    entries = [e.strip() for e in value.split(",")[:1024]]
    indices = (
        tuple(sorted({int(e) for e in entries})) if all(re.fullmatch(_NUMBER, e) for e in entries) else None
    )
    return SlurmGpus(name, value, indices)


def _slurm(environ: Mapping[str, str | None], gpus: Sequence[GpuFacts]) -> list[PlatformShare]:
    job_gpus = slurm_gpus(environ)
    if job_gpus is None or not job_gpus.node_indices:
        return []
    name, value, node = job_gpus.variable, job_gpus.value, list(job_gpus.node_indices)
    seen = sorted(g.index for g in gpus)
    if not seen:
        return []
    if len(seen) == len(node) and seen[-1] < node[-1]:
        # A device cgroup: NVML sees only the job's GPUs, renumbered from 0 in the node's order.
        job = dict(zip(node, seen, strict=True))
        enforced = "Slurm's device cgroup (other GPUs cannot be opened)"
        hard = True
    else:
        job = {i: i for i in node if i in seen}
        enforced = "nobody: no device cgroup, the other GPUs stay reachable"
        hard = False
    by_index = {g.index: g for g in gpus}
    evidence = _evidence(name, value)
    return [
        _share(by_index[i], by_index[i].total_bytes or 0, "Slurm", hard, enforced, evidence)
        for i in job.values()
        if by_index[i].total_bytes
    ]


def _format(size: int) -> str:
    if size % GIB == 0 or size >= 10 * GIB:
        return f"{size / GIB:g} GiB" if size % GIB == 0 else f"{size / GIB:.1f} GiB"
    return f"{size // MIB} MiB"
