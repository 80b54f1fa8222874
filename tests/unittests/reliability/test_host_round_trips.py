"""No host round trip in the steady state: a loss call whose shapes are the previous call's, and a metric ``forward``
with ``dist_sync_on_step=True``, read nothing back from the device — at any world size, every strategy.

Host round trips are counted by wrapping the ``Tensor`` methods that read a value back (``tolist``, ``item``,
``__bool__``, ...) and the data-shaped operations (``tests/_helpers/round_trips.py``); a training step (forward
and backward) after two warm-up steps must count 0. Sizes are not cached: every call's header exchange carries
them as host values (``distributed._call``), so a dtype change or a bad input on one rank still raises on every
rank, and a shape change on one rank alone (an uneven last batch) gives the exact global loss, all without a
round trip.

Package modules covered: ``distributed`` (``_call``, ``_collectives``, the sync engine's layout),
``functional`` (the strategies, the ring's plan, SupCon's labels), ``losses`` and ``aggregation``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests._helpers.harness import run_distributed
from tests._helpers.headers import HEADERS, in_mode
from tests._helpers.outcomes import outcome, problem
from tests._helpers.round_trips import counting, total
from torchmetrics_diff import MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.functional import clip_loss
from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
)

pytestmark = pytest.mark.timeout(180)

F64 = torch.float64
STRATEGIES = ("replicated", "sharded", "ring")
WARM_UP, STEADY = 2, 2


def _randn(rank: int, *shape: int, salt: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1000 * salt + rank), dtype=F64)


def _inputs(kind: str, rank: int, rows: int, salt: int = 0) -> tuple[tuple, Callable[[], Any]]:
    """``(leaves, call(criterion))`` of one step: the leaves require grad, the call returns the loss."""
    g = torch.Generator().manual_seed(7 * salt + rank)
    if kind in ("clip", "siglip", "infonce", "barlow"):
        a = torch.nn.functional.normalize(_randn(rank, rows, 4, salt=salt), dim=1).requires_grad_()
        b = torch.nn.functional.normalize(_randn(rank, rows, 4, salt=salt + 1), dim=1).requires_grad_()
        scale = torch.tensor(5.0, dtype=F64, requires_grad=True)
        if kind == "clip":
            return (a, b, scale), lambda c: c(a, b, scale)
        if kind == "siglip":
            bias = torch.tensor(-2.0, dtype=F64, requires_grad=True)
            return (a, b, scale, bias), lambda c: c(a, b, scale, bias)
        return (a, b), lambda c: c(a, b)
    if kind in ("supcon", "supcon_unlabelled"):
        feats = _randn(rank, rows, 2, 4, salt=salt).requires_grad_()
        labels = torch.randint(0, 3, (rows,), generator=g) if kind == "supcon" else None
        return (feats,), lambda c: c(feats, labels)
    if kind == "mean":
        values = _randn(rank, rows, 3, salt=salt).requires_grad_()
        mask = torch.rand(rows, 3, generator=g) < 0.7
        return (values,), lambda c: c(values, mask=mask)
    if kind == "tokence":
        logits = _randn(rank, rows, 3, 5, salt=salt).requires_grad_()
        target = torch.randint(0, 5, (rows, 3), generator=g)
        return (logits,), lambda c: c(logits, target)
    raise ValueError(kind)


def _criterion(kind: str, strategy: str | None) -> Any:
    opts = {} if strategy is None else {"strategy": strategy}
    if strategy == "ring":
        opts["tile"] = 2  # several tiles per block
    return {
        "clip": lambda: CLIPLoss(**opts),
        "siglip": lambda: SigLIPLoss(**opts),
        "infonce": lambda: InfoNCELoss(temperature=0.5, **opts),
        "supcon": lambda: SupConLoss(temperature=0.5, **opts),
        "supcon_unlabelled": lambda: SupConLoss(temperature=0.5, **opts),
        "barlow": lambda: BarlowTwinsLoss(),
        "mean": lambda: GlobalMeanLoss(),
        "tokence": lambda: TokenCrossEntropyLoss(),
    }[kind]()


LOSS_CASES = [(kind, s) for kind in ("clip", "siglip", "infonce", "supcon", "supcon_unlabelled") for s in STRATEGIES]
LOSS_CASES += [("barlow", None), ("mean", None), ("tokence", None)]


def _metric_cases() -> dict[str, Callable[[], tuple[Any, Callable[[Any, int], Any]]]]:
    """Case -> a factory of ``(metric, step(metric, rank) -> value)``."""

    def values(rank: int) -> torch.Tensor:
        return _randn(rank, 2 + rank, salt=3).requires_grad_()

    def mean_weighted(m: Any, rank: int) -> Any:
        return m(values(rank), weight=torch.rand(2 + rank, generator=torch.Generator().manual_seed(rank)))

    return {
        "MeanMetric": lambda: (MeanMetric(dist_sync_on_step=True), lambda m, r: m(values(r))),
        "MeanMetric weighted": lambda: (MeanMetric(dist_sync_on_step=True), mean_weighted),
        "SumMetric": lambda: (SumMetric(dist_sync_on_step=True), lambda m, r: m(values(r))),
        "MeanMetric float64 ignore": lambda: (
            MeanMetric(nan_strategy="ignore", dist_sync_on_step=True).set_dtype(F64),
            lambda m, r: m(values(r)),
        ),
        "MetricCollection": lambda: (
            MetricCollection({"mean": MeanMetric(dist_sync_on_step=True), "sum": SumMetric(dist_sync_on_step=True)}),
            lambda m, r: m(values(r)),
        ),
    }


def _backward(value: Any, leaves: tuple = ()) -> None:
    out = sum(v.sum() for v in value.values()) if isinstance(value, dict) else value
    if out.requires_grad:
        out.backward()
    for leaf in leaves:
        leaf.grad = None


def _steady_counts_body(rank: int, world: int) -> dict[str, Any]:
    """Per case: the round trips of the first step, of the steady steps (by name), and whether a steady step's
    value equals the first step's (the reused sizes give the same numbers)."""
    out: dict[str, Any] = {}
    for kind, strategy in LOSS_CASES:
        criterion = _criterion(kind, strategy)
        leaves, call = _inputs(kind, rank, 2 + rank)
        with counting() as first:
            value = call(criterion)
            _backward(value, leaves)
        reference = value.detach().clone()
        for _ in range(WARM_UP - 1):
            _backward(call(criterion), leaves)
        with counting() as steady:
            for _ in range(STEADY):
                value = call(criterion)
                _backward(value, leaves)
        out[f"{kind} {strategy}"] = (total(first), dict(steady), bool(torch.equal(value.detach(), reference)))
    for name, make in _metric_cases().items():
        metric, step = make()
        with counting() as first:
            value = step(metric, rank)
            _backward(value)
        for _ in range(WARM_UP - 1):
            _backward(step(metric, rank))
        with counting() as steady:
            for _ in range(STEADY):
                _backward(step(metric, rank))
        out[name] = (total(first), dict(steady), True)
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_no_host_round_trip_in_the_steady_state(world_size: int, headers: str) -> None:
    results = run_distributed(in_mode, world_size, headers, _steady_counts_body, timeout=150)
    problems = []
    for rank, res in enumerate(results):
        for case, (_first, steady, same) in res.items():
            if steady:
                problems.append(
                    f"rank {rank} {case}: {sum(steady.values())} host round trips per {STEADY} steps {steady}"
                )
            if not same:
                problems.append(f"rank {rank} {case}: a steady step's value differs from the first step's")
    assert not problems, "\n".join(problems)


def test_the_counter_sees_round_trips() -> None:
    """The counter itself: each kind of host read counts once (a counter that sees nothing would pass anything)."""
    x = torch.tensor([1.0, float("nan"), 2.0])
    with counting() as counts:
        x.sum().item()
        bool(x.isnan().any())
        x.tolist()
        torch.unique(x)
        x[x > 0]
        float(x[0])
        x[0:2]  # a slice: no read
    assert dict(counts) == {"item": 1, "__bool__": 1, "tolist": 1, "unique": 1, "__getitem__": 1, "__float__": 1}
    with counting() as counts:
        pass
    assert total(counts) == 0


# ------------------------------------------------------------------------------------------ errors still raise


def _steady_then(rank: int, world: int, kind: str, strategy: str | None, change: str) -> dict[str, Any]:
    """Two steady calls, then ``change`` on some ranks, then the original call again on every rank."""
    odd = rank == world - 1
    criterion = _criterion(kind, strategy)
    leaves, call = _inputs(kind, rank, 3)
    for _ in range(2):
        _backward(call(criterion), leaves)
    out: dict[str, Any] = {}
    if change == "dtype":  # the last rank sends float32 (a mismatch between ranks)
        f32 = tuple(t.detach().float().requires_grad_() for t in leaves)
        changed = (lambda c: c(*f32[:2], 5.0)) if odd else call
    elif change == "rows on one rank":  # an uneven last batch: the last rank has 2 rows, the others 3
        changed = _inputs(kind, rank, 2)[1] if odd else call
    elif change == "rows on every rank":
        changed = _inputs(kind, rank, 4 + rank, salt=5)[1]
    elif change == "bad input":  # the last rank's texts have a wrong width: it fails its checks
        bad = (leaves[0], leaves[1][:, :3], leaves[2])
        changed = (lambda c: c(*bad)) if odd else call
    else:
        raise ValueError(change)
    out["changed"] = outcome(lambda: changed(criterion))
    out["after"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    out["again"] = outcome(lambda: call(criterion).detach())
    with counting() as steady:
        out["again steady"] = outcome(lambda: call(criterion).detach())
    out["again round trips"] = total(steady)
    if change.startswith("rows"):  # one process on every rank's rows of the changed call (every rank builds them)
        every = [
            _inputs(kind, r, 4 + r, salt=5)[0]
            if change == "rows on every rank"
            else _inputs(kind, r, 2 if r == world - 1 else 3)[0]
            for r in range(world)
        ]
        out["reference"] = clip_loss(torch.cat([e[0] for e in every]), torch.cat([e[1] for e in every]), 5.0).detach()
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("change", ["dtype", "bad input"])
@pytest.mark.parametrize("headers", HEADERS)
def test_a_change_on_one_rank_raises_on_every_rank(world_size: int, strategy: str, change: str, headers: str) -> None:
    """After the steady state, one rank changes its dtype or passes a bad input: every rank raises (the same
    message, except the bad rank's own error) and the ranks stay in step; the next call is steady again."""
    results = run_distributed(in_mode, world_size, headers, _steady_then, "clip", strategy, change, timeout=120)
    last = world_size - 1
    problems = []
    for rank, res in enumerate(results):
        got = res["changed"]
        if change == "dtype":
            problems.append(problem(f"rank {rank}", got, "RuntimeError", ("disagree", "dtype"), within=10))
        elif rank == last:
            # (ShapeMismatchError: a ValueError and a RuntimeError)
            problems.append(problem(f"rank {rank}", got, "ShapeMismatchError", ("text_embeds",), within=10))
        else:
            problems.append(
                problem(f"rank {rank}", got, "RuntimeError", (f"rank {last}", "raised an error"), within=10)
            )
        if res["after"].kind != "ok" or res["after"].value.item() != world_size:
            problems.append(f"rank {rank}: the ranks are out of step after the error: {res['after']}")
        if res["again"].kind != "ok" or res["again steady"].kind != "ok":
            problems.append(f"rank {rank}: the original call failed afterwards: {res['again']} {res['again steady']}")
        if res["again round trips"]:
            problems.append(f"rank {rank}: {res['again round trips']} round trips once steady again")
    if change != "bad input":
        messages = {res["changed"].message for res in results}
        if len(messages) != 1:
            problems.append(f"the ranks raised different messages: {sorted(messages)}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


@pytest.mark.parametrize("change", ["rows on one rank", "rows on every rank"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("headers", HEADERS)
def test_a_change_of_rows_gives_the_global_loss(strategy: str, change: str, headers: str) -> None:
    """Rows that change on one rank alone (an uneven last batch) or on every rank (each to another size) need no
    agreement beforehand: the value is one process's on every rank's rows, and the call after is steady again."""
    results = run_distributed(in_mode, 3, headers, _steady_then, "clip", strategy, change, timeout=120)
    for rank, res in enumerate(results):
        assert res["changed"].kind == "ok", f"rank {rank}: {res['changed']}"
        torch.testing.assert_close(res["changed"].value.detach(), res["reference"])
        assert res["again steady"].kind == "ok" and res["again round trips"] == 0, f"rank {rank}: {res}"


def _metric_mismatch_body(rank: int, world: int) -> dict[str, Any]:
    """A syncing MeanMetric in its steady state; then the last rank's update fails, then its inputs' dtype changes."""
    odd = rank == world - 1
    metric = MeanMetric(nan_strategy="error", dist_sync_on_step=True)
    x = torch.ones(2, dtype=F64)  # the batch states take the inputs' float64
    for _ in range(3):
        metric(x)
    out = {"bad update": outcome(lambda: metric(torch.tensor([float("nan")] if odd else [1.0], dtype=F64)))}
    out["steady after"] = outcome(lambda: metric(x))
    out["dtype"] = outcome(lambda: metric(x.float() if odd else x))  # the last rank's batch states in float32
    out["after"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_a_syncing_metric_in_its_steady_state_still_raises_on_every_rank(world_size: int, headers: str) -> None:
    results = run_distributed(in_mode, world_size, headers, _metric_mismatch_body, timeout=60)
    last = world_size - 1
    problems = []
    for rank, res in enumerate(results):
        if rank == last:
            problems.append(problem(f"rank {rank} bad", res["bad update"], "RuntimeError", ("NaN", "nan_strategy")))
        else:
            problems.append(problem(f"rank {rank} bad", res["bad update"], "RuntimeError", (f"[{last}]", "before")))
        if res["steady after"].kind != "ok":
            problems.append(f"rank {rank}: the next step failed: {res['steady after']}")
        problems.append(problem(f"rank {rank} dtype", res["dtype"], "RuntimeError", ("'mean_value'", "dtype")))
        if res["after"].kind != "ok" or res["after"].value.item() != world_size:
            problems.append(f"rank {rank}: out of step: {res['after']}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
