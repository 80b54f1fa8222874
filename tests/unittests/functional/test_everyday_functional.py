"""The functional twins of the everyday metrics equal torchmetrics' functions on the same (one-process) data."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import torchmetrics_diff.functional as ours
from tests._helpers.seeds import F64, rand, seed


def _g(tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed("functional", tag))


P1, T1 = rand((40,), "f p1"), rand((40,), "f t1")
P3, T3 = rand((40, 3), "f p3"), 0.5 * rand((40, 3), "f p3") + rand((40, 3), "f t3")
SCORES, LABELS = torch.randn(40, 5, generator=_g("mc")), torch.randint(0, 5, (40,), generator=_g("mc t"))
PROBS, BIN = torch.rand(40, generator=_g("bin")), torch.randint(0, 2, (40,), generator=_g("bin t"))
ML_P, ML_T = torch.rand(40, 3, generator=_g("ml")), torch.randint(0, 2, (40, 3), generator=_g("ml t"))
LOGITS = torch.randn(4, 7, 6, generator=_g("ppl"), dtype=F64)
TOKENS = torch.randint(0, 6, (4, 7), generator=_g("ppl t"))
TOKENS[:, 5:] = -100

# name -> (ours, torchmetrics' name, args, kwargs); the same call on both sides
CASES: dict[str, tuple[Callable, str, tuple, dict]] = {
    "mean_squared_error": (ours.mean_squared_error, "mean_squared_error", (P1, T1), {}),
    "rmse 3 outputs": (ours.mean_squared_error, "mean_squared_error", (P3, T3), {"squared": False, "num_outputs": 3}),
    "mean_absolute_error": (ours.mean_absolute_error, "mean_absolute_error", (P3, T3), {}),
    "r2_score": (ours.r2_score, "r2_score", (P1, T1), {}),
    "r2_score raw": (ours.r2_score, "r2_score", (P3, T3), {"multioutput": "raw_values"}),
    "r2_score adjusted": (ours.r2_score, "r2_score", (P3, T3), {"adjusted": 3, "multioutput": "variance_weighted"}),
    "pearson_corrcoef": (ours.pearson_corrcoef, "pearson_corrcoef", (P1, T1), {}),
    "pearson_corrcoef 3": (ours.pearson_corrcoef, "pearson_corrcoef", (P3, T3), {}),
    "cosine_similarity": (ours.cosine_similarity, "cosine_similarity", (P3.float(), T3.float()), {"reduction": "mean"}),
    "accuracy": (ours.accuracy, "accuracy", (SCORES, LABELS), {"task": "multiclass", "num_classes": 5}),
    "precision macro": (
        ours.precision,
        "precision",
        (SCORES, LABELS),
        {"task": "multiclass", "num_classes": 5, "average": "macro"},
    ),
    "recall binary": (ours.recall, "recall", (PROBS, BIN), {"task": "binary", "threshold": 0.3}),
    "f1_score multilabel": (
        ours.f1_score,
        "f1_score",
        (ML_P, ML_T),
        {"task": "multilabel", "num_labels": 3, "average": "weighted"},
    ),
    "confusion_matrix": (
        ours.confusion_matrix,
        "confusion_matrix",
        (SCORES, LABELS),
        {"task": "multiclass", "num_classes": 5, "normalize": "true"},
    ),
    "auroc": (ours.auroc, "auroc", (PROBS, BIN), {"task": "binary"}),
    "perplexity": (ours.perplexity, "text.perplexity", (LOGITS, TOKENS), {"ignore_index": -100}),
    "mape": (ours.mean_absolute_percentage_error, "mean_absolute_percentage_error", (P3, T3), {}),
    "smape": (ours.symmetric_mean_absolute_percentage_error, "symmetric_mean_absolute_percentage_error", (P1, T1), {}),
    "explained_variance": (
        ours.explained_variance,
        "explained_variance",
        (P3, T3),
        {"multioutput": "variance_weighted"},
    ),
    "kl_divergence": (ours.kl_divergence, "kl_divergence", (P3.abs(), T3.abs()), {"reduction": "none"}),
    "spearman_corrcoef 3 with ties": (ours.spearman_corrcoef, "spearman_corrcoef", (P3.round(), T3), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_functional_equals_torchmetrics(name: str) -> None:
    import torchmetrics.functional.text  # perplexity lives in .text (its top-level import is deprecated)

    reference: Any = torchmetrics.functional
    fn, ref_name, args, kwargs = CASES[name]
    for part in ref_name.split("."):
        reference = getattr(reference, part)
    expected = reference(*args, **kwargs)
    torch.testing.assert_close(fn(*args, **kwargs), expected, atol=1e-6, rtol=1e-6, check_dtype=False)


def test_stat_scores_count_every_prediction_once() -> None:
    """tp + fp + tn + fn is the number of (row, class) cells, tp + fn the class supports (bincount of targets)."""
    s = ours.stat_scores(SCORES, LABELS, "multiclass", num_classes=5)
    assert torch.equal(s.tp + s.fp + s.tn + s.fn, torch.full((5,), 40))
    assert torch.equal(s.tp + s.fn, torch.bincount(LABELS, minlength=5))
    assert torch.equal(s.tp + s.fp, torch.bincount(SCORES.argmax(1), minlength=5))


def test_retrieval_chunk_size_does_not_change_the_result() -> None:
    image, text = rand((23, 4), "chunk image"), rand((23, 4), "chunk text")
    labels = torch.randint(0, 5, (23,), generator=_g("chunk labels"))
    full = ours.retrieval_map_at_k(image, text, labels, top_k=7, chunk_size=100)
    for chunk in (1, 4, 22):
        assert ours.retrieval_map_at_k(image, text, labels, top_k=7, chunk_size=chunk) == full
        assert torch.equal(
            ours.retrieval_ranks(image, text, labels, chunk_size=chunk)["t2i"],
            ours.retrieval_ranks(image, text, labels, chunk_size=100)["t2i"],
        )
    full_ndcg = ours.retrieval_ndcg(image.round(), text.round(), labels, top_k=5, normalize=False, chunk_size=100)
    for chunk in (1, 4, 22):  # tied scores too
        assert (
            ours.retrieval_ndcg(image.round(), text.round(), labels, 5, normalize=False, chunk_size=chunk) == full_ndcg
        )
