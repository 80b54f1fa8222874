"""Per-query retrieval maths: documents scored for queries, as torchmetrics' retrieval metrics take them.

A batch is three flat tensors of one shape: ``preds`` (a document's score), ``target`` (its relevance) and
``indexes`` (the query it belongs to). :func:`group_queries` sorts the rows once by ``(query, -score)`` (stable:
tied scores keep their order of arrival) and every metric below is a vectorised reduction over the contiguous
segments that sort leaves, one value per query, with no Python loop over queries. The definitions follow
torchmetrics' ``torchmetrics.functional.retrieval`` (version 1.x), each one's rules stated in its docstring.

The public functional forms (``retrieval_average_precision`` and the others, torchmetrics' names and arguments),
which score one query's documents, are in ``_retrieval_query_functions``. A document whose score is NaN has no
rank: :func:`nan_free` applies ``nan_strategy`` to it (``_nan_scores``). This module imports only torch and
``functional``'s own helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor

from torchmetrics_diff.functional._nan_scores import check_nan_strategy, settle_nans

__all__ = ["check_nan_strategy"]  # re-exported: the classes take every check from this module

EMPTY_TARGET_ACTIONS = ("neg", "pos", "skip", "error")
AGGREGATIONS = ("mean", "median", "min", "max")
Aggregation = Union[str, Callable[..., Tensor]]


# ------------------------------------------------------------------------------------------ argument checks
def check_empty_target_action(value: Any) -> str:
    """``value`` if it is one of ``"neg"``, ``"pos"``, ``"skip"``, ``"error"``.

    Raises:
        ValueError: naming ``empty_target_action``.
    """
    if not isinstance(value, str) or value not in EMPTY_TARGET_ACTIONS:
        raise ValueError(f"`empty_target_action` must be one of {EMPTY_TARGET_ACTIONS}; got {value!r}")
    return value


def check_ignore_index(value: Any) -> int | None:
    """``value`` if it is an int (not a bool) or ``None``.

    Raises:
        ValueError: naming ``ignore_index``.
    """
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"`ignore_index` must be an int or None; got {value!r}")
    return value


def check_aggregation(value: Any) -> Aggregation:
    """``value`` if it is one of ``"mean"``, ``"median"``, ``"min"``, ``"max"`` or a callable.

    Raises:
        ValueError: naming ``aggregation``.
    """
    if not (callable(value) or (isinstance(value, str) and value in AGGREGATIONS)):
        raise ValueError(
            f"`aggregation` must be one of {AGGREGATIONS} or a callable `fn(values, dim=...)`; got {value!r}"
        )
    return value


def check_optional_positive_int(name: str, value: Any) -> int | None:
    """``value`` if it is ``None`` or an int ``>= 1`` (not a bool).

    Raises:
        ValueError: naming ``name``.
    """
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"`{name}` must be a positive int or None; got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool.

    Raises:
        ValueError: naming ``name``.
    """
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be a bool; got {value!r}")
    return value


def check_max_fpr(value: Any) -> float | None:
    """``value`` if it is ``None`` or a float in ``(0, 1]``.

    Raises:
        ValueError: naming ``max_fpr``.
    """
    if value is not None and (not isinstance(value, float) or not 0.0 < value <= 1.0):
        raise ValueError(f"`max_fpr` must be None or a float in (0, 1]; got {value!r}")
    return value


def check_min_precision(value: Any) -> float:
    """``value`` if it is a float in ``[0, 1]``.

    Raises:
        ValueError: naming ``min_precision``.
    """
    if not isinstance(value, float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"`min_precision` must be a float in [0, 1]; got {value!r}")
    return value


# --------------------------------------------------------------------------------------------- input checks
def _shape(x: Any) -> str:
    return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def _check_types(preds: Tensor, target: Tensor, binary: bool) -> None:
    if not (target.dtype in (torch.bool, torch.int32, torch.int64) or target.is_floating_point()):
        raise ValueError(f"`target` must be a tensor of bools, int32/int64 integers or floats; got {target.dtype}")
    if not preds.is_floating_point():
        raise ValueError(f"`preds` must be a floating tensor of scores; got {preds.dtype}")
    if binary and target.dtype is not torch.bool:
        bad = target[(target != 0) & (target != 1)]
        if bad.numel():
            raise ValueError(
                f"`target` must be binary (0 or 1) for this metric; found {bad[:5].tolist()}"
                + (" (and more)" if bad.numel() > 5 else "")
            )


def check_query_inputs(
    preds: Any, target: Any, indexes: Any, binary: bool = True, ignore_index: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Validated, flattened ``preds``, ``target`` and ``indexes``, the rows whose target is ``ignore_index``
    dropped. A batch without rows, or with none left, is valid: its three tensors come back empty (an empty rank's
    batch adds nothing; torchmetrics refuses it).

    Args:
        preds: the documents' scores, floating, any shape.
        target: their relevance, of the shape of ``preds``: bool, int32/int64 or floating; ``0``/``1`` when
            ``binary``.
        indexes: the query of each document, int64, of the shape of ``preds``.
        binary: whether ``target`` must hold only ``0`` and ``1``.
        ignore_index: a target value whose rows are dropped, or ``None``.

    Raises:
        ValueError: ``indexes`` missing, tensors of different shapes, ``indexes`` not int64, a ``target`` or
            ``preds`` of the wrong dtype, or a non-binary ``target`` where ``binary``.
    """
    if indexes is None:
        raise ValueError("`indexes` must be a tensor of query ids (int64); got None")
    for name, x in (("preds", preds), ("target", target), ("indexes", indexes)):
        if not isinstance(x, Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(x).__name__}")
    if not preds.shape == target.shape == indexes.shape:
        raise ValueError(
            "`preds`, `target` and `indexes` must have one shape; got "
            f"{_shape(preds)}, {_shape(target)} and {_shape(indexes)}"
        )
    if indexes.dtype is not torch.int64:
        raise ValueError(f"`indexes` must be a tensor of int64 (long) query ids; got {indexes.dtype}")
    preds, target, indexes = preds.reshape(-1), target.reshape(-1), indexes.reshape(-1)
    if ignore_index is not None:
        keep = target != ignore_index
        preds, target, indexes = preds[keep], target[keep], indexes[keep]
    # no row (or none left after ``ignore_index``) is a valid batch: an empty rank's, which adds nothing
    _check_types(preds, target, binary)
    return preds, target, indexes


def nan_free(*rows: Tensor, nan_strategy: str, owner: str) -> tuple[Tensor, ...]:
    """Flat ``rows`` (``preds`` first, then ``target`` and ``indexes``) without the documents whose score is NaN,
    as ``nan_strategy`` says (:func:`settle_nans`: ``"error"`` raises, ``"warn"`` warns with the count);
    unchanged with ``"disable"``. Infinite scores are kept (ranked first or last).

    Raises:
        ValueError: ``nan_strategy="error"`` and a NaN score, naming ``owner``.
    """
    if nan_strategy == "disable":
        return rows
    nan = torch.isnan(rows[0])
    if not settle_nans(nan, nan_strategy, owner, "documents", stacklevel=4):
        return rows
    return tuple(x[~nan] for x in rows)


def check_single_query(
    preds: Any, target: Any, binary: bool = True, nan_strategy: str = "disable", owner: str = ""
) -> tuple[Tensor, Tensor]:
    """Validated, flattened ``preds`` and ``target`` of one query (the functional forms), without the documents
    scored NaN as ``nan_strategy`` says (:func:`nan_free`; ``owner`` names the function in its messages).

    Raises:
        ValueError: tensors of different shapes or empty, or of the wrong dtypes, or a non-binary ``target``
            where ``binary``, or a NaN score (``"error"``), or only NaN scores (nothing left to rank).
    """
    for name, x in (("preds", preds), ("target", target)):
        if not isinstance(x, Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(x).__name__}")
    if preds.shape != target.shape:
        raise ValueError(f"`preds` and `target` must have one shape; got {_shape(preds)} and {_shape(target)}")
    if not preds.numel() or not preds.dim():
        raise ValueError(f"`preds` and `target` must be non-empty, non-scalar tensors; got {_shape(preds)}")
    _check_types(preds, target, binary)
    nan_strategy = check_nan_strategy(nan_strategy)
    preds, target = nan_free(preds.reshape(-1), target.reshape(-1), nan_strategy=nan_strategy, owner=owner)
    if not preds.numel():
        raise ValueError(f"{owner}: every score of `preds` is NaN, so no document is left to rank")
    return preds, target


def value_dtype(preds: Tensor) -> torch.dtype:
    """The dtype of the values: that of ``preds``, at least float32."""
    return torch.promote_types(preds.dtype, torch.float32)


# ------------------------------------------------------------------------------------------------- grouping
class Queries(NamedTuple):
    """Rows sorted by ``(query, -score)``: each query's documents contiguous, best first.

    Attributes:
        preds: the scores, sorted.
        target: the relevance, sorted (as given: bool, integer or floating).
        ids: the distinct query ids, ascending (one per segment).
        seg: the segment (0 .. Q-1) of each sorted row.
        counts: the number of documents of each query ``(Q,)``.
        rank: each row's 1-based position within its query.
    """

    preds: Tensor
    target: Tensor
    ids: Tensor
    seg: Tensor
    counts: Tensor
    rank: Tensor


def group_queries(preds: Tensor, target: Tensor, indexes: Tensor) -> Queries:
    """Sort flat rows by query id, then by score, highest first (stable: tied scores keep their order).

    Example:
        >>> import torch
        >>> q = group_queries(torch.tensor([0.1, 0.9, 0.5]), torch.tensor([1, 0, 1]), torch.tensor([7, 3, 7]))
        >>> q.preds, q.ids, q.rank
        (tensor([0.9000, 0.5000, 0.1000]), tensor([3, 7]), tensor([1, 1, 2]))
    """
    order = torch.argsort(preds, descending=True, stable=True)
    order = order[torch.argsort(indexes[order], stable=True)]
    preds, target, indexes = preds[order], target[order], indexes[order]
    ids, seg, counts = torch.unique_consecutive(indexes, return_inverse=True, return_counts=True)
    start = counts.cumsum(0) - counts
    rank = torch.arange(1, preds.numel() + 1, device=preds.device) - start[seg]
    return Queries(preds, target, ids, seg, counts, rank)


def seg_sum(q: Queries, x: Tensor) -> Tensor:
    """The sum of ``x`` (one value per sorted row) over each query ``(Q,)``."""
    return torch.zeros(q.counts.numel(), dtype=x.dtype, device=x.device).index_add_(0, q.seg, x)


def seg_cumsum(q: Queries, x: Tensor) -> Tensor:
    """The running sum of integer ``x`` within each query (exact: integer arithmetic)."""
    total = x.cumsum(0)
    before = (total - x)[q.counts.cumsum(0) - q.counts]  # the running sum just before each query's first row
    return total - before[q.seg]


def _within(q: Queries, k: int | Tensor | None) -> Tensor:
    """Whether each sorted row is among its query's top ``k`` (``k`` an int, a per-query tensor, or None: all)."""
    if k is None:
        return torch.ones_like(q.rank, dtype=torch.bool)
    return q.rank <= (k[q.seg] if isinstance(k, Tensor) else k)


def _ratio(num: Tensor, den: Tensor, dtype: torch.dtype) -> Tensor:
    """``num / den``, 0 where ``den`` is 0."""
    num, den = num.to(dtype), den.to(dtype)
    return torch.where(den == 0, torch.zeros_like(num), num / torch.where(den == 0, torch.ones_like(den), den))


def positives(q: Queries) -> Tensor:
    """The number of relevant documents of each query (the sum of ``target``)."""
    return seg_sum(q, q.target.to(torch.int64) if not q.target.is_floating_point() else q.target)


def negatives(q: Queries) -> Tensor:
    """The number of non-relevant documents of each query (the sum of ``1 - target``)."""
    return q.counts - positives(q).to(torch.int64)


def _hits(q: Queries, scored: bool) -> Tensor:
    """Relevant rows as int64; with ``scored``, only those scoring above 0 (as torchmetrics' AP, reciprocal rank,
    precision and recall count them)."""
    hits = q.target.to(torch.int64)
    return hits * (q.preds > 0) if scored else hits


# ------------------------------------------------------------------------------------------ per-query values
def average_precision(q: Queries, top_k: int | None = None) -> Tensor:
    """AP@k of each query: the mean of ``precision@i`` over the positions ``i <= k`` holding a relevant document
    scored above 0; 0 when there is none."""
    hits = _hits(q, True) * _within(q, top_k)
    found = seg_cumsum(q, hits)
    dtype = value_dtype(q.preds)
    terms = torch.where(
        hits > 0, found.to(dtype) / q.rank.to(dtype), torch.zeros((), dtype=dtype, device=q.preds.device)
    )
    return _ratio(seg_sum(q, terms), seg_sum(q, hits), dtype)


def reciprocal_rank(q: Queries, top_k: int | None = None) -> Tensor:
    """``1 / rank`` of each query's first relevant document scored above 0 within the top ``k``; 0 when none."""
    dtype = value_dtype(q.preds)
    hits = _hits(q, True) * _within(q, top_k)
    terms = torch.where(hits > 0, 1.0 / q.rank.to(dtype), torch.zeros((), dtype=dtype, device=q.preds.device))
    out = torch.zeros(q.counts.numel(), dtype=dtype, device=terms.device)
    return out.scatter_reduce_(0, q.seg, terms, "amax")


def precision(q: Queries, top_k: int | None = None, adaptive_k: bool = False) -> Tensor:
    """Precision@k of each query: relevant documents scored above 0 among the top ``k``, divided by ``k``
    (``k`` is the number of documents when ``top_k`` is None, or with ``adaptive_k`` when ``top_k`` exceeds
    it); 0 for a query without a relevant document."""
    k = q.counts if top_k is None else torch.full_like(q.counts, top_k)
    if adaptive_k and top_k is not None:
        k = torch.minimum(k, q.counts)
    relevant = seg_sum(q, _hits(q, True) * _within(q, k))
    out = _ratio(relevant, k, value_dtype(q.preds))
    return torch.where(positives(q) == 0, torch.zeros_like(out), out)


def recall(q: Queries, top_k: int | None = None) -> Tensor:
    """Recall@k of each query: relevant documents scored above 0 among the top ``k``, divided by all its relevant
    documents; 0 for a query without one."""
    return _ratio(seg_sum(q, _hits(q, True) * _within(q, top_k)), positives(q), value_dtype(q.preds))


def fall_out(q: Queries, top_k: int | None = None) -> Tensor:
    """Fall-out@k of each query: non-relevant documents among the top ``k``, divided by all its non-relevant
    documents; 0 for a query without one."""
    irrelevant = 1 - q.target.to(torch.int64)
    return _ratio(seg_sum(q, irrelevant * _within(q, top_k)), seg_sum(q, irrelevant), value_dtype(q.preds))


def hit_rate(q: Queries, top_k: int | None = None) -> Tensor:
    """1 for a query with a relevant document among its top ``k``, else 0."""
    return (seg_sum(q, _hits(q, False) * _within(q, top_k)) > 0).to(value_dtype(q.preds))


def r_precision(q: Queries) -> Tensor:
    """R-precision of each query: the precision at ``R``, its number of relevant documents; 0 when ``R`` is 0."""
    total = positives(q).to(torch.int64)
    return _ratio(seg_sum(q, _hits(q, False) * _within(q, total)), total, value_dtype(q.preds))


def _tie_starts(q: Queries) -> Tensor:
    """Whether each sorted row starts a new run of equal scores within its query."""
    starts = torch.ones_like(q.seg, dtype=torch.bool)
    starts[1:] = (q.seg[1:] != q.seg[:-1]) | (q.preds[1:] != q.preds[:-1])
    return starts


def normalized_dcg(q: Queries, top_k: int | None = None) -> Tensor:
    """nDCG@k of each query with graded relevance ``target``: ``DCG@k = sum_{i <= k} gain_i / log2(i + 1)`` of the
    documents sorted by score, each run of tied scores sharing its mean gain (as scikit-learn's ``ndcg_score``),
    divided by the DCG@k of the ideal order (gains sorted); 0 where the ideal DCG is 0."""
    dtype = value_dtype(q.preds)
    gain = q.target.to(dtype)
    discount = torch.where(
        _within(q, top_k), 1.0 / torch.log2(q.rank.to(dtype) + 1.0), torch.zeros((), dtype=dtype, device=q.preds.device)
    )
    starts = _tie_starts(q)
    run = starts.to(torch.int64).cumsum(0) - 1
    n_runs = int(run[-1]) + 1 if run.numel() else 0
    zeros = torch.zeros(n_runs, dtype=dtype, device=gain.device)
    mean_gain = zeros.index_add(0, run, gain) / torch.bincount(run, minlength=n_runs).to(dtype)
    run_discount = zeros.index_add(0, run, discount)
    dcg = torch.zeros(q.counts.numel(), dtype=dtype, device=gain.device).index_add_(
        0, q.seg[starts], mean_gain * run_discount
    )
    # the ideal order: the same segments (same queries, same sizes), each query's gains sorted descending
    order = torch.argsort(gain, descending=True, stable=True)
    order = order[torch.argsort(q.seg[order], stable=True)]
    ideal = seg_sum(q, gain[order] * discount)
    return _ratio(dcg, ideal, dtype)


def auroc(q: Queries, top_k: int | None = None, max_fpr: float | None = None) -> Tensor:
    """AUROC of each query over its top ``k`` documents (exact, tied scores forming one ROC step); with
    ``max_fpr``, the partial area up to that false-positive rate with McClish's correction (0.5 for a random
    ranking, 1 for a perfect one); 0 for a query whose top ``k`` lacks a relevant or a non-relevant document."""
    dtype = value_dtype(q.preds)
    keep = _within(q, top_k)
    rel = q.target.to(torch.int64) * keep
    irr = (1 - q.target.to(torch.int64)) * keep
    n_pos, n_neg = seg_sum(q, rel), seg_sum(q, irr)
    tp, fp = seg_cumsum(q, rel), seg_cumsum(q, irr)
    # ROC points: the last row of each run of tied scores among the kept rows (a kept row is a prefix of its query)
    ends = keep.clone()
    ends[:-1] &= _tie_starts(q)[1:] | ~keep[1:]
    seg = q.seg[ends]
    x1 = _ratio(fp[ends], n_neg[seg], dtype)
    y1 = _ratio(tp[ends], n_pos[seg], dtype)
    first = torch.ones_like(seg, dtype=torch.bool)
    first[1:] = seg[1:] != seg[:-1]
    zero = torch.zeros((), dtype=dtype, device=q.preds.device)
    x0 = torch.where(first, zero, x1.roll(1))
    y0 = torch.where(first, zero, y1.roll(1))
    if max_fpr is None or max_fpr == 1.0:
        area = (x1 - x0) * (y0 + y1) / 2
    else:
        m = torch.tensor(max_fpr, dtype=dtype, device=q.preds.device)
        width = torch.where(x1 > x0, x1 - x0, torch.ones((), dtype=dtype, device=q.preds.device))
        y_m = y0 + (y1 - y0) * (m - x0) / width
        partial = (m - x0) * (y0 + y_m) / 2
        area = torch.where(x1 <= m, (x1 - x0) * (y0 + y1) / 2, torch.where(x0 >= m, zero, partial))
    value = torch.zeros(q.counts.numel(), dtype=dtype, device=area.device).index_add_(0, seg, area)
    if max_fpr is not None and max_fpr != 1.0:
        min_area = 0.5 * max_fpr**2
        value = 0.5 * (1 + (value - min_area) / (max_fpr - min_area))
    return torch.where((n_pos > 0) & (n_neg > 0), value, torch.zeros_like(value))


def precision_recall_curve(q: Queries, max_k: int, adaptive_k: bool = False) -> tuple[Tensor, Tensor]:
    """Precision@k and recall@k of each query for ``k = 1 .. max_k``: two ``(Q, max_k)`` tensors. Precision
    divides by ``k`` (by ``min(k, n)`` with ``adaptive_k``, ``n`` the query's documents); a query without a
    relevant document has zeros."""
    dtype = value_dtype(q.preds)
    n_q = q.counts.numel()
    dense = torch.zeros(n_q, max_k, dtype=dtype, device=q.preds.device)
    keep = q.rank <= max_k
    dense[q.seg[keep], q.rank[keep] - 1] = q.target[keep].to(dtype)
    relevant = dense.cumsum(1)
    ks = torch.arange(1, max_k + 1, device=dense.device)
    denom = torch.minimum(ks[None, :], q.counts[:, None]) if adaptive_k else ks[None, :].expand(n_q, max_k)
    total = positives(q)[:, None].expand(n_q, max_k)
    rec = _ratio(relevant, total, dtype)
    prec = torch.where(total == 0, torch.zeros((), dtype=dtype, device=q.preds.device), _ratio(relevant, denom, dtype))
    return prec, rec


def recall_at_fixed_precision(prec: Tensor, rec: Tensor, top_k: Tensor, min_precision: float) -> tuple[Tensor, Tensor]:
    """The highest recall among the ``k`` whose precision is at least ``min_precision``, and that ``k`` (the
    largest such ``k`` on a tie); ``(0, max_k)`` when no ``k`` qualifies or the best recall is 0."""
    ok = prec >= min_precision
    if not bool(ok.any()):
        return torch.zeros((), dtype=rec.dtype, device=rec.device), torch.tensor(top_k.numel(), device=top_k.device)
    best = rec[ok].max()
    if best == 0:
        return best, torch.tensor(top_k.numel(), dtype=top_k.dtype, device=top_k.device)
    return best, top_k[ok & (rec == best)].max()


def aggregate(values: Tensor, aggregation: Aggregation, dim: int | None = None) -> Tensor:
    """Reduce per-query ``values`` with ``"mean"``, ``"median"`` (the lower of the two middle values, as
    ``torch.median``), ``"min"``, ``"max"`` or a callable ``fn(values, dim=dim)``, over ``dim`` (all values
    when None)."""
    if callable(aggregation):
        return aggregation(values, dim=dim)
    if aggregation == "mean":
        return values.mean() if dim is None else values.mean(dim=dim)
    if aggregation == "median":
        return values.median() if dim is None else values.median(dim=dim).values
    if aggregation == "min":
        return values.amin() if dim is None else values.amin(dim=dim)
    return values.amax() if dim is None else values.amax(dim=dim)
