"""Gradient accumulation with the normalized losses: ``with loss.accumulate([...])`` over k micro-batches.

W ranks × k=3 micro-batches with different numbers of valid tokens per rank and micro-batch (some with none) and
different row counts. Under DDP, the first k-1 micro-batches run inside ``model.no_sync()``. The final gradients
must equal one process computing token cross-entropy over *all* tokens of all ranks and micro-batches at once
(Σ over valid tokens / total valid count), and the k returned values must add up to that step loss.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import D_IN, IGNORE, N_CLASSES, Net
from tests._helpers.references import ref_token_ce
from tests._helpers.seeds import F64, generator
from torchmetrics_diff.losses import GlobalMeanLoss, TokenCrossEntropyLoss

K = 3
SEQ = 4
#: valid tokens of [rank][micro-batch]; a micro-batch holds 2 or 3 sequences of SEQ tokens (so at most 8 or 12)
VALID = {
    1: [[3, 0, 6]],
    2: [[5, 0, 8], [1, 7, 3]],
    3: [[5, 0, 8], [1, 7, 3], [8, 2, 0]],
}


def _micro_batch(world_size: int, rank: int, m: int) -> tuple[Tensor, Tensor]:
    """``(x, target)`` of micro-batch ``m`` of ``rank``: 2 or 3 sequences, ``VALID`` tokens not ignored."""
    g = generator("accumulate", world_size, rank, m)
    rows = 2 + (rank + m) % 2
    x = torch.randn(rows, SEQ, D_IN, generator=g, dtype=F64)
    target = torch.randint(0, N_CLASSES, (rows * SEQ,), generator=g)
    target[torch.randperm(rows * SEQ, generator=g)[VALID[world_size][rank][m] :]] = IGNORE
    return x, target.view(rows, SEQ)


def _total_valid(world_size: int) -> int:
    return sum(map(sum, VALID[world_size]))


def _accumulate_step(rank: int, world_size: int, plan: str, grad_reduction: str) -> dict[str, Any]:
    """One optimizer step of k micro-batches; returns the k values and the (reduced) parameter gradients."""
    model = Net("tokence")
    net = DistributedDataParallel(model) if grad_reduction == "mean" else model
    loss_fn = TokenCrossEntropyLoss(ignore_index=IGNORE, grad_reduction=grad_reduction)
    micro = [_micro_batch(world_size, rank, m) for m in range(K)]
    block = (
        loss_fn.accumulate([target for _, target in micro])
        if plan == "items"
        else loss_fn.accumulate(total=_total_valid(world_size))
    )
    values = []
    with block:
        for m, (x, target) in enumerate(micro):
            last = m == K - 1
            no_sync = (
                net.no_sync() if isinstance(net, DistributedDataParallel) and not last else contextlib.nullcontext()
            )
            with no_sync:
                (logits,) = net(x)
                value = loss_fn(logits, target)
                value.backward()
            values.append(value.detach().clone())
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad.detach().clone()
        if grad_reduction == "sum":
            dist.all_reduce(grad)
        grads[name] = grad
    return {"values": values, "grads": grads}


def _reference(world_size: int) -> tuple[list[float], float, dict[str, Tensor]]:
    """One process, every token of every rank and micro-batch: per-micro-batch shares, the loss, its gradients."""
    model = Net("tokence")
    logits, targets, shares = [], [], []
    total = _total_valid(world_size)
    for m in range(K):
        share = torch.zeros((), dtype=F64)
        for rank in range(world_size):
            x, target = _micro_batch(world_size, rank, m)
            logits.append(model(x)[0].reshape(-1, N_CLASSES))
            targets.append(target.reshape(-1))
            share = share + ref_token_ce(logits[-1], targets[-1]) * int((targets[-1] != IGNORE).sum())
        shares.append(float(share.detach()) / total)
    loss = ref_token_ce(torch.cat(logits), torch.cat(targets))
    names, params = zip(*model.named_parameters())
    return shares, float(loss.detach()), dict(zip(names, torch.autograd.grad(loss, params)))


@pytest.mark.parametrize(
    ("plan", "grad_reduction"), [("items", "mean"), ("total", "mean"), ("items", "sum")], ids=["items", "total", "sum"]
)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_accumulated_gradient_is_one_big_batch(world_size: int, plan: str, grad_reduction: str) -> None:
    results = run_distributed(_accumulate_step, world_size, plan, grad_reduction, timeout=120.0)
    shares, loss, grads = _reference(world_size)
    case = f"[TokenCE accumulate({plan}) k={K} W={world_size} valid={VALID[world_size]} {grad_reduction}]"
    problems = []
    for rank, r in enumerate(results):
        got_values = [float(v) for v in r["values"]]
        if max_err(sum(got_values), loss) > 1:
            problems.append(f"{case} rank {rank}: Σ values {sum(got_values)!r} != step loss {loss!r}")
        if max_err(torch.tensor(got_values, dtype=F64), torch.tensor(shares, dtype=F64)) > 1:
            problems.append(f"{case} rank {rank}: values {got_values} != shares {shares}")
        if got_values != [float(v) for v in results[0]["values"]]:
            problems.append(f"{case} rank {rank}: values differ from rank 0's")
        for name, want in grads.items():
            if max_err(r["grads"][name], want) > 1:
                ratio = float(r["grads"][name].norm() / want.norm())
                problems.append(f"{case} rank {rank}: grad {name} != reference (norm ratio {ratio:.6g})")
    assert not problems, "\n".join(problems)


def _plan_mismatch(rank: int, world_size: int) -> list[str]:
    """Leaving the block with fewer or more calls than planned raises RuntimeError (here on every rank)."""
    model = Net("tokence")
    loss_fn = TokenCrossEntropyLoss(ignore_index=IGNORE)
    micro = [_micro_batch(world_size, rank, m) for m in range(K)]
    targets = [target for _, target in micro]
    messages = []
    # fewer: only the first micro-batch (it has fewer valid tokens than the plan on every rank)
    with pytest.raises(RuntimeError, match="planned") as info, loss_fn.accumulate(targets):
        x, target = micro[0]
        loss_fn(model(x)[0], target).backward()
    messages.append(str(info.value))
    # more: every micro-batch, then the first again
    with pytest.raises(RuntimeError, match="planned") as info, loss_fn.accumulate(targets):
        for x, target in [*micro, micro[0]]:
            loss_fn(model(x)[0], target)
    messages.append(str(info.value))
    # the loss is usable again, and a block that adds up leaves quietly
    with loss_fn.accumulate(targets):
        for x, target in micro:
            loss_fn(model(x)[0], target)
    return messages


@pytest.mark.parametrize("world_size", [1, 3])
def test_plan_mismatch_raises_on_leaving_the_block(world_size: int) -> None:
    results = run_distributed(_plan_mismatch, world_size, timeout=60.0)
    for rank, (fewer, more) in enumerate(results):
        planned = sum(VALID[world_size][rank])
        assert f"{planned:g}" in fewer and f"{VALID[world_size][rank][0]:g}" in fewer, (rank, fewer)
        assert f"{planned + VALID[world_size][rank][0]:g}" in more, (rank, more)


def test_accumulate_arguments() -> None:
    loss_fn = TokenCrossEntropyLoss()
    target = torch.tensor([[1, -100]])
    with pytest.raises(ValueError, match="exactly one"), loss_fn.accumulate():
        pass
    with pytest.raises(ValueError, match="exactly one"), loss_fn.accumulate([target], total=1):
        pass
    with pytest.raises(RuntimeError, match="nested"), loss_fn.accumulate([target]), loss_fn.accumulate([target]):
        pass
    # after the failed nesting the loss works again
    with loss_fn.accumulate(total=2):
        value = loss_fn(torch.zeros(1, 2, 3, dtype=F64), target)
    torch.testing.assert_close(value, torch.log(torch.tensor(3.0, dtype=F64)) / 2)


def test_global_mean_accumulate_with_masks() -> None:
    """GlobalMeanLoss.accumulate with the micro-batches' masks: shares of Σ v / Σ valid, gradient of that mean."""
    values = [torch.tensor([3.0, 3.0, float("nan")], dtype=F64), torch.tensor([6.0, 0.0, 1.0], dtype=F64)]
    masks = [torch.tensor([True, True, False]), torch.tensor([True, False, True])]
    leaves = [v.clone().requires_grad_() for v in values]
    loss_fn = GlobalMeanLoss()
    with loss_fn.accumulate(masks):
        shares = [loss_fn(v, mask=m) for v, m in zip(leaves, masks)]
        for share in shares:
            share.backward()
    assert [float(s.detach()) for s in shares] == [6.0 / 4, 7.0 / 4]
    torch.testing.assert_close(leaves[0].grad, torch.tensor([0.25, 0.25, 0.0], dtype=F64))
    torch.testing.assert_close(leaves[1].grad, torch.tensor([0.25, 0.0, 0.25], dtype=F64))
