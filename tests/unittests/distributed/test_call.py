"""The call header (``distributed._call``): fixed size, names and counts, failure markers, and the gloo twin that
carries it beside NCCL (exercised here by forcing a twin for the gloo test group)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff import MeanMetric
from torchmetrics_diff.distributed import _call, all_gather_cat
from torchmetrics_diff.functional import clip_loss
from torchmetrics_diff.losses import CLIPLoss

pytestmark = pytest.mark.timeout(120)


def test_names_round_trip_through_the_header_and_are_truncated() -> None:
    for name in ("", "all_reduce", "CLIPLoss.update: gather_all_tensors"):
        assert _call._decode(_call._encode(name)) == name
    long = "x" * 100
    assert _call._decode(_call._encode(long)) == "x" * (8 * _call._NAME_INTS)


def test_a_payload_longer_than_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match=f"at most {_call.PAYLOAD} ints; got {_call.PAYLOAD + 1}"):
        _call.exchange("too long", [0] * (_call.PAYLOAD + 1), None, 2)


def _headers_body(rank: int, world: int) -> dict[str, Any]:
    """Payloads come back by rank; a public collective is its header exchange and its data collective."""
    with record_collectives() as log:
        got = _call.exchange("probe", [rank, 7 * rank], None, world)
        all_gather_cat(torch.ones(2 + rank, 3), grad="none")
    return {"got": got, "log": log}


def test_every_rank_gets_every_payload() -> None:
    results = run_distributed(_headers_body, 3, timeout=60)
    for rank, res in enumerate(results):
        assert res["got"] == [[r, 7 * r] for r in range(3)], f"rank {rank}: {res['got']}"
        assert len(res["log"]) == 3, f"rank {rank}: header + (header + data) of all_gather_cat: {res['log']}"


def _twin_body(rank: int, world: int) -> dict[str, Any]:
    """Headers over a gloo twin (as beside NCCL): a loss, a syncing metric, a mismatch, all as over the group."""
    _call._FORCE_TWIN = True
    _call._HOSTS.clear()
    try:
        g = torch.Generator().manual_seed(rank)
        img = torch.nn.functional.normalize(torch.randn(2 + rank, 4, generator=g, dtype=torch.float64), dim=1)
        txt = torch.nn.functional.normalize(torch.randn(2 + rank, 4, generator=g, dtype=torch.float64), dim=1)
        value = CLIPLoss()(img, txt, 3.0).detach()
        metric = MeanMetric(dist_sync_on_step=True)
        batch = metric(torch.tensor([float(rank)], dtype=torch.float64))
        twin = _call._HOSTS[id(dist.GroupMember.WORLD)][1]
        mismatch = outcome(lambda: metric(torch.ones(1)) if rank == 0 else metric.compute())
        return {
            "value": value,
            "batch": batch,
            "twin is another group": twin is not None and twin is not dist.GroupMember.WORLD,
            "twin ranks": dist.get_process_group_ranks(twin),
            "mismatch": mismatch,
        }
    finally:
        _call._FORCE_TWIN = False
        _call._HOSTS.clear()


def test_headers_over_a_gloo_twin_group() -> None:
    results = run_distributed(_twin_body, 2, timeout=90)
    every = []
    for r in range(2):
        g = torch.Generator().manual_seed(r)
        every.append(
            [
                torch.nn.functional.normalize(torch.randn(2 + r, 4, generator=g, dtype=torch.float64), dim=1)
                for _ in "it"
            ]
        )
    expected = clip_loss(torch.cat([e[0] for e in every]), torch.cat([e[1] for e in every]), 3.0)
    problems = []
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["value"], expected, rtol=1e-12, atol=1e-12)
        assert res["batch"].item() == pytest.approx(0.5), res["batch"]  # mean of 0 and 1
        assert res["twin is another group"] and res["twin ranks"] == [0, 1], res
        problems.append(problem(f"rank {rank}", res["mismatch"], "RuntimeError", ("different calls", "MeanMetric")))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _area_body(rank: int, world: int) -> dict[str, Any]:
    """The inline area follows the CPU rows calls on the group want: it grows, carries them, and shrinks back."""
    from torchmetrics_diff import CatMetric, SumMetric
    from torchmetrics_diff.distributed import all_reduce

    out: dict[str, Any] = {"start": _call.inline_capacity(None)}
    g = torch.Generator().manual_seed(rank)
    metric = CatMetric()
    counts, values = [], []
    for _ in range(3):  # rows of 2000 floats (8 KB): over the first area, under the largest
        metric.reset()
        metric.update(torch.rand(2000 + rank, generator=g))
        with record_collectives() as log:
            values.append(metric.compute())
        counts.append(len(log))
    out["counts"], out["values"], out["grown"] = counts, values, _call.inline_capacity(None)
    # ranks in different calls after the area grew: still one size per exchange, so every rank raises
    out["mismatch"] = outcome(lambda: metric.compute() if rank == 0 else all_reduce(torch.ones(2), grad="none"))
    small = SumMetric()
    small.update(torch.ones(2))
    for _ in range(_call._WINDOW):
        small.compute()
    out["shrunk"] = _call.inline_capacity(None)
    huge = CatMetric()  # rows over the largest area: never inline, the area stays small
    huge.update(torch.rand(_call.MAX_INLINE_BYTES // 4 + 10))
    counts = []
    for _ in range(3):
        with record_collectives() as log:
            huge.compute()
        counts.append(len(log))
    out["huge counts"], out["after huge"] = counts, _call.inline_capacity(None)
    # an all_reduce of a CPU tensor larger than the area: its header asks for room, so the next ones ride inline
    x = torch.rand(2000, generator=g, dtype=torch.float64, requires_grad=True)
    counts, sums, grads = [], [], []
    for _ in range(3):
        with record_collectives() as log:
            total = all_reduce(x * 3.0)
        counts.append(len(log))
        (grad,) = torch.autograd.grad(total.sum(), x)
        sums.append(total.detach())
        grads.append(grad)
    out["reduce counts"], out["reduce sums"], out["reduce grads"] = counts, sums, grads
    out["reduce input"] = x.detach()
    return out


def test_the_inline_area_grows_to_the_rows_calls_want_and_shrinks_back() -> None:
    results = run_distributed(_area_body, 2, timeout=90)
    every = [torch.rand(2000 + r, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    expected = torch.cat(every)
    for rank, res in enumerate(results):
        assert res["start"] == _call.INLINE_BYTES, res["start"]
        for value in res["values"][:1]:
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
        assert all(v.shape == (4001,) for v in res["values"]), [v.shape for v in res["values"]]
        # first sync: header + rounds A and B (round A's row holds the metadata only: it fits); second: steady, the
        # row after the header, whose header asks for an area that fits it; third: the row inside the header exchange
        assert res["counts"] == [3, 2, 1], f"rank {rank}: {res['counts']}"
        assert 8004 <= res["grown"] <= 8004 + _call._STEP, f"rank {rank}: area {res['grown']}"
        err = problem(f"rank {rank}", res["mismatch"], "RuntimeError", ("different calls", "CatMetric.sync"))
        assert err is None, err
        assert res["shrunk"] == _call.INLINE_BYTES, f"rank {rank}: area after {_call._WINDOW} small calls"
        assert res["huge counts"][1:] == [2, 2], f"rank {rank}: header + row: {res['huge counts']}"
        assert res["after huge"] == _call.INLINE_BYTES, f"rank {rank}: {res['after huge']}"
        # header + all-reduce, then the rows inside the header exchange: the same sums and (local) gradients
        assert res["reduce counts"] == [2, 1, 1], f"rank {rank}: {res['reduce counts']}"
        want = 3.0 * (results[0]["reduce input"] + results[1]["reduce input"])
        for total, grad in zip(res["reduce sums"], res["reduce grads"]):
            torch.testing.assert_close(total, want, rtol=1e-15, atol=0)
            torch.testing.assert_close(grad, torch.full_like(grad, 3.0), rtol=0, atol=0)
