"""The API reference: every cross-reference of the docs resolves, and every public name has an entry.

The docs are built as ``make docs`` builds them (warnings are errors, nitpicky mode: a reference to a name that
is not documented, here or in the local Python and torch inventories, is a warning), with Sphinx's ``dummy``
builder, which resolves every reference but writes no HTML. The build runs in a subprocess (autodoc imports the
package and registers docutils roles; none of that should leak into the test process) that reports its warnings
and the Python objects it documented.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("sphinx")

#: the modules whose public names the reference must document, each under that module's path: ``__all__``, or
#: for a module without one, the public functions and classes it defines (not the names it imports)
PUBLIC_MODULES = (
    "torchmetrics_diff",
    "torchmetrics_diff.losses",
    "torchmetrics_diff.functional",
    "torchmetrics_diff.distributed",
    "torchmetrics_diff.integrations.lightning",
    "torchmetrics_diff.integrations.accelerate",
    "torchmetrics_diff.wrappers",
)

_BUILD = """
import io, json, sys
from sphinx.application import Sphinx
from sphinx.util.console import nocolor

nocolor()

src, out = sys.argv[1], sys.argv[2]
warnings = io.StringIO()
app = Sphinx(src, src, out, out + "/.doctrees", "dummy", status=None, warning=warnings, freshenv=True,
             confoverrides={"nitpicky": True}, keep_going=True)
app.build()
objects = sorted(app.env.get_domain("py").objects)
print(json.dumps({"warnings": warnings.getvalue(), "objects": objects}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("docs")
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_docs_build_without_a_warning_in_nitpicky_mode(built: dict) -> None:
    assert built["warnings"] == "", built["warnings"]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_a_reference_entry(built: dict, module: str) -> None:
    mod = importlib.import_module(module)
    defined = [name for name, obj in vars(mod).items() if getattr(obj, "__module__", None) == module]
    names = getattr(mod, "__all__", None) or [name for name in defined if not name.startswith("_")]
    assert names, f"{module} exports nothing"
    documented = set(built["objects"])
    missing = [name for name in names if f"{module}.{name}" not in documented]
    assert not missing, f"{module}: no entry in the API reference for {missing}"
