"""``ClasswiseWrapper``: a per-class metric's value as a dict, one key per class."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member
from torchmetrics_diff.wrappers._inner import _InnerWrapper
from torchmetrics_diff.wrappers.minmax import _check_metric


class ClasswiseWrapper(_InnerWrapper):
    """Spread a metric's per-class value (``average=None``) over a dict with one key per class.

    Keys are ``f"{prefix}{label}{postfix}"``; without ``prefix`` and ``postfix`` the prefix is the inner metric's
    class name in lower case followed by ``_``, and the labels are ``0, 1, ...`` unless ``labels`` names them.
    Inside a :class:`~torchmetrics_diff.MetricCollection` the keys join the collection's results.

    Args:
        metric: a metric whose value is a 1-D tensor of one entry per class.
        labels: the name of each class. Default ``None``: the class index.
        prefix: put before every label. Default ``None``.
        postfix: put after every label. Default ``None``.

    Returns:
        ``forward`` and ``compute`` return ``{key: 0-d tensor}``, in class order.

    Raises:
        ValueError: ``metric`` is not a metric, ``labels`` is not a list of strings, or ``prefix`` / ``postfix``
            is not a string.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Accuracy
        >>> from torchmetrics_diff.wrappers import ClasswiseWrapper
        >>> metric = ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None), labels=["a", "b", "c"])
        >>> metric(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))
        {'accuracy_a': tensor(1.), 'accuracy_b': tensor(0.5000), 'accuracy_c': tensor(1.)}
    """

    def __init__(
        self,
        metric: Metric,
        labels: list[str] | None = None,
        prefix: str | None = None,
        postfix: str | None = None,
    ) -> None:
        super().__init__()
        self.metric = _check_metric(metric, "metric")
        if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
            raise ValueError(f"`labels` must be None or a list of strings; got {labels!r}")
        for name, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"`{name}` must be None or a string; got {type(value).__name__}")
        self.labels = labels
        self._prefix = prefix
        self._postfix = postfix

    def _inner(self) -> Metric:
        return self.metric

    def _members(self) -> dict[str, Member]:
        return {"metric": self.metric}

    def _affixes(self) -> tuple[str, str]:
        if self._prefix or self._postfix:
            return self._prefix or "", self._postfix or ""
        return f"{type(self.metric).__name__.lower()}_", ""

    def result_keys(self) -> list[str] | None:
        """The keys of the value, known before any update: from ``labels``, or else from the inner metric's
        ``num_classes`` (``num_labels`` for a multilabel metric); ``None`` when neither is known.

        A :class:`~torchmetrics_diff.MetricCollection` uses them to give each class a tensor-valued view in
        ``items()``, so that Lightning's ``self.log_dict(collection)`` logs one value per class.

        Example:
            >>> from torchmetrics_diff import Accuracy
            >>> from torchmetrics_diff.wrappers import ClasswiseWrapper
            >>> ClasswiseWrapper(Accuracy(task="multiclass", num_classes=2, average=None)).result_keys()
            ['accuracy_0', 'accuracy_1']
        """
        if self.labels is not None:
            names: list[Any] = list(self.labels)
        else:
            count = next(
                (n for n in (getattr(self.metric, a, None) for a in ("num_classes", "num_labels")) if _is_count(n)),
                None,
            )
            if count is None:
                return None
            names = list(range(count))
        prefix, postfix = self._affixes()
        return [f"{prefix}{name}{postfix}" for name in names]

    def _convert(self, value: torch.Tensor) -> dict[str, torch.Tensor]:
        prefix, postfix = self._affixes()
        names = self.labels if self.labels is not None else range(len(value))
        return {f"{prefix}{name}{postfix}": v for name, v in zip(names, value)}

    def _step_value(self, values: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self._convert(values["metric"])

    def _compute_value(self) -> dict[str, torch.Tensor]:
        return self._convert(self.metric.compute())


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
