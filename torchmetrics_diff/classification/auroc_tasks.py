"""The AUROC and average-precision task classes (``BinaryAUROC``, ``MulticlassAveragePrecision``, ...): the
generic :class:`~torchmetrics_diff.AUROC` and :class:`~torchmetrics_diff.AveragePrecision` with their task fixed
and torchmetrics' signature, their docstrings built as the other task classes' (``tasks``)."""

from __future__ import annotations

from typing import Any

from torchmetrics_diff.classification.auroc import AUROC, AveragePrecision, _CurveMetric
from torchmetrics_diff.classification.tasks import _task_doc


def _check_normalization(normalization: Any) -> None:
    if normalization != "sigmoid":
        raise ValueError(
            f"`normalization` must be 'sigmoid' (logits go through a sigmoid; no other is implemented); got "
            f"{normalization!r}"
        )


# ---------------------------------------------------------------------------------------- the task forms
class _MulticlassCurve(_CurveMetric):
    """The multiclass signature of :class:`AUROC` and :class:`AveragePrecision` (keywords: their positional
    orders differ)."""

    def __init__(
        self,
        num_classes: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            task="multiclass",
            num_classes=num_classes,
            average=average,
            thresholds=thresholds,
            ignore_index=ignore_index,
            validate_args=validate_args,
            nan_strategy=nan_strategy,
            **kwargs,
        )


class _MultilabelCurve(_CurveMetric):
    """The multilabel signature of :class:`AUROC` and :class:`AveragePrecision`."""

    def __init__(
        self,
        num_labels: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            task="multilabel",
            num_labels=num_labels,
            average=average,
            thresholds=thresholds,
            ignore_index=ignore_index,
            validate_args=validate_args,
            nan_strategy=nan_strategy,
            **kwargs,
        )


# -------------------------------------------------------------------------------------- the task classes
@_task_doc
class BinaryAUROC(AUROC):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryAUROC
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryAUROC()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        max_fpr: Any = None,
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary",
            ignore_index,
            validate_args,
            thresholds=thresholds,
            max_fpr=max_fpr,
            nan_strategy=nan_strategy,
            **kwargs,
        )


@_task_doc
class MulticlassAUROC(_MulticlassCurve, AUROC):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassAUROC
        >>> preds, target = (
        ...     torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]]),
        ...     torch.tensor([0, 1, 2, 1]),
        ... )
        >>> metric = MulticlassAUROC(num_classes=3)
        >>> metric(preds, target)
        tensor(0.9583)
    """


@_task_doc
class MultilabelAUROC(_MultilabelCurve, AUROC):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelAUROC
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelAUROC(num_labels=2)
        >>> metric(preds, target)
        tensor(0.7500)
    """


@_task_doc
class BinaryAveragePrecision(AveragePrecision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryAveragePrecision
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryAveragePrecision()
        >>> metric(preds, target)
        tensor(0.7500)
    """

    def __init__(
        self,
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        normalization: str | None = "sigmoid",
        *,
        nan_strategy: str = "error",
        **kwargs: Any,
    ) -> None:
        _check_normalization(normalization)
        super().__init__(
            "binary",
            thresholds,
            ignore_index=ignore_index,
            validate_args=validate_args,
            nan_strategy=nan_strategy,
            **kwargs,
        )


@_task_doc
class MulticlassAveragePrecision(_MulticlassCurve, AveragePrecision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassAveragePrecision
        >>> preds, target = (
        ...     torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]]),
        ...     torch.tensor([0, 1, 2, 1]),
        ... )
        >>> metric = MulticlassAveragePrecision(num_classes=3)
        >>> metric(preds, target)
        tensor(0.9444)
    """


@_task_doc
class MultilabelAveragePrecision(_MultilabelCurve, AveragePrecision):
    """
    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MultilabelAveragePrecision
        >>> preds, target = (
        ...     torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]),
        ...     torch.tensor([[1, 0], [1, 1], [0, 1]]),
        ... )
        >>> metric = MultilabelAveragePrecision(num_labels=2)
        >>> metric(preds, target)
        tensor(0.9167)
    """


# the legend of a value per class or per label, as torchmetrics names it ("Class 0", "Label 0", ...)
_LEGENDS: dict[type, str] = {
    **dict.fromkeys((MulticlassAUROC, MulticlassAveragePrecision), "Class"),
    **dict.fromkeys((MultilabelAUROC, MultilabelAveragePrecision), "Label"),
}
for _cls, _legend in _LEGENDS.items():
    _cls.plot_legend_name = _legend  # type: ignore[attr-defined]
del _cls, _legend
