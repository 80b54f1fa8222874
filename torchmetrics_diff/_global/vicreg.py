"""VICReg over the global batch: one differentiable all-reduce of the sufficient statistics.

The statistics, the terms and the loss from them are ``functional._vicreg``'s. Every term depends on the rows only
through sums, so the global-batch loss needs one all-reduce of ``D² + 3D + 2`` numbers whatever the batch size
(:func:`global_vicreg_stats`; the two symmetric Gram matrices travel as the two triangles of one ``D × D`` matrix).
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff._global.strategy import check_grad_reduction, checked_together, grad_factor
from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.functional._vicreg import VICRegStats, check_number, vicreg_from_stats, vicreg_stats


def _pack(stats: VICRegStats) -> Tensor:
    """One flat buffer of ``D² + 3D + 2`` numbers: ``gram_a``'s upper and ``gram_b``'s strict lower triangle share
    one ``D × D`` matrix (both are symmetric), ``gram_b``'s diagonal travels apart."""
    triangles = torch.triu(stats.gram_a) + torch.tril(stats.gram_b, -1)
    parts = [triangles, torch.diagonal(stats.gram_b), stats.sum_a, stats.sum_b, stats.sum_sq_diff, stats.count]
    return torch.cat([p.reshape(-1) for p in parts])


def _unpack(flat: Tensor, dim: int) -> VICRegStats:
    triangles, diag_b, sum_a, sum_b, sum_sq_diff, count = flat.split([dim * dim, dim, dim, dim, 1, 1])
    triangles = triangles.view(dim, dim)
    gram_a = torch.triu(triangles) + torch.triu(triangles, 1).T
    lower = torch.tril(triangles, -1)
    gram_b = lower + lower.T + torch.diag(diag_b)
    return VICRegStats(sum_a, gram_a, sum_b, gram_b, sum_sq_diff.reshape(()), count.reshape(()))


def global_vicreg_stats(
    za: Tensor,
    zb: Tensor,
    shift: tuple[Tensor, Tensor] | None = None,
    *,
    group: Group = None,
    grad_reduction: str = "mean",
) -> VICRegStats:
    """VICReg's sufficient statistics of the global batch: this rank's, summed over the ranks of ``group``.

    One differentiable all-reduce of ``D² + 3D + 2`` numbers (the two symmetric Gram matrices share one
    ``D × D`` buffer), whatever the batch size; no communication in backward: each rank's statistics keep the
    graph to its own rows, their gradient scaled for the trainer's reduction.

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included) and the same ``shift``.

    Args:
        za: this rank's embeddings of the first view ``(B, D)``, floating.
        zb: the second view ``(B, D)``, of the shape, dtype and device of ``za``.
        shift: ``(c_a, c_b)``, two ``(D,)`` tensors the statistics are taken around, *the same on every rank*
            (e.g. :meth:`VICRegStats.means` of the previous global statistics), or ``None`` (default).
        group: the process group (default ``None``: the default group). Without an initialised process group,
            or with one rank, the statistics of the local rows and no collective.
        grad_reduction: how the trainer combines gradients across ranks: ``"mean"`` (default: DDP, FSDP) or
            ``"sum"``.

    Returns:
        :class:`VICRegStats` of every rank's rows, identical on every rank, differentiable with respect to the
        local inputs.

    Raises:
        ValueError: views that are not floating ``(B, D)`` tensors of one shape, a bad ``shift`` or an unknown
            ``grad_reduction``; under a process group, on every rank.
        RuntimeError: on every rank, when the ranks' ``D`` or dtypes differ.

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(8, 3, generator=gen), torch.randn(8, 3, generator=gen)
        >>> from torchmetrics_diff.functional import vicreg_loss
        >>> torch.allclose(vicreg_from_stats(global_vicreg_stats(za, zb)), vicreg_loss(za, zb))
        True
    """
    with checked_together(group, za):
        check_grad_reduction(grad_reduction)
        stats = vicreg_stats(za, zb, shift)
    world = group_size(group)
    if world == 1:
        return stats
    flat = all_reduce(scale_grad(_pack(stats), grad_factor(world, grad_reduction)), "sum", group, grad="local")
    return _unpack(flat, stats.sum_a.shape[0])


def global_vicreg_loss(
    za: Tensor,
    zb: Tensor,
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
    eps: float = 1e-4,
    *,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """VICReg loss of the global batch, from all-reduced sufficient statistics (:func:`global_vicreg_stats`).

    The means, variances and covariances are those of every rank's rows, and the invariance term is the mean over
    every rank's rows: the loss of one process holding the concatenated batch, with its gradient.

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included).

    Args:
        za: this rank's embeddings of the first view ``(B, D)``, floating.
        zb: the second view ``(B, D)``, of the shape, dtype and device of ``za``; row i is the same sample.
        sim_coeff: weight of the invariance term. Default ``25``.
        std_coeff: weight of the variance term. Default ``25``.
        cov_coeff: weight of the covariance term. Default ``1``.
        eps: added to each variance before the square root. Default ``1e-4``.
        group: the process group (default ``None``: the default group). Without an initialised process group,
            or with one rank, the loss of the local rows and no collective.
        grad_reduction: how the trainer combines gradients across ranks: ``"mean"`` (default) or ``"sum"``.

    Returns:
        The 0-d loss of every rank's rows, identical on every rank, differentiable with respect to the local
        inputs: float64 for float64 inputs, else float32.

    Raises:
        ValueError: views that are not floating ``(B, D)`` tensors of one shape, a bad coefficient or an unknown
            ``grad_reduction`` (the views and ``grad_reduction`` on every rank under a process group).

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(8, 3, generator=gen), torch.randn(8, 3, generator=gen)
        >>> from torchmetrics_diff.functional import vicreg_loss
        >>> torch.allclose(global_vicreg_loss(za, zb), vicreg_loss(za, zb))
        True
    """
    with checked_together(group, za):  # a bad number on one rank raises on every rank
        for name, value in (("sim_coeff", sim_coeff), ("std_coeff", std_coeff), ("cov_coeff", cov_coeff), ("eps", eps)):
            check_number(name, value)
    stats = global_vicreg_stats(za, zb, group=group, grad_reduction=grad_reduction)
    return vicreg_from_stats(stats, sim_coeff, std_coeff, cov_coeff, eps)
