"""Aggregation metrics: sum, weighted mean, concatenation, min and max of whatever you feed them.

With ``dist_sync_on_step=True`` they are global-batch reductions with exact gradients: for instance
``MeanMetric(dist_sync_on_step=True)(per_token_loss, weight=mask)`` is the token-level loss normalized by the
number of valid tokens of *every* rank, and its gradient is the one-big-device gradient
(:ref:`architecture-gradient-contract`).

Inputs keep their floating dtype within a step (a float64 loss stays float64), except that nothing is summed in
half precision: float16 and bfloat16 values are summed (and concatenated) in float32, so their step value is
float32. The accumulated states keep the metric's dtype (float32 unless :meth:`~torchmetrics_diff.Metric.set_dtype`
says otherwise). See :doc:`/guide/mixed_precision`.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Union

import torch

from torchmetrics_diff._batch_step import QuietBatchValue
from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._reductions import as_rows
from torchmetrics_diff.functional._checks import HALF, acc_dtype
from torchmetrics_diff.metric import _EAGER_STEP, Metric, _tracing, dim_zero_cat

NanStrategy = Union[str, float]
_NAN_STRATEGIES = ("error", "warn", "ignore", "disable")
_SUMMED_AS_IS = (torch.float32, torch.float64)  # the dtypes a sum keeps (half precision is summed in float32)


def _sum(value: torch.Tensor) -> torch.Tensor:
    """``value.sum()`` in at least float32: a half-precision sum would round every partial sum."""
    acc = acc_dtype(value.dtype)
    return value.sum() if acc == value.dtype else value.sum(dtype=acc)


class BaseAggregator(QuietBatchValue, Metric):
    """Shared input handling: conversion to a tensor on the metric's device and the ``nan_strategy``.

    Args:
        fn: the reduction across ranks of the one state (a reduction name or a callable, as in
            :meth:`~torchmetrics_diff.Metric.add_state`).
        default_value: the state's default (a tensor, or ``[]`` for a list state).
        nan_strategy: ``"error"`` raises on NaN, ``"warn"`` (default) warns and drops NaNs (under
            ``torch.compile``: drops them without a warning), ``"ignore"`` drops them silently, ``"disable"``
            skips the check (fastest), a float replaces them.
        state_name: attribute name of the state (default ``"value"``).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: an unknown ``nan_strategy``, or a bad :class:`~torchmetrics_diff.Metric` keyword argument.
    """

    is_differentiable = True
    full_state_update = False
    _repr_hidden = ("state_name",)
    #: what a NaN counts as with ``nan_strategy="ignore"`` under ``torch.compile``: the reduction's neutral
    #: element, so no data-dependent shape (and no graph break); ``None``: dropped, a graph break
    _neutral: float | None = None

    def __init__(
        self,
        fn: str | Callable,
        default_value: torch.Tensor | list,
        nan_strategy: NanStrategy = "warn",
        state_name: str = "value",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not (
            nan_strategy in _NAN_STRATEGIES or (isinstance(nan_strategy, float) and not isinstance(nan_strategy, bool))
        ):
            raise ValueError(f"`nan_strategy` must be one of {_NAN_STRATEGIES} or a float; got {nan_strategy!r}")
        self.nan_strategy = nan_strategy
        self.add_state(state_name, default=default_value, dist_reduce_fx=fn)
        self.state_name = state_name

    def _as_tensor(self, value: Any, name: str = "value") -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            try:
                value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
            except (TypeError, ValueError, RuntimeError) as err:
                raise TypeError(f"`{name}` must be a tensor or a number; got {type(value).__name__}") from err
        if not (value.is_floating_point() or value.is_complex()):
            value = value.to(self.dtype)
        return value

    def _nans_on_device(self) -> bool:
        """Whether eager code handles NaNs without reading anything back: a float replaces them, and ``"warn"`` and
        ``"ignore"`` give them the reduction's neutral element (``"warn"`` counts them, :meth:`_warn_nans`)."""
        strategy = self.nan_strategy
        return isinstance(strategy, float) or (strategy in ("warn", "ignore") and self._neutral is not None)

    def _nan_mask(self, value: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor | None:
        """Boolean mask of the entries to keep, or ``None`` when all are kept (no work on the hot path)."""
        if self.nan_strategy == "disable":
            return None
        nans = torch.isnan(value) if weight is None else torch.isnan(value) | torch.isnan(weight)
        traced = _tracing(self)
        if traced and (
            isinstance(self.nan_strategy, float)
            or (self.nan_strategy in ("warn", "ignore") and self._neutral is not None)
        ):
            # traced: NaNs replaced whatever the data (_replace_or_drop), no host decision; "warn" drops them as
            # "ignore" does, without the warning (a host read, which traced code never makes)
            return ~nans
        if not traced and self._nans_on_device():
            keep = ~nans
            if self.nan_strategy == "warn":
                self._count_kept(keep.numel(), keep.sum())
            return keep  # replaced whatever the data: no host round trip
        where = "`value`" if weight is None else "`value` or `weight`"
        if self.nan_strategy == "error":
            message = f"{type(self).__name__}: encountered NaN in {where} and nan_strategy='error'"
            if traced:  # a device assertion in the graph: no host read, no graph break
                torch._assert_async(nans.logical_not().all(), message)
            elif bool(nans.any()):
                raise RuntimeError(message)
            return None
        if not bool(nans.any()):
            return None
        if self.nan_strategy == "warn":
            warnings.warn(
                f"{type(self).__name__}: NaN in {where} dropped (nan_strategy='warn')", UserWarning, stacklevel=4
            )
        return ~nans

    def _count_kept(self, seen: int, kept: torch.Tensor) -> None:
        """Note that ``kept`` of ``seen`` values were not NaN, for :meth:`_warn_nans` (on the device: nothing is
        read)."""
        state = self.__dict__
        pending = state.get("_nans_seen")
        if pending is None:
            state["_nans_seen"] = [seen, kept.clone()]
        else:
            pending[0] += seen
            pending[1].add_(kept)

    def _add_to(self, name: str, total: torch.Tensor) -> None:
        """``state = state + total`` for the sum state ``name``, eagerly (a new tensor: these updates replace their
        states). When the state is still the zero default ``forward``'s batch starts from (the default itself, not a
        copy: ``_replaces_states``) and ``total`` has its dtype and device (those of the sum), the state becomes
        ``total`` itself: the add of a zero is skipped."""
        states = self.__dict__
        state: torch.Tensor = states[name]
        if state is self._defaults[name] and total.dtype is state.dtype and total.device == state.device:
            states[name] = total
        else:
            states[name] = state + total

    def _nan_free_total(self, value: torch.Tensor, counted: bool) -> tuple[torch.Tensor, Any] | None:
        """Eager ``"warn"``/``"ignore"`` of a real tensor: ``(sum of its non-NaN values, how many are not NaN or
        None)``, computed on the device (``"warn"`` counts the NaNs for :meth:`_warn_nans`); ``None`` for the
        other cases.

        ``counted``: the caller needs the number of values kept (a mean's weight).
        """
        strategy = self.nan_strategy
        if strategy not in ("warn", "ignore") or value.is_complex():
            return None
        if self.__dict__["_in_lifecycle"] is not _EAGER_STEP and compiling():  # (_tracing, inline: forward's path)
            return None
        # (NaN != NaN; count_nonzero: the int64 count a sum of the booleans gives, in a third of its time)
        kept = (value == value).count_nonzero() if counted or strategy == "warn" else None
        if kept is not None and strategy == "warn":
            self._count_kept(value.numel(), kept)
        # (a real floating value here: only half precision is summed in another dtype, float32)
        return (value.nansum(dtype=torch.float32) if value.dtype in HALF else value.nansum()), kept

    def _warn_nans(self) -> None:
        """Warn about the NaNs ``"warn"`` dropped since the last report: one host read, at ``compute()`` or
        ``reset()`` (never in ``forward``)."""
        state = self.__dict__
        if state["_in_lifecycle"] is not _EAGER_STEP and compiling():  # (_tracing, inline: forward's path)
            return
        if state.get("_nans_seen") is None or state.get("_in_batch_value"):
            return
        seen, kept = state.pop("_nans_seen")
        count = seen - int(kept)
        if count:
            where = "`value` or `weight`" if isinstance(self, MeanMetric) else "`value`"
            warnings.warn(
                f"{type(self).__name__}: {count} NaN(s) in {where} dropped (nan_strategy='warn'; counted on the "
                "device and reported at the next compute() or reset())",
                UserWarning,
                stacklevel=6,
            )

    def reset(self) -> None:
        """Report the NaNs dropped since the last ``compute()`` (``nan_strategy="warn"``), then reset."""
        self._warn_nans()
        super().reset()

    def _nan_free_sum(self, value: torch.Tensor) -> torch.Tensor | None:
        """``value.sum()`` when ``value`` holds no NaN for the ``nan_strategy`` to act on, else ``None``.

        A NaN anywhere makes the sum NaN, so one host read of the sum clears the common case without building
        the mask (an infinite sum of opposite infinities also reads NaN: the caller then checks the mask). Eager
        mode only: under ``torch.compile`` the host read would be a graph break of its own. ``None`` without
        reading when the NaNs are handled on the device (:meth:`_nans_on_device`).
        """
        if self._nans_on_device():
            return None
        total = _sum(value)
        if self.nan_strategy == "disable":
            return total
        read = total.item()
        return total if read == read else None

    def _clean(self, value: Any) -> torch.Tensor:
        value = self._as_tensor(value)
        keep = self._nan_mask(value)
        return value if keep is None else self._replace_or_drop(value, keep)

    def _replace_or_drop(self, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Its NaNs replaced by the ``nan_strategy`` float, or the entries not kept dropped."""
        if isinstance(self.nan_strategy, float):
            return torch.where(torch.isnan(value), torch.full_like(value, self.nan_strategy), value)
        if self._neutral is not None and (self.nan_strategy in ("warn", "ignore") or not _tracing(self)):
            # a NaN counts as the neutral element (traced "ignore"; eager "warn" and "ignore"): no data-dependent shape
            return torch.where(keep, value, torch.full_like(value, self._neutral))
        return value[keep]

    def compute(self) -> torch.Tensor:
        """The aggregated value."""
        self._warn_nans()
        return getattr(self, self.state_name)


class SumMetric(BaseAggregator):
    """Sum of every value seen (of every rank's values when syncing).

    Shapes and dtypes: ``forward`` returns the sum of the batch, ``compute()`` the sum of every batch since the
    last reset (0 before any update), both 0-d. The batch value is in the input's floating dtype (float32
    for half-precision, integer and boolean inputs); the accumulated value in the metric's dtype (float32 unless
    :meth:`~torchmetrics_diff.Metric.set_dtype` says otherwise).

    Args:
        nan_strategy: what to do with NaN values, a
            :data:`~torchmetrics_diff.aggregation.NanStrategy` (default ``"warn"``; see
            :class:`~torchmetrics_diff.aggregation.BaseAggregator`).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import SumMetric
        >>> metric = SumMetric()
        >>> metric.update(torch.tensor([1.0, 2.0]))
        >>> metric(3.0)
        tensor(3.)
        >>> metric.compute()
        tensor(6.)
    """

    _neutral = 0.0
    _replaces_states = True  # (update assigns a new sum: forward may start from the default itself)
    sum_value: torch.Tensor

    def __init__(self, nan_strategy: NanStrategy = "warn", **kwargs: Any) -> None:
        super().__init__("sum", torch.tensor(0.0), nan_strategy, state_name="sum_value", **kwargs)

    def update(self, value: torch.Tensor | float) -> None:
        """Add the elements of ``value`` to the sum.

        Args:
            value: a tensor of any shape and real or complex dtype, or a number.

        Raises:
            TypeError: ``value`` is neither a tensor nor a number.
            RuntimeError: a NaN with ``nan_strategy="error"``.
        """
        value = self._as_tensor(value)
        fast = self._nan_free_total(value, counted=False)
        if fast is not None:  # NaNs left out on the device
            self._add_to("sum_value", fast[0])
            return
        total = None if _tracing(self) else self._nan_free_sum(value)
        self.sum_value = self.sum_value + (total if total is not None else _sum(self._clean(value)))


class _Extremum(BaseAggregator):
    """Running max or min; the gradient goes to the element(s) holding it."""

    _op: str  # "max" or "min"
    _replaces_states = True  # (update assigns a new extremum: forward may start from the default itself)

    def __init__(self, nan_strategy: NanStrategy = "warn", **kwargs: Any) -> None:
        start = float("-inf") if self._op == "max" else float("inf")
        super().__init__(self._op, torch.tensor(start), nan_strategy, state_name=f"{self._op}_value", **kwargs)

    def update(self, value: torch.Tensor | float) -> None:
        """Fold the elements of ``value`` into the running extremum.

        Args:
            value: a real tensor of any shape, or a number.

        Raises:
            TypeError: ``value`` is neither a tensor nor a number.
            RuntimeError: a NaN with ``nan_strategy="error"``.
        """
        value = self._clean(value)
        current = getattr(self, self.state_name)
        if value.numel():
            pick, extremum = (torch.maximum, value.amax) if self._op == "max" else (torch.minimum, value.amin)
            setattr(self, self.state_name, pick(current, extremum()))
        elif value.requires_grad:  # an empty batch still joins the graph, so every rank can run backward
            setattr(self, self.state_name, current + value.sum())


class MaxMetric(_Extremum):
    """Maximum of every value seen; the gradient goes to the element(s) holding it.

    Shapes and dtypes: ``forward`` returns the maximum of the batch, ``compute()`` the maximum of every batch since the
    last reset (``-inf`` before any update), both 0-d. The batch value is in the input's floating dtype (float32
    for half-precision, integer and boolean inputs); the accumulated value in the metric's dtype (float32 unless
    :meth:`~torchmetrics_diff.Metric.set_dtype` says otherwise).

    Args:
        nan_strategy: what to do with NaN values, a
            :data:`~torchmetrics_diff.aggregation.NanStrategy` (default ``"warn"``; see
            :class:`~torchmetrics_diff.aggregation.BaseAggregator`).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MaxMetric
        >>> metric = MaxMetric()
        >>> metric.update(torch.tensor([1.0, 5.0, 2.0]))
        >>> metric.compute()
        tensor(5.)
    """

    _op = "max"
    _neutral = float("-inf")


class MinMetric(_Extremum):
    """Minimum of every value seen; the gradient goes to the element(s) holding it.

    Shapes and dtypes: ``forward`` returns the minimum of the batch, ``compute()`` the minimum of every batch since the
    last reset (``inf`` before any update), both 0-d. The batch value is in the input's floating dtype (float32
    for half-precision, integer and boolean inputs); the accumulated value in the metric's dtype (float32 unless
    :meth:`~torchmetrics_diff.Metric.set_dtype` says otherwise).

    Args:
        nan_strategy: what to do with NaN values, a
            :data:`~torchmetrics_diff.aggregation.NanStrategy` (default ``"warn"``; see
            :class:`~torchmetrics_diff.aggregation.BaseAggregator`).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MinMetric
        >>> metric = MinMetric()
        >>> metric.update(torch.tensor([1.0, -5.0, 2.0]))
        >>> metric.compute()
        tensor(-5.)
    """

    _op = "min"
    _neutral = float("inf")


class CatMetric(BaseAggregator):
    """Concatenation of every value seen along dim 0 (rows), in rank order when syncing, as in torchmetrics.

    A tensor of shape ``(n, ...)`` adds ``n`` rows; a 0-d tensor or a number adds one. Every row must have the
    shape of the first (``(2, 3)`` then ``(1, 3)`` gives ``(3, 3)``; 0-d and 1-d values are both rows of shape
    ``()``). With a NaN-dropping ``nan_strategy``, a row holding a NaN is dropped whole.

    Shapes and dtypes: ``forward`` returns the batch's rows, ``compute()`` every row since the last reset, as
    one tensor of shape ``(total rows, *row shape)`` (when syncing, every rank's rows in rank order); rows keep
    their floating dtype (float32 for half-precision, integer and boolean inputs), and ``compute()`` before any
    update is an empty 1-D tensor of the metric's dtype.

    Args:
        nan_strategy: what to do with NaN values, a
            :data:`~torchmetrics_diff.aggregation.NanStrategy` (default ``"warn"``; see
            :class:`~torchmetrics_diff.aggregation.BaseAggregator`).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import CatMetric
        >>> metric = CatMetric()
        >>> metric.update(torch.tensor([1.0, 2.0]))
        >>> metric.update(3.0)
        >>> metric.compute()
        tensor([1., 2., 3.])
        >>> rows = CatMetric()
        >>> rows.update(torch.zeros(2, 3))
        >>> rows.update(torch.ones(1, 3))
        >>> rows.compute().shape
        torch.Size([3, 3])
    """

    _replaces_states = True  # (a list state: a batch starts from a fresh list anyway)
    value: list[torch.Tensor]

    def __init__(self, nan_strategy: NanStrategy = "warn", **kwargs: Any) -> None:
        super().__init__("cat", [], nan_strategy, state_name="value", **kwargs)

    def update(self, value: torch.Tensor | float) -> None:
        """Append the rows of ``value`` (a 0-d value is one row).

        Args:
            value: a tensor ``(n, *row shape)`` or a 0-d tensor or number (one row), real or complex.

        Raises:
            TypeError: ``value`` is neither a tensor nor a number.
            RuntimeError: a NaN with ``nan_strategy="error"``.
            ValueError: the rows of ``value`` have another shape than the rows seen before.
        """
        value = as_rows(self._as_tensor(value))
        if self.value:
            _check_rows(type(self).__name__, self.value[0], value)
        keep = self._nan_mask(value)
        if keep is not None:
            if value.ndim > 1 and not isinstance(self.nan_strategy, float):  # whole rows, so rows stay rows
                keep = keep.reshape(len(value), -1).all(dim=1)
            value = self._replace_or_drop(value, keep)
        value = value.to(acc_dtype(value.dtype))  # never stored in half precision
        if value.numel() or value.requires_grad:  # an empty batch in forward keeps the rank in the graph
            self.value.append(value)

    def compute(self) -> torch.Tensor:
        """Every row seen, as one tensor (1-D and empty when nothing was seen).

        Returns:
            Shape ``(total rows, *row shape)``, in the rows' dtype.

        Raises:
            ValueError: rows of different shapes were accumulated (by ``forward`` or ``merge_state``).
        """
        if not self.value:
            return torch.zeros(0, dtype=self.dtype, device=self.device)
        first = as_rows(self.value[0])
        for rows in self.value[1:]:
            _check_rows(type(self).__name__, first, as_rows(rows))
        return dim_zero_cat(self.value)


def _check_rows(owner: str, seen: torch.Tensor, value: torch.Tensor) -> None:
    if seen.shape[1:] != value.shape[1:]:
        raise ValueError(
            f"{owner}: every row of `value` must have shape {tuple(seen.shape[1:])} (the rows seen before); "
            f"got rows of shape {tuple(value.shape[1:])}"
        )


class MeanMetric(BaseAggregator):
    """Weighted mean ``Σ wᵢ xᵢ / Σ wᵢ`` of every value seen (of every rank's values when syncing).

    With ``dist_sync_on_step=True``, ``MeanMetric(...)(per_token_loss, weight=mask)`` is the loss normalized by
    the global number of valid tokens, with the one-big-device gradient.

    Shapes and dtypes: ``forward`` returns the weighted mean of the batch, ``compute()`` that of every batch
    since the last reset (NaN before any update), both 0-d. The batch value is in the input's floating dtype
    (float32 for half-precision, integer and boolean inputs); the accumulated value in the metric's dtype
    (float32 unless :meth:`~torchmetrics_diff.Metric.set_dtype` says otherwise).

    Args:
        nan_strategy: what to do with NaN values, a
            :data:`~torchmetrics_diff.aggregation.NanStrategy` (default ``"warn"``; see
            :class:`~torchmetrics_diff.aggregation.BaseAggregator`).
            Dropped values drop their weights too.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanMetric
        >>> metric = MeanMetric()
        >>> metric(torch.tensor([1.0, 2.0, 6.0]), weight=torch.tensor([1.0, 1.0, 0.0]))
        tensor(1.5000)
        >>> metric.update(torch.tensor([4.0]))
        >>> metric.compute()
        tensor(2.3333)
    """

    _neutral = 0.0  # with weight 0
    _replaces_states = True  # (update assigns new sums: forward may start from the defaults themselves)
    mean_value: torch.Tensor
    weight: torch.Tensor

    def __init__(self, nan_strategy: NanStrategy = "warn", **kwargs: Any) -> None:
        super().__init__("sum", torch.tensor(0.0), nan_strategy, state_name="mean_value", **kwargs)
        self.add_state("weight", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor | float, weight: torch.Tensor | float = 1.0) -> None:
        """Add ``value`` with ``weight`` (broadcast to ``value``'s shape; a bool mask works).

        Args:
            value: a real tensor of any shape, or a number.
            weight: a tensor broadcastable to ``value``'s shape (floating, integer or boolean), or a number
                (default 1.0).

        Raises:
            TypeError: ``value`` is neither a tensor nor a number.
            RuntimeError: a NaN with ``nan_strategy="error"``.
            ValueError: ``weight`` cannot be broadcast to ``value``.
        """
        state = self.__dict__
        if state["_in_lifecycle"] is _EAGER_STEP and weight.__class__ is float and value.__class__ is torch.Tensor:
            # forward's eager step, its batch states the zero defaults, NaNs dropped and counted on the device: the
            # batch's sums are the states themselves (the common step of a training loop, on its shortest path)
            sums: torch.Tensor = state["mean_value"]
            weights: torch.Tensor = state["weight"]
            if (
                weight == 1.0
                and self.nan_strategy == "warn"
                and sums is self._defaults["mean_value"]
                and weights is self._defaults["weight"]
                and value.dtype is sums.dtype
                and sums.dtype in _SUMMED_AS_IS
            ):
                fast = self._nan_free_total(value, counted=True)  # (never None here: a real value, eagerly)
                if fast is not None:
                    state["mean_value"], kept = fast
                    state["weight"] = kept.float() if sums.dtype is torch.float32 else kept.double()
                    return
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):  # (a floating tensor is kept as it is)
            value = self._as_tensor(value)
        # a Python number, not a bool (the default float first: the common case decided in one comparison)
        scalar = weight.__class__ is float or (isinstance(weight, (int, float)) and not isinstance(weight, bool))
        traced_ignore = self.nan_strategy == "ignore" and _tracing(self)  # NaNs get weight 0: the weighted path
        # the common case: a finite scalar weight, no weight tensor (NaN != NaN)
        if scalar and weight == weight and not traced_ignore:
            fast = self._nan_free_total(value, counted=True)
            if fast is not None:  # NaNs left out on the device: the weight counts the values kept
                nan_free, kept = fast
                if weight == 1:
                    self._add_to("mean_value", nan_free)
                    # (the int64 count in the state's dtype: ``.float()`` costs half of ``.to()``)
                    dtype = self.weight.dtype
                    self._add_to("weight", kept.float() if dtype is torch.float32 else kept.to(dtype))
                else:
                    self._add_to("mean_value", nan_free * weight)
                    self._add_to("weight", kept * weight)
                return
            total = None if _tracing(self) else self._nan_free_sum(value)
            count: Any = value.numel()
            if total is None:
                keep = self._nan_mask(value)
                if keep is not None:
                    kept = self._replace_or_drop(value, keep)
                    replaced = isinstance(self.nan_strategy, float)
                    # NaNs given weight 0 in place (on the device), or dropped (their count read on the host)
                    count = keep.sum() if kept.shape == value.shape and not replaced else kept.numel()
                    value = kept
                total = _sum(value)
            self.mean_value = self.mean_value + (total if weight == 1 else total * weight)
            self.weight = self.weight + count * weight
            return
        weight = self._as_tensor(weight, "weight")
        try:
            weight = torch.broadcast_to(weight, value.shape)
        except RuntimeError as err:
            raise ValueError(
                f"`weight` of shape {tuple(weight.shape)} cannot be broadcast to `value` of shape {tuple(value.shape)}"
            ) from err
        keep = self._nan_mask(value, weight)
        if keep is not None:
            if isinstance(self.nan_strategy, float):  # NaNs of both replaced by the float
                value, weight = self._replace_or_drop(value, keep), self._replace_or_drop(weight, keep)
            elif traced_ignore or (not _tracing(self) and self._nans_on_device()):  # weight 0 for NaNs, on the device
                value, weight = torch.where(keep, value, 0.0), torch.where(keep, weight, 0.0)
            else:
                value, weight = value[keep], weight[keep]
        acc = acc_dtype(torch.promote_types(value.dtype, weight.dtype))  # products and sums: never half precision
        self.mean_value = self.mean_value + (value.to(acc) * weight.to(acc)).sum()
        self.weight = self.weight + weight.to(acc).sum()

    def compute(self) -> torch.Tensor:
        """``Σ wᵢ xᵢ / Σ wᵢ`` (NaN when the weights sum to zero)."""
        self._warn_nans()
        return self.mean_value / self.weight
