"""Classification metrics on the global batch: stat-score metrics from ``int64`` sum states (one collective for a
whole collection) and the exact binary AUROC from ``cat`` states."""

from __future__ import annotations

from torchmetrics_diff.classification.auroc import AUROC
from torchmetrics_diff.classification.stat_scores import Accuracy, ConfusionMatrix, F1Score, Precision, Recall

__all__ = ["AUROC", "Accuracy", "ConfusionMatrix", "F1Score", "Precision", "Recall"]
