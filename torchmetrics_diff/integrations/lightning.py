"""PyTorch Lightning and Fabric: log ``torchmetrics_diff`` metrics and losses like torchmetrics metrics.

Lightning's ``self.log(name, metric)`` and ``self.log_dict(collection)`` accept objects that are
``isinstance(obj, torchmetrics.Metric)``. ``torchmetrics.Metric`` is an abstract base class, and every
:class:`~torchmetrics_diff.Metric` registers itself as a virtual subclass of it the first time a metric is
created while torchmetrics is imported (Lightning imports it), so in the usual ``LightningModule.__init__``
there is nothing to do. Importing this module registers at once, for metrics created before Lightning was
imported. Lightning then logs ``metric._forward_cache`` (the detached value of the last ``forward``) per step,
``metric.compute()`` per epoch, and calls ``metric.reset()`` at the end of the epoch.

Lightning Fabric has no metric objects in its logging: log the tensors that ``forward`` and ``compute``
return (``fabric.log_dict(collection(batch))``, ``fabric.log_dict(collection.compute())``) and call ``reset()``
yourself; :func:`log_epoch` does the last two. See :doc:`/guide/lightning`.
"""

from __future__ import annotations

from typing import Any

import torchmetrics  # noqa: F401  (the registration needs it imported)

from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.metric import Metric, register_with_torchmetrics

if not register_with_torchmetrics():  # pragma: no cover - torchmetrics without an ABC Metric
    raise ImportError("torchmetrics_diff.integrations.lightning: torchmetrics.Metric cannot register subclasses")


def log_epoch(fabric: Any, metrics: Metric | MetricCollection, name: str | None = None, step: int | None = None) -> Any:
    """Log the epoch value of a metric or collection through ``fabric.log_dict`` and reset it.

    Every rank must call it (``compute`` syncs the states); Fabric's loggers write from rank 0.

    Args:
        fabric: a ``lightning.fabric.Fabric``.
        metrics: a metric (logged as ``name``) or a collection (logged under its keys).
        name: the key of a single metric's value (default: its class name).
        step: passed to ``fabric.log_dict``. Default ``None``.

    Returns:
        The computed value(s), after which ``metrics`` is reset.
    """
    value = metrics.compute()
    logged = value if isinstance(metrics, MetricCollection) else {name or type(metrics).__name__: value}
    fabric.log_dict(logged, step=step)
    metrics.reset()
    return value
