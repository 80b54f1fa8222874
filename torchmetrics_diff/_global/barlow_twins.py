"""Barlow Twins over the global batch: one differentiable all-reduce of the sufficient statistics.

The statistics and the loss from them are ``functional._barlow_twins``'s; here they are summed over the ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff._global.strategy import check_grad_reduction, checked_together, grad_factor
from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.functional._barlow_twins import barlow_twins_from_stats, barlow_twins_stats


def global_barlow_twins_loss(
    za: Tensor,
    zb: Tensor,
    lambda_offdiag: float = 5e-3,
    eps: float = 1e-5,
    *,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """Barlow Twins loss of the global batch from all-reduced sufficient statistics.

    One differentiable all-reduce of ``D² + 4D + 1`` numbers, whatever the batch size: the exact global
    cross-correlation (not per-rank batch normalization).

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included).

    Args:
        za: this rank's embeddings of the first view ``(B, D)``, floating (the batch normalization over the
            global batch happens inside).
        zb: the second view ``(B, D)``, of the shape, dtype and device of ``za``; row i is the same sample.
        lambda_offdiag: the weight of the off-diagonal terms (default ``5e-3``).
        eps: added to the variances before the square root of the normalization (default ``1e-5``).
        group: the process group (default ``None``: the default group). Without an initialised process group,
            or with one rank, the loss of the local rows and no collective.
        grad_reduction: how the trainer combines gradients across ranks: ``"mean"`` (default: DDP, FSDP) or
            ``"sum"``.

    Returns:
        The 0-d loss of every rank's rows, identical on every rank, differentiable with respect to the local
        inputs (and the tensor scalars): float64 for float64 inputs, else float32.

    Raises:
        ValueError: views that are not floating ``(B, D)`` tensors of one shape, or an unknown
            ``grad_reduction``; under a process group, on every rank.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.functional import barlow_twins_loss
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(8, 3, generator=gen), torch.randn(8, 3, generator=gen)
        >>> torch.allclose(global_barlow_twins_loss(za, zb), barlow_twins_loss(za, zb))
        True
    """
    with checked_together(group, za):
        check_grad_reduction(grad_reduction)
        stats = barlow_twins_stats(za, zb)
    world = group_size(group)
    if world > 1:
        shapes = [s.shape for s in stats]
        flat = torch.cat([s.reshape(-1) for s in stats])
        flat = all_reduce(scale_grad(flat, grad_factor(world, grad_reduction)), "sum", group, grad="local")
        stats = type(stats)(*(p.reshape(s) for p, s in zip(flat.split([s.numel() for s in shapes]), shapes)))
    return barlow_twins_from_stats(stats, lambda_offdiag, eps)
