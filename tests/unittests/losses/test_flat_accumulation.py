"""Gradient accumulation in a flat loop: ``with loss.flat_accumulation(params) as acc`` and ``acc.finish_step()``.

Inside the block each call returns the rank's unnormalized sum of its micro-batch and communicates nothing; ranks
run different numbers of micro-batches (2/3/1 here, and a rank with none); ``finish_step`` sums the step's weight
over the ranks and rescales the parameters' gradients. After it, under real DDP (gloo, float64, all micro-batches
but a rank's last inside ``no_sync()``), every parameter gradient must equal the gradient of one process on the
step's concatenated micro-batches: ``F.cross_entropy(..., reduction="sum")`` over every valid token divided by
their count, or ``Σ w·v / Σ w`` for ``GlobalMeanLoss`` — references computed here with torch alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import max_err
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, generator
from torchmetrics_diff.losses import GlobalMeanLoss, LoadBalancingLoss, RouterZLoss, TokenCrossEntropyLoss

D_IN, HIDDEN, N_CLASSES, IGNORE = 4, 6, 5, -100
#: micro-batches of each rank in each optimizer step (W = 3): 2/3/1, then a step where rank 1 has none
COUNTS = [[2, 3, 1], [1, 0, 2]]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_CLASSES)).to(F64)


def _tokens(step: int, rank: int, m: int) -> tuple[Tensor, Tensor]:
    """Micro-batch ``m`` of ``rank`` in ``step``: 1 to 3 sequences of 2 to 4 tokens, some of them padding."""
    g = generator("flat", step, rank, m)
    rows, seq = 1 + (rank + 2 * m + step) % 3, 2 + (rank + m) % 3
    x = torch.randn(rows, seq, D_IN, generator=g, dtype=F64)
    target = torch.randint(0, N_CLASSES, (rows, seq), generator=g)
    target[torch.rand(rows, seq, generator=g) < 0.3] = IGNORE
    return x, target


def _weighted(step: int, rank: int, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x, y, weight, mask)`` of a ``GlobalMeanLoss`` micro-batch: per-row squared errors, weights, a mask."""
    g = generator("flat-weighted", step, rank, m)
    rows = 1 + (rank + 2 * m + step) % 4
    x = torch.randn(rows, D_IN, generator=g, dtype=F64)
    y = torch.randn(rows, N_CLASSES, generator=g, dtype=F64)
    weight = torch.rand(rows, generator=g, dtype=F64) + 0.5
    mask = torch.rand(rows, generator=g) < 0.8
    return x, y, weight, mask


def _empty(kind: str) -> tuple[Tensor, ...]:
    """A micro-batch without rows: what a rank with no micro-batch runs under DDP (its one synced backward)."""
    if kind == "tokens":
        return torch.zeros(0, 3, D_IN, dtype=F64), torch.zeros(0, 3, dtype=torch.long)
    rows = torch.zeros(0, dtype=F64)
    return torch.zeros(0, D_IN, dtype=F64), torch.zeros(0, N_CLASSES, dtype=F64), rows, rows.bool()


def _batches(kind: str, step: int, rank: int) -> list[tuple[Tensor, ...]]:
    make = _tokens if kind == "tokens" else _weighted
    return [make(step, rank, m) for m in range(COUNTS[step][rank])]


def _call(kind: str, loss_fn: Any, net: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    if kind == "tokens":
        x, target = batch
        return loss_fn(net(x), target)
    x, y, weight, mask = batch
    return loss_fn((net(x) - y).square().sum(-1), weight=weight, mask=mask)


def _reference(kind: str, step: int, world: int) -> tuple[float, float, dict[str, Tensor]]:
    """One process on every micro-batch of every rank: the step's mean, its weight, its gradients (torch alone)."""
    model = _model()
    batches = [b for rank in range(world) for b in _batches(kind, step, rank)]
    if kind == "tokens":
        logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
        target = torch.cat([t.reshape(-1) for _, t in batches])
        weight = float((target != IGNORE).sum())
        loss = F.cross_entropy(logits, target, ignore_index=IGNORE, reduction="sum") / weight
    else:
        values = torch.cat([(model(x) - y).square().sum(-1) for x, y, _, _ in batches])
        w = torch.cat([torch.where(m, w, torch.zeros_like(w)) for _, _, w, m in batches])
        weight = float(w.sum())
        loss = (values * w).sum() / weight
    names, params = zip(*model.named_parameters())
    return float(loss.detach()), weight, dict(zip(names, torch.autograd.grad(loss, params)))


def _local_sum(kind: str, model: nn.Module, batch: tuple[Tensor, ...]) -> float:
    with torch.no_grad():
        if kind == "tokens":
            x, target = batch
            return float(F.cross_entropy(model(x).reshape(-1, N_CLASSES), target.reshape(-1), reduction="sum"))
        x, y, weight, mask = batch
        return float(((model(x) - y).square().sum(-1) * weight * mask).sum())


def _flat_loop(rank: int, world: int, kind: str, grad_reduction: str) -> list[dict[str, Any]]:
    """Two optimizer steps of a flat loop (no optimizer: the gradients are compared after each finish_step).

    ``"mean"``: under DDP, every micro-batch but the rank's last inside ``no_sync()``, and a rank without
    micro-batches runs one empty one (DDP's all-reduce needs every rank's backward). ``"sum"``: no DDP, the rank
    without micro-batches makes no call at all, and the gradients are summed over the ranks by hand.
    """
    model = _model()
    ddp = grad_reduction == "mean"
    net: nn.Module = DistributedDataParallel(model) if ddp else model
    loss_fn = GlobalMeanLoss if kind == "weighted" else TokenCrossEntropyLoss
    loss_fn = loss_fn(grad_reduction=grad_reduction)
    out = []
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for step in range(len(COUNTS)):
            batches = _batches(kind, step, rank)
            if ddp and not batches:
                batches = [_empty(kind)]
            sums, wanted = [], []
            for i, batch in enumerate(batches):
                last = i == len(batches) - 1
                with net.no_sync() if ddp and not last else contextlib.nullcontext():  # type: ignore[operator]
                    value = _call(kind, loss_fn, net, batch)
                    value.backward()
                sums.append(float(value.detach()))
                wanted.append(_local_sum(kind, model, batch))
            returned = acc.finish_step()
            # (a rank without calls has no gradients yet: it sums zeros)
            grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
            if not ddp:
                for g in grads.values():
                    dist.all_reduce(g)
            out.append(
                {
                    "sums": sums,
                    "wanted": wanted,
                    "loss": float(returned),
                    "acc_loss": float(acc.loss),
                    "weight": float(acc.weight),
                    "grads": grads,
                    "compute": float(loss_fn.compute()),
                }
            )
            loss_fn.reset()
            model.zero_grad()
    out.append({"loss_after_exit": float(acc.loss), "steps": acc.steps})
    return out


def _check_flat_loop(results: list[list[dict[str, Any]]], kind: str, world: int, case: str) -> None:
    problems = []
    for step in range(len(COUNTS)):
        loss, weight, grads = _reference(kind, step, world)
        for rank, r in enumerate(results):
            got = r[step]
            where = f"{case} step {step} rank {rank} ({COUNTS[step][rank]} micro-batches)"
            if max_err(torch.tensor(got["sums"]), torch.tensor(got["wanted"][: len(got["sums"])])) > 1:
                problems.append(f"{where}: returned sums {got['sums']} != unnormalized sums {got['wanted']}")
            for key in ("loss", "acc_loss", "compute"):
                if max_err(got[key], loss) > 1:
                    problems.append(f"{where}: {key} {got[key]!r} != the step's mean {loss!r}")
            if max_err(got["weight"], weight) > 1:
                problems.append(f"{where}: weight {got['weight']} != {weight}")
            for name, want in grads.items():
                if max_err(got["grads"][name], want) > 1:
                    ratio = float(got["grads"][name].norm() / want.norm())
                    problems.append(f"{where}: grad {name} != one process's (norm ratio {ratio:.6g})")
    last_loss, _, _ = _reference(kind, len(COUNTS) - 1, world)
    for rank, r in enumerate(results):  # leaving the block after finish_step: an empty step, loss kept
        if r[-1]["steps"] != len(COUNTS) or max_err(r[-1]["loss_after_exit"], last_loss) > 1:
            problems.append(f"{case} rank {rank}: after the block {r[-1]} (want {len(COUNTS)} steps, {last_loss})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kind", ["tokens", "weighted"])
def test_flat_loop_under_ddp_is_one_process_on_the_step(kind: str) -> None:
    """3 ranks with 2/3/1 micro-batches (then 1/0/2) of uneven sizes under DDP: the one-process gradient."""
    results = run_distributed(_flat_loop, 3, kind, "mean", timeout=120.0)
    _check_flat_loop(results, kind, 3, f"[{kind} DDP W=3 counts {COUNTS}]")


def test_flat_loop_with_summed_gradients_and_a_rank_without_calls() -> None:
    """grad_reduction="sum", gradients summed by hand; in the second step rank 1 makes no call before finishing."""
    results = run_distributed(_flat_loop, 3, "tokens", "sum", timeout=120.0)
    _check_flat_loop(results, "tokens", 3, f"[tokens sum W=3 counts {COUNTS}]")


def _local_mean(rank: int, world: int) -> dict[str, Any]:
    """``dist_sync_on_step=False``: no collective at the finish, the gradient of this rank's own step mean."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss(dist_sync_on_step=False)
    batches = _batches("tokens", 0, rank)
    with record_collectives() as log, loss_fn.flat_accumulation(model) as acc:
        for x, target in batches:
            loss_fn(model(x), target).backward()
        acc.finish_step()
    logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
    target = torch.cat([t.reshape(-1) for _, t in batches])
    want = F.cross_entropy(logits, target, ignore_index=IGNORE)
    grads = torch.autograd.grad(want, list(model.parameters()))
    errors = [max_err(p.grad, g) for p, g in zip(model.parameters(), grads)]
    return {"log": list(log), "errors": errors, "loss": max_err(acc.loss, float(want.detach()))}


def test_without_sync_on_step_each_rank_normalizes_by_its_own_weight() -> None:
    for rank, r in enumerate(run_distributed(_local_mean, 3, timeout=60.0)):
        assert r["log"] == [], (rank, r["log"])
        assert max(r["errors"]) <= 1 and r["loss"] <= 1, (rank, r)


def _collectives(rank: int, world: int) -> dict[str, Any]:
    """What the flat loop communicates: nothing per micro-batch, one collective at the finish (CPU, gloo)."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        calls = []
        for x, target in _batches("tokens", 0, rank):
            with record_collectives() as log:
                loss_fn(model(x), target).backward()
            calls.append(list(log))
        with record_collectives() as finish:
            acc.finish_step()
    return {"calls": calls, "finish": list(finish)}


def test_flat_calls_do_not_communicate_and_the_finish_is_one_collective() -> None:
    for rank, r in enumerate(run_distributed(_collectives, 3, timeout=60.0)):
        assert r["calls"] == [[]] * COUNTS[0][rank], (rank, r["calls"])
        assert len(r["finish"]) == 1, (rank, r["finish"])


def _mismatch(rank: int, world: int) -> str:
    """Rank 0 finishes a flat step while the others call the loss outside any block: every rank raises."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    x, target = _tokens(0, rank, 0)
    try:
        if rank == 0:
            with loss_fn.flat_accumulation(model.parameters()):
                loss_fn(model(x), target).backward()
        else:
            loss_fn(model(x), target).backward()
    except RuntimeError as err:
        message = str(err)
    else:
        return "no error"
    # the loss and the group work again afterwards, in a call all ranks make
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        loss_fn(model(x), target).backward()
    assert acc.weight is not None
    return message


def test_a_rank_finishing_while_the_others_call_the_loss_raises_on_every_rank() -> None:
    for rank, message in enumerate(run_distributed(_mismatch, 3, timeout=60.0)):
        assert "finish_step" in message and "forward" in message, (rank, message)


# ------------------------------------------------------------------------------------------- one process (W = 1)
def _one_process_step(loss_fn: Any, model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
    for x, target in batches:
        loss_fn(model(x), target).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_one_process_flat_loop_is_the_mean_of_the_step() -> None:
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    steps = [_batches("tokens", 0, 1), _batches("tokens", 0, 0)]  # 3 then 2 micro-batches
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for batches in steps:
            _one_process_step(loss_fn, model, batches)
            value = acc.finish_step()
            got = [p.grad.detach().clone() for p in model.parameters()]
            logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
            target = torch.cat([t.reshape(-1) for _, t in batches])
            want = F.cross_entropy(logits, target, ignore_index=IGNORE)
            for g, w in zip(got, torch.autograd.grad(want, list(model.parameters()))):
                assert max_err(g, w) <= 1
            assert max_err(value, float(want.detach())) <= 1 and acc.loss is value
            assert float(acc.weight) == float((target != IGNORE).sum())
            model.zero_grad()
    assert acc.steps == 2


def test_leaving_the_block_finishes_the_step_in_progress() -> None:
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches("tokens", 0, 1)
    with loss_fn.flat_accumulation(model) as acc:
        _one_process_step(loss_fn, model, batches)
        assert acc.loss is None and acc.micro_batches == len(batches)
    logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
    want = F.cross_entropy(logits, torch.cat([t.reshape(-1) for _, t in batches]), ignore_index=IGNORE)
    for p, w in zip(model.parameters(), torch.autograd.grad(want, list(model.parameters()))):
        assert max_err(p.grad, w) <= 1
    assert max_err(acc.loss, float(want.detach())) <= 1 and acc.steps == 1
    # outside the block the loss is normalized per call again
    x, target = batches[0]
    want_one = F.cross_entropy(model(x).reshape(-1, N_CLASSES), target.reshape(-1), ignore_index=IGNORE)
    assert max_err(loss_fn(model(x), target).detach(), float(want_one.detach())) <= 1


def test_parameters_without_gradient_and_an_empty_step_are_left_alone() -> None:
    model = _model()
    frozen = nn.Parameter(torch.ones(2, dtype=F64))  # never used: its .grad stays None
    loss_fn = GlobalMeanLoss()
    with loss_fn.flat_accumulation([*model.parameters(), frozen]) as acc:
        value = loss_fn(torch.tensor([float("nan"), 2.0], dtype=F64), mask=torch.tensor([False, False]))
        assert float(value) == 0.0
        assert float(acc.finish_step()) == 0.0 and float(acc.weight) == 0.0
    assert frozen.grad is None and all(p.grad is None for p in model.parameters())


def test_router_z_loss_accumulates_flat() -> None:
    logits = [torch.randn(n, 4, generator=generator("z", n), dtype=F64).requires_grad_() for n in (3, 5)]
    loss_fn = RouterZLoss()
    with loss_fn.flat_accumulation(logits) as acc:
        for lg in logits:
            loss_fn(lg).backward()
    want = torch.cat([lg.logsumexp(-1).square() for lg in logits]).mean()
    for lg, g in zip(logits, torch.autograd.grad(want, logits)):
        assert max_err(lg.grad, g) <= 1
    assert max_err(acc.loss, float(want.detach())) <= 1


def test_flat_accumulation_errors() -> None:
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    target = torch.tensor([[1, IGNORE]])
    with pytest.raises(RuntimeError, match="nested"), loss_fn.flat_accumulation(model), loss_fn.accumulate([target]):
        pass
    with pytest.raises(RuntimeError, match="nested"), loss_fn.accumulate([target]), loss_fn.flat_accumulation(model):
        pass
    with (
        pytest.raises(RuntimeError, match="nested"),
        loss_fn.flat_accumulation(model),
        loss_fn.flat_accumulation(model),
    ):
        pass
    with pytest.raises(ValueError, match=r"`params`.*got a dict"):
        loss_fn.flat_accumulation([{"params": list(model.parameters())}]).__enter__()
    with pytest.raises(ValueError, match="`params` must hold at least one"):
        loss_fn.flat_accumulation([]).__enter__()
    with pytest.raises(NotImplementedError, match=r"LoadBalancingLoss\.flat_accumulation\(\).*accumulate\(\)"):
        LoadBalancingLoss(4).flat_accumulation(model).__enter__()
    with loss_fn.flat_accumulation(model) as acc:
        pass
    with pytest.raises(RuntimeError, match="after its flat_accumulation"):
        acc.finish_step()
    # an error inside the block closes it without touching the gradients; the loss works again
    loss_fn(model(torch.zeros(1, 2, D_IN, dtype=F64)), target).backward()
    before = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(KeyError), loss_fn.flat_accumulation(model):
        raise KeyError("boom")
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    with loss_fn.flat_accumulation(model):
        pass


def _fsdp2(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 (``fully_shard``): every forward all-gathers the parameters, so every rank runs the same number of
    micro-batches, the short ranks padding with empty ones (2/3/1 -> 3/3/3); ``finish_step`` rescales the local
    shards of the sharded gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model()
    net = fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches("tokens", 0, rank)
    most = max(COUNTS[0])
    batches += [_empty("tokens")] * (most - len(batches))
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for i, (x, target) in enumerate(batches):
            net.set_requires_gradient_sync(i == most - 1)
            loss_fn(net(x), target).backward()
    grads = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {"grads": grads, "loss": float(acc.loss)}


def test_fully_shard_with_padded_micro_batches_is_one_process_on_the_step() -> None:
    fsdp = pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 needs torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard"):  # pragma: no cover - torch 2.13 has it
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)")
    loss, _, grads = _reference("tokens", 0, 3)
    for rank, r in enumerate(run_distributed(_fsdp2, 3, timeout=120.0)):
        assert max_err(r["loss"], loss) <= 1, (rank, r["loss"], loss)
        for name, want in grads.items():
            assert max_err(r["grads"][name], want) <= 1, (rank, name, r["grads"][name], want)


@pytest.mark.parametrize("order", ["finish, unscale", "unscale, finish"])
def test_grad_scaler_commutes_with_the_rescale(order: str) -> None:
    """``GradScaler``: scaled sums backward, then ``finish_step`` and ``unscale_`` in either order."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches("tokens", 0, 1)
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for x, target in batches:
            scaler.scale(loss_fn(model(x), target)).backward()
        if order == "finish, unscale":
            acc.finish_step()
            scaler.unscale_(optimizer)
        else:
            scaler.unscale_(optimizer)
            acc.finish_step()
    logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
    want = F.cross_entropy(logits, torch.cat([t.reshape(-1) for _, t in batches]), ignore_index=IGNORE)
    for p, g in zip(model.parameters(), torch.autograd.grad(want, list(model.parameters()))):
        assert max_err(p.grad, g) <= 1
