"""``tfgpu_magic.claims``, a documented entry point (tutorial 02 claims a GPU from a script with it).

The module lives in :mod:`tfgpu_magic.gpus.claims`; this name is the same module object (not a
copy), so its state and anything patched on it are shared by both names.
"""

import sys

from .gpus import claims as _module

sys.modules[__name__] = _module
