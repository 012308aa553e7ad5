"""Injected NVML faults: each failure stays inside its reading or its GPU, with a note saying why.

The contract (see ``tfgpu_magic.gpus.nvml``): public readings raise nothing but ``NvmlUnavailable``
and, where documented, ``GpuLost`` / ``ReadingFailed``; any other failure of one reading is
None plus a note, and the other GPUs read normally.  Every reading the simulated server knows
is broken on one GPU with every kind of error, then read through ``Nvml``, the status report,
the CLI and the magic.  ``TALLY`` counts the faults injected, raised and survived.
"""

from __future__ import annotations

import collections
import json
import sys

import pytest
from IPython.core.error import UsageError

from tfgpu_magic.gpus.nvml import GpuInfo, GpuLost, MemoryInfo, Nvml, NvmlUnavailable, ReadingFailed
from tfgpu_magic.gpus.simulated import READINGS, SimulatedNvml, shared_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session

NVMLError = SimulatedNvml.NVMLError
ME = 4242
FAULTY = 1  # the A100-80GB holding this "kernel's" memory and two other processes
OTHERS = (0, 2, 3)

# error kind -> (a fresh exception, the reason a note gives; None: the GPU is lost)
ERRORS = {
    "not_supported": (lambda: NVMLError(SimulatedNvml.NVML_ERROR_NOT_SUPPORTED), "Not Supported"),
    "no_permission": (lambda: NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION), "Insufficient Permissions"),
    "unknown_999": (lambda: NVMLError(999), "Unknown Error"),
    "gpu_is_lost": (lambda: NVMLError(SimulatedNvml.NVML_ERROR_GPU_IS_LOST), None),
    "runtime_error": (lambda: RuntimeError("boom"), "RuntimeError: boom"),
    "type_error": (lambda: TypeError("bad handle"), "TypeError: bad handle"),
}

# reading -> (the name in notes, the GpuInfo fields it fills; () = gpu() does not read it)
ALL_FIELDS = (
    "uuid",
    "name",
    "pci_bus_id",
    "memory",
    "utilization_percent",
    "compute_capability",
    "mig_enabled",
)
AFFECTS = {
    "handle": ("device handle", ALL_FIELDS),
    "name": ("name", ("name",)),
    "uuid": ("uuid", ("uuid",)),
    "pci": ("PCI bus id", ("pci_bus_id",)),
    "memory": ("memory", ("memory",)),
    "utilization": ("utilization", ("utilization_percent",)),
    "compute_capability": ("compute capability", ("compute_capability",)),
    "mig": ("MIG mode", ("mig_enabled",)),
    "processes": ("processes", ()),
    "compute_processes": ("processes", ()),
    "graphics_processes": ("graphics processes", ()),
}
assert set(AFFECTS) == set(READINGS)

CASES = [pytest.param(r, k, id=f"{r}-{k}") for r in READINGS for k in ERRORS]

TALLY: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_tally():
    yield
    print(
        f"\nNVML faults: {TALLY['injected']} injected, {TALLY['raised']} raised by the simulated "
        f"library, {TALLY['survived']} survived",
        file=sys.__stdout__,
    )


def faulty_server(reading: str, kind: str) -> SimulatedNvml:
    server = shared_server(ME)
    server.gpus[FAULTY].faults[reading] = ERRORS[kind][0]()
    TALLY["injected"] += 1
    return server


def survived(server: SimulatedNvml) -> None:
    """The test got this far without an unexpected exception: count the fault as survived."""
    assert server.faults_raised > 0, "the injected fault was never raised: the test did not exercise it"
    TALLY["raised"] += server.faults_raised
    TALLY["survived"] += 1


def clean() -> Nvml:
    return Nvml(lib=shared_server(ME))


def is_lost(kind: str) -> bool:
    return ERRORS[kind][1] is None


def note(reading: str, kind: str) -> str:
    return f"{AFFECTS[reading][0]}: {ERRORS[kind][1]}"


# -- Nvml itself --------------------------------------------------------------------------------
@pytest.mark.parametrize("reading, kind", CASES)
def test_gpus_confine_the_fault_to_its_reading_and_gpu(reading, kind):
    server = faulty_server(reading, kind)
    nvml = Nvml(lib=server)
    gpus = nvml.gpus()  # must not raise
    baseline = clean().gpus()
    assert [g for g in gpus if g.index != FAULTY] == [g for g in baseline if g.index != FAULTY]
    gpu, good = gpus[FAULTY], baseline[FAULTY]
    fields = AFFECTS[reading][1]
    if not fields:  # a process listing: gpu() does not read it, so the GPU reads as before
        assert gpu == good
        _processes_outcome(nvml)  # the fault's turn (checked in the processes test)
    elif is_lost(kind):
        assert gpu.lost is True
        assert all(getattr(gpu, f) is None for f in ALL_FIELDS)
        assert gpu.notes == (f"{AFFECTS[reading][0]}: GPU is lost",)
    else:
        assert gpu.lost is False
        for field in ALL_FIELDS:
            expected = None if field in fields else getattr(good, field)
            assert getattr(gpu, field) == expected, field
        assert gpu.notes == (note(reading, kind),)
    survived(server)


def _processes_outcome(nvml: Nvml):
    try:
        return nvml.processes(FAULTY)
    except (GpuLost, ReadingFailed) as err:
        return err


STATIC_CASES = [
    pytest.param(r, k, id=f"{r}-{k}") for r in ("handle", "uuid", "name", "memory") for k in ERRORS
]


@pytest.mark.parametrize("reading, kind", STATIC_CASES)
def test_static_facts_are_none_and_not_cached_when_they_fail(reading, kind):
    server = faulty_server(reading, kind)
    nvml = Nvml(lib=server)
    good = clean()
    facts = {"uuid": nvml.uuid(FAULTY), "name": nvml.name(FAULTY), "total_bytes": nvml.total_bytes(FAULTY)}
    failing = {"handle": set(facts), "uuid": {"uuid"}, "name": {"name"}, "memory": {"total_bytes"}}[reading]
    for fact, value in facts.items():
        assert value == (None if fact in failing else getattr(good, fact)(FAULTY)), fact
    for other in OTHERS:
        assert (nvml.uuid(other), nvml.name(other), nvml.total_bytes(other)) == (
            good.uuid(other),
            good.name(other),
            good.total_bytes(other),
        )
    # the fault clears (or the GPU answers again): a fact that failed is read now, not cached as None
    server.gpus[FAULTY].faults.clear()
    for fact in facts:
        assert getattr(nvml, fact)(FAULTY) == getattr(good, fact)(FAULTY), fact
    survived(server)


@pytest.mark.parametrize("reading, kind", CASES)
def test_memory_raises_only_gpu_lost_or_reading_failed(reading, kind):
    server = faulty_server(reading, kind)
    nvml = Nvml(lib=server)
    if reading in ("handle", "memory"):
        if is_lost(kind):
            with pytest.raises(GpuLost):
                nvml.memory(FAULTY)
        else:
            with pytest.raises(ReadingFailed) as caught:
                nvml.memory(FAULTY)
            assert caught.value.note == note(reading, kind)
            assert caught.value.index == FAULTY
            if reading == "memory":
                assert str(caught.value) == ERRORS[kind][1]  # what the monitor shows in brackets
            else:
                assert str(caught.value) == note(reading, kind)
    else:
        assert nvml.memory(FAULTY) == clean().memory(FAULTY)
        nvml.gpu(FAULTY), _processes_outcome(nvml)  # give the fault its chance
    for other in OTHERS:
        assert nvml.memory(other) == clean().memory(other)
    survived(server)


@pytest.mark.parametrize("reading, kind", CASES)
def test_processes_raise_a_clean_error_never_an_empty_list(reading, kind):
    server = faulty_server(reading, kind)
    nvml = Nvml(lib=server)
    good = clean()
    if reading in ("handle", "processes", "compute_processes") or (
        reading == "graphics_processes" and is_lost(kind)
    ):
        if is_lost(kind):
            with pytest.raises(GpuLost):
                nvml.processes(FAULTY)
        else:
            with pytest.raises(ReadingFailed) as caught:
                nvml.processes(FAULTY)
            assert caught.value.note == note(reading, kind)
    else:  # a failing graphics listing is skipped: compute-only GPUs refuse it
        assert nvml.processes(FAULTY) == good.processes(FAULTY)
        nvml.gpu(FAULTY)
    for other in OTHERS:
        assert nvml.processes(other) == good.processes(other)
    survived(server)


@pytest.mark.parametrize("reading, kind", CASES)
def test_one_processs_share_fails_as_the_listing_does_or_is_its_figure(reading, kind):
    """``memory_of_process`` (the monitor's question) answers what ``processes`` lists for that
    pid, and fails where it fails; the one difference: a pid the compute listing lists is
    answered without the graphics listing, so that listing's fault cannot reach it."""
    server = faulty_server(reading, kind)
    nvml = Nvml(lib=server)
    listed = {p.pid: p for p in clean().processes(FAULTY)}
    for pid in (*listed, 999_999):  # this kernel, the others on that GPU, and a pid not listed
        try:
            expected: object = {p.pid: p.used_memory_bytes for p in nvml.processes(FAULTY)}.get(pid, 0)
        except (GpuLost, ReadingFailed) as err:
            expected = type(err)
        in_compute = pid in listed and listed[pid].kind == "compute"
        if isinstance(expected, type) and reading == "graphics_processes" and in_compute:
            expected = listed[pid].used_memory_bytes
        if isinstance(expected, type):
            with pytest.raises(expected):
                nvml.memory_of_process(FAULTY, pid)
        else:
            assert nvml.memory_of_process(FAULTY, pid) == expected, pid
    nvml.gpu(FAULTY)  # a fault in a reading no listing makes gets its chance too
    for other in OTHERS:
        assert nvml.memory_of_process(other, ME) == clean().memory_of_process(other, ME)
    survived(server)


def test_a_lost_handle_comes_back_when_the_gpu_answers_again():
    server = faulty_server("handle", "gpu_is_lost")
    nvml = Nvml(lib=server)
    assert nvml.gpu(FAULTY).lost
    server.gpus[FAULTY].faults.clear()
    assert nvml.gpu(FAULTY) == clean().gpu(FAULTY)
    survived(server)


def test_gpu_not_found_also_means_lost():
    server = shared_server(ME)
    server.gpus[FAULTY].faults["utilization"] = NVMLError(SimulatedNvml.NVML_ERROR_GPU_NOT_FOUND)
    TALLY["injected"] += 1
    assert Nvml(lib=server).gpu(FAULTY).lost
    survived(server)


def test_an_error_whose_text_fails_still_gives_a_note():
    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no text")

    server = shared_server(ME)
    server.gpus[FAULTY].faults["name"] = Unprintable()
    TALLY["injected"] += 1
    gpu = Nvml(lib=server).gpu(FAULTY)
    assert gpu.name is None and gpu.notes == ("name: Unprintable",)
    survived(server)


def test_an_old_binding_or_a_malformed_answer_is_one_failed_reading(server):
    server.nvmlDeviceGetMigMode = None  # an old pynvml without the function: calling it is a TypeError
    server.nvmlDeviceGetUtilizationRates = lambda handle: object()  # no .gpu: AttributeError
    gpu = Nvml(lib=server).gpu(FAULTY)
    assert (gpu.mig_enabled, gpu.utilization_percent, gpu.lost) == (None, None, False)
    assert gpu.notes == (
        "utilization: AttributeError: 'object' object has no attribute 'gpu'",
        "MIG mode: TypeError: 'NoneType' object is not callable",
    )
    assert gpu.memory == clean().memory(FAULTY)


def test_an_impossible_figure_fails_its_reading_and_is_never_passed_on(server):
    """Negative bytes or a utilization above 100% are nobody's figures: the reading fails with a note
    (the reply's schema allows neither); an impossible process figure is that process's unknown."""
    gpu = server.gpus[FAULTY]
    gpu.base_used_mib = -(1 << 20)  # the driver says the GPU uses minus one TiB
    gpu.utilization = 250
    gpu.processes[0].used_mib = -5
    nvml = Nvml(lib=server)
    read = nvml.gpu(FAULTY)
    assert (read.memory, read.utilization_percent) == (None, None)
    assert len(read.notes) == 2 and read.notes[0].startswith("memory: ValueError: NVML gave -")
    assert read.notes[0].endswith(" as a byte count")
    assert read.notes[1] == "utilization: ValueError: NVML gave a utilization of 250%"
    listed = {p.pid: p.used_memory_bytes for p in nvml.processes(FAULTY)}
    assert listed[gpu.processes[0].pid] is None
    assert [listed[p.pid] for p in gpu.processes[1:]] == [p.used_mib * (1 << 20) for p in gpu.processes[1:]]
    assert nvml.gpu(0).memory == clean().memory(0)  # the other GPUs read as before


def test_interrupts_are_not_swallowed():
    server = shared_server(ME)
    server.gpus[FAULTY].faults["utilization"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        Nvml(lib=server).gpu(FAULTY)


def test_memory_stays_one_nvml_call_on_the_sampling_path(server):
    nvml = Nvml(lib=server)
    nvml.memory(1)
    calls = server.calls
    nvml.memory(1)
    assert server.calls - calls == 1


def test_nvml_shut_down_under_us_is_a_failed_reading_then_a_fresh_start(server):
    nvml = Nvml(lib=server)
    assert nvml.gpu(1).utilization_percent == 35
    server.nvmlShutdown()  # another library's unbalanced nvmlShutdown
    gpu = nvml.gpu(1)
    assert gpu.memory is None and gpu.lost is False and "memory: Uninitialized" in gpu.notes
    assert nvml.gpu(1) == Nvml(lib=shared_server()).gpu(1)
    assert server.init_calls == 2


def test_gpu_info_keeps_its_positional_constructor():
    info = GpuInfo(0, None, None, None, None, None, None, None)
    assert info.lost is False and info.notes == ()
    assert GpuInfo(0, "u", "n", "p", MemoryInfo(1, 0, 1), 5, (8, 0), False, True).lost is True


# -- start-up -----------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "error",
    [None, NVMLError(SimulatedNvml.NVML_ERROR_LIBRARY_NOT_FOUND), RuntimeError("boom"), TypeError("odd")],
)
def test_start_up_is_retried_after_a_backoff(error):
    server = shared_server(ME)
    server.driver = False
    server.init_error = error
    clock = FakeClock()
    nvml = Nvml(lib=server, clock=clock, retry_s=5.0)
    assert nvml.available() is False
    for _ in range(100):  # a 10 Hz sampler on a dead driver: one nvmlInit per backoff, not per call
        assert nvml.available() is False
        with pytest.raises(NvmlUnavailable, match="no NVIDIA driver could be reached through NVML"):
            nvml.device_count()
        with pytest.raises(NvmlUnavailable):
            nvml.gpus()
    assert server.init_calls == 1
    clock.now += 4.9
    assert nvml.available() is False and server.init_calls == 1
    clock.now += 0.2
    assert nvml.available() is False and server.init_calls == 2
    server.driver, server.init_error = True, None  # the driver comes back
    assert nvml.available() is False  # still inside the backoff
    clock.now += 5.0
    assert nvml.available() is True and server.init_calls == 3
    assert nvml.device_count() == 4 and nvml.gpus() == clean().gpus()
    TALLY["injected"] += 1
    TALLY["survived"] += 1


def test_a_failing_device_count_is_a_failed_start_and_is_retried():
    server = shared_server(ME)
    clock = FakeClock()
    nvml = Nvml(lib=server, clock=clock)
    real = server.nvmlDeviceGetCount
    server.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(NVMLError(999))
    with pytest.raises(NvmlUnavailable, match="Unknown Error"):
        nvml.device_count()
    server.nvmlDeviceGetCount = real
    clock.now += 5.0
    assert nvml.device_count() == 4
    TALLY["injected"] += 1
    TALLY["survived"] += 1


@pytest.mark.parametrize("answer, read", [(10**30, 1024), (2**31, 1024), (-1, 0)])
def test_an_absurd_device_count_is_capped_with_a_note(answer, read, monkeypatch, capsys):
    """A driver answering 10**30 once made `tfgpu --json` loop without bound (issue 17, item 6)."""
    server = shared_server(ME)
    server.nvmlDeviceGetCount = lambda: answer
    nvml = Nvml(lib=server)
    assert nvml.device_count() == read
    assert nvml.count_note == f"the driver reported {answer} GPUs; " + (
        "only the first 1024 are read" if read else "none are read"
    )
    monkeypatch.setattr("tfgpu_magic.gpus.simulated.shared_server", lambda *a, **k: server)
    from tfgpu_magic.__main__ import main

    assert main(["--demo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["gpus"]) == read and nvml.count_note in report["notes"]
    TALLY["injected"] += 1
    TALLY["survived"] += 1


def test_missing_pynvml_is_unavailable_and_retried(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    clock = FakeClock()
    nvml = Nvml(clock=clock)
    with pytest.raises(NvmlUnavailable, match="pip install nvidia-ml-py"):
        nvml.device_count()
    assert nvml.available() is False and nvml.lib is None


# -- end to end: the status report, the CLI, the magic -----------------------------------------
def _report(server: SimulatedNvml) -> dict:
    return status.build_report(Session(nvml=Nvml(lib=server), env={}), my_pid=ME)


@pytest.mark.parametrize("reading, kind", CASES)
def test_status_report_survives_and_the_other_gpus_are_unchanged(reading, kind):
    server = faulty_server(reading, kind)
    report = _report(server)
    text = status.render_text(report)
    html = status.render_html(report)
    json.dumps(report)
    good = _report(shared_server(ME))
    assert [g for g in report["gpus"] if g["index"] != FAULTY] == [
        g for g in good["gpus"] if g["index"] != FAULTY
    ]
    entry = report["gpus"][FAULTY]
    listing = reading in ("processes", "compute_processes", "graphics_processes")
    if is_lost(kind) and not listing:
        assert entry["lost"] is True and f"GPU {FAULTY}  lost: the GPU stopped answering" in text
    elif is_lost(kind):  # gpu() read the GPU fine; the listing then found it lost
        assert entry["processes"] is None and entry["notes"] == ["the GPU stopped answering"]
    elif reading in ("handle", "processes", "compute_processes"):
        expected = note(reading, kind) if reading == "handle" else ERRORS[kind][1]
        assert entry["processes"] is None
        assert entry["notes"] == [f"NVML could not list the processes ({expected})"]
        assert f"note: NVML could not list the processes ({expected})" in text
    assert f"GPU {FAULTY}" in html
    survived(server)


@pytest.mark.parametrize(
    "reading, kind",
    [
        ("utilization", "no_permission"),
        ("name", "runtime_error"),
        ("memory", "unknown_999"),
        ("handle", "type_error"),
    ],
)
def test_status_shows_why_a_reading_is_missing(reading, kind):
    server = faulty_server(reading, kind)
    report = _report(server)
    text = status.render_text(report)
    survived(server)  # no crash; what is missing is the note in the report
    assert any(note(reading, kind) in shown for shown in report["gpus"][FAULTY]["notes"])  # said once
    assert f"{note(reading, kind)}" in text


@pytest.mark.parametrize("kind", list(ERRORS))
@pytest.mark.parametrize("reading", ["handle", "uuid", "memory", "utilization", "processes"])
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_cli_does_not_crash(reading, kind, as_json, monkeypatch, capsys):
    server = faulty_server(reading, kind)
    monkeypatch.setattr("tfgpu_magic.gpus.simulated.shared_server", lambda *a, **k: server)
    from tfgpu_magic.__main__ import main

    assert main(["--demo", "--json"] if as_json else ["--demo"]) == 0
    out = capsys.readouterr().out
    if as_json:
        assert [g["index"] for g in json.loads(out)["gpus"]] == [0, 1, 2, 3]
    else:
        assert "GPU 3  Tesla T4" in out
    survived(server)


@pytest.mark.parametrize("kind", [k for k in ERRORS if k != "not_supported"])
@pytest.mark.parametrize("line", ["", "use auto:2", "limit 50%", "use 2"])
def test_the_magic_does_not_crash(gpu, server, line, kind, capsys):
    server.gpus[FAULTY].faults["handle"] = ERRORS[kind][0]()
    TALLY["injected"] += 1
    if line == "limit 50%":  # GPU 1 is visible and its total unknown: a one-line refusal, not a crash
        with pytest.raises(UsageError, match="needs each GPU's total memory, which NVML cannot read here"):
            gpu(line)
    else:
        gpu(line)
    if line == "use auto:2":
        assert (
            gpu.session.env["CUDA_VISIBLE_DEVICES"] == "2,3"
        )  # without the fault: 1,2 (GPU 1 is the freest)
    survived(server)
