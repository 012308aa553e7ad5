"""The JSON Schema (draft 2020-12) of ``GET {base_url}tfgpu/api/status``'s reply, shipped in the package.

The file's name and its ``$id`` carry the reply's ``version``
(:data:`tfgpu_magic.server.kernel_inventory.VERSION`): ``status-reply.v1.json`` describes every
key a version-1 server sends.  The server's replies are checked against it in the tests, and so
is the JupyterLab extension's reader of the reply (js/lab/reply.ts).  A script can check a reply
it fetched with :func:`reply_problems` (it needs ``jsonschema``, which Jupyter Server installs).
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from ..kernel_inventory import VERSION

__all__ = ["FILE_NAME", "reply_problems", "status_reply_schema"]

FILE_NAME = f"status-reply.v{VERSION}.json"


def status_reply_schema() -> dict[str, Any]:
    """The schema of this version's reply, as a dict."""
    return json.loads(files(__name__).joinpath(FILE_NAME).read_text(encoding="utf-8"))


def reply_problems(reply: Any) -> list[str]:
    """Where ``reply`` breaks the schema, one line each (``$.gpus[0].index: ...``); [] when it conforms."""
    import jsonschema  # only here: the server itself never validates its own replies

    validator = jsonschema.Draft202012Validator(status_reply_schema())
    return sorted(f"{error.json_path}: {error.message}" for error in validator.iter_errors(reply))
