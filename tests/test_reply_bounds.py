"""What others plant cannot bloat or break what this product writes (issue 28, items 6, 7 and 10).

* Other users' command lines and user names are bounded where they are read (the process
  table), so the server's reply, ``%gpu status --json`` and ``tfgpu --json`` carry at most
  ``owners.MAX_COMMAND_CHARS`` / ``owners.MAX_NAME_CHARS`` characters of each, cut with "…";
  on Linux a command line is read with a bounded ``read`` of ``/proc/PID/cmdline``.
* With ``/proc`` mounted ``hidepid=2`` a listed pid this user cannot see is "hidden": other
  users' memory and the unattributed rest are unknown (null, absent from ``/metrics``, a
  note), never 0 and never "exited".  Tested with a real ``hidepid=2`` mount in a private
  mount namespace (root only) and with the detection faked.
* Every JSON output parses under a strict parser (no ``NaN``/``Infinity``): Python's with
  ``parse_constant`` refusing them, and Node's ``JSON.parse``.
* A Hypothesis property over arbitrary readings: the reply is strict JSON under a size bound
  that does not grow with what others plant, and ``/metrics`` parses with no forged series.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.utils.capture import capture_output
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tfgpu_magic import __version__
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus import owners
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session
from tfgpu_magic.server import extension, kernel_inventory, metrics
from tfgpu_magic.server.kernel_inventory import KernelDescription

from support.fakes import fake_process_table
from support.reply_schema import replies_follow_the_schema, reply_problems

MIB = 1 << 20
GIB = 1 << 30
COMMAND_BOUND = 1024  # the documented bound (docs/commands.md): characters of a command line, "…" included
NAME_BOUND = 64  # characters of a user name
NODE = shutil.which("node")


@pytest.fixture
def schema_checked(monkeypatch):
    """Every reply the test builds is checked against the shipped schema (tfgpu_magic/server/schema)."""
    yield from replies_follow_the_schema(monkeypatch)


def strict_loads(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and -Infinity, as ``JSON.parse`` does."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def node_parses(text: str) -> bool:
    """Whether Node's ``JSON.parse`` accepts ``text`` (read from stdin)."""
    proc = subprocess.run(
        [
            NODE,
            "-e",
            "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{JSON.parse(s);process.exit(0)})",
        ],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode == 0


def bobs_server(count: int = 20, size: int = MIB, user: str = "bob") -> SimulatedNvml:
    """Bob runs ``count`` GPU processes, each with a ``size``-character command line."""
    processes = [
        SimulatedProcess(50_000 + i, 1024, user=user, command="python " + "A" * size + "\x1b[2J")
        for i in range(count)
    ]
    return SimulatedNvml([SimulatedGpu(total_mib=81920, processes=processes)])


# -- item 6: other users' text is bounded where it is read -------------------------------------------
@pytest.mark.usefixtures("schema_checked")
def test_other_users_command_lines_are_cut_in_the_servers_reply():
    server = bobs_server()
    reply = kernel_inventory.inventory(Nvml(lib=server), [], fake_process_table(server))
    others = reply["other_users"]
    assert len(others) == 20
    assert all(len(p["command"]) <= COMMAND_BOUND and p["command"].endswith("…") for p in others)
    assert all(p["command"].startswith("python AAAA") for p in others)
    assert len(json.dumps(reply)) < 20 * (COMMAND_BOUND + 200) + 10_000  # was 21 MB


@pytest.mark.usefixtures("schema_checked")
def test_other_users_names_are_cut_in_the_servers_reply():
    server = bobs_server(count=2, size=10, user="b" * 100_000)
    reply = kernel_inventory.inventory(Nvml(lib=server), [], fake_process_table(server))
    assert all(len(p["user"]) <= NAME_BOUND and p["user"].endswith("…") for p in reply["other_users"])


def test_other_users_command_lines_are_cut_in_gpu_status_json(shell):
    from tfgpu_magic.kernel.magics import GpuMagics

    from support.fakes import FakeTensorFlow

    server = bobs_server()
    shell.register_magics(
        GpuMagics(
            shell,
            session=Session(nvml=Nvml(lib=server), env={}, frameworks=adapters(tensorflow=FakeTensorFlow())),
        )
    )
    with capture_output() as out:
        shell.run_line_magic("gpu", "status --json")
    report = strict_loads(out.stdout)
    commands = [p["command"] for p in report["gpus"][0]["processes"]]
    assert len(commands) == 20 and all(len(c) <= COMMAND_BOUND and c.endswith("…") for c in commands)
    assert len(out.stdout) < 20 * (COMMAND_BOUND + 400) + 20_000  # was 21 MB


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="reads /proc (Linux)")
def test_a_one_mebibyte_command_line_is_read_with_a_bounded_read(monkeypatch):
    """The psutil table reads at most a few KiB of /proc/PID/cmdline, never the whole MiB."""
    import psutil

    args = ["B" * 100_000 for _ in range(11)]  # 1.1 MB in all (one argument may hold at most 128 KiB)
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == b"ready\n"  # past its exec: the command line is in place
        asked: list[int] = []
        real_read = os.read

        def read(fd: int, n: int) -> bytes:
            asked.append(n)
            return real_read(fd, n)

        def whole(self: Any) -> Any:
            raise AssertionError("psutil.Process.cmdline() reads the whole command line")

        monkeypatch.setattr(os, "read", read)
        monkeypatch.setattr(psutil.Process, "cmdline", whole)
        for lookup in (owners.PsutilProcessTable(min_age_s=0).lookup, owners._proc_lookup):
            command = lookup(proc.pid).command
            assert command is not None and command.startswith(f"{sys.executable} -c {code} BBB")
            assert len(command) <= COMMAND_BOUND and command.endswith("…")
        assert asked and max(asked) <= 8 * COMMAND_BOUND  # each read asks for a few KiB at most
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait(timeout=30)


# -- item 7: hidepid makes other users' memory unknown, never 0 --------------------------------------
def _hidden_reply(monkeypatch, bob: int, alice: int) -> dict:
    server = SimulatedNvml(
        [
            SimulatedGpu(
                total_mib=40960,
                processes=[
                    SimulatedProcess(bob, 8192),
                    SimulatedProcess(alice, 4096),
                ],
            )
        ]
    )
    monkeypatch.setattr(owners, "_hides_others", lambda: True, raising=False)
    table = owners.PsutilProcessTable(min_age_s=0)
    return kernel_inventory.inventory(Nvml(lib=server), [], table, clock=lambda: 1_795_000_000.0)


def _exposition(reply: dict) -> str:
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):
            return metrics.families(reply, __version__)

    registry.register(Fixed())
    return generate_latest(registry).decode()


def _assert_hidden(reply: dict, bob: int, alice: int) -> None:
    assert reply["unattributed"] == []  # never "exited, but NVML still lists it"
    assert [p["pid"] for p in reply["hidden_processes"]] == [bob]
    assert reply["my_other_processes"] == [
        {
            "gpu": 0,
            "pid": alice,
            "used_memory_bytes": 4 * GIB,
            "command": reply["my_other_processes"][0]["command"],
        }
    ]
    split = reply["gpus"][0]["split"]
    assert (split["my_other_bytes"], split["others_bytes"], split["unattributed_bytes"]) == (
        4 * GIB,
        None,
        None,
    )
    assert reply["pids_visible"] is False
    assert any("hidepid" in note and str(bob) in note for note in reply["notes"])
    assert any("hidepid" in note for note in reply["gpus"][0]["notes"])
    text = _exposition(reply)
    assert "tfgpu_other_users_gpu_memory_bytes{" not in text  # absent, never 0


@pytest.mark.usefixtures("schema_checked")
def test_with_hidepid_faked_a_pid_proc_does_not_show_is_hidden_not_exited(monkeypatch):
    """The detection faked: a pid that /proc does not show (none runs with it) and our own process."""
    bob = 4_194_000  # above any pid this machine hands out
    reply = _hidden_reply(monkeypatch, bob, os.getpid())
    _assert_hidden(reply, bob, os.getpid())


@pytest.mark.usefixtures("schema_checked")
def test_without_hidepid_a_pid_proc_does_not_show_stays_exited(monkeypatch):
    server = SimulatedNvml([SimulatedGpu(total_mib=40960, processes=[SimulatedProcess(4_194_000, 8192)])])
    monkeypatch.setattr(owners, "_hides_others", lambda: False)
    reply = kernel_inventory.inventory(Nvml(lib=server), [], owners.PsutilProcessTable(min_age_s=0))
    assert [p["pid"] for p in reply["unattributed"]] == [4_194_000] and reply["hidden_processes"] == []


def test_the_hidepid_option_is_read_from_the_proc_mount(tmp_path, monkeypatch):
    lines = [
        "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        "63 22 0:39 / /proc rw,relatime - proc proc rw,hidepid=invisible",
    ]
    assert owners._hidepid_in(lines) is True
    assert owners._hidepid_in(lines[:1]) is False
    assert owners._hidepid_in([lines[0], lines[1].replace("invisible", "0")]) is False
    assert owners._hidepid_in([lines[1].replace("invisible", "2")]) is True


def test_gpu_status_says_hidden_and_unknown_where_proc_hides_a_pid():
    server = SimulatedNvml(
        [
            SimulatedGpu(
                total_mib=40960,
                processes=[
                    SimulatedProcess(4242, 1024, user="me"),
                    SimulatedProcess(41003, 8192, user="bob", alive=False),
                ],
            )
        ]
    )
    table = fake_process_table(server, my_pid=4242, hides_others=True)
    report = status.build_report(Session(nvml=Nvml(lib=server), env={}), my_pid=4242, process_table=table)
    assert report["gpus"][0]["usage"]["others_bytes"] is None
    text = status.render_text(report)
    assert "  pid 41003    n/a           8.0 GiB  n/a  (hidden by /proc: hidepid)" in text.splitlines()
    assert "other users n/a · unattributed n/a" in text and "(exited)" not in text


def _libc_mount_hidepid() -> None:
    """In a forked root child: a private mount namespace with /proc mounted hidepid=2."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare")
    if libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) != 0:  # MS_REC | MS_PRIVATE
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"proc", b"/proc", b"proc", 0, b"hidepid=2") != 0:
        raise OSError(ctypes.get_errno(), "mount proc hidepid=2")


ALICE, BOB = 54331, 54332


@pytest.mark.skipif(
    not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root: a real hidepid mount, two uids"
)
@pytest.mark.usefixtures("schema_checked")
def test_with_a_real_hidepid_mount_other_users_memory_is_unknown_not_zero():
    """Alice's server reads a GPU where bob (another uid) holds 8 GiB and alice's own process 4 GiB,
    with /proc mounted hidepid=2 in a private mount namespace: bob's pid is invisible to her."""
    import psutil  # noqa: F401  imported before the fork, as root: the child only reads

    procs = [subprocess.Popen(["/bin/sleep", "120"], user=uid, group=uid) for uid in (BOB, ALICE)]
    bob, alice = procs[0].pid, procs[1].pid
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            try:
                _libc_mount_hidepid()
                os.setgroups([])
                os.setgid(ALICE)
                os.setuid(ALICE)
                server = SimulatedNvml(
                    [
                        SimulatedGpu(
                            total_mib=40960,
                            processes=[
                                SimulatedProcess(bob, 8192),
                                SimulatedProcess(alice, 4096),
                            ],
                        )
                    ]
                )
                table = owners.PsutilProcessTable(min_age_s=0)
                value: Any = (
                    "ok",
                    kernel_inventory.inventory(Nvml(lib=server), [], table, clock=lambda: 1.0),
                )
            except BaseException as err:
                import traceback

                value = ("error", f"{err!r}\n{traceback.format_exc()}")
            os.write(w, pickle.dumps(value))
            os.close(w)
        finally:
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as pipe:
            kind, value = pickle.loads(pipe.read())
        os.waitpid(child, 0)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    assert kind == "ok", value
    _assert_hidden(value, bob, alice)


# -- item 10: every JSON this product writes is strict JSON ------------------------------------------
def _jax_session_with(fraction: str) -> Session:
    from support.fakes import FakeTensorFlow
    from support.stand_ins import StandInJax

    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction  # inherited (the fixture restores os.environ)
    session = Session(
        nvml=Nvml(lib=bobs_server(count=1, size=10)),
        env=os.environ,
        frameworks=adapters(tensorflow=FakeTensorFlow()),
    )
    jax = StandInJax()
    session._on_import(session.adapter("jax"), jax)
    jax.devices()  # JAX starts, reading the fraction
    return session


@pytest.mark.parametrize("fraction", ["nan", "inf", "-inf"])
def test_gpu_status_json_is_strict_json_with_a_non_finite_inherited_fraction(shell, fraction):
    from tfgpu_magic.kernel.magics import GpuMagics

    shell.register_magics(GpuMagics(shell, session=_jax_session_with(fraction)))
    with capture_output() as out:
        shell.run_line_magic("gpu", "status --json")
    report = strict_loads(out.stdout)
    assert report["frameworks"]["jax"]["started_with"]["memory_fraction"] is None
    assert any(
        "frameworks.jax.started_with.memory_fraction" in note and fraction in note for note in report["notes"]
    )
    if NODE:
        assert node_parses(out.stdout)


def test_tfgpu_json_is_strict_json_whatever_the_report_holds(monkeypatch, capsys):
    from tfgpu_magic.__main__ import main

    real = status.build_report

    def with_non_finite(*args: Any, **kwargs: Any) -> dict:
        report = real(*args, **kwargs)
        report["gpus"][0]["utilization_percent"] = math.inf
        report["me"]["odd"] = [math.nan, -math.inf, 1e308 * 10]
        return report

    monkeypatch.setattr(status, "build_report", with_non_finite)
    main(["--demo", "--json"])
    text = capsys.readouterr().out
    report = strict_loads(text)
    assert report["gpus"][0]["utilization_percent"] is None and report["me"]["odd"] == [None, None, None]
    if NODE:
        assert node_parses(text)


@pytest.mark.usefixtures("schema_checked")
def test_the_servers_reply_text_is_strict_json():
    server = bobs_server(count=1, size=10)
    reply = kernel_inventory.inventory(
        Nvml(lib=server), [], fake_process_table(server), clock=lambda: math.nan, refresh_interval_s=math.inf
    )
    text = extension.reply_text(reply)
    parsed = strict_loads(text)
    assert (parsed["generated_at"], parsed["refresh_interval_s"]) == (None, None)
    if NODE:
        assert node_parses(text)


# -- the property: arbitrary readings, a bounded strict reply, /metrics with no forged series --------
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Cs", "Co"]), max_size=20),
    st.sampled_from(
        ['x"}\nfake_series{a="b"} 1\n', "\x1b]0;owned\x07", "\\", '"', "\u202e", "\ud800", "é" * 50]
    ),
    st.integers(0, 3).map(lambda k: "C" * (MIB >> k)),  # up to 1 MiB
)
NUMBER = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308, -1e308, 2**70, -(2**70)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**80), 2**80),
)
USED_MIB = st.one_of(st.none(), st.integers(0, 2**40), st.integers(-(2**20), -1))


@st.composite
def readings(draw: Any) -> tuple[SimulatedNvml, list[KernelDescription], float, float, bool]:
    gpus = []
    pid = 60_000
    for _ in range(draw(st.integers(1, 2))):
        processes = []
        for _ in range(draw(st.integers(0, 10))):
            pid += 1
            processes.append(
                SimulatedProcess(
                    pid,
                    draw(USED_MIB),
                    user=draw(HOSTILE),
                    command=draw(HOSTILE),
                    alive=draw(st.booleans()),  # False: the process vanished while NVML still lists it
                )
            )
        gpu = SimulatedGpu(
            name=draw(HOSTILE),
            total_mib=draw(st.integers(1, 2**30)),
            processes=processes,
            base_used_mib=draw(st.integers(-(2**20), 2**30)),
        )
        gpu.utilization = draw(NUMBER)
        gpus.append(gpu)
    kernels = [
        KernelDescription(
            draw(HOSTILE.filter(bool)),  # the server's own kernel id: never empty (a uuid in jupyter_server)
            name=draw(HOSTILE),
            path=draw(HOSTILE),
            execution_state=draw(HOSTILE),
            pid=draw(st.one_of(st.none(), st.integers(60_001, pid + 2))),
        )
        for _ in range(draw(st.integers(0, 2)))
    ]
    # hides_others: /proc mounted hidepid, so a process not shown is hidden rather than exited
    return SimulatedNvml(gpus), kernels, draw(NUMBER), draw(NUMBER), draw(st.booleans())


def reply_bound(reply: dict) -> int:
    """What a reply may weigh: a fixed part, and per listed process and per kernel a bounded part
    (kernel ids and paths are this server's own, counted as they are)."""
    listed = sum(
        len(reply.get(key, []))
        for key in ("my_other_processes", "other_users", "unattributed", "hidden_processes")
    )
    kernels = sum(
        len(json.dumps([k["id"], k["name"], k["path"], k["execution_state"]])) + 2000
        for k in reply["kernels"]
    )
    gpus = sum(2000 + len(json.dumps(g["name"])) + 400 * len(g["notes"]) for g in reply["gpus"])
    return 4000 + gpus + kernels + listed * 2 * 6 * (COMMAND_BOUND + NAME_BOUND + 100)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(readings())
def test_any_reading_gives_a_bounded_strict_reply_and_metrics_with_no_forged_series(reading):
    """Whatever NVML answers (negative bytes, a utilization of 1e22, NaN), the reply stays within
    its bounds and its schema: an impossible figure fails its reading (a note), never reaches it."""
    server, kernels, now, interval, hides_others = reading
    table = fake_process_table(server, hides_others=hides_others)
    reply = kernel_inventory.inventory(
        Nvml(lib=server),
        kernels,
        table,
        parents={},
        clock=lambda: now,
        refresh_interval_s=interval,
    )
    text = extension.reply_text(reply)
    parsed = strict_loads(text)
    assert reply_problems(parsed) == []
    assert len(text) <= reply_bound(parsed)
    for entry in parsed["other_users"] + parsed["my_other_processes"]:
        assert entry["command"] is None or len(entry["command"]) <= COMMAND_BOUND
    for entry in parsed["other_users"]:
        assert entry["user"] is None or len(entry["user"]) <= NAME_BOUND
    exposition = _exposition(reply)
    names = {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}
    assert all(name.startswith("tfgpu_") for name in names), names
    assert "fake_series" not in names


@pytest.mark.usefixtures("schema_checked")
def test_twenty_one_mebibyte_command_lines_weigh_what_twenty_short_ones_do():
    """The size bound does not grow with what others plant: 20 x 1 MiB against 20 x 2 KiB."""

    def size(length: int) -> int:
        server = bobs_server(size=length)
        reply = kernel_inventory.inventory(
            Nvml(lib=server), [], fake_process_table(server), clock=lambda: 1.0
        )
        return len(extension.reply_text(reply))

    assert size(MIB) == size(2 * COMMAND_BOUND)
