"""A process's parents and children, read from the operating system.

Which processes descend from which: the server extension attributes a GPU process to the
kernel it descends from, and the simulated server finds the Jupyter server's kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import owners

__all__ = ["MAX_ANCESTRY", "children_of", "descendants", "read_ancestry", "read_parent_map"]

MAX_ANCESTRY = 64  # parents followed above one pid: more than any real process tree is deep


def read_ancestry(pids: Iterable[int]) -> dict[int, int]:
    """``{pid: ppid}`` for each live pid given and every ancestor above it, up to init.

    Enough to tell which kernel a GPU process descends from, at the cost of a few small reads
    per pid (ancestors shared by several pids are read once).  A pid that has exited or is a
    zombie is left out: it has exited, only its parent has not yet collected it (a kernel killed
    a moment ago is one until its manager notices).
    """
    parents: dict[int, int] = {}
    for pid in pids:
        for _ in range(MAX_ANCESTRY):
            if pid <= 1 or pid in parents:
                break
            ppid = owners.parent_of(pid)
            if ppid is None:
                break
            parents[pid] = ppid
            pid = ppid
    return parents


def read_parent_map() -> tuple[dict[int, int], str | None]:
    """Every running process's parent, ``{pid: ppid}``, from one psutil scan, and a note if it failed.

    A whole-table scan (milliseconds per thousand processes): the simulated server uses it to
    find the Jupyter server's kernels; the inventory reads only ancestries.  A zombie is left out: it has exited, only its parent has not yet collected it (a kernel
    killed a moment ago is one until its manager notices).
    """
    try:
        import psutil  # not at import: the package stays light
    except ImportError:
        return {}, "psutil is not installed: a kernel's child processes are not counted as the kernel's"
    parents: dict[int, int] = {}
    try:
        for proc in psutil.process_iter(["ppid", "status"]):
            ppid, status = proc.info.get("ppid"), proc.info.get("status")
            if ppid is not None and status != psutil.STATUS_ZOMBIE:  # ppid None: vanished during the scan
                parents[proc.pid] = ppid
    except Exception as err:  # psutil.Error, OSError: a partial map still serves
        return parents, f"the process tree could not be read entirely ({type(err).__name__}: {err})"
    return parents, None


def children_of(parents: Mapping[int, int]) -> dict[int, list[int]]:
    """The parent map turned around: ``{ppid: [pids]}``."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), sorted."""
    found: set[int] = set()
    waiting = list(children.get(pid, []))
    while waiting:
        child = waiting.pop()
        if child in found or child == pid:  # a map read while pids are reused may hold a cycle
            continue
        found.add(child)
        waiting.extend(children.get(child, []))
    return sorted(found)
