"""Regression metrics on the global batch: values equal torchmetrics' functions on the concatenation of every
rank's rows (W = 1, 2, 3, uneven batches, a rank with zero rows), and the gradient contract: with
``dist_sync_on_step=True`` the DDP-averaged float64 gradient equals one process on the concatenated batch.

Every rank rebuilds the whole global data from seeds; references are torchmetrics' functions (values, computed
in the pytest process: importing torchmetrics costs each worker seconds) or plain-torch formulas written here
(gradients), never this package.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.metrics import IN_FEATURES, make_model
from tests._helpers.seeds import F64, bounds, rand
from torchmetrics_diff import (
    CosineSimilarity,
    MeanAbsoluteError,
    MeanSquaredError,
    Metric,
    MetricCollection,
    PearsonCorrCoef,
    Perplexity,
    R2Score,
)

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [5, 0, 7], "uneven": [4, 1, 6]}


class _TorchmetricsFunctional:
    """``torchmetrics.functional``, imported on first use (only the pytest process uses it)."""

    def __getattr__(self, name: str) -> Any:
        import torchmetrics.functional

        return getattr(torchmetrics.functional, name)


tmf = _TorchmetricsFunctional()


# ---------------------------------------------------------------------------------------------------- values
class ValueCase(NamedTuple):
    build: Callable[[], Metric]
    width: int  # columns of preds/target (0: 1-D)
    reference: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cosine_rows(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity in float64, after checking torchmetrics agrees to float32 precision."""
    ref = torch.tensor([float(a @ b / (a.norm() * b.norm())) for a, b in zip(p, t)], dtype=F64)
    torch.testing.assert_close(tmf.cosine_similarity(p, t, "none").to(F64), ref, atol=1e-6, rtol=1e-6)
    return ref


VALUE_CASES: dict[str, ValueCase] = {
    "MSE": ValueCase(MeanSquaredError, 0, tmf.mean_squared_error),
    "RMSE": ValueCase(lambda: MeanSquaredError(squared=False), 0, lambda p, t: tmf.mean_squared_error(p, t, False)),
    "MSE 3 outputs": ValueCase(
        lambda: MeanSquaredError(num_outputs=3), 3, lambda p, t: tmf.mean_squared_error(p, t, num_outputs=3)
    ),
    "MSE (N, 3) as one output": ValueCase(MeanSquaredError, 3, tmf.mean_squared_error),
    "MAE": ValueCase(MeanAbsoluteError, 0, tmf.mean_absolute_error),
    "MAE 3 outputs": ValueCase(
        lambda: MeanAbsoluteError(num_outputs=3), 3, lambda p, t: tmf.mean_absolute_error(p, t, num_outputs=3)
    ),
    "R2": ValueCase(R2Score, 0, tmf.r2_score),
    "R2 adjusted=2": ValueCase(lambda: R2Score(adjusted=2), 0, lambda p, t: tmf.r2_score(p, t, adjusted=2)),
    "R2 raw_values": ValueCase(
        lambda: R2Score(multioutput="raw_values", num_outputs=3),
        3,
        lambda p, t: tmf.r2_score(p, t, multioutput="raw_values"),
    ),
    "R2 variance_weighted": ValueCase(
        lambda: R2Score(multioutput="variance_weighted", num_outputs=3),
        3,
        lambda p, t: tmf.r2_score(p, t, multioutput="variance_weighted"),
    ),
    "Pearson": ValueCase(PearsonCorrCoef, 0, tmf.pearson_corrcoef),
    "Pearson 3 outputs": ValueCase(lambda: PearsonCorrCoef(num_outputs=3), 3, tmf.pearson_corrcoef),
    # torchmetrics computes cosine similarity in float32 whatever the input: the float64 reference is written here
    "Cosine sum": ValueCase(CosineSimilarity, 3, lambda p, t: _cosine_rows(p, t).sum()),
    "Cosine mean": ValueCase(lambda: CosineSimilarity("mean"), 3, lambda p, t: _cosine_rows(p, t).mean()),
    "Cosine none": ValueCase(lambda: CosineSimilarity("none"), 3, _cosine_rows),
}


def _pair(tag: str, n: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (n,) if width == 0 else (n, width)
    target = rand(shape, tag, "target") * 2 + 0.5
    preds = 0.7 * target + rand(shape, tag, "noise")  # correlated, so R² and r are far from 0
    return preds, target


def _values_body(rank: int, world: int) -> dict:
    """Per case and layout: ``compute`` after two ``update``s (epoch sync) and one ``forward`` with
    ``dist_sync_on_step`` (batch sync); failures of the detached check."""
    checks = Checks(f"W={world} rank {rank} ")
    values = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, case in VALUE_CASES.items():
            preds, target = _pair(f"{layout}/{name}", sum(sizes), case.width)
            metric = case.build().set_dtype(F64)
            mid = (lo + hi) // 2
            metric.update(preds[lo:mid], target[lo:mid])
            metric.update(preds[mid:hi], target[mid:hi])
            value = metric.compute()
            checks.detached(f"[{layout}] {name} compute", value)
            stepper = case.build()
            stepper.dist_sync_on_step = True
            values[(layout, name)] = (value, stepper.set_dtype(F64)(preds[lo:hi], target[lo:hi]).detach())
    return {"values": values, "failures": checks.failures}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_torchmetrics_on_the_global_batch(world_size: int) -> None:
    """MSE/RMSE/MAE (1 and 3 outputs), R² (adjusted, raw, variance-weighted), Pearson, cosine (sum, mean, none):
    ``compute`` after two updates and a synced ``forward`` both equal torchmetrics on all ranks' rows."""
    results = run_distributed(_values_body, world_size, timeout=180)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for name, case in VALUE_CASES.items():
            expected = case.reference(*_pair(f"{layout}/{name}", n, case.width))
            for rank, res in enumerate(results):
                computed, stepped = res["values"][(layout, name)]
                checks.close(f"[{layout}] {name} compute (rank {rank})", computed, expected, atol=1e-12, rtol=1e-10)
                checks.close(f"[{layout}] {name} forward (rank {rank})", stepped, expected, atol=1e-12, rtol=1e-10)
    assert_no_failures(checks.failures + [f for res in results for f in res["failures"]])


def test_pearson_float64_sums_survive_a_large_offset() -> None:
    """Pearson from raw sums in float64: data with ``|mean| / std = 1e4`` in float32 inputs still gives r to 1e-6
    of numpy's two-pass value; constant data gives NaN with a warning rather than a number made of rounding."""
    import numpy as np

    x = rand((2000,), "pearson offset x")
    y = 0.5 * x + rand((2000,), "pearson offset y")
    metric = PearsonCorrCoef()
    metric.update((x + 1e4).float(), (y - 1e4).float())
    expected = np.corrcoef((x + 1e4).float().double().numpy(), (y - 1e4).float().double().numpy())[0, 1]
    assert abs(metric.compute().item() - expected) < 1e-6
    constant = PearsonCorrCoef()
    constant.update(torch.full((10,), 3.3), torch.arange(10.0))
    with pytest.warns(UserWarning, match="variance"):
        assert torch.isnan(constant.compute())


def _count_body(rank: int, world: int) -> dict[str, list[str]]:
    """Collectives of a collection of four regression metrics (float32, float64 and int64 sum states)."""
    sizes = [4, 0, 6][:world]
    lo, hi = bounds(sizes, rank)
    preds, target = _pair("count", sum(sizes), 0)
    coll = MetricCollection(
        {
            "mse": MeanSquaredError(dist_sync_on_step=True),
            "mae": MeanAbsoluteError(dist_sync_on_step=True),
            "r2": R2Score(dist_sync_on_step=True),
            "pearson": PearsonCorrCoef(dist_sync_on_step=True),
        }
    )
    calls = {}
    for case in ("forward, first step", "forward, step 2", "compute, first sync", "compute"):
        with record_collectives() as log:
            if case.startswith("forward"):
                coll(preds[lo:hi].float(), target[lo:hi].float())
            else:
                coll.compute()
        calls[case] = list(log)
    return calls


@pytest.mark.parametrize("world_size", [2, 3])
def test_collection_of_regression_metrics_syncs_in_one_collective(world_size: int) -> None:
    """MSE, MAE, R² and Pearson (float64 sums) in one ``MetricCollection``: one collective per synced
    ``forward`` and per ``compute`` once the plan is agreed, three on the first sync (the call header, the
    metadata, the data)."""
    results = run_distributed(_count_body, world_size, timeout=120)
    problems = [
        f"rank {rank} {case}: {log}"
        for rank, calls in enumerate(results)
        for case, log in calls.items()
        if len(log) != (3 if "first" in case else 1)
    ]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ gradient contract
TOKENS, VOCAB = 5, 2  # the model's 2 outputs are the logits of a 2-token vocabulary


class GradCase(NamedTuple):
    build: Callable[[], Metric]
    loss: Callable[[Metric, torch.Tensor, dict], torch.Tensor]  # (metric, model output, local data) -> loss
    reference: Callable[[torch.Tensor, dict], torch.Tensor]  # (model output, global data) -> loss
    tokens: bool = False


def _pearson_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a - a.mean(), b - b.mean()
    return (a * b).sum() / torch.sqrt((a * a).sum() * (b * b).sum())


def _r2_ref(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 1 - ((t - p) ** 2).sum() / ((t - t.mean()) ** 2).sum()


def _perplexity_ref(out: torch.Tensor, data: dict) -> torch.Tensor:
    mask = data["target"] != -100
    nll = F.cross_entropy(out[mask], data["target"][mask], reduction="sum")
    return torch.exp(nll / mask.sum())


GRAD_CASES: dict[str, GradCase] = {
    "MSE of 2 outputs, summed": GradCase(
        lambda: MeanSquaredError(num_outputs=2),
        lambda m, out, d: m(out, d["yy"]).sum(),
        lambda out, d: ((out - d["yy"]) ** 2).mean(0).sum(),
    ),
    "RMSE": GradCase(
        lambda: MeanSquaredError(squared=False),
        lambda m, out, d: m(out[:, 0], d["y"]),
        lambda out, d: torch.sqrt(((out[:, 0] - d["y"]) ** 2).mean()),
    ),
    "MAE": GradCase(
        MeanAbsoluteError,
        lambda m, out, d: m(out[:, 0], d["y"]),
        lambda out, d: (out[:, 0] - d["y"]).abs().mean(),
    ),
    "R2 of both outputs": GradCase(
        lambda: R2Score(num_outputs=2),
        lambda m, out, d: m(out, d["yy"]),
        lambda out, d: (_r2_ref(out[:, 0], d["yy"][:, 0]) + _r2_ref(out[:, 1], d["yy"][:, 1])) / 2,
    ),
    "Pearson": GradCase(
        PearsonCorrCoef,
        lambda m, out, d: m(out[:, 0], d["y"]),
        lambda out, d: _pearson_ref(out[:, 0], d["y"]),
    ),
    "Pearson(out0, out1) ** 2": GradCase(
        PearsonCorrCoef,
        lambda m, out, d: m(out[:, 0], out[:, 1]) ** 2,
        lambda out, d: _pearson_ref(out[:, 0], out[:, 1]) ** 2,
    ),
    "Cosine mean": GradCase(
        lambda: CosineSimilarity("mean"),
        lambda m, out, d: m(out, d["yy"]),
        lambda out, d: F.cosine_similarity(out, d["yy"], dim=-1).mean(),
    ),
    "Cosine sum": GradCase(
        CosineSimilarity,
        lambda m, out, d: m(out, d["yy"]),
        lambda out, d: F.cosine_similarity(out, d["yy"], dim=-1).sum(),
    ),
    "Cosine none, sum of squares": GradCase(
        lambda: CosineSimilarity("none"),
        lambda m, out, d: (m(out, d["yy"]) ** 2).sum(),
        lambda out, d: (F.cosine_similarity(out, d["yy"], dim=-1) ** 2).sum(),
    ),
    "Perplexity with padding": GradCase(
        lambda: Perplexity(ignore_index=-100),
        lambda m, out, d: m(out, d["target"]),
        _perplexity_ref,
        tokens=True,
    ),
}


def _grad_data(n: int, tag: str, tokens: bool) -> dict[str, torch.Tensor]:
    if tokens:
        target = torch.randint(0, VOCAB, (n, TOKENS), generator=torch.Generator().manual_seed(11))
        target[rand((n, TOKENS), tag, "pad") > 0.5] = -100  # about 30% padding, unevenly spread over ranks
        target[0, 0] = 1  # at least one real token
        return {"x": rand((n, TOKENS, IN_FEATURES), tag, "x"), "target": target}
    return {"x": rand((n, IN_FEATURES), tag, "x"), "y": rand((n,), tag, "y"), "yy": rand((n, 2), tag, "yy")}


def _grad_body(rank: int, world: int) -> dict:
    """Per (layout, case): this rank's loss value and DDP parameter gradients, and the one-process reference."""
    out: dict = {}
    for layout, all_sizes in {"empty rank": [3, 0, 5], "uneven": [4, 1, 2]}.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, case in GRAD_CASES.items():
            data = _grad_data(sum(sizes), f"{layout}/{name}", case.tokens)
            ref_model = make_model()
            ref_value = case.reference(ref_model(data["x"]), data)
            ref_value.backward()
            model = DistributedDataParallel(make_model())
            metric = case.build().set_dtype(F64)
            metric.dist_sync_on_step = True
            local = {k: v[lo:hi] for k, v in data.items()}
            value = case.loss(metric, model(local["x"]), local)
            has_graph = value.requires_grad
            value.backward()  # every rank, even the empty one: DDP's gradient all-reduce needs them all
            out[(layout, name)] = {
                "value": value.detach(),
                "has_graph": has_graph,
                "grads": [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()],
                "ref_value": ref_value.detach(),
                "ref_grads": [p.grad.clone() for p in ref_model.parameters()],
            }
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ddp_gradient_equals_single_process_gradient(world_size: int) -> None:
    """MSE, RMSE, MAE, R², Pearson (also of two model outputs), cosine (sum, mean, per row) and perplexity with
    padding as global-batch losses: the value is identical on every rank and equals the one-process value, and the
    DDP-averaged float64 gradient equals the one-process gradient (uneven batches, one rank empty)."""
    results: list[dict[Any, dict]] = run_distributed(_grad_body, world_size, timeout=180)
    checks = Checks(f"W={world_size} ")
    for key, first in results[0].items():
        case = f"[{key[0]}] {key[1]}"
        for rank, res in enumerate(r[key] for r in results):
            checks.true(case, res["has_graph"], f"rank {rank}: the loss has no grad_fn")
            checks.true(case, torch.equal(res["value"], first["value"]), f"rank {rank}: value differs from rank 0")
            checks.close(f"{case} value (rank {rank})", res["value"], res["ref_value"], atol=1e-12, rtol=1e-10)
            for i, (g, ref) in enumerate(zip(res["grads"], res["ref_grads"])):
                checks.close(f"{case} DDP grad of param {i} (rank {rank})", g, ref, atol=1e-10, rtol=1e-9)
    assert_no_failures(checks.failures)


# ------------------------------------------------------------------------------------------------- bad input
BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: MeanSquaredError(squared="no"), "`squared` must be a bool; got 'no'"),
    (lambda: MeanAbsoluteError(num_outputs=0), "`num_outputs` must be a positive int; got 0"),
    (lambda: R2Score(adjusted=-1), "`adjusted` must be an int >= 0; got -1"),
    (lambda: R2Score(multioutput="mean"), "`multioutput` must be one of"),
    (lambda: CosineSimilarity(reduction="max"), "`reduction` must be one of"),
    (
        lambda: MeanSquaredError().update(torch.zeros(3), torch.zeros(4)),
        r"same shape; got preds \(3,\) and target \(4,\)",
    ),
    (
        lambda: MeanSquaredError(num_outputs=2).update(torch.zeros(3, 3), torch.zeros(3, 3)),
        r"shape \(N, num_outputs=2\); got \(3, 3\)",
    ),
    (lambda: PearsonCorrCoef().update(torch.zeros(3, 2), torch.zeros(3, 2)), r"num_outputs=1\); got \(3, 2\)"),
    (lambda: CosineSimilarity().update(torch.zeros(3), torch.zeros(3)), r"must be 2-D \(N, D\); got shape \(3,\)"),
    (lambda: MeanAbsoluteError().update(torch.zeros(2, dtype=torch.bool), torch.zeros(2)), "dtype torch.bool"),
    (lambda: _r2_of_one_row(), "R2 score needs at least two observations; got 1"),
]


def _r2_of_one_row() -> torch.Tensor:
    metric = R2Score()
    metric.update(torch.zeros(1), torch.ones(1))
    return metric.compute()


@pytest.mark.filterwarnings("ignore:.*compute.*before.*update:UserWarning")
@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
