"""The arguments of the classification task forms (``binary_accuracy``, ``MulticlassAUROC``, ...), each written
once: its annotation and default (:data:`PARAMS`) and its description (:data:`ARGS`); the inputs and values of
their examples; and the helpers that build a task form's docstring from its own signature: the ``Args`` section
lists the parameters in the signature's order, so a docstring cannot drift from its signature."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchmetrics_diff.functional._signatures import param

TASKS = ("binary", "multiclass", "multilabel")

#: the annotation and default of each argument of the task forms (``nan_strategy`` is keyword only)
PARAMS: dict[str, tuple[str, Any]] = {
    "threshold": ("float", 0.5),
    "num_classes": ("int | None", None),
    "num_labels": ("int | None", None),
    "top_k": ("int", 1),
    "average": ("str | None", "macro"),
    "multidim_average": ("str", "global"),
    "ignore_index": ("int | None", None),
    "validate_args": ("bool", True),
    "zero_division": ("float", 0),
    "normalize": ("str | None", None),
    "max_fpr": ("Any", None),
    "thresholds": ("Any", None),
    "normalization": ("str | None", "sigmoid"),
    "nan_strategy": ("str", "error"),
}


def params(names: Iterable[str], **overrides: tuple[str, Any]) -> list[inspect.Parameter]:
    """The parameters ``names`` of a task form, as :data:`PARAMS` has them or as ``overrides`` says (``num_classes``
    of a task function: ``("int", REQUIRED)``)."""
    return [param(name, *overrides.get(name, PARAMS[name]), keyword_only=name == "nan_strategy") for name in names]


#: one description per argument of the task forms, shared by the task classes and the task functions
ARGS = {
    "threshold": "a probability above it is a positive prediction (logits go through a sigmoid first). Default 0.5.",
    "num_classes": "number of classes ``C`` (required).",
    "num_labels": "number of labels ``L`` (required).",
    "top_k": "right when the target is among the ``top_k`` highest scores (needs ``(N, C, ...)`` scores). Default 1.",
    "average": '``"macro"`` (default, as in torchmetrics), ``"micro"``, ``"weighted"`` or ``"none"``/``None``.',
    "multidim_average": '``"global"`` (default) or ``"samplewise"`` (one value per sample).',
    "ignore_index": "target value whose entries are left out. Default ``None``.",
    "validate_args": "check that labels lie in their range. Default ``True``.",
    "zero_division": "``0`` (default) or ``1``, the score where its denominator is zero.",
    "normalize": '``None`` (default: counts), ``"true"``, ``"pred"`` or ``"all"``.',
    "max_fpr": "only ``None`` (no partial AUROC). Default ``None``.",
    "thresholds": "only ``None`` (exact values; binning is not implemented). Default ``None``.",
    "normalization": 'only ``"sigmoid"`` (the default: logits go through a sigmoid).',
    "nan_strategy": (
        '``"error"`` (default: a NaN score in ``preds`` raises at ``compute``), ``"warn"`` (its sample, or '
        'multilabel entry, dropped with a warning giving the count), ``"ignore"`` (dropped silently) or '
        '``"disable"`` (no check). Keyword only. See :class:`~torchmetrics_diff.AUROC`.'
    ),
    "kwargs": "the :class:`~torchmetrics_diff.Metric` keyword arguments.",
}

#: what each metric measures, by its generic function's name, as a task form's summary names it
WHAT = {
    "accuracy": "accuracy",
    "precision": "precision ``tp / (tp + fp)``",
    "recall": "recall ``tp / (tp + fn)``",
    "f1_score": "F1 score ``2 tp / (2 tp + fp + fn)``",
    "specificity": "specificity ``tn / (tn + fp)``",
    "stat_scores": "stat scores ``[tp, fp, tn, fn, support]`` (torchmetrics' stacked form)",
    "confusion_matrix": "confusion matrix",
    "auroc": "exact AUROC",
    "average_precision": "exact average precision",
}

#: ``average`` of the AUROC and average-precision task forms (no ``"micro"`` for multiclass)
CURVE_AVERAGE = {
    "multiclass": '``"macro"`` (default), ``"weighted"`` (by positives) or ``"none"``/``None``.',
    "multilabel": '``"macro"`` (default), ``"micro"``, ``"weighted"`` (by positives) or ``"none"``/``None``.',
}

#: ``preds`` and ``target`` of a task function, per task
INPUTS = {
    "binary": {
        "preds": "``(N, ...)`` probabilities, logits (a sigmoid when some value lies outside ``[0, 1]``) or integer "
        "labels.",
        "target": "integer labels in ``{0, 1}`` of the shape of ``preds``.",
    },
    "multiclass": {
        "preds": "``(N, C, ...)`` floating scores or ``(N, ...)`` integer labels.",
        "target": "integer labels ``(N, ...)`` in ``[0, C)``.",
    },
    "multilabel": {
        "preds": "``(N, L, ...)`` probabilities, logits or integer labels.",
        "target": "integer labels in ``{0, 1}`` of the shape of ``preds``.",
    },
}

#: the inputs of the task forms' examples, per task: ``preds`` and ``target``, as source
EXAMPLE_INPUTS = {
    "binary": ("torch.tensor([0.9, 0.2, 0.7, 0.4])", "torch.tensor([1, 1, 0, 0])"),
    "multiclass": ("torch.tensor([0, 2, 1, 2])", "torch.tensor([0, 1, 1, 2])"),
    "multilabel": ("torch.tensor([[0.8, 0.1], [0.3, 0.9], [0.6, 0.4]])", "torch.tensor([[1, 0], [1, 1], [0, 1]])"),
}
#: the multiclass inputs of the AUROC and average-precision examples: scores, not labels
CURVE_INPUTS = (
    "torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])",
    "torch.tensor([0, 1, 2, 1])",
)
#: the size an example passes, per task
EXAMPLE_SIZES = {"binary": "", "multiclass": "num_classes=3", "multilabel": "num_labels=2"}
#: the value of each example, by generic name and task (the task function's and the task class's: one value)
EXAMPLE_VALUES = {
    "accuracy": ("tensor(0.5000)", "tensor(0.8333)", "tensor(0.5000)"),
    "precision": ("tensor(0.5000)", "tensor(0.8333)", "tensor(0.7500)"),
    "recall": ("tensor(0.5000)", "tensor(0.8333)", "tensor(0.5000)"),
    "f1_score": ("tensor(0.5000)", "tensor(0.7778)", "tensor(0.5833)"),
    "specificity": ("tensor(0.5000)", "tensor(0.8889)", "tensor(0.5000)"),
    "stat_scores": (
        "tensor([1, 1, 1, 1, 2])",
        "tensor([1.0000, 0.3333, 2.3333, 0.3333, 1.3333])",
        "tensor([1.0000, 0.5000, 0.5000, 1.0000, 2.0000])",
    ),
    "confusion_matrix": (
        "tensor([[1, 1],\n        [1, 1]])",
        "tensor([[1, 0, 0],\n        [0, 1, 1],\n        [0, 0, 1]])",
        "tensor([[[0, 1],\n         [1, 1]],\n<BLANKLINE>\n        [[1, 0],\n         [1, 1]]])",
    ),
    "auroc": ("tensor(0.5000)", "tensor(0.9583)", "tensor(0.7500)"),
    "average_precision": ("tensor(0.7500)", "tensor(0.9444)", "tensor(0.9167)"),
}

_WIDTH = 120  # the line length of the source the docstrings stand for


def task_of(name: str) -> str:
    """The task a task form's name starts with (``"multiclass"`` for ``MulticlassAUROC`` or
    ``multiclass_accuracy``)."""
    return next(task for task in TASKS if name.lower().startswith(task))


def _fill(text: str, indent: int, hanging: bool = True) -> str:
    """``text`` wrapped at the source's width, indented by ``indent`` (the lines after the first by 4 more when
    ``hanging``: an ``Args`` entry); an inline literal (````a b````) is never broken."""
    glued = re.sub(r"``[^`]*``", lambda m: m.group(0).replace(" ", "\0"), text)
    lines = textwrap.wrap(
        glued,
        _WIDTH,
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent + 4 * hanging),
        break_long_words=False,
        break_on_hyphens=False,
    )
    return "\n".join(lines).replace("\0", " ")


def section(title: str, body: str) -> str:
    """A Google-style section (``Returns:``, ``Raises:``) of a docstring, ``body`` wrapped below its title (a
    ``Raises`` entry, ``ValueError: ...``, with its continuation lines indented)."""
    return f"    {title}:\n{_fill(body, 8, hanging=title == 'Raises')}"


def args_section(obj: Callable[..., Any], docs: Mapping[str, str]) -> str:
    """The ``Args:`` section of ``obj`` (a function or a class): each parameter of its signature, in order, with
    its description from ``docs``.

    Raises:
        KeyError: a parameter that ``docs`` does not describe.
    """
    lines = [_fill(f"{name}: {docs[name]}", 8) for name in inspect.signature(obj).parameters]
    return "    Args:\n" + "\n".join(lines)


def compose(summary: str, *sections: str, tail: str | None) -> str:
    """A docstring: ``summary``, then each section, then ``tail`` (the object's own docstring: its example),
    in the layout of a docstring written in the source (the lines after the first indented by 4)."""
    parts = [summary.strip(), *sections]
    if tail:  # a docstring of a module-level object: its lines after the first are indented by 4 already
        parts.append("    " + tail.strip())
    return "\n\n".join(parts) + "\n"


def function_example(name: str) -> str:
    """The ``Example`` section of a task function (``binary_accuracy``): its inputs, its call, its value."""
    task = task_of(name)
    preds, target = EXAMPLE_INPUTS[task]
    size = EXAMPLE_SIZES[task] and f", {EXAMPLE_SIZES[task]}"
    value = EXAMPLE_VALUES[name.removeprefix(f"{task}_")][TASKS.index(task)]
    return _example(f">>> preds, target = {preds}, {target}", f">>> {name}(preds, target{size})", value=value)


def class_example(name: str, generic: str) -> str:
    """The ``Example`` section of a task class (``MultilabelAUROC``, its generic name ``auroc``): the import, the
    inputs (one a line for 2-D scores), the metric, its value."""
    task = task_of(name)
    curve = task == "multiclass" and generic in ("auroc", "average_precision")
    preds, target = CURVE_INPUTS if curve else EXAMPLE_INPUTS[task]
    inputs = [f">>> preds, target = {preds}, {target}"]
    if "[[" in preds:
        inputs = [">>> preds, target = (", f"...     {preds},", f"...     {target},", "... )"]
    lines = (
        f">>> from torchmetrics_diff.classification import {name}",
        *inputs,
        f">>> metric = {name}({EXAMPLE_SIZES[task]})",
    )
    return _example(*lines, ">>> metric(preds, target)", value=EXAMPLE_VALUES[generic][TASKS.index(task)])


def _example(*lines: str, value: str) -> str:
    return "Example:\n" + "\n".join(f"        {line}" for line in (">>> import torch", *lines, *value.splitlines()))
