"""Sphinx configuration: MyST Markdown pages, the magics' reference generated from the grammar.

Built by `make docs` (sphinx-build -W --keep-going -n) into build/docs.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]  # this checkout's package, then the extension

project = "tfgpu_magic"
author = "tfgpu_magic contributors"
copyright = "tfgpu_magic contributors"
release = version = __import__("tfgpu_magic").__version__  # this checkout's, from sys.path above

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.intersphinx", "magics_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links to a heading, as on GitHub
myst_enable_extensions = ["colon_fence"]
smartquotes = False  # `--sidebar` in running text stays two hyphens, as typed (Sphinx would make it a dash)
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
# Signatures without types: the docstrings say what each argument is, and most annotations name the
# package's internal classes, which these pages do not document.
autodoc_typehints = "none"
intersphinx_mapping: dict[str, tuple[str, None]] = {}  # no network when building: nothing fetched

# Names in the documented docstrings and signatures that these pages do not document (the layers'
# internals): shown, not linked.
nitpick_ignore = [
    ("py:class", "tfgpu_magic.kernel.session.Session"),
    ("py:func", "read_parent_map"),  # gpus/process_tree.py, in HostKernelsNvml's docstring
    ("py:func", "is_ipython_kernel"),  # gpus/simulated.py, in HostKernelsNvml's docstring
    ("py:func", "choosing"),  # gpus/claims.py (what %gpu use auto holds), in claim's and holder's docstrings
    ("py:data", "MAX_NOTES"),  # gpus/claims.py, in holders' docstring
    # SimulatedGpu's dataclass fields, annotated as strings (`from __future__ import annotations`):
    # Sphinx 9 cuts `tuple[int, int]` and `dict[str, BaseException]` at the comma into these names.
    ("py:class", "'tuple[int"),
    ("py:class", "'dict[str"),
]
