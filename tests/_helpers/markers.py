"""Which tests spawn processes or compile, decided from what they call, never from their names.

``tests/conftest.py`` marks every collected test with the tier markers it needs:

* ``distributed``: the test (or a fixture it uses, or a function either calls, followed through the test
  modules and ``tests._helpers``) reaches a process-spawning primitive: the gloo harness
  (:func:`~tests._helpers.harness.run_distributed`, :func:`~tests._helpers.harness.run_once`), ``subprocess``,
  ``multiprocessing``/``mp.spawn`` or ``torchrun``;
* ``compile``: it reaches ``torch.compile`` (or ``torch._dynamo.optimize``).

The analysis reads the source (``ast``): a test's body, decorators (parametrize values) and fixtures; from there
every module-level name it references, in its own module or imported from ``tests.*``, transitively. It is
conservative (a name referenced is a name called). What it misses is caught at run time: the conftest's guard
(:func:`guard`) makes a test that is not marked ``distributed`` fail loudly when it starts a process or calls
the harness, and one not marked ``compile`` when it calls ``torch.compile``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

__all__ = [
    "PROCESSES",
    "SpawnInUnmarkedTest",
    "guard",
    "kinds_of_function",
    "kinds_of_source",
    "runs_last",
    "xdist_group",
]

#: dotted names (as written in the source, after resolving import aliases) that spawn processes
_SPAWN_EXACT = {
    "tests._helpers.harness.run_distributed",
    "tests._helpers.harness.run_once",
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
}
_SPAWN_PREFIXES = ("subprocess.", "multiprocessing.", "concurrent.futures.ProcessPoolExecutor")
_SPAWN_STRINGS = ("torchrun",)  # a command line naming the launcher, e.g. ["torchrun", ...]
_COMPILE_EXACT = {"torch.compile", "torch._dynamo.optimize"}

DISTRIBUTED, COMPILE = "distributed", "compile"
#: the xdist group of the tests that start several processes (``make test`` runs them one at a time)
PROCESSES = "processes"


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Module:
    """One parsed module: its import aliases and, per module-level name, the AST nodes that define it."""

    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.aliases: dict[str, str] = {}  # local name -> fully qualified dotted name
        self.defs: dict[str, list[ast.AST]] = {}
        self._refs: dict[str, tuple[str, ...]] = {}
        for node in tree.body:
            self._add(node)

    def refs(self, name: str) -> tuple[str, ...]:
        """What the definition of ``name`` mentions, resolved (parsed once: every test's analysis walks them)."""
        if name not in self._refs:
            self._refs[name] = _resolved(self, self.defs[name])
        return self._refs[name]

    def _add(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defs.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        self.defs.setdefault(sub.id, []).append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # module-level definitions under a guard
            for child in ast.iter_child_nodes(node):
                self._add(child)

    def resolve(self, dotted: str) -> str:
        """The fully qualified form of a dotted name written in this module."""
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            base = self.aliases[head]
        elif head in self.defs:
            base = f"{self.name}.{head}"
        else:
            return dotted
        return f"{base}.{rest}" if rest else base


_SOURCES: dict[str, _Module] = {}  # modules parsed from a string (kinds_of_source)


def _module(name: str) -> _Module | None:
    """The parsed module ``name`` if it is one of the test tree's (``tests.*``), else None."""
    return _SOURCES[name] if name in _SOURCES else _parse(name)


@functools.cache
def _parse(name: str) -> _Module | None:
    if name != "tests" and not name.startswith("tests."):
        return None
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
    if path is None or not path.endswith(".py"):
        return None
    return _Module(name, ast.parse(Path(path).read_text(encoding="utf-8")))


def _references(nodes: list[ast.AST]) -> Iterator[str]:
    """Every dotted name and string constant the nodes mention (strings prefixed with ``'``)."""
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)):
                dotted = _dotted(sub)
                if dotted is not None:
                    yield dotted
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                yield "'" + sub.value


def _primitive(qualified: str) -> str | None:
    if qualified.startswith("'"):
        text = qualified[1:]
        return DISTRIBUTED if any(text == s or text.startswith(s + " ") for s in _SPAWN_STRINGS) else None
    if qualified in _COMPILE_EXACT:
        return COMPILE
    if qualified in _SPAWN_EXACT or qualified in ("subprocess", "multiprocessing"):
        return DISTRIBUTED
    if qualified.startswith(_SPAWN_PREFIXES) or qualified.startswith("torch.multiprocessing.spawn"):
        return DISTRIBUTED
    return None


def _resolved(module: _Module, nodes: list[ast.AST]) -> tuple[str, ...]:
    """The names and strings ``nodes`` mention, fully qualified, each once."""
    return tuple(dict.fromkeys(ref if ref.startswith("'") else module.resolve(ref) for ref in _references(nodes)))


def _kinds(refs: tuple[str, ...], seen: set[str]) -> frozenset[str]:
    """The marker kinds reached from the qualified names ``refs``, following module-level names."""
    found: set[str] = set()
    for qualified in refs:
        kind = _primitive(qualified)
        if kind is not None:
            found.add(kind)
            continue
        found |= _kinds_of_name(qualified, seen)
    return frozenset(found)


@functools.cache
def _definition(qualified: str) -> tuple[_Module, str] | None:
    """The test-tree module and module-level name that ``pkg.module.name[.attr...]`` refers to, if any."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a test-tree module
        module = _module(".".join(parts[:cut]))
        if module is None:
            continue
        return (module, parts[cut]) if parts[cut] in module.defs else None
    return None


def _kinds_of_name(qualified: str, seen: set[str]) -> frozenset[str]:
    """Follow ``pkg.module.name[.attr...]`` into a test-tree module's definition of ``name``."""
    found = _definition(qualified)
    if found is None:
        return frozenset()
    module, name = found
    key = f"{module.name}.{name}"
    if key in seen:
        return frozenset()
    seen.add(key)
    return _kinds(module.refs(name), seen)


def kinds_of_source(source: str, name: str, module_name: str = "tests._probe") -> frozenset[str]:
    """The marker kinds the module-level function ``name`` of ``source`` reaches (for the analysis' own tests)."""
    _SOURCES[module_name] = module = _Module(module_name, ast.parse(source))
    _definition.cache_clear()
    _analysed.cache_clear()
    return _kinds(module.refs(name), {f"{module_name}.{name}"})


def kinds_of_function(func: Callable[..., Any], cls: type | None = None) -> frozenset[str]:
    """The marker kinds a test function (or method of the test class ``cls``) or fixture function reaches."""
    func = inspect.unwrap(func)
    return _analysed(getattr(func, "__module__", "") or "", func.__name__, cls.__name__ if cls is not None else None)


@functools.cache  # a parametrized test's items, and the fixtures many tests share, are analysed once
def _analysed(module_name: str, name: str, cls_name: str | None) -> frozenset[str]:
    module = _module(module_name)
    if module is None:
        return frozenset()
    if cls_name is not None and cls_name in module.defs:
        nodes = _method_nodes(module.defs[cls_name], name)
        return _kinds(_resolved(module, nodes), {f"{module.name}.{cls_name}"})
    if name not in module.defs:
        return frozenset()
    return _kinds(module.refs(name), {f"{module.name}.{name}"})


def _method_nodes(class_nodes: list[ast.AST], method: str) -> list[ast.AST]:
    """A method, its class's decorators, bases and non-function attributes, and the methods it calls on ``self``."""
    nodes: list[ast.AST] = []
    methods: dict[str, ast.AST] = {}
    for cls in class_nodes:
        if not isinstance(cls, ast.ClassDef):
            continue
        nodes += [*cls.decorator_list, *cls.bases]
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[item.name] = item
            else:
                nodes.append(item)
    todo, done = [method], set()
    while todo:
        name = todo.pop()
        if name in done or name not in methods:
            continue
        done.add(name)
        nodes.append(methods[name])
        for sub in ast.walk(methods[name]):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                todo.append(sub.attr)
    for name in ("setup_method", "setup_class", "teardown_method", "teardown_class"):
        if name in methods and name not in done:
            nodes.append(methods[name])
    return nodes


class SpawnInUnmarkedTest(RuntimeError):
    """A test spawned processes without the ``distributed`` marker, or compiled without ``compile``."""


def guard(nodeid: str, kind: str, what: str) -> Callable[..., Any]:
    """A replacement for a spawning/compiling callable that raises :class:`SpawnInUnmarkedTest` with a clear message."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise SpawnInUnmarkedTest(
            f"{nodeid} calls {what} but is not marked `{kind}`: the automatic marking in tests/conftest.py "
            f"(tests/_helpers/markers.py) did not see it. Mark the test `@pytest.mark.{kind}`, or make the call "
            "visible to the analysis (a module-level function of tests/ that the test references)."
        )

    return refuse


def xdist_group(item: Any) -> str:
    """The ``xdist_group`` of a collected test under ``make test``: :data:`PROCESSES` for a test that starts several
    processes (marked ``distributed`` and not ``one_child``), else its module's path, so a module's fixtures (the
    docs' programs, the Sphinx build, the mypy run) run once, on one worker."""
    if item.get_closest_marker(DISTRIBUTED) is not None and item.get_closest_marker("one_child") is None:
        return PROCESSES
    return str(item.nodeid).split("::")[0]


def runs_last(nodeid: str) -> bool:
    """Whether a test runs after the others of its group: the compile tests, whose ranks keep both cores busy (the
    collection is sorted by this, stably)."""
    return nodeid.startswith("tests/unittests/compile/")
