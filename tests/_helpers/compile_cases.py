"""Every public metric and loss class with small valid inputs, for the ``torch.compile`` tests at world size 1.

Each case builds a fresh object (``make()``) and the arguments of its ``i``-th batch (``batch(i)``: seeded, a
different batch per ``i``, float64 where the class takes floats, so that compiled and eager values can be
compared exactly). ``LIST_STATES`` names the classes whose states are Python lists (``cat``): under
``torch.compile`` their rows are folded into one tensor per traced step, whose first dimension becomes dynamic at
the second call's recompile, so they warm up in three calls instead of two (docs/guide/compile.rst).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

import torchmetrics_diff as T
from torchmetrics_diff import losses as L

F64 = torch.float64
ROWS, DIM, CLASSES, LABELS, VOCAB = 6, 4, 3, 3, 5


class Case(NamedTuple):
    make: Callable[[], Any]
    batch: Callable[[int], tuple]


def _gen(i: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + i)


def _values(i: int) -> tuple:
    return (torch.randn(ROWS, generator=_gen(i), dtype=F64),)


def _pairs(i: int) -> tuple:
    g = _gen(i)
    return torch.randn(ROWS, generator=g, dtype=F64), torch.randn(ROWS, generator=g, dtype=F64)


def _embeddings(i: int) -> tuple:
    g = _gen(i)
    return torch.randn(ROWS, DIM, generator=g, dtype=F64), torch.randn(ROWS, DIM, generator=g, dtype=F64)


def _multiclass(i: int) -> tuple:
    g = _gen(i)
    return torch.randn(ROWS, CLASSES, generator=g, dtype=F64), torch.randint(0, CLASSES, (ROWS,), generator=g)


def _binary(i: int) -> tuple:
    g = _gen(i)  # probabilities on even batches, logits (values outside [0, 1]) on odd ones
    scores = torch.rand(ROWS, generator=g, dtype=F64) if i % 2 == 0 else torch.randn(ROWS, generator=g, dtype=F64)
    return scores, torch.tensor([0, 1] * (ROWS // 2))[torch.randperm(ROWS, generator=g)]


def _multilabel(i: int) -> tuple:
    g = _gen(i)
    return torch.rand(ROWS, LABELS, generator=g, dtype=F64), torch.randint(0, 2, (ROWS, LABELS), generator=g)


def _tokens(i: int) -> tuple:
    g = _gen(i)
    target = torch.randint(0, VOCAB, (2, 3), generator=g)
    target[0, 0] = -100  # an ignored token
    return torch.randn(2, 3, VOCAB, generator=g, dtype=F64), target


def _clip(i: int) -> tuple:
    return (*_embeddings(i), 2.0)


def _siglip(i: int) -> tuple:
    return (*_embeddings(i), 2.0, -1.0)


def _supcon(i: int) -> tuple:
    g = _gen(i)
    return torch.randn(ROWS, DIM, generator=g, dtype=F64), torch.tensor([0, 1, 0, 1, 2, 2])


def _queries(i: int) -> tuple:
    """Documents scored for three queries (rows interleaved): scores, 0/1 relevance, query ids."""
    g = _gen(i)
    target = torch.tensor([1, 0, 0, 1, 1, 0])[torch.randperm(ROWS, generator=g)]
    return torch.rand(ROWS, generator=g, dtype=F64), target, torch.tensor([0, 1, 2, 0, 1, 2])


def _router(i: int, probs: bool) -> tuple:
    """Two MoE layers' router probabilities (LoadBalancingLoss) or logits (RouterZLoss), with a padding mask."""
    g = _gen(i)
    logits = torch.randn(2, ROWS, CLASSES, generator=g, dtype=F64)
    mask = torch.arange(ROWS) < ROWS - 1
    if not probs:
        return logits, mask
    p = logits.softmax(-1)
    return p, p.topk(2, dim=-1).indices, mask


def _composed() -> Any:
    return T.SumMetric(nan_strategy="disable") + T.MaxMetric(nan_strategy="disable")


#: class name (and variant) -> case; every public metric and loss class of the package
CASES: dict[str, Case] = {
    "SumMetric": Case(lambda: T.SumMetric(nan_strategy="disable"), _values),
    "MeanMetric": Case(lambda: T.MeanMetric(nan_strategy="ignore"), _values),
    "MeanMetric-default": Case(lambda: T.MeanMetric(), _values),  # nan_strategy="warn"
    "MaxMetric": Case(lambda: T.MaxMetric(nan_strategy="error"), _values),
    "MinMetric": Case(lambda: T.MinMetric(nan_strategy=0.0), _values),
    "CatMetric": Case(lambda: T.CatMetric(nan_strategy="disable"), _values),
    "CompositionalMetric": Case(_composed, _values),
    "Accuracy": Case(lambda: T.Accuracy(task="multiclass", num_classes=CLASSES), _multiclass),
    "Accuracy-unvalidated": Case(
        lambda: T.Accuracy(task="multiclass", num_classes=CLASSES, validate_args=False), _multiclass
    ),
    "Precision": Case(lambda: T.Precision(task="multilabel", num_labels=LABELS, average="macro"), _multilabel),
    "Recall": Case(lambda: T.Recall(task="multiclass", num_classes=CLASSES, average="weighted"), _multiclass),
    "F1Score": Case(lambda: T.F1Score(task="binary"), _binary),
    "ConfusionMatrix": Case(
        lambda: T.ConfusionMatrix(task="multiclass", num_classes=CLASSES, ignore_index=-1, normalize="true"),
        _multiclass,
    ),
    "AUROC": Case(lambda: T.AUROC(task="binary"), _binary),
    "MeanSquaredError": Case(lambda: T.MeanSquaredError().double(), _pairs),
    "MeanAbsoluteError": Case(lambda: T.MeanAbsoluteError().double(), _pairs),
    "R2Score": Case(lambda: T.R2Score(adjusted=1).double(), _pairs),
    "PearsonCorrCoef": Case(lambda: T.PearsonCorrCoef().double(), _pairs),
    "CosineSimilarity": Case(lambda: T.CosineSimilarity(reduction="mean").double(), _embeddings),
    "CosineSimilarity-none": Case(lambda: T.CosineSimilarity(reduction="none").double(), _embeddings),
    "Perplexity": Case(lambda: T.Perplexity(ignore_index=-100).double(), _tokens),
    "CrossModalRecallAtK": Case(lambda: T.CrossModalRecallAtK(top_k=(1, 2)).double(), _embeddings),
    "CrossModalMeanRank": Case(lambda: T.CrossModalMeanRank().double(), _embeddings),
    "CrossModalMedianRank": Case(lambda: T.CrossModalMedianRank().double(), _embeddings),
    "CrossModalMAPAtK": Case(lambda: T.CrossModalMAPAtK(top_k=2).double(), _embeddings),
    "CLIPLoss": Case(lambda: L.CLIPLoss(), _clip),
    "InfoNCELoss": Case(lambda: L.InfoNCELoss(), _embeddings),
    "SigLIPLoss": Case(lambda: L.SigLIPLoss(), _siglip),
    "SupConLoss": Case(lambda: L.SupConLoss(), _supcon),
    "BarlowTwinsLoss": Case(lambda: L.BarlowTwinsLoss(), _embeddings),
    "GlobalMeanLoss": Case(lambda: L.GlobalMeanLoss(), _values),
    "TokenCrossEntropyLoss": Case(lambda: L.TokenCrossEntropyLoss(), _tokens),
    "VICRegLoss": Case(lambda: L.VICRegLoss(), _embeddings),
    "MeanAbsolutePercentageError": Case(lambda: T.MeanAbsolutePercentageError().double(), _pairs),
    "SymmetricMeanAbsolutePercentageError": Case(lambda: T.SymmetricMeanAbsolutePercentageError().double(), _pairs),
    "ExplainedVariance": Case(lambda: T.ExplainedVariance(multioutput="raw_values").double(), _pairs),
    "KLDivergence": Case(lambda: T.KLDivergence().double(), lambda i: tuple(x.abs() + 0.1 for x in _embeddings(i))),
    "KLDivergence-none": Case(
        lambda: T.KLDivergence(log_prob=True, reduction="none").double(),
        lambda i: tuple(x.log_softmax(-1) for x in _embeddings(i)),
    ),
    "SpearmanCorrCoef": Case(lambda: T.SpearmanCorrCoef().double(), _pairs),
    "CrossModalMRR": Case(lambda: T.CrossModalMRR(top_k=3).double(), _embeddings),
    "CrossModalNormalizedDCG": Case(lambda: T.CrossModalNormalizedDCG(top_k=3).double(), _embeddings),
    "LoadBalancingLoss": Case(lambda: L.LoadBalancingLoss(CLASSES, top_k=2), lambda i: _router(i, probs=True)),
    "RouterZLoss": Case(lambda: L.RouterZLoss(), lambda i: _router(i, probs=False)),
    # retrieval: torchmetrics' per-query metrics (not fullgraph: see GRAPH_BREAKS)
    "RetrievalMAP": Case(lambda: T.RetrievalMAP(top_k=2).set_dtype(F64), _queries),
    "RetrievalMRR": Case(lambda: T.RetrievalMRR().set_dtype(F64), _queries),
    "RetrievalPrecision": Case(lambda: T.RetrievalPrecision(top_k=2, adaptive_k=True).set_dtype(F64), _queries),
    "RetrievalRecall": Case(lambda: T.RetrievalRecall(top_k=2).set_dtype(F64), _queries),
    "RetrievalFallOut": Case(lambda: T.RetrievalFallOut(top_k=2).set_dtype(F64), _queries),
    "RetrievalHitRate": Case(lambda: T.RetrievalHitRate(top_k=1, aggregation="median").set_dtype(F64), _queries),
    "RetrievalNormalizedDCG": Case(lambda: T.RetrievalNormalizedDCG(top_k=3).set_dtype(F64), _queries),
    "RetrievalRPrecision": Case(lambda: T.RetrievalRPrecision(ignore_index=-1).set_dtype(F64), _queries),
    "RetrievalAUROC": Case(lambda: T.RetrievalAUROC(max_fpr=0.5).set_dtype(F64), _queries),
    "RetrievalPrecisionRecallCurve": Case(lambda: T.RetrievalPrecisionRecallCurve(max_k=3).set_dtype(F64), _queries),
    "RetrievalRecallAtFixedPrecision": Case(
        lambda: T.RetrievalRecallAtFixedPrecision(min_precision=0.5).set_dtype(F64), _queries
    ),
    # classification: the generic names and options added with the task classes
    "Specificity": Case(
        lambda: T.Specificity(task="multiclass", num_classes=CLASSES, average="macro", top_k=2), _multiclass
    ),
    "StatScores": Case(lambda: T.StatScores(task="multilabel", num_labels=LABELS, average="none"), _multilabel),
    "AveragePrecision": Case(lambda: T.AveragePrecision(task="multiclass", num_classes=CLASSES), _multiclass),
    "AUROC-multilabel": Case(lambda: T.AUROC(task="multilabel", num_labels=LABELS, average="weighted"), _multilabel),
}

#: the classes whose states are lists (compiled, they warm up in three calls: see _folded_lists in metric.py)
LIST_STATES = {
    "CatMetric",
    "AUROC",
    "CosineSimilarity-none",
    "CrossModalRecallAtK",
    "CrossModalMeanRank",
    "CrossModalMedianRank",
    "CrossModalMAPAtK",
    "KLDivergence-none",
    "SpearmanCorrCoef",
    "CrossModalMRR",
    "CrossModalNormalizedDCG",
    "AveragePrecision",
    "AUROC-multilabel",
}

#: the classes that compile with graph breaks, not ``fullgraph=True`` (list states too, not in LIST_STATES):
#: torchmetrics' per-query retrieval metrics check their batch (binary targets, ``ignore_index`` rows dropped) and
#: group the rows by query (data-dependent shapes) eagerly, each behind one break (docs/guide/compile.rst)
GRAPH_BREAKS = {
    "RetrievalMAP",
    "RetrievalMRR",
    "RetrievalPrecision",
    "RetrievalRecall",
    "RetrievalFallOut",
    "RetrievalHitRate",
    "RetrievalNormalizedDCG",
    "RetrievalRPrecision",
    "RetrievalAUROC",
    "RetrievalPrecisionRecallCurve",
    "RetrievalRecallAtFixedPrecision",
}


def _synced_objects() -> list[tuple[Any, tuple]]:
    """Objects of 17 metric and loss classes that sync on step, each with this rank's batch."""
    sync = {"dist_sync_on_step": True}
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    metrics = [
        (T.SumMetric(nan_strategy="disable", **sync), _values),
        (T.MeanMetric(nan_strategy="disable", **sync), _values),
        (T.MaxMetric(nan_strategy="disable", **sync), _values),
        (T.MinMetric(nan_strategy="disable", **sync), _values),
        (T.Accuracy(task="multiclass", num_classes=CLASSES, **sync), _multiclass),
        (T.Precision(task="multilabel", num_labels=LABELS, **sync), _multilabel),
        (T.Recall(task="multiclass", num_classes=CLASSES, **sync), _multiclass),
        (T.F1Score(task="binary", **sync), _binary),
        (T.ConfusionMatrix(task="multiclass", num_classes=CLASSES, **sync), _multiclass),
        (T.MeanSquaredError(**sync).double(), _pairs),
        (T.MeanAbsoluteError(**sync).double(), _pairs),
        (T.R2Score(**sync).double(), _pairs),
        (T.PearsonCorrCoef(**sync).double(), _pairs),
        (T.CosineSimilarity(reduction="mean", **sync).double(), _embeddings),
        (T.Perplexity(ignore_index=-100, **sync).double(), _tokens),
        (L.GlobalMeanLoss(), _values),
        (L.InfoNCELoss(), _embeddings),
    ]
    return [(m, batch(10 * rank)) for m, batch in metrics]


def synced_step_frames(rank: int, world: int, steps: int = 3) -> dict[str, Any]:
    """One compiled step calling every object of :func:`_synced_objects` (each syncs: each breaks inside its own
    ``forward``): frames compiled after two warm-up steps, recompile-limit hits, and the largest difference of
    the values and ``compute()`` from an eager twin's."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    traced, eager = _synced_objects(), _synced_objects()

    def step(objects: list[tuple[Any, tuple]]) -> list[Any]:
        return [m(*args) for m, args in objects]

    compiled = torch.compile(step, backend="eager")
    for _ in range(2):
        compiled(traced), step(eager)
    frames = counters["frames"]["total"]
    for _ in range(steps):
        values, expected = compiled(traced), step(eager)
    worst = 0.0
    for (metric, _), (twin, _), value, want in zip(traced, eager, values, expected):
        worst = max(worst, (value - want).abs().max().item(), (metric.compute() - twin.compute()).abs().max().item())
    limits = [r.splitlines()[0] for r in counters["unimplemented"] if "recompile limit" in r.lower()]
    out = {
        "classes": len({type(m) for m, _ in traced}),
        "late_frames": counters["frames"]["total"] - frames,
        "limits": limits,
        "worst": worst,
    }
    torch._dynamo.reset()
    return out
