"""torchmetrics_diff: metrics and losses on the global batch of a distributed run, with exact gradients."""

from __future__ import annotations

from torchmetrics_diff.aggregation import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric
from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.composition import CompositionalMetric
from torchmetrics_diff.metric import Metric

__version__ = "0.1.0"

__all__ = [
    "CatMetric",
    "CompositionalMetric",
    "MaxMetric",
    "MeanMetric",
    "Metric",
    "MetricCollection",
    "MinMetric",
    "SumMetric",
]
