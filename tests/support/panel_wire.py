"""The panel's messages read back in Python, as the front end reads them (js/lab/wire.ts).

A message of new samples may carry its numbers in binary buffers (widget.batch_wire); tests
compare what it says with widget.batch() of the same samples, so they read it back here into
batch()'s shape: every series of widget.SERIES on every device, nulls where it has no column.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

from tfgpu_magic.kernel.allocator_figures import FigureSeries
from tfgpu_magic.kernel.monitor import DeviceSample, Sample, _Stored

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


# -- samples as the sampler keeps them, for property tests of what is sent -------------------------
FRAMEWORK_SERIES = [
    ("pytorch", "allocated", None),
    ("pytorch", "reserved", None),
    ("tensorflow", "in_use", "tf_in_use_bytes"),
    ("tensorflow", "peak", "tf_peak_bytes"),
]
readings = st.one_of(st.none(), st.integers(0, 2**53 - 1))


@st.composite
def packed_runs(draw):
    """Samples as the sampler keeps them: one or two layouts, gaps, errors, figures and notes."""
    charted = draw(st.lists(st.sampled_from(FRAMEWORK_SERIES), unique=True, max_size=3))
    series = tuple(FigureSeries(f, s, f"{f}: {s}", wire) for f, s, wire in charted)
    layouts = draw(
        st.lists(
            st.lists(st.sampled_from(["gpu0", "gpu1", "gpu2", "tensorflow:CPU:0"]), min_size=1, max_size=3),
            min_size=1,
            max_size=2,
        )
    )
    stored, previous = [], None
    for i in range(draw(st.integers(1, 6))):
        keys = layouts[draw(st.integers(0, len(layouts) - 1))]
        devices = tuple(
            DeviceSample(
                key,
                f"label of {key}",
                *(draw(readings) for _ in range(3)),
                limit_bytes=draw(readings),
                error=draw(st.sampled_from([None, "GPU 1 stopped answering"])),
                utilization_percent=draw(st.one_of(st.none(), st.integers(0, 100))),
                figures=tuple((f, s, draw(readings)) for f, s, _ in charted) if key != "gpu2" else (),
            )
            for key in keys
        )
        sample = Sample(
            1_700_000_000.0 + i / 10,
            devices,
            draw(st.sampled_from([None, "a note"])),
            series,
            draw(st.sampled_from([None, 1_700_000_000.0])),
            draw(st.sampled_from([(), ("JAX: not started",)])),
        )
        previous = _Stored.pack(sample, previous)
        stored.append(previous)
    return stored
