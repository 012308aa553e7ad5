"""The JupyterLab extension's packaging, without a browser: names and versions that must agree
across package.json, the TypeScript sources, the Python widget and pyproject; the entry point; and
the SideArea widget behind ``%gpu monitor --sidebar``.  (tests/test_extension_browser.py drives it
in Chromium; tests/test_install.py installs the wheel into a fresh environment.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tfgpu_magic

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PACKAGE_JSON = json.loads((REPO / "package.json").read_text())
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
NAME = PACKAGE_JSON["name"]


def ts_constant(name: str) -> str:
    source = (REPO / "js" / "lab" / "version.ts").read_text()
    return re.search(rf"export const {name} = '([^']+)';", source).group(1)


def test_one_name_and_one_version_everywhere():
    from tfgpu_magic.kernel import widget

    assert NAME == "tfgpu-magic" == ts_constant("MODULE_NAME") == widget.NPM_PACKAGE
    assert PACKAGE_JSON["version"] == tfgpu_magic.__version__ == PYPROJECT["project"]["version"]
    assert ts_constant("MODULE_VERSION") == PACKAGE_JSON["version"]
    assert widget.NPM_RANGE == f"^{tfgpu_magic.__version__}"


def test_the_entry_point_names_the_built_folder_and_the_wheel_installs_it_there():
    [path] = tfgpu_magic._jupyter_labextension_paths()
    assert path == {"src": "labextension", "dest": NAME}
    assert PACKAGE_JSON["jupyterlab"]["outputDir"] == f"tfgpu_magic/{path['src']}"
    shared = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["tfgpu_magic/labextension"] == f"share/jupyter/labextensions/{NAME}"
    assert shared["install.json"] == f"share/jupyter/labextensions/{NAME}/install.json"
    install = json.loads((REPO / "install.json").read_text())
    assert install["packageManager"] == "python" and install["packageName"] == PYPROJECT["project"]["name"]


def test_the_build_hook_builds_and_checks_both_front_ends():
    hook = PYPROJECT["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    for targets in (hook["ensured-targets"], hook["skip-if-exists"]):
        assert "tfgpu_magic/static/widget.js" in targets
        assert "tfgpu_magic/labextension/package.json" in targets
    assert PACKAGE_JSON["scripts"]["build"] == "npm run build:widget && npm run build:lab"
    assert "jupyter labextension build ." in PACKAGE_JSON["scripts"]["build:lab"]
    assert any(r.startswith("jupyterlab") for r in PYPROJECT["build-system"]["requires"])
    # No "type": "module": Node would read every .js below the checkout (a .venv's included) as ESM.
    assert "type" not in PACKAGE_JSON


def test_ipywidgets_base_is_shared_not_bundled():
    shared = PACKAGE_JSON["jupyterlab"]["sharedPackages"]["@jupyter-widgets/base"]
    assert shared == {"bundled": False, "singleton": True}


def test_the_built_extension_is_this_package():
    # Built by `make setup` (pip's build of the front ends): missing is a broken setup, not a skip.
    built = json.loads((REPO / "tfgpu_magic" / "labextension" / "package.json").read_text())
    assert built["name"] == NAME and built["version"] == PACKAGE_JSON["version"]
    load = REPO / "tfgpu_magic" / "labextension" / built["jupyterlab"]["_build"]["load"]
    assert load.is_file()


def test_importing_the_package_for_its_entry_points_stays_light():
    code = (
        "import sys, tfgpu_magic\n"
        "tfgpu_magic._jupyter_labextension_paths()\n"
        "print(sorted(m for m in ('ipywidgets', 'anywidget', 'jupyterlab', 'jupyter_server', 'IPython') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- the SideArea widget ---------------------------------------------------------------------------
def test_the_side_area_names_the_extensions_model_and_view():
    from tfgpu_magic.kernel.widget import SideArea

    side = SideArea()
    try:
        state = side.get_state()
        assert (state["_model_module"], state["_view_module"]) == (NAME, NAME)
        assert (
            state["_model_module_version"] == state["_view_module_version"] == f"^{tfgpu_magic.__version__}"
        )
        assert (state["_model_name"], state["_view_name"]) == ("SideAreaModel", "SideAreaView")
        assert state["child"] is None and state["title"] == "GPU memory"
    finally:
        side.close()


def test_a_front_end_without_widgets_is_told_where_the_panel_went():
    from tfgpu_magic.kernel.widget import SideArea

    side = SideArea(title="GPU memory")
    try:
        bundle = side._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert bundle["text/plain"].startswith(
            "GPU memory: shown in the side area of JupyterLab or Notebook 7"
        )
        assert "`%gpu monitor` without --sidebar" in bundle["text/plain"]
    finally:
        side.close()


def test_sidecar_is_gone():
    assert not any(d.startswith("sidecar") for d in PYPROJECT["project"]["dependencies"])
    assert "sidecar" not in (REPO / "tfgpu_magic" / "monitor.py").read_text()


def test_the_typescript_build_keeps_its_state_inside_its_output_folder():
    """Without tsBuildInfoFile, tsc (composite, rootDir js/lab) wrote tsconfig.tsbuildinfo into the
    checkout's parent folder: a second clone in the same folder found it, took itself for up to date,
    emitted no lib/, and `make setup` failed ("Cannot find module .../lib/index.js")."""
    config = json.loads((REPO / "tsconfig.json").read_text())["compilerOptions"]
    info = Path(config["tsBuildInfoFile"])
    assert info.parts[0] == config["outDir"] and ".." not in info.parts


# -- the front ends' sources and build tools (issue 29) ---------------------------------------------
def test_every_front_end_source_is_typescript():
    sources = [p.relative_to(REPO).as_posix() for p in (REPO / "js").rglob("*") if p.suffix in {".js", ".ts"}]
    assert "js/widget.ts" in sources and "js/lab/reply.ts" in sources
    assert [s for s in sources if not s.endswith(".ts")] == []
    assert PACKAGE_JSON["scripts"]["build:widget"].startswith("esbuild js/widget.ts ")


def test_make_lint_type_checks_and_lints_all_of_js_with_the_local_binaries():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^lint: lint-python lint-js$", makefile, re.M)
    recipe = re.search(r"^lint-js:\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert (
        "\tnode_modules/.bin/tsc -p tsconfig.check.json\n" in recipe
        and "\tnode_modules/.bin/eslint js\n" in recipe
    )
    check = json.loads((REPO / "tsconfig.check.json").read_text())
    assert check["include"] == ["js/**/*.ts"] and check["compilerOptions"]["noEmit"] is True
    for tool in ("eslint", "typescript-eslint", "@eslint/js", "typescript"):
        assert re.fullmatch(r"~\d+\.\d+\.\d+", PACKAGE_JSON["devDependencies"][tool]), tool


def test_the_builder_and_the_core_metadata_resolve_together_without_overrides():
    """@jupyterlab/core-meta names the builder it works with; the lock holds exactly that pair, once each."""
    from jupyter_builder.jupyterlab_semver import satisfies

    assert "overrides" not in PACKAGE_JSON and "@jupyterlab/builder" not in PACKAGE_JSON["devDependencies"]
    packages = json.loads((REPO / "package-lock.json").read_text())["packages"]
    assert "overrides" not in packages[""]
    builder = packages["node_modules/@jupyter/builder"]
    meta = packages["node_modules/@jupyterlab/core-meta"]
    assert satisfies(meta["version"], PACKAGE_JSON["devDependencies"]["@jupyterlab/core-meta"])
    assert satisfies(meta["version"], builder["dependencies"]["@jupyterlab/core-meta"])
    core = json.loads((REPO / "node_modules" / "@jupyterlab" / "core-meta" / "core.package.json").read_text())
    assert core["version"] == meta["version"]
    assert satisfies(builder["version"], core["devDependencies"]["@jupyter/builder"])
    # One copy of each JupyterLab and Lumino package: none nested under another package.
    nested = [
        k for k in packages if k.count("node_modules/") > 1 and re.search(r"/@(jupyterlab|lumino)/[^/]+$", k)
    ]
    assert nested == []
