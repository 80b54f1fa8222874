"""NaN scores in the per-query retrieval metrics (``preds, target, indexes``) and NaN embeddings in cross-modal
retrieval.

A document whose score is NaN has no rank. ``nan_strategy`` (a keyword argument of every class, keyword-only in
every function): ``"error"`` (default) raises a ``ValueError`` naming the metric, ``preds``, the count of
documents and the way out; ``"warn"`` warns once with the count and drops those documents; ``"ignore"`` drops
them silently; ``"disable"`` checks nothing. After dropping, every value equals torchmetrics' on the rows without
those documents (the independent reference), a query left without documents being absent. Infinite scores are
ranked. Cross-modal retrieval refuses non-finite embeddings at ``compute`` (and in its functions). At W=2 with
the NaNs on rank 1 only, every rank raises, or gets the NaN-free global value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import torchmetrics_diff.functional as ours_f
import torchmetrics_diff.retrieval as ours
from tests._helpers.harness import run_distributed

tm_retrieval = pytest.importorskip("torchmetrics.retrieval")
tm_functional = pytest.importorskip("torchmetrics.functional.retrieval")

pytestmark = pytest.mark.timeout(240)

CLASSES = {
    "RetrievalAUROC": {"max_fpr": 0.5},
    "RetrievalFallOut": {"top_k": 3},
    "RetrievalHitRate": {"top_k": 2},
    "RetrievalMAP": {},
    "RetrievalMRR": {},
    "RetrievalNormalizedDCG": {"top_k": 4},
    "RetrievalPrecision": {"top_k": 3},
    "RetrievalPrecisionRecallCurve": {"max_k": 4},
    "RetrievalRPrecision": {},
    "RetrievalRecall": {"top_k": 3},
    "RetrievalRecallAtFixedPrecision": {"min_precision": 0.3, "max_k": 5},
}
FUNCTIONS = {
    "retrieval_auroc": {},
    "retrieval_average_precision": {"top_k": 4},
    "retrieval_fall_out": {"top_k": 3},
    "retrieval_hit_rate": {"top_k": 2},
    "retrieval_normalized_dcg": {},
    "retrieval_precision": {"top_k": 3},
    "retrieval_precision_recall_curve": {"max_k": 4},
    "retrieval_r_precision": {},
    "retrieval_recall": {"top_k": 3},
    "retrieval_reciprocal_rank": {},
}


def _data(seed: int = 0, graded: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eight queries of 6 documents (distinct float32 scores); the first half of the rows holds no NaN, the
    second half 8 NaN scores: every document of query 7, and two documents of queries 1 to 6. Queries 0 to 6 have
    documents in both halves. Returns preds, target, indexes and the NaN mask."""
    g = torch.Generator().manual_seed(seed)
    n = 48
    preds = ((torch.randperm(10 * n, generator=g)[:n] + 1).double() / (10 * n)).float().double()
    target = torch.randint(0, 3, (n,), generator=g) if graded else (torch.rand(n, generator=g) < 0.4).long()
    first = torch.randperm(42, generator=g)  # the rows of queries 0..6, shuffled: 24 in each half, 18 in the second
    second = torch.cat([first[24:], torch.arange(42, 48)])[torch.randperm(24, generator=g)]
    order = torch.cat([first[:24], second])
    indexes = torch.arange(8).repeat_interleave(6)
    preds, target, indexes = preds[order], target[order], indexes[order]
    target[indexes == 0] = torch.tensor([1, 0, 0, 1, 0, 1], dtype=target.dtype)
    nan = (
        (indexes == 7)
        | (torch.arange(n) == _second_half_row(indexes, 1))
        | (torch.arange(n) == _second_half_row(indexes, 4))
    )
    preds[nan] = float("nan")
    return preds, target, indexes, nan


def _second_half_row(indexes: torch.Tensor, query: int) -> int:
    rows = torch.nonzero(indexes[24:] == query, as_tuple=True)[0]
    return 24 + int(rows[0]) if rows.numel() else -1


def _graded(name: str) -> bool:
    return name in ("RetrievalNormalizedDCG", "retrieval_normalized_dcg")


def _run(cls: type, kwargs: dict[str, Any], preds: torch.Tensor, target: torch.Tensor, indexes: torch.Tensor) -> Any:
    metric = cls(**kwargs)
    cut = preds.numel() // 3
    metric.update(preds[:cut], target[:cut], indexes[:cut])
    metric.update(preds[cut:], target[cut:], indexes[cut:])
    return metric.compute()


def _tm(name: str, kwargs: dict[str, Any], preds: torch.Tensor, target: torch.Tensor, indexes: torch.Tensor) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(getattr(tm_retrieval, name), kwargs, preds, target, indexes)


def _close(got: Any, want: Any) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (got, want)
        for a, b in zip(got, want):
            _close(a, b)
        return
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if want.is_floating_point():
        torch.testing.assert_close(got.double(), want.double(), atol=1e-6, rtol=0)
    else:
        assert torch.equal(got.to(want.dtype), want), (got, want)


def _nan_warnings(caught: list) -> list[str]:
    return [str(w.message) for w in caught if "NaN" in str(w.message)]


# ---------------------------------------------------------------------------------------------- classes
@pytest.mark.parametrize("name", CLASSES)
def test_class_error_by_default_names_metric_argument_and_count(name: str) -> None:
    preds, target, indexes, nan = _data(graded=_graded(name))
    count, total = int(nan.sum()), nan.numel()
    with pytest.raises(ValueError, match=rf"^{name}: `preds` holds NaN scores in {count} of {total} documents") as e:
        _run(getattr(ours, name), CLASSES[name], preds, target, indexes)
    assert "nan_strategy='ignore'" in str(e.value)


@pytest.mark.parametrize("strategy", ["warn", "ignore"])
@pytest.mark.parametrize("name", CLASSES)
def test_class_drops_the_documents_and_equals_torchmetrics_without_them(name: str, strategy: str) -> None:
    preds, target, indexes, nan = _data(graded=_graded(name))
    want = _tm(name, CLASSES[name], preds[~nan], target[~nan], indexes[~nan])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(getattr(ours, name), {**CLASSES[name], "nan_strategy": strategy}, preds, target, indexes)
    messages = _nan_warnings(caught)
    if strategy == "warn":
        assert len(messages) == 1, messages
        assert f"dropped {int(nan.sum())} of {nan.numel()} documents" in messages[0], messages[0]
    else:
        assert not messages
    _close(got, want)


def test_class_disable_checks_nothing_and_bad_strategy_is_refused() -> None:
    preds, target, indexes, _ = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(ours.RetrievalMAP, {"nan_strategy": "disable"}, preds, target, indexes)
    assert not _nan_warnings(caught)
    with pytest.raises(ValueError, match="`nan_strategy` must be one of"):
        ours.RetrievalMRR(nan_strategy="drop")


def test_class_forward_drops_silently_and_compute_warns_once() -> None:
    preds, target, indexes, nan = _data()
    metric = ours.RetrievalMAP(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric(preds[:20], target[:20], indexes[:20])
        metric(preds[20:], target[20:], indexes[20:])
        assert not _nan_warnings(caught)
        value = metric.compute()
    assert len(_nan_warnings(caught)) == 1
    _close(value, _tm("RetrievalMAP", {}, preds[~nan], target[~nan], indexes[~nan]))


def test_class_with_only_nan_scores_is_a_metric_without_rows() -> None:
    preds = torch.full((4,), float("nan"))
    metric = ours.RetrievalMRR(nan_strategy="ignore")
    metric.update(preds, torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1]))
    assert metric.compute() == 0


@pytest.mark.parametrize("name", ["RetrievalMAP", "RetrievalAUROC", "RetrievalNormalizedDCG", "RetrievalMRR"])
def test_infinite_scores_are_ranked_not_dropped(name: str) -> None:
    """One +inf and one -inf per query at most (no ties): the default ``"error"`` accepts them, and the values
    equal torchmetrics' (which ranks them first and last)."""
    preds, target, indexes, nan = _data(graded=_graded(name))
    preds, target, indexes = preds[~nan], target[~nan], indexes[~nan]
    for q in range(7):
        rows = torch.nonzero(indexes == q, as_tuple=True)[0]
        preds[rows[0]], preds[rows[-1]] = float("inf"), float("-inf")
    _close(
        _run(getattr(ours, name), CLASSES[name], preds, target, indexes),
        _tm(name, CLASSES[name], preds, target, indexes),
    )


# -------------------------------------------------------------------------------------------- functions
def _tm_function(fn: str, kwargs: dict[str, Any], preds: torch.Tensor, target: torch.Tensor) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(tm_functional, fn)(preds, target, **kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_function_policies(fn: str) -> None:
    preds, target, indexes, _ = _data(graded=_graded(fn))
    rows = indexes == 0  # query 0: two of its six documents scored NaN below
    p, t = preds[rows].clone(), target[rows]
    p[[1, 4]] = float("nan")
    keep = ~torch.isnan(p)
    with pytest.raises(ValueError, match=rf"^{fn}: `preds` holds NaN scores in 2 of 6 documents"):
        getattr(ours_f, fn)(p, t, **FUNCTIONS[fn])
    want = _tm_function(fn, FUNCTIONS[fn], p[keep], t[keep])
    for strategy in ("warn", "ignore"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = getattr(ours_f, fn)(p, t, **FUNCTIONS[fn], nan_strategy=strategy)
        messages = _nan_warnings(caught)
        assert len(messages) == (strategy == "warn"), messages
        assert strategy == "ignore" or "dropped 2 of 6 documents" in messages[0]
        _close(got, want)
    getattr(ours_f, fn)(p, t, **FUNCTIONS[fn], nan_strategy="disable")  # no check: no error
    with pytest.raises(ValueError, match="every score of `preds` is NaN"):
        getattr(ours_f, fn)(torch.full((3,), float("nan")), t[:3], **FUNCTIONS[fn], nan_strategy="ignore")


def test_function_ranks_infinite_scores() -> None:
    p = torch.tensor([0.3, float("inf"), 0.1, float("-inf"), 0.7])
    t = torch.tensor([0, 1, 1, 0, 1])
    for fn in ("retrieval_average_precision", "retrieval_reciprocal_rank", "retrieval_auroc"):
        _close(getattr(ours_f, fn)(p, t), _tm_function(fn, {}, p, t))


# ----------------------------------------------------------------------------------- cross-modal retrieval
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_cross_modal_refuses_non_finite_embeddings_at_compute(bad: float) -> None:
    g = torch.Generator().manual_seed(1)
    image, text = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    image[2, 1] = bad
    text[[0, 4], 3] = bad
    metric = ours.CrossModalMRR()
    metric.update(image, text)
    with pytest.raises(ValueError, match=r"embeddings must be finite .* in 1 row\(s\) of `image` and 2 row\(s\) of"):
        metric.compute()
    for fn in (ours_f.retrieval_mrr, ours_f.retrieval_ndcg, ours_f.retrieval_recall_at_k):
        with pytest.raises(ValueError, match="embeddings must be finite"):
            fn(image, text)


# ------------------------------------------------------------------------------------------- distributed
def _distributed_body(rank: int, world: int, strategy: str) -> dict[str, Any]:
    """Rank 0 holds the first half of the rows (no NaN), rank 1 the second (every NaN, a whole query)."""
    preds, target, indexes, _ = _data()
    half = preds.numel() // 2
    rows = slice(0, half) if rank == 0 else slice(half, None)
    out: dict[str, Any] = {}
    metric = ours.RetrievalMAP(top_k=4, nan_strategy=strategy)
    metric.update(preds[rows], target[rows], indexes[rows])
    try:
        out["map"] = ("value", metric.compute())
    except ValueError as err:
        out["map"] = ("raised", str(err))
    g = torch.Generator().manual_seed(2)
    image, text = torch.randn(10, 4, generator=g), torch.randn(10, 4, generator=g)
    image[7, 0] = float("nan")
    metric = ours.CrossModalRecallAtK(top_k=(1, 2))
    metric.update(image[:5] if rank == 0 else image[5:], text[:5] if rank == 0 else text[5:])
    try:
        out["cross"] = ("value", metric.compute())
    except ValueError as err:
        out["cross"] = ("raised", str(err))
    return out


@pytest.mark.parametrize("strategy", ["error", "ignore"])
def test_nans_on_one_rank_give_the_same_outcome_on_every_rank(strategy: str) -> None:
    results = run_distributed(_distributed_body, 2, strategy, timeout=180)
    preds, target, indexes, nan = _data()
    want = _tm("RetrievalMAP", {"top_k": 4}, preds[~nan], target[~nan], indexes[~nan])
    for rank, res in enumerate(results):
        kind, value = res["map"]
        if strategy == "error":
            assert kind == "raised" and value.startswith(f"RetrievalMAP: `preds` holds NaN scores in {int(nan.sum())}")
        else:
            assert kind == "value", (rank, value)
            _close(value, want)
        kind, value = res["cross"]
        assert kind == "raised" and "1 row(s) of `image`" in value, (rank, value)  # always an error
