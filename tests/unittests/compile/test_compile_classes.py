"""``torch.compile`` at world size 1 (no process group) for every public metric and loss class
(docs/guide/compile.rst, "What compiles"):

- ``fullgraph=True`` compiles each class's ``forward``, ``update`` and ``compute`` (one graph, no break), and the
  compiled values equal the eager twin's, batch after batch; after two calls nothing compiles again (three for the
  classes with list states, whose accumulated rows become one tensor with a dynamic first dimension, a list of
  one tensor that ``reset()`` empties without a recompile);
- checks of values are device assertions in the graph (no graph break), absent with ``validate_args=False``;
- one compiled evaluation step calling many metric and loss classes, several of which break inside their own
  ``forward``, compiles nothing after its warm-up and never reaches Dynamo's recompile limit (each class runs
  its own copy of the lifecycle code, so the frames compiled per class are not all cached in one code object),
  at world size 1 and, with every metric syncing on step, at world size 2.

Every compile uses ``backend="eager"`` (Dynamo alone: that is what decides graphs, breaks and guards) on tiny
float64 tensors, one compile per function.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import torchmetrics_diff as T
from tests._helpers.compile_cases import CASES, GRAPH_BREAKS, LIST_STATES, synced_step_frames
from tests._helpers.harness import run_distributed
from torchmetrics_diff import losses as L

FULLGRAPH = sorted(set(CASES) - GRAPH_BREAKS)


def compiles() -> int:
    """What Dynamo compiled so far: frames (counted without ``fullgraph``) plus graphs (``fullgraph=True``
    compiles one graph per frame and does not count frames)."""
    return counters["frames"]["total"] + counters["stats"]["unique_graphs"]


def _same(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _run_and_compare(name: str, fullgraph: bool, calls: int = 5) -> dict[str, int]:
    """Forward ``calls`` batches, update as many more, compute; compiled against an eager twin. What each compiled
    function compiled after its warm-up (0 expected; two calls, three with list states: see ``_folded_lists`` in
    metric.py) and graph breaks."""
    case = CASES[name]
    warm = 3 if name in LIST_STATES else 2
    torch._dynamo.reset()
    counters.clear()
    eager, traced = case.make(), case.make()
    forward = torch.compile(lambda *a: traced(*a), backend="eager", fullgraph=fullgraph)
    update = torch.compile(lambda *a: traced.update(*a), backend="eager", fullgraph=fullgraph)
    compute = torch.compile(lambda: traced.compute(), backend="eager", fullgraph=fullgraph)
    late = 0
    for i in range(calls):
        frames = compiles()
        _same(forward(*case.batch(i)), eager(*case.batch(i)))
        late += compiles() - frames if i >= warm else 0
    for i in range(calls, 2 * calls):
        frames = compiles()
        update(*case.batch(i))
        eager.update(*case.batch(i))
        late += compiles() - frames if i >= calls + warm else 0
    _same(compute(), eager.compute())
    _same(traced.compute(), eager.compute())  # the states the compiled calls left
    if name in LIST_STATES:
        late += _list_states_after_reset(name, forward, traced, eager, first=2 * calls)
    return {"late_frames": late, "breaks": sum(counters["graph_break"].values())}


def _list_states_after_reset(name: str, forward: Any, traced: Any, eager: Any, first: int) -> int:
    """Traced calls keep each list state a list of one tensor (the rows so far); after ``reset()`` the compiled
    forward starts again from no rows and still equals eager. Returns what it compiled anew after the reset."""
    case = CASES[name]
    assert all(len(traced.metric_state[n]) == 1 for n in traced._list_states), traced.metric_state
    traced.reset()
    eager.reset()
    before = compiles()
    for i in range(first, first + 3):
        _same(forward(*case.batch(i)), eager(*case.batch(i)))
    _same(traced.compute(), eager.compute())
    return compiles() - before


def test_cases_cover_every_public_class() -> None:
    public = {getattr(T, n) for n in T.__all__} | {getattr(L, n) for n in L.__all__}
    classes = {c.__name__ for c in public if isinstance(c, type) and issubclass(c, T.Metric)}
    classes -= {"Metric", "GlobalBatchLoss"}  # bases without an update of their own
    assert classes <= {name.split("-")[0] for name in CASES}, classes - {name.split("-")[0] for name in CASES}


@pytest.mark.parametrize("name", FULLGRAPH)
def test_fullgraph_forward_update_compute_equal_eager(name: str) -> None:
    """With list states, also: each stays a list of one tensor, and after ``reset()`` the compiled forward starts
    again from no rows without compiling anew."""
    outcome = _run_and_compare(name, fullgraph=True)
    assert outcome == {"late_frames": 0, "breaks": 0}


@pytest.mark.parametrize("name", sorted(GRAPH_BREAKS))
def test_classes_with_graph_breaks_compile_and_equal_eager(name: str) -> None:
    """torchmetrics' per-query retrieval metrics compile with graph breaks (host-side checks of the batch, rows
    grouped into data-dependent shapes): forward, update and compute equal the eager twin's. Their frames compile
    anew for each batch's shapes, so three batches of each call show as much as five (and cost less)."""
    _run_and_compare(name, fullgraph=False, calls=3)


def test_the_counts_see_a_fullgraph_recompile() -> None:
    """The count of compiles sees a ``fullgraph=True`` recompile (a new input shape), so the zeros above mean
    something."""
    torch._dynamo.reset()
    counters.clear()
    double = torch.compile(lambda x: 2 * x, backend="eager", fullgraph=True, dynamic=False)
    double(torch.ones(2))
    before = compiles()
    double(torch.ones(3))
    assert compiles() > before
    torch._dynamo.reset()


def _graph_ops(fn: Any, *args: Any) -> set[Any]:
    """The call targets of the one graph Dynamo makes of ``fn(*args)`` (``fullgraph=True``)."""
    targets: set[Any] = set()

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> Any:
        targets.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    return targets


def test_value_checks_are_device_assertions_and_absent_without_validation() -> None:
    preds, target = CASES["Accuracy"].batch(0)
    checked = T.Accuracy(task="multiclass", num_classes=3)
    unchecked = T.Accuracy(task="multiclass", num_classes=3, validate_args=False)
    assert torch._assert_async in _graph_ops(lambda p, t: checked(p, t), preds, target)
    assert torch._assert_async not in _graph_ops(lambda p, t: unchecked(p, t), preds, target)


@pytest.mark.parametrize(
    ("make", "args", "eager_error", "message"),
    [
        (
            lambda: T.Accuracy(task="multiclass", num_classes=3),
            (torch.zeros(3, 3), torch.tensor([0, 3, 1])),
            ValueError,
            r"`target` values must lie in \[0, 2\]",
        ),
        (
            lambda: T.Perplexity(),
            (torch.zeros(1, 2, 4), torch.tensor([[0, 4]])),
            ValueError,
            r"`target` ids must lie in \[0, 3\] or be ignore_index",
        ),
        (lambda: T.R2Score(), (torch.ones(1), torch.ones(1)), ValueError, "R2 score needs at least two observations"),
        (
            lambda: T.MaxMetric(nan_strategy="error"),
            (torch.tensor([1.0, float("nan")]),),
            RuntimeError,
            "encountered NaN in `value` and nan_strategy='error'",
        ),
    ],
    ids=["Accuracy", "Perplexity", "R2Score", "MaxMetric"],
)
def test_bad_values_raise_under_compile(make: Any, args: tuple, eager_error: type, message: str) -> None:
    """Eagerly the usual error with the values found; compiled (one graph) a ``RuntimeError`` with the same
    expectation, raised by the device assertion; the metric's states are those before the call."""
    with pytest.raises(eager_error, match=message):
        make()(*args)
    metric = make()
    before = {k: v.clone() for k, v in metric.metric_state.items()}
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=message):
        torch.compile(lambda *a: metric(*a), backend="eager", fullgraph=True)(*args)
    torch._dynamo.reset()
    for name, value in before.items():
        _same(metric.metric_state[name], value)


def _step_objects() -> list[tuple[Any, tuple]]:
    """Metric and loss objects of 19 classes with the batch each takes, the aggregators with their default
    ``nan_strategy="warn"`` (which compiles in one graph, as ``"ignore"``)."""
    names = [
        "CatMetric", "AUROC", "CrossModalRecallAtK", "CrossModalMAPAtK", "CosineSimilarity-none",
        "Accuracy", "F1Score", "ConfusionMatrix", "R2Score", "PearsonCorrCoef", "Perplexity", "MeanSquaredError",
        "CLIPLoss", "SupConLoss", "GlobalMeanLoss",
    ]  # fmt: skip
    objects = [(CASES[n].make(), CASES[n].batch(0)) for n in names]
    values = CASES["SumMetric"].batch(0)
    objects += [(cls(), values) for cls in (T.SumMetric, T.MeanMetric, T.MaxMetric, T.MinMetric)]
    return objects


def test_compiled_step_with_many_classes_compiles_nothing_after_warmup() -> None:
    torch._dynamo.reset()
    counters.clear()
    traced, eager = _step_objects(), _step_objects()
    classes = {type(m) for m, _ in traced}
    assert len(classes) >= 12

    def step(objects: list[tuple[Any, tuple]]) -> list[Any]:
        return [m(*args) for m, args in objects]

    compiled = torch.compile(step, backend="eager")
    for _ in range(3):  # warm-up (list states: see _run_and_compare)
        compiled(traced), step(eager)
    frames = compiles()
    for _ in range(3):
        values, expected = compiled(traced), step(eager)
    assert compiles() == frames, "frames compiled after warm-up"
    limits = [r for r in counters["unimplemented"] if "recompile limit" in r.lower() or "cache_size" in r.lower()]
    assert not limits, limits
    for (metric, _), (twin, _), value, want in zip(traced, eager, values, expected):
        _same(value, want)
        _same(metric.compute(), twin.compute())
    # the cause of the limit: a method every class inherits is one code object; each class has its own copy
    forwards = {id(type(m).forward.__code__) for m, _ in traced if not isinstance(m, L.GlobalBatchLoss)}
    assert len(forwards) == len({type(m) for m, _ in traced if not isinstance(m, L.GlobalBatchLoss)})
    torch._dynamo.reset()


def test_compiled_step_of_synced_classes_at_world_size_2_compiles_nothing_after_warmup() -> None:
    """Two gloo ranks, 17 metric and loss classes syncing on step: every ``forward`` steps out of the graph for
    its sync (a break inside each class's ``forward``, and Dynamo resumes after it in the class's own copy of the
    call that steps out). After two warm-up steps, three more compile nothing and never reach the recompile
    limit; values and ``compute()`` equal the eager twin's on every rank."""
    for rank, outcome in enumerate(run_distributed(synced_step_frames, 2, timeout=300)):
        assert outcome == {"classes": 17, "late_frames": 0, "limits": [], "worst": 0.0}, f"rank {rank}: {outcome}"


def test_collection_with_a_list_state_member_compiles_fullgraph() -> None:
    """A collection holding a list-state metric compiles with ``fullgraph=True`` (``forward`` and ``compute``);
    values equal the eager collection's, nothing compiles after warm-up."""
    torch._dynamo.reset()
    counters.clear()

    def make() -> T.MetricCollection:
        return T.MetricCollection({"f1": T.F1Score(task="binary"), "auroc": T.AUROC(task="binary")})

    eager, traced = make(), make()
    forward = torch.compile(lambda *a: traced(*a), backend="eager", fullgraph=True)
    compute = torch.compile(lambda: traced.compute(), backend="eager", fullgraph=True)
    for i in range(6):
        if i == 3:
            frames = compiles()
        _same(forward(*CASES["AUROC"].batch(i)), eager(*CASES["AUROC"].batch(i)))
        _same(compute(), eager.compute())
    assert compiles() == frames
    assert sum(counters["graph_break"].values()) == 0
    torch._dynamo.reset()


@pytest.mark.parametrize(
    ("fn", "case"),
    [
        ("auroc", "AUROC"),
        ("confusion_matrix", "ConfusionMatrix"),
        ("r2_score", "R2Score"),
        ("perplexity", "Perplexity"),
        ("retrieval_recall_at_k", "CrossModalRecallAtK"),
        ("retrieval_median_rank", "CrossModalMedianRank"),
        ("retrieval_map_at_k", "CrossModalMAPAtK"),
        ("explained_variance", "ExplainedVariance"),
        ("kl_divergence", "KLDivergence"),
        ("spearman_corrcoef", "SpearmanCorrCoef"),
        ("retrieval_mrr", "CrossModalMRR"),
        ("retrieval_ndcg", "CrossModalNormalizedDCG"),
    ],
)
def test_functional_batch_values_compile_in_one_graph(fn: str, case: str) -> None:
    """The functions behind the metrics, list-state ones included, have no data-dependent shape or host read:
    ``fullgraph=True`` compiles them, and their values equal the eager ones (ties and logits included)."""
    import torchmetrics_diff.functional as F

    options = {
        "confusion_matrix": {"task": "multiclass", "num_classes": 3},
        "perplexity": {"ignore_index": -100},
        "retrieval_recall_at_k": {"top_k": 2},
        "retrieval_ndcg": {"top_k": 3},
    }
    call = getattr(F, fn)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: call(*a, **options.get(fn, {})), backend="eager", fullgraph=True)
    for i in range(2):
        args = CASES[case].batch(i)
        if fn == "auroc":  # tied scores across classes
            args = (args[0].round(decimals=1), args[1])
        _same(compiled(*args), call(*args, **options.get(fn, {})))
    torch._dynamo.reset()
