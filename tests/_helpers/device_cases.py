"""Every loss (with each strategy) and every metric class of the package on one device, against references.

The bodies run on every rank of a process group (or without one) with the rows of a global batch that every
rank can rebuild (:mod:`tests._helpers.seeds`); they return failures as strings (:class:`~.checks.Checks`).
The CUDA tests run them on ``cuda:0`` under NCCL at one process and under gloo at two
(``tests/unittests/test_cuda_distributed.py``); the device is an argument, so the same bodies read the same on
any device.

References, all on the CPU in float64 and independent of the package:

- losses: the single-process model on the whole global batch through the formulas of
  :mod:`tests._helpers.references` (:func:`~.loss_cases.reference_step`): value and every parameter's gradient,
  the ranks' gradients summed (``grad_reduction="sum"``);
- metrics: the formulas below (means, counts, a brute-force AUROC over every positive/negative pair, ranks by
  comparing every score), written here.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

import torchmetrics_diff as tmd
from tests._helpers.checks import Checks, tensor_devices
from tests._helpers.loss_cases import (
    KINDS,
    MOE_KINDS,
    SSL_KINDS,
    STRATEGY_KINDS,
    Net,
    criterion_call,
    make_batch,
    make_criterion,
    reference_step,
    slice_rows,
)
from tests._helpers.seeds import F64, bounds, generator

#: rows of each rank, by world size (uneven at two ranks)
SIZES = {1: (9,), 2: (3, 6)}
#: every loss kind with each of its strategies (``None``: the loss has none)
LOSS_CASES: list[tuple[str, str | None]] = [
    (kind, strategy)
    for kind in KINDS
    for strategy in (("replicated", "sharded", "ring") if kind in STRATEGY_KINDS else (None,))
] + [(kind, None) for kind in (*MOE_KINDS, *SSL_KINDS)]
LOSS_TOL = (1e-9, 1e-11)  # float64 throughout: only the order of operations differs
METRIC_TOL = (1e-5, 1e-6)  # some states are float32
CLASSES, K_TOP = 3, (1, 3)


# ------------------------------------------------------------------------------------------------ the data
def _gen(*parts: object) -> torch.Generator:
    return generator("device", *parts)


def _values(n: int) -> tuple[Tensor, ...]:
    return (torch.randn(n, generator=_gen("values", n), dtype=F64),)


def _regression(n: int) -> tuple[Tensor, ...]:
    g = _gen("regression", n)
    preds = torch.randn(n, generator=g, dtype=F64)
    return preds, 0.7 * preds + 0.5 * torch.randn(n, generator=g, dtype=F64)


def _multiclass(n: int) -> tuple[Tensor, ...]:
    """Predicted and true classes; every class is predicted and true at least once (rows 0..2)."""
    g = _gen("classes", n)
    preds, target = torch.randint(0, CLASSES, (2, n), generator=g)
    preds[:CLASSES] = target[:CLASSES] = torch.arange(CLASSES)
    return preds, target


def _binary(n: int) -> tuple[Tensor, ...]:
    scores = torch.rand(n, generator=_gen("binary", n), dtype=F64)
    return scores, torch.arange(n) % 2


def _pairs(n: int) -> tuple[Tensor, ...]:
    g = _gen("pairs", n)
    a = torch.randn(n, 4, generator=g, dtype=F64)
    return a, a + 0.8 * torch.randn(n, 4, generator=g, dtype=F64)


def _tokens(n: int) -> tuple[Tensor, ...]:
    g = _gen("tokens", n)
    return torch.randn(n, 3, 5, generator=g, dtype=F64), torch.randint(0, 5, (n, 3), generator=g)


# -------------------------------------------------------------------------------------------- the references
def _per_class(preds: Tensor, target: Tensor) -> list[tuple[int, int, int]]:
    """``(tp, fp, fn)`` of every class, counted one row at a time."""
    out = []
    for c in range(CLASSES):
        tp = sum(1 for p, t in zip(preds.tolist(), target.tolist()) if p == c and t == c)
        fp = sum(1 for p, t in zip(preds.tolist(), target.tolist()) if p == c and t != c)
        fn = sum(1 for p, t in zip(preds.tolist(), target.tolist()) if p != c and t == c)
        out.append((tp, fp, fn))
    return out


def _precision(preds: Tensor, target: Tensor) -> float:
    return statistics.fmean(tp / (tp + fp) for tp, fp, _ in _per_class(preds, target))


def _recall(preds: Tensor, target: Tensor) -> float:
    return statistics.fmean(tp / (tp + fn) for tp, _, fn in _per_class(preds, target))


def _f1(preds: Tensor, target: Tensor) -> float:
    return statistics.fmean(2 * tp / (2 * tp + fp + fn) for tp, fp, fn in _per_class(preds, target))


def _confusion(preds: Tensor, target: Tensor) -> Tensor:
    out = torch.zeros(CLASSES, CLASSES, dtype=F64)
    for p, t in zip(preds.tolist(), target.tolist()):
        out[t, p] += 1  # rows: the true class
    return out


def _auroc(scores: Tensor, target: Tensor) -> float:
    pos = [s for s, t in zip(scores.tolist(), target.tolist()) if t == 1]
    neg = [s for s, t in zip(scores.tolist(), target.tolist()) if t == 0]
    return statistics.fmean((p > q) + 0.5 * (p == q) for p in pos for q in neg)


def _specificity(preds: Tensor, target: Tensor) -> float:
    n = len(target)
    return statistics.fmean((n - tp - fp - fn) / (n - tp - fn) for tp, fp, fn in _per_class(preds, target))


def _stat_scores(preds: Tensor, target: Tensor) -> list[int]:
    """``[tp, fp, tn, fn, support]`` summed over the classes."""
    counts = _per_class(preds, target)
    tp, fp, fn = (sum(c[i] for c in counts) for i in range(3))
    return [tp, fp, CLASSES * len(target) - tp - fp - fn, fn, tp + fn]


def _average_precision(scores: Tensor, target: Tensor) -> float:
    """The mean over the positives of the precision at the positive's score (every row scoring at least as high)."""
    rows = list(zip(scores.tolist(), target.tolist()))
    pos = [s for s, t in rows if t == 1]
    return statistics.fmean(sum(t for q, t in rows if q >= s) / sum(1 for q, _ in rows if q >= s) for s in pos)


def _r2(preds: Tensor, target: Tensor) -> float:
    return 1 - float(((target - preds) ** 2).sum()) / float(((target - target.mean()) ** 2).sum())


def _pearson(preds: Tensor, target: Tensor) -> float:
    dp, dt = preds - preds.mean(), target - target.mean()
    return float((dp * dt).sum() / ((dp * dp).sum() * (dt * dt).sum()).sqrt())


def _cosine(a: Tensor, b: Tensor) -> float:
    return statistics.fmean(float(x @ y / (x.norm() * y.norm())) for x, y in zip(a, b))


def _perplexity(logits: Tensor, target: Tensor) -> float:
    log_p = torch.log_softmax(logits, dim=-1)
    picked = [float(log_p[i, j, target[i, j]]) for i in range(target.shape[0]) for j in range(target.shape[1])]
    return float(torch.tensor(-statistics.fmean(picked), dtype=F64).exp())


def _ranks(image: Tensor, text: Tensor) -> dict[str, list[int]]:
    """Each query's rank per direction: 1 + the gallery items other than its pair scoring at least as high."""
    image, text = image / image.norm(dim=1, keepdim=True), text / text.norm(dim=1, keepdim=True)
    out = {}
    for direction, (queries, gallery) in {"i2t": (image, text), "t2i": (text, image)}.items():
        scores = (queries @ gallery.T).tolist()
        n = len(scores)
        out[direction] = [1 + sum(1 for j in range(n) if j != i and scores[i][j] >= scores[i][i]) for i in range(n)]
    return out


def _recall_at_k(image: Tensor, text: Tensor) -> dict[str, float]:
    ranks = _ranks(image, text)
    return {f"{d}_R@{k}": statistics.fmean(r <= k for r in ranks[d]) for d in ranks for k in K_TOP}


def _mean_rank(image: Tensor, text: Tensor) -> dict[str, float]:
    return {f"{d}_mean_rank": statistics.fmean(r) for d, r in _ranks(image, text).items()}


def _median_rank(image: Tensor, text: Tensor) -> dict[str, float]:
    return {f"{d}_median_rank": statistics.median(r) for d, r in _ranks(image, text).items()}


def _map_at_k(image: Tensor, text: Tensor) -> dict[str, float]:
    """One positive per query (its pair): AP@k is 1 / rank within the top k, else 0."""
    k = K_TOP[-1]
    return {
        f"{d}_mAP@{k}": statistics.fmean(1 / x if x <= k else 0.0 for x in r) for d, r in _ranks(image, text).items()
    }


def _distributions(n: int) -> tuple[Tensor, ...]:
    g = _gen("distributions", n)
    return tuple(torch.rand(2, n, 4, generator=g, dtype=F64) + 0.05)


def _kl(p: Tensor, q: Tensor) -> float:
    """Mean over rows of ``Σ p log(p / q)``, each row divided by its sum first."""
    rows = []
    for a, b in zip(p.tolist(), q.tolist()):
        pa, qb = [x / sum(a) for x in a], [x / sum(b) for x in b]
        rows.append(sum(x * float(torch.tensor(x / y, dtype=F64).log()) for x, y in zip(pa, qb)))
    return statistics.fmean(rows)


def _explained_variance(preds: Tensor, target: Tensor) -> float:
    err, t = (target - preds).tolist(), target.tolist()
    return 1 - statistics.pvariance(err) / statistics.pvariance(t)


def _average_ranks(x: list[float]) -> list[float]:
    """1 + the values below, plus half the other values equal (ties share the mean of their ranks)."""
    return [1 + sum(y < v for y in x) + (sum(y == v for y in x) - 1) / 2 for v in x]


def _spearman(preds: Tensor, target: Tensor) -> float:
    return _pearson(torch.tensor(_average_ranks(preds.tolist())), torch.tensor(_average_ranks(target.tolist())))


def _mrr(image: Tensor, text: Tensor) -> dict[str, float]:
    return {f"{d}_MRR": statistics.fmean(1 / x for x in r) for d, r in _ranks(image, text).items()}


def _ndcg_at_k(image: Tensor, text: Tensor) -> dict[str, float]:
    """One positive per query (its pair), no ties: nDCG@k is ``1 / log2(rank + 1)`` within the top k, else 0."""
    k = K_TOP[-1]
    return {
        f"{d}_nDCG@{k}": statistics.fmean(1 / float(torch.tensor(x + 1.0).log2()) if x <= k else 0.0 for x in r)
        for d, r in _ranks(image, text).items()
    }


def _queries(n: int) -> tuple[Tensor, ...]:
    """Documents of three queries, rows interleaved (so each query's rows sit on every rank): distinct scores,
    0/1 relevance (every query with a relevant and a non-relevant document), int64 query ids."""
    g = _gen("queries", n)
    indexes = torch.arange(n) % 3
    target = (torch.arange(n) // 3) % 2
    return torch.rand(n, generator=g, dtype=F64), target, indexes


def _torchmetrics(name: str, **kwargs: Any) -> Callable[..., Any]:
    """The reference of torchmetrics' retrieval class ``name`` (float32, as it stores scores) on the global batch."""

    def reference(preds: Tensor, target: Tensor, indexes: Tensor) -> Any:
        import torchmetrics.retrieval

        metric = getattr(torchmetrics.retrieval, name)(**kwargs)
        metric.update(preds, target, indexes)
        return metric.compute()

    return reference


def _retrieval_case(name: str, **kwargs: Any) -> MetricCase:
    return MetricCase(lambda: getattr(tmd, name)(**kwargs), _queries, _torchmetrics(name, **kwargs))


class MetricCase(NamedTuple):
    make: Callable[[], tmd.Metric]
    data: Callable[[int], tuple[Tensor, ...]]  # the global batch of n rows; a rank updates with its rows
    reference: Callable[..., Any]  # of the whole global batch: a number, a tensor or a dict of numbers


#: every metric class the package exports, by name
METRIC_CASES: dict[str, MetricCase] = {
    "MeanMetric": MetricCase(tmd.MeanMetric, _values, lambda x: float(x.mean())),
    "SumMetric": MetricCase(tmd.SumMetric, _values, lambda x: float(x.sum())),
    "MaxMetric": MetricCase(tmd.MaxMetric, _values, lambda x: max(x.tolist())),
    "MinMetric": MetricCase(tmd.MinMetric, _values, lambda x: min(x.tolist())),
    "CatMetric": MetricCase(tmd.CatMetric, _values, lambda x: x.clone()),
    "Accuracy": MetricCase(
        lambda: tmd.Accuracy(task="multiclass", num_classes=CLASSES),
        _multiclass,
        lambda p, t: statistics.fmean(a == b for a, b in zip(p.tolist(), t.tolist())),
    ),
    "Precision": MetricCase(
        lambda: tmd.Precision(task="multiclass", num_classes=CLASSES, average="macro"), _multiclass, _precision
    ),
    "Recall": MetricCase(
        lambda: tmd.Recall(task="multiclass", num_classes=CLASSES, average="macro"), _multiclass, _recall
    ),
    "F1Score": MetricCase(
        lambda: tmd.F1Score(task="multiclass", num_classes=CLASSES, average="macro"), _multiclass, _f1
    ),
    "ConfusionMatrix": MetricCase(
        lambda: tmd.ConfusionMatrix(task="multiclass", num_classes=CLASSES), _multiclass, _confusion
    ),
    "AUROC": MetricCase(lambda: tmd.AUROC(task="binary"), _binary, _auroc),
    "MeanSquaredError": MetricCase(tmd.MeanSquaredError, _regression, lambda p, t: float(((p - t) ** 2).mean())),
    "MeanAbsoluteError": MetricCase(tmd.MeanAbsoluteError, _regression, lambda p, t: float((p - t).abs().mean())),
    "R2Score": MetricCase(tmd.R2Score, _regression, _r2),
    "PearsonCorrCoef": MetricCase(tmd.PearsonCorrCoef, _regression, _pearson),
    "CosineSimilarity": MetricCase(lambda: tmd.CosineSimilarity(reduction="mean"), _pairs, _cosine),
    "Perplexity": MetricCase(tmd.Perplexity, _tokens, _perplexity),
    "CrossModalRecallAtK": MetricCase(lambda: tmd.CrossModalRecallAtK(top_k=K_TOP), _pairs, _recall_at_k),
    "CrossModalMeanRank": MetricCase(tmd.CrossModalMeanRank, _pairs, _mean_rank),
    "CrossModalMedianRank": MetricCase(tmd.CrossModalMedianRank, _pairs, _median_rank),
    "CrossModalMAPAtK": MetricCase(lambda: tmd.CrossModalMAPAtK(top_k=K_TOP[-1]), _pairs, _map_at_k),
    "MeanAbsolutePercentageError": MetricCase(
        tmd.MeanAbsolutePercentageError, _regression, lambda p, t: float(((p - t).abs() / t.abs()).mean())
    ),
    "SymmetricMeanAbsolutePercentageError": MetricCase(
        tmd.SymmetricMeanAbsolutePercentageError,
        _regression,
        lambda p, t: float((2 * (p - t).abs() / (p.abs() + t.abs())).mean()),
    ),
    "ExplainedVariance": MetricCase(tmd.ExplainedVariance, _regression, _explained_variance),
    "KLDivergence": MetricCase(tmd.KLDivergence, _distributions, _kl),
    "SpearmanCorrCoef": MetricCase(tmd.SpearmanCorrCoef, _regression, _spearman),
    "CrossModalMRR": MetricCase(tmd.CrossModalMRR, _pairs, _mrr),
    "CrossModalNormalizedDCG": MetricCase(lambda: tmd.CrossModalNormalizedDCG(top_k=K_TOP[-1]), _pairs, _ndcg_at_k),
    # retrieval: torchmetrics' per-query metrics, against torchmetrics' classes
    "RetrievalMAP": _retrieval_case("RetrievalMAP", top_k=2),
    "RetrievalMRR": _retrieval_case("RetrievalMRR"),
    "RetrievalPrecision": _retrieval_case("RetrievalPrecision", top_k=2),
    "RetrievalRecall": _retrieval_case("RetrievalRecall", top_k=2),
    "RetrievalFallOut": _retrieval_case("RetrievalFallOut", top_k=2),
    "RetrievalHitRate": _retrieval_case("RetrievalHitRate", top_k=1),
    "RetrievalNormalizedDCG": _retrieval_case("RetrievalNormalizedDCG", top_k=2),
    "RetrievalRPrecision": _retrieval_case("RetrievalRPrecision"),
    "RetrievalAUROC": _retrieval_case("RetrievalAUROC", max_fpr=0.5),
    "RetrievalPrecisionRecallCurve": _retrieval_case("RetrievalPrecisionRecallCurve", max_k=2),
    "RetrievalRecallAtFixedPrecision": _retrieval_case("RetrievalRecallAtFixedPrecision", min_precision=0.5),
    # classification: the generic names added with the task classes
    "Specificity": MetricCase(
        lambda: tmd.Specificity(task="multiclass", num_classes=CLASSES, average="macro"), _multiclass, _specificity
    ),
    "StatScores": MetricCase(lambda: tmd.StatScores(task="multiclass", num_classes=CLASSES), _multiclass, _stat_scores),
    "AveragePrecision": MetricCase(lambda: tmd.AveragePrecision(task="binary"), _binary, _average_precision),
}


# ---------------------------------------------------------------------------------------------- the bodies
def _close(checks: Checks, what: str, got: Any, want: Any, tol: tuple[float, float]) -> None:
    """``|got - want| <= atol + rtol * |want|`` elementwise, shapes equal (NaN never passes)."""
    rtol, atol = tol
    got_t, want_t = torch.as_tensor(got, dtype=F64), torch.as_tensor(want, dtype=F64)
    if got_t.shape != want_t.shape or not bool(((got_t - want_t).abs() <= atol + rtol * want_t.abs()).all()):
        checks.fail(what, f"got {got}, expected {want}")


def run_loss_cases(rank: int, world: int, device: torch.device, cases: list[tuple[str, str | None]]) -> list[str]:
    """Each loss case on this rank's rows on ``device``: the value and the ranks' summed gradients against the
    reference, and the value, gradients and recorded states on ``device``."""
    checks = Checks(f"W={world} rank {rank} {device} ")
    sizes = SIZES[world]
    lo, hi = bounds(sizes, rank)
    n = sum(sizes)
    for kind, strategy in cases:
        what = f"{kind} strategy={strategy}"
        model = Net(kind).to(device)
        criterion = make_criterion(kind, strategy, "sum").to(device)
        inputs, extra = make_batch(kind, n, 0)
        inputs = tuple(t.to(device) for t in slice_rows(inputs, lo, hi))
        extra = tuple(t.to(device) for t in slice_rows(extra, lo, hi))
        args, kwargs = criterion_call(kind, model(*inputs), extra)
        loss = criterion(*args, **kwargs)
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():
            if p.grad is not None and p.grad.device != device:
                checks.fail(what, f"gradient of {name} on {p.grad.device}")
            grad = torch.zeros(p.shape, dtype=F64) if p.grad is None else p.grad.detach().cpu().clone()
            if world > 1:  # the summing trainer, on the host: the test's bookkeeping, not the package's
                dist.all_reduce(grad)
            grads[name] = grad
        if loss.device != device:
            checks.fail(what, f"value on {loss.device}")
        if not tensor_devices(criterion.metric_state) <= {device}:
            checks.fail(what, f"states on {tensor_devices(criterion.metric_state)}")
        ref_value, ref_grads = reference_step(kind, n, 0)
        _close(checks, f"{what} value", float(loss.detach()), ref_value, LOSS_TOL)
        for name, want in ref_grads.items():
            _close(checks, f"{what} gradient of {name}", grads[name], want, LOSS_TOL)
    return checks.failures


def run_metric_cases(rank: int, world: int, device: torch.device, names: list[str]) -> list[str]:
    """Each metric updated with this rank's rows on ``device``: ``compute()`` equals the reference of the whole
    global batch, and the states and the result stay on ``device``."""
    checks = Checks(f"W={world} rank {rank} {device} ")
    sizes = SIZES[world]
    lo, hi = bounds(sizes, rank)
    for name in names:
        case = METRIC_CASES[name]
        data = case.data(sum(sizes))
        metric = case.make().to(device)
        metric.update(*(t[lo:hi].to(device) for t in data))
        if not tensor_devices(metric.metric_state) <= {device}:
            checks.fail(name, f"states on {tensor_devices(metric.metric_state)}")
        got = metric.compute()
        where = tensor_devices(got)
        if where != {device}:
            checks.fail(name, f"result on {where}")
        want = case.reference(*data)
        if isinstance(want, tuple):  # (a curve's tensors): compared one by one, as floats
            if not isinstance(got, tuple) or len(got) != len(want):
                checks.fail(name, f"got {type(got).__name__}, expected a tuple of {len(want)}")
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                _close(checks, f"{name}[{i}]", g.detach().cpu().to(F64), w.to(F64), METRIC_TOL)
        elif isinstance(want, dict):
            if not isinstance(got, dict) or set(got) != set(want):
                checks.fail(
                    name, f"keys {sorted(got) if isinstance(got, dict) else type(got)}, expected {sorted(want)}"
                )
                continue
            for key, value in want.items():
                _close(checks, f"{name}[{key}]", got[key].detach().cpu().to(F64), value, METRIC_TOL)
        else:
            _close(checks, name, got.detach().cpu().to(F64), want, METRIC_TOL)
    return checks.failures
