"""Accumulation misuse named: ranks that break the normalized losses' accumulation protocols raise a named error on
every rank at once, not gloo's text after the group's timeout.

- ``accumulate(items)``: a rank that forgets its empty micro-batch ``(0, T)`` plans fewer micro-batches. Entering
  the block, the collective that sums the step's weight also sums each rank's number of micro-batches and its
  square, so every rank raises :class:`AccumulationMismatchError` naming each rank's number before any forward
  pass — under DDP too, where a call made after a peer's last backward would otherwise meet DDP's all-reduce.
- ``accumulate``: a rank that plans its empty micro-batch but skips the call leaves the block while its peers make
  their last call: the block's end and its calls name themselves apart in the call header, so every rank raises,
  naming the calls each made. With ``total=`` (no end collective) the short rank meets the others at its next
  step's first call (the header carries the calls made in the block before).
- ``flat_accumulation``: a rank whose loop ends a step early leaves the block while its peers finish a step:
  leaving is named apart from ``finish_step()``, so every rank raises instead of the two pairing and the peers
  waiting at their next collective.
- The flat loop under DDP with a rank that has no micro-batch and runs none: its peers wait in DDP's all-reduce,
  which no call of the loss precedes (flat calls communicate nothing), so only the group's timeout ends it; the
  rank at ``finish_step()`` then names the likely cause (a short group timeout here).
- The documented padded protocol still gives the one-process value: the token-mean cross-entropy over every rank's
  tokens, computed in one process with ``torch.nn.functional.cross_entropy``.

The pools' process groups have a 30 s timeout: every named error must come well before it (under 5 s, measured
around the failing step), on every rank, and the loss and the group must work again afterwards.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed, run_once
from tests._helpers.seeds import F64, generator
from torchmetrics_diff.exceptions import AccumulationMismatchError, RanksDisagreeError
from torchmetrics_diff.losses import TokenCrossEntropyLoss

pytestmark = pytest.mark.timeout(300)

D_IN, N_CLASSES, T, IGNORE = 4, 5, 3, -100
#: well under the pools' 30 s group timeout
PROMPT_S = 5.0
#: micro-batches of each rank in a step: the short rank (rank 1) forgets its empty one
COUNTS = {2: [2, 1], 3: [2, 1, 2]}
SHORT = 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, 6), nn.Tanh(), nn.Linear(6, N_CLASSES)).to(F64)


def _micro(step: int, rank: int, m: int) -> tuple[Tensor, Tensor]:
    """Micro-batch ``m`` of ``rank`` in ``step``: 1 or 2 sequences of ``T`` tokens, some of them padding."""
    g = generator("misuse", step, rank, m)
    rows = 1 + (rank + m + step) % 2
    x = torch.randn(rows, T, D_IN, generator=g, dtype=F64)
    target = torch.randint(0, N_CLASSES, (rows, T), generator=g)
    target[torch.rand(rows, T, generator=g) < 0.3] = IGNORE
    return x, target


def _empty() -> tuple[Tensor, Tensor]:
    """The documented empty micro-batch, ``(0, T)``."""
    return torch.zeros(0, T, D_IN, dtype=F64), torch.zeros(0, T, dtype=torch.long)


def _batches(step: int, rank: int, world: int, padded: bool) -> list[tuple[Tensor, Tensor]]:
    counts = COUNTS[world]
    real = [_micro(step, rank, m) for m in range(counts[rank])]
    return real + [_empty()] * (max(counts) - len(real)) if padded else real


def _timed(call: Callable[[], Any]) -> tuple[str, str, float]:
    """``(type name, message, seconds)`` of what ``call`` raised (``"ok"`` when nothing), timed with monotonic."""
    start = time.monotonic()
    try:
        call()
    except Exception as err:
        return type(err).__name__, str(err), time.monotonic() - start
    return "ok", "", time.monotonic() - start


def _ddp_step(net: Any, loss_fn: Any, batches: list[tuple[Tensor, Tensor]], targets: list[Tensor]) -> float:
    """One accumulated step under DDP, every micro-batch but the last inside ``no_sync()``: the step's loss."""
    step_loss = 0.0
    with loss_fn.accumulate(targets):
        for i, (x, target) in enumerate(batches):
            with contextlib.nullcontext() if i == len(batches) - 1 else net.no_sync():
                share = loss_fn(net(x), target)
                share.backward()
            step_loss += float(share.detach())
    return step_loss


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------------------------- accumulate(items)
def _unpadded_plan_under_ddp(rank: int, world: int) -> dict[str, Any]:
    """The short ranks forget their empty micro-batches under DDP; then the same step, padded."""
    model = _model()
    net = DistributedDataParallel(model)
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches(0, rank, world, padded=False)
    out: dict[str, Any] = {}
    out["unpadded"] = _timed(lambda: _ddp_step(net, loss_fn, batches, [t for _, t in batches]))
    out["grads_untouched"] = all(p.grad is None for p in model.parameters())  # (refused before any forward)
    padded = _batches(0, rank, world, padded=True)
    out["loss"] = _ddp_step(net, loss_fn, padded, [t for _, t in padded])
    out["grads"] = _grads(model)
    return out


def _reference(world: int, step: int = 0) -> tuple[float, float, dict[str, Tensor]]:
    """One process on every real micro-batch of every rank: the token-mean cross-entropy, its count, its
    gradients."""
    model = _model()
    batches = [b for rank in range(world) for b in _batches(step, rank, world, padded=False)]
    logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
    target = torch.cat([t.reshape(-1) for _, t in batches])
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE)
    names, params = zip(*model.named_parameters())
    grads = dict(zip(names, torch.autograd.grad(loss, params)))
    return float(loss.detach()), float((target != IGNORE).sum()), grads


@pytest.mark.parametrize("world", [2, 3])
def test_an_unpadded_plan_raises_on_every_rank_before_any_forward(world: int) -> None:
    counts = COUNTS[world]
    short = [r for r, n in enumerate(counts) if n < max(counts)]
    long = [r for r, n in enumerate(counts) if n == max(counts)]
    shown = "; ".join(
        [f"rank {long[0]}: {max(counts)}" if len(long) == 1 else f"ranks {', '.join(map(str, long))}: {max(counts)}"]
        + [f"rank {r}: {counts[r]}" for r in short]
    )
    loss, _, grads = _reference(world)
    for rank, r in enumerate(run_distributed(_unpadded_plan_under_ddp, world, timeout=120.0)):
        kind, message, seconds = r["unpadded"]
        assert kind == "AccumulationMismatchError", (rank, kind, message)
        for needle in ("TokenCrossEntropyLoss.accumulate()", "planned different numbers of micro-batches", shown):
            assert needle in message, (rank, needle, message)
        assert "pads with empty ones, (0, T)" in message, (rank, message)
        assert seconds < PROMPT_S, (rank, seconds, message)
        assert r["grads_untouched"], rank
        # the padded step afterwards: the one-process value and gradients
        assert max_err(r["loss"], loss) <= 1e3, (rank, r["loss"], loss)
        for name, want in grads.items():
            assert max_err(r["grads"][name], want) <= 1e3, (rank, name)


# ------------------------------------------------------------------------------------- accumulate: a skipped call
def _skipped_call(rank: int, world: int) -> dict[str, Any]:
    """Every rank plans the padded step; the short rank skips its empty micro-batch's call and leaves the block
    while the others make theirs (no DDP)."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches(0, rank, world, padded=True)
    skipping = rank == SHORT

    def step() -> None:
        with loss_fn.accumulate([t for _, t in batches]):
            for x, target in batches[: COUNTS[world][rank]] if skipping else batches:
                loss_fn(model(x), target).backward()

    out = {"skipped": _timed(step)}
    model.zero_grad()
    with loss_fn.accumulate([t for _, t in batches]):  # the loss and the group work again
        out["loss"] = sum(float(loss_fn(model(x), target).detach()) for x, target in batches)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_leaving_the_block_early_raises_on_every_rank(world: int) -> None:
    made = COUNTS[world][SHORT]
    loss, _, _ = _reference(world)
    for rank, r in enumerate(run_distributed(_skipped_call, world, timeout=120.0)):
        kind, message, seconds = r["skipped"]
        assert kind == "AccumulationMismatchError", (rank, kind, message)
        needles = (
            "made different numbers of micro-batch calls",
            f"rank {SHORT} had made {made} call and was leaving the block",
            f"and {'was' if world == 2 else 'were'} making the {made + 1}nd",
            "(0, T)",
        )
        for needle in needles:
            assert needle in message, (rank, needle, message)
        assert seconds < PROMPT_S, (rank, seconds, message)
        assert max_err(r["loss"], loss) <= 1e3, (rank, r["loss"], loss)


def _total_form(rank: int, world: int) -> dict[str, Any]:
    """``total=`` (no collective at the block's end): rank 1 makes one call fewer in the first step, then starts
    the next step; its first call there meets the others' last call of the first."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    batches = _batches(0, rank, world, padded=True)

    def two_steps() -> None:
        for step in range(2):
            with loss_fn.accumulate(total=10.0):
                for x, target in batches[:1] if rank == SHORT and step == 0 else batches:
                    loss_fn(model(x), target)

    return {"steps": _timed(two_steps)}


def test_total_form_short_rank_meets_the_next_step() -> None:
    for rank, r in enumerate(run_distributed(_total_form, 2, timeout=120.0)):
        kind, message, seconds = r["steps"]
        assert kind == "AccumulationMismatchError", (rank, kind, message)
        assert "rank 0 had made 1 call and was making the 2nd" in message, (rank, message)
        assert "rank 1 had made 0 calls and was making the 1st" in message, (rank, message)
        assert seconds < PROMPT_S, (rank, seconds, message)


# ----------------------------------------------------------------------------------------------- flat_accumulation
def _flat_fewer_steps(rank: int, world: int) -> dict[str, Any]:
    """The last rank's loop has one step fewer: it leaves the block while the others finish their second step."""
    model = _model()
    loss_fn = TokenCrossEntropyLoss()
    steps = 1 if rank == world - 1 else 2

    def loop() -> None:
        with loss_fn.flat_accumulation(model.parameters()) as acc:
            for step in range(steps):
                for x, target in _batches(step, rank, world, padded=False):
                    loss_fn(model(x), target).backward()
                acc.finish_step()
                model.zero_grad()

    out = {"loop": _timed(loop)}
    with loss_fn.flat_accumulation(model.parameters()) as acc:  # the loss and the group work again
        for x, target in _batches(0, rank, world, padded=False):
            loss_fn(model(x), target).backward()
    out["loss"] = float(acc.loss)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_leaving_the_flat_block_early_raises_on_every_rank(world: int) -> None:
    last = world - 1
    others = "rank 0" if world == 2 else f"ranks 0-{world - 2}"
    loss, _, _ = _reference(world)
    for rank, r in enumerate(run_distributed(_flat_fewer_steps, world, timeout=120.0)):
        kind, message, seconds = r["loop"]
        assert kind == "AccumulationMismatchError", (rank, kind, message)
        needles = (
            "TokenCrossEntropyLoss.flat_accumulation(): the ranks are not at the same step",
            f"{others} {'was' if world == 2 else 'were'} finishing a step (finish_step())",
            f"rank {last} was leaving the flat_accumulation() block",
            "(0, T)",
        )
        for needle in needles:
            assert needle in message, (rank, needle, message)
        assert seconds < PROMPT_S, (rank, seconds, message)
        assert max_err(r["loss"], loss) <= 1e3, (rank, r["loss"], loss)


def test_the_error_is_a_ranks_disagree_error() -> None:
    assert issubclass(AccumulationMismatchError, RanksDisagreeError)
    from torchmetrics_diff import exceptions

    assert "AccumulationMismatchError" in exceptions.__all__


def _flat_zero_calls_under_ddp(rank: int, world: int) -> tuple[str, str, float]:
    """Under DDP rank 1 has no micro-batch and runs none: rank 0 waits in DDP's all-reduce, rank 1 at
    finish_step(); the group's (short) timeout ends both."""
    model = _model()
    net = DistributedDataParallel(model)
    loss_fn = TokenCrossEntropyLoss()

    def step() -> None:
        with loss_fn.flat_accumulation(model.parameters()) as acc:
            if rank == 0:
                time.sleep(0.5)  # (rank 1 waits longest: its own timeout, not the peer's teardown, ends its wait)
                x, target = _micro(0, rank, 0)
                loss_fn(net(x), target).backward()
            acc.finish_step()

    return _timed(step)


def test_flat_zero_calls_under_ddp_names_the_cause_after_the_timeout() -> None:
    results = run_once(_flat_zero_calls_under_ddp, 2, timeout=120.0, pg_timeout=3.0, forked=True)
    kind, message, seconds = results[1]
    assert kind == "CollectiveError", (kind, message)
    for needle in ("finish_step()", "made 0 calls", "under DDP every rank must run at least one", "(0, T)"):
        assert needle in message, (needle, message)
    assert seconds > 2.0, (seconds, message)  # (the group's 3 s timeout, not a check of the loss, ended it)
    assert results[0][0] != "ok", results[0]  # (DDP's own all-reduce timed out)


# --------------------------------------------------------------------------------------- the padded protocol
def _padded_under_ddp(rank: int, world: int) -> dict[str, Any]:
    """The documented protocol under DDP: up front, the short rank padded with an empty micro-batch ``(0, T)``;
    flat, the last rank without micro-batches runs one empty one (its one backward outside ``no_sync()``)."""
    out: dict[str, Any] = {}
    model = _model()
    net = DistributedDataParallel(model)
    loss_fn = TokenCrossEntropyLoss()
    padded = _batches(0, rank, world, padded=True)
    out["up_front"] = {"loss": _ddp_step(net, loss_fn, padded, [t for _, t in padded]), "grads": _grads(model)}
    model = _model()
    net = DistributedDataParallel(model)
    batches = [] if rank == world - 1 else _batches(0, rank, world, padded=False)
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for i, (x, target) in enumerate(batches or [_empty()]):
            with contextlib.nullcontext() if i == max(len(batches), 1) - 1 else net.no_sync():
                loss_fn(net(x), target).backward()
        acc.finish_step()
    out["flat"] = {"loss": float(acc.loss), "weight": float(acc.weight), "grads": _grads(model)}
    return out


def _reference_without_last(world: int) -> tuple[float, float, dict[str, Tensor]]:
    """As :func:`_reference`, without the last rank's micro-batches."""
    model = _model()
    batches = [b for rank in range(world - 1) for b in _batches(0, rank, world, padded=False)]
    logits = torch.cat([model(x).reshape(-1, N_CLASSES) for x, _ in batches])
    target = torch.cat([t.reshape(-1) for _, t in batches])
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE)
    names, params = zip(*model.named_parameters())
    return float(loss.detach()), float((target != IGNORE).sum()), dict(zip(names, torch.autograd.grad(loss, params)))


@pytest.mark.parametrize("world", [2, 3])
def test_the_padded_protocol_is_one_process_on_every_token(world: int) -> None:
    """Up front and flat under DDP: the loss and every gradient of one process on every rank's tokens."""
    results = run_distributed(_padded_under_ddp, world, timeout=120.0)
    up_front, flat = _reference(world), _reference_without_last(world)
    for rank, r in enumerate(results):
        for form, (loss, weight, grads) in (("up_front", up_front), ("flat", flat)):
            got = r[form]
            assert max_err(got["loss"], loss) <= 1e3, (rank, form, got["loss"], loss)
            assert got.get("weight", weight) == weight, (rank, form, got["weight"], weight)
            for name, want in grads.items():
                assert max_err(got["grads"][name], want) <= 1e3, (rank, form, name)
