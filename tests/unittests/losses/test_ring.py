"""The ``"ring"`` strategy: exact global-batch gradients with per-rank memory independent of N.

- Gradient equivalence under a real ``DistributedDataParallel`` model, float64, W = 1, 2, 3, even, uneven and empty
  ranks, ``grad_reduction`` "mean" (DDP) and "sum" (a manual all-reduce), tiles of 2 and 3 candidate columns (so
  full and partial tiles and single-row blocks all occur), against the *independent* single-process references of
  ``tests._helpers.references`` (explicit loops over anchors and pairs, never this package's code).
- Bounded memory, by construction: while a W = 3 ring runs forward and backward, no floating tensor the loss
  creates has more elements than ``B·D`` or ``B·tile``, none has a dimension of the global size,
  and no rank holds more than two received candidate blocks at once.
- A bad input on one rank raises on every rank (no hang); ranks that disagree on the embedding width raise alike.
"""

from __future__ import annotations

import gc
import weakref
from functools import cache
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import (
    LOSS_PARAMS,
    STRATEGY_KINDS,
    Net,
    criterion_call,
    make_batch,
    make_criterion,
    reference_step,
    slice_rows,
)
from tests._helpers.seeds import bounds
from torchmetrics_diff.distributed import _ring as ring_module
from torchmetrics_diff.functional import global_clip_loss, global_info_nce_loss, global_siglip_loss, global_supcon_loss
from torchmetrics_diff.losses import CLIPLoss, SigLIPLoss

pytestmark = pytest.mark.timeout(300)

F64 = torch.float64
N_STEPS = 2  # the second step checks that nothing of the first one is carried over
SIZES = {1: [(4,), (0,)], 2: [(3, 5), (0, 4)], 3: [(0, 4, 2), (3, 1, 5)]}
TILES = (2, 3)


def _cases(world_size: int) -> list[tuple[str, tuple[int, ...], str, int]]:
    cases = []
    for kind in STRATEGY_KINDS:
        for i, sizes in enumerate(SIZES[world_size]):
            tile = TILES[i % len(TILES)]
            cases.append((kind, sizes, "mean", tile))
            if world_size > 1 and i == 0:  # the summing trainer once per kind and world size
                cases.append((kind, sizes, "sum", TILES[1 - i % len(TILES)]))
    return cases


def _run_cases(rank: int, world_size: int, cases: list, n_steps: int) -> list[dict[str, Any]]:
    results = []
    for kind, sizes, grad_reduction, tile in cases:
        model = Net(kind)
        net = DistributedDataParallel(model) if grad_reduction == "mean" and world_size > 1 else model
        criterion = make_criterion(kind, "ring", grad_reduction, tile=tile)
        lo, hi = bounds(sizes, rank)
        values, grads = [], []
        for step in range(n_steps):
            inputs, extra = make_batch(kind, sum(sizes), step)
            model.zero_grad(set_to_none=True)
            args, kwargs = criterion_call(kind, net(*slice_rows(inputs, lo, hi)), slice_rows(extra, lo, hi))
            loss = criterion(*args, **kwargs)
            loss.backward()
            step_grads = {}
            for name, p in model.named_parameters():
                grad = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                if grad_reduction == "sum" and world_size > 1:
                    dist.all_reduce(grad)
                step_grads[name] = grad
            values.append(loss.detach().clone())
            grads.append(step_grads)
        results.append({"values": values, "grads": grads})
    return results


@cache
def _reference(kind: str, n: int, step: int) -> tuple[float, dict[str, torch.Tensor]]:
    return reference_step(kind, n, step)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ring_gradient_equivalence(world_size: int) -> None:
    """Value on every rank and DDP-averaged (or summed) gradients equal one process on the global batch."""
    cases = _cases(world_size)
    results = run_distributed(_run_cases, world_size, cases, N_STEPS, timeout=240.0)
    problems = []
    for i, (kind, sizes, grad_reduction, tile) in enumerate(cases):
        case = f"[{kind} ring W={world_size} sizes={sizes} grad_reduction={grad_reduction} tile={tile}]"
        for step in range(N_STEPS):
            ref_value, ref_grads = _reference(kind, sum(sizes), step)
            values = [r[i]["values"][step] for r in results]
            if not all(torch.equal(v, values[0]) for v in values):
                problems.append(f"{case} step {step}: value differs between ranks: {[float(v) for v in values]}")
            for rank, r in enumerate(results):
                if max_err(r[i]["values"][step], ref_value) > 1:
                    problems.append(f"{case} step {step} rank {rank}: value {float(values[rank])} != {ref_value}")
                for name, want in ref_grads.items():
                    if max_err(r[i]["grads"][step][name], want) > 1:
                        what = "loss-parameter" if name in LOSS_PARAMS else "encoder"
                        problems.append(f"{case} step {step} rank {rank}: {what} grad {name} differs from reference")
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------------ memory
B, D, TILE = 6, 5, 4  # per rank; the global candidate count at W = 3 is 18 (36 for InfoNCE's two views)


class _Shapes(TorchDispatchMode):
    """Records the shape of every floating tensor an operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.shapes.append((str(func), tuple(t.shape)))
        return out


def _memory_body(rank: int, world_size: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(rank)
    held: list[weakref.ref] = []
    most = [0]
    original = ring_module.Ring.exchange

    def exchange(self: Any, sends: Any, receives: Any, tag: int = ring_module._BLOCK_TAG) -> Any:
        if tag == ring_module._BLOCK_TAG:
            gc.collect()
            held[:] = [r for r in held if r() is not None]
            held.extend(weakref.ref(t) for t in receives[:1])
            most[0] = max(most[0], len(held))
        return original(self, sends, receives, tag)

    ring_module.Ring.exchange = exchange  # type: ignore[method-assign]
    report = {}
    try:
        for name in ("clip", "siglip", "infonce", "supcon"):
            a = torch.randn(B, D, generator=gen, dtype=F64, requires_grad=True)
            b = torch.randn(B, D, generator=gen, dtype=F64, requires_grad=True)
            scale = torch.tensor(2.0, dtype=F64, requires_grad=True)
            with _Shapes() as mode:
                if name == "clip":
                    loss = global_clip_loss(a, b, scale, strategy="ring", tile=TILE)
                elif name == "siglip":
                    loss = global_siglip_loss(a, b, scale, -1.0, strategy="ring", tile=TILE)
                elif name == "infonce":
                    loss = global_info_nce_loss(a, b, 0.5, strategy="ring", tile=TILE)
                else:
                    loss = global_supcon_loss(a, torch.arange(B) % 2, 0.5, strategy="ring", tile=TILE)
                loss.backward()
            report[name] = mode.shapes
    finally:
        ring_module.Ring.exchange = original  # type: ignore[method-assign]
    report["most_blocks_held"] = most[0]
    return report


def test_ring_memory_is_bounded_by_construction() -> None:
    """No floating tensor of the ring loss grows with the global batch; at most two received blocks are alive."""
    world = 3
    per_rank = run_distributed(_memory_body, world, timeout=120.0)
    for rank, report in enumerate(per_rank):
        assert report.pop("most_blocks_held") <= 2, f"rank {rank} held more than two received blocks"
        for name, shapes in report.items():
            rows = 2 * B if name == "infonce" else B  # InfoNCE: both views are a rank's anchors and its block
            limit = max(rows * D, rows * TILE)
            big = [(op, s) for op, s in shapes if torch.Size(s).numel() > limit]
            assert not big, f"rank {rank} {name}: tensors larger than B·D or B·tile ({limit}): {big[:5]}"
            global_size = world * rows
            wide = [(op, s) for op, s in shapes if global_size in s]
            assert not wide, f"rank {rank} {name}: tensors with a dimension of the global size: {wide[:5]}"
            assert shapes, f"rank {rank} {name}: nothing recorded"


# ------------------------------------------------------------------------------------------ failures
def _failure_body(rank: int, world_size: int, what: str) -> tuple[str, str]:
    img = torch.randn(3, 4, dtype=F64)
    txt = torch.randn(3, 4 if not (rank == 1 and what == "shape") else 5, dtype=F64)
    if what == "width":
        img = torch.randn(3, 4 + rank, dtype=F64)
        txt = torch.randn(3, 4 + rank, dtype=F64)
    if what == "dtype":
        img, txt = img.to(torch.float32 if rank else F64), txt.to(torch.float32 if rank else F64)
    try:
        CLIPLoss(strategy="ring", tile=2)(img, txt, 2.0)
    except Exception as err:  # every rank must get here
        return type(err).__name__, str(err)
    return "ok", ""


@pytest.mark.parametrize("what", ["shape", "width", "dtype"])
def test_ring_bad_input_on_one_rank_raises_on_every_rank(what: str) -> None:
    out = run_distributed(_failure_body, 2, what, timeout=60.0)
    if what == "shape":
        # ShapeMismatchError: a ValueError and a RuntimeError (the type's name is what crosses the processes)
        assert out[1][0] == "ShapeMismatchError" and "`text_embeds`" in out[1][1], out
        assert out[0][0] == "PeerFailedError" and "rank 1" in out[0][1], out
    else:
        needle = "embedding width" if what == "width" else "dtype (rank 0: torch.float64, rank 1: torch.float32)"
        for kind, message in out:
            assert kind == "RanksDisagreeError" and needle in message, out


def _labels_on_one_rank_body(rank: int, world_size: int) -> tuple[str, str]:
    features = torch.randn(3, 4, dtype=F64)
    try:
        global_supcon_loss(features, torch.tensor([0, 1, 0]) if rank == 0 else None, strategy="ring", tile=2)
    except Exception as err:  # every rank must get here
        return type(err).__name__, str(err)
    return "ok", ""


def test_ring_supcon_labels_on_some_ranks_only_raises_on_every_rank() -> None:
    out = run_distributed(_labels_on_one_rank_body, 2, timeout=60.0)
    for kind, message in out:
        assert kind == "RanksDisagreeError" and "whether labels are given (rank 0: 1, rank 1: 0)" in message, out


# ----------------------------------------------------------------------------------- single process
def test_ring_tile_argument_is_checked() -> None:
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="`tile`"):
            CLIPLoss(strategy="ring", tile=bad)
        with pytest.raises(ValueError, match="`tile`"):
            global_clip_loss(torch.eye(2), torch.eye(2), 1.0, strategy="ring", tile=bad)


def test_ring_tiles_do_not_change_the_value() -> None:
    """One process: the ring's tiled online log-sum-exp gives the same value for any tile, and under no_grad."""
    gen = torch.Generator().manual_seed(3)
    img, txt = torch.randn(7, 3, generator=gen, dtype=F64), torch.randn(7, 3, generator=gen, dtype=F64)
    values = [SigLIPLoss(strategy="ring", tile=t)(img, txt, 3.0, -1.0) for t in (1, 2, 7, 100)]
    with torch.no_grad():
        values.append(global_siglip_loss(img, txt, 3.0, -1.0, strategy="ring", tile=3))
    assert all(abs(float(v - values[0])) < 1e-12 for v in values), values
