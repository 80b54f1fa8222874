"""``MultitaskWrapper``: one metric (or collection) per task, fed by dicts of predictions and targets."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from copy import deepcopy
from typing import Any

from torch import nn

from torchmetrics_diff._torchmetrics import synced_hint
from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member, WrapperMetric

#: the ``Args`` and ``Raises`` of ``update`` and ``forward``
_BATCH = """Args:
    task_preds: task name -> that task's predictions.
    task_targets: task name -> that task's targets.

Raises:
    ValueError: the dicts' keys are not the tasks."""


class MultitaskWrapper(WrapperMetric):
    """Metrics of several tasks driven as one: ``update(task_preds, task_targets)`` with a dict per argument.

    Every task's states are synced in the same single collective (a collection among the tasks joins it for
    ``compute``; its ``forward`` syncs on its own).

    Args:
        task_metrics: task name -> a metric or a :class:`~torchmetrics_diff.MetricCollection`.
        prefix: put before every task name in the results. Default ``None``.
        postfix: put after every task name in the results. Default ``None``.

    Returns:
        ``forward`` and ``compute`` return ``{f"{prefix}{task}{postfix}": value}``; a collection's value is its
        dict.

    Raises:
        TypeError: ``task_metrics`` is not a dict of metrics and collections.
        ValueError: ``prefix`` or ``postfix`` is not a string; ``update`` got other tasks than ``task_metrics``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Accuracy, MeanSquaredError
        >>> from torchmetrics_diff.wrappers import MultitaskWrapper
        >>> metrics = MultitaskWrapper({"cls": Accuracy(task="binary"), "reg": MeanSquaredError()})
        >>> preds = {"cls": torch.tensor([1, 0, 1]), "reg": torch.tensor([1.0, 2.0])}
        >>> targets = {"cls": torch.tensor([1, 1, 1]), "reg": torch.tensor([1.0, 4.0])}
        >>> {k: round(v.item(), 4) for k, v in metrics(preds, targets).items()}
        {'cls': 0.6667, 'reg': 2.0}
    """

    is_differentiable = False

    def __init__(
        self,
        task_metrics: dict[str, Metric | MetricCollection],
        prefix: str | None = None,
        postfix: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(task_metrics, dict):
            raise TypeError(f"`task_metrics` must be a dict of metrics; got {type(task_metrics).__name__}")
        for task, metric in task_metrics.items():
            if not isinstance(metric, (Metric, MetricCollection)):
                raise TypeError(
                    f"`task_metrics[{task!r}]` must be a Metric or a MetricCollection; got {type(metric).__name__}"
                    f"{synced_hint(metric)}"
                )
        for name, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"`{name}` must be None or a string; got {type(value).__name__}")
        self.task_metrics = nn.ModuleDict(task_metrics)
        self._prefix = prefix or ""
        self._postfix = postfix or ""

    def _members(self) -> dict[str, Member]:
        return dict(self.task_metrics.items())  # type: ignore[arg-type]  # (checked in __init__)

    def result_keys(self) -> list[str] | None:
        """The keys of the value (the task names with the wrapper's prefix and postfix) when every task's value is a
        tensor, else ``None`` (a task holding a collection or a dict-valued metric): a
        :class:`~torchmetrics_diff.MetricCollection` holding the wrapper then gives each task a tensor-valued view
        in ``items()``, which Lightning's ``self.log_dict(collection)`` logs.

        Example:
            >>> from torchmetrics_diff import MeanMetric, SumMetric
            >>> from torchmetrics_diff.wrappers import MultitaskWrapper
            >>> MultitaskWrapper({"a": MeanMetric(), "b": SumMetric()}, prefix="task/").result_keys()
            ['task/a', 'task/b']
        """
        members = self._members()
        if any(not isinstance(m, Metric) or hasattr(m, "result_keys") for m in members.values()):
            return None
        return [self._key(task) for task in members]

    def _key(self, task: str) -> str:
        return f"{self._prefix}{task}{self._postfix}"

    def _check_tasks(self, task_preds: Any, task_targets: Any) -> None:
        for name, given in (("task_preds", task_preds), ("task_targets", task_targets)):
            if not isinstance(given, dict) or set(given) != set(self.task_metrics):
                keys = sorted(given) if isinstance(given, dict) else type(given).__name__
                raise ValueError(f"`{name}` must be a dict with the tasks {sorted(self.task_metrics)}; got {keys}")

    @shared_docs(batch=_BATCH)
    def update(self, task_preds: dict[str, Any], task_targets: dict[str, Any]) -> None:
        """Update every task's metric with its predictions and targets.

        {batch}
        """
        self._check_tasks(task_preds, task_targets)
        super().update(task_preds, task_targets)

    @shared_docs(batch=_BATCH)
    def forward(self, task_preds: dict[str, Any], task_targets: dict[str, Any]) -> dict[str, Any]:
        """Update every task's metric and return each task's value of the batch.

        {batch}
        """
        self._check_tasks(task_preds, task_targets)
        return super().forward(task_preds, task_targets)

    def _route(self, key: str, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return (args[0][key], args[1][key]), {}

    def _step_value(self, values: dict[str, Any]) -> dict[str, Any]:
        return {self._key(task): value for task, value in values.items()}

    def _compute_value(self) -> dict[str, Any]:
        return {self._key(task): metric.compute() for task, metric in self._members().items()}

    def plot(self, val: Any = None, axes: Any = None) -> list[tuple[Any, Any]]:  # type: ignore[override]
        """One figure per task, as torchmetrics' ``MultitaskWrapper.plot``: each task's metric (or collection)
        draws its own value.

        Args:
            val: a value as ``compute()`` or ``forward`` return it (a dict by task key), a sequence of them, or
                ``None`` for ``compute()``.
            axes: a sequence of matplotlib ``Axes``, one per task, or ``None`` for new figures.

        Returns:
            A list of what each task's ``plot`` returns (a collection's is a list of its own), in task order.

        Raises:
            TypeError: ``axes`` is not a sequence, or ``val`` neither a dict nor a sequence of dicts.
            ValueError: ``axes`` does not hold one axes per task.
            ModuleNotFoundError: matplotlib is not installed.
        """
        if axes is not None:
            if not isinstance(axes, Sequence):
                raise TypeError(f"`axes` must be a sequence of matplotlib axes; got {type(axes).__name__}")
            if len(axes) != len(self.task_metrics):
                raise ValueError(f"`axes` must hold one axes per task ({len(self.task_metrics)}); got {len(axes)}")
        val = self.compute() if val is None else val
        if not isinstance(val, (dict, Sequence)):
            raise TypeError(f"`val` must be None, a dict by task or a sequence of them; got {type(val).__name__}")
        out = []
        for i, (task, metric) in enumerate(self._members().items()):
            key = self._key(task)
            mine = val[key] if isinstance(val, dict) else [v[key] for v in val]
            out.append(metric.plot(mine, ax=None if axes is None else axes[i]))
        return out

    def items(self, flatten: bool = True) -> Iterator[tuple[str, Any]]:
        """``(key, metric)`` pairs; with ``flatten`` a collection's members as ``f"{prefix}{task}_{name}{postfix}"``.

        Args:
            flatten: spread collections into their members. Default ``True``.
        """
        for task, metric in self.task_metrics.items():
            if flatten and isinstance(metric, MetricCollection):
                for name, member in metric.items():
                    yield f"{self._prefix}{task}_{name}{self._postfix}", member
            else:
                yield self._key(task), metric

    def keys(self, flatten: bool = True) -> Iterator[str]:
        """The keys of :meth:`items`.

        Args:
            flatten: spread collections into their members. Default ``True``.
        """
        for key, _ in self.items(flatten):
            yield key

    def values(self, flatten: bool = True) -> Iterator[Any]:
        """The metrics of :meth:`items`.

        Args:
            flatten: spread collections into their members. Default ``True``.
        """
        for _, metric in self.items(flatten):
            yield metric

    def clone(self, prefix: str | None = None, postfix: str | None = None) -> MultitaskWrapper:
        """A deep copy with a new prefix and postfix (``None``: none, as torchmetrics).

        Args:
            prefix: the copy's prefix. Default ``None``.
            postfix: the copy's postfix. Default ``None``.

        Raises:
            ValueError: ``prefix`` or ``postfix`` is not a string.
        """
        for name, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"`{name}` must be None or a string; got {type(value).__name__}")
        new = deepcopy(self)
        new._prefix, new._postfix = prefix or "", postfix or ""
        return new
