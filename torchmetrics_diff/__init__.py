"""torchmetrics_diff: metrics and losses on the global batch of a distributed run, with exact gradients."""

from __future__ import annotations

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
from torchmetrics_diff.regression import (
    CosineSimilarity,
    ExplainedVariance,
    KLDivergence,
    MeanAbsoluteError,
    MeanAbsolutePercentageError,
    MeanSquaredError,
    PearsonCorrCoef,
    R2Score,
    SpearmanCorrCoef,
    SymmetricMeanAbsolutePercentageError,
)
from torchmetrics_diff.retrieval import (
    RetrievalMAPAtK,
    RetrievalMeanRank,
    RetrievalMedianRank,
    RetrievalMRR,
    RetrievalNormalizedDCG,
    RetrievalRecallAtK,
)
from torchmetrics_diff.text import Perplexity

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
    "CosineSimilarity",
    "F1Score",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "PearsonCorrCoef",
    "Perplexity",
    "Precision",
    "R2Score",
    "Recall",
    "RetrievalMAPAtK",
    "RetrievalMeanRank",
    "RetrievalMedianRank",
    "RetrievalRecallAtK",
    "ExplainedVariance",
    "KLDivergence",
    "MeanAbsolutePercentageError",
    "SpearmanCorrCoef",
    "SymmetricMeanAbsolutePercentageError",
    "RetrievalMRR",
    "RetrievalNormalizedDCG",
    # classification: generic names added with the task classes
    "AveragePrecision",
    "Specificity",
    "StatScores",
]
