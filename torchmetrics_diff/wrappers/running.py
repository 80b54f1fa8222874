"""``Running``: a metric over the last ``window`` updates only; ``RunningMean`` and ``RunningSum``."""

from __future__ import annotations

from copy import deepcopy
from typing import Any, cast

from torch import nn

from torchmetrics_diff.aggregation import MeanMetric, NanStrategy, SumMetric
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member
from torchmetrics_diff.wrappers._inner import _InnerWrapper
from torchmetrics_diff.wrappers.minmax import _check_metric


class Running(_InnerWrapper):
    """``base_metric`` over the last ``window`` updates (or ``forward`` calls) only.

    Each update fills one of ``window`` slots (a copy of the metric, the oldest overwritten); ``compute`` merges
    the slots' states by their reductions (:meth:`~torchmetrics_diff.Metric.merge_state`) and computes the
    metric of the merge. ``forward`` returns the batch's value, as the inner metric's ``forward`` does (synced
    when it has ``dist_sync_on_step=True``, with its gradient). Under DDP the slots of every rank are synced in
    one collective before the merge, so the value is that of the last ``window`` updates of every rank.

    Args:
        base_metric: a metric whose states merge by their reductions (``full_state_update=False``); only its
            copies are updated.
        window: the number of updates kept. Default 5.

    Raises:
        ValueError: ``base_metric`` is not a metric or has ``full_state_update`` not ``False``, or ``window`` is
            not a positive int.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import SumMetric
        >>> from torchmetrics_diff.wrappers import Running
        >>> metric = Running(SumMetric(), window=2)
        >>> [metric(torch.tensor(float(i))).item() for i in range(4)]
        [0.0, 1.0, 2.0, 3.0]
        >>> metric.compute()  # the last two updates: 2 + 3
        tensor(5.)
    """

    def __init__(self, base_metric: Metric, window: int = 5) -> None:
        super().__init__()
        _check_metric(base_metric, "base_metric")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"`window` must be a positive int; got {window!r}")
        if base_metric.full_state_update is not False:
            raise ValueError(
                f"`base_metric` must have full_state_update=False (its states merge by their reductions); "
                f"{type(base_metric).__name__} has {base_metric.full_state_update}"
            )
        self.base_metric = base_metric
        self.window = window
        self._slots = nn.ModuleList([deepcopy(base_metric) for _ in range(window)])
        self._num_vals_seen = 0

    def _inner(self) -> Metric:
        return self.base_metric

    def _members(self) -> dict[str, Member]:
        return {str(i): m for i, m in enumerate(self._slots)}  # type: ignore[misc]  # (copies of a Metric)

    def _current(self) -> Metric:
        return self._slots[self._num_vals_seen % self.window]  # type: ignore[return-value]

    def _step_members(self) -> dict[str, Member]:
        return {"current": self._current()}  # one key whatever the slot: the step sync keeps its plan

    def _start_step(self) -> Any:
        slot = self._current()
        saved = slot._snapshot()
        slot.reset()
        return saved

    def _undo_step(self, undo: Any) -> None:
        self._current()._restore(undo)

    def _end_step(self) -> None:
        self._num_vals_seen += 1

    def _extra_snapshot(self) -> Any:
        return self._num_vals_seen

    def _restore_extra(self, extra: Any) -> None:
        self._num_vals_seen = extra

    def _compute_value(self) -> Any:
        merged = self.base_metric
        merged.reset()
        try:
            for slot in self._members().values():  # (a slot's states are every rank's when synced)
                merged.merge_state(dict(cast(Metric, slot).metric_state))
            return merged._batch_value()  # the merge's value, without a sync of its own
        finally:
            merged.reset()

    def reset(self) -> None:
        """Empty the window."""
        super().reset()
        self._num_vals_seen = 0


class _Aggregation(Running):
    """``Running`` of an aggregation metric (:attr:`_aggregation`) made from the arguments."""

    _aggregation: type[MeanMetric | SumMetric]

    def __init__(self, window: int = 5, nan_strategy: NanStrategy = "warn", **kwargs: Any) -> None:
        super().__init__(self._aggregation(nan_strategy=nan_strategy, **kwargs), window=window)


def _doc(summary: str, inner: str, window: int, updates: int, comment: str, value: str) -> str:
    """The docstring of ``Running<inner>``: ``summary`` of the last ``window`` updates, and an example that
    updates it ``updates`` times, then prints ``value`` (what ``comment`` says it is)."""
    name = f"Running{inner.removesuffix('Metric')}"
    return f"""{summary} of the last ``window`` updates: ``Running({inner}(...), window)``.

    Args:
        window: the number of updates kept. Default 5.
        nan_strategy: as :class:`~torchmetrics_diff.{inner}`'s. Default ``"warn"``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments of the inner ``{inner}``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.wrappers import {name}
        >>> metric = {name}(window={window})
        >>> for i in range({updates}):
        ...     _ = metric(torch.tensor([float(i)]))
        >>> metric.compute()  # {comment}
        {value}
    """


class RunningMean(_Aggregation):
    __doc__ = _doc("The weighted mean", "MeanMetric", 3, 6, "the mean of 3, 4 and 5", "tensor(4.)")
    _aggregation = MeanMetric


class RunningSum(_Aggregation):
    __doc__ = _doc("The sum", "SumMetric", 2, 4, "2 + 3", "tensor(5.)")
    _aggregation = SumMetric
