"""Checks ``"off"`` (``set_checks("off")``) serves every call family with static shapes, over many steps.

With the checks off the package exchanges headers at the first calls of each kind only (a metric's sync: its first
two, the agreement and the first through the agreed plan) and then moves data alone. Every family runs 5 steps
at W = 2 and 3 with uneven but static shapes per rank, and every value (and every gradient of a loss and of a
public gather) is compared with a single-process reference on the global batch:

- metrics: ``SumMetric`` and ``MulticlassAccuracy`` ``compute()`` after an ``update`` each step, ``MeanMetric``
  and ``CatMetric`` ``forward`` with ``dist_sync_on_step=True``, a ``MetricCollection``'s ``compute()``;
- every loss of ``tests._helpers.loss_cases.KINDS`` and, for the contrastive ones, every strategy (``"auto"`` too);
- the public ``gather_all_tensors``, ``all_gather_cat`` and ``all_reduce`` with ``grad="sync"``.

Package modules covered: ``distributed._call`` (the ``"off"`` transport), ``distributed._sync.engine``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import (
    KINDS,
    STRATEGY_KINDS,
    Net,
    criterion_call,
    make_batch,
    make_criterion,
    reference_step,
    slice_rows,
)
from tests._helpers.seeds import rand

pytestmark = pytest.mark.timeout(240)

STEPS = 5
ROWS = {2: (3, 2), 3: (3, 0, 4)}  # rows per rank: uneven, one rank empty at W=3, the same at every step
# a CatMetric's rows: none empty (a rank whose cat list stays empty agrees anew at every sync while its peers go
# through the plan: under "off" they would not meet; docs/guide/failure_modes.rst says so)
CAT_ROWS = {2: (3, 2), 3: (3, 1, 4)}


def _bounds(world: int, rank: int) -> tuple[int, int]:
    rows = ROWS[world]
    return sum(rows[:rank]), sum(rows[: rank + 1])


def _metrics(rank: int, world: int) -> list[str]:
    from torchmetrics_diff import CatMetric, MeanMetric, MetricCollection, SumMetric
    from torchmetrics_diff.classification import MulticlassAccuracy

    problems = []
    lo, hi = _bounds(world, rank)
    n = sum(ROWS[world])
    total, acc = SumMetric(), MulticlassAccuracy(num_classes=3, average="micro")
    mean, cat = MeanMetric(dist_sync_on_step=True), CatMetric(dist_sync_on_step=True)
    collection = MetricCollection({"sum": SumMetric(), "mean": MeanMetric()})
    seen_x, seen_pred, seen_target = [], [], []
    for step in range(STEPS):
        x = rand((n,), "off metrics", step)
        y = rand((sum(CAT_ROWS[world]),), "off cat", step)
        pred = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(step))
        target = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(100 + step))
        seen_x.append(x)
        seen_pred.append(pred)
        seen_target.append(target)
        everything = torch.cat(seen_x)
        total.update(x[lo:hi].sum())
        acc.update(pred[lo:hi], target[lo:hi])
        collection.update(x[lo:hi])
        expected = {
            "SumMetric.compute": (total.compute(), everything.sum()),
            "MulticlassAccuracy.compute": (
                acc.compute(),
                (torch.cat(seen_pred) == torch.cat(seen_target)).double().mean(),
            ),
            "MeanMetric.forward": (mean(x[lo:hi]), x.mean()),
            "CatMetric.forward": (cat(y[sum(CAT_ROWS[world][:rank]) : sum(CAT_ROWS[world][: rank + 1])]), y),
            "collection sum": (collection.compute()["sum"], everything.sum()),
            "collection mean": (collection.compute()["mean"], everything.mean()),
        }
        for name, (got, want) in expected.items():
            if not torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-9):
                problems.append(f"rank {rank}, step {step}, {name}: {got} != {want}")
    return problems


def _losses(rank: int, world: int) -> list[str]:
    problems = []
    lo, hi = _bounds(world, rank)
    n = sum(ROWS[world])
    for kind in KINDS:
        for strategy in ("replicated", "sharded", "ring", "auto") if kind in STRATEGY_KINDS else (None,):
            model = Net(kind)
            criterion = make_criterion(kind, strategy, grad_reduction="sum")
            for step in range(3):
                inputs, extra = make_batch(kind, n, "off", step)
                model.zero_grad(set_to_none=True)
                args, kwargs = criterion_call(kind, model(*slice_rows(inputs, lo, hi)), slice_rows(extra, lo, hi))
                value = criterion(*args, **kwargs)
                value.backward()
                want_value, want_grads = reference_step(kind, n, "off", step)
                case = f"rank {rank}, {kind}/{strategy}, step {step}"
                if abs(float(value) - want_value) > 1e-9 * max(1.0, abs(want_value)):
                    problems.append(f"{case}: value {float(value)} != {want_value}")
                for name, p in model.named_parameters():
                    grad = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                    dist.all_reduce(grad)  # (grad_reduction "sum": the ranks' gradients add up to the global one)
                    if not torch.allclose(grad, want_grads[name], rtol=1e-7, atol=1e-10):
                        problems.append(f"{case}: gradient of {name} differs")
    return problems


def _gathers(rank: int, world: int) -> list[str]:
    from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors

    problems = []
    for step in range(STEPS):
        data = [rand((ROWS[world][r], 3), "off gathers", step, r) for r in range(world)]
        x = data[rank].clone().requires_grad_(True)
        weights = rand((sum(ROWS[world]), 3), "off weights", step)
        cat = all_gather_cat(x, grad="sync")
        listed = gather_all_tensors(x, grad="sync")
        reduced = all_reduce(x.sum(0), "sum", grad="sync")
        ((cat * weights).sum() + sum((t * t).sum() for t in listed) + reduced.sum()).backward()
        lo, hi = _bounds(world, rank)
        # every rank computes the same function: d/dx_r of world x (w.x + x.x + sum x), summed over the ranks
        want_grad = world * (weights[lo:hi] + 2 * data[rank] + 1)
        if not torch.equal(cat.detach(), torch.cat(data)):
            problems.append(f"rank {rank}, step {step}: all_gather_cat {cat}")
        if any(not torch.equal(a.detach(), b) for a, b in zip(listed, data)) or len(listed) != world:
            problems.append(f"rank {rank}, step {step}: gather_all_tensors")
        if not torch.allclose(reduced.detach(), torch.cat(data).sum(0)):
            problems.append(f"rank {rank}, step {step}: all_reduce {reduced}")
        if not torch.allclose(x.grad, want_grad):
            problems.append(f"rank {rank}, step {step}: gradient {x.grad} != {want_grad}")
    return problems


def _off_body(rank: int, world: int, family: str) -> list[str]:
    from torchmetrics_diff.distributed import set_checks

    set_checks("off")
    try:
        return {"metrics": _metrics, "losses": _losses, "gathers": _gathers}[family](rank, world)
    finally:
        set_checks("steady")


@pytest.mark.parametrize("family", ["metrics", "losses", "gathers"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_checks_off_serves_every_call_family_over_many_steps(world_size: int, family: str) -> None:
    results = run_distributed(_off_body, world_size, family, timeout=180)
    problems = [p for res in results for p in res]
    assert not problems, "\n".join(problems[:20])
