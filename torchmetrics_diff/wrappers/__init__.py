"""Wrappers around metrics, with torchmetrics' names and behaviour: every inner state synced in one collective.

A wrapper holds inner metrics and adds logic on top; its own ``compute`` and ``forward`` (and a
:class:`~torchmetrics_diff.MetricCollection` holding it) sync all its inner states in one engine call, and its
``forward`` keeps the inner metrics' gradients. See :doc:`/metrics/wrappers`.
"""

from __future__ import annotations

from torchmetrics_diff.wrappers._base import WrapperMetric
from torchmetrics_diff.wrappers.bootstrap import BootStrapper
from torchmetrics_diff.wrappers.classwise import ClasswiseWrapper
from torchmetrics_diff.wrappers.minmax import MinMaxMetric
from torchmetrics_diff.wrappers.multitask import MultitaskWrapper
from torchmetrics_diff.wrappers.running import Running, RunningMean, RunningSum
from torchmetrics_diff.wrappers.synced import Synced
from torchmetrics_diff.wrappers.tracker import MetricTracker

__all__ = [
    "BootStrapper",
    "ClasswiseWrapper",
    "MetricTracker",
    "MinMaxMetric",
    "MultitaskWrapper",
    "Running",
    "RunningMean",
    "RunningSum",
    "Synced",
    "WrapperMetric",
]
