"""The memory panel from Python: a documented, stable entry point.

``open_panel()`` shows the panel ``%gpu monitor`` shows and returns it; ``stop_panels()`` is
``%gpu monitor off``; ``active_sampler()`` and ``sampler_running()`` say whether this kernel samples.
The engine lives in :mod:`tfgpu_magic.kernel.monitor` and the opening in
:mod:`tfgpu_magic.kernel.panels`; these are the same objects, so a sampler started through one
name is seen through the other.
"""

from .kernel.monitor import DeviceSample, Sample, Sampler, active_sampler, sampler_running, stop_panels
from .kernel.panels import open_panel

__all__ = [
    "DeviceSample",
    "Sample",
    "Sampler",
    "active_sampler",
    "open_panel",
    "sampler_running",
    "stop_panels",
]
