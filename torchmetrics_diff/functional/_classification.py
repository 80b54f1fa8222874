"""Classification metrics as pure functions, the tasks' inputs and their stat scores (tp, fp, tn, fn): the
arguments' checks, the input formats, the counts, and the division shared by the scores made from them. The scores
are in ``_classification_scores``, the confusion matrix in ``_confusion_matrix``, AUROC and average precision in
``_curves``.

Inputs follow torchmetrics:

- ``task="binary"``: ``preds`` and ``target`` of the same shape ``(N, ...)``; float ``preds`` are
  probabilities, or logits when any value lies outside ``[0, 1]`` (a sigmoid is applied); a prediction is
  positive when ``preds > threshold``; integer ``preds`` are labels in ``{0, 1}``.
- ``task="multiclass"``: ``preds`` ``(N, C, ...)`` scores (argmax over dim 1) or ``(N, ...)`` labels, ``target``
  ``(N, ...)`` labels in ``[0, C)``.
- ``task="multilabel"``: ``preds`` and ``target`` ``(N, L, ...)``, each label scored as in the binary task.

``ignore_index``: target entries equal to it are left out. Stat scores are integer counts whose sums over
ranks are the global counts, which is why the classification metrics need only ``sum`` states.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from torchmetrics_diff.functional._checks import check_ignore_index, check_positive_int, check_values
from torchmetrics_diff.functional._errors import ShapeMismatchError

TASKS = ("binary", "multiclass", "multilabel")
AVERAGES = ("micro", "macro", "weighted", "none", None)
NORMALIZE = ("true", "pred", "all", "none", None)
MULTIDIM_AVERAGES = ("global", "samplewise")


class StatScores(NamedTuple):
    """The four counts of a classification batch, each ``int64``.

    Each field is 0-d for ``binary`` and of shape ``(C,)`` (``multiclass``, one count per class) or ``(L,)``
    (``multilabel``, one per label); sums over batches and ranks are the counts of the whole data.

    Attributes:
        tp: true positives.
        fp: false positives.
        tn: true negatives.
        fn: false negatives.
    """

    tp: torch.Tensor
    fp: torch.Tensor
    tn: torch.Tensor
    fn: torch.Tensor


# ------------------------------------------------------------------------------------------------ arguments
def check_task_args(
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    average: str | None = "micro",
    ignore_index: int | None = None,
) -> int:
    """Validate the common arguments; return the number of classes/labels (1 for ``binary``).

    Raises:
        ValueError: naming the argument, what was expected and what came.
    """
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}; got {task!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"`threshold` must be a float in [0, 1]; got {threshold!r}")
    if average not in AVERAGES:
        raise ValueError(f"`average` must be one of {AVERAGES}; got {average!r}")
    check_ignore_index(ignore_index)
    if task == "multiclass":
        if num_classes is None:
            raise ValueError("`num_classes` must be a positive int for task='multiclass'; got None")
        return check_positive_int("num_classes", num_classes)
    if task == "multilabel":
        if num_labels is None:
            raise ValueError("`num_labels` must be a positive int for task='multilabel'; got None")
        return check_positive_int("num_labels", num_labels)
    return 1


def check_multidim_args(task: str, top_k: Any, multidim_average: Any, num_classes: int | None) -> None:
    """``top_k`` (an int in ``[1, num_classes]``, above 1 for multiclass only) and ``multidim_average``.

    Raises:
        ValueError: naming the argument, what was expected and what came.
    """
    if multidim_average not in MULTIDIM_AVERAGES:
        raise ValueError(f"`multidim_average` must be one of {MULTIDIM_AVERAGES}; got {multidim_average!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"`top_k` must be a positive int; got {top_k!r}")
    if top_k > 1 and task != "multiclass":
        raise ValueError(f"`top_k` above 1 needs task='multiclass'; got top_k={top_k} with task={task!r}")
    if task == "multiclass" and num_classes is not None and top_k > num_classes:
        raise ValueError(f"`top_k` must be at most num_classes={num_classes}; got {top_k}")


def _check_pair(preds: Any, target: Any, same_shape: bool = True) -> None:
    """Both real tensors (and, with ``same_shape``, of one shape)."""
    for name, value in (("preds", preds), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(value).__name__}")
        if value.is_complex():
            raise ValueError(f"`{name}` must be a real tensor; got dtype {value.dtype}")
    if same_shape and preds.shape != target.shape:
        raise ShapeMismatchError(
            f"`preds` and `target` must have the same shape; got preds {tuple(preds.shape)} "
            f"and target {tuple(target.shape)}"
        )


def _check_labels(name: str, values: torch.Tensor, high: int, ignore_index: int | None) -> None:
    """Every value an integer in ``[0, high)`` (or ``ignore_index``)."""
    if values.is_floating_point():
        raise ValueError(f"`{name}` must hold integer labels; got dtype {values.dtype}")
    if not values.numel():
        return
    bad = (values < 0) | (values >= high)
    if ignore_index is not None:
        bad &= values != ignore_index
    extra = f" or {ignore_index} (ignore_index)" if ignore_index is not None else ""
    check_values(
        bad, f"`{name}` values must lie in [0, {high - 1}]{extra}", lambda: f"found {values[bad][:5].tolist()}"
    )


def _probabilities(scores: torch.Tensor) -> torch.Tensor:
    """Float scores as probabilities: torchmetrics takes a batch for logits (sigmoid) when any value lies outside
    ``[0, 1]``. Decided on the device (a ``where`` over the batch): no host read, nothing for ``torch.compile``
    to branch on."""
    if not scores.numel():
        return scores
    logits = ((scores < 0) | (scores > 1)).any()
    return torch.where(logits, torch.sigmoid(scores), scores)


def _binary_preds(preds: torch.Tensor, threshold: float, validate: bool) -> torch.Tensor:
    """Boolean predictions from probabilities, logits or labels."""
    if preds.is_floating_point():
        return _probabilities(preds) > threshold
    if validate:
        _check_labels("preds", preds, 2, None)
    return preds.to(torch.bool)


def _flat_kept(
    preds: torch.Tensor, target: torch.Tensor, ignore_index: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``preds`` and ``target``, the entries whose target is ``ignore_index`` dropped."""
    p, t = preds.reshape(-1), target.reshape(-1)
    if ignore_index is not None:
        keep = t != ignore_index
        p, t = p[keep], t[keep]
    return p, t


# --------------------------------------------------------------------------------------------- stat scores
def _two_class_format(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int | None,
    threshold: float,
    ignore_index: int | None,
    validate: bool,
    samplewise: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Boolean predictions and targets, and the mask of kept entries (``None``: all): flat for ``binary``
    (``num_labels=None``), ``(M, L)`` for multilabel (extra dims folded into rows). ``samplewise``: ``(X, N)``
    and ``(X, N, L)``, the extra dims first, so that counts over dim 0 are each sample's."""
    _check_pair(preds, target)
    if num_labels is not None and (preds.ndim < 2 or preds.shape[1] != num_labels):
        raise ValueError(f"`preds` must have shape (N, num_labels={num_labels}, ...); got {tuple(preds.shape)}")
    if samplewise and preds.ndim < (2 if num_labels is None else 3):
        least = "(N, ...) with 2" if num_labels is None else "(N, L, ...) with 3"
        raise ValueError(
            f"`preds` must have shape {least} dims or more with multidim_average='samplewise'; got {tuple(preds.shape)}"
        )
    if validate:
        _check_labels("target", target, 2, ignore_index)
    n = preds.shape[0]
    extra = math.prod(preds.shape[1 if num_labels is None else 2 :])  # explicit: a rank's batch may be empty

    def rows(x: torch.Tensor) -> torch.Tensor:
        if num_labels is None:
            return x.reshape(n, extra).T if samplewise else x.reshape(-1)
        x = x.movedim(1, -1)
        return x.reshape(n, extra, num_labels).transpose(0, 1) if samplewise else x.reshape(-1, num_labels)

    keep = None if ignore_index is None else rows(target != ignore_index)
    return rows(_binary_preds(preds, threshold, validate)), rows(target == 1), keep


def _top_k_labels(scores: torch.Tensor, target: torch.Tensor, top_k: int) -> torch.Tensor:
    """torchmetrics' top-k prediction: the target where it is among the ``top_k`` highest scores, else the top
    score's class (so that a sample counts as one prediction, right or wrong)."""
    top = scores.topk(top_k, dim=1).indices
    hit = (top == target.unsqueeze(1).to(top.dtype)).any(1)
    return torch.where(hit, target.to(top.dtype), top[:, 0])


def _multiclass_labels(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    ignore_index: int | None,
    validate: bool,
    top_k: int = 1,
    flat: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Predicted and target labels (``int64``) and the mask of kept entries (``None``: all): flat, or ``(N, X)``
    (one row per sample) with ``flat=False``."""
    _check_pair(preds, target, same_shape=False)
    if preds.ndim == target.ndim + 1:
        if preds.shape[1] != num_classes or preds.shape[:1] + preds.shape[2:] != target.shape:
            raise ValueError(
                f"`preds` scores must have shape (N, num_classes={num_classes}, ...) matching `target` "
                f"{tuple(target.shape)}; got {tuple(preds.shape)}"
            )
        if not preds.is_floating_point():
            raise ValueError(f"`preds` scores of shape (N, C, ...) must be floating; got dtype {preds.dtype}")
        preds = preds.argmax(1) if top_k == 1 else _top_k_labels(preds, target, top_k)
    elif top_k > 1:
        raise ValueError(
            f"`top_k`={top_k} needs `preds` scores of shape (N, num_classes={num_classes}, ...); got labels of "
            f"shape {tuple(preds.shape)}"
        )
    elif preds.shape == target.shape:
        if validate:
            _check_labels("preds", preds, num_classes, None)
    else:
        raise ShapeMismatchError(
            f"`preds` must have shape (N, num_classes, ...) (scores) or the shape of `target` (labels); got preds "
            f"{tuple(preds.shape)} and target {tuple(target.shape)}"
        )
    if validate:
        _check_labels("target", target, num_classes, ignore_index)
    shape = (-1,) if flat else (target.shape[0], math.prod(target.shape[1:]))  # explicit: N may be 0
    p, t = preds.reshape(shape).long(), target.reshape(shape).long()
    return p, t, (None if ignore_index is None else t != ignore_index)


def _multiclass_samplewise(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    ignore_index: int | None,
    validate: bool,
    top_k: int,
) -> StatScores:
    """Each sample's per-class counts, ``(N, C)`` each, over the sample's extra dimensions."""
    if target.ndim < 2:
        raise ValueError(
            f"`target` must have shape (N, ...) with 2 dims or more with multidim_average='samplewise'; got "
            f"{tuple(target.shape)}"
        )
    p, t, keep = _multiclass_labels(preds, target, num_classes, ignore_index, validate, top_k, flat=False)
    if keep is not None:  # an ignored target may be any int: one-hot encode class 0, then mask it out
        t = torch.where(keep, t, 0)
    classes = torch.arange(num_classes, device=t.device)

    def one_hot(x: torch.Tensor) -> torch.Tensor:  # (N, X) labels -> (X, N, C) booleans
        return (x.unsqueeze(-1) == classes).transpose(0, 1)

    mask = None if keep is None else keep.transpose(0, 1).unsqueeze(-1)
    return _masked_counts(one_hot(p), one_hot(t), mask)


def multiclass_confusion_counts(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    ignore_index: int | None = None,
    validate: bool = True,
    top_k: int = 1,
) -> torch.Tensor:
    """The ``(C, C)`` ``int64`` confusion matrix, rows the target class, columns the predicted one.

    Every entry is counted into a fixed ``C * C`` bins, an ignored one with weight 0 (no entry is dropped, no
    shape depends on the data: ``torch.compile`` traces it in one graph).
    """
    p, t, keep = _multiclass_labels(preds, target, num_classes, ignore_index, validate, top_k)
    cell = t * num_classes + p
    ones = torch.ones_like(cell)
    if keep is not None:  # an ignored target may be any int (-100): count it in cell 0 with weight 0
        cell, ones = torch.where(keep, cell, 0), keep.to(torch.int64)
    counts = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=cell.device)
    return counts.scatter_add_(0, cell, ones).reshape(num_classes, num_classes)


def _masked_counts(p: torch.Tensor, t: torch.Tensor, keep: torch.Tensor | None) -> StatScores:
    """Counts over dim 0 (all of a 1-D input), of the kept entries only."""
    neg_p, neg_t = ~p, ~t
    if keep is not None:  # masking both prediction sides masks every combination
        p, neg_p = p & keep, neg_p & keep

    def count(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0, dtype=torch.int64)

    return StatScores(count(p & t), count(p & neg_t), count(neg_p & neg_t), count(neg_p & t))


def stat_scores(
    preds: torch.Tensor,
    target: torch.Tensor,
    task: str,
    threshold: float = 0.5,
    num_classes: int | None = None,
    num_labels: int | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
    top_k: int = 1,
    multidim_average: str = "global",
) -> StatScores:
    """True positives, false positives, true negatives and false negatives of a batch.

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
        ignore_index: target entries equal to it are left out. Default ``None``.
        validate_args: check that the labels lie in their range (one pass over the batch). Default ``True``.

        top_k: ``multiclass`` with scores only: a sample is right when its target is among its ``top_k`` highest
            scores (it then predicts the target, else its top class, as torchmetrics). Default 1.
        multidim_average: ``"global"`` (default: extra dimensions folded into the batch) or ``"samplewise"``
            (counts per sample over its extra dimensions; needs ``(N, X, ...)`` inputs).

    Returns:
        A :class:`StatScores` of ``int64`` tensors: 0-d for ``binary``, one count per class (``multiclass``,
        ``(C,)``) or per label (``multilabel``, ``(L,)``); ``samplewise`` puts a leading ``(N,)`` in front.

    Raises:
        ValueError: an unknown ``task`` or ``multidim_average``, a ``threshold`` outside ``[0, 1]``, a missing or
            non-positive ``num_classes``/``num_labels``, a ``top_k`` below 1, above ``num_classes`` or above 1
            outside multiclass scores, tensors of mismatched shapes, or (with ``validate_args``) labels out of
            range.

    Example:
        >>> import torch
        >>> stat_scores(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2]), "multiclass", num_classes=3)
        StatScores(tp=tensor([1, 1, 1]), fp=tensor([0, 0, 1]), tn=tensor([3, 2, 2]), fn=tensor([0, 1, 0]))
    """
    size = check_task_args(task, threshold, num_classes, num_labels, "micro", ignore_index)
    check_multidim_args(task, top_k, multidim_average, num_classes)
    samplewise = multidim_average == "samplewise"
    if task != "multiclass":
        labels = size if task == "multilabel" else None
        formatted = _two_class_format(preds, target, labels, threshold, ignore_index, validate_args, samplewise)
        return _masked_counts(*formatted)
    if samplewise:
        return _multiclass_samplewise(preds, target, size, ignore_index, validate_args, top_k)
    confmat = multiclass_confusion_counts(preds, target, size, ignore_index, validate_args, top_k)
    tp = confmat.diagonal()
    fp = confmat.sum(0) - tp
    fn = confmat.sum(1) - tp
    return StatScores(tp, fp, confmat.sum() - tp - fp - fn, fn)


def binary_auroc_inputs(
    preds: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat float scores (sigmoid applied to logits, as torchmetrics does) and ``int64`` targets, ignored left out.

    Raises:
        ValueError: different shapes, non-floating ``preds``, or targets outside ``{0, 1}`` (and ``ignore_index``).
    """
    _check_pair(preds, target)
    if not preds.is_floating_point():
        raise ValueError(f"`preds` must be floating scores (probabilities or logits); got dtype {preds.dtype}")
    if validate:
        _check_labels("target", target, 2, ignore_index)
    p, t = _flat_kept(preds, target, ignore_index)
    return _probabilities(p), t.long()


# ------------------------------------------------------------------------------------------------- division
def _divide(num: torch.Tensor, denom: torch.Tensor, zero_division: float = 0.0) -> torch.Tensor:
    """``num / denom`` in the default float dtype, ``zero_division`` where ``denom == 0`` (counts: no gradient)."""
    denom = denom.to(torch.get_default_dtype())
    return torch.where(denom == 0, float(zero_division), num.to(denom.dtype) / denom)
