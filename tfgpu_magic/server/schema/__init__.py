"""The JSON Schema (draft 2020-12) of ``GET {base_url}tfgpu/api/status``'s reply, shipped in the package.

The file's name and its ``$id`` carry the reply's ``version``
(:data:`tfgpu_magic.server.kernel_inventory.VERSION`): ``status-reply.v1.json`` describes every
key a version-1 server sends.  The server's replies are checked against it in the tests, and so
is the JupyterLab extension's reader of the reply (js/lab/reply.ts).  A script can check a reply
it fetched against :func:`status_reply_schema` with any draft 2020-12 validator (``jsonschema``).
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from ..kernel_inventory import VERSION

__all__ = ["FILE_NAME", "status_reply_schema"]

FILE_NAME = f"status-reply.v{VERSION}.json"


def status_reply_schema() -> dict[str, Any]:
    """The schema of this version's reply, as a dict."""
    return json.loads(files(__name__).joinpath(FILE_NAME).read_text(encoding="utf-8"))
