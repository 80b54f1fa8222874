"""Pytest hooks for the whole test tree: the tier markers, set from what each test calls, and their guard.

``make test-fast`` deselects ``distributed`` and ``compile`` (``-m "not slow and not distributed and not
compile"``). Nobody writes these markers by hand: :func:`pytest_collection_modifyitems` derives them from the
source (``tests/_helpers/markers.py``: the harness, ``subprocess``, ``multiprocessing``, ``torchrun``,
``torch.compile``, reached from the test, its decorators or its fixtures), and the autouse guard below makes a
test that spawns or compiles without its marker fail loudly, in every tier.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Iterator

import pytest
import torch

from tests._helpers import harness
from tests._helpers.markers import COMPILE, DISTRIBUTED, guard, kinds_of_function, runs_last, xdist_group

# not modules to doctest: scripts that tests run in subprocesses (they import lightning at module level), and what
# the harness's fork server imports (it limits threads, which must not happen in the test process)
collect_ignore_glob = ["integration/lightning/run_*.py", "_helpers/worker_preload.py"]


def _kinds(item: pytest.Item) -> set[str]:
    func = getattr(item, "function", None)
    if func is None:  # a doctest (tests/_helpers' docstrings): runs in-process
        return set()
    kinds = set(kinds_of_function(func, getattr(item, "cls", None)))
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        for fixturedef in defs:
            if fixturedef.argname != "_tier_guard":  # the guard names what it refuses
                kinds |= kinds_of_function(fixturedef.func)
    return kinds


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups (and runs first otherwise)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier markers, then the xdist group of ``make test`` (``pytest -n 2 --dist loadgroup``, stock
    pytest-xdist): the tests that start several processes in one group, one at a time on one worker; any other test
    with the rest of its module. The compile tests go last (their ranks keep both cores busy): run while the other
    worker has finished, they compete with nothing."""
    for item in items:
        for kind in sorted(_kinds(item)):
            if item.get_closest_marker(kind) is None:
                item.add_marker(kind)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    items.sort(key=lambda item: runs_last(item.nodeid))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: one core of its own at most
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse, in a test not marked so, to spawn processes (``distributed``) or to compile (``compile``)."""
    node = request.node
    if node.get_closest_marker(DISTRIBUTED) is None:
        monkeypatch.setattr(harness, "spawn_guard", guard(node.nodeid, DISTRIBUTED, "the gloo harness"))
    # torch.compile's inductor runs the C++ compiler and its worker pool in processes: part of compiling
    if node.get_closest_marker(DISTRIBUTED) is None and node.get_closest_marker(COMPILE) is None:
        monkeypatch.setattr(
            multiprocessing.process.BaseProcess, "start", guard(node.nodeid, DISTRIBUTED, "multiprocessing")
        )
        monkeypatch.setattr(subprocess.Popen, "_execute_child", guard(node.nodeid, DISTRIBUTED, "subprocess"))
    if node.get_closest_marker(COMPILE) is None:
        monkeypatch.setattr(torch, "compile", guard(node.nodeid, COMPILE, "torch.compile"))
    yield
