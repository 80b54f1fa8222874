"""DINO's teacher center over the global batch: ``functional._dino``, ``_global.dino`` and ``losses.DINOCenter``.

The reference is the paper's update written out in float64 on one process: ``c ← m·c + (1 - m)·mean`` with the
mean over the concatenated rows of every rank, a loop over the steps. Under W = 1, 2, 3 ranks with uneven and
empty ranks (and a step where every rank is empty) the center after every step equals it on every rank; an update
is one collective (the all-reduce of small CPU sums rides in the call header's exchange) and no host round trip;
``state_dict`` round-trips and the restored center continues identically; ranks that disagree (``D``, a bad input
on one rank) raise on every rank.

Package modules covered: ``functional._dino``, ``_global.dino``, ``losses.self_supervised`` (``DINOCenter``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from tests._helpers.checks import max_err
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.outcomes import outcome, problem
from tests._helpers.round_trips import counting, total
from tests._helpers.seeds import F64, bounds, generator
from torchmetrics_diff.functional import dino_center_update
from torchmetrics_diff.losses import DINOCenter

pytestmark = pytest.mark.timeout(120)

D = 5
MOMENTUM = 0.8
#: rows of [step][rank]: uneven, empty ranks, and a step with no row anywhere (the center stays)
ROWS = {
    1: [(4,), (0,), (3,)],
    2: [(3, 1), (0, 4), (0, 0), (2, 5)],
    3: [(2, 0, 5), (1, 1, 1), (0, 0, 0), (4, 2, 0)],
}


def _teacher(step: int, rows: int, crops: int = 2) -> Tensor:
    """The global batch of one step, ``(rows, crops, D)``: every crop of every image is a row of the mean."""
    g = generator("dino", step, rows)
    return torch.randn(rows, crops, D, generator=g, dtype=F64) * 2 + torch.arange(D, dtype=F64)


def ref_centers(world: int, momentum: float = MOMENTUM) -> list[Tensor]:
    """The paper's EMA over the concatenated batches, float64, one process: the center after each step."""
    center = torch.zeros(D, dtype=F64)
    out = []
    for step, rows in enumerate(ROWS[world]):
        batch = _teacher(step, sum(rows)).reshape(-1, D)
        if batch.shape[0]:
            mean = torch.stack([batch[k] for k in range(batch.shape[0])]).sum(0) / batch.shape[0]
            center = momentum * center + (1 - momentum) * mean
        out.append(center.clone())
    return out


def test_single_process_update_is_the_papers_ema() -> None:
    center = DINOCenter(D, MOMENTUM, dtype=F64)
    for step, rows in enumerate(ROWS[1]):
        center.update(_teacher(step, rows[0]))
        assert max_err(center.center, ref_centers(1)[step]) <= 1, step
    teacher = _teacher(9, 3)
    torch.testing.assert_close(center(teacher), teacher - center.center, rtol=0, atol=0)


def test_momentum_edges_and_half_precision() -> None:
    teacher = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    frozen = DINOCenter(2, momentum=1.0)
    frozen.update(teacher)
    assert frozen.center.tolist() == [0.0, 0.0]
    latest = DINOCenter(2, momentum=0)
    latest.update(teacher)
    assert latest.center.tolist() == [2.0, 3.0]
    # bfloat16 outputs are summed in float32: 4097 rows of 1.0 and one of 3.0 average to 1.00048...
    half = torch.ones(4097, 2, dtype=torch.bfloat16)
    half[0] = 3.0
    center = DINOCenter(2, momentum=0)
    center.update(half)
    torch.testing.assert_close(center.center, torch.full((2,), 4099 / 4097))
    assert center(half).dtype == torch.float32  # as the reference: half minus the float32 center


def test_no_gradient_reaches_the_center_or_through_update() -> None:
    center = DINOCenter(3)
    teacher = torch.randn(4, 3, requires_grad=True)
    center.update(teacher)
    assert not center.center.requires_grad
    out = center(teacher)
    out.sum().backward()
    torch.testing.assert_close(teacher.grad, torch.ones(4, 3))


def test_state_dict_round_trip_continues_identically() -> None:
    first = DINOCenter(D, MOMENTUM, dtype=F64)
    for step in range(2):
        first.update(_teacher(step, 3))
    state = first.state_dict()
    assert set(state) == {"center"}
    second = DINOCenter(D, MOMENTUM, dtype=F64)
    second.load_state_dict(state)
    for c in (first, second):
        c.update(_teacher(5, 4))
    assert torch.equal(first.center, second.center)
    assert torch.equal(
        dino_center_update(torch.zeros(D, dtype=F64), _teacher(0, 2), 0.5), 0.5 * _teacher(0, 2).reshape(-1, D).mean(0)
    )


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        (lambda: DINOCenter(0), ("`dim`", "0")),
        (lambda: DINOCenter(3, momentum=1.5), ("`momentum`", "1.5")),
        (lambda: DINOCenter(3, momentum=True), ("`momentum`", "True")),
        (lambda: DINOCenter(3, dtype=torch.long), ("`dtype`", "torch.int64")),
        (lambda: DINOCenter(3).update(torch.zeros(4, 2)), ("`teacher_output`", "(..., 3)", "(4, 2)")),
        (lambda: DINOCenter(3).update(torch.zeros(4, 3, dtype=torch.long)), ("`teacher_output`", "torch.int64")),
        (lambda: DINOCenter(3)(torch.zeros(4, 2)), ("`teacher_output`", "(..., 3)", "(4, 2)")),
        (lambda: dino_center_update(torch.zeros(3, 1), torch.zeros(4, 3)), ("`center`", "(D,)", "(3, 1)")),
        (lambda: dino_center_update(torch.zeros(3), torch.zeros(4, 3), momentum=-0.1), ("`momentum`", "-0.1")),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call: Any, needles: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert all(n in str(info.value) for n in needles), (str(info.value), needles)


# ------------------------------------------------------------------------------------------------ distributed
def _ranks(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    center = DINOCenter(D, MOMENTUM, dtype=F64)
    centers, logs, trips = [], [], 0
    for step, rows in enumerate(ROWS[world]):
        lo, hi = bounds(rows, rank)
        teacher = _teacher(step, sum(rows))[lo:hi]
        with record_collectives() as log, counting() as counts:
            center.update(teacher)
        centers.append(center.center.clone())
        logs.append(list(log))
        trips += total(counts) if step else 0  # the first update may agree on things; the rest are steady
    out["centers"], out["collectives"], out["round_trips"] = centers, logs, trips
    restored = DINOCenter(D, MOMENTUM, dtype=F64)
    restored.load_state_dict(center.state_dict())
    restored.update(_teacher(7, 2)[: rank % 2 + 1])
    center.update(_teacher(7, 2)[: rank % 2 + 1])
    out["restored equal"] = torch.equal(restored.center, center.center)
    if world > 1:
        odd = rank == world - 1
        out["other D"] = outcome(lambda: DINOCenter(4 if odd else D).update(torch.zeros(2, 4 if odd else D)))
        bad = torch.zeros(2, D + 1) if odd else torch.zeros(2, D)
        out["bad input on one rank"] = outcome(lambda: DINOCenter(D).update(bad))
        out["after the errors"] = outcome(lambda: center.update(_teacher(0, 1)))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_center_is_the_ema_of_the_global_mean(world_size: int) -> None:
    results = run_distributed(_ranks, world_size, timeout=60.0)
    want = ref_centers(world_size)
    problems = []
    for rank, r in enumerate(results):
        for step, (got, ref) in enumerate(zip(r["centers"], want)):
            if max_err(got, ref) > 1:
                problems.append(f"W={world_size} rank {rank} step {step}: center {got.tolist()} != {ref.tolist()}")
            if not torch.equal(got, results[0]["centers"][step]):
                problems.append(f"W={world_size} rank {rank} step {step}: center differs from rank 0's")
        for step, log in enumerate(r["collectives"]):
            if len(log) != (0 if world_size == 1 else 1) or log.count("all_reduce"):
                problems.append(f"W={world_size} rank {rank} step {step}: collectives {log}")
        if r["round_trips"]:
            problems.append(f"W={world_size} rank {rank}: {r['round_trips']} host round trips in steady updates")
        if not r["restored equal"]:
            problems.append(f"W={world_size} rank {rank}: the restored center continues differently")
        if world_size == 1:
            continue
        odd = rank == world_size - 1
        for p in (
            problem(f"rank {rank} other D", r["other D"], "RuntimeError", ("shape",)),
            problem(
                f"rank {rank} bad input",
                r["bad input on one rank"],
                "ValueError" if odd else "RuntimeError",
                ("`teacher_output`",) if odd else (f"rank {world_size - 1}",),
            ),
        ):
            if p:
                problems.append(f"W={world_size} {p}")
        if r["after the errors"].kind != "ok":
            problems.append(f"W={world_size} rank {rank}: update fails after the errors: {r['after the errors']}")
    assert not problems, "\n".join(problems)
