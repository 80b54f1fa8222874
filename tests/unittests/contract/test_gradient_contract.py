"""The gradient contract of ``Metric``: a metric with ``dist_sync_on_step=True`` is a global-batch
loss whose value is identical on every rank and whose DDP-averaged gradient is the one-process gradient.

Every rank rebuilds the whole global batch from seeds known to all ranks, feeds its own slice through a
``DistributedDataParallel`` float64 ``Linear``, and compares with a separate copy of the model run on the
concatenated global batch through a plain-torch formula (never the package). Batches are uneven, and one layout
gives a rank zero rows.

Package modules covered: ``metric`` (forward and compute under ``dist_sync_on_step``), ``collections``,
``aggregation`` and the differentiable sync of ``distributed``.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, Callable, NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.metrics import IN_FEATURES, Projection, SoftmaxScore, make_model, projection_ref, softmax_score_ref
from tests._helpers.seeds import F64, bounds, rand
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, Metric, MetricCollection, MinMetric, SumMetric

pytestmark = pytest.mark.timeout(180)

WORLD_SIZES = [1, 2, 3]
LAYOUTS = {"empty rank": [3, 0, 5], "uneven": [4, 1, 2]}
TOKENS = 5
REDUCTIONS = ("mean", "sum")


# ------------------------------------------------------------------------------------------------- the cases


class Case(NamedTuple):
    """One loss: its global data, the metric under test, how to call it, and the plain-torch reference."""

    data: Callable[[int, str], dict[str, torch.Tensor]]  # (global rows, seed tag) -> name -> global tensor
    build: Callable[[str], Any]  # grad_reduction -> metric / composition / collection
    call: Callable[[Any, torch.Tensor, dict], torch.Tensor]  # (metric, model output, local data) -> loss
    reference: Callable[[torch.Tensor, dict], torch.Tensor]  # (model output, global data) -> loss


def _rows_data(n: int, tag: str) -> dict[str, torch.Tensor]:
    return {"x": rand((n, IN_FEATURES), tag, "x"), "w": rand((n, 1), tag, "w").abs() + 0.1}


def _token_data(n: int, tag: str) -> dict[str, torch.Tensor]:
    targets = torch.randint(0, 2, (n, TOKENS), generator=torch.Generator().manual_seed(7))
    mask = rand((n, TOKENS), tag, "mask") < 0.6  # about 70% valid tokens
    mask[0, 0] = True  # at least one valid token in the global batch
    return {"x": rand((n, TOKENS, IN_FEATURES), tag, "x"), "targets": targets, "mask": mask}


def _per_token_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1), reduction="none").reshape(targets.shape)


def _weighted_mean_ref(out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (out * w).sum() / (w * torch.ones_like(out)).sum()


def _collection_loss(coll: MetricCollection, out: torch.Tensor, local: dict) -> torch.Tensor:
    values = coll(out, weight=local["w"])
    assert set(values) == {"mean", "total", "score"}, f"collection keys {sorted(values)}"
    return values["mean"] + values["total"] + values["score"]


CASES: dict[str, Case] = {
    "(a) custom cat+sum metric, softmax over the global batch": Case(
        _rows_data,
        lambda g: SoftmaxScore(dist_sync_on_step=True, grad_reduction=g),
        lambda m, out, local: m(out),
        lambda out, data: softmax_score_ref(out),
    ),
    "(b) MeanMetric token loss / global valid-token count": Case(
        _token_data,
        lambda g: MeanMetric(dist_sync_on_step=True, grad_reduction=g),
        lambda m, out, local: m(_per_token_loss(out, local["targets"]), weight=local["mask"]),
        lambda out, data: (_per_token_loss(out, data["targets"]) * data["mask"]).sum() / data["mask"].sum(),
    ),
    "(c) composition a + 0.5 * b": Case(
        _rows_data,
        lambda g: (
            MeanMetric(dist_sync_on_step=True, grad_reduction=g)
            + 0.5 * SoftmaxScore(dist_sync_on_step=True, grad_reduction=g)
        ),
        lambda m, out, local: m(out, weight=local["w"]),
        lambda out, data: _weighted_mean_ref(out, data["w"]) + 0.5 * softmax_score_ref(out),
    ),
    "(d) MetricCollection, outputs summed into the loss": Case(
        _rows_data,
        lambda g: MetricCollection(
            {
                "mean": MeanMetric(dist_sync_on_step=True, grad_reduction=g),
                "total": SumMetric(dist_sync_on_step=True, grad_reduction=g),
                "score": SoftmaxScore(dist_sync_on_step=True, grad_reduction=g),
            }
        ),
        _collection_loss,
        lambda out, data: _weighted_mean_ref(out, data["w"]) + out.sum() + softmax_score_ref(out),
    ),
    "(e) large vector sum state (all-reduced, not gathered)": Case(
        _rows_data,
        lambda g: Projection(dist_sync_on_step=True, grad_reduction=g),
        lambda m, out, local: m(out),
        lambda out, data: projection_ref(out),
    ),
}


def _reference(case: Case, data: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The one-process loss and parameter gradients on the concatenated global batch."""
    model = make_model()
    value = case.reference(model(data["x"]), data)
    value.backward()
    return value.detach(), [p.grad.clone() for p in model.parameters()]


def _grad_body(rank: int, world: int, modes: tuple[str, ...] = ("ddp", "plain")) -> dict:
    """Per (layout, case, grad_reduction, mode): this rank's loss value and parameter gradients, and the reference.

    ``mode`` "ddp" wraps the model in DDP (gradients averaged); "plain" keeps a local model (raw local gradient).
    """
    out: dict = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, case in CASES.items():
            data = case.data(sum(sizes), f"{layout}/{name}")
            ref_value, ref_grads = _reference(case, data)
            local = {k: v[lo:hi] for k, v in data.items()}
            for reduction in REDUCTIONS:
                for mode in modes:
                    model: nn.Module = make_model()
                    if mode == "ddp":
                        model = DistributedDataParallel(model)
                    metric = case.build(reduction)
                    value = case.call(metric, model(local["x"]), local)
                    has_graph = value.requires_grad
                    if has_graph or mode == "ddp":  # DDP needs every rank's backward; let it fail loudly
                        value.backward()
                    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
                    out[(layout, name, reduction, mode)] = {
                        "value": value.detach(),
                        "has_graph": has_graph,
                        "grads": grads,
                        "ref_value": ref_value,
                        "ref_grads": ref_grads,
                    }
    return out


def _check_grad_results(results: list[dict], world: int) -> list[str]:
    checks = Checks(f"W={world} ")
    for key, first in results[0].items():
        layout, name, reduction, mode = key
        case = f"[{layout}] {name} grad_reduction={reduction} {mode}"
        per_rank = [r[key] for r in results]
        for rank, res in enumerate(per_rank):
            checks.true(case, res["has_graph"], f"rank {rank}: the loss value has no grad_fn")
            checks.true(
                case,
                torch.equal(res["value"], first["value"]),
                f"value differs between ranks: rank 0 {first['value'].item()!r}, rank {rank} {res['value'].item()!r}",
            )
            checks.close(f"{case} value (rank {rank}) vs one process", res["value"], res["ref_value"])
        if mode == "ddp":
            # DDP averages: "mean" must give the one-process gradient, "sum" 1/W of it (the raw local gradient).
            scale = 1.0 if reduction == "mean" else float(world)
            for rank, res in enumerate(per_rank):
                for i, (g, ref) in enumerate(zip(res["grads"], first["ref_grads"])):
                    checks.close(f"{case} DDP grad of param {i} (rank {rank}) x{scale:g}", g * scale, ref, atol=1e-10)
        else:
            # Raw local gradients: their sum ("sum") or their mean ("mean") over ranks is the one-process gradient.
            for i, ref in enumerate(first["ref_grads"]):
                total = sum(res["grads"][i] for res in per_rank)
                combined = total if reduction == "sum" else total / world
                checks.close(f"{case} {reduction} over ranks of local grads of param {i}", combined, ref, atol=1e-10)
    return checks.failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ddp_gradient_equals_single_process_gradient(world_size: int) -> None:
    """Cases (a)-(e): identical global value on every rank, DDP gradients equal the one-process ones.

    Also ``grad_reduction="sum"``: DDP gives 1/W of the gradient, i.e. the ranks' raw local gradients sum to it.
    """
    results = run_distributed(_grad_body, world_size, timeout=120)
    assert_no_failures(_check_grad_results(results, world_size))


def test_not_initialised_gives_plain_values_and_gradients() -> None:
    """Without a process group (this pytest process) forward is the plain one-process loss; no collective runs."""
    assert not dist.is_initialized(), "the pytest process must not join a process group"

    def forbidden(name: str) -> None:
        raise AssertionError(f"collective {name} called without a process group")

    with record_collectives(forbidden) as log:
        results = [_grad_body(0, 1, modes=("plain",))]
    assert log == [], f"collectives called: {log}"
    assert_no_failures(_check_grad_results(results, 1))


# ------------------------------------------------------------------ min / max / cat losses with an empty rank


def _extremum_body(rank: int, world: int) -> dict:
    """Max/Min/Cat with dist_sync_on_step on uneven batches where rank 1 holds zero rows; no DDP (see test)."""
    sizes = [3, 0, 5][:world]
    lo, hi = bounds(sizes, rank)
    cases = {
        "MaxMetric": (MaxMetric, lambda v: v, lambda out: out.amax()),
        "MinMetric": (MinMetric, lambda v: v, lambda out: out.amin()),
        "CatMetric, loss = Σ value²": (CatMetric, lambda v: (v**2).sum(), lambda out: (out.reshape(-1) ** 2).sum()),
    }
    results = {}
    for name, (cls, loss_of, ref_of) in cases.items():
        x = rand((sum(sizes), IN_FEATURES), "extremum", name)
        ref_model = make_model()
        ref_value = ref_of(ref_model(x))
        ref_value.backward()
        model = make_model()
        metric = cls(dist_sync_on_step=True).set_dtype(F64)
        value = loss_of(metric(model(x[lo:hi])))
        has_graph = value.requires_grad
        if has_graph:
            value.backward()
        results[name] = {
            "value": value.detach(),
            "has_graph": has_graph,
            "grads": [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()],
            "ref_value": ref_value.detach(),
            "ref_grads": [p.grad.clone() for p in ref_model.parameters()],
        }
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_min_max_cat_losses_with_an_empty_rank(world_size: int) -> None:
    """Max/Min/Cat as global losses: every rank's value is differentiable (even the empty rank's, whose DDP
    backward must run), the gradient has no NaN from the ±inf defaults, and the DDP-averaged gradient is the
    one-process one.

    Run without DDP so that a rank without a graph reports instead of leaving DDP's gradient all-reduce hanging.
    """
    results = run_distributed(_extremum_body, world_size, timeout=60)
    checks = Checks(f"W={world_size} ")
    for name, first in results[0].items():
        for rank, res in enumerate(r[name] for r in results):
            checks.true(name, res["has_graph"], f"rank {rank} (local rows: {[3, 0, 5][rank]}): value has no grad_fn")
            checks.close(f"{name} value (rank {rank})", res["value"], first["ref_value"])
            for g in res["grads"]:
                checks.true(name, bool(torch.isfinite(g).all()), f"rank {rank}: non-finite gradient {g}")
        for i, ref in enumerate(first["ref_grads"]):
            mean = sum(r[name]["grads"][i] for r in results) / world_size
            checks.close(f"{name} DDP-averaged grad of param {i}", mean, ref, atol=1e-10)
    assert_no_failures(checks.failures)


# --------------------------------------------------------------------------------- epoch compute after steps

STEPS = (("forward", [3, 0, 5]), ("update", [2, 2, 1]), ("forward", [1, 4, 0]), ("update", [0, 3, 2]))


def _epoch_metrics() -> dict[str, Any]:
    def f64(m: Metric) -> Metric:
        return m.set_dtype(F64)

    return {
        "SoftmaxScore": SoftmaxScore(dist_sync_on_step=True),
        "SoftmaxScore without step sync": SoftmaxScore(),
        "MeanMetric": f64(MeanMetric(dist_sync_on_step=True)),
        "SumMetric": f64(SumMetric(dist_sync_on_step=True)),
        "CatMetric": f64(CatMetric(dist_sync_on_step=True)),
        "MaxMetric": f64(MaxMetric(dist_sync_on_step=True)),
        "MinMetric": f64(MinMetric(dist_sync_on_step=True)),
        "composition": f64(MeanMetric(dist_sync_on_step=True)) + 0.5 * SoftmaxScore(dist_sync_on_step=True),
        "collection": MetricCollection(
            {"mean": f64(MeanMetric(dist_sync_on_step=True)), "score": SoftmaxScore(dist_sync_on_step=True)}
        ),
    }


def _epoch_ref(name: str, out: torch.Tensor, w: torch.Tensor) -> Any:
    """Plain-torch value of metric ``name`` on rows ``out`` (weights ``w``), in the order the ranks hold them."""
    refs: dict[str, Callable[[], Any]] = {
        "SoftmaxScore": lambda: softmax_score_ref(out),
        "MeanMetric": lambda: _weighted_mean_ref(out, w),
        "SumMetric": lambda: out.sum(),
        "CatMetric": lambda: out,  # rows kept, as in torchmetrics
        "MaxMetric": lambda: out.amax(),
        "MinMetric": lambda: out.amin(),
        "composition": lambda: _weighted_mean_ref(out, w) + 0.5 * softmax_score_ref(out),
        "collection": lambda: {"mean": _weighted_mean_ref(out, w), "score": softmax_score_ref(out)},
    }
    return refs[name.replace(" without step sync", "")]()


def _call(metric: Any, out: torch.Tensor, w: torch.Tensor) -> Any:
    if isinstance(metric, (SoftmaxScore, SumMetric, CatMetric, MaxMetric, MinMetric)):
        return metric(out)
    return metric(out, weight=w)


def _update(metric: Any, out: torch.Tensor, w: torch.Tensor) -> None:
    if isinstance(metric, (SoftmaxScore, SumMetric, CatMetric, MaxMetric, MinMetric)):
        metric.update(out)
    else:
        metric.update(out, weight=w)


def _states(metric: Any) -> dict[str, dict]:
    """Member key -> that member's ``metric_state`` ("" for a plain metric)."""
    if isinstance(metric, MetricCollection):
        return {k: m.metric_state for k, m in metric.items()}
    if hasattr(metric, "metric_a"):  # mean + 0.5 * score
        return {"a": metric.metric_a.metric_state, "b": metric.metric_b.metric_b.metric_state}
    return {"": metric.metric_state}


def _epoch_body(rank: int, world: int) -> list[str]:
    checks = Checks(f"W={world} rank {rank} ")
    model = make_model()
    metrics = _epoch_metrics()
    outs = {r: [] for r in range(world)}  # every rank's model outputs, per step (rebuilt from the seeds)
    weights = {r: [] for r in range(world)}
    for step, (kind, all_sizes) in enumerate(STEPS):
        sizes = all_sizes[:world]
        x = rand((sum(sizes), IN_FEATURES), "epoch", step)
        w = rand((sum(sizes), 1), "epoch w", step).abs() + 0.1
        with torch.no_grad():
            global_out = model(x)
        for r in range(world):
            lo, hi = bounds(sizes, r)
            outs[r].append(global_out[lo:hi])
            weights[r].append(w[lo:hi])
        lo, hi = bounds(sizes, rank)
        for name, metric in metrics.items():
            case = f"step {step} {kind} {name}"
            local_out = model(x[lo:hi])  # a fresh graph per metric, as a training step would have
            if kind == "forward":
                value = _call(metric, local_out, w[lo:hi])
                synced = "without step sync" not in name
                ref_out, ref_w = (global_out, w) if synced else (global_out[lo:hi], w[lo:hi])
                if not synced and ref_out.shape[0] == 0:
                    continue  # a local softmax over zero rows is not defined
                checks.close(f"{case} batch value", _detach(value), _epoch_ref(name, ref_out, ref_w))
            else:
                _update(metric, local_out, w[lo:hi])
            # grad_fn only: that update() leaves no requires_grad views is test_update_keeps_no_graph_alive's job
            checks.detached(f"{case} states after the step", _states(metric), strict=False)
    for name, metric in metrics.items():
        all_out = torch.cat([o for r in range(world) for o in outs[r]])  # rank-major: the order of a cat sync
        all_w = torch.cat([v for r in range(world) for v in weights[r]])
        local_before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in _flat_states(metric).items()}
        value = metric.compute()
        checks.close(f"epoch compute {name}", value, _epoch_ref(name, all_out, all_w))
        checks.detached(f"epoch compute {name} result", value)
        after = _flat_states(metric)
        for k, v in local_before.items():
            if isinstance(v, torch.Tensor):
                checks.close(f"{name} state {k} restored to the local value after compute", after[k], v, atol=0)
        if not isinstance(metric, MetricCollection):
            checks.true(name, metric.update_count == len(STEPS), f"update_count {metric.update_count}")
    # sync_context: the global states inside, the local ones back afterwards
    total = SumMetric().set_dtype(F64)
    total.update(torch.tensor([float(rank + 1)], dtype=F64))
    with total.sync_context():
        checks.close("sync_context global sum", total.sum_value, torch.tensor(world * (world + 1) / 2, dtype=F64))
    checks.close("sync_context local sum restored", total.sum_value, torch.tensor(float(rank + 1), dtype=F64))
    return checks.failures


def _detach(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v.detach() for k, v in value.items()}
    return value.detach()


def _flat_states(metric: Any) -> dict[str, Any]:
    return {f"{key}.{name}": value for key, states in _states(metric).items() for name, value in states.items()}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_epoch_compute_equals_single_process_value_over_all_data(world_size: int) -> None:
    """Forward and update steps mixed, an empty rank on some steps: each forward returns the global batch value,
    no state has a grad_fn after a step, and ``compute()`` is the detached value over all data of all ranks,
    after which the local states are back."""
    results = run_distributed(_epoch_body, world_size, timeout=120)
    assert_no_failures([f for per_rank in results for f in per_rank])


def test_update_keeps_no_graph_alive() -> None:
    """``update`` with inputs that carry a graph stores detached states: no state requires grad or is a view of
    the caller's graph-carrying tensor, which must be freed once the caller drops it (the gradient contract: no graph
    survives a step; memory stays flat)."""
    checks = Checks()
    for name, metric in {
        "CatMetric": CatMetric().set_dtype(F64),
        "SoftmaxScore (cat list + sum)": SoftmaxScore(),
        "MeanMetric": MeanMetric().set_dtype(F64),
    }.items():
        model = make_model()
        out = model(rand((5, IN_FEATURES), "update graph", name))
        alive = weakref.ref(out)
        metric.update(out)
        checks.detached(f"{name} states after update", metric.metric_state)
        del out
        gc.collect()
        checks.true(name, alive() is None, "the caller's output tensor (and its autograd graph) is kept alive")
    assert_no_failures(checks.failures)
