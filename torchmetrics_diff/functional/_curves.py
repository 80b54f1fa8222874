"""Exact ranking metrics of the classification tasks, their arguments and maths: AUROC and average precision,
binary, multiclass (one class against the rest) and multilabel (one label at a time), from the scores themselves,
never from thresholds. The public functions are in ``_curve_functions``.

Both come from one sort per column and two binary searches (the ranks of tied scores), so every shape is the
input's:

- AUROC is the Mann-Whitney statistic with tied scores sharing their mean rank, which equals the trapezoidal area
  under the exact ROC curve (what torchmetrics computes without ``thresholds``);
- average precision is ``sum_k (R_k - R_{k-1}) P_k`` over the distinct scores taken as thresholds (torchmetrics'
  step sum), written as the mean, over the positive rows, of the precision at the row's own score: ``(positives
  scoring at least s) / (rows scoring at least s)``.

Per task, like torchmetrics: binary scores go through a sigmoid when some value of the batch lies outside
``[0, 1]``, multiclass scores through a softmax over the classes, multilabel scores through a sigmoid. A column
without a positive (or, for AUROC, without a negative) scores 0 with a warning; for the multiclass average
precision such a class is NaN and is left out of the ``macro`` and ``weighted`` means, as torchmetrics does.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch

from torchmetrics_diff.functional._checks import check_ignore_index, check_positive_int, compiling
from torchmetrics_diff.functional._classification import (
    TASKS,
    _check_labels,
    _check_pair,
    binary_auroc_inputs,
)
from torchmetrics_diff.functional._errors import ShapeMismatchError
from torchmetrics_diff.functional._nan_scores import check_nan_strategy, settle_nans

CURVE_AVERAGES = ("macro", "weighted", "none", None)
MULTILABEL_CURVE_AVERAGES = ("micro", "macro", "weighted", "none", None)
CURVES = ("auroc", "average_precision")


# ------------------------------------------------------------------------------------------------ arguments
def check_curve_args(
    task: Any,
    num_classes: Any = None,
    num_labels: Any = None,
    average: Any = "macro",
    thresholds: Any = None,
    ignore_index: Any = None,
    max_fpr: Any = None,
) -> int:
    """Validate the arguments of AUROC and average precision; return the number of columns (1 for binary).

    Raises:
        ValueError: naming the argument, what was expected and what came; ``thresholds`` and ``max_fpr`` other
            than ``None`` are not supported (the values are exact).
    """
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}; got {task!r}")
    if thresholds is not None:
        raise ValueError(
            "`thresholds` must be None: the value is exact, from every score (binned thresholds are not "
            f"implemented); got {thresholds!r}"
        )
    if max_fpr is not None:
        raise ValueError(f"`max_fpr` must be None (the partial AUROC is not implemented); got {max_fpr!r}")
    check_ignore_index(ignore_index)
    if task == "binary":
        return 1
    choices = MULTILABEL_CURVE_AVERAGES if task == "multilabel" else CURVE_AVERAGES
    if average not in choices:
        raise ValueError(f"`average` must be one of {choices} for task={task!r}; got {average!r}")
    name, value = ("num_classes", num_classes) if task == "multiclass" else ("num_labels", num_labels)
    if value is None:
        raise ValueError(f"`{name}` must be a positive int for task={task!r}; got None")
    return check_positive_int(name, value)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over dim 1, and its limit in a row whose largest score is infinite: the entries at that score
    share the mass (``torch.softmax`` gives NaN there, from ``inf - inf``; an all ``-inf`` row is uniform). A row
    holding a NaN stays NaN, so that ``nan_strategy`` finds it."""
    top = scores.amax(1, keepdim=True)  # NaN in a row with a NaN
    at_top = scores == top
    limit = (at_top / at_top.sum(1, keepdim=True)).to(scores.dtype)
    infinite = torch.isinf(top)
    return torch.where(infinite, limit, torch.softmax(torch.where(infinite, torch.zeros_like(scores), scores), 1))


def _probabilities(scores: torch.Tensor, softmax: bool) -> torch.Tensor:
    """Scores as probabilities: a sigmoid (or a softmax over dim 1) when some value lies outside ``[0, 1]``,
    decided on the device for the whole tensor (as torchmetrics does per batch; a NaN decides nothing)."""
    if not scores.numel():
        return scores
    logits = ((scores < 0) | (scores > 1)).any()
    return torch.where(logits, _softmax(scores) if softmax else torch.sigmoid(scores), scores)


def curve_inputs(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    size: int,
    ignore_index: int | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as the rows the curve metrics keep: probabilities and ``int64`` targets.

    ``binary``: flat scores ``(M,)`` and targets, ignored entries dropped. ``multiclass``: ``(M, C)`` and
    ``(M,)``, extra dimensions folded into rows, rows with an ignored target dropped. ``multilabel``: ``(M, L)``
    and ``(M, L)``, an ignored entry kept with target ``-1`` (a row may be ignored for one label only).

    Raises:
        ValueError: integer ``preds``, shapes that do not fit the task, or (``validate``) targets out of range.
    """
    if task == "binary":
        return binary_auroc_inputs(preds, target, ignore_index, validate)
    multiclass = task == "multiclass"
    _check_pair(preds, target, same_shape=not multiclass)
    if not preds.is_floating_point():
        raise ValueError(f"`preds` must be floating scores (probabilities or logits); got dtype {preds.dtype}")
    name = "num_classes" if multiclass else "num_labels"
    rank = target.ndim + 1 if multiclass else target.ndim
    if preds.ndim < 2 or preds.ndim != rank or preds.shape[1] != size:
        raise ValueError(
            f"`preds` must have shape (N, {name}={size}, ...) for `target` of shape {tuple(target.shape)}; got "
            f"{tuple(preds.shape)}"
        )
    if multiclass and preds.shape[:1] + preds.shape[2:] != target.shape:
        raise ShapeMismatchError(
            f"`preds` (N, C, ...) must match `target` (N, ...) outside dim 1; got preds {tuple(preds.shape)} and "
            f"target {tuple(target.shape)}"
        )
    if validate:
        _check_labels("target", target, size if multiclass else 2, ignore_index)
    scores = preds.movedim(1, -1).reshape(-1, size)
    if multiclass:
        labels = target.reshape(-1).long()
        if ignore_index is not None:
            keep = labels != ignore_index
            scores, labels = scores[keep], labels[keep]
        return _probabilities(scores, softmax=True), labels
    labels = target.movedim(1, -1).reshape(-1, size).long()
    if ignore_index is not None:
        labels = torch.where(labels == ignore_index, -1, labels)
    return _probabilities(scores, softmax=False), labels


# ------------------------------------------------------------------------------------------------ the maths
def _columns(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None, curve: str) -> torch.Tensor:
    """AUROC or average precision of each column of ``(M, K)`` scores (float64), with per-entry ``positive``
    targets and, for multilabel, the ``valid`` (not ignored) entries; NaN where undefined (a column without a
    positive, or for AUROC without a negative)."""
    rows = scores.shape[0]
    scores = scores.detach()
    if valid is not None:  # an ignored entry scores -inf: below every kept score, so it changes no kept rank
        scores = torch.where(valid, scores, float("-inf"))
        positive = positive & valid
        kept = valid.sum(0).to(torch.float64)
    else:
        kept = torch.full(scores.shape[1:], float(rows), dtype=torch.float64, device=scores.device)
    cols, pos = scores.T.contiguous(), positive.T
    ordered, order = cols.sort(dim=1)
    below = torch.searchsorted(ordered, cols)  # (K, M): scores ranked strictly below
    positives = pos.sum(1).to(torch.float64)
    if curve == "auroc":
        through = torch.searchsorted(ordered, cols, right=True)
        mean_rank = (below + through + 1).to(torch.float64) / 2 - (rows - kept).unsqueeze(1)  # among kept only
        rank_sum = torch.where(pos, mean_rank, 0.0).sum(1)
        pairs = positives * (kept - positives)
        auc = (rank_sum - positives * (positives + 1) / 2) / torch.where(pairs > 0, pairs, 1.0)
        return torch.where(pairs > 0, auc, float("nan"))
    cum = torch.cat([pos.new_zeros(pos.shape[0], 1, dtype=torch.int64), pos.gather(1, order).cumsum(1)], 1)
    hits_at_least = positives.unsqueeze(1) - cum.gather(1, below).to(torch.float64)  # positives scoring >= s
    rows_at_least = (rows - below).to(torch.float64)  # kept rows scoring >= s (ignored ones are -inf)
    precision_at = torch.where(pos, hits_at_least / rows_at_least.clamp(min=1), 0.0)
    return torch.where(positives > 0, precision_at.sum(1) / positives.clamp(min=1), float("nan"))


def _warn_undefined(values: torch.Tensor, curve: str, what: str) -> None:
    """torchmetrics' warning for columns whose score is undefined (no positive, or for AUROC no negative)."""
    if compiling() or not values.numel():
        return
    undefined = torch.isnan(values)
    if bool(undefined.any()):
        missing = "positive or no negative" if curve == "auroc" else "positive"
        warnings.warn(
            f"{curve} is undefined for {int(undefined.sum())} {what}(s) with no {missing} target",
            UserWarning,
            stacklevel=3,
        )


def binary_auroc_exact(scores: torch.Tensor, target: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Area under the ROC curve of 1-D scores: the Mann-Whitney statistic with tied scores sharing their mean
    rank, which equals the trapezoidal area under the exact ROC curve. 0 (with a warning) without positives or
    without negatives, like torchmetrics. ``valid``: the entries that count (the others are left out; the kept
    scores must lie above ``-inf``, as probabilities do), or ``None``: all.

    The ranks come from one sort and two binary searches (a score's mean rank among its ties is the mean of the
    first and last positions its value holds in the sorted scores): every shape is the input's, nothing is read
    on the host but the warning's counts, so ``torch.compile`` traces it in one graph (there, without the
    warning).
    """
    dtype = torch.get_default_dtype()
    positive = target == 1
    left_out: Any = 0
    if valid is not None:  # a left-out entry scores -inf: below every kept score, so it changes no kept rank
        positive = positive & valid
        left_out = (~valid).sum()
        scores = torch.where(valid, scores, float("-inf"))
    positives = positive.sum().to(torch.float64)
    negatives = target.numel() - left_out - positives
    if not compiling() and not bool(positives * negatives):
        warnings.warn(
            f"AUROC is undefined with {int(positives)} positive and {int(negatives)} negative targets; returning 0",
            UserWarning,
            stacklevel=2,
        )
        return torch.zeros((), dtype=dtype, device=scores.device)
    scores = scores.detach()
    ordered = scores.sort().values
    below = torch.searchsorted(ordered, scores)  # scores ranked strictly below
    through = torch.searchsorted(ordered, scores, right=True)  # ... below or tied
    mean_rank = (below + through + 1).to(torch.float64) / 2 - left_out  # 1-based, among the kept entries
    rank_sum = torch.where(positive, mean_rank, 0.0).sum()
    pairs = positives * negatives
    auc = (rank_sum - positives * (positives + 1) / 2) / torch.where(pairs > 0, pairs, 1.0)
    return torch.where(pairs > 0, auc, 0.0).to(dtype)


def _binary(scores: torch.Tensor, target: torch.Tensor, curve: str, valid: torch.Tensor | None = None) -> torch.Tensor:
    if curve == "auroc":
        return binary_auroc_exact(scores, target, valid)
    kept = None if valid is None else valid.reshape(-1, 1)
    value = _columns(scores.reshape(-1, 1), (target == 1).reshape(-1, 1), kept, curve)
    _warn_undefined(value, curve, "binary target")
    return torch.nan_to_num(value, nan=0.0).reshape(()).to(torch.get_default_dtype())


#: what ``nan_strategy`` drops, per task: one entry of the NaN mask of :func:`curve_score`
NAN_UNITS = {"binary": "samples", "multiclass": "samples", "multilabel": "(sample, label) entries"}


def _nan_rows(scores: torch.Tensor, task: str, nan_strategy: str, owner: str) -> torch.Tensor | None:
    """The mask of what ``nan_strategy`` drops (a multiclass sample with any NaN class score), or ``None`` when
    nothing is to be dropped; raises or warns as the strategy says (:func:`settle_nans`)."""
    if nan_strategy == "disable":
        return None
    nan = torch.isnan(scores)
    if task == "multiclass":
        nan = nan.any(1)
    return nan if settle_nans(nan, nan_strategy, owner, NAN_UNITS[task], stacklevel=5) else None


def curve_score(
    scores: torch.Tensor,
    target: torch.Tensor,
    task: str,
    size: int,
    average: str | None,
    curve: str,
    nan_strategy: str = "disable",
    owner: str = "",
) -> torch.Tensor:
    """AUROC or average precision (``curve``) of rows formatted by :func:`curve_inputs` (every rank's, gathered).

    ``nan_strategy`` says what NaN scores do (``"disable"``: nothing is checked); ``owner`` is the name its
    messages give (default: ``curve``).

    Returns:
        A tensor in the default dtype: 0-d, or one value per class or label with ``average="none"``.

    Raises:
        ValueError: ``nan_strategy="error"`` and a NaN score.
    """
    dtype = torch.get_default_dtype()
    nan = _nan_rows(scores, task, nan_strategy, owner or curve)
    if task == "binary":
        return _binary(scores, target, curve, None if nan is None else ~nan)
    if task == "multilabel" and nan is not None:
        target = torch.where(nan, -1, target)  # a dropped entry is an ignored one
    if task == "multilabel" and average == "micro":
        kept = target >= 0
        return _binary(scores[kept], target[kept], curve)
    valid: torch.Tensor | None = None
    if task == "multiclass":
        positive = target.unsqueeze(1) == torch.arange(size, device=target.device)
        if nan is not None:
            valid = (~nan).unsqueeze(1).expand_as(positive)
            positive = positive & valid
    else:
        positive, valid = target == 1, target >= 0
    values = _columns(scores, positive, valid, curve)
    _warn_undefined(values, curve, "class" if task == "multiclass" else "label")
    if not (curve == "average_precision" and task == "multiclass"):
        values = torch.nan_to_num(values, nan=0.0)  # torchmetrics' 0 for an undefined column
    if average in ("none", None):
        return values.to(dtype)
    defined = ~torch.isnan(values)
    weights = positive.sum(0).to(torch.float64) if average == "weighted" else torch.ones_like(values)
    weights = torch.where(defined, weights, 0.0)
    total = weights.sum()
    mean = (torch.where(defined, values, 0.0) * weights).sum() / torch.where(total > 0, total, 1.0)
    if average == "macro":  # no defined column: NaN, the mean of nothing
        mean = torch.where(defined.any(), mean, float("nan"))
    return mean.to(dtype)


class CurveArgs(NamedTuple):
    """The arguments of an AUROC or an average precision, as its functions and its metrics check them."""

    task: str
    num_classes: int | None
    num_labels: int | None
    average: str | None
    thresholds: Any
    ignore_index: int | None
    validate_args: bool
    max_fpr: Any = None
    nan_strategy: str = "error"

    def check(self) -> int:
        """:func:`check_curve_args` of these arguments: the number of columns."""
        args = (self.task, self.num_classes, self.num_labels, self.average, self.thresholds, self.ignore_index)
        return check_curve_args(*args, self.max_fpr)


def _curve(curve: str, preds: torch.Tensor, target: torch.Tensor, args: CurveArgs, owner: str = "") -> torch.Tensor:
    """Validate, format and score: the body of every AUROC and average-precision function (``owner``: its name,
    for the messages)."""
    size = args.check()
    nan_strategy = check_nan_strategy(args.nan_strategy)
    scores, labels = curve_inputs(preds, target, args.task, size, args.ignore_index, args.validate_args)
    return curve_score(scores, labels, args.task, size, args.average, curve, nan_strategy, owner)
