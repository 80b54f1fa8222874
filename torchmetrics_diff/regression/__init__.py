"""Differentiable regression metrics from sum states: exact global-batch values and gradients under DDP."""

from __future__ import annotations

from torchmetrics_diff.regression.metrics import (
    CosineSimilarity,
    MeanAbsoluteError,
    MeanSquaredError,
    PearsonCorrCoef,
    R2Score,
)

__all__ = ["CosineSimilarity", "MeanAbsoluteError", "MeanSquaredError", "PearsonCorrCoef", "R2Score"]
