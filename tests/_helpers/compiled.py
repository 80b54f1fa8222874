"""Compiled training steps on every rank: recompiles after warm-up, graph breaks per call, values and gradients.

Run by ``run_distributed`` (module-level functions, picklable) and, at world size 1, in the test process too.
Each body builds the same seeded float64 model on every rank (:mod:`tests._helpers.loss_cases`), compiles a step
that calls the loss (or metric, collection, compute) and counts Dynamo's work with ``torch._dynamo.utils.counters``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tests._helpers.loss_cases import Net, criterion_call, make_batch, make_criterion, slice_rows
from tests._helpers.seeds import bounds
from torchmetrics_diff import MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.distributed._compile import HOST_ROUND_TRIPS


def rows_of(world: int, rank: int, n_local: tuple[int, ...] | None) -> tuple[int, int, int]:
    """``(lo, hi, n_global)``: this rank's rows of the global batch (uneven: rank r holds 3 + r rows)."""
    sizes = n_local or tuple(3 + r for r in range(world))
    lo, hi = bounds(sizes, rank)
    return lo, hi, sum(sizes)


def loss_step(kind: str, strategy: str | None, rank: int, world: int, sizes: tuple[int, ...] | None = None) -> tuple:
    """``(step, batch, model, criterion)``: ``step(*batch)`` runs the model and the loss on this rank's rows."""
    model = Net(kind)
    criterion = make_criterion(kind, strategy)
    lo, hi, n = rows_of(world, rank, sizes)
    inputs, extra = make_batch(kind, n, "compile")
    inputs, extra = slice_rows(inputs, lo, hi), slice_rows(extra, lo, hi)
    n_in = len(inputs)

    def step(*batch: torch.Tensor) -> torch.Tensor:
        outputs = model(*batch[:n_in])
        args, kwargs = criterion_call(kind, outputs, batch[n_in:])
        return criterion(*args, **kwargs)

    return step, (*inputs, *extra), model, criterion


def metric_step(which: str, rank: int, world: int) -> tuple:
    """A step calling a metric's ``forward``, a collection's, or ``compute`` after a forward (synced on step)."""
    model = Net("mean")
    lo, hi, n = rows_of(world, rank, None)
    (x,), (y, weight, _mask) = make_batch("mean", n, "compile")
    x, y, weight = x[lo:hi], y[lo:hi], weight[lo:hi]
    opts = {"dist_sync_on_step": True, "nan_strategy": "disable"}
    if which == "metric":
        metric: Any = MeanMetric(**opts)
    elif which == "collection":
        metric = MetricCollection({"sum": SumMetric(**opts), "mean": MeanMetric(**opts)})
    else:
        metric = MeanMetric(**opts)

    def step(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> Any:
        err = (model(x)[0] - y) ** 2
        out = metric(err, weight=weight.expand_as(err)) if which != "collection" else metric(err)
        if which == "compute":
            return out, metric.compute()
        return out

    return step, (x, y, weight), model, metric


def make_step(case: tuple, rank: int, world: int) -> tuple:
    if case[0] in ("metric", "collection", "compute"):
        return metric_step(case[0], rank, world)
    return loss_step(case[0], case[1], rank, world)


def _total(out: Any) -> torch.Tensor:
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return sum(_total(o) for o in out)
    return out


def count_recompiles(
    rank: int, world: int, cases: list[tuple], backend: str = "eager", steps: int = 100, warmup: int = 3
) -> dict[str, dict[str, int]]:
    """Per case: frames compiled during warm-up and during the ``steps`` steps after it (must be 0), breaks."""
    out = {}
    for case in cases:
        torch._dynamo.reset()
        counters.clear()
        step, batch, model, _ = make_step(case, rank, world)
        compiled = torch.compile(step, backend=backend)
        for _ in range(warmup):
            _total(compiled(*batch)).backward()
        after_warmup = counters["frames"]["total"], counters["stats"]["unique_graphs"]
        for _ in range(steps):
            _total(compiled(*batch)).backward()
        out[str(case)] = {
            "warmup_frames": after_warmup[0],
            "new_frames": counters["frames"]["total"] - after_warmup[0],
            "new_graphs": counters["stats"]["unique_graphs"] - after_warmup[1],
            "graph_breaks": sum(counters["graph_break"].values()),
        }
        model.zero_grad()
    torch._dynamo.reset()
    return out


def count_breaks(rank: int, world: int, cases: list[tuple]) -> dict[str, Any]:
    """Per case: graph breaks of one compiled call (``torch._dynamo.explain``), with their reasons."""
    out = {}
    for case in cases:
        torch._dynamo.reset()
        step, batch, _, _ = make_step(case, rank, world)
        HOST_ROUND_TRIPS.clear()
        explained = torch._dynamo.explain(step)(*batch)
        out[str(case)] = {
            "breaks": explained.graph_break_count,
            "reasons": [str(b.reason).splitlines()[0] for b in explained.break_reasons],
            "host": dict(HOST_ROUND_TRIPS),
        }
    torch._dynamo.reset()
    return out


def compiled_equals_eager(
    rank: int, world: int, cases: list[tuple], backend: str = "eager", steps: int = 3
) -> dict[str, float]:
    """Per case: the largest difference between compiled and eager values and parameter gradients (float64)."""
    out = {}
    for case in cases:
        torch._dynamo.reset()
        step_e, batch, model_e, crit_e = make_step(case, rank, world)
        step_c, _, model_c, crit_c = make_step(case, rank, world)
        compiled = torch.compile(step_c, backend=backend)
        worst = 0.0
        for _ in range(steps):
            for p in (*model_e.parameters(), *model_c.parameters()):
                p.grad = None
            value_e, value_c = _total(step_e(*batch)), _total(compiled(*batch))
            value_e.backward()
            value_c.backward()
            worst = max(worst, (value_e - value_c).abs().item())
            for pe, pc in zip(model_e.parameters(), model_c.parameters()):
                if pe.grad is not None or pc.grad is not None:
                    worst = max(worst, (pe.grad - pc.grad).abs().max().item())
        if hasattr(crit_e, "compute") and not isinstance(crit_e, MetricCollection):
            worst = max(worst, (crit_e.compute() - crit_c.compute()).abs().item())
        out[str(case)] = worst
    torch._dynamo.reset()
    return out


def check_cases(
    rank: int,
    world: int,
    cases: list[tuple],
    backend: str = "eager",
    steps: int = 20,
    warmup: int = 2,
    fullgraph: bool = False,
) -> dict[str, dict[str, Any]]:
    """Per case, one compiled step and an eager twin (same seeded model and data), run side by side:

    - ``breaks``/``reasons``: the graph breaks Dynamo made while compiling (during warm-up);
    - ``new_frames``: frames compiled during the ``steps`` steps after warm-up (a recompile or a new frame; 0);
    - ``worst``: the largest difference between compiled and eager values, gradients and ``compute()``;
    - ``error``: with ``fullgraph=True`` (no graph break allowed), what compiling raised, else ``None``.
    """
    out = {}
    for case in cases:
        try:
            out[str(case)] = {**_check_case(case, rank, world, backend, steps, warmup, fullgraph), "error": None}
        except Exception as err:
            if not fullgraph:
                raise
            out[str(case)] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    torch._dynamo.reset()
    return out


def _check_case(
    case: tuple, rank: int, world: int, backend: str, steps: int, warmup: int, fullgraph: bool
) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    step_e, batch, model_e, crit_e = make_step(case, rank, world)
    step_c, _, model_c, crit_c = make_step(case, rank, world)
    compiled = torch.compile(step_c, backend=backend, fullgraph=fullgraph)
    worst, frames = 0.0, 0
    for i in range(warmup + steps):
        if i == warmup:
            frames = counters["frames"]["total"]
            HOST_ROUND_TRIPS.clear()
        for p in (*model_e.parameters(), *model_c.parameters()):
            p.grad = None
        value_e, value_c = _total(step_e(*batch)), _total(compiled(*batch))
        value_e.backward()
        value_c.backward()
        if i < warmup or i == warmup + steps - 1:  # the comparisons cost more than the steps
            worst = max(worst, (value_e - value_c).abs().item())
            for pe, pc in zip(model_e.parameters(), model_c.parameters()):
                worst = max(worst, (pe.grad - pc.grad).abs().max().item())
    if not isinstance(crit_e, MetricCollection):
        worst = max(worst, (crit_e.compute() - crit_c.compute()).abs().item())
    return {
        "breaks": sum(counters["graph_break"].values()),
        "reasons": sorted({r.splitlines()[0] for r in counters["graph_break"]}),
        "new_frames": counters["frames"]["total"] - frames,
        "worst": worst,
        "host_per_step": {name: n / steps for name, n in HOST_ROUND_TRIPS.items()},
    }


def count_break_points(rank: int, world: int, cases: list[tuple]) -> dict[str, Any]:
    """:func:`count_breaks` with ``nested_graph_breaks``: one break per break point, not one per enclosing frame."""
    nested = torch._dynamo.config.nested_graph_breaks
    torch._dynamo.config.nested_graph_breaks = True
    try:
        return count_breaks(rank, world, cases)
    finally:
        torch._dynamo.config.nested_graph_breaks = nested


LOSS_CASES: list[tuple] = [
    ("clip", "sharded"),
    ("clip", "replicated"),
    ("infonce", "sharded"),
    ("supcon", "sharded"),
    ("siglip", "sharded"),
    ("barlow", None),
    ("mean", None),
    ("tokence", None),
]
METRIC_CASES: list[tuple] = [("metric",), ("collection",), ("compute",)]


# ------------------------------------------------------------------ the gradients of functional collectives


def _coefficients(world: int, rows: int, cols: int) -> list[torch.Tensor]:
    """Rank r's loss is ``Σ C_r * y``: a different, seeded function of the collective's result on every rank."""
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(rows, cols, generator=g, dtype=torch.float64) for _ in range(world)]


def funcol_gradients(rank: int, world: int) -> dict[str, float]:
    """Largest error of each functional collective's gradient against the hand-built adjoint, eager and compiled.

    ``all_reduce`` (sum): every rank's gradient is ``Σ_r' C_r'`` (the gradients of every rank summed: our
    ``grad="sync"``); ``all_gather_tensor``: rank r's input receives ``Σ_r' C_r'[rows of r]`` (reduce-scatter).
    ``sum_across_ranks`` must give the ``all_reduce`` answer in both modes.
    """
    from torch.distributed import _functional_collectives as funcol

    from torchmetrics_diff.distributed._compile import sum_across_ranks

    group = torch.distributed.group.WORLD
    n, d = 2, 3
    x0 = torch.arange(n * d, dtype=torch.float64).reshape(n, d) + 10 * rank
    errors = {}

    reduce_c = _coefficients(world, n, d)
    gather_c = _coefficients(world, world * n, d)

    def reduce_loss(x: torch.Tensor) -> torch.Tensor:
        return (reduce_c[rank] * funcol.all_reduce(x, "sum", group)).sum()

    def gather_loss(x: torch.Tensor) -> torch.Tensor:
        return (gather_c[rank] * funcol.all_gather_tensor(x, 0, group)).sum()

    def ours_loss(x: torch.Tensor) -> torch.Tensor:
        return (reduce_c[rank] * sum_across_ranks(x, None, world)).sum()

    expected_sum = sum(torch.arange(n * d, dtype=torch.float64).reshape(n, d) + 10 * r for r in range(world))
    for label, fn, grad in (
        ("all_reduce", reduce_loss, sum(reduce_c)),
        ("all_gather_tensor", gather_loss, sum(gather_c)[rank * n : (rank + 1) * n]),
        ("sum_across_ranks", ours_loss, sum(reduce_c)),
    ):
        for mode, run in (("eager", fn), ("compiled", torch.compile(fn, backend="eager", fullgraph=True))):
            x = x0.clone().requires_grad_(True)
            run(x).backward()
            errors[f"{label} {mode} grad"] = (x.grad - grad).abs().max().item()
        torch._dynamo.reset()
    with torch.no_grad():
        errors["sum_across_ranks value"] = (sum_across_ranks(x0, None, world) - expected_sum).abs().max().item()
    return errors


def nan_aggregators(strategy: Any) -> dict[str, dict[str, Any]]:
    """Per aggregator: graph breaks and new frames of a compiled step fed NaNs, and the largest difference of its
    value, ``compute()`` and input gradient from the eager metric's (world size 1, no process group)."""
    from torchmetrics_diff import MaxMetric, MinMetric

    out = {}
    g = torch.Generator().manual_seed(7)
    batches = []
    for i in range(6):
        x = torch.randn(5, generator=g, dtype=torch.float64)
        x[i % 5] = float("nan")
        if i == 3:
            x[:] = float("nan")  # a batch of NaNs only
        batches.append(x)
    for cls in (SumMetric, MeanMetric, MaxMetric, MinMetric):
        torch._dynamo.reset()
        counters.clear()
        eager = cls(nan_strategy=strategy).set_dtype(torch.float64)
        traced = cls(nan_strategy=strategy).set_dtype(torch.float64)
        compiled = torch.compile(lambda x, m=traced: m(x * 1.0), backend="eager")
        worst, frames = 0.0, 0
        for i, x in enumerate(batches):
            if i == 2:
                frames = counters["frames"]["total"]
            xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
            ve, vc = eager(xe * 1.0), compiled(xc)
            (ve.nan_to_num(0.0, 0.0, 0.0)).backward()
            (vc.nan_to_num(0.0, 0.0, 0.0)).backward()
            same_nan = bool(torch.isnan(ve) == torch.isnan(vc))
            worst = max(worst, 0.0 if same_nan and torch.isnan(ve) else (ve - vc).abs().item() if same_nan else 1e9)
            worst = max(worst, (xe.grad - xc.grad).abs().max().item())
        worst = max(worst, (eager.compute() - traced.compute()).abs().item())
        out[cls.__name__] = {
            "breaks": sum(counters["graph_break"].values()),
            "new_frames": counters["frames"]["total"] - frames,
            "worst": worst,
        }
    torch._dynamo.reset()
    return out
