"""A notebook's saved GPU settings from a script: the ``tfgpu`` metadata key (version 1).

``read(notebook["metadata"])`` gives the settings ``%gpu save`` wrote (None when there are none),
or raises :class:`SettingsError` with one line; ``merge_metadata`` writes a ``%gpu save`` output's
keys (its :data:`MIME_TYPE` data) into a notebook's metadata as the front end and ``tfgpu run`` do.
The format: docs/notebook-settings.md; its JSON Schema ships as
``tfgpu_magic/command/schema/notebook-settings.v1.json``.  The objects live in
:mod:`tfgpu_magic.command.saved`.
"""

from .command.saved import (
    KEY,
    MIME_TYPE,
    VERSION,
    NotebookSettings,
    Requirements,
    SettingsError,
    accelerator_keys,
    merge_metadata,
    read,
)

__all__ = [
    "KEY",
    "MIME_TYPE",
    "VERSION",
    "NotebookSettings",
    "Requirements",
    "SettingsError",
    "accelerator_keys",
    "merge_metadata",
    "read",
]
