"""The losses and the everyday metrics as pure functions.

``clip_loss``, ``info_nce_loss``, ... take the *already global* tensors (one process, or tensors you gathered
yourself); ``*_block`` forms score a block of rows; ``global_*`` forms take each rank's local rows and return the
global-batch loss with the gradient contract (``strategy="replicated" | "sharded" | "ring"``, :data:`STRATEGIES`).
``clip_sum`` is the one-pass CLIP kernel (each logit computed once, across ranks) that ``global_clip_loss`` runs.

Inside, one job per module: ``_checks`` (validation, dtypes, counts, scales), ``_contrastive`` (CLIP, InfoNCE,
SupCon, SigLIP: block and whole-batch forms), ``_normalized`` (weighted mean, token cross-entropy),
``_barlow_twins``, ``_kernels`` (the fused autograd kernels, free of communication), ``_strategy`` (the strategies,
their checks, the replicated and sharded runs), ``_ring`` (the ring kernels) and ``_global`` (the ``global_*``
functions); the everyday metrics' maths in ``_classification`` (with ``_curves`` for AUROC and average precision and
``_classification_tasks`` for the task forms), ``_regression``, ``_retrieval`` and ``_text``.
"""

from __future__ import annotations

from torchmetrics_diff.functional._barlow_twins import (
    BarlowTwinsStats,
    barlow_twins_from_stats,
    barlow_twins_loss,
    barlow_twins_stats,
)
from torchmetrics_diff.functional._classification import (
    StatScores,
    accuracy,
    confusion_matrix,
    f1_score,
    precision,
    recall,
    specificity,
    stat_scores,
)
from torchmetrics_diff.functional._classification_tasks import (
    binary_accuracy,
    binary_confusion_matrix,
    binary_f1_score,
    binary_precision,
    binary_recall,
    binary_specificity,
    binary_stat_scores,
    multiclass_accuracy,
    multiclass_confusion_matrix,
    multiclass_f1_score,
    multiclass_precision,
    multiclass_recall,
    multiclass_specificity,
    multiclass_stat_scores,
    multilabel_accuracy,
    multilabel_confusion_matrix,
    multilabel_f1_score,
    multilabel_precision,
    multilabel_recall,
    multilabel_specificity,
    multilabel_stat_scores,
)
from torchmetrics_diff.functional._contrastive import (
    clip_block,
    clip_loss,
    info_nce_block,
    info_nce_loss,
    siglip_block,
    siglip_loss,
    supcon_block,
    supcon_loss,
)
from torchmetrics_diff.functional._curves import (
    auroc,
    average_precision,
    binary_auroc,
    binary_average_precision,
    multiclass_auroc,
    multiclass_average_precision,
    multilabel_auroc,
    multilabel_average_precision,
)
from torchmetrics_diff.functional._global import (
    clip_sum,
    global_barlow_twins_loss,
    global_clip_loss,
    global_info_nce_loss,
    global_siglip_loss,
    global_supcon_loss,
    global_token_cross_entropy,
    global_weighted_mean,
)
from torchmetrics_diff.functional._normalized import (
    token_cross_entropy,
    token_cross_entropy_block,
    weighted_mean,
    weighted_mean_block,
)
from torchmetrics_diff.functional._regression import (
    cosine_similarity,
    mean_absolute_error,
    mean_squared_error,
    pearson_corrcoef,
    r2_score,
)
from torchmetrics_diff.functional._retrieval import (
    retrieval_map_at_k,
    retrieval_mean_rank,
    retrieval_median_rank,
    retrieval_ranks,
    retrieval_recall_at_k,
)
from torchmetrics_diff.functional._strategy import STRATEGIES, global_rows_loss
from torchmetrics_diff.functional._text import perplexity

__all__ = [
    "STRATEGIES",
    "BarlowTwinsStats",
    "barlow_twins_from_stats",
    "barlow_twins_loss",
    "barlow_twins_stats",
    "clip_block",
    "clip_loss",
    "clip_sum",
    "global_barlow_twins_loss",
    "global_clip_loss",
    "global_info_nce_loss",
    "global_rows_loss",
    "global_siglip_loss",
    "global_supcon_loss",
    "global_token_cross_entropy",
    "global_weighted_mean",
    "info_nce_block",
    "info_nce_loss",
    "siglip_block",
    "siglip_loss",
    "supcon_block",
    "supcon_loss",
    "token_cross_entropy",
    "token_cross_entropy_block",
    "weighted_mean",
    "weighted_mean_block",
    # everyday metrics
    "StatScores",
    "accuracy",
    "auroc",
    "confusion_matrix",
    "cosine_similarity",
    "f1_score",
    "mean_absolute_error",
    "mean_squared_error",
    "pearson_corrcoef",
    "perplexity",
    "precision",
    "r2_score",
    "recall",
    "retrieval_map_at_k",
    "retrieval_mean_rank",
    "retrieval_median_rank",
    "retrieval_ranks",
    "retrieval_recall_at_k",
    "stat_scores",
    # classification: the task forms and the ranking metrics
    "average_precision",
    "binary_auroc",
    "binary_average_precision",
    "multiclass_auroc",
    "multiclass_average_precision",
    "multilabel_auroc",
    "multilabel_average_precision",
    "specificity",
    "binary_accuracy",
    "multiclass_accuracy",
    "multilabel_accuracy",
    "binary_precision",
    "multiclass_precision",
    "multilabel_precision",
    "binary_recall",
    "multiclass_recall",
    "multilabel_recall",
    "binary_f1_score",
    "multiclass_f1_score",
    "multilabel_f1_score",
    "binary_specificity",
    "multiclass_specificity",
    "multilabel_specificity",
    "binary_stat_scores",
    "multiclass_stat_scores",
    "multilabel_stat_scores",
    "binary_confusion_matrix",
    "multiclass_confusion_matrix",
    "multilabel_confusion_matrix",
]
