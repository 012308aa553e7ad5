"""Peak GPU memory per epoch in Keras: a documented, stable entry point.

``MemoryCallback`` logs each device's peak memory after every epoch under the key ``log_key(device)``.
Importing this module imports Keras (``import tfgpu_magic`` never does).  The callback lives in
:mod:`tfgpu_magic.kernel.keras_callback`; these are the same objects.
"""

from .kernel.keras_callback import MemoryCallback, log_key

__all__ = ["MemoryCallback", "log_key"]
