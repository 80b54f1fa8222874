"""``MetricTracker``: a fresh copy of a metric (or collection) per epoch, and the best epoch."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from copy import deepcopy
from typing import Any, Union, cast

import torch

from torchmetrics_diff._torchmetrics import synced_hint
from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member, WrapperMetric
from torchmetrics_diff.wrappers.classwise import ClasswiseWrapper

Best = Union[float, None, dict[str, Union[float, None]]]


#: the ``Args`` and ``Raises`` of ``update`` and ``forward``
_BATCH = """Args:
    args: the batch, as the tracked metric's ``update`` takes it.
    kwargs: the batch's keyword arguments.

Raises:
    ValueError: before the first :meth:`increment`."""


class MetricTracker(WrapperMetric):
    """Track a metric or collection over epochs: :meth:`increment` starts a new copy, :meth:`compute_all` returns
    every epoch's value and :meth:`best_metric` the best one.

    ``update``, ``forward``, ``compute`` and ``reset`` act on the latest copy; :meth:`compute_all` syncs every
    copy's states in one collective. As in torchmetrics, ``tracker[0]`` is the metric given (never updated),
    ``tracker[i]`` the copy of epoch ``i`` and ``tracker[-1]`` the latest; ``len(tracker)`` is
    ``n_steps + 1``.

    Args:
        metric: the metric or :class:`~torchmetrics_diff.MetricCollection` to track.
        maximize: whether higher is better: a bool, or one per member of a collection (a ``ClasswiseWrapper``
            member counts once per class). Default ``None``: the metrics' ``higher_is_better``.

    Raises:
        TypeError: ``metric`` is neither a metric nor a collection.
        ValueError: ``maximize`` is not a bool or a list of bools, or its length does not match the collection.
        AttributeError: ``maximize`` is ``None`` and a metric has no ``higher_is_better``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanSquaredError
        >>> from torchmetrics_diff.wrappers import MetricTracker
        >>> tracker = MetricTracker(MeanSquaredError())
        >>> for epoch in range(3):
        ...     tracker.increment()
        ...     tracker.update(torch.tensor([float(epoch)]), torch.tensor([1.0]))
        >>> tracker.compute_all()
        tensor([1., 0., 1.])
        >>> tracker.best_metric(return_step=True)
        (0.0, 1)
    """

    def __init__(self, metric: Metric | MetricCollection, maximize: bool | list[bool] | None = None) -> None:
        super().__init__()
        if not isinstance(metric, (Metric, MetricCollection)):
            raise TypeError(
                f"`metric` must be a Metric or a MetricCollection; got {type(metric).__name__}{synced_hint(metric)}"
            )
        self._base_metric = metric
        self.maximize = self._maximize(metric, maximize)
        self._increment_called = False
        # epoch key -> (its update counts, its value): a finished epoch's value, reused by compute_all while the
        # counts are unchanged, so that a compute_all after each increment syncs the latest epoch only (under a
        # fixed name: the steady state) instead of a growing set of epochs (a new sync layout every epoch)
        self._values: dict[str, tuple[Any, Any]] = {}

    @staticmethod
    def _maximize(metric: Metric | MetricCollection, maximize: bool | list[bool] | None) -> bool | list[bool]:
        if maximize is None:
            if isinstance(metric, Metric):
                if metric.higher_is_better is None:
                    raise AttributeError(
                        f"{type(metric).__name__} has no `higher_is_better`; pass `maximize` to MetricTracker"
                    )
                return bool(metric.higher_is_better)
            out: list[bool] = []
            for name, member in metric.items():
                if member.higher_is_better is None:
                    raise AttributeError(f"member {name!r} has no `higher_is_better`; pass `maximize` to MetricTracker")
                classes = getattr(member.metric, "num_classes", None) if isinstance(member, ClasswiseWrapper) else None
                out.extend([bool(member.higher_is_better)] * (classes if isinstance(classes, int) else 1))
            return out
        if not isinstance(maximize, (bool, list)) or (
            isinstance(maximize, list) and not all(isinstance(m, bool) for m in maximize)
        ):
            raise ValueError(f"`maximize` must be a bool or a list of bools; got {maximize!r}")
        if isinstance(metric, Metric) and not isinstance(maximize, bool):
            raise ValueError(f"`maximize` must be a single bool for a single metric; got {maximize!r}")
        members = len(list(metric.keys())) if isinstance(metric, MetricCollection) else 1
        if isinstance(maximize, list) and len(maximize) != members:
            raise ValueError(
                f"`maximize` must have one entry per member of the collection ({members}); got {len(maximize)}"
            )
        return maximize

    # ------------------------------------------------------------------- the steps, as torchmetrics' ModuleList
    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._modules.values()))

    def __getitem__(self, idx: int) -> Any:
        return list(self._modules.values())[idx]

    @property
    def n_steps(self) -> int:
        """The number of epochs tracked (calls of :meth:`increment`)."""
        return len(self) - 1

    def increment(self) -> None:
        """Start a new epoch: a fresh copy of the tracked metric."""
        self._increment_called = True
        self.add_module(str(len(self._modules)), deepcopy(self._base_metric))

    def _check(self, method: str) -> None:
        if not self._increment_called:
            raise ValueError(f"`{method}` cannot be called before `.increment()` has been called")

    def _members(self) -> dict[str, Member]:
        return {k: m for k, m in self._modules.items() if k != "_base_metric"}  # type: ignore[misc]

    def _step_members(self) -> dict[str, Member]:
        # one key whatever the epoch: the syncs of forward and compute keep their plan from epoch to epoch
        return {"latest": self[-1]} if self._increment_called else {}

    _compute_members = _step_members

    def _kwargs_target(self) -> Metric | None:
        latest = self[-1]
        return latest if isinstance(latest, Metric) else None

    # ------------------------------------------------------------------- the lifecycle of the latest copy
    @shared_docs(batch=_BATCH)
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Update the latest copy.

        {batch}
        """
        self._check("update")
        super().update(*args, **kwargs)

    @shared_docs(batch=_BATCH)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The latest copy's ``forward``.

        {batch}
        """
        self._check("forward")
        return super().forward(*args, **kwargs)

    def compute(self) -> Any:
        """The latest copy's value.

        Raises:
            ValueError: before the first :meth:`increment`.
        """
        self._check("compute")
        value = super().compute()
        self._values[str(len(self._modules) - 1)] = (_counts(self[-1]), value)
        return value

    def _step_value(self, values: dict[str, Any]) -> Any:
        return next(iter(values.values()))

    def _compute_value(self) -> Any:
        return self[-1].compute()

    def reset(self) -> None:
        """Reset the latest copy (:meth:`reset_all` resets every one)."""
        Metric.reset(self)
        if self._increment_called:
            self[-1].reset()

    def reset_all(self) -> None:
        """Reset every copy."""
        self._values = {}
        for metric in self:
            metric.reset()  # (a Metric or a MetricCollection)

    def compute_all(self) -> Any:
        """Every epoch's value, stacked on dim 0 (a dict of stacks for a dict value), from one collective.

        An earlier epoch's value, once computed, is kept while its metric's update count stays the same: usually
        only the latest epoch is synced. The epochs without a kept value are synced together with it, in the same
        collective. (Every rank must then hold the same kept epochs: update an earlier epoch's metric on every
        rank or on none.)

        Returns:
            A tensor of shape ``(n_steps, ...)``, a dict of them, or a list of values that cannot be stacked.

        Raises:
            ValueError: before the first :meth:`increment`.
        """
        self._check("compute_all")
        members = self._members()
        latest = str(len(self._modules) - 1)
        kept = {k: v for k, (counts, v) in self._values.items() if k in members and counts == _counts(members[k])}
        stale = {k: m for k, m in members.items() if k != latest and k not in kept}
        if stale:
            stale[latest] = members[latest]
            with self._synced_members(self._leaves(stale)):
                for key, metric in stale.items():
                    kept[key] = metric.compute()
                    self._values[key] = (_counts(metric), kept[key])
        else:
            kept[latest] = self.compute()
        res = [kept[key] for key in members]
        try:
            if isinstance(res[0], dict):
                return {k: torch.stack([r[k] for r in res], dim=0) for k in res[0]}
            if isinstance(res[0], list):
                return torch.stack([torch.stack(cast(list, r), dim=0) for r in res], dim=0)
            return torch.stack(res, dim=0)
        except (TypeError, RuntimeError):
            return res

    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """Draw every tracked epoch's value, as torchmetrics' ``MetricTracker.plot`` does.

        Without ``val``, the value of :meth:`compute_all`: for a metric, one marker per epoch (x = the epoch's
        index, labelled by it); for a collection (a dict value), one line per key over the epochs ("Step", one
        tick per epoch). The y axis reads ``MetricTracker``; no bounds are drawn (the tracked metric's are not
        used, as in torchmetrics).

        Args:
            val: a value as :meth:`compute_all` returns it, or a sequence of values; ``None`` plots
                :meth:`compute_all` (which syncs: call it on every rank).
            ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

        Returns:
            ``(figure, axes)``.

        Raises:
            ValueError: before the first :meth:`increment` (without ``val``).
            ModuleNotFoundError: matplotlib is not installed.
        """
        from torchmetrics_diff._plot import plot_values

        return plot_values(self.compute_all() if val is None else val, ax=ax, name=type(self).__name__)

    def best_metric(self, return_step: bool = False) -> Any:
        """The best value over the epochs (by ``maximize``), and with ``return_step`` the epoch it came from.

        Args:
            return_step: also return the step (0-based) of the best value. Default ``False``.

        Returns:
            A float (a dict of them, per key, for a collection or a dict value), or ``(value, step)``; ``None``
            where "best" is not defined (a warning says why).
        """
        res = self.compute_all()
        if isinstance(res, list):
            warnings.warn(
                "MetricTracker.best_metric: the values have a nested structure (a collection or wrapper inside "
                "a collection?); returning None",
                UserWarning,
                stacklevel=2,
            )
            return (None, None) if return_step else None
        if isinstance(self._base_metric, Metric) and not isinstance(self._base_metric, ClasswiseWrapper):
            try:
                value, idx = (torch.max if self.maximize else torch.min)(res, 0)
                return (value.item(), idx.item()) if return_step else value.item()
            except (ValueError, RuntimeError, TypeError) as err:
                warnings.warn(
                    f"MetricTracker.best_metric: no best value ({err}); returning None", UserWarning, stacklevel=2
                )
                return (None, None) if return_step else None
        maximize = self.maximize if isinstance(self.maximize, list) else [self.maximize] * len(res)
        values: dict[str, Any] = {}
        steps: dict[str, Any] = {}
        for i, (key, v) in enumerate(res.items()):
            try:
                best, idx = (torch.max if maximize[i] else torch.min)(v, 0)
                values[key], steps[key] = best.item(), idx.item()
            except (ValueError, RuntimeError, TypeError, IndexError) as err:
                warnings.warn(
                    f"MetricTracker.best_metric: no best value for {key!r} ({err}); returning None for it",
                    UserWarning,
                    stacklevel=2,
                )
                values[key], steps[key] = None, None
        return (values, steps) if return_step else values


def _counts(metric: Any) -> Any:
    """A metric's update count (a collection's: its members'), to tell whether a kept value is still its value."""
    if isinstance(metric, MetricCollection):
        return tuple(m.update_count for m in metric.values())
    return metric.update_count
