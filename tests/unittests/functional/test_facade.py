"""``torchmetrics_diff.functional`` as the facade of the global layer: its public names include the ``global_*``
functions (and ``clip_sum``, ``dino_center_update``, ``global_rows_loss``, ``STRATEGIES``) that live in
``torchmetrics_diff._global``, resolved on first use by the package's module ``__getattr__``.

- Every name of ``__all__`` resolves, the global ones to the very objects of ``torchmetrics_diff._global``; the
  lazy names, the ``TYPE_CHECKING`` import (what type checkers see) and ``_global.__all__`` are the same list.
- In a fresh interpreter: importing ``functional`` loads nothing of ``_global``; ``from ... import *``,
  ``dir()`` and ``help()`` see the global names; an unknown name raises ``AttributeError``.

Package modules covered: ``functional/__init__.py``, ``_global/__init__.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import torchmetrics_diff._global as G
import torchmetrics_diff.functional as F

ROOT = Path(__file__).resolve().parents[3]


def _type_checking_names() -> set[str]:
    """The names ``functional/__init__.py`` imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse((ROOT / "torchmetrics_diff" / "functional" / "__init__.py").read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module == "torchmetrics_diff._global", ast.dump(stmt)
                names.update(alias.name for alias in stmt.names)
    return names


def test_the_lazy_names_are_the_global_layers_public_names() -> None:
    lazy = set(F._GLOBAL_NAMES)
    assert lazy == set(G.__all__)
    assert lazy == _type_checking_names()
    assert lazy <= set(F.__all__)


def test_every_public_name_resolves_to_the_same_object() -> None:
    for name in F.__all__:
        assert getattr(F, name) is not None, name
    for name in G.__all__:
        assert getattr(F, name) is getattr(G, name), name
    assert F.global_clip_loss.__module__ == "torchmetrics_diff._global.contrastive"


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'global_nothing'"):
        F.global_nothing  # noqa: B018
    assert not hasattr(F, "global_nothing")


_FRESH = """
import pydoc, sys
import torchmetrics_diff
before = "torchmetrics_diff._global" in sys.modules
import torchmetrics_diff.functional as F
loaded_by_functional = not before and "torchmetrics_diff._global" in sys.modules
names = dir(F)
star = {}
exec("from torchmetrics_diff.functional import *", star)
text = pydoc.render_doc(F)
print(loaded_by_functional, all(n in names for n in F.__all__), all(n in star for n in F.__all__),
      "global_clip_loss(" in text and "dino_center_update(" in text)
"""


@pytest.mark.one_child
def test_a_fresh_import_star_dir_and_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded, in_dir, in_star, in_help = proc.stdout.split()
    assert loaded == "False", "importing torchmetrics_diff.functional loaded torchmetrics_diff._global"
    assert (in_dir, in_star, in_help) == ("True", "True", "True"), proc.stdout
