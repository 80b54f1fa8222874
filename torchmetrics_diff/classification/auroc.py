"""Exact AUROC and average precision from ``cat`` states: every rank's scores and targets, gathered in one
collective, ranked once in ``compute`` (binary, multiclass one class against the rest, multilabel one label at a
time). NaN scores follow ``nan_strategy``, applied in ``compute`` to every rank's rows (the same outcome on every
rank)."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff._batch_step import QuietBatchValue
from torchmetrics_diff.classification.stat_scores import PLOT_SECTIONS
from torchmetrics_diff.functional._curves import CurveArgs, curve_inputs, curve_score
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.functional._nan_scores import check_nan_strategy
from torchmetrics_diff.metric import Metric, dim_zero_cat


class _CurveMetric(QuietBatchValue, Metric):
    """Scores and targets as ``cat`` list states, scored by :func:`curve_score` (the class's ``_curve``)."""

    is_differentiable = False
    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    full_state_update = False
    _curve: str  # "auroc" or "average_precision"
    preds: list[torch.Tensor]
    target: list[torch.Tensor]

    def _setup(self, args: CurveArgs) -> None:
        self._size = args.check()
        self.task, self.num_classes, self.num_labels, self.average = args[:4]
        self.thresholds, self.ignore_index, self.validate_args, self.max_fpr = args[4:8]
        self.nan_strategy = check_nan_strategy(args.nan_strategy)
        self.add_state("preds", [], dist_reduce_fx="cat")
        self.add_state("target", [], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Append a batch's scores and targets.

        Args:
            preds: floating scores: ``(N, ...)`` binary, ``(N, C, ...)`` multiclass, ``(N, L, ...)`` multilabel;
                probabilities, or logits (a sigmoid, or for multiclass a softmax over dim 1, when some value of
                the batch lies outside ``[0, 1]``).
            target: integer labels: ``(N, ...)`` in ``{0, 1}`` or ``[0, C)``, or ``(N, L, ...)`` in ``{0, 1}``.

        Raises:
            ValueError: shapes that do not fit the task, integer ``preds``, or (``validate_args``) targets out of
                range.
        """
        p, t = curve_inputs(preds, target, self.task, self._size, self.ignore_index, self.validate_args)
        # appended even when empty: a rank whose list states hold (empty) tensors agrees with the others on their
        # dtype and shape, so its syncs stay on the engine's one-collective path
        self.preds.append(p.to(self.dtype))
        self.target.append(t)

    def compute(self) -> torch.Tensor:
        """The value over every row seen (every rank's, once synced).

        Returns:
            A tensor in the default dtype: 0-d, or one value per class or label with ``average="none"``.

        Raises:
            ValueError: ``nan_strategy="error"`` and a NaN score among the rows.
        """
        if not self.preds:
            columns = () if self.task == "binary" else (self._size,)
            scores = torch.zeros((0, *columns), device=self.device)
            target_shape = (0, *columns) if self.task == "multilabel" else (0,)
            labels = torch.zeros(target_shape, dtype=torch.int64, device=self.device)
        else:
            scores, labels = dim_zero_cat(self.preds), dim_zero_cat(self.target)
        strategy = self.nan_strategy
        if strategy == "warn" and self.__dict__.get("_in_batch_value"):
            strategy = "ignore"  # forward's value of one batch: compute() reports the NaNs of every batch
        args = (self.task, self._size, self.average, self._curve, strategy, type(self).__name__)
        return curve_score(scores, labels, *args)

    @shared_docs(sections=PLOT_SECTIONS)
    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """:meth:`Metric.plot <torchmetrics_diff.Metric.plot>`, named as torchmetrics' class of the task.

        The y axis reads ``BinaryAUROC`` for ``AUROC(task="binary")``; a value per class (per label) is drawn as
        "Class i" ("Label i"), as torchmetrics draws it.

        {sections}
        """
        from torchmetrics_diff._plot import plot_metric

        return plot_metric(self, val, ax, task=self.task, per_class=True)


class AUROC(_CurveMetric):
    """Area under the ROC curve, exact (no thresholds binning) over every rank's rows: binary, multiclass (each
    class against the rest) or multilabel (each label).

    The scores and targets are ``cat`` list states; ``compute`` ranks the gathered scores once per class (ties
    share their mean rank, which equals the trapezoidal area of the exact ROC curve, as torchmetrics computes it
    without ``thresholds``). Logits (any score outside ``[0, 1]`` in a batch) go through a sigmoid, or for
    multiclass a softmax, as in torchmetrics. A class without a positive or without a negative target scores 0,
    with a warning (torchmetrics' result).

    Args:
        task: ``"binary"`` (default), ``"multiclass"`` or ``"multilabel"``.
        ignore_index: target value whose entries are left out (a row for multiclass, one entry for multilabel).
            Default ``None``.
        validate_args: check that targets lie in their range. Default ``True``.
        num_classes: ``C``, required for multiclass. Default ``None``.
        num_labels: ``L``, required for multilabel. Default ``None``.
        average: ``"macro"`` (default), ``"weighted"`` (by the number of positives), ``"none"``/``None``, and for
            multilabel ``"micro"`` (every entry one binary task). Ignored for binary.
        thresholds: only ``None`` (exact). Default ``None``.
        max_fpr: only ``None`` (no partial AUROC). Default ``None``.
        nan_strategy: what a NaN score in ``preds`` does, checked in ``compute`` on every rank's rows: ``"error"``
            (default) raises a ``ValueError`` with the count; ``"warn"`` drops what holds it (a sample; for
            multiclass a sample with any NaN class score; for multilabel the one ``(sample, label)`` entry) with
            a warning from ``compute`` giving the count; ``"ignore"`` drops it silently; ``"disable"`` skips the
            check (torchmetrics' behaviour: the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad argument (named); in ``update``, inputs of the wrong shape, integer scores or bad
            targets; in ``compute``, a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import AUROC
        >>> metric = AUROC(task="binary")
        >>> metric.update(torch.tensor([0.1, 0.4]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([0.35, 0.8]), torch.tensor([1, 1]))
        >>> metric.compute()
        tensor(0.7500)
        >>> metric = AUROC(task="multiclass", num_classes=3)
        >>> metric.update(torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([[0.1, 0.3, 0.6], [0.3, 0.3, 0.4]]), torch.tensor([2, 1]))
        >>> metric.compute()
        tensor(0.9583)

        A NaN score raises by default; ``nan_strategy="ignore"`` drops its sample:

        >>> metric = AUROC(task="binary", nan_strategy="ignore")
        >>> metric.update(torch.tensor([0.1, 0.4, float("nan")]), torch.tensor([0, 0, 1]))
        >>> metric.update(torch.tensor([0.35, 0.8]), torch.tensor([1, 1]))
        >>> metric.compute()
        tensor(0.7500)
    """

    _curve = "auroc"

    def __init__(
        self,
        task: str = "binary",
        ignore_index: int | None = None,
        validate_args: bool = True,
        num_classes: int | None = None,
        num_labels: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        max_fpr: Any = None,
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        args = (thresholds, ignore_index, validate_args, max_fpr, nan_strategy)
        self._setup(CurveArgs(task, num_classes, num_labels, average, *args))


class AveragePrecision(_CurveMetric):
    """Average precision, exact over every rank's rows: binary, multiclass (each class against the rest) or
    multilabel (each label).

    ``sum_k (R_k - R_{k-1}) P_k`` over every distinct score taken as a threshold, as torchmetrics computes it
    without ``thresholds``. The scores and targets are ``cat`` list states, ranked once in ``compute``. Without a
    positive target the value is 0 (binary, and a multilabel label) or NaN (a multiclass class, left out of the
    ``macro`` and ``weighted`` means), with a warning, as torchmetrics.

    Args:
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        thresholds: only ``None`` (exact). Default ``None``.
        num_classes: ``C``, required for multiclass. Default ``None``.
        num_labels: ``L``, required for multilabel. Default ``None``.
        average: ``"macro"`` (default), ``"weighted"`` (by the number of positives), ``"none"``/``None``, and for
            multilabel ``"micro"``. Ignored for binary.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that targets lie in their range. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does, checked in ``compute`` on every rank's rows: ``"error"``
            (default) raises a ``ValueError`` with the count; ``"warn"`` drops what holds it (a sample; for
            multiclass a sample with any NaN class score; for multilabel the one ``(sample, label)`` entry) with
            a warning from ``compute`` giving the count; ``"ignore"`` drops it silently; ``"disable"`` skips the
            check (torchmetrics' behaviour: the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad argument (named); in ``update``, inputs of the wrong shape, integer scores or bad
            targets; in ``compute``, a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import AveragePrecision
        >>> metric = AveragePrecision(task="binary")
        >>> metric.update(torch.tensor([0.1, 0.4]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([0.35, 0.8]), torch.tensor([1, 1]))
        >>> metric.compute()
        tensor(0.8333)
    """

    _curve = "average_precision"

    def __init__(
        self,
        task: str,
        thresholds: Any = None,
        num_classes: int | None = None,
        num_labels: int | None = None,
        average: str | None = "macro",
        ignore_index: int | None = None,
        validate_args: bool = True,
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        args = (thresholds, ignore_index, validate_args, None, nan_strategy)
        self._setup(CurveArgs(task, num_classes, num_labels, average, *args))
