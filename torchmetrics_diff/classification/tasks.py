"""The task classes torchmetrics users import (``BinaryAccuracy``, ``MulticlassF1Score``, ...): each is the
generic class (:class:`~torchmetrics_diff.Accuracy`, ...) with its task fixed and torchmetrics' signature and
defaults (``average="macro"`` for the multiclass and multilabel classes, as torchmetrics' task classes), so that
an ``isinstance`` check against the generic class holds and the states, syncs and values are the generic ones.
Here the stat-score and confusion-matrix classes; the AUROC and average-precision ones are in ``auroc_tasks``.

A task class is ``class <Task><Generic>(_TaskClass, <Generic>)``: :class:`_TaskClass` finds the signature of its
form in a table (:data:`_FORMS`), compiles its ``__init__`` from it, and builds its docstring from that
signature, the shared argument descriptions and the example shared with the task function."""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any, NamedTuple

from torchmetrics_diff.classification import stat_scores as generic
from torchmetrics_diff.classification.auroc import AUROC, AveragePrecision, _CurveMetric
from torchmetrics_diff.functional._classification_docs import (
    ARGS,
    CURVE_AVERAGE,
    WHAT,
    args_section,
    class_example,
    compose,
    params,
    section,
    task_of,
)
from torchmetrics_diff.functional._signatures import KWARGS, SELF, define

_RAISES = "ValueError: a bad or unsupported argument, naming it; in ``update``, inputs that do not fit the task."


class _Form(NamedTuple):
    """The signature of a task class and how its ``__init__`` calls the generic one."""

    params: tuple[str, ...]  # in torchmetrics' order; ``**kwargs`` follows
    #: the generic ``__init__``'s arguments after the task that go by position, each the class's or else its
    #: default in ``generic``; the class's others go by keyword. ``None``: all by keyword, the task too
    positional: tuple[str, ...] | None = None
    generic: Any = None  # the generic ``__init__``, whose defaults fill the arguments a class does not take


def _by_position(init: Any, *params: str) -> _Form:
    """The form ``params`` whose ``__init__`` passes every argument of the generic ``init`` by position."""
    return _Form(params, tuple(inspect.signature(init).parameters)[2:-1], init)  # after self and task, before kwargs


def _stat(*params: str) -> _Form:
    return _by_position(generic._StatScoresMetric.__init__, *params)


def _matrix(*params: str) -> _Form:
    return _by_position(generic.ConfusionMatrix.__init__, *params)


_BINARY = ("threshold", "multidim_average", "ignore_index", "validate_args")
_MULTICLASS = ("num_classes", "top_k", "average", "multidim_average", "ignore_index", "validate_args")
_MULTILABEL = ("num_labels", "threshold", "average", "multidim_average", "ignore_index", "validate_args")
_CURVE = ("average", "thresholds", "ignore_index", "validate_args", "nan_strategy")
#: the form of each task class, by the generic class it is a task of (the first in its ``__mro__`` found here)
#: and its task: the stat scores (``zero_division`` for precision, recall and F1), the confusion matrix, AUROC and
#: average precision (by keyword, but for binary: their positional orders differ)
_FORMS = {
    (generic._StatScoresMetric, "binary"): _stat(*_BINARY),
    (generic._StatScoresMetric, "multiclass"): _stat(*_MULTICLASS),
    (generic._StatScoresMetric, "multilabel"): _stat(*_MULTILABEL),
    (generic._ZeroDivision, "binary"): _stat(*_BINARY, "zero_division"),
    (generic._ZeroDivision, "multiclass"): _stat(*_MULTICLASS, "zero_division"),
    (generic._ZeroDivision, "multilabel"): _stat(*_MULTILABEL, "zero_division"),
    (generic.ConfusionMatrix, "binary"): _matrix("threshold", "ignore_index", "normalize", "validate_args"),
    (generic.ConfusionMatrix, "multiclass"): _matrix("num_classes", "ignore_index", "normalize", "validate_args"),
    (generic.ConfusionMatrix, "multilabel"): _matrix(
        "num_labels", "threshold", "ignore_index", "normalize", "validate_args"
    ),
    (AUROC, "binary"): _Form(
        ("max_fpr", "thresholds", "ignore_index", "validate_args", "nan_strategy"), ("ignore_index", "validate_args")
    ),
    (AveragePrecision, "binary"): _Form(
        ("thresholds", "ignore_index", "validate_args", "normalization", "nan_strategy"), ("thresholds",)
    ),
    (_CurveMetric, "multiclass"): _Form(("num_classes", *_CURVE)),
    (_CurveMetric, "multilabel"): _Form(("num_labels", *_CURVE)),
}


def _form(base: type, task: str) -> _Form:
    """The form of the task class of generic class ``base`` and task ``task``."""
    return next(_FORMS[family, task] for family in base.__mro__ if (family, task) in _FORMS)


class _TaskClass:
    """The first base of a task class ``class <Task><Generic>(_TaskClass, <Generic>)``: when such a class is
    created, its ``__init__`` is compiled from its form and its docstring built (:meth:`__init_subclass__`).
    The ``__init__`` here, which passes everything on, is the one type checkers see; the compiled one calls it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    def __init_subclass__(cls, check: str = "", **kwargs: Any) -> None:
        """Compile the ``__init__`` of the new task class and build its docstring.

        Args:
            check: a statement its ``__init__`` runs first, naming an argument that the generic class does not
                take (not passed on), in the namespace of the class's module.
            kwargs: ``__init_subclass__``'s keyword arguments.
        """
        super().__init_subclass__(**kwargs)
        if _TaskClass not in cls.__bases__:  # a subclass of a task class keeps what it inherits
            return
        base, task = cls.__bases__[-1], task_of(cls.__name__)
        form = _form(base, task)
        if form.positional is None:
            passed = [f"task={task!r}"]
        else:
            defaults = inspect.signature(form.generic).parameters if form.generic else {}
            passed = [repr(task)] + [n if n in form.params else repr(defaults[n].default) for n in form.positional]
        checked = re.findall(r"\w+", check)
        passed += [f"{n}={n}" for n in form.params if n not in (*(form.positional or ()), *checked)]
        call = f"super({cls.__name__}, self).__init__({', '.join([*passed, '**kwargs'])})"
        signature = [SELF, *params(form.params), KWARGS]
        namespace = vars(sys.modules[cls.__module__])
        body = (check, call) if check else (call,)
        cls.__init__ = define(f"{cls.__name__}.__init__", signature, "None", namespace, *body)  # type: ignore[method-assign]
        cls.__doc__ = _doc(cls, base, task)


def _doc(cls: type, base: type, task: str) -> str:
    """A task class's docstring: the summary (its generic class and task), its arguments (from its signature),
    what it raises, then its example."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base.__name__).lower()  # F1Score: f1_score
    summary = (
        f"The {WHAT[name]} of a {task} task: :class:`~torchmetrics_diff.{base.__name__}` with\n"
        f'    ``task="{task}"`` and torchmetrics\' signature.'
    )
    docs = {**ARGS, "average": CURVE_AVERAGE[task]} if issubclass(cls, _CurveMetric) and task != "binary" else ARGS
    sections = (args_section(cls, docs), section("Raises", _RAISES))
    return compose(summary, *sections, tail=class_example(cls.__name__, name))


# -------------------------------------------------------------------------------------- the task classes
class BinaryAccuracy(_TaskClass, generic.Accuracy): ...


class MulticlassAccuracy(_TaskClass, generic.Accuracy): ...


class MultilabelAccuracy(_TaskClass, generic.Accuracy): ...


class BinaryPrecision(_TaskClass, generic.Precision): ...


class MulticlassPrecision(_TaskClass, generic.Precision): ...


class MultilabelPrecision(_TaskClass, generic.Precision): ...


class BinaryRecall(_TaskClass, generic.Recall): ...


class MulticlassRecall(_TaskClass, generic.Recall): ...


class MultilabelRecall(_TaskClass, generic.Recall): ...


class BinaryF1Score(_TaskClass, generic.F1Score): ...


class MulticlassF1Score(_TaskClass, generic.F1Score): ...


class MultilabelF1Score(_TaskClass, generic.F1Score): ...


class BinarySpecificity(_TaskClass, generic.Specificity): ...


class MulticlassSpecificity(_TaskClass, generic.Specificity): ...


class MultilabelSpecificity(_TaskClass, generic.Specificity): ...


class BinaryStatScores(_TaskClass, generic.StatScores): ...


class MulticlassStatScores(_TaskClass, generic.StatScores): ...


class MultilabelStatScores(_TaskClass, generic.StatScores): ...


class BinaryConfusionMatrix(_TaskClass, generic.ConfusionMatrix): ...


class MulticlassConfusionMatrix(_TaskClass, generic.ConfusionMatrix): ...


class MultilabelConfusionMatrix(_TaskClass, generic.ConfusionMatrix): ...


# the legend of a value per class or per label, as torchmetrics names it ("Class 0", "Label 0", ...)
_LEGENDS: dict[type, str] = {
    **dict.fromkeys(
        (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score, MulticlassSpecificity), "Class"
    ),
    **dict.fromkeys(
        (MultilabelAccuracy, MultilabelPrecision, MultilabelRecall, MultilabelF1Score, MultilabelSpecificity), "Label"
    ),
}
for _cls, _legend in _LEGENDS.items():
    _cls.plot_legend_name = _legend  # type: ignore[attr-defined]
del _cls, _legend
