"""TensorFlow imported before the session is prepared, then started, in this fresh process.

One TensorFlow start serves two checks: showing status never starts TensorFlow (its stage stays
``imported``), and ``use auto`` once it has started gives the restart remedy.  Prints JSON.
"""

from __future__ import annotations

import json

import tensorflow as tf

from tfgpu_magic.command import grammar
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.choosing import ChoiceError, choose_gpus
from tfgpu_magic.kernel.session import Session

session = Session(nvml=Nvml(lib=shared_server()), env={})
session.prepare()  # the import hook fires at once: TensorFlow is already here
report = status.build_report(session)
status.render_text(report), status.render_html(report)
results = {
    "stage_after_status": session.adapter("tensorflow").stage().name,
    "reported_stage": report["tensorflow"]["stage"],
}

tf.constant(1)  # the runtime starts: visibility is frozen (a CPU build: no GPU)
try:
    choose_gpus(session, grammar.Auto(), print)
    results["auto_after_start"] = None
except ChoiceError as err:
    results["auto_after_start"] = str(err)
print(json.dumps(results))
