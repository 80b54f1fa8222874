"""Accuracy, precision, recall, F1, specificity, the stat scores and the confusion matrix, from integer states.

Every state is an ``int64`` count (``tp``, ``fp``, ``tn``, ``fn`` per class or label, or the confusion
matrix), reduced with ``sum``: a :class:`~torchmetrics_diff.MetricCollection` of these metrics packs all of
them into one buffer and syncs in one collective (:ref:`architecture-sync-engine`). They are not differentiable
(thresholds and argmax), so ``dist_sync_on_step`` gives the global-batch value without a graph. With
``multidim_average="samplewise"`` the counts are per sample, so they are ``int64`` ``cat`` states (one row per
sample), gathered in the same collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from torchmetrics_diff.functional._classification import StatScores as Counts
from torchmetrics_diff.functional._classification import check_multidim_args, check_task_args, stat_scores
from torchmetrics_diff.functional._classification_scores import (
    check_zero_division,
    reduce_stat_scores,
    stack_stat_scores,
)
from torchmetrics_diff.functional._confusion_matrix import confusion_counts, normalize_confusion
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.metric import Metric, dim_zero_cat

_TASK_ARGS = """
    Inputs of ``update`` and ``forward`` (as in :func:`~torchmetrics_diff.functional.stat_scores`): ``preds``
    ``(N, ...)`` probabilities, logits or labels for binary, ``(N, C, ...)`` scores or ``(N, ...)`` labels for
    multiclass, ``(N, L, ...)`` for multilabel; ``target`` integer labels of the matching shape. The value is a
    floating tensor in the default dtype: 0-d, or ``(C,)``/``(L,)`` with ``average="none"``.

    Args:
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        threshold: a probability above it is a positive prediction (binary, multilabel); logits (any value
            outside ``[0, 1]``) go through a sigmoid first. Default 0.5.
        num_classes: number of classes ``C``, required for multiclass. Default ``None``.
        num_labels: number of labels ``L``, required for multilabel. Default ``None``.
        average: ``"micro"`` (default: pool the counts of every class), ``"macro"`` (mean of per-class scores;
            for multiclass, classes absent from both targets and predictions are left out, as in torchmetrics),
            ``"weighted"`` (per-class scores weighted by support), ``"none"``/``None`` (one score per class).
            Ignored for ``binary``.
        multidim_average: ``"global"`` (the default: extra dimensions are folded into the batch) or
            ``"samplewise"`` (one value per sample, over its extra dimensions: inputs ``(N, X, ...)``; the counts
            are then ``cat`` states, one row per sample).
        top_k: multiclass scores only: a sample is right when its target is among its ``top_k`` highest scores
            (torchmetrics' top-k). Default 1.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range (one pass over the batch); ``False`` skips it.
            Default ``True``."""

_ZERO_DIVISION = """
        zero_division: ``0`` or ``1``, the score where its denominator is zero. Default 0, as torchmetrics."""

_KWARGS = """
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.
"""


#: the ``Args``, ``Returns`` and ``Raises`` of the ``plot`` of the classification metrics named as torchmetrics'
#: class of their task (these and AUROC and average precision)
PLOT_SECTIONS = """Args:
    val: a value or a sequence of values, as :meth:`Metric.plot <torchmetrics_diff.Metric.plot>` takes it;
        ``None`` plots :meth:`compute`.
    ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

Returns:
    ``(figure, axes)``.

Raises:
    ModuleNotFoundError: matplotlib is not installed."""


def _doc(summary: str, example: str, zero_division: bool = True) -> str:
    """A stat-score metric's docstring: its summary, the shared arguments, its example."""
    return summary + _TASK_ARGS + (_ZERO_DIVISION if zero_division else "") + _KWARGS + example


class _TaskCounts(Metric):
    """The task arguments of the classification count metrics (validated once), and a batch's counts from a
    functional counter that takes them in one order."""

    is_differentiable = False
    full_state_update = False

    def __init__(
        self,
        task: str,
        threshold: float,
        num_classes: int | None,
        num_labels: int | None,
        average: str | None,
        ignore_index: int | None,
        validate_args: bool,
        /,
        **kwargs: Any,  # positional-only above: a keyword of the same name stays a Metric keyword (and fails there)
    ) -> None:
        super().__init__(**kwargs)
        self._size = check_task_args(task, threshold, num_classes, num_labels, average, ignore_index)
        self.task, self.threshold = task, threshold
        self.num_classes, self.num_labels, self.ignore_index = num_classes, num_labels, ignore_index
        self.validate_args = validate_args

    def _count(self, counter: Callable[..., Any], preds: torch.Tensor, target: torch.Tensor) -> Any:
        """``counter`` (:func:`stat_scores` or :func:`confusion_counts`) of a batch, with this metric's task."""
        task_args = (self.task, self.threshold, self.num_classes, self.num_labels, self.ignore_index)
        return counter(preds, target, *task_args, self.validate_args)


class _StatScoresMetric(_TaskCounts):
    """``tp``/``fp``/``tn``/``fn`` count states (per class or label) reduced to the score named by ``_score``."""

    higher_is_better: ClassVar[bool | None] = True
    plot_lower_bound: ClassVar[float | None] = 0.0
    plot_upper_bound: ClassVar[float | None] = 1.0
    zero_division = 0.0  # the score of a zero denominator: torchmetrics' 0 (Accuracy), an argument of the others
    _score: str  # a key of functional ``SCORES``
    tp: Any  # an int64 tensor, or (samplewise) a list of them
    fp: Any
    tn: Any
    fn: Any

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
        super().__init__(task, threshold, num_classes, num_labels, average, ignore_index, validate_args, **kwargs)
        check_multidim_args(task, top_k, multidim_average, num_classes)
        if not isinstance(validate_args, bool):
            raise ValueError(f"`validate_args` must be a bool; got {validate_args!r}")
        self.average, self.top_k, self.multidim_average = average, top_k, multidim_average
        self._shape = () if task == "binary" else (self._size,)
        for name in Counts._fields:
            if multidim_average == "samplewise":
                self.add_state(name, [], dist_reduce_fx="cat")
            else:
                self.add_state(name, torch.zeros(self._shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's counts (append each sample's, with ``multidim_average="samplewise"``).

        Args:
            preds: predictions, see the class docstring (shapes per task).
            target: integer labels of the matching shape.

        Raises:
            ValueError: inputs that do not fit the task (shapes, dtypes, labels out of range).
        """
        task_args = (self.task, self.threshold, self.num_classes, self.num_labels, self.ignore_index)
        s = stat_scores(preds, target, *task_args, self.validate_args, self.top_k, self.multidim_average)
        for name, value in zip(Counts._fields, s):
            if self.multidim_average == "samplewise":  # appended even when empty: the rank stays on one path
                getattr(self, name).append(value.to(self.device))
            else:
                setattr(self, name, getattr(self, name) + value.to(self.device))

    def _counts(self) -> Counts:
        """The counts of every batch seen: summed, or (samplewise) one row per sample."""
        if self.multidim_average != "samplewise":
            return Counts(self.tp, self.fp, self.tn, self.fn)

        def rows(state: Any) -> torch.Tensor:
            if isinstance(state, list) and not state:
                return torch.zeros((0, *self._shape), dtype=torch.int64, device=self.device)
            return dim_zero_cat(state)

        return Counts(*(rows(getattr(self, name)) for name in Counts._fields))

    def compute(self) -> torch.Tensor:
        """The score (see the class) of every batch seen; one per sample with ``multidim_average="samplewise"``."""
        return reduce_stat_scores(self._counts(), self._score, self.task, self.average, self.zero_division, self.top_k)

    @shared_docs(sections=PLOT_SECTIONS)
    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """:meth:`Metric.plot <torchmetrics_diff.Metric.plot>`, named as torchmetrics' class of the task.

        The y axis reads ``BinaryAccuracy`` for ``Accuracy(task="binary")``; a score per class (per label) is
        drawn as "Class i" ("Label i"), as torchmetrics draws it.

        {sections}
        """
        from torchmetrics_diff._plot import plot_metric

        return plot_metric(self, val, ax, task=self.task, per_class=self._score != "stat_scores")


class Accuracy(_StatScoresMetric):
    __doc__ = _doc(
        """Accuracy: ``(tp + tn) / all`` for binary and for multilabel labels, ``tp / (tp + fn)`` per class for
    multiclass (micro: correct predictions over all predictions).
""",
        """
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
    """,
        zero_division=False,
    )
    _score = "accuracy"


class _ZeroDivision(_StatScoresMetric):
    def __init__(self, task: str, *args: Any, zero_division: float = 0, **kwargs: Any) -> None:
        super().__init__(task, *args, **kwargs)
        self.zero_division = check_zero_division(zero_division)


class Precision(_ZeroDivision):
    __doc__ = _doc(
        """Precision ``tp / (tp + fp)``.
""",
        """
    Example:
        >>> import torch
        >>> from torchmetrics_diff import Precision
        >>> metric = Precision(task="multiclass", num_classes=3, average="macro")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.8333)
    """,
    )
    _score = "precision"


class Recall(_ZeroDivision):
    __doc__ = _doc(
        """Recall ``tp / (tp + fn)``.
""",
        """
    Example:
        >>> import torch
        >>> from torchmetrics_diff import Recall
        >>> metric = Recall(task="multiclass", num_classes=3, average="macro")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.8333)
    """,
    )
    _score = "recall"


class F1Score(_ZeroDivision):
    __doc__ = _doc(
        """F1 score ``2 tp / (2 tp + fp + fn)``, the harmonic mean of precision and recall.
""",
        """
    Example:
        >>> import torch
        >>> from torchmetrics_diff import F1Score
        >>> metric = F1Score(task="multilabel", num_labels=2, average="macro")
        >>> metric.update(torch.tensor([[0.8, 0.1], [0.3, 0.9]]), torch.tensor([[1, 0], [1, 1]]))
        >>> metric.compute()
        tensor(0.8333)
    """,
    )
    _score = "f1"


class Specificity(_StatScoresMetric):
    __doc__ = _doc(
        """Specificity ``tn / (tn + fp)``, the recall of the negatives (0 where ``tn + fp`` is 0, as torchmetrics).
""",
        """
    Example:
        >>> import torch
        >>> from torchmetrics_diff import Specificity
        >>> metric = Specificity(task="multiclass", num_classes=3, average="macro")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor(0.8889)
    """,
        zero_division=False,
    )
    _score = "specificity"


class StatScores(_StatScoresMetric):
    __doc__ = _doc(
        """The stat scores themselves, as torchmetrics' ``StatScores``: ``[tp, fp, tn, fn, support]`` (support
    ``tp + fn``) along the last dimension, ``int64``: summed over classes with ``"micro"``, one row per class
    with ``"none"``, and floating means over classes with ``"macro"`` and ``"weighted"`` (weights: the support).
""",
        """
    Example:
        >>> import torch
        >>> from torchmetrics_diff import StatScores
        >>> metric = StatScores(task="multiclass", num_classes=3, average="none")
        >>> metric.update(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]))
        >>> metric.compute()
        tensor([[1, 0, 3, 0, 1],
                [1, 0, 2, 1, 2],
                [1, 1, 2, 0, 1]])
    """,
        zero_division=False,
    )
    higher_is_better = None
    plot_lower_bound = None
    plot_upper_bound = None
    _score = "stat_scores"

    def compute(self) -> torch.Tensor:
        """``[tp, fp, tn, fn, support]`` of every batch seen, reduced over classes by ``average``.

        Returns:
            Shape ``(5,)``, ``(C, 5)``/``(L, 5)`` with ``average="none"``, a leading ``(N,)`` when samplewise:
            ``int64``, or floating (the default dtype) for ``"macro"`` and ``"weighted"``.
        """
        return stack_stat_scores(self._counts(), self.task, self.average)


class ConfusionMatrix(_TaskCounts):
    """Confusion matrix, rows the targets and columns the predictions: ``(2, 2)`` binary, ``(C, C)`` multiclass,
    ``(L, 2, 2)`` multilabel (each ``[[tn, fp], [fn, tp]]``). One ``int64`` ``sum`` state.

    Args:
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        num_classes: number of classes ``C``, required for multiclass. Default ``None``.
        num_labels: number of labels ``L``, required for multilabel. Default ``None``.
        threshold: as for :class:`~torchmetrics_diff.Accuracy`. Default 0.5.
        normalize: ``None``/``"none"`` (default: counts), ``"true"`` (rows sum to 1), ``"pred"`` (columns) or
            ``"all"``; an all-zero row or column stays zero.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
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

    higher_is_better = None
    confmat: torch.Tensor

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
        super().__init__(task, threshold, num_classes, num_labels, "micro", ignore_index, validate_args, **kwargs)
        normalize_confusion(torch.zeros(2, 2, dtype=torch.int64), normalize)  # validates `normalize`
        self.normalize = normalize
        size = self._size
        shape = {"binary": (2, 2), "multiclass": (size, size), "multilabel": (size, 2, 2)}[task]
        self.add_state("confmat", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's counts.

        Args:
            preds: predictions, as for :func:`~torchmetrics_diff.functional.confusion_matrix`.
            target: integer labels of the matching shape.

        Raises:
            ValueError: inputs that do not fit the task (shapes, dtypes, labels out of range).
        """
        self.confmat = self.confmat + self._count(confusion_counts, preds, target).to(self.device)

    def compute(self) -> torch.Tensor:
        """The (normalized) confusion matrix of every batch seen.

        Returns:
            ``(2, 2)`` binary, ``(C, C)`` multiclass, ``(L, 2, 2)`` multilabel; ``int64`` counts, or floating
            (the default dtype) when normalized.
        """
        return normalize_confusion(self.confmat, self.normalize)

    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """Draw the matrix as an image, its x axis labelled "predicted" and its y axis "target".

        Args:
            val: a ``(C, C)`` or ``(2, 2)`` matrix as :meth:`compute` returns it; ``None`` plots :meth:`compute`.
                A multilabel ``(L, 2, 2)`` value is drawn one label at a time: ``plot(val[i])``.
            ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

        Returns:
            ``(figure, axes)``.

        Raises:
            ModuleNotFoundError: matplotlib is not installed.
            ValueError: ``val`` is not a single 2-D matrix or a value :meth:`Metric.plot` draws otherwise.
        """
        from torchmetrics_diff._plot import plot_values

        return plot_values(
            self.compute() if val is None else val,
            ax=ax,
            name=type(self).__name__,
            higher_is_better=self.higher_is_better,
            lower_bound=self.plot_lower_bound,
            upper_bound=self.plot_upper_bound,
            matrix_labels=("predicted", "target"),
        )
