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
    CrossModalMAPAtK,
    CrossModalMeanRank,
    CrossModalMedianRank,
    CrossModalMRR,
    CrossModalNormalizedDCG,
    CrossModalRecallAtK,
    RetrievalAUROC,
    RetrievalFallOut,
    RetrievalHitRate,
    RetrievalMAP,
    RetrievalMAPAtK,
    RetrievalMeanRank,
    RetrievalMedianRank,
    RetrievalMRR,
    RetrievalNormalizedDCG,
    RetrievalPrecision,
    RetrievalPrecisionRecallCurve,
    RetrievalRecall,
    RetrievalRecallAtFixedPrecision,
    RetrievalRecallAtK,
    RetrievalRPrecision,
)
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
    "CosineSimilarity",
    "F1Score",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "PearsonCorrCoef",
    "Perplexity",
    "Precision",
    "R2Score",
    "Recall",
    "CrossModalMAPAtK",
    "CrossModalMeanRank",
    "CrossModalMedianRank",
    "CrossModalRecallAtK",
    "ExplainedVariance",
    "KLDivergence",
    "MeanAbsolutePercentageError",
    "SpearmanCorrCoef",
    "SymmetricMeanAbsolutePercentageError",
    "CrossModalMRR",
    "CrossModalNormalizedDCG",
    # retrieval: torchmetrics' per-query metrics under its names
    "RetrievalAUROC",
    "RetrievalFallOut",
    "RetrievalHitRate",
    "RetrievalMAP",
    "RetrievalMRR",
    "RetrievalNormalizedDCG",
    "RetrievalPrecision",
    "RetrievalPrecisionRecallCurve",
    "RetrievalRPrecision",
    "RetrievalRecall",
    "RetrievalRecallAtFixedPrecision",
    # classification: generic names added with the task classes
    "AveragePrecision",
    "Specificity",
    "StatScores",
]
