"""Sphinx configuration of the torchmetrics_diff documentation (``make docs``: warnings are errors)."""

from __future__ import annotations

import sys
from pathlib import Path

# Import the package from this checkout, whether or not it is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))  # the local extensions (mathml)

import torchmetrics_diff

project = "torchmetrics_diff"
author = "torchmetrics_diff contributors"
copyright = "torchmetrics_diff contributors"
release = torchmetrics_diff.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "mathml",
]

# Formulas become MathML at build time (docs/_ext/mathml.py): they render offline, with no MathJax from a CDN.
html_math_renderer = "mathml"

# Every cross-reference must resolve (``make docs`` also passes ``-n``). The build needs no network: the
# inventories of Python and torch are small local files listing the names these docs reference (a new external
# name in a docstring fails the build until its line is added there).
nitpicky = True
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", "_inventories/python.txt"),
    "torch": ("https://docs.pytorch.org/docs/stable/", "_inventories/torch.txt"),
}

# Google-style docstrings (Args / Returns / Raises / Example).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"  # a type beside every documented argument
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
# Aliases in signatures, shown as the documented name they stand for.
autodoc_type_aliases = {
    "NanStrategy": "torchmetrics_diff.aggregation.NanStrategy",
    "Group": "torch.distributed.ProcessGroup",
    "Generator": "torch.Generator",
}


def _public_bases(app: object, name: str, obj: type, options: object, bases: list) -> None:
    """Only public classes under "Bases:": a private base (an underscore name, or a class that says
    ``_internal_base = True``) gives way to its own bases, and torch's classes go by their documented path
    (``torch.nn.Module``, not ``torch.nn.modules.module.Module``)."""
    import torch

    public: list = []
    todo = list(bases)
    while todo:
        base = todo.pop(0)
        if base.__name__.startswith("_") or base.__dict__.get("_internal_base", False):
            todo[:0] = [b for b in base.__bases__ if b not in public and b not in todo]
        elif base not in public:
            public.append(base)
    # a private base's own bases can be ancestors of another base (a private base deriving from ``Metric`` beside
    # a public ``Metric`` subclass, say): they say nothing that base does not
    public = [b for b in public if not any(c is not b and issubclass(c, b) for c in public)]
    bases[:] = [
        f":py:class:`torch.nn.{b.__name__}`"
        if b.__module__.startswith("torch.nn.") and getattr(torch.nn, b.__name__, None) is b
        else b
        for b in public
    ]


def setup(app: object) -> None:
    app.connect("autodoc-process-bases", _public_bases)  # type: ignore[attr-defined]


templates_path: list[str] = []
exclude_patterns = ["_build", "examples", "_ext"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"

html_theme = "furo"
html_title = f"torchmetrics_diff {release}"
html_static_path = ["_static"]
