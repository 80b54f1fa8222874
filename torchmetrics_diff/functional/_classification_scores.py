"""The classification scores reduced from stat scores: accuracy, precision, recall, F1 and specificity, each a
numerator and a denominator of the counts of ``_classification``, divided and averaged by one reducer; and their
generic public functions (the task forms are in ``_classification_tasks``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from torchmetrics_diff.functional._classification import StatScores, _divide, check_task_args, stat_scores
from torchmetrics_diff.functional._classification_docs import args_section, compose, section

_F = TypeVar("_F", bound=Callable[..., Any])


# ------------------------------------------------------------------------------------------------ reductions
def _accuracy_parts(s: StatScores, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    if task == "multiclass":
        return s.tp, s.tp + s.fn
    return s.tp + s.tn, s.tp + s.tn + s.fp + s.fn


def _precision_parts(s: StatScores, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    return s.tp, s.tp + s.fp


def _recall_parts(s: StatScores, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    return s.tp, s.tp + s.fn


def _f1_parts(s: StatScores, task: str, beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    b2 = beta * beta
    return (1 + b2) * s.tp, (1 + b2) * s.tp + b2 * s.fn + s.fp


def _specificity_parts(s: StatScores, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    return s.tn, s.tn + s.fp


# each score as a numerator and a denominator of stat scores, so that one reducer divides and averages them all
SCORES = {
    "accuracy": _accuracy_parts,
    "precision": _precision_parts,
    "recall": _recall_parts,
    "f1": _f1_parts,
    "specificity": _specificity_parts,
}
# the scores whose multiclass macro average, with top_k > 1, leaves out only the classes without support (tp + fn)
_TOP_K_MACRO = ("accuracy", "precision", "recall")


def _average(
    score: torch.Tensor, s: StatScores, average: str | None, task: str, support_only: bool = False
) -> torch.Tensor:
    """Per-class scores averaged torchmetrics' way: ``macro`` leaves out classes absent from both the targets and
    the predictions (multiclass only; with ``support_only``, those absent from the targets), ``weighted`` weighs
    by support ``tp + fn``."""
    if average in ("none", None):
        return score
    if average == "weighted":
        weights = (s.tp + s.fn).to(score.dtype)
    else:
        weights = torch.ones_like(score)
        if task == "multiclass":
            absent = s.tp + s.fn == 0 if support_only else s.tp + s.fp + s.fn == 0
            weights = torch.where(absent, torch.zeros_like(score), weights)
    return _divide((weights * score).sum(-1), weights.sum(-1))


def reduce_stat_scores(
    s: StatScores, score: str, task: str, average: str | None = "micro", zero_division: float = 0.0, top_k: int = 1
) -> torch.Tensor:
    """One of :data:`SCORES` from stat scores, ``zero_division`` where its denominator is 0: of the counts for
    ``binary``; else of the counts pooled over classes (``micro``) or per class, then averaged.

    Accuracy is ``(tp + tn) / all`` for binary and multilabel, ``tp / (tp + fn)`` per class for multiclass;
    precision ``tp / (tp + fp)``; recall ``tp / (tp + fn)``; F1 ``2 tp / (2 tp + fn + fp)``; specificity
    ``tn / (tn + fp)``. Samplewise counts (a leading ``(N,)``) give one value per sample.
    """
    parts = SCORES[score]

    def value(x: StatScores) -> torch.Tensor:
        return _divide(*parts(x, task), zero_division)

    if task == "binary":
        return value(s)
    if average == "micro":
        return value(StatScores(*(x.sum(-1) for x in s)))
    return _average(value(s), s, average, task, top_k > 1 and score in _TOP_K_MACRO)


def stack_stat_scores(s: StatScores, task: str, average: str | None) -> torch.Tensor:
    """torchmetrics' stacked stat scores ``[tp, fp, tn, fn, support]`` along the last dimension (support
    ``tp + fn``): ``int64`` summed over classes (``"micro"``) or per class (``"none"``, and always for binary),
    floating means over classes for ``"macro"`` and ``"weighted"`` (weights: the support; NaN without any)."""
    res = torch.stack([s.tp, s.fp, s.tn, s.fn, s.tp + s.fn], -1)
    if task == "binary" or average in ("none", None):
        return res
    if average == "micro":
        return res.sum(-2)
    dtype = torch.get_default_dtype()
    if average == "macro":
        return res.to(dtype).mean(-2)
    weights = (s.tp + s.fn).to(dtype)
    # torchmetrics divides the multilabel samplewise weights by the support of every sample and label together
    share = weights / (weights.sum() if task == "multilabel" else weights.sum(-1, keepdim=True))
    return (res.to(dtype) * share.unsqueeze(-1)).sum(-2)


def check_zero_division(zero_division: Any) -> float:
    """``zero_division`` (0 or 1) as a float."""
    if zero_division not in (0, 1) or isinstance(zero_division, bool):
        raise ValueError(f"`zero_division` must be 0 or 1; got {zero_division!r}")
    return float(zero_division)


# ------------------------------------------------------------------------------------------ public functions
#: the arguments of the generic score functions (:func:`accuracy`, :func:`precision`, ...), described once
_SCORE_ARGS = {
    "preds": "predictions. ``binary``: shape ``(N, ...)``, float probabilities or logits (any value outside "
    "``[0, 1]`` makes the whole tensor logits: a sigmoid is applied), or integer labels in ``{0, 1}``. "
    "``multiclass``: float scores ``(N, C, ...)`` (argmax over dim 1) or integer labels ``(N, ...)``. "
    "``multilabel``: ``(N, L, ...)``, each label as in ``binary``.",
    "target": "integer labels of shape ``(N, ...)`` (``binary``: in ``{0, 1}``; ``multiclass``: in ``[0, C)``) or "
    "``(N, L, ...)`` (``multilabel``); entries equal to ``ignore_index`` are allowed.",
    "task": '``"binary"``, ``"multiclass"`` or ``"multilabel"``.',
    "threshold": "a probability above it is a positive prediction (``binary``, ``multilabel``). Default 0.5.",
    "num_classes": "``C``, required for ``multiclass``. Default ``None``.",
    "num_labels": "``L``, required for ``multilabel``. Default ``None``.",
    "average": '``"micro"`` (default: pool the counts of every class or label), ``"macro"`` (mean of the per-class '
    "scores; for ``multiclass`` the classes absent from both targets and predictions are left out, as in "
    'torchmetrics), ``"weighted"`` (per-class scores weighted by their support ``tp + fn``), ``"none"`` or '
    "``None`` (one score per class or label). Ignored for ``binary``.",
    "ignore_index": "target entries equal to it are left out. Default ``None``.",
    "validate_args": "check that the labels lie in their range (one pass over the batch). Default ``True``.",
    "zero_division": "``0`` (default, as torchmetrics) or ``1``: the score where its denominator is zero.",
    "top_k": "``multiclass`` scores only: right when the target is among the ``top_k`` highest scores (keyword; "
    "see :func:`stat_scores`). Default 1.",
    "multidim_average": '``"global"`` (default) or ``"samplewise"``: one value per sample, over its extra '
    'dimensions (keyword). Default ``"global"``.',
}
_SCORE_RETURNS = (
    'A floating tensor in the default dtype (float32): 0-d for ``binary`` and for ``"micro"``, ``"macro"`` and '
    '``"weighted"``; shape ``(C,)`` or ``(L,)`` with ``average="none"``; a leading ``(N,)`` when samplewise. No '
    "gradient (it is counts)."
)


def _score_doc(fn: _F) -> _F:
    """Put the shared ``Args``, ``Returns`` and ``Raises`` sections of a generic score function into its
    docstring, between its summary and its example."""
    summary, example = (fn.__doc__ or "").split("    Example:")
    with_zero_division = "zero_division" in inspect.signature(fn).parameters
    unknown = "``average`` or ``zero_division``" if with_zero_division else "``average``"
    raises = (
        f"ValueError: an unknown ``task``, {unknown}, a ``threshold`` outside ``[0, 1]``, a missing or non-positive "
        "``num_classes``/``num_labels``, tensors of mismatched shapes, or (with ``validate_args``) labels out of range."
    )
    sections = (args_section(fn, _SCORE_ARGS), section("Returns", _SCORE_RETURNS), section("Raises", raises))
    fn.__doc__ = compose(summary, *sections, tail="Example:" + example)
    return fn


def _score(
    score: str,
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float,
    num_classes: int | None,
    num_labels: int | None,
    average: str | None,
    ignore_index: int | None,
    validate_args: bool,
    zero_division: float = 0,
    top_k: int = 1,
    multidim_average: str = "global",
) -> torch.Tensor:
    """Validate, count and reduce: the body of every stat-score function."""
    check_task_args(task, threshold, num_classes, num_labels, average, ignore_index)
    zd = check_zero_division(zero_division)
    task_args = (task, threshold, num_classes, num_labels, ignore_index, validate_args, top_k, multidim_average)
    s = stat_scores(preds, target, *task_args)
    return reduce_stat_scores(s, score, task, average, zd, top_k)


@_score_doc
def accuracy(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    ignore_index: int | None = None,
    validate_args: bool = True,
    top_k: int = 1,
    multidim_average: str = "global",
) -> torch.Tensor:
    """Accuracy of a batch: ``(tp + tn) / all`` for ``binary`` and ``multilabel``, ``tp / (tp + fn)`` per class
    for ``multiclass`` (with ``"micro"``: the fraction of correct labels).

    The functional form of :class:`~torchmetrics_diff.Accuracy`; no collective.

    Example:
        >>> import torch
        >>> accuracy(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]), "multiclass", num_classes=3)
        tensor(0.7500)
    """
    args = (task, threshold, num_classes, num_labels, average, ignore_index, validate_args)
    return _score("accuracy", preds, target, *args, 0, top_k, multidim_average)


@_score_doc
def precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
    top_k: int = 1,
    multidim_average: str = "global",
) -> torch.Tensor:
    """Precision ``tp / (tp + fp)`` of a batch.

    The functional form of :class:`~torchmetrics_diff.Precision`; no collective.

    Example:
        >>> import torch
        >>> precision(torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 1, 0]), "binary")
        tensor(0.5000)
    """
    args = (task, threshold, num_classes, num_labels, average, ignore_index, validate_args, zero_division)
    return _score("precision", preds, target, *args, top_k, multidim_average)


@_score_doc
def recall(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
    top_k: int = 1,
    multidim_average: str = "global",
) -> torch.Tensor:
    """Recall ``tp / (tp + fn)`` of a batch.

    The functional form of :class:`~torchmetrics_diff.Recall`; no collective.

    Example:
        >>> import torch
        >>> recall(torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 1, 0]), "binary")
        tensor(0.5000)
    """
    args = (task, threshold, num_classes, num_labels, average, ignore_index, validate_args, zero_division)
    return _score("recall", preds, target, *args, top_k, multidim_average)


@_score_doc
def f1_score(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
    top_k: int = 1,
    multidim_average: str = "global",
) -> torch.Tensor:
    """F1 score ``2 tp / (2 tp + fp + fn)`` of a batch.

    The functional form of :class:`~torchmetrics_diff.F1Score`; no collective.

    Example:
        >>> import torch
        >>> f1_score(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]), "multiclass", num_classes=3,
        ...          average="macro")
        tensor(0.7778)
    """
    args = (task, threshold, num_classes, num_labels, average, ignore_index, validate_args, zero_division)
    return _score("f1", preds, target, *args, top_k, multidim_average)


def specificity(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    multidim_average: str = "global",
    top_k: int = 1,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """Specificity ``tn / (tn + fp)`` of a batch (0 where ``tn + fp`` is 0, as torchmetrics).

    The functional form of :class:`~torchmetrics_diff.Specificity`; no collective. Its arguments come in
    torchmetrics' order.

    Args:
        preds: predictions, as for :func:`stat_scores` (per task).
        target: integer labels of the matching shape; entries equal to ``ignore_index`` are allowed.
        task: ``"binary"``, ``"multiclass"`` or ``"multilabel"``.
        threshold: a probability above it is a positive prediction (``binary``, ``multilabel``). Default 0.5.
        num_classes: ``C``, required for ``multiclass``. Default ``None``.
        num_labels: ``L``, required for ``multilabel``. Default ``None``.
        average: ``"micro"`` (default), ``"macro"``, ``"weighted"`` or ``"none"``/``None``, as for
            :func:`precision`. Ignored for ``binary``.
        multidim_average: ``"global"`` (default) or ``"samplewise"`` (one value per sample).
        top_k: ``multiclass`` scores only, as for :func:`stat_scores`. Default 1.
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check that the labels lie in their range. Default ``True``.

    Returns:
        A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a leading
        ``(N,)`` when samplewise. No gradient.

    Raises:
        ValueError: a bad argument (named), tensors of mismatched shapes, or labels out of range.

    Example:
        >>> import torch
        >>> specificity(torch.tensor([0.9, 0.2, 0.7, 0.1]), torch.tensor([1, 1, 0, 0]), "binary")
        tensor(0.5000)
    """
    args = (task, threshold, num_classes, num_labels, average, ignore_index, validate_args)
    return _score("specificity", preds, target, *args, 0, top_k, multidim_average)
