"""Cross-modal retrieval metrics over the global gallery (every rank's rows), scored in memory-bounded chunks."""

from __future__ import annotations

from torchmetrics_diff.retrieval.cross_modal import (
    RetrievalMAPAtK,
    RetrievalMeanRank,
    RetrievalMedianRank,
    RetrievalMRR,
    RetrievalNormalizedDCG,
    RetrievalRecallAtK,
)

__all__ = [
    "RetrievalMAPAtK",
    "RetrievalMeanRank",
    "RetrievalMedianRank",
    "RetrievalRecallAtK",
    "RetrievalMRR",
    "RetrievalNormalizedDCG",
]
