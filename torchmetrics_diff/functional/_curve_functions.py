"""AUROC and average precision, the public functions: generic (``task=``) and per task (``binary_auroc``, ...),
with torchmetrics' names and arguments; each validates, formats and scores through ``_curves``.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._curves import CurveArgs, _curve


def auroc(
    preds: torch.Tensor,
    target: torch.Tensor,
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
) -> torch.Tensor:
    """Exact area under the ROC curve of a batch: binary, multiclass (each class against the rest) or multilabel.

    The Mann-Whitney statistic, with tied scores sharing their mean rank: it equals the trapezoidal area under the
    exact ROC curve (no binning). The functional form of :class:`~torchmetrics_diff.AUROC`; no collective. The
    first five arguments keep this package's earlier order; pass the others by keyword.

    Args:
        preds: floating scores: ``(N, ...)`` binary, ``(N, C, ...)`` multiclass, ``(N, L, ...)`` multilabel;
            probabilities, or logits (a sigmoid, or for multiclass a softmax over dim 1, when some value lies
            outside ``[0, 1]``).
        target: integer labels: ``(N, ...)`` in ``{0, 1}`` (binary) or ``[0, C)`` (multiclass), ``(N, L, ...)``
            in ``{0, 1}`` (multilabel); entries equal to ``ignore_index`` are allowed.
        task: ``"binary"`` (default), ``"multiclass"`` or ``"multilabel"``.
        ignore_index: target entries equal to it are left out (a whole row for multiclass, one entry for
            multilabel). Default ``None``.
        validate_args: check that the targets lie in their range. Default ``True``.
        num_classes: ``C``, required for multiclass. Default ``None``.
        num_labels: ``L``, required for multilabel. Default ``None``.
        average: ``"macro"`` (default: mean over classes or labels), ``"weighted"`` (weighted by the number of
            positives), ``"none"``/``None`` (one value each), and for multilabel ``"micro"`` (every entry as one
            binary task). Ignored for binary.
        thresholds: only ``None`` (exact; binned thresholds are not implemented). Default ``None``.
        max_fpr: only ``None`` (the partial AUROC is not implemented). Default ``None``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops its sample (multiclass: a sample with any NaN class score; multilabel: the one
            ``(sample, label)`` entry) with a warning giving the count; ``"ignore"`` drops it silently; ``"disable"``
            skips the check (the value then depends on where the sort puts the NaN). Infinite scores are ranked, never
            dropped. Keyword only.

    Returns:
        A tensor in the default dtype (float32), without gradient: 0-d, or ``(C,)``/``(L,)`` with
        ``average="none"``. A class or label without a positive or without a negative scores 0, with a
        ``UserWarning`` (torchmetrics' value).

    Raises:
        ValueError: an unknown ``task`` or ``average``, a missing ``num_classes``/``num_labels``, ``thresholds``
            or ``max_fpr`` given, integer ``preds``, mismatched shapes, (with ``validate_args``) targets out of range,
            or a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        tensor(0.7500)
        >>> scores = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
        >>> auroc(scores, torch.tensor([0, 1, 2, 1]), task="multiclass", num_classes=3, average="none")
        tensor([1.0000, 0.8750, 1.0000])
    """
    args = (task, num_classes, num_labels, average, thresholds, ignore_index, validate_args, max_fpr)
    return _curve("auroc", preds, target, CurveArgs(*args, nan_strategy=nan_strategy), "auroc")


def average_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    thresholds: Any = None,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "macro",
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """Exact average precision of a batch: binary, multiclass (each class against the rest) or multilabel.

    ``sum_k (R_k - R_{k-1}) P_k`` over every distinct score taken as a threshold, as torchmetrics computes it
    without ``thresholds``. The functional form of :class:`~torchmetrics_diff.AveragePrecision`; no collective.
    Arguments in torchmetrics' order.

    Args:
        preds: floating scores: ``(N, ...)`` binary, ``(N, C, ...)`` multiclass, ``(N, L, ...)`` multilabel;
            probabilities, or logits (a sigmoid, or for multiclass a softmax over dim 1, when some value lies
            outside ``[0, 1]``).
        target: integer labels: ``(N, ...)`` in ``{0, 1}`` (binary) or ``[0, C)`` (multiclass), ``(N, L, ...)``
            in ``{0, 1}`` (multilabel); entries equal to ``ignore_index`` are allowed.
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        thresholds: only ``None`` (exact; binned thresholds are not implemented). Default ``None``.
        num_classes: ``C``, required for multiclass. Default ``None``.
        num_labels: ``L``, required for multilabel. Default ``None``.
        average: ``"macro"`` (default), ``"weighted"`` (by the number of positives), ``"none"``/``None``, and for
            multilabel ``"micro"``. Ignored for binary.
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check that the targets lie in their range. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops its sample (multiclass: a sample with any NaN class score; multilabel: the one
            ``(sample, label)`` entry) with a warning giving the count; ``"ignore"`` drops it silently; ``"disable"``
            skips the check (the value then depends on where the sort puts the NaN). Infinite scores are ranked, never
            dropped. Keyword only.

    Returns:
        A tensor in the default dtype (float32), without gradient: 0-d, or ``(C,)``/``(L,)`` with
        ``average="none"``. Without a positive target the value is 0 (binary, and a multilabel label) or NaN (a
        multiclass class, left out of the ``macro`` and ``weighted`` means), with a ``UserWarning``, as
        torchmetrics.

    Raises:
        ValueError: an unknown ``task`` or ``average``, a missing ``num_classes``/``num_labels``, ``thresholds``
            given, integer ``preds``, mismatched shapes, (with ``validate_args``) targets out of range, or a NaN score
            with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> average_precision(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]), task="binary")
        tensor(0.8333)
    """
    args = (task, num_classes, num_labels, average, thresholds, ignore_index, validate_args)
    return _curve("average_precision", preds, target, CurveArgs(*args, nan_strategy=nan_strategy), "average_precision")


def binary_auroc(
    preds: torch.Tensor,
    target: torch.Tensor,
    max_fpr: Any = None,
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`auroc` with ``task="binary"``, in torchmetrics' argument order.

    Args:
        preds: floating scores ``(N, ...)``: probabilities, or logits (a sigmoid when some value lies outside
            ``[0, 1]``).
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        max_fpr: only ``None``. Default ``None``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops its sample with a warning giving the count; ``"ignore"`` drops it silently; ``"disable"``
            skips the check (the value then depends on where the sort puts the NaN). Infinite scores are ranked, never
            dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype.

    Raises:
        ValueError: as :func:`auroc`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> binary_auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        tensor(0.7500)
    """
    args = CurveArgs("binary", None, None, None, thresholds, ignore_index, validate_args, max_fpr, nan_strategy)
    return _curve("auroc", preds, target, args, "binary_auroc")


def multiclass_auroc(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`auroc` with ``task="multiclass"`` (each class against the rest), in torchmetrics' argument order.

    Args:
        preds: floating scores ``(N, C, ...)``: probabilities, or logits (a softmax over dim 1 when some value
            lies outside ``[0, 1]``).
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: ``C``.
        average: ``"macro"`` (default), ``"weighted"`` or ``"none"``/``None``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: rows whose target equals it are left out. Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops a sample with any NaN class score with a warning giving the count; ``"ignore"`` drops it
            silently; ``"disable"`` skips the check (the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype, or ``(C,)`` with ``average="none"``.

    Raises:
        ValueError: as :func:`auroc`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
        >>> multiclass_auroc(scores, torch.tensor([0, 1, 2, 1]), num_classes=3)
        tensor(0.9583)
    """
    args = (num_classes, None, average, thresholds, ignore_index, validate_args)
    return _curve("auroc", preds, target, CurveArgs("multiclass", *args, nan_strategy=nan_strategy), "multiclass_auroc")


def multilabel_auroc(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    average: str | None = "macro",
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`auroc` with ``task="multilabel"`` (one label at a time), in torchmetrics' argument order.

    Args:
        preds: floating scores ``(N, L, ...)``: probabilities, or logits (a sigmoid when some value lies outside
            ``[0, 1]``).
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: ``L``.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: target entries equal to it are left out (per label). Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops the one ``(sample, label)`` entry with a warning giving the count; ``"ignore"`` drops it
            silently; ``"disable"`` skips the check (the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype, or ``(L,)`` with ``average="none"``.

    Raises:
        ValueError: as :func:`auroc`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.9, 0.2], [0.4, 0.7], [0.6, 0.1], [0.2, 0.8]])
        >>> multilabel_auroc(scores, torch.tensor([[1, 0], [0, 1], [1, 0], [0, 0]]), num_labels=2, average="none")
        tensor([1.0000, 0.6667])
    """
    args = (None, num_labels, average, thresholds, ignore_index, validate_args)
    return _curve("auroc", preds, target, CurveArgs("multilabel", *args, nan_strategy=nan_strategy), "multilabel_auroc")


def binary_average_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`average_precision` with ``task="binary"``, in torchmetrics' argument order.

    Args:
        preds: floating scores ``(N, ...)``: probabilities, or logits (a sigmoid when some value lies outside
            ``[0, 1]``).
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops its sample with a warning giving the count; ``"ignore"`` drops it silently; ``"disable"``
            skips the check (the value then depends on where the sort puts the NaN). Infinite scores are ranked, never
            dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype.

    Raises:
        ValueError: as :func:`average_precision`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> binary_average_precision(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        tensor(0.8333)
    """
    args = (None, None, None, thresholds, ignore_index, validate_args)
    return _curve(
        "average_precision",
        preds,
        target,
        CurveArgs("binary", *args, nan_strategy=nan_strategy),
        "binary_average_precision",
    )


def multiclass_average_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    average: str | None = "macro",
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`average_precision` with ``task="multiclass"`` (each class against the rest), in torchmetrics'
    argument order.

    Args:
        preds: floating scores ``(N, C, ...)``: probabilities, or logits (a softmax over dim 1 when some value
            lies outside ``[0, 1]``).
        target: integer labels ``(N, ...)`` in ``[0, C)``.
        num_classes: ``C``.
        average: ``"macro"`` (default), ``"weighted"`` or ``"none"``/``None``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: rows whose target equals it are left out. Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops a sample with any NaN class score with a warning giving the count; ``"ignore"`` drops it
            silently; ``"disable"`` skips the check (the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype, or ``(C,)`` with ``average="none"`` (NaN for a class without a
        positive).

    Raises:
        ValueError: as :func:`average_precision`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
        >>> multiclass_average_precision(scores, torch.tensor([0, 1, 2, 1]), num_classes=3, average="none")
        tensor([1.0000, 0.8333, 1.0000])
    """
    args = (num_classes, None, average, thresholds, ignore_index, validate_args)
    return _curve(
        "average_precision",
        preds,
        target,
        CurveArgs("multiclass", *args, nan_strategy=nan_strategy),
        "multiclass_average_precision",
    )


def multilabel_average_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    average: str | None = "macro",
    thresholds: Any = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    *,
    nan_strategy: str = "error",
) -> torch.Tensor:
    """:func:`average_precision` with ``task="multilabel"`` (one label at a time), in torchmetrics' argument
    order.

    Args:
        preds: floating scores ``(N, L, ...)``: probabilities, or logits (a sigmoid when some value lies outside
            ``[0, 1]``).
        target: integer labels in ``{0, 1}`` of the shape of ``preds``.
        num_labels: ``L``.
        average: ``"macro"`` (default), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.
        thresholds: only ``None``. Default ``None``.
        ignore_index: target entries equal to it are left out (per label). Default ``None``.
        validate_args: check the targets. Default ``True``.
        nan_strategy: what a NaN score in ``preds`` does: ``"error"`` (default) raises a ``ValueError`` with the count;
            ``"warn"`` drops the one ``(sample, label)`` entry with a warning giving the count; ``"ignore"`` drops it
            silently; ``"disable"`` skips the check (the value then depends on where the sort puts the NaN). Infinite
            scores are ranked, never dropped. Keyword only.

    Returns:
        A 0-d tensor in the default dtype, or ``(L,)`` with ``average="none"``.

    Raises:
        ValueError: as :func:`average_precision`, and a NaN score with ``nan_strategy="error"``.

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.9, 0.2], [0.4, 0.7], [0.6, 0.1], [0.2, 0.8]])
        >>> multilabel_average_precision(scores, torch.tensor([[1, 0], [0, 1], [1, 0], [0, 0]]), num_labels=2)
        tensor(0.7500)
    """
    args = (None, num_labels, average, thresholds, ignore_index, validate_args)
    return _curve(
        "average_precision",
        preds,
        target,
        CurveArgs("multilabel", *args, nan_strategy=nan_strategy),
        "multilabel_average_precision",
    )
