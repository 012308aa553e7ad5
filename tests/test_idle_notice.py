"""The kernel's own notice of memory it holds unused: one line under the next cell after a pause."""

from __future__ import annotations

import os

import pytest

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedProcess, mig_server, shared_server
from tfgpu_magic.kernel import idle_notice
from tfgpu_magic.kernel.idle_notice import CULLER_ENV, IdleNotice, Thresholds
from tfgpu_magic.kernel.session import Session

GIB = 1024**3
CELL_END = 1_795_000_000.0  # 2026-11-18T11:06:40Z


class Kernel:
    """This process as a kernel holding 10 GiB on GPU 1 of shared_server, with its hooks and a clock."""

    def __init__(self, after_s=60.0, min_bytes=GIB, env=None, make=shared_server) -> None:
        self.now = CELL_END
        self.server = make(os.getpid())
        self.server.clock = lambda: self.now
        self.session = Session(nvml=Nvml(lib=self.server), env={})
        self.hooks = IdleNotice(
            self.session, lambda: Thresholds(after_s, min_bytes), clock=lambda: self.now, env=env or {}
        )

    def me(self) -> SimulatedProcess:
        return next(p for gpu in self.server.gpus for p in gpu.processes if p.pid == os.getpid())

    def cell(self, capsys, after_s: float = 0.0, work: int = 0) -> str:
        """Wait ``after_s``, then run a cell (``work``: its GPU utilization while it runs)."""
        self.now += after_s
        self.hooks.pre_run_cell()
        self.me().sm_percent = work
        self.now += 1
        self.hooks.post_run_cell()
        self.me().sm_percent = 0
        return capsys.readouterr().out


def test_after_a_long_pause_holding_memory_unused_the_next_cell_says_so(capsys):
    kernel = Kernel()
    assert kernel.cell(capsys) == ""  # the first cell: no pause known
    assert kernel.cell(capsys, after_s=30) == ""  # under the threshold: not even a reading
    calls = kernel.server.calls
    assert kernel.cell(capsys, after_s=30) == "" and kernel.server.calls == calls  # one clock reading
    said = kernel.cell(capsys, after_s=600)
    assert said == (
        "tfgpu_magic: This kernel holds 10.0 GiB of GPU memory (the driver's figure) and the driver's samples "
        "show no GPU work by it since its last cell ended, 10 min ago: `%gpu free` gives it back to your colleagues\n"
    )
    assert kernel.cell(capsys) == ""  # said once: the next cell follows at once


def test_work_on_the_gpu_during_the_pause_says_nothing(capsys):
    kernel = Kernel()
    kernel.cell(capsys)
    kernel.me().sm_percent = 50  # a thread of the kernel trains between cells
    kernel.now += 600
    kernel.hooks.pre_run_cell()
    kernel.hooks.post_run_cell()
    assert capsys.readouterr().out == ""


def test_a_process_the_kernel_started_counts_as_its_own(capsys):
    kernel = Kernel(min_bytes=12 * GIB)
    kernel.cell(capsys)
    assert kernel.cell(capsys, after_s=600) == ""  # 10 GiB < 12 GiB
    kernel.server.gpus[2].processes.append(SimulatedProcess(os.getpid(), 3072))  # its memory on GPU 2 too
    assert "13.0 GiB" in kernel.cell(capsys, after_s=600)


def test_under_the_memory_threshold_or_without_memory_nothing_is_said(capsys):
    kernel = Kernel(min_bytes=20 * GIB)
    kernel.cell(capsys)
    assert kernel.cell(capsys, after_s=600) == ""
    bare = Kernel(min_bytes=0)
    bare.server.gpus[1].processes = [p for p in bare.server.gpus[1].processes if p.pid != os.getpid()]
    bare.server.gpus[1].processes.append(SimulatedProcess(os.getpid(), 0))
    bare.cell(capsys)
    assert bare.cell(capsys, after_s=600) == ""


@pytest.mark.parametrize("fault", ["process_utilization", "processes"])
def test_a_reading_that_fails_says_nothing(capsys, fault):
    kernel = Kernel()
    kernel.server.gpus[1].faults[fault] = RuntimeError("boom")
    kernel.cell(capsys)
    assert kernel.cell(capsys, after_s=600) == ""


def test_on_mig_only_a_whole_gpu_at_zero_counts_and_there_is_no_such_figure(capsys):
    kernel = Kernel(make=mig_server)
    kernel.server.gpus[3].mig_instances[2].processes.append(SimulatedProcess(os.getpid(), 2048))
    kernel.server.gpus[1].processes = [p for p in kernel.server.gpus[1].processes if p.pid != os.getpid()]
    kernel.server.gpus[1].processes.append(SimulatedProcess(os.getpid(), 0))
    kernel.cell(capsys)
    assert kernel.cell(capsys, after_s=600) == ""  # a MIG GPU has no utilization at all: unknown


def test_the_servers_culler_deadline_is_said_when_it_applies(capsys):
    kernel = Kernel(env={CULLER_ENV: f"3600,{GIB}"})
    kernel.cell(capsys)
    said = kernel.cell(capsys, after_s=600)
    assert said.endswith(
        "; the idle culler can shut it down from 12:06 UTC if it stays idle\n"
    )  # 11:06:41 + 1 h
    for env in ({CULLER_ENV: f"3600,{20 * GIB}"}, {CULLER_ENV: "junk"}, {CULLER_ENV: "nan,1"}):
        other = Kernel(env=env)
        other.cell(capsys)
        assert "culler" not in other.cell(capsys, after_s=600)


def test_the_thresholds_are_the_magics_config(shell, session):
    from tfgpu_magic.kernel.magics import GpuMagics

    magics = GpuMagics(shell, session=session)
    assert magics.idle_thresholds() == Thresholds(600.0, GIB)
    magics.idle_notice_after = 5.0
    magics.idle_notice_min_memory = "512M"
    assert magics.idle_thresholds() == Thresholds(5.0, 512 * 1024**2)
    magics.idle_notice_min_memory = "lots"
    assert magics.idle_thresholds().min_bytes == GIB
    magics.idle_notice_after = float("nan")  # would read the driver after every cell
    assert magics.idle_thresholds().after_s == 600.0


def test_the_hooks_run_under_a_real_shells_cells(shell, session, capsys):
    clock = [CELL_END]
    session.nvml._lib.clock = lambda: clock[0]
    notice = idle_notice.install(shell, session, lambda: Thresholds(60.0, GIB))
    notice._clock = lambda: clock[0]
    try:
        shell.run_cell("1 + 1")
        capsys.readouterr()
        clock[0] += 120
        shell.run_cell("print('cell output')")
        out = capsys.readouterr().out
        assert out.index("cell output") < out.index("tfgpu_magic: This kernel holds 10.0 GiB")
        assert idle_notice.install(shell, session, lambda: Thresholds(60.0, GIB)) is not notice  # replaced
    finally:
        again = idle_notice._hooks.pop(id(shell))
        shell.events.unregister("pre_run_cell", again.pre_run_cell)
        shell.events.unregister("post_run_cell", again.post_run_cell)


def test_a_culler_that_waits_for_a_shortage_is_said_to_be_conditional(capsys):
    kernel = Kernel(env={CULLER_ENV: f"3600,1,{8 * GIB}"})
    kernel.cell(capsys)
    assert kernel.cell(capsys, after_s=600).endswith(
        "; the idle culler may shut it down from 12:06 UTC if it stays idle and the GPU runs short\n"
    )


def test_the_server_names_its_culler_in_the_kernels_it_starts():
    from tfgpu_magic.server.culler import CullPolicy
    from tfgpu_magic.server.extension import _kernel_variables

    assert _kernel_variables(None, CullPolicy()) is None
    assert _kernel_variables(None, CullPolicy(3600.0, GIB))() == {CULLER_ENV: f"3600,{GIB}"}
    both = _kernel_variables(lambda: {"A": "1"}, CullPolicy(60.0, 1, 8 * GIB))()
    assert both == {"A": "1", CULLER_ENV: f"60,1,{8 * GIB}"}
