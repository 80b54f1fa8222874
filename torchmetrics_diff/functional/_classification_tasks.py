"""The task forms of the stat-score functions, with torchmetrics' names, argument order and defaults
(``average="macro"`` for multiclass and multilabel): ``binary_accuracy``, ``multiclass_f1_score``, ... Each is
the generic function with its task fixed, compiled by :func:`_task_function` from its name: its parameters from
the table of the task's form (:data:`_FORMS`), its docstring from its signature, the argument descriptions and the
example shared with the task classes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchmetrics_diff.functional._classification import check_task_args, stat_scores
from torchmetrics_diff.functional._classification_docs import (
    ARGS,
    INPUTS,
    WHAT,
    args_section,
    compose,
    function_example,
    params,
    section,
    task_of,
)
from torchmetrics_diff.functional._classification_scores import _score, stack_stat_scores
from torchmetrics_diff.functional._confusion_matrix import confusion_matrix
from torchmetrics_diff.functional._signatures import REQUIRED, define, keywords, param

#: the parameters after ``preds`` and ``target`` of each task form, in torchmetrics' order; precision, recall and
#: F1 add ``zero_division``
_FORMS = {
    "binary": ("threshold", "multidim_average", "ignore_index", "validate_args"),
    "multiclass": ("num_classes", "average", "top_k", "multidim_average", "ignore_index", "validate_args"),
    "multilabel": ("num_labels", "threshold", "average", "multidim_average", "ignore_index", "validate_args"),
}
_MATRIX_FORMS = {
    "binary": ("threshold", "normalize", "ignore_index", "validate_args"),
    "multiclass": ("num_classes", "normalize", "ignore_index", "validate_args"),
    "multilabel": ("num_labels", "threshold", "normalize", "ignore_index", "validate_args"),
}
_ZERO_DIVISION = ("precision", "recall", "f1_score")
_INPUTS = (param("preds", "torch.Tensor"), param("target", "torch.Tensor"))
#: a task function requires its size (but for torchmetrics' ``multiclass_accuracy``)
_SIZES = {"num_classes": ("int", REQUIRED), "num_labels": ("int", REQUIRED)}

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


def _task_function(name: str) -> Callable[..., torch.Tensor]:
    """The task function ``name`` (``binary_accuracy``): its signature, its docstring (the summary, its generic
    function and task; its arguments, from its signature; what it returns and raises; its example) and its body,
    :func:`_call`."""
    task = task_of(name)
    generic = name.removeprefix(f"{task}_")
    form = (_MATRIX_FORMS if generic == "confusion_matrix" else _FORMS)[task]
    names = (*form, "zero_division") if generic in _ZERO_DIVISION else form
    sizes = {} if name == "multiclass_accuracy" else _SIZES
    signature = [*_INPUTS, *params(names, **sizes)]
    fn = define(name, signature, "torch.Tensor", globals(), f"_call({name!r}, {keywords(signature)})")
    what = WHAT[generic]
    summary = (
        f"{what[0].upper()}{what[1:]} of a {task} batch.\n\n"
        f'    :func:`{generic}` with ``task="{task}"``, in torchmetrics\' argument order. No collective.'
    )
    returns = _RETURNS.get(generic) or f"{_MATRIX[task]} ``int64`` counts, or floating when normalized."
    docs = {**ARGS, **INPUTS[task]}
    sections = (args_section(fn, docs), section("Returns", returns), section("Raises", _RAISES))
    fn.__doc__ = compose(summary, *sections, tail=function_example(name))
    return fn


def _call(name: str, preds: torch.Tensor, target: torch.Tensor, **arguments: Any) -> torch.Tensor:
    """The body of the task function ``name``: its generic function with its task and its arguments."""
    task = task_of(name)
    generic = name.removeprefix(f"{task}_")
    if generic == "confusion_matrix":
        return confusion_matrix(preds, target, task, **arguments)
    args = _TASK_ARGS[task](**arguments)
    if generic == "stat_scores":
        return _stacked(preds, target, args)
    return _score("f1" if generic == "f1_score" else generic, preds, target, *args)


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


_TASK_ARGS: dict[str, Callable[..., _ScoreArgs]] = {
    "binary": _binary,
    "multiclass": _multiclass,
    "multilabel": _multilabel,
}


def _stacked(preds: torch.Tensor, target: torch.Tensor, args: _ScoreArgs) -> torch.Tensor:
    """The stat scores in torchmetrics' stacked form, with ``_score``'s arguments (``zero_division`` unused)."""
    task, threshold, num_classes, num_labels, average, ignore_index, validate_args, _, top_k, multidim_average = args
    check_task_args(task, threshold, num_classes, num_labels, average, ignore_index)
    task_args = (task, threshold, num_classes, num_labels, ignore_index, validate_args, top_k, multidim_average)
    return stack_stat_scores(stat_scores(preds, target, *task_args), task, average)


binary_accuracy = _task_function("binary_accuracy")
multiclass_accuracy = _task_function("multiclass_accuracy")
multilabel_accuracy = _task_function("multilabel_accuracy")
binary_precision = _task_function("binary_precision")
multiclass_precision = _task_function("multiclass_precision")
multilabel_precision = _task_function("multilabel_precision")
binary_recall = _task_function("binary_recall")
multiclass_recall = _task_function("multiclass_recall")
multilabel_recall = _task_function("multilabel_recall")
binary_f1_score = _task_function("binary_f1_score")
multiclass_f1_score = _task_function("multiclass_f1_score")
multilabel_f1_score = _task_function("multilabel_f1_score")
binary_specificity = _task_function("binary_specificity")
multiclass_specificity = _task_function("multiclass_specificity")
multilabel_specificity = _task_function("multilabel_specificity")
binary_stat_scores = _task_function("binary_stat_scores")
multiclass_stat_scores = _task_function("multiclass_stat_scores")
multilabel_stat_scores = _task_function("multilabel_stat_scores")
binary_confusion_matrix = _task_function("binary_confusion_matrix")
multiclass_confusion_matrix = _task_function("multiclass_confusion_matrix")
multilabel_confusion_matrix = _task_function("multilabel_confusion_matrix")
