"""The tier markers (tests/conftest.py, tests/_helpers/markers.py): set from what a test calls, and enforced.

A test that spawns processes or compiles must carry ``distributed`` / ``compile`` so that ``make test-fast``
leaves it out. The analysis finds the spawning call through module-level functions, decorators and imports; a
call it cannot see is refused at run time by the conftest's guard, so the test fails instead of slowing the fast
tier silently.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from tests._helpers import harness, scheduling
from tests._helpers.markers import SpawnInUnmarkedTest, kinds_of_source

SOURCE = """
import subprocess
import pytest
import torch
from tests._helpers.harness import run_distributed
from tests._helpers import harness as H
from tests._helpers.compiled import count_recompiles

def _body(rank, world):
    return rank

def _spawns():
    return run_distributed(_body, 2)

def test_direct():
    run_distributed(_body, 2)

def test_through_a_local_function():
    assert _spawns() == [0, 1]

def test_through_a_module_alias():
    H.run_once(_body, 2)

def test_subprocess():
    subprocess.run(["true"], check=True)

def test_torchrun_command_line(tmp_path):
    cmd = ["torchrun", "--standalone", str(tmp_path)]

def test_compile():
    torch.compile(lambda x: x)

def test_through_a_helper_module():
    count_recompiles(0, 1, [])

CASES = [_spawns]

@pytest.mark.parametrize("case", CASES)
def test_through_parametrize(case):
    case()

def test_pure():
    assert torch.ones(2).sum() == 2
    assert "subprocess" != "run_distributed"
"""


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("test_direct", {"distributed"}),
        ("test_through_a_local_function", {"distributed"}),
        ("test_through_a_module_alias", {"distributed"}),
        ("test_subprocess", {"distributed"}),
        ("test_torchrun_command_line", {"distributed"}),
        ("test_compile", {"compile"}),
        ("test_through_a_helper_module", {"compile"}),
        ("test_through_parametrize", {"distributed"}),
        ("test_pure", set()),
    ],
)
def test_the_analysis_marks_what_a_test_reaches(name: str, kinds: set[str]) -> None:
    assert kinds_of_source(SOURCE, name) == kinds


def test_this_tier_runs_unmarked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("distributed") is None
    assert request.node.get_closest_marker("compile") is None


# The calls below are hidden from the analysis (looked up by string), as a call it cannot follow would be: the
# guard must refuse them, since this test is not marked.


def test_an_unmarked_test_cannot_start_a_subprocess() -> None:
    run = importlib.import_module("sub" + "process").run
    with pytest.raises(SpawnInUnmarkedTest, match="not marked `distributed`"):
        run(["true"], check=True)


def test_an_unmarked_test_cannot_start_a_process() -> None:
    ctx = importlib.import_module("multi" + "processing").get_context("spawn")
    with pytest.raises(SpawnInUnmarkedTest, match="not marked `distributed`"):
        ctx.Process(target=print).start()


def test_an_unmarked_test_cannot_use_the_harness() -> None:
    run = getattr(harness, "run_" + "distributed")
    with pytest.raises(SpawnInUnmarkedTest, match="the gloo harness"):
        run(print, 2)


def test_an_unmarked_test_cannot_compile() -> None:
    torch = importlib.import_module("torch")
    with pytest.raises(SpawnInUnmarkedTest, match="not marked `compile`"):
        getattr(torch, "com" + "pile")(lambda x: x)


def test_make_test_runs_the_process_tests_in_one_group_and_the_rest_a_module_at_a_time(
    request: pytest.FixtureRequest,
) -> None:
    """The groups of ``make test``'s scheduler: every test that starts several processes in ``processes``, any
    other test in its module's. Under ``make test`` (a pytest-xdist worker) the map this worker wrote is the one the
    controller reads, and it holds every collected test; the scheduler's scopes are those groups."""
    expected = {}
    for item in request.session.items:
        spawns = item.get_closest_marker("distributed") and not item.get_closest_marker("one_child")
        expected[item.nodeid] = "processes" if spawns else item.nodeid.split("::")[0]
    assert {item.nodeid: scheduling.group_of(item) for item in request.session.items} == expected
    assert expected[request.node.nodeid] == "tests/unittests/test_markers.py"
    folder = os.environ.get("TORCHMETRICS_DIFF_TEST_GROUPS")
    if hasattr(request.config, "workerinput"):  # make test: the folder exists, the map is this run's
        assert folder, "pytest -n without --dist loadgroup, or the controller did not name the groups' folder"
        assert scheduling.read_groups(Path(folder)) == expected


def test_the_scheduler_scopes_are_the_workers_groups(tmp_path: Path) -> None:
    """The scheduler's scopes: the groups of every worker's map (a test no map lists: its module)."""
    (tmp_path / "gw0.json").write_text(json.dumps({"a.py::t1": "processes", "b.py::t2[x@y]": "b.py"}))
    (tmp_path / "gw1.json").write_text(json.dumps({"c.py::C::t3": "processes"}))
    groups = scheduling.read_groups(tmp_path)
    scopes = [scheduling.scope_of(groups, n) for n in ["a.py::t1", "b.py::t2[x@y]", "c.py::C::t3", "d.py::C::t4"]]
    assert scopes == ["processes", "b.py", "processes", "d.py"]
    # in a worker's unit, the compile tests (every rank compiling) after the others
    assert scheduling.last_when_alone("tests/unittests/compile/test_compile.py::test_world_size_3")
    assert not scheduling.last_when_alone("tests/unittests/test_harness.py::test_hang_times_out_and_pool_rebuilt")
