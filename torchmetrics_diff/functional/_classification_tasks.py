"""The task forms of the stat-score functions, with torchmetrics' names, argument order and defaults
(``average="macro"`` for multiclass and multilabel): ``binary_accuracy``, ``multiclass_f1_score``, ... Each is
the generic function with its task fixed; its docstring is built by :func:`_task_doc` from its signature and the
argument descriptions shared with the task classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from torchmetrics_diff.functional._classification import check_task_args, stat_scores
from torchmetrics_diff.functional._classification_docs import (
    ARGS,
    INPUTS,
    WHAT,
    args_section,
    compose,
    section,
    task_of,
)
from torchmetrics_diff.functional._classification_scores import _score, stack_stat_scores
from torchmetrics_diff.functional._confusion_matrix import confusion_matrix

_F = TypeVar("_F", bound=Callable[..., Any])

_SCORE = (
    'A floating tensor in the default dtype: 0-d, ``(C,)``/``(L,)`` with ``average="none"``, a leading ``(N,)`` when '
    "samplewise."
)
_RETURNS = {
    **dict.fromkeys(("accuracy", "precision", "recall", "f1_score", "specificity"), _SCORE),
    "stat_scores": 'Shape ``(5,)``, ``(C, 5)``/``(L, 5)`` with ``average="none"``, a leading ``(N,)`` when samplewise; '
    '``int64``, or floating for ``"macro"`` and ``"weighted"``.',
}
_MATRIX = {"binary": "``(2, 2)``", "multiclass": "``(C, C)``", "multilabel": "``(L, 2, 2)``"}
_RAISES = "ValueError: a bad argument, naming it; inputs that do not fit the task."


def _task_doc(fn: _F) -> _F:
    """Give a task function its docstring: the summary (its generic function and task), its arguments (from its
    signature), what it returns and raises, then its own docstring (the example)."""
    task = task_of(fn.__name__)
    generic = fn.__name__.removeprefix(f"{task}_")
    what = WHAT[generic]
    summary = (
        f"{what[0].upper()}{what[1:]} of a {task} batch.\n\n"
        f'    :func:`{generic}` with ``task="{task}"``, in torchmetrics\' argument order. No collective.'
    )
    returns = _RETURNS.get(generic) or f"{_MATRIX[task]} ``int64`` counts, or floating when normalized."
    docs = {**ARGS, **INPUTS[task]}
    sections = (args_section(fn, docs), section("Returns", returns), section("Raises", _RAISES))
    fn.__doc__ = compose(summary, *sections, tail=fn.__doc__)
    return fn


# the arguments of ``_score`` after ``preds`` and ``target``: the generic form's, its task fixed
_ScoreArgs = tuple[str, float, "int | None", "int | None", "str | None", "int | None", bool, float, int, str]


def _binary(
    threshold: float, multidim_average: str, ignore_index: int | None, validate_args: bool, zero_division: float = 0
) -> _ScoreArgs:
    return ("binary", threshold, None, None, "micro", ignore_index, validate_args, zero_division, 1, multidim_average)


def _multiclass(
    num_classes: int | None,
    average: str | None,
    top_k: int,
    multidim_average: str,
    ignore_index: int | None,
    validate_args: bool,
    zero_division: float = 0,
) -> _ScoreArgs:
    task_args = ("multiclass", 0.5, num_classes, None, average, ignore_index, validate_args)
    return (*task_args, zero_division, top_k, multidim_average)


def _multilabel(
    num_labels: int,
    threshold: float,
    average: str | None,
    multidim_average: str,
    ignore_index: int | None,
    validate_args: bool,
    zero_division: float = 0,
) -> _ScoreArgs:
    task_args = ("multilabel", threshold, None, num_labels, average, ignore_index, validate_args)
    return (*task_args, zero_division, 1, multidim_average)


def _stacked(preds: torch.Tensor, target: torch.Tensor, args: _ScoreArgs) -> torch.Tensor:
    """The stat scores in torchmetrics' stacked form, with ``_score``'s arguments (``zero_division`` unused)."""
    task, threshold, num_classes, num_labels, average, ignore_index, validate_args, _, top_k, multidim_average = args
    check_task_args(task, threshold, num_classes, num_labels, average, ignore_index)
    task_args = (task, threshold, num_classes, num_labels, ignore_index, validate_args, top_k, multidim_average)
    return stack_stat_scores(stat_scores(preds, target, *task_args), task, average)


@_task_doc
def binary_accuracy(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_accuracy(preds, target)
        tensor(0.5000)
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args)
    return _score("accuracy", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_accuracy(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args)
    return _score("accuracy", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_accuracy(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args)
    return _score("accuracy", preds, target, *args)


@_task_doc
def binary_precision(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_precision(preds, target)
        tensor(0.5000)
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args, zero_division)
    return _score("precision", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_precision(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args, zero_division)
    return _score("precision", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_precision(preds, target, num_labels=2)
        tensor(0.7500)
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args, zero_division)
    return _score("precision", preds, target, *args)


@_task_doc
def binary_recall(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_recall(preds, target)
        tensor(0.5000)
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args, zero_division)
    return _score("recall", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_recall(preds, target, num_classes=3)
        tensor(0.8333)
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args, zero_division)
    return _score("recall", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_recall(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args, zero_division)
    return _score("recall", preds, target, *args)


@_task_doc
def binary_f1_score(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
    zero_division: float = 0,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_f1_score(preds, target)
        tensor(0.5000)
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args, zero_division)
    return _score("f1", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_f1_score(preds, target, num_classes=3)
        tensor(0.7778)
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args, zero_division)
    return _score("f1", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_f1_score(preds, target, num_labels=2)
        tensor(0.5833)
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args, zero_division)
    return _score("f1", preds, target, *args)


@_task_doc
def binary_specificity(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_specificity(preds, target)
        tensor(0.5000)
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args)
    return _score("specificity", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_specificity(preds, target, num_classes=3)
        tensor(0.8889)
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args)
    return _score("specificity", preds, target, *args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_specificity(preds, target, num_labels=2)
        tensor(0.5000)
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args)
    return _score("specificity", preds, target, *args)


@_task_doc
def binary_stat_scores(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_stat_scores(preds, target)
        tensor([1, 1, 1, 1, 2])
    """
    args = _binary(threshold, multidim_average, ignore_index, validate_args)
    return _stacked(preds, target, args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_stat_scores(preds, target, num_classes=3)
        tensor([1.0000, 0.3333, 2.3333, 0.3333, 1.3333])
    """
    args = _multiclass(num_classes, average, top_k, multidim_average, ignore_index, validate_args)
    return _stacked(preds, target, args)


@_task_doc
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
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]]), torch.tensor([[1, 0], [1, 1], [0, 1]])
        >>> multilabel_stat_scores(preds, target, num_labels=2)
        tensor([1.0000, 0.5000, 0.5000, 1.0000, 2.0000])
    """
    args = _multilabel(num_labels, threshold, average, multidim_average, ignore_index, validate_args)
    return _stacked(preds, target, args)


@_task_doc
def binary_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    threshold: float = 0.5,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4]), torch.tensor([1, 1, 0, 0])
        >>> binary_confusion_matrix(preds, target)
        tensor([[1, 1],
                [1, 1]])
    """
    return confusion_matrix(preds, target, "binary", threshold, None, None, normalize, ignore_index, validate_args)


@_task_doc
def multiclass_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 1, 2])
        >>> multiclass_confusion_matrix(preds, target, num_classes=3)
        tensor([[1, 0, 0],
                [0, 1, 1],
                [0, 0, 1]])
    """
    return confusion_matrix(preds, target, "multiclass", 0.5, num_classes, None, normalize, ignore_index, validate_args)


@_task_doc
def multilabel_confusion_matrix(
    preds: torch.Tensor,
    target: torch.Tensor,
    num_labels: int,
    threshold: float = 0.5,
    normalize: str | None = None,
    ignore_index: int | None = None,
    validate_args: bool = True,
) -> torch.Tensor:
    """
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
