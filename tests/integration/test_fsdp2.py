"""FSDP2, for real: ``torch.distributed.fsdp.fully_shard`` on gloo ranks, every loss and strategy.

FSDP2 shards each parameter across the ranks and, after ``backward``, reduce-scatters the gradients *averaged*
over the ranks, as DDP all-reduces them: with ``grad_reduction="mean"`` (the default) every loss must give, on
every rank, the gradient of one process on the concatenated batch. The model is the replicated float64 model of
the DDP tests with its loss parameters (logit scale, bias) of shape ``(1,)``, since FSDP2 refuses 0-d parameters;
the reference is that model's 0-d twin on the whole batch (independent formulas, ``tests._helpers.references``).
Uneven and empty ranks, two steps each (the sync plans' steady state), and a token loss accumulated over two
micro-batches with FSDP2's gradient sync switched off for the first (its ``no_sync``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import (
    KINDS,
    LOSS_PARAMS,
    MOE_KINDS,
    SSL_KINDS,
    STRATEGY_KINDS,
    Net,
    criterion_call,
    make_batch,
    make_criterion,
    reference_step,
    slice_rows,
)
from tests._helpers.seeds import bounds

fsdp = pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 needs torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):  # pragma: no cover - torch 2.13 has it
    pytest.skip("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)", allow_module_level=True)

STEPS = 2
SIZES = {2: [(3, 5), (0, 3)], 3: [(3, 0, 5)]}
CASES = [
    (kind, strategy)
    for kind in (*KINDS, *SSL_KINDS, *MOE_KINDS)
    for strategy in (("replicated", "sharded", "ring") if kind in STRATEGY_KINDS and kind != "supcon_mv" else (None,))
]


def _sharded_net(kind: str, world: int) -> tuple[nn.Module, Any]:
    """``Net(kind)`` with its loss parameters reshaped to ``(1,)``, under ``fully_shard`` over every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = Net(kind)
    for name in LOSS_PARAMS:
        if hasattr(model, name):
            setattr(model, name, nn.Parameter(getattr(model, name).detach().reshape(1)))
    return fully_shard(model, mesh=init_device_mesh("cpu", (world,))), model


def _full(grad: Any) -> torch.Tensor | None:
    if grad is None:
        return None
    return (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()


def _run(rank: int, world: int, sizes_list: list[tuple[int, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sizes in sizes_list:
        lo, hi = bounds(sizes, rank)
        for kind, strategy in CASES:
            net, model = _sharded_net(kind, world)
            criterion = make_criterion(kind, strategy)
            for step in range(STEPS):
                inputs, extra = make_batch(kind, sum(sizes), step)
                model.zero_grad(set_to_none=True)
                args, kwargs = criterion_call(kind, net(*slice_rows(inputs, lo, hi)), slice_rows(extra, lo, hi))
                loss = criterion(*args, **kwargs)
                loss.backward()
                grads = {name: _full(p.grad) for name, p in model.named_parameters()}
                out[(kind, strategy, sizes, step)] = (float(loss.detach()), grads)
        # gradient accumulation: two micro-batches (the first without gradient sync) inside accumulate()
        net, model = _sharded_net("tokence", world)
        criterion = make_criterion("tokence")
        inputs, extra = make_batch("tokence", sum(sizes), 0)
        half = [(lo, lo + (hi - lo) // 2), (lo + (hi - lo) // 2, hi)]
        with criterion.accumulate([slice_rows(extra, a, b)[0] for a, b in half]):  # each micro-batch's targets
            for i, (a, b) in enumerate(half):
                net.set_requires_gradient_sync(i == len(half) - 1)
                args, kwargs = criterion_call("tokence", net(*slice_rows(inputs, a, b)), slice_rows(extra, a, b))
                criterion(*args, **kwargs).backward()
        out[("tokence-accumulate", None, sizes, 0)] = (None, {n: _full(p.grad) for n, p in model.named_parameters()})
    return out


def _check(results: list[dict[str, Any]]) -> list[str]:
    problems = []
    for key in results[0]:
        kind, strategy, sizes, step = key
        ref_value, ref_grads = reference_step(kind.removesuffix("-accumulate"), sum(sizes), step)
        for rank, per_rank in enumerate(results):
            value, grads = per_rank[key]
            where = f"[{kind} strategy={strategy} sizes={sizes} step {step}] rank {rank}"
            if value is not None and max_err(value, ref_value) > 1:
                problems.append(f"{where}: value {value!r} != reference {ref_value!r}")
            for name, want in ref_grads.items():
                got = grads[name]
                got = got.reshape(want.shape) if got is not None and got.numel() == want.numel() else got
                if max_err(got, want) > 1:
                    problems.append(f"{where}: grad {name} off by {max_err(got, want):.3g}x the tolerance")
    return problems


@pytest.mark.parametrize("world", [2, 3])
def test_fully_shard_gradients_equal_one_process_on_the_global_batch(world: int) -> None:
    """Every loss and strategy under FSDP2: each rank's full gradient is the one-process gradient (float64)."""
    results = run_distributed(_run, world, SIZES[world], timeout=240.0)
    assert len(results[0]) == len(SIZES[world]) * (len(CASES) * STEPS + 1)
    problems = _check(results)
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


def test_the_check_sees_a_world_size_factor() -> None:
    """The comparison is not vacuous: a gradient ``world`` times too small (a summing loss under FSDP2's
    averaging) is reported."""
    value, grads = reference_step("clip", 8, 0)
    wrong = {name: g / 2 for name, g in grads.items()}
    problems = _check([{("clip", "sharded", (3, 5), 0): (value, wrong)}])
    assert any("grad enc_a.weight" in p for p in problems), problems
