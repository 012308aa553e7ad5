"""``tfgpu_magic.simulated``, a documented entry point: the simulated shared server (SimulatedNvml, shared_server, kernels_server, host_kernels_server, ...).

The module lives in :mod:`tfgpu_magic.gpus.simulated`; this name is the same module object (not a
copy), so its state and anything patched on it are shared by both names.
"""

import sys

from .gpus import simulated as _module

sys.modules[__name__] = _module
