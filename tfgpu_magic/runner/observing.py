"""What a run observed, written into its output notebook's metadata.

Two sources, because neither sees everything:

* the **driver's peak** per GPU for the kernel's process tree, sampled by the runner from NVML
  every :data:`SAMPLE_EVERY_S` in a thread of its own (the runner is not a user's kernel, so a
  thread of its may read NVML while cells run); a peak shorter than that can be missed, as the
  record says;
* the **kernel's own observation** at the end, before it is shut down: each imported framework's
  allocator peak, and the GPUs it used (:func:`tfgpu_magic.kernel.notebook_settings.observed`),
  asked as a silent request (a user expression), so the notebook gets no extra cell or output.

Then every ``%gpu save`` output of the run is written into the notebook's metadata in order (the
last one wins, :func:`tfgpu_magic.command.saved.merge_metadata`), and the ``tfgpu`` key, if the
notebook has one, gets this run's ``observed``.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

from ..command import saved
from ..gpus.nvml import Nvml
from ..gpus.process_tree import children_of, descendants, read_parent_map

__all__ = ["SAMPLE_EVERY_S", "DriverPeaks", "Watch", "kernel_pid", "write_saved_keys"]

SAMPLE_EVERY_S = 0.5
ASK_KERNEL_TIMEOUT_S = 30.0
# The keys `%gpu save` writes (saved.MIME_TYPE's bundle); any other key in such an output is ignored.
SAVED_KEYS = (saved.KEY, "accelerator", "colab", "kaggle")
# The kernel's observation as a user expression: a JSON display object, so its data arrives as JSON.
_OBSERVE = (
    "__import__('IPython.display', fromlist=['JSON']).JSON("
    "__import__('tfgpu_magic.kernel.notebook_settings', fromlist=['observed']).observed("
    "__import__('tfgpu_magic.kernel.session', fromlist=['get_session']).get_session(), by={by!r}))"
)


class DriverPeaks:
    """The most memory a process and its descendants held on each GPU, per the driver (NVML)."""

    def __init__(self, nvml: Nvml, pid: int | None, every_s: float = SAMPLE_EVERY_S) -> None:
        self.nvml = nvml
        self.pid = pid
        self.every_s = every_s
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfgpu-run-driver-peaks", daemon=True)

    def start(self) -> DriverPeaks:
        if self.pid is not None:
            self._thread.start()
        return self

    def stop(self) -> dict[int, int]:
        """Stop sampling (one last sample first: a short notebook gets at least one); the peaks."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()
        return dict(self.peaks)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        """One look: the tree's memory on each GPU; a failed reading is no figure, never an error."""
        if self.pid is None:
            return
        try:
            tree = {self.pid, *descendants(self.pid, children_of(read_parent_map()[0]))}
            count = self.nvml.device_count()
        except Exception:
            return
        for index in range(count):
            try:
                listed = self.nvml.processes(index)
            except Exception:
                continue
            used = sum(p.used_memory_bytes or 0 for p in listed if p.pid in tree)
            if used:
                self.peaks[index] = max(used, self.peaks.get(index, 0))
        self.samples += 1


def kernel_pid(client: Any) -> int | None:
    """The kernel's process id, from jupyter_client's local provisioner (None for a remote kernel)."""
    pid = getattr(getattr(getattr(client, "km", None), "provisioner", None), "pid", None)
    return pid if isinstance(pid, int) else None


class Watch:
    """One run's observation: started when the kernel is, finished before it is shut down."""

    def __init__(self, nvml: Nvml, by: str) -> None:
        self.nvml = nvml
        self.by = by
        self.peaks: DriverPeaks | None = None
        self.kernel: dict[str, Any] | None = None
        self.why_not: str | None = "the kernel was not asked (the run stopped first)"
        self.driver_peaks: dict[int, int] = {}

    def started(self, client: Any) -> None:
        self.peaks = DriverPeaks(self.nvml, kernel_pid(client)).start()

    def finish(self, client: Any | None) -> None:
        """Ask the kernel for its observation (``client`` None: it cannot be asked), stop sampling."""
        if client is not None:
            self.kernel, self.why_not = ask_kernel(client, self.by)
        if self.peaks is not None:
            self.driver_peaks = self.peaks.stop()

    def observed(self) -> dict[str, Any]:
        """The ``observed`` value for the notebook's ``tfgpu`` key."""
        found: dict[str, Any] = dict(self.kernel) if self.kernel is not None else {"by": self.by}
        found["at"] = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
        found.setdefault("allocator_peak_bytes", {})
        if self.kernel is None:
            found["allocator_note"] = f"no allocator peaks: {self.why_not}"
        gpus = [dict(gpu) for gpu in found.get("gpus", []) if isinstance(gpu, dict)]
        listed = {gpu.get("index") for gpu in gpus}
        gpus += [self._gpu(index) for index in sorted(self.driver_peaks) if index not in listed]
        for gpu in gpus:
            gpu["driver_peak_bytes"] = self.driver_peaks.get(gpu.get("index", -1))
        found["gpus"] = sorted(gpus, key=lambda gpu: gpu.get("index", -1))
        found["driver"] = self._driver_text()
        return found

    def _gpu(self, index: int) -> dict[str, Any]:
        try:
            info = self.nvml.gpu(index)
        except Exception:
            return {"index": index}
        total = None if info.memory is None else info.memory.total_bytes
        return {"index": index, "model": info.name, "total_bytes": total}

    def _driver_text(self) -> str:
        samples = self.peaks.samples if self.peaks is not None else 0
        if not samples:
            return "the kernel's memory per the driver was not measured (no NVML reading, or no local kernel process)"
        return (
            f"driver_peak_bytes: the most the kernel's processes held per the driver (NVML), sampled by "
            f"{self.by} every {SAMPLE_EVERY_S:g} s ({samples} sample{'s' if samples != 1 else ''}; a shorter "
            "peak can be missed); "
            "driver_bytes: the kernel's own figure at the end"
        )


def ask_kernel(
    client: Any, by: str, timeout: float = ASK_KERNEL_TIMEOUT_S
) -> tuple[dict[str, Any] | None, str]:
    """The kernel's own observation, or None and why not (no extension loaded, no answer)."""
    from nbclient.util import run_sync

    try:
        reply = run_sync(_ask)(client.kc, _OBSERVE.format(by=by), timeout)
    except Exception as err:
        return None, f"the kernel did not answer ({type(err).__name__})"
    answer = reply.get("content", {}).get("user_expressions", {}).get("tfgpu", {})
    if answer.get("status") != "ok":
        return None, f"the kernel could not say ({answer.get('ename')}: {answer.get('evalue')})"
    value = answer.get("data", {}).get("application/json")
    if not isinstance(value, dict):
        return None, "the kernel's answer was not JSON"
    return value, ""


async def _ask(kc: Any, expression: str, timeout: float) -> dict[str, Any]:
    msg_id = kc.execute("", silent=True, store_history=False, user_expressions={"tfgpu": expression})
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply")
        reply: dict[str, Any] = await kc.get_shell_msg(timeout=left)
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return reply


def write_saved_keys(nb: Any) -> int:
    """Every ``%gpu save`` output's keys written into the notebook's metadata, in order; how many."""
    import nbformat

    count = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            keys = output.get("data", {}).get(saved.MIME_TYPE) if isinstance(output, dict) else None
            if not isinstance(keys, dict):
                continue
            update = {key: value for key, value in keys.items() if key in SAVED_KEYS}
            try:  # what a front end would refuse is not written: no settings key, or a malformed one
                if saved.read(update) is None:
                    continue
            except saved.SettingsError:
                continue
            nb.metadata = nbformat.from_dict(saved.merge_metadata(dict(nb.metadata), update))
            count += 1
    return count


def write_observed(nb: Any, watch: Watch) -> bool:
    """This run's ``observed`` into the notebook's ``tfgpu`` key, where it has one; whether it had."""
    import nbformat

    value = nb.metadata.get(saved.KEY)
    if not isinstance(value, dict):
        return False
    nb.metadata[saved.KEY] = nbformat.from_dict({**value, "observed": watch.observed()})
    return True
