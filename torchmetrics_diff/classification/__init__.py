"""Classification metrics on the global batch: stat-score metrics from ``int64`` sum states (one collective for a
whole collection), the exact AUROC and average precision from ``cat`` states, and the task classes
(``BinaryAccuracy``, ``MulticlassAUROC``, ...) with torchmetrics' names."""

from __future__ import annotations

from torchmetrics_diff.classification.auroc import AUROC, AveragePrecision
from torchmetrics_diff.classification.auroc_tasks import (
    BinaryAUROC,
    BinaryAveragePrecision,
    MulticlassAUROC,
    MulticlassAveragePrecision,
    MultilabelAUROC,
    MultilabelAveragePrecision,
)
from torchmetrics_diff.classification.stat_scores import (
    Accuracy,
    ConfusionMatrix,
    F1Score,
    Precision,
    Recall,
    Specificity,
    StatScores,
)
from torchmetrics_diff.classification.tasks import (
    BinaryAccuracy,
    BinaryConfusionMatrix,
    BinaryF1Score,
    BinaryPrecision,
    BinaryRecall,
    BinarySpecificity,
    BinaryStatScores,
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
    MulticlassSpecificity,
    MulticlassStatScores,
    MultilabelAccuracy,
    MultilabelConfusionMatrix,
    MultilabelF1Score,
    MultilabelPrecision,
    MultilabelRecall,
    MultilabelSpecificity,
    MultilabelStatScores,
)

__all__ = [
    "AUROC",
    "Accuracy",
    "ConfusionMatrix",
    "F1Score",
    "Precision",
    "Recall",
    # generic names added with the task classes
    "AveragePrecision",
    "Specificity",
    "StatScores",
    # the task classes
    "BinaryAccuracy",
    "MulticlassAccuracy",
    "MultilabelAccuracy",
    "BinaryPrecision",
    "MulticlassPrecision",
    "MultilabelPrecision",
    "BinaryRecall",
    "MulticlassRecall",
    "MultilabelRecall",
    "BinaryF1Score",
    "MulticlassF1Score",
    "MultilabelF1Score",
    "BinarySpecificity",
    "MulticlassSpecificity",
    "MultilabelSpecificity",
    "BinaryStatScores",
    "MulticlassStatScores",
    "MultilabelStatScores",
    "BinaryConfusionMatrix",
    "MulticlassConfusionMatrix",
    "MultilabelConfusionMatrix",
    "BinaryAUROC",
    "MulticlassAUROC",
    "MultilabelAUROC",
    "BinaryAveragePrecision",
    "MulticlassAveragePrecision",
    "MultilabelAveragePrecision",
]
