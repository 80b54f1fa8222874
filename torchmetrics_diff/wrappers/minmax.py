"""``MinMaxMetric``: a scalar metric with the lowest and highest values it has taken."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff._torchmetrics import synced_hint
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member, WrapperMetric


def _check_metric(value: Any, name: str) -> Metric:
    if not isinstance(value, Metric):
        raise ValueError(f"`{name}` must be a torchmetrics_diff Metric; got {type(value).__name__}{synced_hint(value)}")
    return value


class MinMaxMetric(WrapperMetric):
    """The value of ``base_metric`` with the minimum and maximum it has taken since the last reset.

    Every value the wrapper returns — each ``forward`` (the batch's value) and each ``compute()`` (the value of
    every batch since the reset) — moves the bounds. The inner metric is synced as it is configured
    (``dist_sync_on_step`` for the batch value, ``sync_on_compute`` for ``compute``), in one collective.

    Args:
        base_metric: a metric whose value is a scalar (a 0-d or one-element tensor, or a number).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Returns:
        ``forward`` and ``compute`` return ``{"raw": value, "max": highest, "min": lowest}`` (0-d tensors).

    ``state_dict()`` holds the bounds, ``min_val`` and ``max_val`` (whatever ``persistent()`` says; the inner
    metric's states only when persistent), and ``load_state_dict`` restores them. A state dict saved without them
    (before they were saved) still loads, ``strict`` or not: the bounds then keep their values, ``inf`` and
    ``-inf`` in a new wrapper, and restart from the next value. :meth:`reset` resets them (torchmetrics keeps
    them).

    Raises:
        ValueError: ``base_metric`` is not a metric.
        RuntimeError: the inner metric's value is not a scalar.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Accuracy
        >>> from torchmetrics_diff.wrappers import MinMaxMetric
        >>> metric = MinMaxMetric(Accuracy(task="binary"))
        >>> metric(torch.tensor([1, 0, 1]), torch.tensor([1, 1, 1]))["raw"]
        tensor(0.6667)
        >>> out = metric(torch.tensor([1, 1, 1]), torch.tensor([1, 1, 1]))
        >>> {k: round(v.item(), 4) for k, v in out.items()}
        {'raw': 1.0, 'max': 1.0, 'min': 0.6667}
        >>> {k: round(v.item(), 4) for k, v in metric.compute().items()}
        {'raw': 0.8333, 'max': 1.0, 'min': 0.6667}
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, base_metric: Metric, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._base_metric = _check_metric(base_metric, "base_metric")
        self.min_val = torch.tensor(float("inf"))
        self.max_val = torch.tensor(float("-inf"))

    @property
    def higher_is_better(self) -> bool | None:  # type: ignore[override]
        """The inner metric's ``higher_is_better``."""
        return self._base_metric.higher_is_better

    @property
    def is_differentiable(self) -> bool | None:  # type: ignore[override]
        """The inner metric's ``is_differentiable``."""
        return self._base_metric.is_differentiable

    def _members(self) -> dict[str, Member]:
        return {"base": self._base_metric}

    def _kwargs_target(self) -> Metric:
        return self._base_metric

    def result_keys(self) -> list[str]:
        """The keys of the value: a :class:`~torchmetrics_diff.MetricCollection` holding the metric gives each a
        tensor-valued view in ``items()``, which Lightning's ``self.log_dict(collection)`` logs.

        Example:
            >>> from torchmetrics_diff import MeanMetric
            >>> from torchmetrics_diff.wrappers import MinMaxMetric
            >>> MinMaxMetric(MeanMetric()).result_keys()
            ['raw', 'max', 'min']
        """
        return ["raw", "max", "min"]

    def _bounded(self, value: Any) -> dict[str, torch.Tensor]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = torch.tensor(float(value))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise RuntimeError(f"MinMaxMetric needs a scalar value from the inner metric; got {shape}")
        flat = value.detach().reshape(())
        dtype = torch.promote_types(self.min_val.dtype, flat.dtype) if flat.is_floating_point() else self.min_val.dtype
        lo, hi = self.min_val.to(flat.device, dtype), self.max_val.to(flat.device, dtype)
        if not torch.isnan(flat):  # a NaN value moves neither bound (as a comparison with NaN is false)
            lo, hi = torch.minimum(lo, flat.to(dtype)), torch.maximum(hi, flat.to(dtype))
        self.min_val, self.max_val = lo, hi
        return {"raw": value, "max": self.max_val, "min": self.min_val}

    def _step_value(self, values: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self._bounded(values["base"])

    def _compute_value(self) -> dict[str, torch.Tensor]:
        return self._bounded(self._base_metric.compute())

    def _extra_snapshot(self) -> Any:
        return self.min_val, self.max_val

    def _restore_extra(self, extra: Any) -> None:
        self.min_val, self.max_val = extra

    # min_val and max_val are saved whatever `persistent` says (torchmetrics' main branch saves them too): they are
    # the wrapper's record of past values, which a checkpoint would otherwise lose. The inner metric's states follow
    # `persistent` as any metric's. A state dict saved before the bounds were (no min_val / max_val) loads too,
    # strict or not: the bounds then keep their values (inf and -inf in a new wrapper) and restart from the next value.
    _saved_attributes = ("min_val", "max_val")

    def reset(self) -> None:
        """Reset the inner metric and the bounds (to ``inf`` and ``-inf``)."""
        super().reset()
        self.min_val = torch.tensor(float("inf"))
        self.max_val = torch.tensor(float("-inf"))
