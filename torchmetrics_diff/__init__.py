"""torchmetrics_diff: metrics and losses on the global batch of a distributed run, with exact gradients."""

from __future__ import annotations

from torchmetrics_diff import regression, retrieval
from torchmetrics_diff.aggregation import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric
from torchmetrics_diff.classification import (
    AUROC,
    Accuracy,
    AveragePrecision,
    ConfusionMatrix,
    F1Score,
    Precision,
    Recall,
    Specificity,
    StatScores,
)
from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.composition import CompositionalMetric
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.regression import *  # noqa: F403  (its __all__: every regression metric)
from torchmetrics_diff.retrieval import *  # noqa: F403  (its __all__: every retrieval metric)
from torchmetrics_diff.retrieval import RetrievalMAPAtK, RetrievalMeanRank, RetrievalMedianRank, RetrievalRecallAtK
from torchmetrics_diff.text import Perplexity

# the cross-modal metrics' old names, deprecated (FutureWarning when constructed), not in __all__
_DEPRECATED = (RetrievalMAPAtK, RetrievalMeanRank, RetrievalMedianRank, RetrievalRecallAtK)

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
    # everyday metrics
    "AUROC",
    "Accuracy",
    "ConfusionMatrix",
    "F1Score",
    "Perplexity",
    "Precision",
    "Recall",
    # classification: generic names added with the task classes
    "AveragePrecision",
    "Specificity",
    "StatScores",
]
__all__ += regression.__all__
__all__ += retrieval.__all__  # torchmetrics' per-query metrics under its names, and the cross-modal ones
