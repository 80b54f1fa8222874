"""The task classes torchmetrics users import (``BinaryAccuracy``, ``MulticlassF1Score``, ...): each is the
generic class (:class:`~torchmetrics_diff.Accuracy`, ...) with its task fixed and torchmetrics' signature and
defaults (``average="macro"`` for the multiclass and multilabel classes, as torchmetrics' task classes), so that
an ``isinstance`` check against the generic class holds and the states, syncs and values are the generic ones.
Here the stat-score and confusion-matrix classes; the AUROC and average-precision ones are in ``auroc_tasks``.

A task form's signature is written once, in a private base (``_BinaryStatScores``, ``_MulticlassZeroDivision``, ...)
that the task classes of that form share, and each class's docstring is built by :func:`_task_doc` from its
signature and the shared argument descriptions; a class itself holds its example."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from torchmetrics_diff.classification.auroc import _CurveMetric
from torchmetrics_diff.classification.stat_scores import (
    Accuracy,
    ConfusionMatrix,
    F1Score,
    Precision,
    Recall,
    Specificity,
    StatScores,
    _StatScoresMetric,
)
from torchmetrics_diff.functional._classification_docs import (
    ARGS,
    CURVE_AVERAGE,
    WHAT,
    args_section,
    compose,
    section,
    task_of,
)

_T = TypeVar("_T", bound=type)

_RAISES = "ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task."


def _task_doc(cls: _T) -> _T:
    """Give a task class its docstring: the summary (its generic class and task), its arguments (from its
    signature), what it raises, then its own docstring (the example)."""
    generic = cls.__bases__[-1]  # last: ``class BinaryAccuracy(_BinaryStatScores, Accuracy)``
    task = task_of(cls.__name__)
    what = WHAT[re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", generic.__name__).lower()]  # F1Score: f1_score
    summary = (
        f"The {what} of a {task} task: :class:`~torchmetrics_diff.{generic.__name__}` with\n"
        f'    ``task="{task}"`` and torchmetrics\' signature.'
    )
    docs = {**ARGS, "average": CURVE_AVERAGE[task]} if issubclass(cls, _CurveMetric) and task != "binary" else ARGS
    cls.__doc__ = compose(summary, args_section(cls, docs), section("Raises", _RAISES), tail=cls.__doc__)
    return cls


# ---------------------------------------------------------------------------------------- the task forms
class _BinaryStatScores(_StatScoresMetric):
    """The binary signature of the stat-score classes."""

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        args = (threshold, None, None, "micro", multidim_average, 1, ignore_index, validate_args)
        super().__init__("binary", *args, **kwargs)


class _MulticlassStatScores(_StatScoresMetric):
    """The multiclass signature of the stat-score classes."""

    def __init__(
        self,
        num_classes: int | None = None,
        top_k: int = 1,
        average: str | None = "macro",
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        args = (0.5, num_classes, None, average, multidim_average, top_k, ignore_index, validate_args)
        super().__init__("multiclass", *args, **kwargs)


class _MultilabelStatScores(_StatScoresMetric):
    """The multilabel signature of the stat-score classes."""

    def __init__(
        self,
        num_labels: int | None = None,
        threshold: float = 0.5,
        average: str | None = "macro",
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        args = (threshold, None, num_labels, average, multidim_average, 1, ignore_index, validate_args)
        super().__init__("multilabel", *args, **kwargs)


class _BinaryZeroDivision(_BinaryStatScores):
    """The binary signature of the scores with a ``zero_division`` (precision, recall, F1)."""

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        args = (threshold, multidim_average, ignore_index, validate_args)
        super().__init__(*args, zero_division=zero_division, **kwargs)


class _MulticlassZeroDivision(_MulticlassStatScores):
    """The multiclass signature of the scores with a ``zero_division``."""

    def __init__(
        self,
        num_classes: int | None = None,
        top_k: int = 1,
        average: str | None = "macro",
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        args = (num_classes, top_k, average, multidim_average, ignore_index, validate_args)
        super().__init__(*args, zero_division=zero_division, **kwargs)


class _MultilabelZeroDivision(_MultilabelStatScores):
    """The multilabel signature of the scores with a ``zero_division``."""

    def __init__(
        self,
        num_labels: int | None = None,
        threshold: float = 0.5,
        average: str | None = "macro",
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        args = (num_labels, threshold, average, multidim_average, ignore_index, validate_args)
        super().__init__(*args, zero_division=zero_division, **kwargs)


# -------------------------------------------------------------------------------------- the task classes


@_task_doc
class BinaryAccuracy(_BinaryStatScores, Accuracy):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryAccuracy
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryAccuracy()
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class MulticlassAccuracy(_MulticlassStatScores, Accuracy):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassAccuracy
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassAccuracy(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """


@_task_doc
class MultilabelAccuracy(_MultilabelStatScores, Accuracy):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelAccuracy
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelAccuracy(num_labels=2)
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class BinaryPrecision(_BinaryZeroDivision, Precision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryPrecision
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryPrecision()
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class MulticlassPrecision(_MulticlassZeroDivision, Precision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassPrecision
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassPrecision(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """


@_task_doc
class MultilabelPrecision(_MultilabelZeroDivision, Precision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelPrecision
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelPrecision(num_labels=2)
        >>> metric(preds, target)
        tensor(0.7500)
    """


@_task_doc
class BinaryRecall(_BinaryZeroDivision, Recall):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryRecall
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryRecall()
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class MulticlassRecall(_MulticlassZeroDivision, Recall):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassRecall
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassRecall(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """


@_task_doc
class MultilabelRecall(_MultilabelZeroDivision, Recall):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelRecall
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelRecall(num_labels=2)
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class BinaryF1Score(_BinaryZeroDivision, F1Score):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryF1Score
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryF1Score()
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class MulticlassF1Score(_MulticlassZeroDivision, F1Score):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassF1Score
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassF1Score(num_classes=3)
        >>> metric(preds, target)
        tensor(0.7778)
    """


@_task_doc
class MultilabelF1Score(_MultilabelZeroDivision, F1Score):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelF1Score
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelF1Score(num_labels=2)
        >>> metric(preds, target)
        tensor(0.5833)
    """


@_task_doc
class BinarySpecificity(_BinaryStatScores, Specificity):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinarySpecificity
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinarySpecificity()
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class MulticlassSpecificity(_MulticlassStatScores, Specificity):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassSpecificity
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassSpecificity(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8889)
    """


@_task_doc
class MultilabelSpecificity(_MultilabelStatScores, Specificity):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelSpecificity
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelSpecificity(num_labels=2)
        >>> metric(preds, target)
        tensor(0.5000)
    """


@_task_doc
class BinaryStatScores(_BinaryStatScores, StatScores):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryStatScores
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryStatScores()
        >>> metric(preds, target)
        tensor([1, 1, 1, 1, 2])
    """


@_task_doc
class MulticlassStatScores(_MulticlassStatScores, StatScores):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassStatScores
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassStatScores(num_classes=3)
        >>> metric(preds, target)
        tensor([1.0000, 0.3333, 2.3333, 0.3333, 1.3333])
    """


@_task_doc
class MultilabelStatScores(_MultilabelStatScores, StatScores):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelStatScores
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelStatScores(num_labels=2)
        >>> metric(preds, target)
        tensor([1.0000, 0.5000, 0.5000, 1.0000, 2.0000])
    """


@_task_doc
class BinaryConfusionMatrix(ConfusionMatrix):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryConfusionMatrix
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryConfusionMatrix()
        >>> metric(preds, target)
        tensor([[1, 1],
                [1, 1]])
    """

    def __init__(
        self,
        threshold: float = 0.5,
        ignore_index: int | None = None,
        normalize: str | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__("binary", threshold, None, None, normalize, ignore_index, validate_args, **kwargs)


@_task_doc
class MulticlassConfusionMatrix(ConfusionMatrix):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassConfusionMatrix
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassConfusionMatrix(num_classes=3)
        >>> metric(preds, target)
        tensor([[1, 0, 0],
                [0, 1, 1],
                [0, 0, 1]])
    """

    def __init__(
        self,
        num_classes: int | None = None,
        ignore_index: int | None = None,
        normalize: str | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__("multiclass", 0.5, num_classes, None, normalize, ignore_index, validate_args, **kwargs)


@_task_doc
class MultilabelConfusionMatrix(ConfusionMatrix):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelConfusionMatrix
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelConfusionMatrix(num_labels=2)
        >>> metric(preds, target)
        tensor([[[0, 1],
                 [1, 1]],
        <BLANKLINE>
                [[1, 0],
                 [1, 1]]])
    """

    def __init__(
        self,
        num_labels: int | None = None,
        threshold: float = 0.5,
        ignore_index: int | None = None,
        normalize: str | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__("multilabel", threshold, None, num_labels, normalize, ignore_index, validate_args, **kwargs)


# the legend of a value per class or per label, as torchmetrics names it ("Class 0", "Label 0", ...)
_LEGENDS: dict[type, str] = {
    **dict.fromkeys(
        (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score, MulticlassSpecificity), "Class"
    ),
    **dict.fromkeys(
        (MultilabelAccuracy, MultilabelPrecision, MultilabelRecall, MultilabelF1Score, MultilabelSpecificity), "Label"
    ),
}
for _cls, _legend in _LEGENDS.items():
    _cls.plot_legend_name = _legend  # type: ignore[attr-defined]
del _cls, _legend
