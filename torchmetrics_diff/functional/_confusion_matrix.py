"""The confusion matrix of the classification tasks: the counts, their normalization, and the public function."""

from __future__ import annotations

import torch

from torchmetrics_diff.functional._classification import (
    NORMALIZE,
    _divide,
    check_task_args,
    multiclass_confusion_counts,
    stat_scores,
)


def confusion_counts(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float,
    num_classes: int | None,
    num_labels: int | None,
    ignore_index: int | None,
    validate_args: bool,
) -> torch.Tensor:
    """Unnormalized ``int64`` confusion matrix: ``(2, 2)`` binary, ``(C, C)`` multiclass, ``(L, 2, 2)`` multilabel;
    rows are targets, columns predictions (``[[tn, fp], [fn, tp]]`` for the two-class ones). Every argument is
    given (by :func:`confusion_matrix` and :class:`~torchmetrics_diff.ConfusionMatrix`, which hold the defaults)."""
    size = check_task_args(task, threshold, num_classes, num_labels, "micro", ignore_index)
    if task == "multiclass":
        return multiclass_confusion_counts(preds, target, size, ignore_index, validate_args)
    s = stat_scores(preds, target, task, threshold, num_classes, num_labels, ignore_index, validate_args)
    return torch.stack([torch.stack([s.tn, s.fp], -1), torch.stack([s.fn, s.tp], -1)], -2)


def normalize_confusion(confmat: torch.Tensor, normalize: str | None) -> torch.Tensor:
    """Normalize over targets (rows, ``"true"``), predictions (columns, ``"pred"``) or everything (``"all"``);
    an all-zero row/column gives zeros (torchmetrics replaces the NaNs by 0 as well)."""
    if normalize not in NORMALIZE:
        raise ValueError(f"`normalize` must be one of {NORMALIZE}; got {normalize!r}")
    if normalize in ("none", None):
        return confmat
    dims = {"true": (-1,), "pred": (-2,), "all": (-2, -1)}[normalize]
    return _divide(confmat, confmat.sum(dims, keepdim=True).expand_as(confmat))


def confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Confusion matrix of a batch: rows are targets, columns predictions.

    The functional form of :class:`~torchmetrics_diff.ConfusionMatrix`; no collective.

    Args:
        preds: predictions. ``binary``: shape ``(N, ...)``, float probabilities or logits (any value outside
            ``[0, 1]`` makes the whole tensor logits: a sigmoid is applied), or integer labels in ``{0, 1}``.
            ``multiclass``: float scores ``(N, C, ...)`` (argmax over dim 1) or integer labels ``(N, ...)``.
            ``multilabel``: ``(N, L, ...)``, each label as in ``binary``.
        target: integer labels of shape ``(N, ...)`` (``binary``: in ``{0, 1}``; ``multiclass``: in
            ``[0, C)``) or ``(N, L, ...)`` (``multilabel``); entries equal to ``ignore_index`` are allowed.
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        threshold: a probability above it is a positive prediction (``binary``, ``multilabel``). Default 0.5.
        num_classes: ``C``, required for ``multiclass``. Default ``None``.
        num_labels: ``L``, required for ``multilabel``. Default ``None``.
        normalize: ``None`` or ``"none"`` (default: counts), ``"true"`` (each row sums to 1), ``"pred"`` (each
            column sums to 1) or ``"all"`` (the matrix sums to 1); an all-zero row or column gives zeros.
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check that the labels lie in their range (one pass over the batch). Default ``True``.

    Returns:
        Shape ``(2, 2)`` for ``binary`` (``[[tn, fp], [fn, tp]]``), ``(C, C)`` for ``multiclass``, ``(L, 2, 2)``
        for ``multilabel``: ``int64`` counts, or floating (the default dtype) when normalized.

    Raises:
        ValueError: an unknown ``task`` or ``normalize``, a ``threshold`` outside ``[0, 1]``, a missing or
            non-positive ``num_classes``/``num_labels``, tensors of mismatched shapes, or (with ``validate_args``)
            labels out of range.

    Example:
        >>> import torch
        >>> confusion_matrix(torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 1, 0]), "binary")
        tensor([[0, 1],
                [1, 1]])
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"`normalize` must be one of {NORMALIZE}; got {normalize!r}")
    counts = confusion_counts(preds, target, task, threshold, num_classes, num_labels, ignore_index, validate_args)
    return normalize_confusion(counts, normalize)
