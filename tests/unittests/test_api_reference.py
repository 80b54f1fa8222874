"""The API reference: every cross-reference of the docs resolves, and every public name has an entry.

The docs are built as ``make docs`` builds them (warnings are errors, nitpicky mode: a reference to a name that
is not documented, here or in the local Python and torch inventories, is a warning), with Sphinx's ``dummy``
builder, which resolves every reference but writes no HTML. The build runs in a subprocess (autodoc imports the
package and registers docutils roles; none of that should leak into the test process) that reports its warnings
and the Python objects it documented.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("sphinx")

pytestmark = pytest.mark.one_child  # Sphinx builds in one child process

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


# ---------------------------------------------------------------------------------- every argument documented
#: the sections that name a callable's parameters (``Attributes`` for the fields of a named tuple)
_SECTION = re.compile(r"^\s*(Args|Attributes):\n(?P<body>.*?)(?=^\s*[A-Z][A-Za-z ]*:\n|\Z)", re.M | re.S)


def _documented(doc: str | None) -> set[str]:
    """The parameter names that ``doc``'s ``Args:``/``Attributes:`` sections describe (``name: ...`` entries)."""
    names: set[str] = set()
    for section in _SECTION.finditer(inspect.cleandoc(doc or "")):
        names.update(re.findall(r"^ {4}\**(\w+)(?: \([^)]*\))?:", section["body"], re.M))
    return names


def _public_callables() -> dict[str, Any]:
    found: dict[int, tuple[str, Any]] = {}
    for module in (*PUBLIC_MODULES, *(f"torchmetrics_diff.{m}" for m in ("classification", "regression", "retrieval"))):
        mod = importlib.import_module(module)
        defined = [n for n, obj in vars(mod).items() if getattr(obj, "__module__", None) == module]
        names = getattr(mod, "__all__", None) or [n for n in defined if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name)
            if (inspect.isclass(obj) and not issubclass(obj, BaseException)) or inspect.isfunction(obj):
                found.setdefault(id(obj), (f"{module}.{name}", obj))
    return dict(found.values())


def _undocumented(obj: Any) -> list[str]:
    """The parameters of ``obj``'s signature that its docstring's Args do not name (``*args`` stands for the
    positional parameters the docstring names one by one)."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return []
    named = _documented(obj.__doc__)
    return [p.name for p in params if p.kind is not p.VAR_POSITIONAL and p.name not in named]


def test_every_public_callable_documents_every_argument() -> None:
    """Each public function and class names each of its parameters in ``Args:`` (a named tuple's fields in
    ``Attributes:``), so the reference is complete without reading the source."""
    callables = _public_callables()
    assert len(callables) > 150, f"only {len(callables)} public callables found: the scan reads nothing"
    public = {id(obj) for obj in callables.values()}

    def checked(obj: Any) -> bool:  # a class whose ``__init__`` a public base defines: documented with that base
        owner = next((c for c in obj.__mro__ if "__init__" in vars(c)), obj) if inspect.isclass(obj) else obj
        return owner is obj or id(owner) not in public

    missing = {name: gaps for name, obj in callables.items() if checked(obj) and (gaps := _undocumented(obj))}
    assert not missing, "\n".join(f"{name}: {gaps}" for name, gaps in sorted(missing.items()))


def test_the_argument_check_sees_a_missing_entry() -> None:
    def documented(a: int, b: int = 0) -> None:
        """Example.

        Args:
            a: the first.
            b: the second.
        """

    def forgotten(a: int, b: int = 0, **kwargs: Any) -> None:
        """Example.

        Args:
            a: the first (``b: int`` in prose does not count).

        Returns:
            Nothing.
        """

    assert _undocumented(documented) == []
    assert _undocumented(forgotten) == ["b", "kwargs"]
