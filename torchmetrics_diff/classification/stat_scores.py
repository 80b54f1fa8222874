"""Accuracy, precision, recall, F1 and the confusion matrix, from integer ``sum`` states.

Every state is an ``int64`` count (``tp``, ``fp``, ``tn``, ``fn`` per class or label, or the confusion
matrix), reduced with ``sum``: a :class:`~torchmetrics_diff.MetricCollection` of these metrics packs all of
them into one buffer and syncs in one collective (DESIGN §4). They are not differentiable (thresholds and
argmax), so ``dist_sync_on_step`` gives the global-batch value without a graph.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._classification import (
    StatScores,
    _check_zero_division,
    check_task_args,
    confusion_counts,
    normalize_confusion,
    reduce_accuracy,
    reduce_fbeta,
    reduce_precision_recall,
    stat_scores,
)
from torchmetrics_diff.metric import Metric

_TASK_ARGS = """
    Args:
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        threshold: a probability above it is a positive prediction (binary, multilabel); logits (any value
            outside ``[0, 1]``) go through a sigmoid first.
        num_classes: number of classes (multiclass).
        num_labels: number of labels (multilabel).
        average: ``"micro"`` (pool the counts of every class), ``"macro"`` (mean of per-class scores; for
            multiclass, classes absent from both targets and predictions are left out, as in torchmetrics),
            ``"weighted"`` (per-class scores weighted by support), ``"none"``/``None`` (one score per class).
            Ignored for ``binary``.
        multidim_average: only ``"global"`` (extra dimensions are folded into the batch) is implemented.
        top_k: only ``1`` is implemented.
        ignore_index: target value whose entries are left out.
        validate_args: check that labels lie in their range (one pass over the batch); ``False`` skips it."""


class _StatScoresMetric(Metric):
    """Shared ``tp``/``fp``/``tn``/``fn`` count states; subclasses reduce them."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        task: str,
        threshold: float = 0.5,
        num_classes: int | None = None,
        num_labels: int | None = None,
        average: str | None = "micro",
        multidim_average: str = "global",
        top_k: int = 1,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        size = check_task_args(task, threshold, num_classes, num_labels, average, ignore_index)
        if multidim_average != "global":
            raise ValueError(f"`multidim_average` must be 'global' (the only one built); got {multidim_average!r}")
        if top_k != 1:
            raise ValueError(f"`top_k` must be 1 (the only value implemented); got {top_k!r}")
        if not isinstance(validate_args, bool):
            raise ValueError(f"`validate_args` must be a bool; got {validate_args!r}")
        self.task, self.threshold, self.average = task, threshold, average
        self.num_classes, self.num_labels, self.ignore_index = num_classes, num_labels, ignore_index
        self.validate_args = validate_args
        shape = () if task == "binary" else (size,)
        for name in StatScores._fields:
            self.add_state(name, torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's counts."""
        s = stat_scores(
            preds,
            target,
            self.task,
            self.threshold,
            self.num_classes,
            self.num_labels,
            self.ignore_index,
            self.validate_args,
        )
        self.tp, self.fp, self.tn, self.fn = (
            getattr(self, name) + value.to(self.device) for name, value in zip(StatScores._fields, s)
        )

    def _scores(self) -> StatScores:
        return StatScores(self.tp, self.fp, self.tn, self.fn)


class Accuracy(_StatScoresMetric):
    __doc__ = (
        """Accuracy: ``(tp + tn) / all`` for binary and for multilabel labels, ``tp / (tp + fn)`` per class for
    multiclass (micro: correct predictions over all predictions).
"""
        + _TASK_ARGS
        + """
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad argument; in ``update``, inputs of the wrong shape, dtype or value range.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Accuracy
        >>> metric = Accuracy(task="multiclass", num_classes=3)
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.7500)
        >>> Accuracy(task="binary")(torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 1, 0]))
        tensor(0.3333)
    """
    )

    def compute(self) -> torch.Tensor:
        """Accuracy of every batch seen."""
        return reduce_accuracy(self._scores(), self.task, self.average)


class _ZeroDivision(_StatScoresMetric):
    def __init__(self, task: str, *args: Any, zero_division: float = 0, **kwargs: Any) -> None:
        super().__init__(task, *args, **kwargs)
        self.zero_division = _check_zero_division(zero_division)


_ZERO_DIVISION = """
        zero_division: ``0`` or ``1``, the score where its denominator is zero (torchmetrics' default 0)."""


class Precision(_ZeroDivision):
    __doc__ = (
        """Precision ``tp / (tp + fp)``.
"""
        + _TASK_ARGS
        + _ZERO_DIVISION
        + """
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Precision
        >>> metric = Precision(task="multiclass", num_classes=3, average="macro")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.8333)
    """
    )

    def compute(self) -> torch.Tensor:
        """Precision of every batch seen."""
        return reduce_precision_recall(self._scores(), "precision", self.task, self.average, self.zero_division)


class Recall(_ZeroDivision):
    __doc__ = (
        """Recall ``tp / (tp + fn)``.
"""
        + _TASK_ARGS
        + _ZERO_DIVISION
        + """
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Recall
        >>> metric = Recall(task="multiclass", num_classes=3, average="macro")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.8333)
    """
    )

    def compute(self) -> torch.Tensor:
        """Recall of every batch seen."""
        return reduce_precision_recall(self._scores(), "recall", self.task, self.average, self.zero_division)


class F1Score(_ZeroDivision):
    __doc__ = (
        """F1 score ``2 tp / (2 tp + fp + fn)``, the harmonic mean of precision and recall.
"""
        + _TASK_ARGS
        + _ZERO_DIVISION
        + """
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import F1Score
        >>> metric = F1Score(task="multilabel", num_labels=2, average="macro")
        >>> metric.update(torch.tensor([[0.8, 0.1], [0.3, 0.9]]), torch.tensor([[1, 0], [1, 1]]))
        >>> metric.compute()
        tensor(0.8333)
    """
    )

    def compute(self) -> torch.Tensor:
        """F1 of every batch seen."""
        return reduce_fbeta(self._scores(), self.task, self.average, 1.0, self.zero_division)


class ConfusionMatrix(Metric):
    """Confusion matrix, rows the targets and columns the predictions: ``(2, 2)`` binary, ``(C, C)`` multiclass,
    ``(L, 2, 2)`` multilabel (each ``[[tn, fp], [fn, tp]]``). One ``int64`` ``sum`` state.

    Args:
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        num_classes: number of classes (multiclass).
        num_labels: number of labels (multilabel).
        threshold: as for :class:`Accuracy`.
        normalize: ``None``/``"none"`` (counts), ``"true"`` (rows sum to 1), ``"pred"`` (columns) or ``"all"``;
            an all-zero row or column stays zero.
        ignore_index: target value whose entries are left out.
        validate_args: check that labels lie in their range.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import ConfusionMatrix
        >>> metric = ConfusionMatrix(task="multiclass", num_classes=3)
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor([[1, 0, 0],
                [0, 1, 1],
                [0, 0, 1]])
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(
        self,
        task: str,
        threshold: float = 0.5,
        num_classes: int | None = None,
        num_labels: int | None = None,
        normalize: str | None = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        size = check_task_args(task, threshold, num_classes, num_labels, "micro", ignore_index)
        normalize_confusion(torch.zeros(2, 2, dtype=torch.int64), normalize)  # validates `normalize`
        self.task, self.threshold, self.normalize = task, threshold, normalize
        self.num_classes, self.num_labels, self.ignore_index = num_classes, num_labels, ignore_index
        self.validate_args = validate_args
        shape = {"binary": (2, 2), "multiclass": (size, size), "multilabel": (size, 2, 2)}[task]
        self.add_state("confmat", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's counts."""
        counts = confusion_counts(
            preds,
            target,
            self.task,
            self.threshold,
            self.num_classes,
            self.num_labels,
            self.ignore_index,
            self.validate_args,
        )
        self.confmat = self.confmat + counts.to(self.device)

    def compute(self) -> torch.Tensor:
        """The (normalized) confusion matrix of every batch seen."""
        return normalize_confusion(self.confmat, self.normalize)
