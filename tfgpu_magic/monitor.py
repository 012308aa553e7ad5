"""``tfgpu_magic.monitor``, a documented entry point: the memory panel (open_panel, active_sampler, sampler_running, ...).

The module lives in :mod:`tfgpu_magic.kernel.monitor`; this name is the same module object (not a
copy), so its state and anything patched on it are shared by both names.
"""

import sys

from .kernel import monitor as _module

sys.modules[__name__] = _module
