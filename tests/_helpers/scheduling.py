"""How ``make test`` shares the tests between its two pytest-xdist workers.

Two kinds of group, one worker each at a time:

* ``processes``: every test that starts several processes (marked ``distributed`` and not ``one_child``), one
  after another on one worker, so no two of them compete for the two cores and their timeouts mean what they
  say;
* a test module: every other test goes with the rest of its module, so a module's fixtures (the docs' programs,
  the Sphinx build, the mypy run) run once, not once per worker.

Why not pytest-xdist's own ``xdist_group`` marks: ``--dist loadgroup`` carries a mark to the scheduler by
appending ``@group`` to the test's node id in the worker; since pytest 9.2 node ids are structured and that
append no longer takes, so the grouping stops without a word (an open pytest-xdist bug): the process tests ran
on both workers at once and every module fixture ran twice. Here the groups travel beside the node ids instead: the
controller names a folder (:func:`start`), each worker writes ``{node id: group}`` there before it reports its
collection (:func:`write_groups`), and the controller's scheduler (:func:`scheduler`: pytest-xdist's scope
scheduler, scoped by that map) reads it once every worker has reported.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "PROCESSES",
    "group_of",
    "last_when_alone",
    "make_scheduler",
    "read_groups",
    "scheduler",
    "scope_of",
    "start",
    "write_groups",
]

PROCESSES = "processes"
_FOLDER = "TORCHMETRICS_DIFF_TEST_GROUPS"  # the environment variable the workers inherit from the controller


def group_of(item: pytest.Item) -> str:
    """The group of one collected test: ``processes`` or its module's path."""
    if item.get_closest_marker("distributed") is not None and item.get_closest_marker("one_child") is None:
        return PROCESSES
    return _module_of(item.nodeid)


def _module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def start(config: pytest.Config) -> None:
    """In the controller of ``pytest -n N --dist loadgroup``: name the folder the workers write their groups to."""
    if hasattr(config, "workerinput"):
        return
    os.environ.pop(_FOLDER, None)  # a pytest run inside a test: not the outer run's folder
    if not config.getoption("numprocesses", None) or config.getoption("dist", "no") != "loadgroup":
        return
    os.environ[_FOLDER] = tempfile.mkdtemp(prefix="torchmetrics_diff_groups_")
    config.add_cleanup(_forget)


def _forget() -> None:
    shutil.rmtree(os.environ.pop(_FOLDER, ""), ignore_errors=True)


def write_groups(session: pytest.Session) -> None:
    """In a worker, after collection and before it is reported: every collected test's group."""
    folder, worker = os.environ.get(_FOLDER), getattr(session.config, "workerinput", {}).get("workerid")
    if not folder or not worker:
        return
    path = Path(folder) / f"{worker}.json"
    part = path.with_suffix(".part")
    part.write_text(json.dumps({item.nodeid: group_of(item) for item in session.items}), encoding="utf-8")
    os.replace(part, path)  # whole or absent: the controller may read it the moment the worker reports


def read_groups(folder: Path) -> dict[str, str]:
    """Every worker's map, merged (the workers collected the same tests, or xdist stops the run)."""
    groups: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        groups.update(json.loads(path.read_text(encoding="utf-8")))
    return groups


def scope_of(groups: dict[str, str], nodeid: str) -> str:
    """The scheduler's scope of one test: its group, or its module where the map does not list it."""
    return groups.get(nodeid) or _module_of(nodeid)


#: tests that keep several cores busy for long (torch.compile on every rank): a worker runs them after its other
#: tests, so that they, not a test that mostly waits, are what runs once the other worker has finished
_LAST = ("tests/unittests/compile/",)


def last_when_alone(nodeid: str) -> bool:
    """Whether a worker runs this test after the rest of its group (the sort is stable: else collection order)."""
    return nodeid.startswith(_LAST)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of ``make test`` (:func:`scheduler`), or ``None`` (xdist's own) outside it (:func:`start`
    named no folder)."""
    folder = os.environ.get(_FOLDER)
    return scheduler(config, log, Path(folder)) if folder else None


def scheduler(config: pytest.Config, log: Any, folder: Path) -> Any:
    """pytest-xdist's scope scheduler whose scopes are the groups the workers wrote to ``folder``.

    It hands out whole scopes, the largest first (``processes``, at once), and gives a worker that runs low the
    next one; a test the map does not list (none should be) goes with its module.
    """
    from xdist.scheduler import LoadScopeScheduling

    class _Groups(LoadScopeScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every worker has reported its collection
                self._groups = read_groups(folder)
            return scope_of(self._groups, nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            scope, unit = next(iter(self.workqueue.items()))  # the unit the base class hands out next
            self.workqueue[scope] = dict(sorted(unit.items(), key=lambda entry: last_when_alone(entry[0])))
            super()._assign_work_unit(node)

    return _Groups(config, log)
