"""What every framework adapter shares: the start-up stage, and the record of what CUDA saw.

A framework accepts GPU settings only before it starts; each adapter says where its framework
is (:class:`Stage`), records the environment at the moment CUDA read it, and never imports its
framework: it is handed the module by a post-import hook once the user's import has finished.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["CUDA_ENV", "Capture", "Stage", "capture"]

CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")  # read by CUDA when it starts in the process


class Stage(enum.IntEnum):
    NOT_IMPORTED = 0
    IMPORTED = 1  # imported, no device query yet: CUDA_VISIBLE_DEVICES still works
    ENUMERATED = 2  # CUDA listed the devices (TensorFlow): only tf.config changes visibility now
    STARTED = 3  # the framework's GPU state exists: its GPU settings are frozen

    def describe(self) -> str:
        return {
            Stage.NOT_IMPORTED: "not imported",
            Stage.IMPORTED: "imported, devices not yet enumerated",
            Stage.ENUMERATED: "devices enumerated, runtime not started",
            Stage.STARTED: "started (first op ran); GPU settings are frozen",
        }[self]


@dataclass(frozen=True)
class Capture:
    """Environment variables as they were when a framework (or CUDA) read them.

    ``late`` is True when the moment had passed before tfgpu_magic was loaded, so the values
    are the ones found at load time (the best evidence left).
    """

    env: Mapping[str, Optional[str]]
    late: bool = False

    def get(self, name: str) -> Optional[str]:
        return self.env.get(name)


def capture(names: tuple[str, ...], late: bool = False) -> Capture:
    return Capture({name: os.environ.get(name) for name in names}, late)
