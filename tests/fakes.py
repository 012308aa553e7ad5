"""Test-only helpers around the simulated server (they do not ship in the package)."""

from __future__ import annotations

from typing import Optional

from tfgpu_magic.inventory import OwnerLookupTable
from tfgpu_magic.simulated import SimulatedNvml


def fake_process_table(server: SimulatedNvml, me: str = "me", my_pid: Optional[int] = None) -> OwnerLookupTable:
    """The simulated server's process table (``owner_of``) as an ``inventory.ProcessTable``."""
    return OwnerLookupTable(server.owner_of, me=me, my_pid=my_pid)
