"""The task forms of the stat-score functions, with torchmetrics' names, argument order and defaults
(``average="macro"`` for multiclass and multilabel): ``binary_accuracy``, ``multiclass_f1_score``, ... Each is
the generic function with its task fixed."""

from __future__ import annotations

import torch

from torchmetrics_diff.functional._classification import (
    _score,
    check_task_args,
    confusion_matrix,
    stack_stat_scores,
    stat_scores,
)


def binary_accuracy(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Accuracy of a binary batch.

    :func:`accuracy` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_accuracy(preds, target)
        tensor(0.5000)
    """
    args = ("binary", threshold, None, None, "micro", ignore_index, validate_args, 0, 1, multidim_average)
    return _score("accuracy", preds, target, *args)


def multiclass_accuracy(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int | None = None,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Accuracy of a multiclass batch.

    :func:`accuracy` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_accuracy(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = ("multiclass", 0.5, num_classes, None, average, ignore_index, validate_args, 0, top_k, multidim_average)
    return _score("accuracy", preds, target, *args)


def multilabel_accuracy(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Accuracy of a multilabel batch.

    :func:`accuracy` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_accuracy(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = ("multilabel", threshold, None, num_labels, average, ignore_index, validate_args, 0, 1, multidim_average)
    return _score("accuracy", preds, target, *args)


def binary_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Precision ``tp / (tp + fp)`` of a binary batch.

    :func:`precision` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_precision(preds, target)
        tensor(0.5000)
    """
    args = ("binary", threshold, None, None, "micro", ignore_index, validate_args, zero_division, 1, multidim_average)
    return _score("precision", preds, target, *args)


def multiclass_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Precision ``tp / (tp + fp)`` of a multiclass batch.

    :func:`precision` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_precision(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = (
        "multiclass",
        0.5,
        num_classes,
        None,
        average,
        ignore_index,
        validate_args,
        zero_division,
        top_k,
        multidim_average,
    )
    return _score("precision", preds, target, *args)


def multilabel_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Precision ``tp / (tp + fp)`` of a multilabel batch.

    :func:`precision` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_precision(preds, target, num_labels=2)
        tensor(0.7500)
    """
    args = (
        "multilabel",
        threshold,
        None,
        num_labels,
        average,
        ignore_index,
        validate_args,
        zero_division,
        1,
        multidim_average,
    )
    return _score("precision", preds, target, *args)


def binary_recall(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Recall ``tp / (tp + fn)`` of a binary batch.

    :func:`recall` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_recall(preds, target)
        tensor(0.5000)
    """
    args = ("binary", threshold, None, None, "micro", ignore_index, validate_args, zero_division, 1, multidim_average)
    return _score("recall", preds, target, *args)


def multiclass_recall(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Recall ``tp / (tp + fn)`` of a multiclass batch.

    :func:`recall` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_recall(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = (
        "multiclass",
        0.5,
        num_classes,
        None,
        average,
        ignore_index,
        validate_args,
        zero_division,
        top_k,
        multidim_average,
    )
    return _score("recall", preds, target, *args)


def multilabel_recall(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """Recall ``tp / (tp + fn)`` of a multilabel batch.

    :func:`recall` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_recall(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = (
        "multilabel",
        threshold,
        None,
        num_labels,
        average,
        ignore_index,
        validate_args,
        zero_division,
        1,
        multidim_average,
    )
    return _score("recall", preds, target, *args)


def binary_f1_score(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """F1 score ``2 tp / (2 tp + fp + fn)`` of a binary batch.

    :func:`f1_score` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_f1_score(preds, target)
        tensor(0.5000)
    """
    args = ("binary", threshold, None, None, "micro", ignore_index, validate_args, zero_division, 1, multidim_average)
    return _score("f1", preds, target, *args)


def multiclass_f1_score(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """F1 score ``2 tp / (2 tp + fp + fn)`` of a multiclass batch.

    :func:`f1_score` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_f1_score(preds, target, num_classes=3)
        tensor(0.7778)
    """
    args = (
        "multiclass",
        0.5,
        num_classes,
        None,
        average,
        ignore_index,
        validate_args,
        zero_division,
        top_k,
        multidim_average,
    )
    return _score("f1", preds, target, *args)


def multilabel_f1_score(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """F1 score ``2 tp / (2 tp + fp + fn)`` of a multilabel batch.

    :func:`f1_score` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.
        zero_division: ``0`` (default) or ``1``, the value where a denominator is zero.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_f1_score(preds, target, num_labels=2)
        tensor(0.5833)
    """
    args = (
        "multilabel",
        threshold,
        None,
        num_labels,
        average,
        ignore_index,
        validate_args,
        zero_division,
        1,
        multidim_average,
    )
    return _score("f1", preds, target, *args)


def binary_specificity(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Specificity ``tn / (tn + fp)`` of a binary batch.

    :func:`specificity` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_specificity(preds, target)
        tensor(0.5000)
    """
    args = ("binary", threshold, None, None, "micro", ignore_index, validate_args, 0, 1, multidim_average)
    return _score("specificity", preds, target, *args)


def multiclass_specificity(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Specificity ``tn / (tn + fp)`` of a multiclass batch.

    :func:`specificity` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_specificity(preds, target, num_classes=3)
        tensor(0.8889)
    """
    args = ("multiclass", 0.5, num_classes, None, average, ignore_index, validate_args, 0, top_k, multidim_average)
    return _score("specificity", preds, target, *args)


def multilabel_specificity(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Specificity ``tn / (tn + fp)`` of a multilabel batch.

    :func:`specificity` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a
        leading ``(N,)`` when samplewise.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_specificity(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = ("multilabel", threshold, None, num_labels, average, ignore_index, validate_args, 0, 1, multidim_average)
    return _score("specificity", preds, target, *args)


def binary_stat_scores(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Stat scores ``[tp, fp, tn, fn, support]`` (torchmetrics' stacked form) of a binary batch.

    :func:`stat_scores` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        Shape ``(5,)``, ``(C, 5)``/``(L, 5)`` with ``average="none"``, a leading ``(N,)`` when
        samplewise; ``int64``, or floating for ``"macro"`` and ``"weighted"``.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_stat_scores(preds, target)
        tensor([1, 1, 1, 1, 2])
    """
    check_task_args("binary", threshold, None, None, "micro", ignore_index)
    s = stat_scores(preds, target, "binary", threshold, None, None, ignore_index, validate_args, 1, multidim_average)
    return stack_stat_scores(s, "binary", "micro")


def multiclass_stat_scores(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    top_k: int = 1,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Stat scores ``[tp, fp, tn, fn, support]`` (torchmetrics' stacked form) of a multiclass batch.

    :func:`stat_scores` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        top_k: right when the target is among the ``top_k`` highest scores (needs scores). Default 1.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        Shape ``(5,)``, ``(C, 5)``/``(L, 5)`` with ``average="none"``, a leading ``(N,)`` when
        samplewise; ``int64``, or floating for ``"macro"`` and ``"weighted"``.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_stat_scores(preds, target, num_classes=3)
        tensor([1.0000, 0.3333, 2.3333, 0.3333, 1.3333])
    """
    check_task_args("multiclass", 0.5, num_classes, None, average, ignore_index)
    s = stat_scores(
        preds, target, "multiclass", 0.5, num_classes, None, ignore_index, validate_args, top_k, multidim_average
    )
    return stack_stat_scores(s, "multiclass", average)


def multilabel_stat_scores(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Stat scores ``[tp, fp, tn, fn, support]`` (torchmetrics' stacked form) of a multilabel batch.

    :func:`stat_scores` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        Shape ``(5,)``, ``(C, 5)``/``(L, 5)`` with ``average="none"``, a leading ``(N,)`` when
        samplewise; ``int64``, or floating for ``"macro"`` and ``"weighted"``.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_stat_scores(preds, target, num_labels=2)
        tensor([1.0000, 0.5000, 0.5000, 1.0000, 2.0000])
    """
    check_task_args("multilabel", threshold, None, num_labels, average, ignore_index)
    s = stat_scores(
        preds, target, "multilabel", threshold, None, num_labels, ignore_index, validate_args, 1, multidim_average
    )
    return stack_stat_scores(s, "multilabel", average)


def binary_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Confusion matrix of a binary batch.

    :func:`confusion_matrix` with ``task="binary"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or
            integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        ``(2, 2)`` ``int64`` counts, or floating when normalized.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_confusion_matrix(preds, target)
        tensor([[1, 1],
                [1, 1]])
    """
    return confusion_matrix(preds, target, "binary", threshold, None, None, normalize, ignore_index, validate_args)


def multiclass_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Confusion matrix of a multiclass batch.

    :func:`confusion_matrix` with ``task="multiclass"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: number of classes ``C`` (required).
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        ``(C, C)`` ``int64`` counts, or floating when normalized.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_confusion_matrix(preds, target, num_classes=3)
        tensor([[1, 0, 0],
                [0, 1, 1],
                [0, 0, 1]])
    """
    return confusion_matrix(preds, target, "multiclass", 0.5, num_classes, None, normalize, ignore_index, validate_args)


def multilabel_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Confusion matrix of a multilabel batch.

    :func:`confusion_matrix` with ``task="multilabel"``, in torchmetrics' argument order. No collective.

    Args:
        preds: ``(N, L, ...)`` probabilities, logits or integer labels.
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: number of labels ``L``.
        threshold: a probability above it is a positive prediction. Default 0.5.
        normalize: ``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that labels lie in their range. Default ``True``.

    Returns:
        ``(L, 2, 2)`` ``int64`` counts, or floating when normalized.

    Raises:
        ValueError: a bad argument, naming it; inputs that do not fit the task.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_confusion_matrix(preds, target, num_labels=2)
        tensor([[[0, 1],
                 [1, 1]],
        <BLANKLINE>
                [[1, 0],
                 [1, 1]]])
    """
    return confusion_matrix(
        preds, target, "multilabel", threshold, None, num_labels, normalize, ignore_index, validate_args
    )
