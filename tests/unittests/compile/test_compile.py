"""``torch.compile`` (docs/guide/compile.rst): compiled training steps that call our losses and metrics.

The properties, per world size 1, 2, 3 (gloo, float64, uneven rows: rank r holds 3 + r rows):

- after a warm-up of two steps, 20 more compiled steps compile nothing new (no recompile, no new frame: Dynamo
  guards on nothing that changes every step, so it never hits its recompile limit and falls back to eager);
- without a process group or at world size 1 there is no graph break at all: ``fullgraph=True`` compiles;
- at world size > 1 the only graph breaks are the documented host round trips (``torch.compiler.disable``d
  collectives), as many per call as the docs' table says;
- values, parameter gradients and ``compute()`` of the compiled step equal the eager ones (exactly with the
  ``eager`` backend; to float64 rounding with ``inductor``, which reassociates sums);
- the functional collectives the package uses in graphs have the adjoint gradients written by hand here.

Compiling is slow on the 2-core CI machines, so each world size compiles every case once (``backend="eager"``)
and reuses that compile for all checks; the sharded CLIP loss also runs under ``inductor`` at world sizes 1 and 2.

Package modules covered: ``distributed._compile``, ``metric``, ``collections``, ``aggregation``, ``losses`` and
``functional`` under ``torch.compile``.
"""

from __future__ import annotations

import pytest

from tests._helpers import compiled as B
from tests._helpers.harness import run_distributed

ALL = B.LOSS_CASES + B.METRIC_CASES
DISABLED = "Skip calling `torch.compiler.disable()`d function"

#: the host round trips of one call at world size > 1 (docs/guide/compile.rst, "Graph breaks per call"): the
#: torch.compiler.disable'd functions a compiled call runs, each one graph break
HOST = {
    # the texts of every rank (peers' row counts are shapes here), then the partial column log-sum-exps
    "('clip', 'sharded')": {"_gather_across": 1, "_clip_here": 1},
    "('clip', 'replicated')": {"_gather_across": 1},
    "('infonce', 'sharded')": {"_gather_across": 1},
    "('supcon', 'sharded')": {"_global_labels": 1, "_gather_across": 1},  # the labels, then the features
    "('siglip', 'sharded')": {"_gather_across": 1},
    "('barlow', None)": {"_reduce_across": 1},  # the checked all_reduce of the statistics
    "('mean', None)": {"_reduce_across": 1},  # the checked all_reduce of (loss sum, count)
    "('tokence', None)": {"_reduce_across": 1},
    "('metric',)": {"Metric.forward": 1},  # the whole forward: the sync engine runs inside its try
    "('collection',)": {"MetricCollection.forward": 1},
    "('compute',)": {"Metric.forward": 1, "Metric._compute_template": 1},
}
#: break points per loss call at world size 2: one per host round trip
BREAK_POINTS_W2 = {case: sum(HOST[case].values()) for case in map(str, B.LOSS_CASES)}
#: Dynamo's reasons for those breaks: the package's functions called through torch.compiler.disable
SKIPS = {DISABLED, "Attempted to call function marked as skipped"}

#: world size 3 runs the cases whose host round trips differ in kind (each costs a compile of its own)
W3_CASES = [("clip", "sharded"), ("supcon", "sharded"), ("mean", None), ("metric",), ("collection",), ("compute",)]


def _problems(results: list[dict], world: int, tolerance: float = 0.0) -> list[str]:
    problems = []
    for rank, by_case in enumerate(results):
        for case, r in by_case.items():
            if r["error"] is not None:
                problems.append(f"W={world} rank {rank} {case}: does not compile with fullgraph=True: {r['error']}")
                continue
            if r["new_frames"]:
                problems.append(f"W={world} rank {rank} {case}: {r['new_frames']} frames compiled after warm-up")
            if r["worst"] > tolerance:
                problems.append(f"W={world} rank {rank} {case}: compiled differs from eager by {r['worst']:.3g}")
            if world == 1 and r["breaks"]:
                problems.append(f"W=1 {case}: {r['breaks']} graph breaks: {r['reasons']}")
            if world > 1 and not set(r["reasons"]) <= SKIPS:
                problems.append(f"W={world} rank {rank} {case}: a break that is not a collective: {r['reasons']}")
            expected = HOST[case] if world > 1 else {}
            if r["host_per_step"] != expected:
                problems.append(f"W={world} rank {rank} {case}: host round trips per step {r['host_per_step']}")
    return problems


def test_world_size_1_fullgraph_no_recompile_values_equal_eager() -> None:
    """In the test process (no process group): every case compiles with ``fullgraph=True`` (no graph break); 20
    steps after warm-up (more than Dynamo's recompile limit of 8, so a guard that fails every step shows), 0 new
    frames; exact values."""
    problems = _problems([B.check_cases(0, 1, ALL, fullgraph=True)], 1)
    assert not problems, "\n".join(problems)


def test_world_size_1_inductor() -> None:
    """The inductor backend: no recompile after warm-up; values equal eager to float64 rounding."""
    problems = _problems([B.check_cases(0, 1, [("clip", "sharded")], backend="inductor")], 1, tolerance=1e-12)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.one_child), 2])
def test_distributed_no_recompile_values_equal_eager(world: int) -> None:
    """In the gloo workers (a process group exists, also at world size 1): every case, 20 steps; at world size 1
    with ``fullgraph=True`` (a group of one rank breaks no graph)."""
    results = run_distributed(B.check_cases, world, ALL, fullgraph=world == 1, timeout=400)
    problems = _problems(results, world)
    assert not problems, "\n".join(problems)


def test_world_size_2_inductor() -> None:
    """The sharded CLIP loss under inductor at world size 2: the gather behind its break, the value's all-reduce a
    functional collective inside the inductor graph; no recompile, values and gradients equal eager."""
    results = run_distributed(B.check_cases, 2, [("clip", "sharded")], backend="inductor", timeout=400)
    problems = _problems(results, 2, tolerance=1e-12)
    assert not problems, "\n".join(problems)


def test_world_size_3_no_recompile_values_equal_eager() -> None:
    results = run_distributed(B.check_cases, 3, W3_CASES, timeout=400)
    problems = _problems(results, 3)
    assert not problems, "\n".join(problems)


def test_world_size_2_graph_breaks_per_loss_call_are_the_documented_collectives() -> None:
    """One break per host round trip (counted with ``nested_graph_breaks``: without it Dynamo also splits every
    enclosing frame at the call, see the docs); each of them a ``torch.compiler.disable``d collective."""
    results = run_distributed(B.count_break_points, 2, B.LOSS_CASES, timeout=300)
    for rank, by_case in enumerate(results):
        counts = {case: r["breaks"] for case, r in by_case.items()}
        assert counts == BREAK_POINTS_W2, f"rank {rank}: {counts}"
        for case, r in by_case.items():
            assert set(r["reasons"]) <= SKIPS, f"rank {rank} {case}: {r['reasons']}"
            assert r["host"] == HOST[case], f"rank {rank} {case}: host round trips {r['host']}"


def test_functional_collectives_gradients_are_the_adjoints() -> None:
    """``all_reduce`` backward sums every rank's gradient; ``all_gather_tensor`` backward reduce-scatters; both
    eager and compiled (``fullgraph=True``: no break); ``sum_across_ranks`` agrees in both modes."""
    for rank, errors in enumerate(run_distributed(B.funcol_gradients, 2, timeout=300)):
        assert errors and max(errors.values()) == 0.0, f"rank {rank}: {errors}"


@pytest.mark.filterwarnings("ignore:.*nan_strategy='warn'")  # (the eager twins report their NaNs)
@pytest.mark.parametrize("strategy", ["warn", "ignore", -1.0])
def test_aggregators_with_nan_compile_without_break(strategy: object) -> None:
    """``nan_strategy="warn"`` (the default), ``"ignore"`` or a float: NaNs are replaced in the graph (the
    reduction's neutral element with weight 0, or the float) instead of a data-dependent drop; values, ``compute()``
    and gradients equal eager (``"warn"``: without the warning in traced code)."""
    results = B.nan_aggregators(strategy)
    for name, r in results.items():
        assert r["breaks"] == 0 and r["new_frames"] == 0, f"{name}: {r}"
        assert r["worst"] <= 1e-12, f"{name}: compiled differs from eager by {r['worst']:.3g}"


@pytest.mark.one_child
def test_importing_the_package_does_not_import_dynamo() -> None:
    """The compile support must cost nothing to users who never compile: importing Dynamo takes seconds."""
    import subprocess
    import sys

    code = "import sys, torchmetrics_diff, torchmetrics_diff.losses; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
