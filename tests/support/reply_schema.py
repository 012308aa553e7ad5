"""Every reply the server builds, checked against the shipped JSON Schema of ``GET tfgpu/api/status``.

A test module opts in with an autouse fixture::

    @pytest.fixture(autouse=True)
    def _replies_follow_the_schema(monkeypatch):
        yield from replies_follow_the_schema(monkeypatch)

Then each reply :func:`~tfgpu_magic.server.kernel_inventory.inventory` or ``unavailable`` returns
(as JSON, the way the endpoint writes it) and each text the endpoint writes (after the culler's
annotations, the timeout's notes, a failed reading's reason) is checked the moment it is made;
the test fails at teardown with every place a reply broke the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tfgpu_magic.safe_text import strict_json
from tfgpu_magic.server import extension, kernel_inventory
from tfgpu_magic.server.schema import status_reply_schema


def replies_follow_the_schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Yields the list of replies checked so far (the wire form of each), for a test that counts them."""
    checked: list[dict[str, Any]] = []
    broken: list[str] = []

    def check(text: str, where: str) -> None:
        reply = json.loads(text)
        checked.append(reply)
        broken.extend(f"{where} reply #{len(checked)}: {line}" for line in reply_problems(reply))

    real_safe_tree, real_reply_text = kernel_inventory.safe_tree, extension.reply_text

    def safe_tree(tree: Any) -> Any:
        safe = real_safe_tree(tree)
        check(strict_json(safe), "inventory")
        return safe

    def reply_text(reply: dict[str, Any]) -> str:
        text = real_reply_text(reply)
        check(text, "endpoint")
        return text

    monkeypatch.setattr(kernel_inventory, "safe_tree", safe_tree)
    monkeypatch.setattr(extension, "reply_text", reply_text)
    yield checked
    assert not broken, "replies that break the schema:\n" + "\n".join(broken[:40])


def reply_problems(reply: Any) -> list[str]:
    """Where ``reply`` breaks the schema, one line each (``$.gpus[0].index: ...``); [] when it conforms."""
    validator = jsonschema.Draft202012Validator(status_reply_schema())
    return sorted(f"{error.json_path}: {error.message}" for error in validator.iter_errors(reply))
