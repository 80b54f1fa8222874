"""Our metrics among torchmetrics' own containers: which ones can hold them, and one clear error for the others.

Our metrics pass ``isinstance(m, torchmetrics.Metric)`` (the registration in :mod:`torchmetrics_diff.metric`), so
torchmetrics' containers accept them. Most only call the public lifecycle (``update``, ``compute``, ``forward``,
``reset``, ``_filter_kwargs``, copies) and work: ``MetricCollection``, ``MetricTracker``, ``MinMaxMetric``,
``ClasswiseWrapper``, ``MultitaskWrapper``, ``BootStrapper``, ``MultioutputWrapper``, the input transformers, and
torchmetrics' ``CompositionalMetric``. Those in :data:`REFUSED` reach into torchmetrics' private state machinery
or need what our metrics do not have; a module-registration hook makes them raise one ``TypeError`` when our
metric is attached to them, which is the first thing their constructors do with it.

torchmetrics is never imported here: the hook compares class names, and :func:`is_torchmetrics_metric` looks the
module up in ``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

#: torchmetrics containers that cannot hold our metrics, by qualified class name, with what to use instead
REFUSED = {
    "torchmetrics.wrappers.running.Running": (
        "it rebuilds the window through torchmetrics' private `_reduce_states` and keeps references to list "
        "states that our reset() empties in place. Use torchmetrics_diff.wrappers.Running (the same window, its "
        "states synced in one collective), or wrap the torchmetrics metric of the same name in torchmetrics' Running"
    ),
    "torchmetrics.wrappers.feature_share.FeatureShare": (
        "it shares the `feature_network` of torchmetrics' image metrics, which our metrics (adapted ones included) "
        "do not expose. Use torchmetrics_diff.MetricCollection; adapted FID, KID or MIFID metrics share one feature "
        "extractor when each is given the same module as `feature=` (its weights are held once, and each metric "
        "runs it on its own batches)"
    ),
}

_OURS: tuple[type, ...] = ()


def _refuse(module: nn.Module, name: str, submodule: Any) -> None:
    if not isinstance(submodule, _OURS):
        return
    for cls in type(module).__mro__:
        why = REFUSED.get(f"{cls.__module__}.{cls.__qualname__}")
        if why is not None:
            raise TypeError(
                f"torchmetrics' {cls.__qualname__} cannot hold {type(submodule).__name__} (a torchmetrics_diff "
                f"metric, given as `{name}`): {why}."
            )


def refuse_in_torchmetrics_containers(ours: type) -> None:
    """Make the containers of :data:`REFUSED` raise ``TypeError`` when a metric of class ``ours`` is attached."""
    global _OURS
    if not _OURS:
        register_module_module_registration_hook(_refuse)
    _OURS = (ours,)


def is_torchmetrics_metric(obj: Any) -> bool:
    """Whether ``obj`` is a ``torchmetrics.Metric`` (ours included, once registered); ``False`` without torchmetrics."""
    base = getattr(sys.modules.get("torchmetrics"), "Metric", None)
    return base is not None and isinstance(obj, base)


def synced_hint(member: object) -> str:
    """What to do with a container member that is not ours: a torchmetrics metric joins wrapped in the adapter."""
    if is_torchmetrics_metric(member):
        return (
            " (a torchmetrics metric: wrap it as `Synced(metric)`, from torchmetrics_diff.wrappers, and it syncs "
            "through this package; see the torchmetrics adapter guide)"
        )
    return ""
