"""Retrieval metrics, two families.

* torchmetrics' retrieval metrics under its names (:mod:`~torchmetrics_diff.retrieval.queries`): documents scored
  for queries, ``update(preds, target, indexes)``, each query grouped over every rank's rows.
* Cross-modal retrieval over the global gallery (:mod:`~torchmetrics_diff.retrieval.cross_modal`): paired
  image/text embeddings, every query scored against every rank's rows in memory-bounded chunks.

``RetrievalRecallAtK``, ``RetrievalMAPAtK``, ``RetrievalMeanRank`` and ``RetrievalMedianRank``, the cross-modal
metrics' old names, remain for one release as deprecated aliases (``FutureWarning``) of the ``CrossModal*`` classes.
"""

from __future__ import annotations

from torchmetrics_diff.retrieval.cross_modal import (
    CrossModalMAPAtK,
    CrossModalMeanRank,
    CrossModalMedianRank,
    CrossModalMRR,
    CrossModalNormalizedDCG,
    CrossModalRecallAtK,
    RetrievalMAPAtK,
    RetrievalMeanRank,
    RetrievalMedianRank,
    RetrievalRecallAtK,
)
from torchmetrics_diff.retrieval.queries import (
    RetrievalAUROC,
    RetrievalFallOut,
    RetrievalHitRate,
    RetrievalMAP,
    RetrievalMRR,
    RetrievalNormalizedDCG,
    RetrievalPrecision,
    RetrievalPrecisionRecallCurve,
    RetrievalRecall,
    RetrievalRecallAtFixedPrecision,
    RetrievalRPrecision,
)

__all__ = [
    # torchmetrics' retrieval metrics
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
    # cross-modal retrieval over the global gallery
    "CrossModalMAPAtK",
    "CrossModalMeanRank",
    "CrossModalMedianRank",
    "CrossModalMRR",
    "CrossModalNormalizedDCG",
    "CrossModalRecallAtK",
]

# deprecated aliases (not in __all__): importable for one more release
_DEPRECATED = (RetrievalMAPAtK, RetrievalMeanRank, RetrievalMedianRank, RetrievalRecallAtK)
