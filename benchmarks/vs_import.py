"""What the extension adds to ``import torch``, ``import jax`` and ``import tensorflow``, in fresh processes.

Run by ``compare.py`` as a child process (``python benchmarks/vs_import.py ROUNDS [FRAMEWORK ...]``),
which prints one JSON line.  Each round starts one fresh Python process per framework and mode,
the modes' order rotating round by round, and times the framework's import in it:

- ``off``: a plain IPython shell, the extension not loaded;
- ``light``: ``%load_ext tfgpu_magic`` first (the light load: nothing asks for the session yet),
  so the framework's import is the first use and its hook builds the session;
- ``built``: ``%load_ext`` and the session built before (as after a first ``%gpu``), so the
  hooks only hand the import to the session and its adapter;
- ``off+objects``: ``off``, with 3,000 small lists kept alive before the import, fewer objects
  than the light load and the session leave behind and than any notebook's state: the control
  for the collector's passes.  CPython runs a full pass when the count of younger passes reaches
  its threshold (and enough objects await one), so how many fall in an import depends on where
  those counters stood when it began, which any allocation before it moves.

In each process: the import's wall time; the time spent in our hooks (every outermost call of
``import_hooks._run``: all our code that runs inside the import), and of it the framework's own
calls: ``torch.cuda._lazy_call``, which the PyTorch adapter calls to hear of CUDA's start and which
records its caller's stack (``traceback.format_stack``, reading the source lines of every frame);
the calls of our finder (one
per module the import system looks for, each a dict lookup for a module nobody waits for); and
the garbage collector's passes during the import, per generation, and their time (``gc.callbacks``).
Separately, one finder call for a module nobody watches is timed in this process (``timeit``).

The import's wall time differs between modes by the hooks' time plus noise of the machine (a
TensorFlow import spreads by a few hundred ms on a busy VM): the hooks' time is the figure to
read; the wall times and the gc passes say whether anything else moved.  No assertion.

Everything runs from compiled bytecode, as an installed package does (see ``vs_startup.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import timeit
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from timing import summary  # noqa: E402

FRAMEWORKS = ("torch", "jax", "tensorflow")
MODES = ("off", "off+objects", "light", "built")
HELD_OBJECTS = 3000  # what ``off+objects`` keeps alive before the import: less than any notebook's state

CHILD = r"""
import gc, sys, time
framework, mode = sys.argv[1], sys.argv[2]
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
held = [[n] for n in range(HELD_OBJECTS)] if mode == "off+objects" else []
if not mode.startswith("off"):
    shell.run_line_magic("load_ext", "tfgpu_magic")
if mode == "built":
    from tfgpu_magic.kernel.session import get_session

    get_session()
ours = {"ms": 0.0, "depth": 0, "finder_calls": 0, "framework_ms": 0.0}
if not mode.startswith("off"):
    from tfgpu_magic.frameworks import import_hooks

    run_hooks, find_spec = import_hooks._run, import_hooks._PostImportFinder.find_spec

    def timed_lazy_call(lazy_call):
        # torch's own torch.cuda._lazy_call, which the adapter calls to hear of CUDA's start:
        # timed apart, as the framework's own time inside our hooks (it records the caller's stack).
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return lazy_call(*args, **kwargs)
            finally:
                ours["framework_ms"] += (time.perf_counter() - start) * 1000
        return timed

    def timed_run(name, hooks, module):
        cuda = getattr(module, "cuda", None) if name == "torch" and ours["depth"] == 0 else None
        lazy_call = getattr(cuda, "_lazy_call", None)
        if lazy_call is not None:
            cuda._lazy_call = timed_lazy_call(lazy_call)
        ours["depth"] += 1
        start = time.perf_counter()
        try:
            run_hooks(name, hooks, module)
        finally:
            ours["depth"] -= 1
            if ours["depth"] == 0:  # a hook that imports a watched module runs hooks inside: counted once
                ours["ms"] += (time.perf_counter() - start) * 1000
            if lazy_call is not None:
                cuda._lazy_call = lazy_call

    def counted_find_spec(self, *args):
        ours["finder_calls"] += 1
        return find_spec(self, *args)

    import_hooks._run = timed_run
    import_hooks._PostImportFinder.find_spec = counted_find_spec
passes, gc_ms, gc_start = [0, 0, 0], [0.0, 0.0, 0.0], [0.0]

def on_gc(phase, info):
    if phase == "start":
        gc_start[0] = time.perf_counter()
    else:
        generation = info["generation"]
        passes[generation] += 1
        gc_ms[generation] += (time.perf_counter() - gc_start[0]) * 1000

modules = len(sys.modules)
gc.callbacks.append(on_gc)
start = time.perf_counter()
__import__(framework)
import_ms = (time.perf_counter() - start) * 1000
gc.callbacks.remove(on_gc)
print(
    __import__("json").dumps(
        {
            "import_ms": import_ms,
            "hooks_ms": ours["ms"],
            "framework_ms": ours["framework_ms"],
            "finder_calls": ours["finder_calls"],
            "modules": len(sys.modules) - modules,
            "gc_passes": passes,
            "gc_ms": gc_ms,
        }
    )
)
"""


def in_fresh_process(framework: str, mode: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # No inherited CUDA variable, saved settings or notebook: the load stays light, as in a plain notebook.
    for name in (
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "TFGPU_MAGIC_NOTEBOOK_SETTINGS",
        "JPY_SESSION_NAME",
    ):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD.replace("HELD_OBJECTS", str(HELD_OBJECTS)), framework, mode],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"import {framework} ({mode}) failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def finder_call_ns(runs: int = 200_000) -> float:
    """One call of our finder for a module nobody watches (what every other import pays), in ns."""
    from tfgpu_magic.frameworks import import_hooks

    finder = import_hooks._FINDER
    seconds = min(timeit.repeat(lambda: finder.find_spec("json.decoder", None, None), number=runs, repeat=5))
    empty = min(timeit.repeat(lambda: None, number=runs, repeat=5))  # the lambda's own call
    return max(0.0, seconds - empty) / runs * 1e9


def compile_all() -> None:
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "tfgpu_magic"), quiet=1)


def main() -> None:
    rounds = int(sys.argv[1])
    frameworks = sys.argv[2:] or list(FRAMEWORKS)
    compile_all()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {f: {m: [] for m in MODES} for f in frameworks}
    for round_ in range(rounds):
        for framework in frameworks:
            shift = round_ % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                runs[framework][mode].append(in_fresh_process(framework, mode))
    result: dict[str, Any] = {
        "finder_call_ns": finder_call_ns(),
        "held_objects": HELD_OBJECTS,
        "frameworks": {},
    }
    for framework, by_mode in runs.items():
        result["frameworks"][framework] = {
            mode: {
                "import_ms": summary([r["import_ms"] for r in found]),
                "hooks_ms": summary([r["hooks_ms"] for r in found]),
                # Of the hooks' time, the framework's own calls (torch's _lazy_call), and ours alone.
                "framework_ms": summary([r.get("framework_ms", 0.0) for r in found]),
                "ours_ms": summary([r["hooks_ms"] - r.get("framework_ms", 0.0) for r in found]),
                "finder_calls": max(r["finder_calls"] for r in found),
                "modules": max(r["modules"] for r in found),
                "gen2_passes": sorted(r["gc_passes"][2] for r in found),
                "gc_ms": summary([sum(r["gc_ms"]) for r in found]),
                "samples": found,
            }
            for mode, found in by_mode.items()
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
