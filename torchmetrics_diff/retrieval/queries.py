"""torchmetrics' retrieval metrics, under its names: documents scored for queries, ``update(preds, target, indexes)``.

Each rank appends its rows (``ignore_index`` rows dropped) to three ``cat`` list states; ``compute`` syncs them in
one collective and groups the rows by query over the global batch, so a query whose documents sit on several ranks
is scored exactly as on one process. The grouping sorts the rows once by ``(query, -score)`` and every value is a
vectorised segment reduction (:mod:`torchmetrics_diff.functional._retrieval_queries`); the per-query values are
then aggregated (``mean`` by default). A document whose score is NaN has no rank: ``nan_strategy`` (a keyword
argument of every class) says what it does, applied in ``compute`` to every rank's rows.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from torchmetrics_diff._batch_step import QuietBatchValue
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.functional import _retrieval_queries as F
from torchmetrics_diff.metric import Metric, dim_zero_cat

# Under torch.compile the batch checks (values read on the host, ``ignore_index`` rows dropped) and the grouping
# by query (data-dependent shapes) run eagerly, each behind one graph break.
_checked_rows = outside_graph(F.check_query_inputs)


def _metric_value(metric: Any) -> Any:
    """The value of ``metric`` from its states (eager: see :func:`outside_graph`)."""
    return metric._value()


_value_outside_graph = outside_graph(_metric_value)

_COMMON_ARGS = """
        empty_target_action: what a query without a relevant document contributes: ``"neg"`` 0, ``"pos"`` 1,
            ``"skip"`` nothing (left out of the aggregation), ``"error"`` a ``ValueError`` at ``compute``.
            Default ``"{default}"``.
        ignore_index: rows whose ``target`` equals it are dropped at ``update``. Default ``None``."""
_AGGREGATION_ARG = """
        aggregation: how the per-query values reduce: ``"mean"`` (default), ``"median"`` (the lower middle value
            for an even count, as ``torch.median``), ``"min"``, ``"max"``, or a callable ``fn(values, dim=None)``."""
_KWARGS_ARG = """
        kwargs: ``nan_strategy``, what a NaN score does, checked in ``compute`` on every rank's rows: ``"error"``
            (default) raises a ``ValueError`` with the count, ``"warn"`` drops its document with a warning from
            ``compute`` giving the count, ``"ignore"`` drops it silently, ``"disable"`` skips the check
            (torchmetrics' behaviour); infinite scores are ranked. And the :class:`~torchmetrics_diff.Metric`
            keyword arguments (``compute_on_cpu=True`` keeps the rows off the accelerator)."""
_TOP_K_ARG = """
        top_k: only each query's ``top_k`` best-scored documents count (a positive int), or ``None`` (default):
            all of them."""
_RAISES = """

    Raises:
        ValueError: a bad argument (naming it); in ``update``, missing ``indexes``, tensors of different shapes,
            ``indexes`` not int64, ``preds`` not floating, a ``target`` of another dtype than bool, int32/int64 or
            floating{binary}; in ``compute``, with ``empty_target_action="error"``, a query without a {kind}
            document, or a NaN score with ``nan_strategy="error"``."""
_STATES = """

    ``preds`` are stored in the metric's dtype (float32 by default, as torchmetrics; float64 after
    ``set_dtype(torch.float64)``), as is the result. Tied scores keep their order of arrival; torchmetrics orders
    them by its ``topk``, so metrics that cut the ranking (all but nDCG and AUROC, which average over ties) can
    differ from it on ties at the cut."""


def _doc(summary: str, args: str, example: str, default: str = "neg", binary: bool = True, kind: str = "relevant"):
    binary_text = ", or a ``target`` that is not binary (0 or 1)" if binary else ""
    return (
        summary
        + _STATES
        + "\n\n    Args:"
        + args
        + _COMMON_ARGS.format(default=default)
        + _AGGREGATION_ARG
        + _KWARGS_ARG
        + _RAISES.format(binary=binary_text, kind=kind)
        + "\n\n    Example:\n"
        + example
    )


class _QueryRetrieval(QuietBatchValue, Metric):
    """Stores ``preds``, ``target`` and ``indexes`` as ``cat`` states; ``compute`` scores each query and
    aggregates."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound: ClassVar[float | None] = 0.0
    plot_upper_bound: ClassVar[float | None] = 1.0
    #: whether ``target`` must be 0/1 (nDCG takes graded relevance)
    _binary_target = True
    #: which queries count as empty: those without a relevant document (without a non-relevant one for fall-out)
    _empty_kind = "relevant"
    indexes: list[Tensor]
    preds: list[Tensor]
    target: list[Tensor]

    def __init__(
        self,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        aggregation: Any = "mean",
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.nan_strategy = F.check_nan_strategy(nan_strategy)
        self.empty_target_action = F.check_empty_target_action(empty_target_action)
        self.ignore_index = F.check_ignore_index(ignore_index)
        self.aggregation = F.check_aggregation(aggregation)
        self.add_state("indexes", [], dist_reduce_fx="cat")
        self.add_state("preds", [], dist_reduce_fx="cat")
        self.add_state("target", [], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor, indexes: Tensor) -> None:
        """Append a batch of scored documents. A batch without rows (or with none left after ``ignore_index``)
        adds none: an empty rank's batch is valid (torchmetrics refuses it).

        Args:
            preds: the documents' scores, floating, any shape.
            target: their relevance, of the shape of ``preds``: bool, int32/int64 or floating (0 or 1 except for
                nDCG, which takes graded relevance).
            indexes: the query of each document, int64, of the shape of ``preds``; a query's documents may
                arrive in several batches and on several ranks.

        Raises:
            ValueError: missing ``indexes``, tensors of different shapes, ``indexes`` not int64, or a
                ``preds``/``target`` of the wrong dtype or values.
        """
        preds, target, indexes = _checked_rows(
            preds, target, indexes, binary=self._binary_target, ignore_index=self.ignore_index
        )
        self.indexes.append(indexes)
        self.preds.append(preds.to(self.dtype))
        self.target.append(target.to(torch.int64) if self._binary_target else target.to(self.dtype))

    def _queries(self) -> F.Queries | None:
        """Every row seen (every rank's, once synced), without the NaN scores ``nan_strategy`` drops, grouped by
        query; ``None`` before any row (or when none is left)."""
        if not self.preds or not sum(p.numel() for p in self.preds):
            return None
        strategy = self.nan_strategy
        if strategy == "warn" and self.__dict__.get("_in_batch_value"):
            strategy = "ignore"  # forward's value of one batch: compute() reports the NaNs of every batch
        rows = (dim_zero_cat(self.preds), dim_zero_cat(self.target), dim_zero_cat(self.indexes))
        preds, target, indexes = F.nan_free(*rows, nan_strategy=strategy, owner=type(self).__name__)
        return F.group_queries(preds, target, indexes) if preds.numel() else None

    def _empty(self, q: F.Queries) -> Tensor:
        if self._empty_kind == "non-relevant":
            return F.negatives(q) == 0
        return F.positives(q) == 0

    def _settle_empty(self, q: F.Queries, values: Tensor) -> Tensor:
        """``values`` (one row per query) with the empty queries replaced as ``empty_target_action`` says."""
        empty = self._empty(q)
        if self.empty_target_action == "error":
            if bool(empty.any()):
                bad = q.ids[empty]
                raise ValueError(
                    f"empty_target_action='error' and {bad.numel()} quer{'y' if bad.numel() == 1 else 'ies'} "
                    f"without a {self._empty_kind} document: indexes {bad[:5].tolist()}"
                    + (" ..." if bad.numel() > 5 else "")
                )
            return values
        if self.empty_target_action == "skip":
            return values[~empty]
        fill = torch.ones_like(values) if self.empty_target_action == "pos" else torch.zeros_like(values)
        return torch.where(empty.view(-1, *([1] * (values.dim() - 1))), fill, values)

    def _values(self, q: F.Queries) -> Tensor:
        raise NotImplementedError

    def compute(self) -> Tensor:
        """The per-query values over every rank's rows, aggregated; 0 when no query is left (or no row seen)."""
        return _value_outside_graph(self)

    def _value(self) -> Any:
        q = self._queries()
        if q is None:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        values = self._settle_empty(q, self._values(q))
        if not values.numel():
            return torch.zeros((), dtype=values.dtype, device=values.device)
        return F.aggregate(values, self.aggregation)


class _TopK(_QueryRetrieval):
    def __init__(
        self,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        top_k: int | None = None,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, aggregation, **kwargs)
        self.top_k = F.check_optional_positive_int("top_k", top_k)


class RetrievalMAP(_TopK):
    __doc__ = _doc(
        """Mean average precision of ranked documents, per query then aggregated (torchmetrics' class of the same
    name): a query's AP is the mean of precision@i over the positions ``i <= top_k`` holding a relevant document.
    As torchmetrics, a relevant document scored ``<= 0`` counts as not retrieved.""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalMAP
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalMAP()
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.7917)
    """,
    )

    def _values(self, q: F.Queries) -> Tensor:
        return F.average_precision(q, self.top_k)


class RetrievalMRR(_TopK):
    __doc__ = _doc(
        """Mean reciprocal rank of ranked documents (torchmetrics' class of the same name): a query's value is
    ``1 / rank`` of its best-scored relevant document, 0 when that rank is beyond ``top_k``. As torchmetrics, a
    relevant document scored ``<= 0`` counts as not retrieved. (Cross-modal MRR over embedding pairs is
    :class:`~torchmetrics_diff.CrossModalMRR`.)""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalMRR
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalMRR()
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.7500)
    """,
    )

    def _values(self, q: F.Queries) -> Tensor:
        return F.reciprocal_rank(q, self.top_k)


class RetrievalPrecision(_TopK):
    __doc__ = _doc(
        """Precision@k of ranked documents (torchmetrics' class of the same name): a query's relevant documents
    among its ``top_k`` best-scored ones, divided by ``top_k`` (by its number of documents when ``top_k`` is
    None, or with ``adaptive_k`` when ``top_k`` exceeds it). As torchmetrics, a relevant document scored ``<= 0``
    counts as not retrieved.""",
        _TOP_K_ARG
        + """
        adaptive_k: divide by the query's number of documents when ``top_k`` exceeds it. Default ``False``.""",
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalPrecision
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalPrecision(top_k=2)
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.5000)
    """,
    )

    def __init__(
        self,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        top_k: int | None = None,
        adaptive_k: bool = False,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, top_k, aggregation, **kwargs)
        self.adaptive_k = F.check_bool("adaptive_k", adaptive_k)

    def _values(self, q: F.Queries) -> Tensor:
        return F.precision(q, self.top_k, self.adaptive_k)


class RetrievalRecall(_TopK):
    __doc__ = _doc(
        """Recall@k of ranked documents (torchmetrics' class of the same name): a query's relevant documents among
    its ``top_k`` best-scored ones, divided by all its relevant documents. As torchmetrics, a relevant document
    scored ``<= 0`` counts as not retrieved.""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalRecall
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalRecall(top_k=2)
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.7500)
    """,
    )

    def _values(self, q: F.Queries) -> Tensor:
        return F.recall(q, self.top_k)


class RetrievalFallOut(_TopK):
    __doc__ = _doc(
        """Fall-out@k of ranked documents (torchmetrics' class of the same name; lower is better): a query's
    non-relevant documents among its ``top_k`` best-scored ones, divided by all its non-relevant documents. The
    empty queries here are those **without a non-relevant document**, and ``empty_target_action`` defaults to
    ``"pos"``.""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalFallOut
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalFallOut(top_k=2)
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.5000)
    """,
        default="pos",
        kind="non-relevant",
    )

    higher_is_better = False
    _empty_kind = "non-relevant"

    def __init__(
        self,
        empty_target_action: str = "pos",
        ignore_index: int | None = None,
        top_k: int | None = None,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, top_k, aggregation, **kwargs)

    def _values(self, q: F.Queries) -> Tensor:
        return F.fall_out(q, self.top_k)


class RetrievalHitRate(_TopK):
    __doc__ = _doc(
        """Hit rate@k of ranked documents (torchmetrics' class of the same name): the share of queries with a
    relevant document among their ``top_k`` best-scored ones.""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalHitRate
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalHitRate(top_k=1)
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.5000)
    """,
    )

    def _values(self, q: F.Queries) -> Tensor:
        return F.hit_rate(q, self.top_k)


class RetrievalNormalizedDCG(_TopK):
    __doc__ = _doc(
        """Normalized discounted cumulative gain of ranked documents with graded relevance (torchmetrics' class
    of the same name): ``DCG@k = sum_{i <= k} target_i / log2(i + 1)`` over a query's documents sorted by score,
    tied scores sharing the mean gain of their run (as torchmetrics and scikit-learn's ``ndcg_score``), divided
    by the DCG@k of the ideal order; 0 where that is 0. ``target`` may hold any gains (integer or floating); a
    query is empty when its gains sum to 0. (Cross-modal nDCG over embedding pairs is
    :class:`~torchmetrics_diff.CrossModalNormalizedDCG`.)""",
        _TOP_K_ARG,
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalNormalizedDCG
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([0, 1, 3, 0, 2, 0, 1])
        >>> metric = RetrievalNormalizedDCG()
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.8348)
    """,
        binary=False,
    )

    _binary_target = False

    def _values(self, q: F.Queries) -> Tensor:
        return F.normalized_dcg(q, self.top_k)


class RetrievalRPrecision(_QueryRetrieval):
    __doc__ = _doc(
        """R-precision of ranked documents (torchmetrics' class of the same name): a query's precision among its
    ``R`` best-scored documents, ``R`` its number of relevant ones.""",
        "",
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalRPrecision
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalRPrecision()
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.7500)
    """,
    )

    def __init__(
        self,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, aggregation, **kwargs)

    def _values(self, q: F.Queries) -> Tensor:
        return F.r_precision(q)


class RetrievalAUROC(_TopK):
    __doc__ = _doc(
        """Area under the ROC curve of each query's ranked documents, aggregated (torchmetrics' class of the same
    name): exact, tied scores forming one step of the curve; over the ``top_k`` best-scored documents with
    ``top_k``; 0 for a query whose counted documents lack a relevant or a non-relevant one. torchmetrics passes
    scores outside ``[0, 1]`` through a sigmoid first: that changes nothing but where float rounding makes two
    scores equal.""",
        _TOP_K_ARG
        + """
        max_fpr: a float in ``(0, 1]``: the standardized partial AUC up to that false-positive rate (McClish's
            correction: 0.5 for a random ranking, 1 for a perfect one), or ``None`` (default): the whole area.""",
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalAUROC
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalAUROC()
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        tensor(0.7500)
    """,
    )

    def __init__(
        self,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        top_k: int | None = None,
        max_fpr: float | None = None,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, top_k, aggregation, **kwargs)
        self.max_fpr = F.check_max_fpr(max_fpr)

    def _values(self, q: F.Queries) -> Tensor:
        return F.auroc(q, self.top_k, self.max_fpr)


class RetrievalPrecisionRecallCurve(_QueryRetrieval):
    __doc__ = _doc(
        """Precision@k and recall@k of ranked documents for ``k = 1 .. max_k``, each aggregated over the queries
    position by position (torchmetrics' class of the same name). ``compute`` returns ``(precision, recall, top_k)``,
    three tensors of length ``max_k`` (``top_k`` is ``1 .. max_k``); precision@k divides by ``k`` (by the query's
    number of documents where ``k`` exceeds it, with ``adaptive_k``). An empty query contributes zeros
    (``"neg"``) or ones (``"pos"``) at every ``k``.""",
        """
        max_k: the largest ``k`` (a positive int), or ``None`` (default): the largest number of documents of a
            query in the global batch.
        adaptive_k: divide precision@k by the query's number of documents where ``k`` exceeds it. Default
            ``False``.""",
        """        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalPrecisionRecallCurve
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalPrecisionRecallCurve(max_k=3)
        >>> metric.update(preds, target, indexes)
        >>> precision, recall, top_k = metric.compute()
        >>> precision, recall, top_k
        (tensor([0.5000, 0.5000, 0.5000]), tensor([0.5000, 0.7500, 1.0000]), tensor([1, 2, 3]))
    """,
    )

    plot_lower_bound = None
    plot_upper_bound = None

    def __init__(
        self,
        max_k: int | None = None,
        adaptive_k: bool = False,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        aggregation: Any = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(empty_target_action, ignore_index, aggregation, **kwargs)
        self.max_k = F.check_optional_positive_int("max_k", max_k)
        self.adaptive_k = F.check_bool("adaptive_k", adaptive_k)

    def _curve(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(precision, recall, top_k)`` over every rank's rows, each of length ``max_k``."""
        q = self._queries()
        max_k = self.max_k
        if max_k is None:
            max_k = 0 if q is None else int(q.counts.max())
        top_k = torch.arange(1, max_k + 1, device=self.device)
        zeros = torch.zeros(max_k, dtype=self.dtype, device=self.device)
        if q is None:
            return zeros, zeros.clone(), top_k
        prec, rec = F.precision_recall_curve(q, max_k, self.adaptive_k)
        prec, rec = self._settle_empty(q, prec), self._settle_empty(q, rec)
        if not prec.shape[0]:
            return zeros, zeros.clone(), top_k
        return F.aggregate(prec, self.aggregation, dim=0), F.aggregate(rec, self.aggregation, dim=0), top_k

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        """``(precision, recall, top_k)`` over every rank's rows, each of length ``max_k`` (0-d tensors when
        ``max_k`` is 1, as torchmetrics returns them)."""
        return _value_outside_graph(self)

    def _value(self) -> Any:
        curve = self._curve()
        return tuple(x.squeeze(0) for x in curve) if curve[0].numel() == 1 else curve


class RetrievalRecallAtFixedPrecision(RetrievalPrecisionRecallCurve):
    """The best recall@k among the ``k <= max_k`` whose precision@k is at least ``min_precision``, and that ``k``
    (torchmetrics' class of the same name), from :class:`RetrievalPrecisionRecallCurve`'s aggregated curve.
    ``compute`` returns ``(recall, k)``: the largest such ``k`` on a tie of recalls, and ``(0, max_k)`` when no
    ``k`` qualifies or the best recall is 0.

    Args:
        min_precision: the least precision, a float in ``[0, 1]``. Default ``0.0``.
        max_k: the largest ``k`` (a positive int), or ``None`` (default): the largest number of documents of a
            query in the global batch.
        adaptive_k: divide precision@k by the query's number of documents where ``k`` exceeds it. Default
            ``False``.
        empty_target_action: what a query without a relevant document contributes to the curve: ``"neg"``
            zeros, ``"pos"`` ones, ``"skip"`` nothing, ``"error"`` a ``ValueError`` at ``compute``. Default
            ``"neg"``.
        ignore_index: rows whose ``target`` equals it are dropped at ``update``. Default ``None``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments, ``aggregation`` and ``nan_strategy``
            (as :class:`RetrievalPrecisionRecallCurve`'s; defaults ``"mean"`` and ``"error"``).

    Raises:
        ValueError: a bad argument (naming it), or a bad batch as for :class:`RetrievalPrecisionRecallCurve`.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import RetrievalRecallAtFixedPrecision
        >>> indexes = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        >>> preds = torch.tensor([0.2, 0.3, 0.5, 0.1, 0.3, 0.5, 0.2])
        >>> target = torch.tensor([False, False, True, False, True, False, True])
        >>> metric = RetrievalRecallAtFixedPrecision(min_precision=0.5, max_k=3)
        >>> metric.update(preds, target, indexes)
        >>> metric.compute()
        (tensor(1.), tensor(3))
    """

    def __init__(
        self,
        min_precision: float = 0.0,
        max_k: int | None = None,
        adaptive_k: bool = False,
        empty_target_action: str = "neg",
        ignore_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_k, adaptive_k, empty_target_action, ignore_index, **kwargs)
        self.min_precision = F.check_min_precision(min_precision)

    def compute(self) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        """``(recall, k)`` over every rank's rows."""
        return _value_outside_graph(self)

    def _value(self) -> Any:
        prec, rec, top_k = self._curve()
        return F.recall_at_fixed_precision(prec, rec, top_k, self.min_precision)
