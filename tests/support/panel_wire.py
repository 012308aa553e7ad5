"""The panel's messages read back in Python, as the front end reads them (js/lab/wire.ts).

A message of new samples may carry its numbers in binary buffers (widget.batch_wire); tests
compare what it says with widget.batch() of the same samples, so they read it back here into
batch()'s shape: every series of widget.SERIES on every device, nulls where it has no column.
"""

from __future__ import annotations

import struct
from typing import Any

GAP = -(2**63)


def unpacked(content: dict[str, Any], buffers: list | None = None) -> dict[str, Any]:
    """``content`` as batch() gives it, its columns cut from ``buffers`` where it has them."""
    packed = content.get("packed")
    if packed is None:
        return content
    from tfgpu_magic.kernel.widget import SERIES

    times_raw, readings_raw = (bytes(b) for b in buffers or ())
    times = list(struct.unpack(f"<{len(times_raw) // 8}d", times_raw))
    values = [None if v == GAP else v for v in struct.unpack(f"<{len(readings_raw) // 8}q", readings_raw)]
    n = len(times)
    stride = len(values) // n if n else 0
    wire = {(f, s): name for f, s, name in packed["wire"]}
    fixed = packed["readings"]
    columns: dict[str, dict[str, Any]] = {}
    at = 0
    for key, charted in packed["devices"]:
        device: dict[str, Any] = {name: values[at + j :: stride] for j, name in enumerate(fixed)}
        frameworks: dict[str, dict[str, list]] = {}
        for k, (framework, series) in enumerate(charted):
            column = values[at + len(fixed) + k :: stride]
            frameworks.setdefault(framework, {})[series] = column
            if (framework, series) in wire:
                device[wire[(framework, series)]] = column
        columns[key] = {name: device.get(name, [None] * n) for name in SERIES}
        if frameworks:
            columns[key]["frameworks"] = frameworks
        at += len(fixed) + len(charted)
    rest = {k: v for k, v in content.items() if k != "packed"}
    return {**rest, "t": times, "d": columns}
