"""Barlow Twins as pure functions: additive sufficient statistics of a shard, and the loss from (summed) ones.

The statistics of a union of shards are the field-wise sums of theirs, so the global-batch loss needs one
all-reduce of ``D² + 4D + 1`` numbers whatever the batch size
(:func:`~torchmetrics_diff.functional.global_barlow_twins_loss`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_diff.functional._checks import (
    acc_dtype,
    as_count,
    autocast_off,
    check_float_tensor,
    check_same_shape,
    compute_dtype,
)


class BarlowTwinsStats(NamedTuple):
    """Additive sufficient statistics of Barlow Twins' cross-correlation over a set of rows.

    Every field is a sum over rows, so the statistics of a union of shards are the field-wise sums
    (:meth:`merge`, or one ``all_reduce(sum)`` per field). :func:`barlow_twins_stats` makes them in at least
    float32 (half-precision embeddings are summed in float32), all fields of one dtype and device.

    Attributes:
        sum_a: ``Σ_k za[k]``, shape ``(D,)``.
        sum_sq_a: ``Σ_k za[k]²``, shape ``(D,)``.
        sum_b: ``Σ_k zb[k]``, shape ``(D,)``.
        sum_sq_b: ``Σ_k zb[k]²``, shape ``(D,)``.
        sum_ab: ``Σ_k outer(za[k], zb[k])``, shape ``(D, D)``.
        count: the number of rows, a 0-d floating tensor.
    """

    sum_a: Tensor
    sum_sq_a: Tensor
    sum_b: Tensor
    sum_sq_b: Tensor
    sum_ab: Tensor
    count: Tensor  # type: ignore[assignment]  # (the field hides tuple.count)

    def merge(self, other: BarlowTwinsStats) -> BarlowTwinsStats:
        """The statistics of the union of both row sets (field-wise sums).

        Args:
            other: the statistics of the other rows, of the same ``D``.

        Returns:
            A new :class:`BarlowTwinsStats`.
        """
        return BarlowTwinsStats(*(mine + theirs for mine, theirs in zip(self, other)))


def barlow_twins_stats(za: Tensor, zb: Tensor) -> BarlowTwinsStats:
    """Differentiable sufficient statistics of a shard of embeddings for :func:`barlow_twins_from_stats`.

    Args:
        za: embeddings of the first view (n, D); n may be 0.
        zb: embeddings of the second view (n, D).

    Returns:
        :class:`BarlowTwinsStats` of the rows, in the accumulation dtype (at least float32). Under
        ``torch.autocast`` the embeddings are rounded to the autocast dtype once, as the product ``za.T @ zb``
        would take them, and every statistic is a float32 sum of those values (the loss subtracts products of
        means from them: sums rounded to half precision would cancel catastrophically).

    Raises:
        ValueError: if ``za`` is not a floating (n, D) tensor or ``zb`` has another shape.

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(10, 4, generator=gen), torch.randn(10, 4, generator=gen)
        >>> merged = barlow_twins_stats(za[:3], zb[:3]).merge(barlow_twins_stats(za[3:], zb[3:]))
        >>> torch.allclose(barlow_twins_from_stats(merged), barlow_twins_loss(za, zb), atol=1e-5)
        True
    """
    check_float_tensor("za", za, 2, "(n, D)")
    check_same_shape("zb", zb, "za", za)
    dtype = compute_dtype(za, zb)
    acc = acc_dtype(dtype)
    with autocast_off(za):
        za, zb = za.to(dtype).to(acc), zb.to(dtype).to(acc)  # the values the autocast product would see, exactly
        return BarlowTwinsStats(
            sum_a=za.sum(dim=0),
            sum_sq_a=(za * za).sum(dim=0),
            sum_b=zb.sum(dim=0),
            sum_sq_b=(zb * zb).sum(dim=0),
            sum_ab=za.T @ zb,
            count=as_count(za.shape[0], za),
        )


def barlow_twins_from_stats(
    stats: BarlowTwinsStats | tuple[Tensor, ...],
    lambda_offdiag: float = 5e-3,
    eps: float = 1e-5,
) -> Tensor:
    """Barlow Twins loss (Zbontar et al., 2021) from (summed) sufficient statistics.

    ``C_ij = (E[za_i zb_j] - mu_a_i mu_b_j) / (sigma_a_i sigma_b_j)`` with the population variance plus
    ``eps`` (``sigma = sqrt(var + eps)``, as a BatchNorm without affine in training mode), and
    ``loss = sum_i (1 - C_ii) ** 2 + lambda_offdiag * sum_{i != j} C_ij ** 2``.

    The variance comes from raw moments (``E[x^2] - E[x]^2``, clamped at 0), which is what makes the
    statistics additive; in float32 it loses precision when ``|mean|`` dwarfs the standard deviation.
    With ``count == 0`` every moment is taken as 0 (loss ``D``), never ``NaN``.

    Args:
        stats: :class:`BarlowTwinsStats` or a tuple of its six fields in order.
        lambda_offdiag: weight of the off-diagonal (redundancy reduction) term. Default ``5e-3``.
        eps: added to each variance, as BatchNorm's ``eps``. Default ``1e-5``.

    Returns:
        The loss, a 0-d tensor.

    Raises:
        ValueError: on stats of inconsistent shapes or a negative / non-finite ``eps`` or ``lambda_offdiag``.

    Example:
        >>> import torch
        >>> za = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> barlow_twins_from_stats(barlow_twins_stats(za, -za), eps=0.0)  # C = -I
        tensor(8.)
    """
    sum_a, sum_sq_a, sum_b, sum_sq_b, sum_ab, count = stats
    dim = sum_a.shape[0] if isinstance(sum_a, Tensor) and sum_a.ndim == 1 else None
    for name, field, shape in [
        ("stats.sum_a", sum_a, (dim,)),
        ("stats.sum_sq_a", sum_sq_a, (dim,)),
        ("stats.sum_b", sum_b, (dim,)),
        ("stats.sum_sq_b", sum_sq_b, (dim,)),
        ("stats.sum_ab", sum_ab, (dim, dim)),
        ("stats.count", count, ()),
    ]:
        if dim is None or not isinstance(field, Tensor) or field.shape != shape:
            got = tuple(field.shape) if isinstance(field, Tensor) else type(field).__name__
            raise ValueError(f"`{name}` must have shape {shape if dim is not None else '(D,)'}; got {got}")
    for name, value in [("lambda_offdiag", lambda_offdiag), ("eps", eps)]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"`{name}` must be a finite non-negative number; got {value!r}")

    n = count.clamp(min=1)
    mean_a, mean_b = sum_a / n, sum_b / n
    var_a = (sum_sq_a / n - mean_a * mean_a).clamp(min=0)
    var_b = (sum_sq_b / n - mean_b * mean_b).clamp(min=0)
    cov = sum_ab / n - mean_a[:, None] * mean_b[None, :]
    corr = cov / torch.sqrt((var_a + eps)[:, None] * (var_b + eps)[None, :])
    on_diag = (1 - torch.diagonal(corr)).pow(2).sum()
    eye = torch.eye(corr.shape[0], dtype=torch.bool, device=corr.device)
    off_diag = corr.masked_fill(eye, 0.0).pow(2).sum()
    return on_diag + lambda_offdiag * off_diag


def barlow_twins_loss(za: Tensor, zb: Tensor, lambda_offdiag: float = 5e-3, eps: float = 1e-5) -> Tensor:
    """Barlow Twins loss of a full batch.

    Args:
        za: embeddings of the first view (N, D).
        zb: embeddings of the second view (N, D).
        lambda_offdiag: weight of the off-diagonal term. Default ``5e-3``.
        eps: added to each variance, as BatchNorm's ``eps``. Default ``1e-5``.

    Returns:
        The loss, a 0-d tensor (float64 for float64 inputs, else float32).

    Raises:
        ValueError: ``za`` is not a floating ``(N, D)`` tensor, or ``zb`` has another shape.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])
        >>> barlow_twins_loss(z, z, eps=0.0)  # the two features are fully correlated
        tensor(0.0100)
    """
    return barlow_twins_from_stats(barlow_twins_stats(za, zb), lambda_offdiag, eps)
