"""What a :class:`~torchmetrics_diff.Metric` shows of itself: its ``repr`` and its plot.

``_MetricDisplay`` is a base class of ``Metric`` (as ``_MetricBatchSteps`` of ``torchmetrics_diff._batch_step``):
``repr(metric)`` lists the constructor arguments whose value differs from the default, read from the ``__init__``
signatures of the class hierarchy; ``plot`` draws values with matplotlib (imported on use, in
``torchmetrics_diff._plot``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar


class _MetricDisplay:
    """:class:`~torchmetrics_diff.Metric`'s ``repr`` and ``plot``."""

    _repr_hidden: ClassVar[tuple[str, ...]] = ()  # constructor arguments a subclass fixes itself (not in repr)

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in self._settings().items())
        return f"{type(self).__name__}({settings})"

    def _settings(self) -> dict[str, Any]:
        """Constructor arguments whose current value differs from the default (what ``repr`` shows).

        Read from the ``__init__`` signatures along the class hierarchy (the most derived default wins) and the
        instance attributes of the same names; arguments that are not kept as attributes are not shown.
        """
        out: dict[str, Any] = {}
        seen: set[str] = set()
        for cls in type(self).__mro__:
            init = cls.__dict__.get("__init__")
            if init is None:
                continue
            for param in list(inspect.signature(init).parameters.values())[1:]:
                if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in seen:
                    continue
                seen.add(param.name)
                if param.name not in self.__dict__ or param.name in self._repr_hidden:
                    continue
                value = self.__dict__[param.name]
                if param.default is param.empty or _differs(value, param.default):
                    out[param.name] = value
            if _MetricDisplay in cls.__bases__:  # Metric: its bases (this one, nn.Module) take no arguments
                break
        return out

    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """Plot a value of the metric, or a sequence of values (one per step or epoch), with matplotlib.

        The picture is torchmetrics': the same points, labels, legend, ``plot_lower_bound`` and
        ``plot_upper_bound`` lines and "Optimal value" mark (see the plotting guide).

        Args:
            val: a value as ``forward`` or ``compute`` return it (a scalar or 1-D tensor, a 2-D tensor shown as
                an image, a dict of those), or a sequence of such values (drawn over their index);
                ``None`` plots :meth:`compute`.
            ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

        Returns:
            ``(figure, axes)``.

        Raises:
            ModuleNotFoundError: matplotlib is not installed (the ``plot`` extra: ``pip install 'matplotlib>=3.6'``).

        Example:
            >>> import torch
            >>> from torchmetrics_diff import MeanMetric
            >>> metric = MeanMetric()
            >>> values = [metric(torch.tensor([float(i), 1.0])) for i in range(5)]
            >>> fig, ax = metric.plot(values)  # doctest: +SKIP
        """
        from torchmetrics_diff._plot import plot_metric

        return plot_metric(self, val, ax)


def _differs(value: Any, default: Any) -> bool:
    if value is default:
        return False
    try:
        return bool(value != default)
    except Exception:  # tensors of several elements, objects without a usable comparison
        return True
