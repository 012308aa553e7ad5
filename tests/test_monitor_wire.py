"""The panel's binary messages as the front end reads them: js/lab/wire.ts, run in Node.

The kernel sends new samples with their numbers in two buffers (widget.batch_wire); the front
end cuts them back into batch()'s columns.  Held here to batch() of the same samples.
"""

from __future__ import annotations

import base64
import json
import subprocess

from hypothesis import HealthCheck, given, settings

from tfgpu_magic.kernel import widget

from support.panel_wire import packed_runs
from support.typescript import compiled_module, node

READ_BACK = """
import { unpackSamples } from './wire.mjs';
import { readFileSync } from 'node:fs';
const sent = JSON.parse(readFileSync(new URL('./sent.json', import.meta.url)));
const views = sent.buffers.map((b) => { const raw = Buffer.from(b, 'base64'); return new DataView(raw.buffer, raw.byteOffset, raw.byteLength); });
console.log(JSON.stringify(unpackSamples(sent.content, views)));
"""


def read_in_node(tmp_path, content: dict, buffers: list) -> dict:
    (tmp_path / "wire.mjs").write_text(compiled_module("wire.js").read_text())
    encoded = [base64.b64encode(bytes(b)).decode() for b in buffers]
    (tmp_path / "sent.json").write_text(json.dumps({"content": content, "buffers": encoded}))
    (tmp_path / "read.mjs").write_text(READ_BACK)
    done = subprocess.run([node(), str(tmp_path / "read.mjs")], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def as_the_panel_reads(message: dict) -> dict:
    """A series the message has no column for is nulls to the panel (js/widget.ts ingest)."""
    n = len(message["t"])
    for device in message["d"].values():
        for name in widget.SERIES:
            device.setdefault(name, [None] * n)
    return message


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=packed_runs())
def test_the_front_end_reads_a_binary_batch_as_the_batch_of_those_samples(tmp_path, stored):
    content, buffers = widget.batch_wire(stored)
    read = as_the_panel_reads(read_in_node(tmp_path, content, buffers))
    assert read == widget.batch([s.unpack() for s in stored])


def test_a_missing_reading_is_a_gap_and_large_byte_counts_stay_exact(tmp_path):
    """The gap (-2**63) is null, never a number; bytes up to 2**53 - 1 come back exactly."""
    from tfgpu_magic.kernel.monitor import DeviceSample, Sample, _Stored

    big = 2**53 - 1
    devices = (DeviceSample("gpu0", "GPU 0", big, None, 0, utilization_percent=None),)
    stored = [_Stored.pack(Sample(1_700_000_000.25, devices), None)]
    content, buffers = widget.batch_wire(stored)
    assert buffers, "one layout: the numbers travel in buffers"
    read = read_in_node(tmp_path, content, buffers)
    assert read["t"] == [1_700_000_000.25]
    gpu0 = read["d"]["gpu0"]
    assert (gpu0["total"], gpu0["used"], gpu0["mine"], gpu0["util"]) == ([big], [None], [0], [None])
