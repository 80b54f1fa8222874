"""The task classes torchmetrics users import (``BinaryAccuracy``, ``MulticlassAUROC``, ...): each is the
generic class (:class:`~torchmetrics_diff.Accuracy`, ...) with its task fixed and torchmetrics' signature and
defaults (``average="macro"`` for the multiclass and multilabel classes, as torchmetrics' task classes), so that
an ``isinstance`` check against the generic class holds and the states, syncs and values are the generic ones."""

from __future__ import annotations

from typing import Any

from torchmetrics_diff.classification.auroc import AUROC, AveragePrecision
from torchmetrics_diff.classification.stat_scores import (
    Accuracy,
    ConfusionMatrix,
    F1Score,
    Precision,
    Recall,
    Specificity,
    StatScores,
)


def _check_normalization(normalization: Any) -> None:
    if normalization != "sigmoid":
        raise ValueError(
            f"`normalization` must be 'sigmoid' (logits go through a sigmoid; no other is implemented); got "
            f"{normalization!r}"
        )


class BinaryAccuracy(Accuracy):
    """The accuracy of a binary task: :class:`~torchmetrics_diff.Accuracy` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryAccuracy
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryAccuracy()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary", threshold, None, None, "micro", multidim_average, 1, ignore_index, validate_args, **kwargs
        )


class MulticlassAccuracy(Accuracy):
    """The accuracy of a multiclass task: :class:`~torchmetrics_diff.Accuracy` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassAccuracy
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassAccuracy(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            **kwargs,
        )


class MultilabelAccuracy(Accuracy):
    """The accuracy of a multilabel task: :class:`~torchmetrics_diff.Accuracy` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            **kwargs,
        )


class BinaryPrecision(Precision):
    """The precision ``tp / (tp + fp)`` of a binary task: :class:`~torchmetrics_diff.Precision` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryPrecision
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryPrecision()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary",
            threshold,
            None,
            None,
            "micro",
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MulticlassPrecision(Precision):
    """The precision ``tp / (tp + fp)`` of a multiclass task: :class:`~torchmetrics_diff.Precision` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassPrecision
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassPrecision(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MultilabelPrecision(Precision):
    """The precision ``tp / (tp + fp)`` of a multilabel task: :class:`~torchmetrics_diff.Precision` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class BinaryRecall(Recall):
    """The recall ``tp / (tp + fn)`` of a binary task: :class:`~torchmetrics_diff.Recall` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryRecall
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryRecall()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary",
            threshold,
            None,
            None,
            "micro",
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MulticlassRecall(Recall):
    """The recall ``tp / (tp + fn)`` of a multiclass task: :class:`~torchmetrics_diff.Recall` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassRecall
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassRecall(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8333)
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MultilabelRecall(Recall):
    """The recall ``tp / (tp + fn)`` of a multilabel task: :class:`~torchmetrics_diff.Recall` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class BinaryF1Score(F1Score):
    """The F1 score ``2 tp / (2 tp + fp + fn)`` of a binary task: :class:`~torchmetrics_diff.F1Score` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryF1Score
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryF1Score()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        zero_division: float = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary",
            threshold,
            None,
            None,
            "micro",
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MulticlassF1Score(F1Score):
    """The F1 score ``2 tp / (2 tp + fp + fn)`` of a multiclass task: :class:`~torchmetrics_diff.F1Score` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassF1Score
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassF1Score(num_classes=3)
        >>> metric(preds, target)
        tensor(0.7778)
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class MultilabelF1Score(F1Score):
    """The F1 score ``2 tp / (2 tp + fp + fn)`` of a multilabel task: :class:`~torchmetrics_diff.F1Score` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the score where its denominator is zero.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            zero_division=zero_division,
            **kwargs,
        )


class BinarySpecificity(Specificity):
    """The specificity ``tn / (tn + fp)`` of a binary task: :class:`~torchmetrics_diff.Specificity` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinarySpecificity
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinarySpecificity()
        >>> metric(preds, target)
        tensor(0.5000)
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary", threshold, None, None, "micro", multidim_average, 1, ignore_index, validate_args, **kwargs
        )


class MulticlassSpecificity(Specificity):
    """The specificity ``tn / (tn + fp)`` of a multiclass task: :class:`~torchmetrics_diff.Specificity` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassSpecificity
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassSpecificity(num_classes=3)
        >>> metric(preds, target)
        tensor(0.8889)
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            **kwargs,
        )


class MultilabelSpecificity(Specificity):
    """The specificity ``tn / (tn + fp)`` of a multilabel task: :class:`~torchmetrics_diff.Specificity` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            **kwargs,
        )


class BinaryStatScores(StatScores):
    """The stat scores ``[tp, fp, tn, fn, support]`` of a binary task: :class:`~torchmetrics_diff.StatScores` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import BinaryStatScores
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> metric = BinaryStatScores()
        >>> metric(preds, target)
        tensor([1, 1, 1, 1, 2])
    """

    def __init__(
        self,
        threshold: float = 0.5,
        multidim_average: str = "global",
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "binary", threshold, None, None, "micro", multidim_average, 1, ignore_index, validate_args, **kwargs
        )


class MulticlassStatScores(StatScores):
    """The stat scores ``[tp, fp, tn, fn, support]`` of a multiclass task: :class:`~torchmetrics_diff.StatScores` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        top_k: right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores).
            Default 1.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.classification import MulticlassStatScores
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> metric = MulticlassStatScores(num_classes=3)
        >>> metric(preds, target)
        tensor([1.0000, 0.3333, 2.3333, 0.3333, 1.3333])
    """

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
        super().__init__(
            "multiclass",
            0.5,
            num_classes,
            None,
            average,
            multidim_average,
            top_k,
            ignore_index,
            validate_args,
            **kwargs,
        )


class MultilabelStatScores(StatScores):
    """The stat scores ``[tp, fp, tn, fn, support]`` of a multilabel task: :class:`~torchmetrics_diff.StatScores` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        average: ``"macro"`` (default, as torchmetrics' task classes), ``"micro"``, ``"weighted"`` or
            ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        super().__init__(
            "multilabel",
            threshold,
            None,
            num_labels,
            average,
            multidim_average,
            1,
            ignore_index,
            validate_args,
            **kwargs,
        )


class BinaryConfusionMatrix(ConfusionMatrix):
    """The confusion matrix of a binary task: :class:`~torchmetrics_diff.ConfusionMatrix` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        ignore_index: target value whose entries are left out. Default ``None``.
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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


class MulticlassConfusionMatrix(ConfusionMatrix):
    """The confusion matrix of a multiclass task: :class:`~torchmetrics_diff.ConfusionMatrix` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        ignore_index: target value whose entries are left out. Default ``None``.
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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


class MultilabelConfusionMatrix(ConfusionMatrix):
    """The confusion matrix of a multilabel task: :class:`~torchmetrics_diff.ConfusionMatrix` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        threshold: a probability above it is a positive prediction (logits go through a sigmoid first).
            Default 0.5.
        ignore_index: target value whose entries are left out. Default ``None``.
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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


class BinaryAUROC(AUROC):
    """The exact AUROC of a binary task: :class:`~torchmetrics_diff.AUROC` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        max_fpr: only ``None`` (no partial AUROC). Default ``None``.
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        **kwargs: Any,
    ) -> None:
        super().__init__("binary", ignore_index, validate_args, thresholds=thresholds, max_fpr=max_fpr, **kwargs)


class MulticlassAUROC(AUROC):
    """The exact AUROC of a multiclass task: :class:`~torchmetrics_diff.AUROC` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"weighted"`` (by positives) or ``"none"``/``None``.
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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

    def __init__(
        self,
        num_classes: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "multiclass",
            ignore_index,
            validate_args,
            average=average,
            thresholds=thresholds,
            num_classes=num_classes,
            **kwargs,
        )


class MultilabelAUROC(AUROC):
    """The exact AUROC of a multilabel task: :class:`~torchmetrics_diff.AUROC` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` (by positives) or ``"none"``/``None``.
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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

    def __init__(
        self,
        num_labels: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "multilabel",
            ignore_index,
            validate_args,
            average=average,
            thresholds=thresholds,
            num_labels=num_labels,
            **kwargs,
        )


class BinaryAveragePrecision(AveragePrecision):
    """The exact average precision of a binary task: :class:`~torchmetrics_diff.AveragePrecision` with
    ``task="binary"`` and torchmetrics' signature.

    Args:
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        normalization: only ``"sigmoid"`` (the default: logits go through a sigmoid).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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
        **kwargs: Any,
    ) -> None:
        _check_normalization(normalization)
        super().__init__("binary", thresholds, ignore_index=ignore_index, validate_args=validate_args, **kwargs)


class MulticlassAveragePrecision(AveragePrecision):
    """The exact average precision of a multiclass task: :class:`~torchmetrics_diff.AveragePrecision` with
    ``task="multiclass"`` and torchmetrics' signature.

    Args:
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"weighted"`` (by positives) or ``"none"``/``None``.
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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

    def __init__(
        self,
        num_classes: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "multiclass",
            thresholds,
            average=average,
            ignore_index=ignore_index,
            validate_args=validate_args,
            num_classes=num_classes,
            **kwargs,
        )


class MultilabelAveragePrecision(AveragePrecision):
    """The exact average precision of a multilabel task: :class:`~torchmetrics_diff.AveragePrecision` with
    ``task="multilabel"`` and torchmetrics' signature.

    Args:
        num_labels: number of labels ``L`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` (by positives) or ``"none"``/``None``.
        thresholds: only ``None`` (exact values; binning is not implemented). Default ``None``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task.

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

    def __init__(
        self,
        num_labels: int | None = None,
        average: str | None = "macro",
        thresholds: Any = None,
        ignore_index: int | None = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            "multilabel",
            thresholds,
            average=average,
            ignore_index=ignore_index,
            validate_args=validate_args,
            num_labels=num_labels,
            **kwargs,
        )
