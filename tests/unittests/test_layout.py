"""The package's layout, read from its source with ``ast`` (nothing is imported), and the repository's wording.

- No import cycle between the modules of ``torchmetrics_diff``, counting imports inside functions and under
  ``if TYPE_CHECKING:`` too: every ``import a.b.c``, ``from a.b import c`` and relative ``from . import x`` /
  ``from ..m import y`` is an edge.
- No private name (``_x``) imported from another subpackage. The subpackages are the root package
  (``torchmetrics_diff/*.py``) and each top-level folder (``distributed/``, ``functional/``, ``_global/``,
  ``losses/``, ..., with whatever folders they hold). Importing a private *module* (``distributed._backend``) is
  allowed; importing a private *name* (``from torchmetrics_diff.metric import _detach`` into ``losses/``) is not,
  except for the commented entries of :data:`PRIVATE_ALLOWED`.
- Arrows point down (:data:`LAYERS`): ``distributed`` imports nothing else of the package, ``functional``
  nothing either (it is pure: no communication, no metric), the global layer ``_global`` only ``functional`` and
  ``distributed``; only ``integrations`` imports ``wrappers``, and nothing imports ``integrations``. The one
  exception is listed in :data:`LAZY_FACADES` with its reason: the package ``torchmetrics_diff.functional``
  (its ``__init__``, no other module of ``functional/``) offers the public names of ``_global``, imported in its
  module ``__getattr__`` on first use and under ``if TYPE_CHECKING:`` for type checkers — lazily only: an eager
  import there fails the test. A planted import proves that the check fails when ``functional`` reaches up.
- No module of the package is longer than :data:`MAX_LINES` lines, except those of :data:`LONG_MODULES`, each
  with its reason.
- No file of the package, the docs, the tests or the benchmarks cites a design file's sections or a tracker
  number: the design lives in ``docs/guide/architecture.rst``, linked by section.

Package modules covered: every module of ``torchmetrics_diff``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "torchmetrics_diff"

#: ``(importing subpackage, module the name comes from, name)`` -> why the private name may cross
PRIVATE_ALLOWED: dict[tuple[str, str, str], str] = {}

#: what a subpackage may import of the rest of the package; subpackages not listed may import anything
LAYERS = {
    f"{PACKAGE}.distributed": set(),
    f"{PACKAGE}.functional": set(),
    f"{PACKAGE}._global": {f"{PACKAGE}.functional", f"{PACKAGE}.distributed"},
}
#: ``(importing module, imported module)`` -> why that one import may go against :data:`LAYERS`; it must be lazy
#: (inside a function, or under ``if TYPE_CHECKING:``), so that importing the importer loads nothing above it
LAZY_FACADES: dict[tuple[str, str], str] = {
    (f"{PACKAGE}.functional", f"{PACKAGE}._global"): (
        "the public names of torchmetrics_diff.functional include the global layer's (global_clip_loss, ...); "
        "the package's __init__ resolves them in its module __getattr__ on first use, and imports them under "
        "TYPE_CHECKING for type checkers, so functional/ stays pure at import time"
    ),
}
NOT_IMPORTED = f"{PACKAGE}.integrations"
#: the wrappers sit above the metrics and collections and below the integrations: only these import them
WRAPPERS = f"{PACKAGE}.wrappers"
WRAPPERS_IMPORTED_BY = {WRAPPERS, NOT_IMPORTED}

#: the longest a module of the package may be, in lines ...
MAX_LINES = 600
#: ... except these (paths from the repository root), each with its reason; an entry no longer needed fails
LONG_MODULES: dict[str, str] = {
    f"{PACKAGE}/metric.py": (
        "the Metric lifecycle read in one file: its states, update and compute, forward and the hooks of its batch "
        "step, sync, state_dict, pickling and copies, repr and plot, with no base class split off"
    ),
}

#: searched by the wording test; generated folders are skipped
WORDING_DIRS = (PACKAGE, "docs", "tests", "benchmarks")
SKIPPED_DIRS = {"_build", "__pycache__", ".ipynb_checkpoints", "generated", "_autosummary"}
TEXT_SUFFIXES = {".py", ".rst", ".md", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json", ".html", ".css"}
# written so that this file does not match its own patterns
CITATIONS = re.compile("DESIGN(?:\\.md)?\\s*\u00a7|issue #?[0-9]")


class Import(NamedTuple):
    importer: str  # the module whose source holds the import
    line: int
    target: str  # the package module it imports (the longest existing module prefix)
    name: str | None  # the name taken from ``target`` by ``from target import name``, else None
    lazy: bool = False  # inside a function or under ``if TYPE_CHECKING:``: not run when the importer is imported


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its folder's name)."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return out


def _resolve(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``dotted`` that is a package module, or None outside the package."""
    while dotted not in modules:
        if "." not in dotted:
            return None
        dotted = dotted.rsplit(".", 1)[0]
    return dotted


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node`` (as ``ast.walk``), with whether it runs only later or never at import: inside a
    function (or lambda) body or the body of an ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        yield child, lazy
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, True)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, lazy
                yield from _walk(stmt, lazy)
        else:
            yield from _walk(child, lazy)


def _imports(modules: dict[str, Path]) -> Iterator[Import]:
    """Every import of a package module by a package module, at any depth of the source (functions and
    ``if TYPE_CHECKING:`` blocks too, marked ``lazy``)."""
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node, lazy in _walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(alias.name, modules)
                    if target is not None:
                        yield Import(name, node.lineno, target, None, lazy)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                origin = _resolve(source, modules)
                if origin is None:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:  # ``from pkg import module``: the edge goes to the module
                        yield Import(name, node.lineno, submodule, None, lazy)
                    else:
                        yield Import(name, node.lineno, origin, alias.name, lazy)


def _where(imp: Import, modules: dict[str, Path]) -> str:
    path = modules[imp.importer]
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{imp.line}"


def _subpackage(module: str) -> str:
    """The root package for ``torchmetrics_diff/*.py``, else the top-level folder the module lies in."""
    parts = module.split(".")
    if len(parts) == 1:
        return PACKAGE
    folder = f"{PACKAGE}.{parts[1]}"
    is_folder = (ROOT / PACKAGE / parts[1]).is_dir()
    return folder if is_folder else PACKAGE


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        if len(component) < 2:
            continue
        start = min(component)
        paths = {start: [start]}
        todo = [start]
        while todo:  # breadth first: the shortest way back to ``start`` inside the component
            v = todo.pop(0)
            for w in sorted(edges[v] & component):
                if w == start:
                    cycles.append([*paths[v], start])
                    todo = []
                    break
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    todo.append(w)
    return sorted(cycles)


def test_no_import_cycle() -> None:
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], dict[str, None]] = {}  # the import lines of each edge, in order, once each
    for imp in _imports(modules):
        if imp.target != imp.importer:
            edges[imp.importer].add(imp.target)
            lines.setdefault((imp.importer, imp.target), {})[_where(imp, modules)] = None
    cycles = _cycles(edges)
    report = []
    for cycle in cycles:
        steps = [f"    {a} -> {b}  ({', '.join(lines[a, b])})" for a, b in zip(cycle, cycle[1:])]
        report.append(" -> ".join(cycle) + "\n" + "\n".join(steps))
    assert not cycles, f"{len(cycles)} import cycle(s) in the package:\n" + "\n".join(report)


def test_no_private_name_crosses_subpackages() -> None:
    modules = _modules()
    found = []
    for imp in _imports(modules):
        if imp.name is None or not imp.name.startswith("_") or imp.name.startswith("__"):
            continue
        importer, origin = _subpackage(imp.importer), _subpackage(imp.target)
        if importer != origin and (importer, imp.target, imp.name) not in PRIVATE_ALLOWED:
            found.append(f"{_where(imp, modules)}: {imp.importer} imports {imp.name} from {imp.target}")
    assert not found, f"{len(found)} private name(s) imported from another subpackage:\n" + "\n".join(found)


def test_allow_list_entries_are_used_and_explained() -> None:
    modules = _modules()
    used = {(_subpackage(i.importer), i.target, i.name) for i in _imports(modules) if i.name is not None}
    stale = [entry for entry in PRIVATE_ALLOWED if entry not in used]
    unexplained = [entry for entry, why in PRIVATE_ALLOWED.items() if len(why.split()) < 3]
    assert not stale, f"allow-list entries no import needs any more: {stale}"
    assert not unexplained, f"allow-list entries without a reason: {unexplained}"


def _against_the_layers(modules: dict[str, Path]) -> list[str]:
    """Each import of ``modules`` that points up (or sideways) against :data:`LAYERS`, as a line of a report."""
    found = []
    for imp in _imports(modules):
        layer, target = _subpackage(imp.importer), _subpackage(imp.target)
        if target == layer:
            continue
        where = f"{_where(imp, modules)}: {imp.importer} imports {imp.target}"
        allowed = LAYERS.get(layer)
        facade = (imp.importer, imp.target) in LAZY_FACADES
        if facade and not imp.lazy:
            found.append(f"{where} eagerly (the facade's import must be in a function or under TYPE_CHECKING)")
        elif allowed is not None and target not in allowed and not facade:
            may = ", ".join(sorted(allowed)) or "nothing else of the package"
            found.append(f"{where} ({layer} may import {may})")
        if target == NOT_IMPORTED:
            found.append(f"{where} (nothing may import it)")
        if target == WRAPPERS and layer not in WRAPPERS_IMPORTED_BY:
            found.append(f"{where} (only integrations may)")
    return found


def test_arrows_point_down() -> None:
    found = _against_the_layers(_modules())
    assert not found, f"{len(found)} import(s) against the layers:\n" + "\n".join(found)


def test_lazy_facades_are_used_and_explained() -> None:
    modules = _modules()
    used = {(i.importer, i.target) for i in _imports(modules)}
    stale = [entry for entry in LAZY_FACADES if entry not in used]
    unexplained = [entry for entry, why in LAZY_FACADES.items() if len(why.split()) < 3]
    assert not stale, f"facade entries no import needs any more: {stale}"
    assert not unexplained, f"facade entries without a reason: {unexplained}"


#: planted into ``functional/``: each source must be reported by the layer check (module name -> source)
_PLANTED = {
    "_planted_sync": "from torchmetrics_diff.distributed import all_reduce\n",
    "_planted_private_sync": "import torchmetrics_diff.distributed._call\n",
    "_planted_global": "def f():\n    from torchmetrics_diff._global.strategy import checked_together\n",
    "_planted_typing": "if TYPE_CHECKING:\n    from torchmetrics_diff._global import global_clip_loss\n",
    "_planted_root": "from torchmetrics_diff.metric import Metric\n",
    "_planted_relative": "from ..distributed import all_reduce\n",
}


def test_the_layer_check_fails_when_functional_imports_the_sync_layer(tmp_path: Path) -> None:
    """Run the check of :func:`test_arrows_point_down` on the package plus planted ``functional/`` modules that
    reach up (to ``distributed``, to ``_global`` from a function or under ``TYPE_CHECKING`` — only the facade
    ``functional/__init__`` may — to the root package, relatively), and on a facade that imports ``_global``
    eagerly: every planted import is reported, and nothing else."""
    modules = _modules()
    planted = dict(modules)
    for stem, source in _PLANTED.items():
        path = tmp_path / f"{stem}.py"
        path.write_text(source, encoding="utf-8")
        planted[f"{PACKAGE}.functional.{stem}"] = path
    facade = tmp_path / "__init__.py"  # the facade with an eager upward import added at its top
    facade.write_text(
        "from torchmetrics_diff._global import global_clip_loss\n" + modules[f"{PACKAGE}.functional"].read_text(),
        encoding="utf-8",
    )
    planted[f"{PACKAGE}.functional"] = facade
    found = _against_the_layers(planted)
    reported = {line.split(":", 1)[0] for line in found}
    assert reported == {str(tmp_path / f"{stem}.py") for stem in _PLANTED} | {str(facade)}, "\n".join(found)
    assert any("eagerly" in line for line in found if line.startswith(str(facade))), found
    assert _against_the_layers(modules) == []


def test_no_module_is_longer_than_the_limit() -> None:
    """One job per file: a module over :data:`MAX_LINES` lines is split, unless :data:`LONG_MODULES` says why not."""
    lengths = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in _modules().values()
    }
    over = {path: n for path, n in lengths.items() if n > MAX_LINES}
    unexplained = {path: n for path, n in over.items() if path not in LONG_MODULES}
    stale = [path for path in LONG_MODULES if path not in over]
    assert not unexplained, f"modules over {MAX_LINES} lines (split them, or list them with a reason): {unexplained}"
    assert not stale, f"LONG_MODULES entries no longer over {MAX_LINES} lines: {stale}"
    assert all(len(why.split()) >= 3 for why in LONG_MODULES.values()), "a LONG_MODULES entry without a reason"


def _text_files() -> Iterator[Path]:
    for top in WORDING_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIPPED_DIRS.intersection(rel.parts):
                yield path


def test_no_design_file_sections_or_tracker_numbers() -> None:
    found = []
    for path in _text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if CITATIONS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, (
        f"{len(found)} line(s) cite a design file's sections or a tracker number (link the section of "
        "docs/guide/architecture.rst, or say it in words):\n" + "\n".join(found)
    )
