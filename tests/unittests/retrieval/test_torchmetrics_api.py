"""torchmetrics' retrieval metrics under its names equal torchmetrics' classes and functions on the same inputs.

Every class against torchmetrics' class of the same name: random queries with 1 to 12 documents each, their rows
shuffled and fed in three batches, scores distinct (no ties: metrics that cut the ranking order tied scores as
their sort leaves them, which torchmetrics does not specify) except for nDCG and AUROC, which average over ties
and are also checked with many tied scores; queries without a relevant (and, for fall-out, without a non-relevant)
document under every ``empty_target_action``, ``ignore_index``, ``top_k``/``max_k``/``adaptive_k``/``max_fpr``/
``min_precision`` values and every ``aggregation``. torchmetrics stores the scores in float32: our float32 and our
float64 (``set_dtype``) results must agree with it within ``ATOL`` (1e-6; the scores are float32 values, so both
rank the rows alike). The functions are compared likewise, query by query. Bad arguments and bad batches raise a
``ValueError`` (as torchmetrics, where it raises one) whose message names the argument; spawned gloo runs with
W = 2 and 3, each query's rows split over the ranks (unevenly, one rank without rows), equal torchmetrics on the
concatenated rows on every rank.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
import torch

import torchmetrics_diff as tmd
import torchmetrics_diff.functional as ours_f
import torchmetrics_diff.retrieval as ours
from tests._helpers.harness import run_distributed

tm_retrieval = pytest.importorskip("torchmetrics.retrieval")
tm_functional = pytest.importorskip("torchmetrics.functional.retrieval")

pytestmark = pytest.mark.timeout(240)

ATOL = 1e-6
CLASSES = [
    "RetrievalAUROC",
    "RetrievalFallOut",
    "RetrievalHitRate",
    "RetrievalMAP",
    "RetrievalMRR",
    "RetrievalNormalizedDCG",
    "RetrievalPrecision",
    "RetrievalPrecisionRecallCurve",
    "RetrievalRPrecision",
    "RetrievalRecall",
    "RetrievalRecallAtFixedPrecision",
]
FUNCTIONS = [
    "retrieval_auroc",
    "retrieval_average_precision",
    "retrieval_fall_out",
    "retrieval_hit_rate",
    "retrieval_normalized_dcg",
    "retrieval_precision",
    "retrieval_precision_recall_curve",
    "retrieval_r_precision",
    "retrieval_recall",
    "retrieval_reciprocal_rank",
]

# each class's own options (beyond empty_target_action, ignore_index and aggregation)
OPTIONS: dict[str, list[dict[str, Any]]] = {
    "RetrievalAUROC": [
        {},
        {"top_k": 1},
        {"top_k": 4},
        {"max_fpr": 0.3},
        {"max_fpr": 1.0},
        {"top_k": 5, "max_fpr": 0.5},
    ],
    "RetrievalFallOut": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalHitRate": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalMAP": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalMRR": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalNormalizedDCG": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalPrecision": [
        {},
        {"top_k": 1},
        {"top_k": 3},
        {"top_k": 20},
        {"top_k": 3, "adaptive_k": True},
        {"top_k": 20, "adaptive_k": True},
    ],
    "RetrievalPrecisionRecallCurve": [{}, {"max_k": 1}, {"max_k": 5}, {"max_k": 20}, {"max_k": 20, "adaptive_k": True}],
    "RetrievalRPrecision": [{}],
    "RetrievalRecall": [{}, {"top_k": 1}, {"top_k": 3}, {"top_k": 20}],
    "RetrievalRecallAtFixedPrecision": [
        {},
        {"min_precision": 0.3},
        {"min_precision": 0.6, "max_k": 4},
        {"min_precision": 0.5, "max_k": 20, "adaptive_k": True},
        {"min_precision": 1.0},
    ],
}
AGGREGATIONS: list[Any] = ["mean", "median", "min", "max"]


def _sum_aggregation(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return values.sum() if dim is None else values.sum(dim=dim)


def _data(
    seed: int, n_queries: int = 14, graded: bool = False, ties: bool = False, negative: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``n_queries`` queries (ids spread, 1 to 12 documents each, rows shuffled): distinct float32 scores
    in (0, 1] unless ``ties`` (one decimal: many ties) or ``negative`` (in (-1, 1)); query 0 without a relevant
    document, query 1 with relevant documents only."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 13, (n_queries,), generator=g)
    sizes[0], sizes[1] = 5, 4
    ids = torch.randperm(100, generator=g)[:n_queries] * 3
    indexes = torch.repeat_interleave(ids, sizes)
    n = int(sizes.sum())
    preds = (torch.randperm(10 * n, generator=g)[:n].to(torch.float64) + 1) / (10 * n)
    if ties:
        preds = (preds * 10).round() / 10
    if negative:
        preds = 2 * preds - 1
    preds = preds.to(torch.float32).to(torch.float64)  # float32 values: torchmetrics ranks them alike
    target = torch.randint(0, 4, (n,), generator=g) if graded else (torch.rand(n, generator=g) < 0.4).to(torch.int64)
    target[indexes == ids[0]] = 0
    target[indexes == ids[1]] = 1
    order = torch.randperm(n, generator=g)
    return preds[order], target[order], indexes[order]


def _batches(*tensors: torch.Tensor, parts: int = 3) -> list[tuple[torch.Tensor, ...]]:
    n = tensors[0].shape[0]
    cuts = [0, n // 5, n // 2, n][: parts + 1] if parts == 3 else [0, n]
    return [tuple(t[a:b] for t in tensors) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def _run(
    cls: type,
    kwargs: dict[str, Any],
    preds: torch.Tensor,
    target: torch.Tensor,
    indexes: torch.Tensor,
    float64: bool = False,
) -> Any:
    metric = cls(**kwargs)
    if float64:
        metric.set_dtype(torch.float64)
    for p, t, i in _batches(preds, target, indexes):
        metric.update(p, t, i)
    return metric.compute()


def _close(got: Any, want: Any, atol: float = ATOL) -> str | None:
    """None when ``got`` equals ``want`` (tensors or tuples of them) within ``atol``, else a description."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"got {got!r}, want {want!r}"
        for a, b in zip(got, want):
            if (err := _close(a, b, atol)) is not None:
                return err
        return None
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}: {got} vs {want}"
    if not want.is_floating_point():
        return None if torch.equal(got.to(want.dtype), want) else f"{got} != {want}"
    if not torch.allclose(got.to(torch.float64), want.to(torch.float64), atol=atol, rtol=0):
        return f"{got} != {want} (max error {float((got.double() - want.double()).abs().max()):.3g})"
    return None


def _tm(name: str, kwargs: dict[str, Any], preds: torch.Tensor, target: torch.Tensor, indexes: torch.Tensor) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(getattr(tm_retrieval, name), kwargs, preds, target, indexes)


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for name in CLASSES:
        for option in OPTIONS[name]:
            for action in ("neg", "pos", "skip"):
                for aggregation in AGGREGATIONS:
                    if name == "RetrievalRecallAtFixedPrecision" and aggregation != "mean":
                        continue  # its signature has no `aggregation` (it goes through **kwargs): checked below
                    cases.append((name, {**option, "empty_target_action": action, "aggregation": aggregation}))
    cases += [(name, {"aggregation": _sum_aggregation}) for name in CLASSES]
    cases += [("RetrievalRecallAtFixedPrecision", {"aggregation": "max", "min_precision": 0.5})]
    return cases


CASES = _cases()


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, kwargs = case
    shown = {k: (v.__name__ if callable(v) else v) for k, v in kwargs.items()}
    return f"{name}-{shown}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_class_equals_torchmetrics(case: tuple[str, dict[str, Any]]) -> None:
    """The class equals torchmetrics' on random queries (two seeds, three batches), in float32 and float64."""
    name, kwargs = case
    for seed in (0, 1):
        preds, target, indexes = _data(seed, graded=name == "RetrievalNormalizedDCG")
        want = _tm(name, kwargs, preds, target, indexes)
        for float64 in (False, True):
            got = _run(getattr(ours, name), kwargs, preds, target, indexes, float64=float64)
            assert (err := _close(got, want)) is None, f"seed {seed} float64={float64}: {err}"
            if float64 and name not in ("RetrievalPrecisionRecallCurve", "RetrievalRecallAtFixedPrecision"):
                assert got.dtype == torch.float64


@pytest.mark.parametrize("name", ["RetrievalNormalizedDCG", "RetrievalAUROC"])
@pytest.mark.parametrize("option", [{}, {"max_fpr": 0.4}, {"max_fpr": 0.75}, {"top_k": 30}])
def test_tied_scores_average_as_torchmetrics(name: str, option: dict[str, Any]) -> None:
    """nDCG and AUROC do not depend on the order of tied scores: with many ties they equal torchmetrics."""
    if "max_fpr" in option and name != "RetrievalAUROC":
        pytest.skip("max_fpr is AUROC's")
    for seed in (2, 3, 4):
        preds, target, indexes = _data(seed, graded=name == "RetrievalNormalizedDCG", ties=True)
        want = _tm(name, option, preds, target, indexes)
        got = _run(getattr(ours, name), option, preds, target, indexes, float64=True)
        assert (err := _close(got, want)) is None, f"seed {seed}: {err}"


@pytest.mark.parametrize("name", CLASSES)
def test_negative_scores_count_as_torchmetrics_counts_them(name: str) -> None:
    """Scores in (-1, 1): torchmetrics' AP, MRR, precision and recall count a relevant document scored <= 0 as
    not retrieved, and the other metrics do not; ours follow it."""
    preds, target, indexes = _data(5, graded=name == "RetrievalNormalizedDCG", negative=True)
    for option in OPTIONS[name][:3]:
        want = _tm(name, option, preds, target, indexes)
        got = _run(getattr(ours, name), option, preds, target, indexes)
        assert (err := _close(got, want)) is None, f"{option}: {err}"


@pytest.mark.parametrize("name", CLASSES)
def test_ignore_index_rows_are_dropped(name: str) -> None:
    preds, target, indexes = _data(6, graded=name == "RetrievalNormalizedDCG")
    target = target.clone()
    target[::4] = -100
    kwargs = {"ignore_index": -100, **OPTIONS[name][-1]}
    want = _tm(name, kwargs, preds, target, indexes)
    got = _run(getattr(ours, name), kwargs, preds, target, indexes)
    assert (err := _close(got, want)) is None, err


@pytest.mark.parametrize("name", CLASSES)
def test_every_query_skipped_gives_zero(name: str) -> None:
    preds, target, indexes = _data(7)
    kind = torch.ones_like(target) if name == "RetrievalFallOut" else torch.zeros_like(target)
    kwargs = {"empty_target_action": "skip"}
    assert (
        _close(_run(getattr(ours, name), kwargs, preds, kind, indexes), _tm(name, kwargs, preds, kind, indexes)) is None
    )


@pytest.mark.parametrize("name", CLASSES)
def test_empty_target_action_error_raises_at_compute(name: str) -> None:
    preds, target, indexes = _data(8, graded=name == "RetrievalNormalizedDCG")
    if name == "RetrievalFallOut":
        target = target.clone()
        target[indexes == indexes[target == 1][0]] = 1  # a query with relevant documents only
    with pytest.raises(ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _run(getattr(tm_retrieval, name), {"empty_target_action": "error"}, preds, target, indexes)
    with pytest.raises(ValueError, match="empty_target_action='error'"):
        _run(getattr(ours, name), {"empty_target_action": "error"}, preds, target, indexes)


@pytest.mark.parametrize("name", CLASSES)
def test_class_attributes_and_signature_match_torchmetrics(name: str) -> None:
    """Same constructor arguments (names, order, defaults), same class facts and plot bounds."""
    mine, theirs = getattr(ours, name), getattr(tm_retrieval, name)
    sig = [(p.name, p.default) for p in inspect.signature(mine.__init__).parameters.values()]
    tm_sig = [(p.name, p.default) for p in inspect.signature(theirs.__init__).parameters.values()]
    assert sig == tm_sig
    for attr in ("higher_is_better", "is_differentiable", "full_state_update", "plot_lower_bound", "plot_upper_bound"):
        assert getattr(mine, attr, None) == getattr(theirs, attr, None), attr
    assert getattr(tmd, name) is mine


# ------------------------------------------------------------------------------------------------ functions
def _function_cases() -> list[tuple[str, dict[str, Any]]]:
    cases: list[tuple[str, dict[str, Any]]] = []
    for fn in FUNCTIONS:
        extra: list[dict[str, Any]] = [{}]
        if fn == "retrieval_precision_recall_curve":
            extra += [{"max_k": 3}, {"max_k": 15}, {"max_k": 15, "adaptive_k": True}]
        elif fn == "retrieval_precision":
            extra += [{"top_k": 2}, {"top_k": 15}, {"top_k": 15, "adaptive_k": True}]
        elif fn == "retrieval_auroc":
            extra += [{"top_k": 4}, {"max_fpr": 0.3}, {"max_fpr": 0.5, "top_k": 6}]
        elif fn != "retrieval_r_precision":
            extra += [{"top_k": 1}, {"top_k": 3}, {"top_k": 15}]
        cases += [(fn, kw) for kw in extra]
    return cases


@pytest.mark.parametrize(("fn", "kwargs"), _function_cases(), ids=[f"{f}-{k}" for f, k in _function_cases()])
def test_function_equals_torchmetrics(fn: str, kwargs: dict[str, Any]) -> None:
    """Query by query (float64 in; torchmetrics computes in float32), including queries without a relevant
    document, with relevant documents only, and negative scores."""
    for seed, negative in ((0, False), (1, True)):
        preds, target, indexes = _data(seed, graded=fn == "retrieval_normalized_dcg", negative=negative)
        for query in indexes.unique():
            rows = indexes == query
            want = getattr(tm_functional, fn)(preds[rows], target[rows], **kwargs)
            got = getattr(ours_f, fn)(preds[rows], target[rows], **kwargs)
            assert (err := _close(got, want)) is None, f"query {int(query)} ({int(rows.sum())} documents): {err}"


# --------------------------------------------------------------------------------------------------- errors
BAD_ARGS: list[tuple[str, dict[str, Any], str]] = [
    (name, kwargs, arg)
    for name in CLASSES
    for kwargs, arg in (
        ({"empty_target_action": "drop"}, "empty_target_action"),
        ({"ignore_index": 1.5}, "ignore_index"),
        ({"aggregation": "sum"}, "aggregation"),
    )
    if not (name == "RetrievalRecallAtFixedPrecision" and arg == "aggregation")
]
BAD_ARGS += [
    (name, {"top_k": bad}, "top_k")
    for name in (
        "RetrievalAUROC",
        "RetrievalFallOut",
        "RetrievalHitRate",
        "RetrievalNormalizedDCG",
        "RetrievalPrecision",
        "RetrievalRecall",
    )
    for bad in (0, -1, 1.0)
]
BAD_ARGS += [
    ("RetrievalPrecision", {"adaptive_k": 1}, "adaptive_k"),
    ("RetrievalPrecisionRecallCurve", {"adaptive_k": "yes"}, "adaptive_k"),
    ("RetrievalPrecisionRecallCurve", {"max_k": 0}, "max_k"),
    ("RetrievalRecallAtFixedPrecision", {"max_k": 2.0}, "max_k"),
    ("RetrievalRecallAtFixedPrecision", {"min_precision": 1.5}, "min_precision"),
    ("RetrievalRecallAtFixedPrecision", {"min_precision": 1}, "min_precision"),
    ("RetrievalAUROC", {"max_fpr": 1}, "max_fpr"),
]


@pytest.mark.parametrize(("name", "kwargs", "arg"), BAD_ARGS, ids=[f"{n}-{k}" for n, k, _ in BAD_ARGS])
def test_bad_arguments_raise_value_error_as_torchmetrics(name: str, kwargs: dict[str, Any], arg: str) -> None:
    with pytest.raises(ValueError):
        getattr(tm_retrieval, name)(**kwargs)
    with pytest.raises(ValueError, match=f"`{arg}`"):
        getattr(ours, name)(**kwargs)


STRICTER: list[tuple[str, dict[str, Any], str]] = [
    ("RetrievalMAP", {"top_k": 0}, "top_k"),  # torchmetrics takes 0 as None
    ("RetrievalMRR", {"top_k": 0}, "top_k"),
    ("RetrievalMAP", {"top_k": 2.0}, "top_k"),  # torchmetrics: a TypeError from topk at compute
    ("RetrievalAUROC", {"max_fpr": 1.5}, "max_fpr"),  # torchmetrics: accepted, fails or gives NaN at compute
    ("RetrievalAUROC", {"max_fpr": 0.0}, "max_fpr"),
]


@pytest.mark.parametrize(("name", "kwargs", "arg"), STRICTER, ids=[f"{n}-{k}" for n, k, _ in STRICTER])
def test_arguments_torchmetrics_lets_through_are_refused_at_construction(
    name: str, kwargs: dict[str, Any], arg: str
) -> None:
    with pytest.raises(ValueError, match=f"`{arg}`"):
        getattr(ours, name)(**kwargs)


_P, _T, _I = torch.tensor([0.3, 0.2, 0.5]), torch.tensor([1, 0, 1]), torch.tensor([0, 0, 1])
BAD_BATCHES: list[tuple[str, tuple[Any, ...], str]] = [
    ("shape", (_P, _T[:2], _I), "`preds`, `target` and `indexes` must have one shape"),
    ("indexes None", (_P, _T, None), "`indexes`"),
    ("indexes float", (_P, _T, _I.float()), "`indexes` must be a tensor of int64"),
    ("indexes int32", (_P, _T, _I.int()), "`indexes` must be a tensor of int64"),
    ("preds int", (_T, _T, _I), "`preds` must be a floating tensor"),
    ("target 2", (_P, torch.tensor([1, 2, 0]), _I), "`target` must be binary"),
    ("target -1", (_P, torch.tensor([1, -1, 0]), _I), "`target` must be binary"),
]


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize(("what", "batch", "message"), BAD_BATCHES, ids=[b[0] for b in BAD_BATCHES])
def test_bad_batches_raise_value_error_as_torchmetrics(name: str, what: str, batch: tuple, message: str) -> None:
    if name == "RetrievalNormalizedDCG" and what.startswith("target"):
        pytest.skip("nDCG takes graded relevance")
    with pytest.raises(ValueError):
        getattr(tm_retrieval, name)().update(*batch)
    metric = getattr(ours, name)()
    with pytest.raises(ValueError, match=message):
        metric.update(*batch)
    assert not metric.preds  # nothing appended


def test_a_batch_without_rows_adds_none_where_torchmetrics_raises() -> None:
    """An empty batch, or one whose every row is ``ignore_index``, is an empty rank's batch: it adds no row (and
    no warning), where torchmetrics raises a ``ValueError``."""
    all_ignored = (_P, torch.ones(3, dtype=torch.int64), _I)
    with pytest.raises(ValueError):
        tm_retrieval.RetrievalMAP().update(_P[:0], _T[:0], _I[:0])
    with pytest.raises(ValueError):
        tm_retrieval.RetrievalMAP(ignore_index=1).update(*all_ignored)
    for metric, batch in (
        (ours.RetrievalMAP(), (_P[:0], _T[:0], _I[:0])),
        (ours.RetrievalMAP(ignore_index=1), all_ignored),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metric.update(*batch)
        assert sum(p.numel() for p in metric.preds) == 0
        metric.update(_P, _T, _I)
        expected = tm_retrieval.RetrievalMAP(ignore_index=metric.ignore_index)
        expected.update(_P, _T, _I)
        torch.testing.assert_close(metric.compute(), expected.compute(), atol=ATOL, rtol=0)


def test_soft_target_is_refused_where_binary_is_required() -> None:
    """torchmetrics lets a float target of 0.5 through its binary check (only the range is checked); ours
    requires 0 or 1."""
    with pytest.raises(ValueError, match="`target` must be binary"):
        ours.RetrievalMAP().update(_P, torch.tensor([1.0, 0.5, 0.0]), _I)
    metric = ours.RetrievalNormalizedDCG()
    metric.update(_P, torch.tensor([1.0, 0.5, -2.0]), _I)  # graded relevance: any gains
    assert torch.isfinite(metric.compute())


def test_compute_before_update_warns_and_gives_zero() -> None:
    for name in CLASSES:
        with pytest.warns(UserWarning, match="before update"):
            value = getattr(ours, name)().compute()
        flat = torch.cat(
            [torch.as_tensor(v).reshape(-1).double() for v in (value if isinstance(value, tuple) else (value,))]
        )
        assert not flat.any(), name


def test_curve_has_one_value_per_k_and_keeps_dtype() -> None:
    preds, target, indexes = _data(9)
    precision, recall, top_k = _run(ours.RetrievalPrecisionRecallCurve, {"max_k": 7}, preds, target, indexes, True)
    assert precision.shape == recall.shape == top_k.shape == (7,)
    assert precision.dtype == recall.dtype == torch.float64 and top_k.dtype == torch.int64


# ----------------------------------------------------------------------------------------- renamed classes
DEPRECATED = {
    "RetrievalRecallAtK": "CrossModalRecallAtK",
    "RetrievalMAPAtK": "CrossModalMAPAtK",
    "RetrievalMeanRank": "CrossModalMeanRank",
    "RetrievalMedianRank": "CrossModalMedianRank",
}


@pytest.mark.parametrize(("old", "new"), list(DEPRECATED.items()))
def test_old_cross_modal_names_warn_and_still_work(old: str, new: str) -> None:
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
    for module in (tmd, ours):
        with pytest.warns(FutureWarning, match=f"`{old}` is deprecated.*`{new}`"):
            metric = getattr(module, old)()
        assert isinstance(metric, getattr(ours, new))
        assert old not in module.__all__
        metric.update(image, text)
        replacement = getattr(ours, new)()
        replacement.update(image, text)
        assert metric.compute() == replacement.compute()


def test_cross_modal_mrr_and_ndcg_keep_their_behaviour_under_new_names() -> None:
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
    mrr = ours.CrossModalMRR()
    mrr.update(image, text)
    assert set(mrr.compute()) == {"i2t_MRR", "t2i_MRR"}
    ndcg = ours.CrossModalNormalizedDCG(top_k=2)
    ndcg.update(image, text, labels=torch.tensor([0, 1, 0]))
    assert set(ndcg.compute()) == {"i2t_nDCG@2", "t2i_nDCG@2"}
    with pytest.raises(ValueError, match="`indexes`"):
        ours.RetrievalMRR().update(image[:, 0], text[:, 0].round().long(), None)


# ------------------------------------------------------------------------------------------- distributed
DIST_CASES: list[tuple[str, dict[str, Any]]] = [
    ("RetrievalMAP", {"top_k": 3}),
    ("RetrievalMRR", {"empty_target_action": "skip"}),
    ("RetrievalPrecision", {"top_k": 4, "adaptive_k": True, "aggregation": "median"}),
    ("RetrievalRecall", {"top_k": 2, "empty_target_action": "pos"}),
    ("RetrievalFallOut", {"top_k": 3}),
    ("RetrievalHitRate", {"top_k": 2, "aggregation": "min"}),
    ("RetrievalNormalizedDCG", {"top_k": 5}),
    ("RetrievalRPrecision", {"aggregation": "max"}),
    ("RetrievalAUROC", {"max_fpr": 0.5}),
    ("RetrievalPrecisionRecallCurve", {}),
    ("RetrievalRecallAtFixedPrecision", {"min_precision": 0.4, "max_k": 6}),
]
#: where each rank's rows start and end, as fractions of the rows: uneven, the last rank at W=3 without rows
CUTS = {2: [0.0, 0.7, 1.0], 3: [0.0, 0.45, 1.0, 1.0]}


def _rank_rows(rank: int, world: int, n: int) -> slice:
    return slice(round(CUTS[world][rank] * n), round(CUTS[world][rank + 1] * n))


def _dist_body(rank: int, world: int) -> dict:
    out = {}
    for name, kwargs in DIST_CASES:
        preds, target, indexes = _data(11, graded=name == "RetrievalNormalizedDCG")
        rows = _rank_rows(rank, world, preds.shape[0])
        metric = getattr(ours, name)(**kwargs)
        mine = (preds[rows], target[rows], indexes[rows])
        for batch in _batches(*mine) if mine[0].numel() else []:  # the rank without rows never updates
            metric.update(*batch)
        out[name] = metric.compute()
        out[name + " again"] = metric.compute()
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_queries_split_over_ranks_equal_torchmetrics_on_the_concatenated_rows(world_size: int) -> None:
    """Rows shuffled, so each query's documents sit on several ranks; the last rank at W=3 holds none."""
    results = run_distributed(_dist_body, world_size, timeout=180)
    for name, kwargs in DIST_CASES:
        preds, target, indexes = _data(11, graded=name == "RetrievalNormalizedDCG")
        sizes = [_rank_rows(r, world_size, preds.shape[0]) for r in range(world_size)]
        assert sizes[0].stop > sizes[0].start and (world_size == 2 or sizes[-1].stop == sizes[-1].start)
        want = _tm(name, kwargs, preds, target, indexes)
        for rank, res in enumerate(results):
            for key in (name, name + " again"):
                assert (err := _close(res[key], want)) is None, f"W={world_size} rank {rank} {key}: {err}"


def test_split_helper_covers_every_row_once() -> None:
    for world in (2, 3):
        covered = [i for r in range(world) for i in range(100)[_rank_rows(r, world, 100)]]
        assert covered == list(range(100))
