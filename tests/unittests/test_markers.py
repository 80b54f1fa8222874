"""The tier markers (tests/conftest.py, tests/_helpers/markers.py): set from what a test calls, and enforced.

A test that spawns processes or compiles must carry ``distributed`` / ``compile`` so that ``make test-fast``
leaves it out. The analysis finds the spawning call through module-level functions, decorators and imports; a
call it cannot see is refused at run time by the conftest's guard, so the test fails instead of slowing the fast
tier silently.
"""

from __future__ import annotations

import importlib

import pytest

from tests._helpers import harness
from tests._helpers.markers import SpawnInUnmarkedTest, kinds_of_source, runs_last

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
    """The ``xdist_group`` of every collected test: ``processes`` for a test that starts several processes, else its
    module's path. Under ``make test`` (a worker of ``--dist loadgroup``) stock pytest-xdist has taken the group:
    the node id carries it (pytest 9.2 drops it silently, which is why pyproject.toml keeps pytest below 9.2)."""
    expected = {}
    for item in request.session.items:
        spawns = item.get_closest_marker("distributed") and not item.get_closest_marker("one_child")
        expected[item.nodeid] = "processes" if spawns else item.nodeid.split("@")[0].split("::")[0]
    groups = {}
    for item in request.session.items:
        marks = [m.kwargs.get("name", m.args[0] if m.args else None) for m in item.iter_markers("xdist_group")]
        groups[item.nodeid] = marks[0] if marks else None
    assert groups == expected
    assert expected[request.node.nodeid] == "tests/unittests/test_markers.py"
    worker = getattr(request.config, "workerinput", None)
    if worker is not None and request.config.getoption("dist") == "loadgroup":
        assert request.node.nodeid.endswith("@tests/unittests/test_markers.py"), request.node.nodeid


def test_the_compile_tests_run_after_the_rest(request: pytest.FixtureRequest) -> None:
    """In the collection (and so in each group) the compile tests come last: they keep both cores busy, so they run
    once the other worker has finished."""
    last = [runs_last(item.nodeid) for item in request.session.items]
    assert last == sorted(last)
    assert runs_last("tests/unittests/compile/test_compile.py::test_world_size_3")
    assert not runs_last("tests/unittests/test_harness.py::test_hang_times_out_and_pool_rebuilt")
