"""The first look at a notebook file for saved settings: bounded, never through a link, never
blocking, and no parse unless the ``tfgpu`` key is in its bytes.

Standard library only and nothing else of ours, so ``%load_ext`` can ask whether the notebook
holds settings without importing the command language (:func:`tfgpu_magic.kernel.magics.load`);
:func:`tfgpu_magic.command.saved.metadata_from_file` parses what this returns.
"""

from __future__ import annotations

import os
import stat

__all__ = ["KEY", "MAX_NOTEBOOK_BYTES", "keyed_bytes"]

KEY = "tfgpu"  # the notebook metadata key
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024  # a larger notebook is not read at a kernel's start

_KEY_AS_WRITTEN = f'"{KEY}"'.encode()


def keyed_bytes(path: str) -> bytes | None:
    """The bytes of the notebook file at ``path`` when they hold the ``tfgpu`` key; None for a file
    that is gone, a link, not a regular file (a FIFO would block the open), larger than
    :data:`MAX_NOTEBOOK_BYTES`, or without the key (most notebooks: read, not parsed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_NOTEBOOK_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw if _KEY_AS_WRITTEN in raw and len(raw) <= MAX_NOTEBOOK_BYTES else None
