"""MAPE, SMAPE, explained variance, KL divergence and Spearman on the global batch.

One spawned run per world size (W = 1, 2, 3) does everything on every rank: the values after several updates
(uneven batches, a rank with zero rows) and of a synced ``forward``, which must equal torchmetrics' functions (and,
for Spearman, ``scipy.stats.spearmanr``) on the concatenation of every rank's rows; the gradient contract of the
differentiable ones (float64, DDP, ``dist_sync_on_step=True``: value and parameter gradients equal one process on
the concatenated batch, against plain-torch formulas written here); and the collectives of a collection holding
all of them (one per steady-state sync). Every rank rebuilds the whole global data from seeds; references run in
the pytest process (importing torchmetrics or scipy costs each worker seconds), never from this package.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.metrics import IN_FEATURES, make_model
from tests._helpers.outcomes import Outcome, outcome, problem
from tests._helpers.seeds import F64, bounds, rand
from torchmetrics_diff import (
    ExplainedVariance,
    KLDivergence,
    MeanAbsolutePercentageError,
    Metric,
    MetricCollection,
    SpearmanCorrCoef,
    SymmetricMeanAbsolutePercentageError,
)
from torchmetrics_diff.functional import (
    explained_variance,
    kl_divergence,
    mean_absolute_percentage_error,
    spearman_corrcoef,
    symmetric_mean_absolute_percentage_error,
)

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [5, 0, 7], "uneven": [4, 1, 6]}
GRAD_LAYOUTS = {"empty rank": [3, 0, 5], "uneven": [4, 1, 2]}
EPS = 1.17e-06  # torchmetrics' (and scikit-learn's) floor of a percentage error's denominator


class _Lazy:
    """``torchmetrics.functional`` / ``scipy.stats``, imported on first use (only the pytest process uses them)."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self.module), name)


tmf = _Lazy("torchmetrics.functional")
stats = _Lazy("scipy.stats")


# ---------------------------------------------------------------------------------------------------- values
class ValueCase(NamedTuple):
    build: Callable[[], Metric]
    data: str  # "pair" (1-D), "pair3" ((N, 3)), "ties3" ((N, 3) with ties), "probs", "logprobs"
    reference: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    atol: float = 1e-12


def _spearman_scipy(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """scipy's rho per column, after checking torchmetrics agrees (its ``+ 1e-6`` in the denominator aside)."""
    cols = [(p, t)] if p.ndim == 1 else [(p[:, i], t[:, i]) for i in range(p.shape[1])]
    ref = torch.tensor([float(stats.spearmanr(a.numpy(), b.numpy()).statistic) for a, b in cols], dtype=F64)
    torch.testing.assert_close(tmf.spearman_corrcoef(p, t).to(F64).reshape(-1), ref, atol=1e-5, rtol=1e-5)
    return ref.reshape(()) if p.ndim == 1 else ref


VALUE_CASES: dict[str, ValueCase] = {
    "MAPE": ValueCase(MeanAbsolutePercentageError, "pair", tmf.mean_absolute_percentage_error),
    "MAPE of (N, 3) elements": ValueCase(MeanAbsolutePercentageError, "pair3", tmf.mean_absolute_percentage_error),
    "SMAPE": ValueCase(SymmetricMeanAbsolutePercentageError, "pair", tmf.symmetric_mean_absolute_percentage_error),
    "SMAPE of (N, 3) elements": ValueCase(
        SymmetricMeanAbsolutePercentageError, "pair3", tmf.symmetric_mean_absolute_percentage_error
    ),
    "EV": ValueCase(ExplainedVariance, "pair", tmf.explained_variance),
    "EV 3 outputs": ValueCase(lambda: ExplainedVariance(num_outputs=3), "pair3", tmf.explained_variance),
    "EV raw_values": ValueCase(
        lambda: ExplainedVariance("raw_values", num_outputs=3),
        "pair3",
        lambda p, t: tmf.explained_variance(p, t, "raw_values"),
    ),
    "EV variance_weighted": ValueCase(
        lambda: ExplainedVariance("variance_weighted", num_outputs=3),
        "pair3",
        lambda p, t: tmf.explained_variance(p, t, "variance_weighted"),
    ),
    "KL mean": ValueCase(KLDivergence, "probs", tmf.kl_divergence),
    "KL sum": ValueCase(
        lambda: KLDivergence(reduction="sum"), "probs", lambda p, q: tmf.kl_divergence(p, q, False, "sum")
    ),
    "KL none": ValueCase(
        lambda: KLDivergence(reduction="none"), "probs", lambda p, q: tmf.kl_divergence(p, q, False, "none")
    ),
    "KL None, log_prob": ValueCase(
        lambda: KLDivergence(log_prob=True, reduction=None),
        "logprobs",
        lambda p, q: tmf.kl_divergence(p, q, True, None),
    ),
    "KL mean, log_prob": ValueCase(
        lambda: KLDivergence(log_prob=True), "logprobs", lambda p, q: tmf.kl_divergence(p, q, True)
    ),
    "Spearman": ValueCase(SpearmanCorrCoef, "pair", _spearman_scipy),
    "Spearman 3 outputs with ties": ValueCase(lambda: SpearmanCorrCoef(num_outputs=3), "ties3", _spearman_scipy),
}

FUNCTIONAL: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "MAPE": mean_absolute_percentage_error,
    "SMAPE": symmetric_mean_absolute_percentage_error,
    "EV 3 outputs": explained_variance,
    "EV raw_values": lambda p, t: explained_variance(p, t, "raw_values"),
    "KL mean, log_prob": lambda p, q: kl_divergence(p, q, log_prob=True),
    "KL none": lambda p, q: kl_divergence(p, q, reduction="none"),
    "Spearman 3 outputs with ties": spearman_corrcoef,
}


def _data(tag: str, n: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    if kind in ("probs", "logprobs"):
        p, q = rand((n, 4), tag, "p"), rand((n, 4), tag, "q")
        if kind == "logprobs":
            return p.log_softmax(-1), q.log_softmax(-1)
        return p.abs() + 0.05, q.abs() + 0.05  # unnormalized: the metric divides each row by its sum
    shape = (n,) if kind == "pair" else (n, 3)
    target = rand(shape, tag, "target") * 2 + 0.5
    preds = 0.7 * target + rand(shape, tag, "noise")
    if kind == "ties3":
        return (preds * 2).round() / 2, target.round()  # many ties in both
    return preds, target


# ---------------------------------------------------------------------------------------------- gradients
class GradCase(NamedTuple):
    build: Callable[[], Metric]
    loss: Callable[[Metric, torch.Tensor, dict], torch.Tensor]  # (metric, model output, local data) -> loss
    reference: Callable[[torch.Tensor, dict], torch.Tensor]  # (model output, global data) -> loss


def _ev(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per column ``1 - Var(t - p) / Var(t)`` (population variances)."""
    return 1 - (t - p).var(0, unbiased=False) / t.var(0, unbiased=False)


def _kl_rows(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    return (log_p.exp() * (log_p - log_q)).sum(-1)


GRAD_CASES: dict[str, GradCase] = {
    "MAPE": GradCase(
        MeanAbsolutePercentageError,
        lambda m, out, d: m(out[:, 0], d["y"]),
        lambda out, d: ((out[:, 0] - d["y"]).abs() / d["y"].abs().clamp(min=EPS)).mean(),
    ),
    "SMAPE": GradCase(
        SymmetricMeanAbsolutePercentageError,
        lambda m, out, d: m(out[:, 0], d["y"]),
        lambda out, d: (2 * (out[:, 0] - d["y"]).abs() / (out[:, 0].abs() + d["y"].abs())).mean(),
    ),
    "EV of both outputs": GradCase(
        lambda: ExplainedVariance(num_outputs=2),
        lambda m, out, d: m(out, d["yy"]),
        lambda out, d: _ev(out, d["yy"]).mean(),
    ),
    "EV variance_weighted": GradCase(
        lambda: ExplainedVariance("variance_weighted", num_outputs=2),
        lambda m, out, d: m(out, d["yy"]),
        lambda out, d: (
            d["yy"].var(0, unbiased=False) / d["yy"].var(0, unbiased=False).sum() * _ev(out, d["yy"])
        ).sum(),
    ),
    "KL mean of probabilities": GradCase(
        KLDivergence,
        lambda m, out, d: m(out.exp(), d["yy"].exp()),  # unnormalized: the metric normalizes the rows
        lambda out, d: _kl_rows(out.log_softmax(-1), d["yy"].log_softmax(-1)).mean(),
    ),
    "KL sum of log-probabilities": GradCase(
        lambda: KLDivergence(log_prob=True, reduction="sum"),
        lambda m, out, d: m(d["yy"].log_softmax(-1), out.log_softmax(-1)),  # the model is q
        lambda out, d: _kl_rows(d["yy"].log_softmax(-1), out.log_softmax(-1)).sum(),
    ),
    "KL none, sum of squares": GradCase(
        lambda: KLDivergence(log_prob=True, reduction="none"),
        lambda m, out, d: (m(out.log_softmax(-1), d["yy"].log_softmax(-1)) ** 2).sum(),
        lambda out, d: (_kl_rows(out.log_softmax(-1), d["yy"].log_softmax(-1)) ** 2).sum(),
    ),
}


def _grad_data(n: int, tag: str) -> dict[str, torch.Tensor]:
    return {"x": rand((n, IN_FEATURES), tag, "x"), "y": rand((n,), tag, "y"), "yy": rand((n, 2), tag, "yy")}


# ------------------------------------------------------------------------------------------------ the run
def _collection(sync: bool) -> MetricCollection:
    kwargs = {"dist_sync_on_step": sync}
    return MetricCollection(
        {
            "mape": MeanAbsolutePercentageError(**kwargs),
            "smape": SymmetricMeanAbsolutePercentageError(**kwargs),
            "ev": ExplainedVariance(**kwargs),
            "spearman": SpearmanCorrCoef(**kwargs),
        }
    )


def _body(rank: int, world: int) -> dict:
    """Values (``compute`` after two updates, and a synced ``forward``), DDP gradients against the one-process
    reference, and the collectives of collections, all on this rank."""
    checks = Checks(f"W={world} rank {rank} ")
    values: dict = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        mid = (lo + hi) // 2
        for name, case in VALUE_CASES.items():
            a, b = _data(f"{layout}/{name}", sum(sizes), case.data)
            metric = case.build().set_dtype(F64)
            metric.update(a[lo:mid], b[lo:mid])
            metric.update(a[mid:hi], b[mid:hi])
            value = metric.compute()
            checks.detached(f"[{layout}] {name} compute", value)
            stepper = case.build().set_dtype(F64)
            stepper.dist_sync_on_step = True
            values[(layout, name)] = (value, stepper(a[lo:hi], b[lo:hi]).detach())
    for name, fn in FUNCTIONAL.items():  # the functional twins, on the global rows
        values[("functional", name)] = fn(
            *_data(f"uneven/{name}", sum(LAYOUTS["uneven"][:world]), VALUE_CASES[name].data)
        )

    grads: dict = {}
    for layout, all_sizes in GRAD_LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, grad_case in GRAD_CASES.items():
            data = _grad_data(sum(sizes), f"{layout}/{name}")
            ref_model = make_model()
            ref_value = grad_case.reference(ref_model(data["x"]), data)
            ref_value.backward()
            model = DistributedDataParallel(make_model())
            metric = grad_case.build().set_dtype(F64)
            metric.dist_sync_on_step = True
            local = {k: v[lo:hi] for k, v in data.items()}
            loss = grad_case.loss(metric, model(local["x"]), local)
            has_graph = loss.requires_grad
            loss.backward()  # every rank, even the empty one: DDP's gradient all-reduce needs them all
            grads[(layout, name)] = {
                "value": loss.detach(),
                "has_graph": has_graph,
                "grads": [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()],
                "ref_value": ref_value.detach(),
                "ref_grads": [p.grad.clone() for p in ref_model.parameters()],
            }

    calls: dict[str, list[str]] = {}
    sizes = [4, 0, 6][:world]
    lo, hi = bounds(sizes, rank)
    preds, target = _data("count", sum(sizes), "pair")
    p, q = _data("count", sum(sizes), "logprobs")
    stepping = _collection(sync=True)
    kl = MetricCollection(
        {
            "kl": KLDivergence(log_prob=True, dist_sync_on_step=True),
            "kl rows": KLDivergence(log_prob=True, reduction="none", dist_sync_on_step=True),
        }
    )
    for step in range(3):
        with record_collectives() as log:
            stepping(preds[lo:hi].float(), target[lo:hi].float())
        calls[f"forward, step {step}"] = list(log)
        with record_collectives() as log:
            kl(p[lo:hi].float(), q[lo:hi].float())
        calls[f"KL forward, step {step}"] = list(log)
    epoch = _collection(sync=False)
    for _ in range(2):
        epoch.update(preds[lo:hi].float(), target[lo:hi].float())
    for step in range(2):
        with record_collectives() as log:
            epoch.compute()
        calls[f"compute {step}"] = list(log)
    # ranks that disagree on the number of outputs: the sync raises on every rank, and the ranks stay in step
    odd = world > 1 and rank == world - 1
    mismatched: dict[str, Outcome] = {}
    for name, metric in {
        "ExplainedVariance": ExplainedVariance(num_outputs=2 if odd else 1),
        "SpearmanCorrCoef": SpearmanCorrCoef(num_outputs=2 if odd else 1),
    }.items():
        shape = (3, 2) if odd else (3,)
        metric.update(torch.rand(shape), torch.rand(shape))
        mismatched[name] = outcome(metric.compute)
    after = MeanAbsolutePercentageError()
    after.update(torch.full((2,), 2.0), torch.full((2,), 1.0 + rank))
    mismatched["a sync after them"] = outcome(after.compute)
    return {"values": values, "grads": grads, "calls": calls, "mismatched": mismatched, "failures": checks.failures}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_gradients_and_collectives_on_the_global_batch(world_size: int) -> None:
    """One spawn per world size.

    Values: MAPE and SMAPE (1-D and ``(N, 3)`` elements), explained variance (1 and 3 outputs, raw values,
    variance-weighted), KL divergence (mean, sum, per row; probabilities and log-probabilities) and Spearman
    (1 output; 3 outputs with ties in both) after two updates per rank and from a synced ``forward`` equal
    torchmetrics (Spearman: scipy) on every rank's rows, with uneven batches and an empty rank; so do the
    functional twins on the global rows.

    Gradients: with ``dist_sync_on_step=True`` each differentiable one is a global-batch loss whose value is the
    same on every rank and equals one process, and whose DDP-averaged float64 parameter gradient equals the
    one-process gradient.

    Collectives: a collection of MAPE, SMAPE, explained variance and Spearman (``sum`` and ``cat`` states), and
    one of KL divergence (mean and per row), sync in one collective per steady-state ``forward`` and ``compute``.

    Disagreement: ranks whose explained variance or Spearman have different ``num_outputs`` get a ``RuntimeError``
    naming the state and both shapes on every rank, and the next sync is exact.
    """
    results = run_distributed(_body, world_size, timeout=200)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for name, case in VALUE_CASES.items():
            expected = case.reference(*_data(f"{layout}/{name}", n, case.data)).to(F64)
            for rank, res in enumerate(results):
                computed, stepped = res["values"][(layout, name)]
                checks.close(f"[{layout}] {name} compute (rank {rank})", computed, expected, atol=case.atol, rtol=1e-10)
                checks.close(f"[{layout}] {name} forward (rank {rank})", stepped, expected, atol=case.atol, rtol=1e-10)
    n = sum(LAYOUTS["uneven"][:world_size])
    for name in FUNCTIONAL:
        case = VALUE_CASES[name]
        expected = case.reference(*_data(f"uneven/{name}", n, case.data)).to(F64)
        checks.close(f"functional {name}", results[0]["values"][("functional", name)], expected, rtol=1e-10)

    for key, first in results[0]["grads"].items():
        case_name = f"[{key[0]}] {key[1]}"
        for rank, res in enumerate(r["grads"][key] for r in results):
            checks.true(case_name, res["has_graph"], f"rank {rank}: the loss has no grad_fn")
            checks.true(case_name, torch.equal(res["value"], first["value"]), f"rank {rank}: value differs from rank 0")
            checks.close(f"{case_name} value (rank {rank})", res["value"], res["ref_value"], atol=1e-12, rtol=1e-10)
            for i, (g, ref) in enumerate(zip(res["grads"], res["ref_grads"])):
                checks.close(f"{case_name} DDP grad of param {i} (rank {rank})", g, ref, atol=1e-10, rtol=1e-9)

    if world_size > 1:
        for rank, res in enumerate(results):
            for case_name, log in res["calls"].items():
                if case_name.endswith("0"):  # a first sync agrees on the plan: not the steady state
                    continue
                checks.true(case_name, len(log) == 1, f"rank {rank}: {len(log)} collectives {log}, expected 1")
        for rank, res in enumerate(results):
            for name, state, shapes in (
                ("ExplainedVariance", "'sum_error'", ("(1,)", "(2,)")),
                ("SpearmanCorrCoef", "'preds'", ("(*, 1)", "(*, 2)")),
            ):
                found = problem(f"rank {rank} {name}", res["mismatched"][name], "RuntimeError", (state, *shapes))
                checks.true(f"{name} with ranks of different num_outputs", found is None, str(found))
    expected_after = sum(abs(2 - (1 + r)) / (1 + r) for r in range(world_size)) / world_size  # t = 1 + rank
    for rank, res in enumerate(results):
        got = res["mismatched"]["a sync after them"]
        checks.true("a sync after the mismatches", got.kind == "ok", f"rank {rank}: {got.kind} {got.message}")
        if got.kind == "ok":
            checks.close(f"the sync after the mismatches (rank {rank})", float(got.value), expected_after, rtol=1e-6)
    assert_no_failures(checks.failures + [f for res in results for f in res["failures"]])


def test_spearman_is_not_differentiable_and_warns_on_a_constant_column() -> None:
    """Spearman carries no graph (ranks are piecewise constant) and gives NaN, with a warning, for a constant
    column, as scipy does; its class says it is not differentiable."""
    preds = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    assert spearman_corrcoef(preds, torch.tensor([1.0, 3.0, 2.0, 4.0])).grad_fn is None
    assert SpearmanCorrCoef.is_differentiable is False
    assert all(m.is_differentiable for m in (MeanAbsolutePercentageError(), ExplainedVariance(), KLDivergence()))
    metric = SpearmanCorrCoef()
    metric.update(torch.full((5,), 2.0), torch.arange(5.0))
    with pytest.warns(UserWarning, match="variance"):
        assert torch.isnan(metric.compute())


def test_kl_divergence_zero_probability_terms() -> None:
    """A zero in ``p`` contributes 0 (torchmetrics does the same), with a finite gradient; a zero in ``q`` where
    ``p`` is not gives ``inf``."""
    p = torch.tensor([[0.0, 0.5, 0.5]], dtype=F64, requires_grad=True)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=F64)
    value = kl_divergence(p, q)
    torch.testing.assert_close(value, tmf.kl_divergence(p.detach(), q), rtol=1e-12, atol=1e-12)
    value.backward()
    assert torch.isfinite(p.grad).all()
    assert torch.isinf(kl_divergence(torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]])))


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: ExplainedVariance(multioutput="mean"), "`multioutput` must be one of .*; got 'mean'"),
    (lambda: ExplainedVariance(num_outputs=0), "`num_outputs` must be a positive int; got 0"),
    (lambda: KLDivergence(log_prob=1), "`log_prob` must be a bool; got 1"),
    (lambda: KLDivergence(reduction="max"), "`reduction` must be one of .*; got 'max'"),
    (lambda: SpearmanCorrCoef(num_outputs=-1), "`num_outputs` must be a positive int; got -1"),
    (
        lambda: MeanAbsolutePercentageError().update(torch.zeros(3), torch.zeros(4)),
        r"same shape; got preds \(3,\) and target \(4,\)",
    ),
    (
        lambda: SymmetricMeanAbsolutePercentageError().update(torch.zeros(2, dtype=torch.bool), torch.zeros(2)),
        "`preds` must be a real floating or integer tensor; got dtype torch.bool",
    ),
    (
        lambda: ExplainedVariance(num_outputs=2).update(torch.zeros(3, 3), torch.zeros(3, 3)),
        r"shape \(N, num_outputs=2\); got \(3, 3\)",
    ),
    (
        lambda: KLDivergence().update(torch.ones(3), torch.ones(3)),
        r"`p` must be a 2-D \(N, D\) distribution; got shape \(3,\)",
    ),
    (
        lambda: KLDivergence().update(torch.ones(2, 3), torch.ones(2, 4)),
        r"`p` and `q` must have the same shape; got p \(2, 3\) and q \(2, 4\)",
    ),
    (lambda: kl_divergence(torch.ones(2, 3), torch.ones(2, 3), reduction="avg"), "`reduction` must be one of"),
    (lambda: SpearmanCorrCoef().update(torch.zeros(3, 2), torch.zeros(3, 2)), r"num_outputs=1\); got \(3, 2\)"),
    (
        lambda: spearman_corrcoef(torch.zeros(3, 2, 2), torch.zeros(3, 2, 2)),
        r"shape \(N,\) or \(N, M\); got \(3, 2, 2\)",
    ),
    (lambda: explained_variance(torch.zeros(3), torch.zeros(3), "weighted"), "`multioutput` must be one of"),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
