"""A Keras callback that records each epoch's peak allocator memory in the history and TensorBoard.

::

    from tfgpu_magic.keras import MemoryCallback
    history = model.fit(x, y, epochs=5, callbacks=[MemoryCallback(log_dir="logs/memory")])
    history.history["gpu0_peak_bytes"]     # one peak per epoch, in bytes

Keys are ``<device>_peak_bytes`` in TensorFlow's numbering (``gpu0``, ``gpu1``, ...; ``cpu0``
where no GPU is visible and ``TF_CPU_ALLOCATOR_USE_BFC=true`` gave the CPU allocator statistics).
The peak is the most TensorFlow's allocator held during the epoch, in bytes.  Importing this
module imports Keras; ``import tfgpu_magic`` does not.
"""

from __future__ import annotations

from typing import Any, Optional

import keras

from ..frameworks.tensorflow import PeakWindow, TensorFlow
from .session import get_session

__all__ = ["MemoryCallback", "log_key"]


def log_key(device: str) -> str:
    """``GPU:0`` -> ``gpu0_peak_bytes``: a valid Keras log key and TensorBoard tag."""
    return device.replace(":", "").lower() + "_peak_bytes"


class MemoryCallback(keras.callbacks.Callback):
    """Per-epoch peak of TensorFlow's allocator in ``logs`` (hence ``History``), and in TensorBoard.

    ``log_dir``: where to write ``memory/<key>`` scalars (``tf.summary``), one step per epoch.
    Devices without allocator statistics are left out; with none at all, nothing is recorded.
    """

    def __init__(self, log_dir: Optional[str] = None, tf: Optional[TensorFlow] = None) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._tf = tf if tf is not None else get_session().tf  # the kernel's adapter
        self._tf.attach()  # Keras imported TensorFlow before this callback could exist
        self._window: Optional[PeakWindow] = None
        self._writers: dict[str, Any] = {}

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._close()
        self._window = self._tf.open_peak_window()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self._window is None:
            return
        peaks = {log_key(device): stats.peak_bytes for device, (_, stats) in self._window.read().items()}
        self._close()
        if logs is not None:
            logs.update(peaks)  # History runs after user callbacks and copies these
        if self.log_dir and peaks:
            tags = {f"memory/{key}": float(value) for key, value in peaks.items()}
            self._tf.write_scalars(self.log_dir, self._writers, tags, step=epoch)

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        self._close()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None
