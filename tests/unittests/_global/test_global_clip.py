"""The one-pass sharded CLIP loss (each global logit computed once) against a plain single-process formula.

Each rank holds a slice of a global batch of leaf tensors and calls ``global_clip_loss`` on its rows; the test
process computes the reference from ``torch.nn.functional.cross_entropy`` on the full (N, N) logits, in float64,
and differentiates it with autograd. Checked on every rank: the value, the gradient of the rank's own image and
text rows, and the logit scale's gradient after the trainer's reduction (sum, or mean over ranks of the W-scaled
local gradients), for a 0-d and a shape-(1,) scale. World sizes 1, 2, 3 with even, uneven and empty ranks, with
the column statistics combined by each branch of the rule (one all-gather, or two all-reduces of N numbers).
The combination itself against ``torch.logsumexp`` (``-inf`` columns and ranks), and the bytes each branch moves.

Also: extreme logits in float32 (the column statistics need their own shift), and that every fused kernel keeps
at most one tensor of the logit block's size for backward.
"""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from tests._helpers.checks import max_err
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import COLUMN_BRANCHES, column_branch
from tests._helpers.seeds import F64, bounds, generator
from torchmetrics_diff.functional import (
    clip_loss,
    global_clip_loss,
    global_info_nce_loss,
    global_siglip_loss,
    global_supcon_loss,
    info_nce_loss,
    siglip_loss,
    supcon_loss,
)

D = 6
SPLITS = {1: [(5,), (0,)], 2: [(4, 4), (3, 5), (0, 3), (0, 0)], 3: [(3, 5, 2), (3, 0, 5), (0, 4, 0)]}
SCALES = {"0-d": (), "shape (1,)": (1,)}


def _batch(n: int, key: object) -> tuple[Tensor, Tensor]:
    g = generator("global_clip", n, key)
    img = F.normalize(torch.randn(n, D, generator=g, dtype=F64), dim=1)
    txt = F.normalize(img + 0.7 * torch.randn(n, D, generator=g, dtype=F64), dim=1)  # informative positives
    return img, txt


def _reference(img: Tensor, txt: Tensor, scale: float) -> tuple[float, Tensor, Tensor, float]:
    """Value and gradients (image rows, text rows, scale) of one process on the whole batch, via F.cross_entropy."""
    img, txt = img.clone().requires_grad_(), txt.clone().requires_grad_()
    s = torch.tensor(scale, dtype=F64, requires_grad=True)
    n = img.shape[0]
    if n == 0:
        return 0.0, torch.zeros_like(img), torch.zeros_like(txt), 0.0
    logits = s * img @ txt.T
    target = torch.arange(n)
    loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    g_img, g_txt, g_s = torch.autograd.grad(loss, (img, txt, s))
    return float(loss.detach()), g_img, g_txt, float(g_s)


def _on_rank(rank: int, world: int, cases: list[tuple[Any, ...]], branch: str) -> dict[str, Any]:
    with column_branch(branch) as decisions:
        out = _run_cases(rank, world, cases)
    return {"cases": out, "decisions": decisions}


def _run_cases(rank: int, world: int, cases: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for sizes, key, scale, scale_shape, strategy, reduction in cases:
        img_all, txt_all = _batch(sum(sizes), key)
        lo, hi = bounds(sizes, rank)
        img, txt = img_all[lo:hi].clone().requires_grad_(), txt_all[lo:hi].clone().requires_grad_()
        s = torch.full(scale_shape, scale, dtype=F64, requires_grad=True)
        loss = global_clip_loss(img, txt, s, strategy=strategy, grad_reduction=reduction)
        loss.backward()
        g_s = s.grad.clone().reshape(1)
        if world > 1:  # the trainer: sum, or mean of the W-scaled local gradients
            dist.all_reduce(g_s)
        factor = world if reduction == "mean" else 1
        out.append(
            {
                "value": float(loss),
                "img": img.grad / factor,
                "txt": txt.grad / factor,
                "scale": float(g_s) / factor,
                "scale_shape": tuple(s.grad.shape),
            }
        )
    return out


def _cases(world: int, strategies: tuple[str, ...] = ("sharded", "replicated")) -> list[tuple[Any, ...]]:
    cases = []
    for i, sizes in enumerate(SPLITS[world]):
        for shape_name, shape in SCALES.items():
            for strategy in strategies:
                for reduction in ("mean", "sum"):
                    scale = (2.0, 7.5)[i % 2]
                    cases.append((sizes, f"{i}{shape_name}", scale, shape, strategy, reduction))
    return cases


@pytest.mark.parametrize(
    ("world_size", "branch"), [(1, "gather"), (2, "gather"), (3, "gather"), (2, "reductions"), (3, "reductions")]
)
def test_global_clip_value_and_gradients_equal_single_process_cross_entropy(world_size: int, branch: str) -> None:
    # the reductions change only the sharded strategy's column statistics: the replicated cases run once
    cases = _cases(world_size, ("sharded",) if branch == "reductions" else ("sharded", "replicated"))
    results = run_distributed(_on_rank, world_size, cases, branch, timeout=120.0)
    for rank, result in enumerate(results):  # the branch ran wherever the statistics crossed ranks (N > 0)
        sharded = [c for c in cases if c[4] == "sharded" and sum(c[0])]
        want = [branch == "gather"] * (len(sharded) if world_size > 1 else 0)
        assert result["decisions"] == want, f"rank {rank}: the rule chose {result['decisions']}, not {branch}"
    per_rank = [result["cases"] for result in results]
    problems = []
    for i, (sizes, key, scale, shape, strategy, reduction) in enumerate(cases):
        value, g_img, g_txt, g_s = _reference(*_batch(sum(sizes), key), scale)
        where = f"[{strategy} {reduction} sizes={sizes} scale {shape}]"
        for rank in range(world_size):
            got = per_rank[rank][i]
            lo, hi = bounds(sizes, rank)
            for name, err in (
                ("value", max_err(got["value"], value)),
                ("image grad", max_err(got["img"], g_img[lo:hi])),
                ("text grad", max_err(got["txt"], g_txt[lo:hi])),
                ("scale grad", max_err(got["scale"], g_s)),
            ):
                if err > 1:
                    problems.append(f"{where} rank {rank}: {name} off by {err:.3g}x the 1e-10 tolerance")
            if got["scale_shape"] != shape:
                problems.append(f"{where} rank {rank}: scale grad shape {got['scale_shape']} != {shape}")
    assert not problems, "\n".join(problems)


def _extreme(rank: int, world: int) -> list[float]:
    """float32, logit scale 100, and a text whose every similarity is far below the other rows' maxima."""
    img_all, txt_all = _extreme_batch(torch.float32)
    lo, hi = bounds((3, 3), rank) if world == 2 else (0, 6)
    img, txt = img_all[lo:hi].clone().requires_grad_(), txt_all[lo:hi].clone().requires_grad_()
    loss = global_clip_loss(img, txt, 100.0, grad_reduction="sum")
    loss.backward()
    return [float(loss), img.grad.clone(), txt.grad.clone()]


def _extreme_batch(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    img = torch.eye(6, 4, dtype=dtype)[[0, 1, 2, 3, 0, 1]]
    txt = img.clone()
    txt[5] = -img[5]  # cos -1 with its own image and with image 1: its column's logits are all <= 0 ...
    txt[4] = torch.tensor([0.6, 0.8, 0.0, 0.0], dtype=dtype)  # ... while rows reach +100
    return img, txt


@pytest.mark.parametrize("world_size", [1, 2])
def test_float32_extreme_logits_match_float64(world_size: int) -> None:
    """Rows reach logit 100 while a column stays at or below 0: a shared shift would underflow that column."""
    img, txt = (t.to(F64) for t in _extreme_batch(torch.float32))
    value, g_img, g_txt, _ = _reference(img, txt, 100.0)
    for rank, (got, gi, gt) in enumerate(run_distributed(_extreme, world_size, timeout=60.0)):
        lo, hi = bounds((3, 3), rank) if world_size == 2 else (0, 6)
        assert math.isfinite(got) and abs(got - value) <= 1e-4 * max(1.0, abs(value))
        torch.testing.assert_close(gi.to(F64), g_img[lo:hi], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gt.to(F64), g_txt[lo:hi], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ saved tensors
def _count_block_sized_saves(fn: Any, block: int) -> int:
    """Number of tensors of at least ``block`` elements that autograd keeps for the backward of ``fn()``."""
    saved: list[int] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return sum(1 for numel in saved if numel >= block)


def _leaf(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).requires_grad_()


@pytest.mark.parametrize(
    ("name", "fn", "block"),
    [
        ("clip_loss", lambda a, b, s: clip_loss(a, b, s), 32 * 32),
        ("global_clip_loss", lambda a, b, s: global_clip_loss(a, b, s), 32 * 32),
        ("siglip_loss", lambda a, b, s: siglip_loss(a, b, s, -1.0), 32 * 32),
        ("global_siglip_loss", lambda a, b, s: global_siglip_loss(a, b, s, -1.0), 32 * 32),
        ("info_nce_loss", lambda a, b, s: info_nce_loss(a, b, 1 / s), 64 * 64),
        ("global_info_nce_loss", lambda a, b, s: global_info_nce_loss(a, b, 1 / s), 64 * 64),
        ("supcon_loss", lambda a, b, s: supcon_loss(torch.stack([a, b], 1), torch.arange(32) % 5, 1 / s), 64 * 64),
        ("global_supcon_loss", lambda a, b, s: global_supcon_loss(a, torch.arange(32) % 5, 1 / s), 32 * 32),
    ],
)
def test_at_most_one_logit_block_is_kept_for_backward(name: str, fn: Any, block: int) -> None:
    a, b = _leaf(32, 3, seed=1), _leaf(32, 3, seed=2)
    s = torch.tensor(3.0, dtype=F64, requires_grad=True)
    assert _count_block_sized_saves(lambda: fn(a, b, s), block) <= 1, name


def _sharded_saves(rank: int, world: int) -> int:
    rows = (5, 11)[rank]
    img, txt = _leaf(rows, 3, seed=10 + rank), _leaf(rows, 3, seed=20 + rank)
    s = torch.tensor(3.0, dtype=F64, requires_grad=True)
    return _count_block_sized_saves(lambda: global_clip_loss(img, txt, s, strategy="sharded"), 5 * 16)


def test_sharded_clip_keeps_at_most_one_row_block_for_backward() -> None:
    """Rank 0 holds 5 of 16 rows: its (5, 16) block is the largest tensor it may keep (the texts are 16 x 3)."""
    assert run_distributed(_sharded_saves, 2, timeout=60.0) == [1, 1]


# ------------------------------------------------------------------------------------- the column statistics
NEG = -torch.inf


def _parts(world: int) -> Tensor:
    """Every rank's partial column log-sum-exps (W, 6): column 0 is ``-inf`` on every rank, column 1 on all but the
    first, column 2 far above and column 3 far below 0; the second rank holds no rows (its parts are all ``-inf``)."""
    g = generator("column parts", world)
    parts = torch.randn(world, 6, generator=g, dtype=F64) * 3
    parts[:, 0] = NEG
    parts[1:, 1] = NEG
    parts[:, 2] += 800.0  # exp would overflow without a shift
    parts[:, 3] -= 800.0  # and underflow
    parts[1] = NEG
    return parts


def _combined(rank: int, world: int) -> dict[str, Tensor]:
    from torchmetrics_diff._global.contrastive import _column_lse_of_every_rank

    out = {}
    for branch in COLUMN_BRANCHES:
        with column_branch(branch) as decisions:
            out[branch] = _column_lse_of_every_rank(_parts(world)[rank].clone(), None, world)
        assert decisions == [branch == "gather"]
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_both_branches_combine_columns_as_torch_logsumexp(world_size: int) -> None:
    """``-inf`` everywhere gives ``-inf`` (no NaN); a rank without rows changes nothing; no overflow or underflow."""
    want = torch.logsumexp(_parts(world_size), dim=0)
    assert want[0] == NEG and torch.isfinite(want[1:]).all()
    for rank, got in enumerate(run_distributed(_combined, world_size, timeout=60.0)):
        for branch, lse in got.items():
            assert not lse.isnan().any(), f"rank {rank} {branch}: NaN in {lse}"
            assert lse[0] == NEG, f"rank {rank} {branch}: a column without rows gave {lse[0]}"
            torch.testing.assert_close(lse, want, rtol=1e-14, atol=0, msg=f"rank {rank} {branch}")


def _column_traffic(rank: int, world: int, m: int, force: str | None) -> list[tuple[str, list[int]]]:
    """The collectives (and their tensors' bytes) of one sharded ``clip_sum`` over ``m`` columns: one image row
    per rank against ``m`` texts, so the only collectives are the column statistics'. ``force``: a branch, or
    ``None``: the rule at ``W`` above its limit on ranks (only the table's bytes decide)."""
    from torchmetrics_diff._global import contrastive
    from torchmetrics_diff.functional import clip_sum

    g = generator("column traffic", m, rank)
    img, txt_all = torch.randn(1, 4, generator=g, dtype=F64), torch.randn(m, 4, generator=g, dtype=F64)
    sizes: list[tuple[str, list[int]]] = []
    rule = column_branch(force) if force else mock.patch.object(contrastive, "_GATHER_MAX_WORLD", 1)
    with rule, record_collectives(sizes=sizes):
        clip_sum(img, txt_all, 2.0, min(rank, m - 1), sharded=True)
    return sizes


@pytest.mark.parametrize("world_size", [2, 3])
def test_reductions_move_m_numbers_per_rank_whatever_w(world_size: int) -> None:
    """The reductions: two all-reduces of the M statistics, no all-gather of the W × M table; the gather: one
    all-gather whose output is the table."""
    m, item = 40, 8  # float64 statistics
    gathered = run_distributed(_column_traffic, world_size, m, "gather", timeout=60.0)
    reduced = run_distributed(_column_traffic, world_size, m, "reductions", timeout=60.0)
    for rank in range(world_size):
        assert gathered[rank] == [("_all_gather_flat", [world_size * m * item, m * item])], gathered[rank]
        assert reduced[rank] == [("all_reduce", [m * item]), ("all_reduce", [m * item])], reduced[rank]


def test_the_rule_gathers_tables_up_to_64_kib() -> None:
    """Above the ranks' limit the table's bytes decide: 64 KiB (W = 2, 4096 float64 columns) travel in the
    all-gather, one column more in the reductions."""
    for m, want in ((4096, ["_all_gather_flat"]), (4097, ["all_reduce", "all_reduce"])):
        for rank, calls in enumerate(run_distributed(_column_traffic, 2, m, None, timeout=60.0)):
            assert [name for name, _ in calls] == want, f"M={m} rank {rank}: {calls}"
