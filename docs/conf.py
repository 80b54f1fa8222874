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
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "mathml",
]

# Formulas become MathML at build time (docs/_ext/mathml.py): they render offline, with no MathJax from a CDN.
html_math_renderer = "mathml"

# No network at build time: no intersphinx. References to torch therefore stay plain text, which is
# why nitpicky mode is off (it would flag every ``torch.Tensor`` in a signature).
nitpicky = False

# Google-style docstrings (Args / Returns / Raises / Example).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}

templates_path: list[str] = []
exclude_patterns = ["_build", "examples", "_ext"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"

html_theme = "furo"
html_title = f"torchmetrics_diff {release}"
html_static_path = ["_static"]
