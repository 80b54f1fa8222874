"""Regression metrics on the global batch: differentiable ones from sum states (exact values and gradients under
DDP), and Spearman's rank correlation over every rank's rows."""

from __future__ import annotations

from torchmetrics_diff.regression.metrics import (
    CosineSimilarity,
    ExplainedVariance,
    KLDivergence,
    MeanAbsoluteError,
    MeanAbsolutePercentageError,
    MeanSquaredError,
    PearsonCorrCoef,
    R2Score,
    SymmetricMeanAbsolutePercentageError,
)
from torchmetrics_diff.regression.spearman import SpearmanCorrCoef

__all__ = [
    "CosineSimilarity",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "PearsonCorrCoef",
    "R2Score",
    "ExplainedVariance",
    "KLDivergence",
    "MeanAbsolutePercentageError",
    "SpearmanCorrCoef",
    "SymmetricMeanAbsolutePercentageError",
]
