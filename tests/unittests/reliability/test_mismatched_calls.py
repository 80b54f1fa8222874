"""Ranks that arrive at different calls raise one clear ``RuntimeError`` on every rank: never an abort, never a hang.

The typical case is an uneven validation split: one rank runs one more ``update`` (or ``forward``) than the
others, which meanwhile go on to ``compute()``. Every call that communicates starts with the same fixed-size header
exchange (``distributed._call``), so the extra call meets the others' next call there; every rank reads every
rank's header and raises naming each rank's call and counts. Without it, the extra call's collective met a
collective of another size: gloo aborted the process (``EnforceNotMet``, SIGABRT) and NCCL hangs.

One test per communicating entry point: a loss's ``update`` and ``forward`` (each strategy), a syncing metric's
``forward``, ``compute`` (two metrics of one class told apart), a collection's ``forward`` and ``compute``, and
the public collectives. Each runs under the harness, whose workers would report a death by signal or a timeout,
and each twice: with every rank's header on every call (groups of up to 8 ranks), and with the fingerprint that
stands for it in larger groups (the bodies lower that bound so that 2 and 3 ranks take the large groups' path).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests._helpers.harness import run_distributed
from tests._helpers.headers import HEADERS, in_mode
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff import MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.distributed import all_gather_cat, all_reduce
from torchmetrics_diff.losses import CLIPLoss, GlobalMeanLoss, SupConLoss

pytestmark = pytest.mark.timeout(120)

# the ranks are grouped by what they were doing: rank 0 alone, the others as one run ("rank 1: " at two ranks)
NEEDLES = ("ranks are in different calls", "rank 0: ")


def _others(world_size: int) -> str:
    return "rank 1: " if world_size == 2 else f"ranks 1-{world_size - 1}: "


def _emb(rank: int, step: int, rows: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.nn.functional.normalize(torch.randn(rows, 4, generator=g, dtype=torch.float64), dim=1)


def _clip(strategy: str) -> Callable[[], tuple[Any, Callable, Callable]]:
    def make() -> tuple[Any, Callable, Callable]:
        loss = CLIPLoss(strategy=strategy)
        return loss, lambda r, s: loss.update(_emb(r, s), _emb(r, s + 50), 5.0), lambda: loss.compute()

    return make


def _clip_forward() -> tuple[Any, Callable, Callable]:
    loss = CLIPLoss()
    return loss, lambda r, s: loss(_emb(r, s), _emb(r, s + 50), 5.0), lambda: loss.compute()


def _supcon() -> tuple[Any, Callable, Callable]:
    loss = SupConLoss()
    return loss, lambda r, s: loss.update(_emb(r, s), torch.tensor([0, 1, 0])), lambda: loss.compute()


def _mean_loss() -> tuple[Any, Callable, Callable]:
    loss = GlobalMeanLoss()  # (its update adds to local sums: only forward communicates)
    return loss, lambda r, s: loss(_emb(r, s)), lambda: loss.compute()


def _metric_forward() -> tuple[Any, Callable, Callable]:
    metric = MeanMetric(dist_sync_on_step=True)
    return metric, lambda r, s: metric(_emb(r, s)), lambda: metric.compute()


def _collection_forward() -> tuple[Any, Callable, Callable]:
    coll = MetricCollection({"mean": MeanMetric(dist_sync_on_step=True), "sum": SumMetric(dist_sync_on_step=True)})
    return coll, lambda r, s: coll(_emb(r, s)), lambda: coll.compute()


CASES = {
    "CLIPLoss.update sharded": _clip("sharded"),
    "CLIPLoss.update replicated": _clip("replicated"),
    "CLIPLoss.update ring": _clip("ring"),
    "CLIPLoss.forward": _clip_forward,
    "SupConLoss.update": _supcon,
    "GlobalMeanLoss.forward": _mean_loss,
    "MeanMetric.forward (dist_sync_on_step)": _metric_forward,
    "MetricCollection.forward (dist_sync_on_step)": _collection_forward,
}


def _one_call_more(rank: int, world: int, case: str) -> dict[str, Any]:
    """Every rank makes 2 calls, rank 0 a third; then every rank computes, and the ranks check they are in step."""
    _obj, call, compute = CASES[case]()
    for step in range(2):
        call(rank, step)
    out = {"extra": outcome(lambda: call(rank, 2) if rank == 0 else compute())}
    out["in step"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    return out


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_one_call_more_on_one_rank_raises_on_every_rank(case: str, world_size: int, headers: str) -> None:
    results = run_distributed(in_mode, world_size, headers, _one_call_more, case, timeout=60)
    problems = [
        problem(f"rank {r} {case}", res["extra"], "RuntimeError", (*NEEDLES, _others(world_size)), within=10)
        for r, res in enumerate(results)
    ]
    messages = {res["extra"].message for res in results}
    if len(messages) != 1:
        problems.append(f"{case}: the ranks raised different messages: {sorted(messages)}")
    name = case.split()[0]  # the extra call and the compute are both named
    if not all(name in m and ".sync" in m for m in messages):
        problems.append(f"{case}: the message does not name both calls ({name!r} and the compute's sync): {messages}")
    for r, res in enumerate(results):
        if res["in step"].kind != "ok" or res["in step"].value.item() != world_size:
            problems.append(f"rank {r}: the ranks are out of step after the error: {res['in step']}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _two_of_a_class(rank: int, world: int) -> dict[str, Any]:
    """Two MeanMetrics: rank 0 computes the first twice while the others compute the first, then the second. Both
    syncs are 'MeanMetric.sync' with the same states: the metric's own count of syncs tells them apart."""
    first, second = MeanMetric(compute_with_cache=False), MeanMetric(compute_with_cache=False)
    first.update(torch.tensor([1.0 + rank]))
    second.update(torch.tensor([10.0 + rank]))
    out = {"first": outcome(lambda: first.compute())}
    out["next"] = outcome(lambda: first.compute() if rank == 0 else second.compute())
    return out


@pytest.mark.parametrize("headers", HEADERS)
def test_two_metrics_of_one_class_are_told_apart(headers: str) -> None:
    results = run_distributed(in_mode, 2, headers, _two_of_a_class, timeout=60)
    problems = []
    for r, res in enumerate(results):
        if res["first"].kind != "ok" or res["first"].value.item() != pytest.approx(1.5):  # mean of 1 and 2
            problems.append(f"rank {r}: the first compute: {res['first']}")
        problems.append(
            problem(f"rank {r}", res["next"], "RuntimeError", (*NEEDLES, _others(2), "MeanMetric.sync", "2nd", "1st"))
        )
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _collectives(rank: int, world: int) -> dict[str, Any]:
    """Rank 0 makes one all_reduce more while the others go on to an all_gather_cat of another size."""
    all_reduce(torch.ones(2), "sum", grad="none")
    if rank == 0:
        got = outcome(lambda: all_reduce(torch.ones(2), "sum", grad="none"))
    else:
        got = outcome(lambda: all_gather_cat(torch.ones(5 + rank, 3), grad="none"))
    return {"extra": got}


@pytest.mark.parametrize("headers", HEADERS)
def test_public_collectives_at_different_calls_raise_on_every_rank(headers: str) -> None:
    results = run_distributed(in_mode, 3, headers, _collectives, timeout=60)
    problems = [
        problem(
            f"rank {r}",
            res["extra"],
            "RuntimeError",
            (*NEEDLES, _others(3), "'all_reduce'", "'all_gather_cat'"),
            within=10,
        )
        for r, res in enumerate(results)
    ]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
