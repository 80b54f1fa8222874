"""Differentiable collectives: each one a small ``autograd.Function`` whose backward is the adjoint.

``mode`` selects the backward:

- ``"local"``: a rank differentiates only its own slot, so the backward needs no communication. Exact when
  every rank computes the *same* function of the gathered data (what a replicated loss does), up to the
  gradient averaging of the trainer, which the caller compensates for.
- ``"sync"``: the true adjoint. Every rank's gradient for every slot is summed and delivered to the slot's
  owner (reduce-scatter for gathers, all-reduce for reductions), so it is exact even when ranks compute
  different functions of the gathered data (a sharded loss). Every rank must then run the backward.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import Group, all_gather_flat, all_reduce_, reduce_scatter_flat


class AllGatherFlat(torch.autograd.Function):
    """``(n,)`` on each rank -> ``(W, n)``: row ``i`` is rank ``i``'s input."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, group: Group, rank: int, world: int, mode: str) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.mode = group, rank, mode
        out = flat.new_empty(world * flat.numel())
        all_gather_flat(out, flat.contiguous(), group)
        return out.view(world, flat.numel())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.mode == "local":
            return grad[ctx.rank].clone(), None, None, None, None
        out = grad.new_empty(grad.shape[1])
        reduce_scatter_flat(out, grad.contiguous().view(-1), ctx.group)
        return out, None, None, None, None


class AllReduce(torch.autograd.Function):
    """Elementwise reduction across ranks; min/max send gradient only to the holders of the extremum.

    Ties are split evenly among the ranks (and elements) that hold the extremum, like ``torch.amax``. The
    count of holders is all-reduced in forward, so the backward of ``"local"`` mode stays communication-free.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, op: str, group: Group, world: int, mode: str, count_ties: bool
    ) -> torch.Tensor:
        ctx.op, ctx.group, ctx.world, ctx.mode = op, group, world, mode
        out = x.detach().clone(memory_format=torch.contiguous_format)
        all_reduce_(out, _reductions.all_reduce_op(op), group)
        if _reductions.averages(op):
            out /= world
        if count_ties and _reductions.selects(op):
            holder = x.detach() == out
            count = holder.to(x.dtype)
            all_reduce_(count, "sum", group)
            ctx.save_for_backward(holder, count)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.mode == "sync":
            grad = grad.clone(memory_format=torch.contiguous_format)
            all_reduce_(grad, "sum", ctx.group)
        if _reductions.averages(ctx.op):
            grad = grad / ctx.world
        elif _reductions.selects(ctx.op):
            holder, count = ctx.saved_tensors
            grad = torch.where(holder, grad / count.clamp_min(1), torch.zeros_like(grad))
        return grad, None, None, None, None, None


class ReduceRows(AllReduce):
    """:class:`AllReduce` whose forward reduces every rank's input, already gathered (``rows``, ``(W, *shape)``),
    on this rank in rank order: the same bits on every rank, no collective. The backward is the same."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, rows: torch.Tensor, op: str, group: Group, world: int, mode: str
    ) -> torch.Tensor:
        ctx.op, ctx.group, ctx.world, ctx.mode = op, group, world, mode
        out = _reductions.reduce_rows(op, rows)
        if _reductions.selects(op):  # ties: how many ranks hold the extremum, from the rows themselves
            holder = x.detach() == out
            ctx.save_for_backward(holder, (rows == out).sum(0).to(x.dtype))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (*AllReduce.backward(ctx, grad)[:1], None, None, None, None, None)


class _ScaleGrad(torch.autograd.Function):
    """Identity in forward; multiplies the gradient by ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Return ``x`` unchanged whose gradient is multiplied by ``scale`` (no-op when ``scale == 1``)."""
    if scale == 1 or not x.requires_grad:
        return x
    return _ScaleGrad.apply(x, scale)
