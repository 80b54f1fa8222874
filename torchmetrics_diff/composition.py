"""``CompositionalMetric``: arithmetic between metrics, tensors and numbers, evaluated lazily.

``forward`` composes the members' *differentiable* batch values (each member syncs its own states when it syncs
on step), so ``a + 0.5 * b`` is a loss whose gradient is that of the composed global-batch values. ``compute``
composes the members' epoch values.

The operators of :class:`~torchmetrics_diff.Metric` that build a ``CompositionalMetric`` (``a + b``, ``a < b``,
``-a``, ``a[0]``, ...) are defined at the end of this module.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from torchmetrics_diff._tensors import detach
from torchmetrics_diff._torchmetrics import is_torchmetrics_metric
from torchmetrics_diff.metric import Metric


class CompositionalMetric(Metric):
    """The result of an operator applied to metrics (and constants): ``op(metric_a, metric_b)``.

    Args:
        operator: a function of one (unary) or two values.
        metric_a: a metric, a tensor or a number.
        metric_b: a metric, a tensor, a number, or ``None`` for a unary operator.

    Note:
        ``+metric`` is the metric itself and ``-metric`` its negation. (torchmetrics maps ``+metric`` to
        ``abs(metric)``; use ``abs(metric)`` for that.)

    Example:
        >>> import torch
        >>> from torchmetrics_diff import SumMetric, MeanMetric
        >>> total, mean = SumMetric(), MeanMetric()
        >>> loss = total + 0.5 * mean
        >>> loss(torch.tensor([1.0, 3.0]))  # 4 + 0.5 * 2
        tensor(5.)
        >>> loss.compute()
        tensor(5.)
    """

    _wrap_lifecycle = False  # members run their own lifecycles; this class only combines values

    def __init__(self, operator: Callable, metric_a: Any, metric_b: Any) -> None:
        super().__init__()
        self.op = operator
        self.metric_a = metric_a
        self.metric_b = metric_b

    def _members(self) -> list[Metric]:
        return [m for m in (self.metric_a, self.metric_b) if isinstance(m, Metric)]

    def _apply_op(self, a: Any, b: Any) -> Any:
        if self.metric_b is None and not isinstance(self.metric_b, Metric):
            return self.op(a)
        return self.op(a, b)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Update every member metric (keyword arguments routed by each member's ``update`` signature).

        All or nothing: when a member raises, the members updated before it are restored.

        Args:
            args: the batch, passed to every member's ``update``.
            kwargs: keyword arguments, each passed to the members whose ``update`` accepts it.
        """
        snapshot = self._snapshot()
        try:
            for m in self._members():
                m.update(*args, **m._filter_kwargs(**kwargs))
        except BaseException:
            self._restore(snapshot)
            raise

    def compute(self) -> Any:
        """The operator applied to the members' computed values."""
        a, b = (m.compute() if isinstance(m, Metric) else m for m in (self.metric_a, self.metric_b))
        return self._apply_op(a, b)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The operator applied to the members' (differentiable, possibly global) batch values; all or nothing.

        Args:
            args: the batch, passed to every member.
            kwargs: keyword arguments, each passed to the members whose ``update`` accepts it.
        """
        snapshot = self._snapshot()
        try:
            a, b = (
                m(*args, **m._filter_kwargs(**kwargs)) if isinstance(m, Metric) else m
                for m in (self.metric_a, self.metric_b)
            )
        except BaseException:
            self._restore(snapshot)
            raise
        value = self._apply_op(a, b)
        self._forward_cache = detach(value)
        return value

    def _snapshot(self) -> Any:
        return [m._snapshot() for m in self._members()]

    def _restore(self, snapshot: Any) -> None:
        for m, saved in zip(self._members(), snapshot):
            m._restore(saved)

    def reset(self) -> None:
        """Reset every member."""
        for m in self._members():
            m.reset()

    def persistent(self, mode: bool = False) -> None:
        """Set persistence of every member's states."""
        for m in self._members():
            m.persistent(mode)

    @property
    def update_count(self) -> int:
        """The largest update count of the members."""
        return max((m.update_count for m in self._members()), default=0)

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any) -> CompositionalMetric:
        super()._apply(fn, *args, **kwargs)
        for attr in ("metric_a", "metric_b"):
            value = getattr(self, attr)
            if isinstance(value, torch.Tensor):
                setattr(self, attr, value.to(self.device))
        return self

    def __repr__(self) -> str:
        name = getattr(self.op, "__name__", repr(self.op))
        return f"{type(self).__name__}(\n  {name}(\n    {self.metric_a!r},\n    {self.metric_b!r}\n  )\n)"


# ------------------------------------------------------------------------------------- Metric's operators
def _binary(fn: Callable, reflected: bool = False) -> Callable:
    def method(self: Metric, other: Any = None) -> Metric:
        if not isinstance(other, Metric) and is_torchmetrics_metric(other):
            # a torchmetrics metric: its reflected operator builds torchmetrics' CompositionalMetric, which
            # drives both (ours through the lifecycle torchmetrics calls); ours would take it for a constant
            return NotImplemented
        return CompositionalMetric(fn, other, self) if reflected else CompositionalMetric(fn, self, other)

    method.__name__ = getattr(fn, "__name__", "op")
    return method


def _unary(fn: Callable) -> Callable:
    def method(self: Metric) -> Metric:
        return CompositionalMetric(fn, self, None)

    method.__name__ = getattr(fn, "__name__", "op")
    return method


def _getitem(self: Metric, idx: Any) -> Metric:
    """``metric[idx]``: a :class:`~torchmetrics_diff.CompositionalMetric` whose value is ``value[idx]``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import CatMetric
        >>> first = CatMetric()[0]
        >>> first(torch.tensor([5.0, 6.0]))
        tensor(5.)
    """
    return CompositionalMetric(operator.itemgetter(idx), self, None)


def _pos(self: Metric) -> Metric:
    """``+metric`` is the metric itself (torchmetrics returns ``abs(metric)``)."""
    return self


_BINARY: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
}
_COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
_UNARY = {"neg": torch.neg, "abs": torch.abs, "invert": torch.bitwise_not}

for _name, _fn in _BINARY.items():
    setattr(Metric, f"__{_name}__", _binary(_fn))
    setattr(Metric, f"__r{_name}__", _binary(_fn, reflected=True))
for _name, _fn in _COMPARE.items():
    setattr(Metric, f"__{_name}__", _binary(_fn))
for _name, _fn in _UNARY.items():
    setattr(Metric, f"__{_name}__", _unary(_fn))
_getitem.__name__, _pos.__name__ = "__getitem__", "__pos__"
Metric.__getitem__ = _getitem  # type: ignore[method-assign]
Metric.__pos__ = _pos  # type: ignore[method-assign]
