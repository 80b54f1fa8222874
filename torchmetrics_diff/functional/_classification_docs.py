"""The argument descriptions of the classification task forms (``binary_accuracy``, ``MulticlassAUROC``, ...),
each written once, and the helpers that build a task form's docstring from its own signature: the ``Args``
section lists the parameters in the signature's order, so a docstring cannot drift from its signature."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

TASKS = ("binary", "multiclass", "multilabel")

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
