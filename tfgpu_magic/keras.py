"""``tfgpu_magic.keras``, a documented entry point: the Keras MemoryCallback.

The module lives in :mod:`tfgpu_magic.kernel.keras_callback`; this name is the same module object (not a
copy), so its state and anything patched on it are shared by both names.
"""

import sys

from .kernel import keras_callback as _module

sys.modules[__name__] = _module
