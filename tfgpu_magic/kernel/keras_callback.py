"""A Keras callback that records each epoch's peak allocator memory in the history and TensorBoard.

::

    from tfgpu_magic.keras import MemoryCallback
    history = model.fit(x, y, epochs=5, callbacks=[MemoryCallback(log_dir="logs/memory")])
    history.history["gpu0_peak_bytes"]     # one peak per epoch, in bytes

Keys are ``<device>_peak_bytes`` in the framework's own numbering (TensorFlow's ``gpu0``,
``gpu1``, ...; ``cpu0`` where no GPU is visible and ``TF_CPU_ALLOCATOR_USE_BFC=true`` gave the
CPU allocator statistics).  The framework is the one Keras runs on (``keras.backend.backend()``),
measured through its adapter's peak window; the peak is the most its allocator held during the
epoch, in bytes.  Importing this module imports Keras; ``import tfgpu_magic`` does not.
"""

from __future__ import annotations

from typing import Any

import keras

from ..frameworks.base import PeakWindow
from .session import get_session

__all__ = ["MemoryCallback", "log_key"]


def log_key(device: str) -> str:
    """``GPU:0`` -> ``gpu0_peak_bytes``: a valid Keras log key and TensorBoard tag."""
    return device.replace(":", "").lower() + "_peak_bytes"


def backend_framework(frameworks: Any) -> Any:
    """The adapter of the framework the callbacks' library runs on: the one whose module is its back end."""
    backend = keras.backend.backend()
    for framework in frameworks:
        if framework.module == backend:
            return framework
    raise ValueError(f"the back end {backend!r} has no tfgpu_magic adapter to measure it")


class MemoryCallback(keras.callbacks.Callback):
    """Per-epoch peak of the allocator Keras runs on, in ``logs`` (hence ``History``), and in TensorBoard.

    ``log_dir``: where to write ``memory/<key>`` scalars, one step per epoch (through the
    adapter's ``write_scalars``).  ``framework``: the adapter to measure (default: the kernel's
    adapter of Keras's back end).  Devices without allocator statistics are left out; with none
    at all, nothing is recorded.
    """

    def __init__(self, log_dir: str | None = None, framework: Any = None) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._framework = (
            framework if framework is not None else backend_framework(get_session().frameworks())
        )
        self._framework.attach()  # Keras imported its back end before this callback could exist
        if log_dir and not hasattr(self._framework, "write_scalars"):
            raise ValueError(
                f"log_dir: TensorBoard scalars are written through {self._framework.name}, which cannot"
            )
        self._window: PeakWindow | None = None
        self._writers: dict[str, Any] = {}

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._close()
        self._window = self._framework.open_peak_window()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._window is None:
            return
        peaks = {log_key(device): reading.peak_bytes for device, reading in self._window.peaks().items()}
        self._close()
        if logs is not None:
            logs.update(peaks)  # History runs after user callbacks and copies these
        if self.log_dir and peaks:
            tags = {f"memory/{key}": float(value) for key, value in peaks.items()}
            self._framework.write_scalars(self.log_dir, self._writers, tags, step=epoch)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._close()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None
