"""Exception safety: a call that raises leaves every state exactly as before it (values, list lengths and
``update_count``), and in a distributed run a bad input on ONE rank makes every rank raise — the bad rank its own
error, the others a ``RuntimeError`` naming it — promptly (no hang), after which the metric or loss works on every
rank (the next call returns the right global value).

The distributed bodies never let an expected error escape: they record what each call did (:func:`outcome`) and
return it, so the harness keeps its worker pools and the parent asserts.

Package modules covered: ``metric``, ``aggregation``, ``collections``, ``losses`` and ``functional`` (rollback, and
failing on every rank).
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from tests._helpers.headers import HEADERS, in_mode
from tests._helpers.metrics import InPlace
from tests._helpers.outcomes import Outcome, differences, members_differences, outcome, problem, snapshot
from torchmetrics_diff import MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.functional import clip_loss, supcon_loss
from torchmetrics_diff.losses import CLIPLoss, GlobalMeanLoss, SupConLoss, TokenCrossEntropyLoss

pytestmark = pytest.mark.timeout(120)

F64 = torch.float64
BAD = 1  # the one rank that gets the bad input
PROMPT_S = 5.0  # "no hang": every rank must raise well within the 30 s process-group timeout


# ------------------------------------------------------------------------------------------- single process


def test_update_that_raises_after_in_place_changes_is_rolled_back() -> None:
    metric = InPlace()
    metric.update(torch.tensor([1.0, 2.0], dtype=F64))
    before = snapshot(metric)
    with pytest.raises(ValueError, match="negative"):
        metric.update(torch.tensor([5.0, -1.0], dtype=F64))
    assert not differences(before, metric), differences(before, metric)
    with pytest.raises(ValueError, match="negative"):
        metric(torch.tensor([5.0, -1.0], dtype=F64))
    assert not differences(before, metric), differences(before, metric)
    metric.update(torch.tensor([3.0], dtype=F64))  # still works, and the failed calls left no trace
    torch.testing.assert_close(metric.compute(), torch.tensor([6.0, 14.0, 6.0, 3.0], dtype=F64))


@pytest.mark.parametrize("how", ["update", "forward"])
def test_nan_error_leaves_mean_metric_untouched(how: str) -> None:
    metric = MeanMetric(nan_strategy="error")
    metric.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([1.0, 2.0]))
    before = snapshot(metric)
    call = metric.update if how == "update" else metric
    with pytest.raises(RuntimeError, match="NaN"):
        call(torch.tensor([2.0, float("nan")]), weight=torch.tensor([1.0, 1.0]))
    assert not differences(before, metric), differences(before, metric)
    assert metric.compute().item() == pytest.approx(7 / 3)


def test_loss_with_a_bad_input_records_nothing() -> None:
    loss = CLIPLoss()
    x = torch.eye(3)
    loss(x, x, 2.0)
    before = snapshot(loss)
    with pytest.raises(ValueError, match="text_embeds"):
        loss(x, x[:2], 2.0)
    assert not differences(before, loss), differences(before, loss)


def test_accumulate_block_left_by_an_exception_can_be_entered_again() -> None:
    loss = GlobalMeanLoss()
    items = [torch.ones(2, dtype=torch.bool)]
    with pytest.raises(KeyError), loss.accumulate(items):
        raise KeyError("user code failed inside the block")
    with loss.accumulate(items):  # not "cannot be nested"
        value = loss(torch.tensor([1.0, 3.0]), mask=items[0])
    assert value.item() == 2.0


# -------------------------------------------------------------------------------- one bad rank, W = 2 and 3


def _good(rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s good batch at ``step``: ``rank + 2`` float64 values, the same in every process."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.rand(rank + 2, generator=g, dtype=F64) + 0.5


def _every(world: int, step: int) -> torch.Tensor:
    return torch.cat([_good(r, step) for r in range(world)])


def _one_bad_rank(rank: int, call: Any, good: Any, bad: Any) -> Outcome:
    return outcome(lambda: call(bad if rank == BAD else good))


def _metric_body(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    nan = torch.tensor([1.0, float("nan")], dtype=F64)

    # MeanMetric, NaN on one rank, plan already agreed (second step)
    mean = MeanMetric(nan_strategy="error", dist_sync_on_step=True).set_dtype(F64)
    mean(_good(rank, 0))
    before = snapshot(mean)
    out["mean: bad"] = _one_bad_rank(rank, mean, _good(rank, 1), nan)
    out["mean: states"] = differences(before, mean)
    out["mean: next"] = outcome(lambda: mean(_good(rank, 2)))
    out["mean: compute"] = outcome(mean.compute)

    # in-place metric (sum, cat list and max states) raising after its in-place changes: on the very first sync
    # (no agreed plan) and after two good steps (agreed plan with a cat capacity)
    for label, warm in (("first sync", 0), ("agreed plan", 2)):
        metric = InPlace(dist_sync_on_step=True)
        for step in range(warm):
            metric(_good(rank, 10 + step))
        before = snapshot(metric)
        out[f"inplace {label}: bad"] = _one_bad_rank(rank, metric, _good(rank, 3), -_good(rank, 3))
        out[f"inplace {label}: states"] = differences(before, metric)
        out[f"inplace {label}: next"] = outcome(lambda metric=metric: metric(_good(rank, 4)))

    # a MetricCollection whose MeanMetric raises on one rank; the members sync together
    coll = MetricCollection(
        {
            "sum": SumMetric(dist_sync_on_step=True).set_dtype(F64),
            "mean": MeanMetric(nan_strategy="error", dist_sync_on_step=True).set_dtype(F64),
            "inplace": InPlace(dist_sync_on_step=True),
        }
    )
    coll(_good(rank, 5))
    before_coll = {k: snapshot(m) for k, m in coll.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["collection: bad"] = _one_bad_rank(rank, coll, _good(rank, 6), nan)
    out["collection: states"] = members_differences(before_coll, coll)
    out["collection: next"] = outcome(lambda: coll(_good(rank, 7)))

    # every rank bad: each raises its own error
    mean2 = MeanMetric(nan_strategy="error", dist_sync_on_step=True)
    out["all bad"] = outcome(lambda: mean2(torch.tensor([float("nan")])))
    out["after"] = outcome(lambda: SumMetric(dist_sync_on_step=True)(torch.tensor(1.0)))
    return out


def _check_one_bad_rank(results: list[dict], case: str, bad_kind: str, bad_needles: tuple, owner: str) -> list[str]:
    """The bad rank raised its own error, every other rank a RuntimeError naming it; all promptly."""
    problems = []
    for rank, res in enumerate(results):
        got = res[f"{case}: bad"]
        if rank == BAD:
            problems.append(problem(f"{case} rank {rank} (bad)", got, bad_kind, bad_needles, within=PROMPT_S))
        else:
            needles = (owner, f"[{BAD}]", "raised an error before syncing")
            problems.append(problem(f"{case} rank {rank}", got, "RuntimeError", needles, within=PROMPT_S))
        states = res.get(f"{case}: states")
        if states:
            problems.append(f"{case} rank {rank}: the failed call changed {states}")
    return [p for p in problems if p]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_metric_forward_with_a_bad_input_on_one_rank(world_size: int, headers: str) -> None:
    results = run_distributed(in_mode, world_size, headers, _metric_body, timeout=60)
    problems = _check_one_bad_rank(results, "mean", "RuntimeError", ("NaN", "nan_strategy='error'"), "MeanMetric")
    for label in ("first sync", "agreed plan"):
        problems += _check_one_bad_rank(results, f"inplace {label}", "ValueError", ("negative",), "InPlace")
    problems += _check_one_bad_rank(results, "collection", "RuntimeError", ("NaN",), "MetricCollection")
    mean_next = _every(world_size, 2).mean()
    mean_all = torch.cat([_every(world_size, 0), _every(world_size, 2)]).mean()
    every = _every(world_size, 4)
    expected_inplace = torch.stack([every.sum(), (every * every).sum(), every.sum(), every.max()])
    every7 = _every(world_size, 7)
    for rank, res in enumerate(results):
        checks = {
            "mean: next": (res["mean: next"], mean_next),
            "mean: compute": (res["mean: compute"], mean_all),
            "inplace first sync: next": (res["inplace first sync: next"], expected_inplace),
            "inplace agreed plan: next": (res["inplace agreed plan: next"], expected_inplace),
            "after": (res["after"], torch.tensor(float(world_size))),
        }
        for case, (got, expected) in checks.items():
            if got.kind != "ok":
                problems.append(f"rank {rank} {case}: raised {got.kind} {got.message!r}")
            elif not torch.allclose(got.value.detach().to(F64), expected.to(F64)):
                problems.append(f"rank {rank} {case}: {got.value} != {expected}")
        got = res["collection: next"]
        if got.kind != "ok":
            problems.append(f"rank {rank} collection: next raised {got.kind} {got.message!r}")
        else:
            for key, expected in (("sum", every7.sum()), ("mean", every7.mean())):
                if not torch.allclose(got.value[key].detach(), expected):
                    problems.append(f"rank {rank} collection next {key}: {got.value[key]} != {expected}")
        problems.append(problem(f"rank {rank} all bad", res["all bad"], "RuntimeError", ("NaN", "nan_strategy")))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


# ------------------------------------------------------------------------------------------------------ losses


def _views(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + 10 * step + rank)
    img = torch.nn.functional.normalize(torch.randn(rank + 2, 4, generator=g, dtype=F64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(rank + 2, 4, generator=g, dtype=F64), dim=1)
    return img, txt


def _labels(rank: int) -> torch.Tensor:
    return torch.arange(rank + 2) % 2


def _loss_cases(rank: int, strategy: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loss = CLIPLoss(strategy=strategy)
    img, txt = _views(rank, 0)
    loss(img, txt, 5.0)
    before = snapshot(loss)
    out[f"clip {strategy}: bad"] = outcome(lambda: loss(img, txt[:1] if rank == BAD else txt, 5.0))
    out[f"clip {strategy}: states"] = differences(before, loss)
    out[f"clip {strategy}: next"] = outcome(lambda: loss(*_views(rank, 1), 5.0))

    sup = SupConLoss(temperature=0.5, strategy=strategy)
    feats = _views(rank, 2)[0]
    sup(feats, _labels(rank))
    before = snapshot(sup)
    bad_labels = _labels(rank)[:-1] if rank == BAD else _labels(rank)
    out[f"supcon {strategy}: bad"] = outcome(lambda: sup(feats, bad_labels))
    out[f"supcon {strategy}: states"] = differences(before, sup)
    out[f"supcon {strategy}: next"] = outcome(lambda: sup(feats, _labels(rank)))
    return out


def _loss_body(rank: int, world: int) -> dict[str, Any]:
    return {**_loss_cases(rank, "sharded"), **_loss_cases(rank, "replicated")}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_contrastive_loss_with_a_bad_input_on_one_rank(world_size: int, headers: str) -> None:
    """CLIPLoss with mismatched views and SupConLoss with labels of the wrong length on one rank only."""
    results = run_distributed(in_mode, world_size, headers, _loss_body, timeout=60)
    problems: list[str | None] = []
    clip_ref = clip_loss(*(torch.cat(v) for v in zip(*[_views(r, 1) for r in range(world_size)])), 5.0)
    feats_all = torch.cat([_views(r, 2)[0] for r in range(world_size)])
    sup_ref = supcon_loss(feats_all, torch.cat([_labels(r) for r in range(world_size)]), 0.5)
    for strategy in ("sharded", "replicated"):
        for case, kind, needles, ref in (  # ShapeMismatchError: a ValueError (and a RuntimeError)
            (f"clip {strategy}", "ShapeMismatchError", ("`text_embeds`", "`image_embeds`"), clip_ref),
            (f"supcon {strategy}", "ValueError", ("`labels`",), sup_ref),
        ):
            for rank, res in enumerate(results):
                got = res[f"{case}: bad"]
                if rank == BAD:
                    problems.append(problem(f"{case} rank {rank} (bad)", got, kind, needles, PROMPT_S))
                else:
                    needles_peer = (f"rank {BAD}", "raised an error before")
                    problems.append(problem(f"{case} rank {rank}", got, "RuntimeError", needles_peer, PROMPT_S))
                if res[f"{case}: states"]:
                    problems.append(f"{case} rank {rank}: the failed call changed {res[f'{case}: states']}")
                nxt = res[f"{case}: next"]
                if nxt.kind != "ok":
                    problems.append(f"{case} rank {rank}: the next call raised {nxt.kind} {nxt.message!r}")
                elif not torch.allclose(nxt.value.detach(), ref):
                    problems.append(f"{case} rank {rank}: the next call gave {nxt.value}, expected {ref}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _global_mean_body(rank: int, world: int) -> dict[str, Any]:
    loss = GlobalMeanLoss()
    loss(torch.tensor([1.0, 2.0], dtype=F64))
    before = snapshot(loss)
    mask = torch.ones(2) if rank == BAD else torch.ones(2, dtype=torch.bool)  # a float mask on one rank
    bad = outcome(lambda: loss(torch.tensor([3.0, 4.0], dtype=F64), mask=mask))
    changed = differences(before, loss)
    nxt = outcome(lambda: loss(torch.full((rank + 1,), float(rank), dtype=F64)))
    return {"bad": bad, "states": changed, "next": nxt, "compute": outcome(loss.compute)}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_global_mean_loss_with_a_bad_input_on_one_rank(world_size: int, headers: str) -> None:
    """Every rank raises; and no rank keeps the failed call in its states (the good ranks had already folded their
    batch into ``loss_sum``/``weight``/``update_count`` before the collective that failed)."""
    results = run_distributed(in_mode, world_size, headers, _global_mean_body, timeout=60)
    problems = []
    values = torch.cat([torch.full((r + 1,), float(r), dtype=F64) for r in range(world_size)])
    first = torch.tensor([1.0, 2.0], dtype=F64).repeat(world_size)
    for rank, res in enumerate(results):
        if rank == BAD:
            problems.append(problem(f"rank {rank} (bad)", res["bad"], "ValueError", ("`mask`", "bool"), PROMPT_S))
        else:
            needles = (f"rank {BAD}", "raised an error before")
            problems.append(problem(f"rank {rank}", res["bad"], "RuntimeError", needles, PROMPT_S))
        if res["states"]:
            problems.append(f"rank {rank}: the failed call changed {res['states']}")
        if res["next"].kind != "ok" or not torch.allclose(res["next"].value, values.mean()):
            problems.append(f"rank {rank}: next call gave {res['next']}, expected {values.mean()}")
        expected = torch.cat([first, values]).mean()
        if res["compute"].kind != "ok" or not torch.allclose(res["compute"].value, expected):
            problems.append(f"rank {rank}: compute gave {res['compute']}, expected {expected} (no failed call in it)")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _token_ce_body(rank: int, world: int) -> dict[str, Any]:
    # a subgroup with a short timeout: if the good ranks are left waiting, they fail in 3 s, not in 30 s
    dist.barrier()  # line the ranks up, so that the subgroup's own setup is far from its short timeout
    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=3))
    loss = TokenCrossEntropyLoss(process_group=group)
    target = torch.tensor([[0, 1, 7 if rank == BAD else 2]])  # 4 classes: 7 is out of range on one rank
    bad = outcome(lambda: loss(torch.zeros(1, 3, 4), target))
    dist.barrier()  # the default group: every rank is past its failure before the subgroup goes away
    dist.destroy_process_group(group)
    return {"bad": bad}


@pytest.mark.parametrize("world_size", [2])
@pytest.mark.parametrize("headers", HEADERS)
def test_token_cross_entropy_target_out_of_range_on_one_rank(world_size: int, headers: str) -> None:
    """A target outside ``[0, C)`` (not ``ignore_index``) on one rank: ``F.cross_entropy`` raises ``IndexError``
    there, which ``checked_together`` does not announce (it catches only ValueError/TypeError), so the other ranks
    wait in the all-reduce until the process-group timeout instead of raising at once."""
    results = run_distributed(in_mode, world_size, headers, _token_ce_body, timeout=60)
    problems = []
    for rank, res in enumerate(results):
        if rank == BAD:
            problems.append(problem(f"rank {rank} (bad)", res["bad"], res["bad"].kind, ("7",), within=PROMPT_S))
            if res["bad"].kind == "ok":
                problems.append(f"rank {rank}: an out-of-range target did not raise")
        else:
            needles = (f"rank {BAD}", "raised an error before")
            problems.append(problem(f"rank {rank}", res["bad"], "RuntimeError", needles, within=2.0))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


# -------------------------------------------------------------------------------------------------- accumulate


def _accumulate_body(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loss = GlobalMeanLoss()
    masks = [torch.tensor([True, True, False]), torch.tensor([True, False])]
    values = [torch.tensor([1.0, 2.0, 9.0], dtype=F64), torch.tensor([4.0, 9.0], dtype=F64)]

    def wrong_plan() -> None:  # the same number of calls everywhere, but one rank's calls bring another weight
        with loss.accumulate(masks):
            loss(values[0], mask=masks[0])
            loss(values[1], mask=torch.tensor([True, True]) if rank == BAD else masks[1])

    out["wrong weight"] = outcome(wrong_plan)

    def fewer_calls() -> None:  # one rank skips a call: its exit check meets the others' next all-reduce
        with loss.accumulate(masks):
            loss(values[0], mask=masks[0])
            if rank != BAD:
                loss(values[1], mask=masks[1])

    out["fewer calls"] = outcome(fewer_calls)

    def good() -> list[float]:
        with loss.accumulate(masks):
            return [loss(v * (rank + 1), mask=m).item() for v, m in zip(values, masks)]

    out["next"] = outcome(good)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("headers", HEADERS)
def test_accumulate_plan_mismatch_on_one_rank(world_size: int, headers: str) -> None:
    """Only one rank's calls do not add up to its plan: every rank raises on leaving the block (that rank naming
    the planned and the brought weight, the others naming it); a rank making fewer calls than the others also
    makes every rank raise, not hang; the next block works everywhere."""
    results = run_distributed(in_mode, world_size, headers, _accumulate_body, timeout=60)
    problems = []
    for rank, res in enumerate(results):
        if rank == BAD:
            needles = ("planned a weight of 3", "brought 4")
            problems.append(problem(f"wrong weight rank {rank} (bad)", res["wrong weight"], "RuntimeError", needles))
        else:
            needles = (f"rank(s) [{BAD}]", "did not add up")
            problems.append(problem(f"wrong weight rank {rank}", res["wrong weight"], "RuntimeError", needles))
        problems.append(problem(f"fewer calls rank {rank}", res["fewer calls"], "RuntimeError", within=PROMPT_S))
        # each rank's values scaled by rank + 1: the step's loss is Σ_r (r + 1)(1 + 2 + 4) / (3 W)
        expected = [sum((r + 1) * 3.0 for r in range(world_size)) / (3 * world_size)]
        expected.append(sum((r + 1) * 4.0 for r in range(world_size)) / (3 * world_size))
        got = res["next"]
        if got.kind != "ok" or not torch.allclose(torch.tensor(got.value), torch.tensor(expected)):
            problems.append(f"rank {rank}: the next block gave {got}, expected shares {expected}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
