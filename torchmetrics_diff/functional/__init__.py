"""The losses and the everyday metrics as pure functions.

``clip_loss``, ``info_nce_loss``, ... take the *already global* tensors (one process, or tensors you gathered
yourself); ``*_block`` forms score a block of rows; ``global_*`` forms take each rank's local rows and return the
global-batch loss with the gradient contract (``strategy="auto" | "replicated" | "sharded" | "ring"``,
:data:`STRATEGIES`; ``"auto"``, the default, picks one of the others per call).
``clip_sum`` is the one-pass CLIP kernel (each logit computed once, across ranks) that ``global_clip_loss`` runs.

This package is the functional layer: its modules import nothing of the package outside ``functional/``
(:ref:`architecture-layers`). The names that communicate — the ``global_*`` functions, ``clip_sum``,
``dino_center_update``, ``global_rows_loss`` and :data:`STRATEGIES` — live one layer up, in
``torchmetrics_diff._global``, above ``distributed``; this module offers them too, resolved on first use
(``__getattr__`` below), and type checkers see them through its ``TYPE_CHECKING`` import.

Inside, one job per module: ``_checks`` (validation, dtypes, counts, scales), ``_contrastive`` (CLIP, InfoNCE,
SupCon, SigLIP: block and whole-batch forms), ``_normalized`` (weighted mean, token cross-entropy),
``_barlow_twins``, ``_vicreg``, ``_dino`` (the teacher center's maths), ``_moe`` (the Mixture-of-Experts router
losses), ``_kernels`` (the fused autograd kernels, free of communication); the everyday metrics' maths in
``_classification`` (the tasks' inputs and stat scores), ``_classification_scores`` (the scores reduced from them),
``_confusion_matrix``, ``_curves`` and ``_curve_functions`` (AUROC and average precision),
``_classification_tasks`` (the task forms), ``_regression``, ``_correlation`` and ``_similarity`` (regression),
``_retrieval`` and ``_text``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmetrics_diff.functional._barlow_twins import (
    BarlowTwinsStats,
    barlow_twins_from_stats,
    barlow_twins_loss,
    barlow_twins_stats,
)
from torchmetrics_diff.functional._classification import StatScores, stat_scores
from torchmetrics_diff.functional._classification_scores import accuracy, f1_score, precision, recall, specificity
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
from torchmetrics_diff.functional._confusion_matrix import confusion_matrix
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
from torchmetrics_diff.functional._correlation import explained_variance, pearson_corrcoef, r2_score, spearman_corrcoef
from torchmetrics_diff.functional._curve_functions import (
    auroc,
    average_precision,
    binary_auroc,
    binary_average_precision,
    multiclass_auroc,
    multiclass_average_precision,
    multilabel_auroc,
    multilabel_average_precision,
)
from torchmetrics_diff.functional._moe import (
    LoadBalancingStats,
    expert_load,
    load_balancing_from_stats,
    load_balancing_loss,
    load_balancing_stats,
    router_z_block,
    router_z_loss,
)
from torchmetrics_diff.functional._normalized import (
    token_cross_entropy,
    token_cross_entropy_block,
    weighted_mean,
    weighted_mean_block,
)
from torchmetrics_diff.functional._regression import (
    mean_absolute_error,
    mean_absolute_percentage_error,
    mean_squared_error,
    symmetric_mean_absolute_percentage_error,
)
from torchmetrics_diff.functional._retrieval import (
    retrieval_map_at_k,
    retrieval_mean_rank,
    retrieval_median_rank,
    retrieval_mrr,
    retrieval_ndcg,
    retrieval_ranks,
    retrieval_recall_at_k,
)
from torchmetrics_diff.functional._retrieval_query_functions import (
    retrieval_auroc,
    retrieval_average_precision,
    retrieval_fall_out,
    retrieval_hit_rate,
    retrieval_normalized_dcg,
    retrieval_precision,
    retrieval_precision_recall_curve,
    retrieval_r_precision,
    retrieval_recall,
    retrieval_reciprocal_rank,
)
from torchmetrics_diff.functional._similarity import cosine_similarity, kl_divergence
from torchmetrics_diff.functional._text import perplexity
from torchmetrics_diff.functional._vicreg import (
    VICRegStats,
    VICRegTerms,
    vicreg_from_stats,
    vicreg_loss,
    vicreg_stats,
    vicreg_terms,
)

if TYPE_CHECKING:  # what type checkers see; at run time ``__getattr__`` resolves these names on first use
    from torchmetrics_diff._global import (
        STRATEGIES,
        clip_sum,
        dino_center_update,
        global_barlow_twins_loss,
        global_clip_loss,
        global_info_nce_loss,
        global_load_balancing_loss,
        global_router_z_loss,
        global_rows_loss,
        global_siglip_loss,
        global_supcon_loss,
        global_token_cross_entropy,
        global_vicreg_loss,
        global_vicreg_stats,
        global_weighted_mean,
    )


def __getattr__(name: str) -> object:
    """A name of the global layer, imported from ``torchmetrics_diff._global`` on first use (PEP 562).

    The one import of ``functional/`` from outside it, and a lazy one: importing ``functional`` loads nothing of
    the layers above (:ref:`architecture-layers`). The object is kept in this module, so that later look-ups are
    plain attribute reads; ``from torchmetrics_diff.functional import *`` resolves them through ``__all__``.
    """
    if name in _GLOBAL_NAMES:
        from torchmetrics_diff import _global

        value = getattr(_global, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _GLOBAL_NAMES)


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
    # self-supervised regularizers
    "VICRegStats",
    "VICRegTerms",
    "dino_center_update",
    "global_vicreg_loss",
    "global_vicreg_stats",
    "vicreg_from_stats",
    "vicreg_loss",
    "vicreg_stats",
    "vicreg_terms",
    "explained_variance",
    "kl_divergence",
    "mean_absolute_percentage_error",
    "spearman_corrcoef",
    "symmetric_mean_absolute_percentage_error",
    "retrieval_mrr",
    "retrieval_ndcg",
    # Mixture-of-Experts router losses
    "LoadBalancingStats",
    "expert_load",
    "global_load_balancing_loss",
    "global_router_z_loss",
    "load_balancing_from_stats",
    "load_balancing_loss",
    "load_balancing_stats",
    "router_z_block",
    "router_z_loss",
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
    "retrieval_auroc",
    "retrieval_average_precision",
    "retrieval_fall_out",
    "retrieval_hit_rate",
    "retrieval_normalized_dcg",
    "retrieval_precision",
    "retrieval_precision_recall_curve",
    "retrieval_r_precision",
    "retrieval_recall",
    "retrieval_reciprocal_rank",
]

#: the names of the global layer offered here, resolved on first use: those of ``__all__`` that no import above
#: binds (``torchmetrics_diff._global.__all__``, which the facade's test checks)
_GLOBAL_NAMES = frozenset(__all__).difference(globals())
