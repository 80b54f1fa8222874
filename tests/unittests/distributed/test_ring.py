"""The ring schedule itself (``distributed/_ring.py``: :class:`Ring` and :func:`circulate`), not through the losses.

On 1, 2 and 3 gloo ranks with uneven and empty blocks: each exchange is one ``batch_isend_irecv`` call holding
the non-empty tensors of the schedule; every rank visits every rank's block exactly once, in the documented order
(at step ``k`` rank ``r`` holds the block of rank ``(r - k) mod W``), with the owner's exact contents; accumulators
travel with the blocks and come home to their owner combined in visiting order; gradients computed on visited
blocks and sent home equal the brute-force gradient of every rank's loss with respect to the owner's rows. Every
expectation is rebuilt on each rank from seeds known to every rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, generator
from torchmetrics_diff.distributed._ring import Ring, circulate

pytestmark = pytest.mark.timeout(120)

ROWS = {"uneven": [3, 1, 5], "empty": [2, 0, 4], "all-empty": [0, 0, 0]}
DIM = 3


def _block(owner: int, rows: list[int], case: str) -> list[torch.Tensor]:
    """Rank ``owner``'s block: its rows and a per-row label (two tensors of different dtypes travel together)."""
    gen = generator(case, owner)
    x = torch.randn(rows[owner], DIM, generator=gen, dtype=F64)
    label = torch.arange(rows[owner], dtype=torch.int64) + 100 * owner
    return [x, label]


def _weight(rank: int, case: str) -> torch.Tensor:
    return torch.randn(DIM, generator=generator(case, "w", rank), dtype=F64)


def _loss(rank: int, x: torch.Tensor, case: str) -> torch.Tensor:
    """What rank ``rank`` computes on a block of rows (a different function on every rank)."""
    return ((x @ _weight(rank, case)) ** 2).sum() + (rank + 1) * x.sum()


def _schedule_body(rank: int, world: int) -> list[str]:
    failures: list[str] = []
    ring = Ring()
    if (ring.size, ring.rank) != (world, rank):
        failures.append(f"[rank {rank}] Ring() is ({ring.size}, {ring.rank}), expected ({world}, {rank})")
    for case, all_rows in ROWS.items():
        rows = all_rows[:world]
        seen: list[tuple[int, list[torch.Tensor]]] = []

        def visit(owner: int, block: list[torch.Tensor], seen: list = seen) -> None:
            seen.append((owner, [t.clone() for t in block]))

        def empty_block(owner: int, rows: list[int] = rows) -> list[torch.Tensor]:
            return [torch.empty(rows[owner], DIM, dtype=F64), torch.empty(rows[owner], dtype=torch.int64)]

        out = circulate(ring, _block(rank, rows, case), empty_block, visit)
        owners = [o for o, _ in seen]
        expected = [(rank - k) % world for k in range(world)]
        if owners != expected:
            failures.append(f"[rank {rank}] {case}: visited {owners}, expected {expected}")
        for owner, block in seen:
            want = _block(owner, rows, case)
            if not all(torch.equal(a, b) for a, b in zip(block, want)):
                failures.append(f"[rank {rank}] {case}: block of rank {owner} arrived changed")
        if out is not None:
            failures.append(f"[rank {rank}] {case}: no accumulators, yet circulate returned {out}")
    return failures


def _order_body(rank: int, world: int) -> list[str]:
    """Accumulators come home combined in visiting order: a non-commutative ``combine`` shows the order."""
    failures: list[str] = []
    ring = Ring()
    rows = ROWS["empty"][:world]

    def visit(owner: int, block: list[torch.Tensor]) -> torch.Tensor:
        return torch.full((2,), float(rank + 1), dtype=F64) + block[0].sum()

    acc = circulate(
        ring,
        _block(rank, rows, "order"),
        lambda o: [torch.empty(rows[o], DIM, dtype=F64), torch.empty(rows[o], dtype=torch.int64)],
        visit,
        empty_acc=lambda o: torch.empty(2, dtype=F64),
        combine=lambda incoming, part: incoming * 10 + part,
    )
    # brute force: the visitors of this rank's block are ranks rank, rank + 1, ... in that order
    own_sum = _block(rank, rows, "order")[0].sum()
    expected = None
    for k in range(world):
        part = torch.full((2,), float((rank + k) % world + 1), dtype=F64) + own_sum
        expected = part if expected is None else expected * 10 + part
    if acc is None or not torch.allclose(acc, expected, rtol=1e-12, atol=1e-12):
        failures.append(f"[rank {rank}] order: accumulator {acc}, expected {expected}")
    return failures


def _gradient_body(rank: int, world: int) -> list[str]:
    """The ring losses' pattern: each rank differentiates its own loss on every visited block and sends the
    gradient home; the owner receives the sum over ranks, which is the brute-force gradient of the total loss."""
    failures: list[str] = []
    ring = Ring()
    for case, all_rows in ROWS.items():
        rows = all_rows[:world]

        def visit(owner: int, block: list[torch.Tensor], case: str = case) -> torch.Tensor:
            x = block[0].detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(_loss(rank, x, case), x)
            return grad

        grad = circulate(
            ring,
            _block(rank, rows, case),
            lambda o, rows=rows: [torch.empty(rows[o], DIM, dtype=F64), torch.empty(rows[o], dtype=torch.int64)],
            visit,
            empty_acc=lambda o, rows=rows: torch.empty(rows[o], DIM, dtype=F64),
        )
        x = _block(rank, rows, case)[0].requires_grad_(True)
        total = sum(_loss(r, x, case) for r in range(world))
        (expected,) = torch.autograd.grad(total, x)
        if grad is None or grad.shape != expected.shape or not torch.allclose(grad, expected, rtol=1e-10, atol=1e-12):
            failures.append(f"[rank {rank}] {case}: gradient sent home {grad}, expected {expected}")
    return failures


def _subgroup_body(rank: int, world: int) -> list[str]:
    """A ring of group ranks [0, 2] of three: group rank 1 is global rank 2 (sends and receives go by global rank)."""
    group = dist.new_group([0, 2])
    if rank == 1:
        return []
    ring = Ring(group)
    me = {0: 0, 2: 1}[rank]
    rows = [2, 3]
    seen: list[int] = []

    def visit(owner: int, block: list[torch.Tensor]) -> torch.Tensor:
        seen.append(owner)
        if not torch.equal(block[0], _block(owner, rows, "sub")[0]):
            raise AssertionError(f"block of group rank {owner} arrived changed")
        return block[0] * (me + 1)

    acc = circulate(
        ring,
        _block(me, rows, "sub"),
        lambda o: [torch.empty(rows[o], DIM, dtype=F64), torch.empty(rows[o], dtype=torch.int64)],
        visit,
        empty_acc=lambda o: torch.empty(rows[o], DIM, dtype=F64),
    )
    failures = []
    if (ring.size, ring.rank) != (2, me) or seen != [me, 1 - me]:
        failures.append(f"[rank {rank}] ring ({ring.size}, {ring.rank}) visited {seen}")
    if acc is None or not torch.allclose(acc, _block(me, rows, "sub")[0] * 3):
        failures.append(f"[rank {rank}] accumulator {acc}")
    return failures


def _batched_body(rank: int, world: int) -> list[str]:
    """Every exchange is one ``batch_isend_irecv`` call: the block's tensors to the next rank and the next block's
    from the previous one, then the accumulator likewise; zero-size tensors are left out (an exchange with
    nothing left posts nothing). The expected batches are rebuilt from the documented schedule."""
    failures: list[str] = []
    calls: list[list[tuple[str, int, int, int]]] = []
    original = dist.batch_isend_irecv

    def recording(ops: list) -> list:
        calls.append([(op.op.__name__, op.peer, op.tensor.numel(), op.tag) for op in ops])
        return original(ops)

    ring = Ring()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    dist.batch_isend_irecv = recording
    try:
        for case, all_rows in ROWS.items():
            rows = all_rows[:world]
            calls.clear()
            grad = circulate(
                ring,
                _block(rank, rows, case),
                lambda o, rows=rows: [torch.empty(rows[o], DIM, dtype=F64), torch.empty(rows[o], dtype=torch.int64)],
                lambda owner, block: block[0] * 2,
                empty_acc=lambda o, rows=rows: torch.empty(rows[o], DIM, dtype=F64),
            )
            expected = []
            for k in range(world):
                owner, coming = (rank - k) % world, (rank - k - 1) % world
                if k < world - 1:
                    batch = [("isend", nxt, n, 17) for n in (rows[owner] * DIM, rows[owner]) if n]
                    batch += [("irecv", prev, n, 17) for n in (rows[coming] * DIM, rows[coming]) if n]
                    expected += [batch] if batch else []
                if world > 1:
                    batch = [("isend", nxt, rows[owner] * DIM, 18)] if rows[owner] else []
                    batch += [("irecv", prev, rows[coming] * DIM, 18)] if rows[coming] else []
                    expected += [batch] if batch else []
            if calls != expected:
                failures.append(f"[rank {rank}] {case}: batches {calls}, expected {expected}")
            want = _block(rank, rows, case)[0] * 2 * world
            if grad is None or not torch.allclose(grad, want, rtol=1e-12, atol=0):
                failures.append(f"[rank {rank}] {case}: accumulator {grad}, expected {want}")
    finally:
        dist.batch_isend_irecv = original
    return failures


def _assert_none(results: list[list[str]]) -> None:
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_block_visited_once_in_ring_order(world_size: int) -> None:
    _assert_none(run_distributed(_schedule_body, world_size, timeout=60))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_accumulators_come_home_combined_in_visiting_order(world_size: int) -> None:
    _assert_none(run_distributed(_order_body, world_size, timeout=60))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_gradients_sent_home_match_brute_force(world_size: int) -> None:
    _assert_none(run_distributed(_gradient_body, world_size, timeout=60))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_exchange_is_one_batch_of_point_to_point_operations(world_size: int) -> None:
    _assert_none(run_distributed(_batched_body, world_size, timeout=60))


def test_ring_of_a_subgroup_uses_global_ranks() -> None:
    _assert_none(run_distributed(_subgroup_body, 3, timeout=60))


def test_ring_of_one_without_process_group() -> None:
    """Not distributed: a ring of one visits its own block and returns its own part, no communication."""
    ring = Ring()
    assert (ring.size, ring.rank) == (1, 0)
    own = [torch.arange(3.0)]
    seen = []
    out = circulate(ring, own, lambda o: [torch.empty(3)], lambda o, b: seen.append(o) or b[0] * 2, lambda o: None)
    assert seen == [0]
    assert torch.equal(out, torch.arange(3.0) * 2)
