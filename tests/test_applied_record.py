"""What was applied is recorded when it is applied, and read from that record afterwards
(issue 18, item 1): the panel's limit line, the out-of-memory text and ``%gpu`` quote the
caps TensorFlow was given, whatever the driver says later, and the sampler reads them
without asking the driver anything."""

from __future__ import annotations

import json

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, Stage
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import NVML_ERROR_UNKNOWN, NVMLError, shared_server
from tfgpu_magic.kernel import oom, panels, status
from tfgpu_magic.kernel.session import Session

from support.fakes import FakeTensorFlow

GIB = 1 << 30
HALF_OF_80G = 40960 * (1 << 20)  # `limit 50%` of an 80 GiB GPU, resolved in MiB


def started_session(*commands: str) -> tuple[Session, object]:
    """A kernel that asked ``commands``, imported TensorFlow (the hook gives it the request) and
    ran its first op on GPU 1."""
    server = shared_server()
    session = Session(
        nvml=Nvml(lib=server),
        env={},
        frameworks=adapters(tensorflow=FakeTensorFlow(gpus={"GPU:0": 1}, found=[1])),
    )
    for command in commands:
        session.configure(grammar.parse(command))
    session._on_import(session.adapter("tensorflow"), None)
    session.adapter("tensorflow").fake_stage = Stage.STARTED
    session.adapter("tensorflow").stats = {"GPU:0": AllocatorStats(11 * GIB, 11 * GIB)}
    return session, server


def break_the_driver(server) -> None:
    """Every reading of every GPU fails from now on (a driver reset, a lost GPU, a permission change)."""
    for gpu in server.gpus:
        for reading in ("handle", "name", "uuid", "pci", "memory", "utilization", "processes", "mig"):
            gpu.faults[reading] = NVMLError(NVML_ERROR_UNKNOWN)
    server.driver = False


def oom_on_gpu0() -> Exception:
    return Exception(
        "OOM when allocating tensor with shape[64,512,512,64] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"
    )


def test_a_percentage_limit_is_quoted_as_applied_after_the_driver_stops_answering():
    session, server = started_session("use 1", "limit 50%")
    assert session.limit_bytes_by_gpu() == {1: HALF_OF_80G}
    break_the_driver(server)
    session.nvml = Nvml(lib=server)  # a fresh NVML start, which now fails
    assert session.limit_bytes_by_gpu() == {1: HALF_OF_80G}
    assert "limit: 40.0 GiB (`%gpu limit`)" in oom.explain(session, oom_on_gpu0())
    report = json.loads(json.dumps(status.build_report(session)))  # as `%gpu status --json` prints it
    assert report["resolved"]["gpus"] == [
        {
            "index": 1,
            "limit_mib": 40960,
            "logical_mib": [40960],
            "within_share": None,
            "enforcement": "soft (TensorFlow's allocator)",  # who holds it, as %gpu says
        }
    ]
    assert not any("cannot hold" in note for note in report["notes"])


def test_the_sampler_reads_the_limits_without_asking_the_driver():
    session, server = started_session("use 1", "limit 50%")
    limits = panels._kernel_sources(session, None)["limits"]
    before = server.calls
    assert limits() == {1: HALF_OF_80G}
    assert server.calls == before  # a plain read of the record: no NVML call, no TensorFlow call


def test_a_tensorflow_that_found_no_gpu_was_given_no_limit_and_none_is_drawn():
    server = shared_server()
    session = Session(nvml=Nvml(lib=server), env={}, frameworks=adapters(tensorflow=FakeTensorFlow(found=[])))
    session.configure(grammar.parse("limit 4G"))
    assert session.limit_bytes_by_gpu() == {i: 4 * GIB for i in range(4)}  # to be given at import
    session._on_import(session.adapter("tensorflow"), None)  # a CPU-only TensorFlow: the hook cannot apply it
    assert session.applied == {} and session.limit_bytes_by_gpu() == {}
    assert any("TensorFlow found no GPU" in error for error in session.hook_errors)


def test_the_record_is_the_resolution_the_command_made_not_a_new_one():
    session, _ = started_session("limit 50%")
    assert session.applied["tensorflow"] is session.resolved()
    given = session.adapter("tensorflow").applied[-1][1]  # what tf.config was given
    assert given == session.resolved().logical_mib() and given[1] == (40960,)


def test_a_resolution_made_while_a_command_holds_the_session_is_not_kept():
    """The sampler thread may resolve the never-accepted request while `configure` is accepting a
    new one: what it resolved is used for that reading only, never stored over the new request."""
    import threading

    session = Session(
        nvml=Nvml(lib=shared_server()), env={}, frameworks=adapters(tensorflow=FakeTensorFlow())
    )
    with session._lock:  # as `configure` holds it
        seen = []
        reader = threading.Thread(target=lambda: seen.append(session.resolved()))
        reader.start()
        reader.join(5)
    assert seen and seen[0].visible == (0, 1, 2, 3)  # the reading got its answer without waiting
    assert session._accepted is None  # and stored nothing
    assert session.resolved() is session.resolved()  # on the user's thread it is kept
