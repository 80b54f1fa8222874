"""Tests of ``torchmetrics_diff._global.strategy``: the strategy table, the option checks, ``checked_together``,
the packing of views, ``sharded_value`` and ``global_rows_loss`` against a brute-force single process.

The distributed cases run on two gloo ranks (``tests/_helpers/harness.py``) in float64, with uneven rows and an
empty rank; the reference is one process on the concatenated batch, written here with plain autograd.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from tests._helpers.harness import run_distributed
from torchmetrics_diff._global.strategy import (
    DEFAULT_TILE,
    FIXED_STRATEGIES,
    GRAD_REDUCTIONS,
    Options,
    check_options,
    check_strategy,
    check_tile,
    checked_together,
    pack,
    rows_loss,
    same_width,
    sharded_value,
    strategy_table,
    unpack,
)
from torchmetrics_diff.distributed import gather_all_tensors
from torchmetrics_diff.functional import STRATEGIES, global_rows_loss

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}
SIZES = [(0, 5), (3, 4), (2, 0)]  # rows per rank at W=2: an empty rank first, uneven, an empty rank last
BAD_RANK = 1


# ------------------------------------------------------------------------------------------- table and checks
def test_the_strategies_are_auto_replicated_sharded_and_ring() -> None:
    assert STRATEGIES == ("auto", "replicated", "sharded", "ring")
    assert FIXED_STRATEGIES == ("replicated", "sharded", "ring")
    assert GRAD_REDUCTIONS == ("mean", "sum")


def test_strategy_table_has_one_implementation_per_strategy() -> None:
    def rows(*args: Any) -> str:
        return "rows"

    def sharded(*args: Any) -> str:
        return "sharded"

    def ring(*args: Any) -> str:
        return "ring"

    table = strategy_table(rows=rows, ring=ring)
    assert tuple(table) == FIXED_STRATEGIES  # ("auto" resolves to one of them before the table is read)
    assert [table[s]() for s in FIXED_STRATEGIES] == ["rows", "rows", "ring"]
    own = strategy_table(rows=rows, ring=ring, sharded=sharded)
    assert [own[s]() for s in FIXED_STRATEGIES] == ["rows", "sharded", "ring"]


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        (lambda: check_strategy("shard"), ["`strategy`", "('auto', 'replicated', 'sharded', 'ring')", "'shard'"]),
        (lambda: check_strategy(None), ["`strategy`", "'ring'", "None"]),
        (lambda: check_options("sharded", None, "avg", None), ["`grad_reduction`", "('mean', 'sum')", "'avg'"]),
        (lambda: check_options("ring", None, "mean", 0), ["`tile`", "positive integer", "0"]),
        (lambda: check_tile(2.5), ["`tile`", "positive integer", "2.5"]),
        (lambda: check_tile(True), ["`tile`", "True"]),
        (lambda: check_tile("8"), ["`tile`", "'8'"]),
    ],
    ids=["strategy", "strategy-none", "grad-reduction", "ring-tile", "tile-float", "tile-bool", "tile-str"],
)
def test_option_errors_name_the_argument_what_is_expected_and_what_came(call: Any, needles: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        call()
    missing = [n for n in needles if n not in str(info.value)]
    assert not missing, f"{missing} not in {str(info.value)!r}"


def test_check_options_reads_the_tile_only_for_ring() -> None:
    assert check_options("ring", None, "sum", None) == Options("ring", None, "sum", DEFAULT_TILE)
    assert check_options("ring", None, "mean", 3).tile == 3
    # the gathering strategies have no tile: a value they would not use is not an error
    assert check_options("sharded", None, "mean", 0) == Options("sharded", None, "mean", DEFAULT_TILE)


def test_global_rows_loss_refuses_ring_and_an_unknown_strategy() -> None:
    x = torch.ones(2, 3)

    def block(local: Any, every: Any, start: int) -> tuple[Tensor, Tensor]:
        return local[0].sum(), torch.tensor(2.0)

    with pytest.raises(ValueError, match="'ring' needs a ring kernel"):
        global_rows_loss([x], block, strategy="ring")
    with pytest.raises(ValueError, match="`strategy` must be one of"):
        global_rows_loss([x], block, strategy="all")


def test_checked_together_without_a_process_group_raises_the_error_itself() -> None:
    with pytest.raises(ValueError, match="the original error"), checked_together(None, torch.ones(1)):
        raise ValueError("the original error")


# ------------------------------------------------------------------------------------------- pack and unpack
def test_pack_then_unpack_gives_the_views_back() -> None:
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 4):
        views = [
            torch.randn(n, 3, generator=gen, dtype=F64),
            torch.randn(n, 2, 2, generator=gen, dtype=F64),
            torch.randn(n, generator=gen, dtype=F64),
        ]
        packed, trailing = pack(views)
        assert packed.shape == (n, 3 + 4 + 1)
        assert trailing == [(3,), (2, 2), ()]
        back = unpack(packed, trailing)
        assert len(back) == len(views), (len(back), len(views))
        assert all(b.shape == v.shape and torch.equal(b, v) for b, v in zip(back, views))


def test_pack_promotes_to_one_dtype_and_unpack_takes_any_row_count() -> None:
    packed, trailing = pack([torch.ones(2, 2, dtype=torch.float32), torch.zeros(2, 1, dtype=F64)])
    assert packed.dtype == F64
    stacked = torch.cat([packed, packed, packed])  # the rows of three ranks, as a gather returns them
    first, second = unpack(stacked, trailing)
    assert first.shape == (6, 2) and second.shape == (6, 1)
    assert torch.equal(first, torch.ones(6, 2, dtype=F64)) and torch.equal(second, torch.zeros(6, 1, dtype=F64))


def test_same_width_names_every_ranks_width() -> None:
    pieces = [torch.ones(2, 3), torch.ones(0, 3)]
    assert same_width(pieces) is pieces
    with pytest.raises(RuntimeError, match=r"rank 0: \(3,\), rank 1: \(4,\)"):
        same_width([torch.ones(2, 3), torch.ones(2, 4)])


def test_sharded_value_on_one_process_is_the_plain_mean() -> None:
    loss_sum = torch.tensor(6.0, dtype=F64, requires_grad=True)
    value = sharded_value(loss_sum, torch.tensor(4.0, dtype=F64), 1, None, "mean")
    value.backward()
    assert float(value.detach()) == 1.5 and float(loss_sum.grad) == 0.25
    assert float(sharded_value(torch.tensor(0.0), torch.tensor(0.0), 1, None, "mean")) == 0.0


# ------------------------------------------------------------------------------- global_rows_loss, two ranks
def _batch(n: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1000 + n)
    return torch.randn(n, 4, generator=gen, dtype=F64), torch.randn(n, 4, generator=gen, dtype=F64)


def _block(local: Any, every: Any, row_start: int) -> tuple[Tensor, Tensor]:
    """A row-decomposable loss: each row of x against every row of y, its own the positive (image-to-text CE)."""
    x = local[0]
    logits = x @ every[1].T
    own = torch.arange(row_start, row_start + x.shape[0])
    positive = logits[torch.arange(x.shape[0]), own] if x.shape[0] else logits.new_zeros(0)
    return (torch.logsumexp(logits, dim=1) - positive).sum(), torch.tensor(float(x.shape[0]), dtype=F64)


def _reference(x: Tensor, y: Tensor) -> tuple[float, Tensor, Tensor]:
    """One process, the whole batch: mean over rows of ``logsumexp(x_i · Y) - x_i · y_i``."""
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    logits = x @ y.T
    loss = (torch.logsumexp(logits, dim=1) - logits.diagonal()).mean()
    gx, gy = torch.autograd.grad(loss, (x, y))
    return float(loss.detach()), gx, gy


def _rows_on_rank(rank: int, world: int, cases: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for sizes, strategy, reduction, candidates in cases:
        x_all, y_all = _batch(sum(sizes))
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        x, y = x_all[lo:hi].clone().requires_grad_(), y_all[lo:hi].clone().requires_grad_()
        loss = global_rows_loss([x, y], _block, strategy=strategy, grad_reduction=reduction, candidates=candidates)
        loss.backward()
        factor = world if reduction == "mean" else 1  # the trainer averages the W-scaled local gradients
        out.append({"value": float(loss), "x": x.grad / factor, "y": y.grad / factor})
    return out


def _rows_cases() -> list[tuple[Any, ...]]:
    cases = []
    for sizes in SIZES:
        for strategy in ("replicated", "sharded"):
            for reduction in GRAD_REDUCTIONS:
                cases.append((sizes, strategy, reduction, None))
        cases.append((sizes, "sharded", "mean", [1]))  # only y is gathered: the block reads y's global rows alone
    return cases


def test_global_rows_loss_value_and_gradients_equal_one_process_at_two_ranks() -> None:
    cases = _rows_cases()
    per_rank = run_distributed(_rows_on_rank, 2, cases, timeout=120.0)
    problems = []
    for i, (sizes, strategy, reduction, candidates) in enumerate(cases):
        value, gx, gy = _reference(*_batch(sum(sizes)))
        for rank in range(2):
            got = per_rank[rank][i]
            lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
            where = f"[{strategy} {reduction} candidates={candidates} sizes={sizes}] rank {rank}"
            if abs(got["value"] - value) > 1e-12 * max(1.0, abs(value)):
                problems.append(f"{where}: value {got['value']!r} != {value!r}")
            if not torch.allclose(got["x"], gx[lo:hi], **TOL):
                problems.append(f"{where}: x gradient off by {float((got['x'] - gx[lo:hi]).abs().max()):.3g}")
            if not torch.allclose(got["y"], gy[lo:hi], **TOL):
                problems.append(f"{where}: y gradient off by {float((got['y'] - gy[lo:hi]).abs().max()):.3g}")
    assert not problems, "\n".join(problems)


def test_rows_loss_at_two_ranks_matches_global_rows_loss() -> None:
    """The checked entry point and the internal one (options already checked) are the same run."""
    results = run_distributed(_rows_both_ways, 2, timeout=60.0)
    for rank, (public, internal) in enumerate(results):
        assert public == internal, f"rank {rank}: {public} != {internal}"


def _rows_both_ways(rank: int, world: int) -> tuple[float, float]:
    x_all, y_all = _batch(7)
    lo, hi = (0, 3) if rank == 0 else (3, 7)
    x, y = x_all[lo:hi], y_all[lo:hi]
    public = global_rows_loss([x, y], _block, strategy="sharded")
    internal = rows_loss([x, y], _block, check_options("sharded", None, "mean", None))
    return float(public), float(internal)


# --------------------------------------------------------------------------- checked_together, every rank
def _fails_on_one_rank(rank: int, world: int) -> dict[str, Any]:
    """Rank ``BAD_RANK`` fails its checks; every rank then calls the first collective as the losses do."""
    out: dict[str, Any] = {}
    x = torch.ones(rank + 1, 3, dtype=F64)
    for case in ("direct", "strategy"):
        try:
            if case == "direct":
                with checked_together(None, x):
                    if rank == BAD_RANK:
                        raise ValueError("`x` is bad on this rank")
                gather_all_tensors(x, None, grad="none")
            else:  # a bad option on one rank, found by global_rows_loss's own checks
                global_rows_loss([x, x], _block, strategy="bogus" if rank == BAD_RANK else "sharded")
            out[case] = ("ok", "")
        except Exception as err:  # every rank reports what it saw
            out[case] = (type(err).__name__, str(err))
    # the group is still usable: the next collective completes on every rank
    total = torch.tensor([float(rank)], dtype=F64)
    dist.all_reduce(total)
    out["after"] = float(total)
    return out


def test_checked_together_raises_on_every_rank() -> None:
    results = run_distributed(_fails_on_one_rank, 2, timeout=60.0)
    problems = []
    expected = {"direct": "`x` is bad on this rank", "strategy": "`strategy` must be one of"}
    for rank, res in enumerate(results):
        for case, message in expected.items():
            kind, text = res[case]
            if rank == BAD_RANK and (kind != "ValueError" or message not in text):
                problems.append(f"{case} rank {rank} (bad): {kind} {text!r}, expected the ValueError {message!r}")
            if rank != BAD_RANK and (kind != "PeerFailedError" or f"rank {BAD_RANK}" not in text):
                problems.append(f"{case} rank {rank}: {kind} {text!r}, expected a PeerFailedError naming rank 1")
        if res["after"] != 1.0:
            problems.append(f"rank {rank}: the collective after the failure gave {res['after']}")
    assert not problems, "\n".join(problems)
