"""The old name of :mod:`tfgpu_magic.simulated`, kept so notebooks written against it still run."""

from .simulated import SimulatedGpu as FakeGpu
from .simulated import SimulatedNvml as FakeNvml
from .simulated import SimulatedProcess as FakeProcess
from .simulated import busy_server, shared_server

__all__ = ["FakeGpu", "FakeNvml", "FakeProcess", "busy_server", "shared_server"]
