"""Post-import hooks (tfgpu_magic.frameworks.import_hooks), each case in a fresh Python.

A tiny package written into tmp_path stands in for TensorFlow: a hook's registry and the
finder on ``sys.meta_path`` are process-wide, so every case starts from a clean interpreter.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from support.processes import run_python

pytestmark = pytest.mark.slow  # each case starts a fresh Python

PREAMBLE = """\
import json, sys
sys.path.insert(0, {site!r})
from tfgpu_magic.frameworks.import_hooks import run_after_import
calls = []
def record(label):
    return lambda module: calls.append([label, module.__name__, getattr(module, "READY", None)])
"""


def run(tmp_path, files: dict[str, str], script: str) -> dict:
    """Write ``files`` under tmp_path/site, run ``script`` there; return the JSON it prints last."""
    site = tmp_path / "site"
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    code = PREAMBLE.format(site=str(site)) + textwrap.dedent(script)
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


PKG = {"pkg/__init__.py": "READY = 'pkg'\n", "pkg/sub.py": "READY = 'sub'\n"}


def test_a_hook_runs_once_after_the_module_has_run_and_gets_the_imported_module(tmp_path):
    result = run(
        tmp_path,
        PKG,
        """
        run_after_import("pkg", record("a"))
        before = list(calls)
        import pkg
        import pkg  # a second import runs nothing again
        print(json.dumps({"before": before, "calls": calls}))
    """,
    )
    assert result["before"] == []
    assert result["calls"] == [["a", "pkg", "pkg"]]  # READY set: the module's code had finished


def test_an_imported_module_gets_its_hook_at_once(tmp_path):
    result = run(
        tmp_path,
        PKG,
        """
        import pkg
        run_after_import("pkg", record("a"))
        print(json.dumps({"calls": calls}))
    """,
    )
    assert result["calls"] == [["a", "pkg", "pkg"]]


@pytest.mark.parametrize(
    "statement",
    ["import pkg.sub", "from pkg import sub", "import importlib; importlib.import_module('pkg.sub')"],
)
def test_a_parent_and_a_submodule_get_their_hooks_however_they_are_imported(tmp_path, statement):
    result = run(
        tmp_path,
        PKG,
        f"""
        run_after_import("pkg.sub", record("sub"))
        run_after_import("pkg", record("parent"))
        {statement}
        print(json.dumps({{"calls": calls}}))
    """,
    )
    # The parent's hook runs as soon as the parent has run, before the submodule starts.
    assert result["calls"] == [["parent", "pkg", "pkg"], ["sub", "pkg.sub", "sub"]]


def test_hooks_run_in_the_order_registered_and_a_waiting_hook_is_not_added_twice(tmp_path):
    result = run(
        tmp_path,
        PKG,
        """
        first, second = record("first"), record("second")
        run_after_import("pkg", first)
        run_after_import("pkg", second)
        run_after_import("pkg", first)
        import pkg
        print(json.dumps({"calls": [label for label, _, _ in calls]}))
    """,
    )
    assert result["calls"] == ["first", "second"]


def test_a_failed_import_keeps_the_hook_waiting_for_the_import_that_succeeds(tmp_path):
    files = {
        "flaky.py": "import os\nif os.environ.get('FAIL') == '1':\n    raise RuntimeError('broken')\nREADY = 1\n"
    }
    result = run(
        tmp_path,
        files,
        """
        import os
        run_after_import("flaky", record("a"))
        os.environ["FAIL"] = "1"
        try:
            import flaky
        except RuntimeError:
            pass
        after_failure = list(calls)
        os.environ["FAIL"] = "0"
        import flaky
        print(json.dumps({"after_failure": after_failure, "calls": calls}))
    """,
    )
    assert result["after_failure"] == []
    assert result["calls"] == [["a", "flaky", 1]]


def test_the_hook_gets_the_module_that_replaced_itself_in_sys_modules(tmp_path):
    """TensorFlow's lazy loaders put another object in sys.modules while the module runs."""
    files = {
        "swap.py": """
        import sys, types
        class Lazy(types.ModuleType):
            READY = "replacement"
        sys.modules[__name__] = Lazy(__name__)
    """
    }
    result = run(
        tmp_path,
        files,
        """
        seen = []
        run_after_import("swap", seen.append)
        import swap
        print(json.dumps({"same": seen == [swap] and swap is sys.modules["swap"], "ready": swap.READY}))
    """,
    )
    assert result == {"same": True, "ready": "replacement", "stderr": ""}


def test_the_module_keeps_its_own_loader(tmp_path):
    """inspect.getsource, importlib.resources, ... read ``__loader__``: never the wrapper."""
    result = run(
        tmp_path,
        PKG,
        """
        import importlib.machinery
        run_after_import("pkg", record("a"))
        import pkg
        loaders = [type(pkg.__loader__).__name__, type(pkg.__spec__.loader).__name__]
        print(json.dumps({"loaders": loaders, "calls": len(calls)}))
    """,
    )
    assert result["loaders"] == ["SourceFileLoader", "SourceFileLoader"]
    assert result["calls"] == 1


def test_a_failing_hook_is_reported_and_breaks_neither_the_import_nor_the_next_hook(tmp_path):
    result = run(
        tmp_path,
        PKG,
        """
        def broken(module):
            raise ValueError("hook bug")
        run_after_import("pkg", broken)
        run_after_import("pkg", record("after"))
        import pkg
        run_after_import("pkg", broken)  # already imported: runs at once, and the caller goes on
        print(json.dumps({"calls": calls, "imported": "pkg" in sys.modules}))
    """,
    )
    assert result["imported"] is True
    assert result["calls"] == [["after", "pkg", "pkg"]]
    assert result["stderr"].count("a hook run after importing 'pkg' failed (the import worked)") == 2
    assert "ValueError: hook bug" in result["stderr"]


def test_a_hook_registered_while_the_module_runs_waits_for_its_end(tmp_path):
    files = {
        "selfish.py": """
        from tfgpu_magic.frameworks.import_hooks import run_after_import
        import builtins
        run_after_import(__name__, lambda m: builtins.seen.append(getattr(m, "READY", None)))
        READY = "done"
    """
    }
    result = run(
        tmp_path,
        files,
        """
        import builtins
        builtins.seen = []
        run_after_import("selfish", record("outer"))  # watched: its import goes through the finder
        import selfish
        print(json.dumps({"seen": builtins.seen, "calls": calls}))
    """,
    )
    assert result["seen"] == ["done"]
    assert result["calls"] == [["outer", "selfish", "done"]]


def test_imports_racing_in_threads_run_the_hook_once_and_all_wait_for_it(tmp_path):
    files = {"slow.py": "import time\ntime.sleep(0.2)\nREADY = True\n"}
    result = run(
        tmp_path,
        files,
        """
        import threading, time
        def configure(module):
            time.sleep(0.1)  # the other threads' `import slow` must not return before this is done
            module.CONFIGURED = True
            calls.append(module.__name__)
        run_after_import("slow", configure)
        seen = []
        def importer():
            import slow
            seen.append(getattr(slow, "CONFIGURED", False))
        threads = [threading.Thread(target=importer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"calls": calls, "seen": seen}))
    """,
    )
    assert result["calls"] == ["slow"]
    assert result["seen"] == [True] * 8


def test_an_old_style_loader_with_only_load_module_gets_its_hook(tmp_path):
    result = run(
        tmp_path,
        {},
        """
        import importlib.util, types, warnings
        warnings.simplefilter("ignore", ImportWarning)  # the import system's note on load_module
        class OldLoader:
            def load_module(self, fullname):
                module = sys.modules.setdefault(fullname, types.ModuleType(fullname))
                module.READY = "old"
                return module
        class OldFinder:
            def find_spec(self, fullname, path=None, target=None):
                return importlib.util.spec_from_loader(fullname, OldLoader()) if fullname == "oldie" else None
        sys.meta_path.append(OldFinder())
        run_after_import("oldie", record("a"))
        import oldie
        print(json.dumps({"calls": calls, "loader": type(oldie.__loader__).__name__}))
    """,
    )
    assert result["calls"] == [["a", "oldie", "old"]]
    assert result["loader"] == "OldLoader"


def test_other_imports_are_left_to_the_other_finders(tmp_path):
    result = run(
        tmp_path,
        PKG,
        """
        run_after_import("pkg", record("a"))
        finder = sys.meta_path[0]
        print(json.dumps({"json": finder.find_spec("json"), "pkg": finder.find_spec("pkg") is not None}))
    """,
    )
    assert result["json"] is None  # not watched: answered at once, found by the next finder
    assert result["pkg"] is True


def test_loading_the_extension_leaves_wrapt_and_what_only_errors_need_out(tmp_path):
    """wrapt (and the asyncio, ssl, importlib.metadata it imports) was most of `%load_ext`'s cost;
    the out-of-memory explanation and the no-GPU diagnosis load when they are needed."""
    result = run(
        tmp_path,
        {},
        """
        import tfgpu_magic
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tfgpu_magic")
        later = ("wrapt", "tensorflow", "tfgpu_magic.kernel.oom", "tfgpu_magic.frameworks.tensorflow_diagnosis")
        print(json.dumps({"loaded": sorted(m for m in later if m in sys.modules)}))
    """,
    )
    assert result["loaded"] == []


def test_an_import_asks_each_finder_once_watched_or_not(tmp_path):
    """What the hooks add to an import: one call of our finder, a dict lookup for a module nobody
    watches; for a watched one it asks the finders after it itself, and the import system, given
    that spec, asks none of them again.  So no finder runs twice (issue 32, item 5)."""
    result = run(
        tmp_path,
        {**PKG, "plain.py": "READY = 'plain'\n"},
        """
        run_after_import("pkg", record("a"))
        ours, asked = sys.meta_path[0], []

        class Counting:
            def find_spec(self, name, path=None, target=None):
                asked.append(name)
                return None

        sys.meta_path.insert(1, Counting())
        our_calls = []
        find_spec = type(ours).find_spec
        type(ours).find_spec = lambda self, *a: our_calls.append(a[0]) or find_spec(self, *a)
        import plain, pkg
        print(json.dumps({"asked": asked, "ours": our_calls, "calls": calls}))
    """,
    )
    assert result["ours"] == ["plain", "pkg"]
    assert result["asked"] == ["plain", "pkg"]  # each once: by the import system, by our finder for pkg
    assert result["calls"] == [["a", "pkg", "pkg"]]
