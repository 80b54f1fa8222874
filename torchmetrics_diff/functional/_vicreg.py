"""VICReg's local maths: additive sufficient statistics of a shard, the three terms and the loss from them.

VICReg (Bardes, Ponce and LeCun, ICLR 2022) regularizes two views' embeddings ``za``, ``zb`` of ``N`` rows and
``D`` features with three terms, written as in the paper's Algorithm 1 (its reference pseudo-code):

- invariance ``s = mse(za, zb)``: the mean of ``(za - zb)²`` over all ``N·D`` entries;
- variance ``v(Z) = mean_j relu(1 - sqrt(Var(z_j) + eps))`` with the unbiased variance over the batch (divisor
  ``N - 1``), summed over the two views;
- covariance ``c(Z) = Σ_{i≠j} Cov(Z)_ij² / D`` with ``Cov(Z) = (Z - mean)ᵀ (Z - mean) / (N - 1)``, summed over the
  two views;

and ``loss = sim_coeff · s + std_coeff · [v(Za) + v(Zb)] + cov_coeff · [c(Za) + c(Zb)]``. (The authors' released
training script halves the variance term, ``mean(relu(1 - std_a)) / 2 + mean(relu(1 - std_b)) / 2``; pass
``std_coeff=12.5`` for its numbers.)

Every term depends on the rows only through sums (the row count, per view the sum of rows and the Gram matrix
``Σ z zᵀ``, and ``Σ ||za - zb||²``), so the statistics of a union of shards are the field-wise sums of theirs
and the global-batch loss needs one all-reduce of ``D² + 3D + 2`` numbers whatever the batch size
(``global_vicreg_stats``, in ``torchmetrics_diff._global.vicreg``; the two symmetric Gram matrices travel as the
two triangles of one ``D × D`` matrix).

Precision: the covariance from sums is ``(G - S Sᵀ / N) / (N - 1)``, which cancels catastrophically in float32
when a feature's mean is many times its standard deviation. The statistics can therefore be taken around a
*shift* ``c`` (``Σ (z - c)``, ``Σ (z - c)(z - c)ᵀ``), which leaves every term unchanged in exact arithmetic and
removes the cancellation when ``c`` is near the mean; :class:`~torchmetrics_diff.losses.VICRegLoss` shifts by
the previous call's global mean, which every rank holds bit for bit.
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
    check_views,
    compute_dtype,
    safe_divide,
)


class VICRegStats(NamedTuple):
    """Additive sufficient statistics of VICReg over a set of rows, taken around a shift ``c`` (default 0).

    Every field is a sum over rows, so the statistics of a union of shards taken around the *same* shift are the
    field-wise sums (:meth:`merge`, or one ``all_reduce(sum)``). :func:`vicreg_stats` makes them in at least
    float32, all fields of one dtype and device.

    Attributes:
        sum_a: ``Σ_k (za[k] - c_a)``, shape ``(D,)``.
        gram_a: ``Σ_k (za[k] - c_a)(za[k] - c_a)ᵀ``, shape ``(D, D)``.
        sum_b: ``Σ_k (zb[k] - c_b)``, shape ``(D,)``.
        gram_b: ``Σ_k (zb[k] - c_b)(zb[k] - c_b)ᵀ``, shape ``(D, D)``.
        sum_sq_diff: ``Σ_k ||za[k] - zb[k]||²`` (never shifted), a 0-d tensor.
        count: the number of rows, a 0-d floating tensor.
    """

    sum_a: Tensor
    gram_a: Tensor
    sum_b: Tensor
    gram_b: Tensor
    sum_sq_diff: Tensor
    count: Tensor  # type: ignore[assignment]  # (the field hides tuple.count)

    def merge(self, other: VICRegStats) -> VICRegStats:
        """The statistics of the union of both row sets (field-wise sums; both taken around the same shift).

        Args:
            other: the statistics of the other rows, of the same ``D``.

        Returns:
            A new :class:`VICRegStats`.
        """
        return VICRegStats(*(mine + theirs for mine, theirs in zip(self, other)))

    def means(self, shift: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """The two views' per-feature means (detached), ``0`` for no rows: a good shift for the next batch.

        Args:
            shift: the shift the statistics were taken around (default ``None``: none).

        Returns:
            ``(mean_a, mean_b)``, each ``(D,)``.
        """
        n = self.count.detach().clamp(min=1)
        mean_a, mean_b = self.sum_a.detach() / n, self.sum_b.detach() / n
        if shift is not None:
            mean_a, mean_b = mean_a + shift[0].to(mean_a.dtype), mean_b + shift[1].to(mean_b.dtype)
        return mean_a, mean_b


class VICRegTerms(NamedTuple):
    """VICReg's three terms, unweighted (the loss is ``sim·invariance + std·variance + cov·covariance``).

    Attributes:
        invariance: the mean squared difference of the views over all ``N·D`` entries, 0-d.
        variance: ``v(Za) + v(Zb)``, the hinge on the per-feature standard deviations, 0-d.
        covariance: ``c(Za) + c(Zb)``, the squared off-diagonal covariances over ``D``, 0-d.
    """

    invariance: Tensor
    variance: Tensor
    covariance: Tensor


def _check_shift(shift: object, dim: int) -> None:
    if shift is None:
        return
    if not isinstance(shift, (tuple, list)) or len(shift) != 2:
        raise ValueError(f"`shift` must be None or a pair of (D,) tensors (D = {dim}); got {type(shift).__name__}")
    for name, s in zip(("shift[0]", "shift[1]"), shift):
        if not isinstance(s, Tensor) or s.shape != (dim,) or not s.is_floating_point():
            got = f"shape {tuple(s.shape)} and dtype {s.dtype}" if isinstance(s, Tensor) else type(s).__name__
            raise ValueError(f"`{name}` must be a floating-point tensor of shape ({dim},); got {got}")


def vicreg_stats(za: Tensor, zb: Tensor, shift: tuple[Tensor, Tensor] | None = None) -> VICRegStats:
    """Differentiable sufficient statistics of a shard of embeddings for :func:`vicreg_terms`.

    Args:
        za: embeddings of the first view ``(n, D)``, floating; ``n`` may be 0.
        zb: embeddings of the second view ``(n, D)``, of the shape of ``za``; row ``k`` is the same sample.
        shift: ``(c_a, c_b)``, two ``(D,)`` tensors the rows are taken around (treated as constants: no
            gradient reaches them), or ``None`` (default): no shift. Shards whose statistics are summed must use
            the same shift.

    Returns:
        :class:`VICRegStats` in the accumulation dtype (float64 for float64 inputs, else float32). Under
        ``torch.autocast`` the embeddings are rounded to the autocast dtype once, as a matrix product would take
        them, and every statistic is a float32 sum of those values.

    Raises:
        ValueError: ``za`` is not a floating ``(n, D)`` tensor, ``zb`` has another shape, or a bad ``shift``.

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(10, 4, generator=gen), torch.randn(10, 4, generator=gen)
        >>> merged = vicreg_stats(za[:3], zb[:3]).merge(vicreg_stats(za[3:], zb[3:]))
        >>> torch.allclose(vicreg_from_stats(merged), vicreg_loss(za, zb), atol=1e-5)
        True
    """
    check_views("za", za, "zb", zb)
    _check_shift(shift, za.shape[1])
    dtype = compute_dtype(za, zb)
    acc = acc_dtype(dtype)
    with autocast_off(za):
        za, zb = za.to(dtype).to(acc), zb.to(dtype).to(acc)
        diff = za - zb
        sum_sq_diff = (diff * diff).sum()
        if shift is not None:
            za = za - shift[0].detach().to(device=za.device, dtype=acc)
            zb = zb - shift[1].detach().to(device=zb.device, dtype=acc)
        return VICRegStats(
            sum_a=za.sum(dim=0),
            gram_a=za.T @ za,
            sum_b=zb.sum(dim=0),
            gram_b=zb.T @ zb,
            sum_sq_diff=sum_sq_diff,
            count=as_count(za.shape[0], za),
        )


def check_number(name: str, value: object) -> float:
    """``value`` as a ``float`` if it is a finite number ``>= 0`` (not a bool), else a ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}")
    return float(value)


def _covariance(total: Tensor, gram: Tensor, n: Tensor, denominator: Tensor) -> Tensor:
    return (gram - torch.outer(total, total) / n) / denominator


def vicreg_terms(stats: VICRegStats | tuple[Tensor, ...], eps: float = 1e-4) -> VICRegTerms:
    """VICReg's three unweighted terms from (summed) sufficient statistics.

    With ``N`` rows: ``Cov = (G - S Sᵀ / N) / (N - 1)`` per view (``S``, ``G`` the sum and Gram of the rows
    around the shift, which cancels), ``invariance = Σ||za - zb||² / (N·D)``,
    ``variance = Σ_view mean_j relu(1 - sqrt(Cov_jj + eps))`` and
    ``covariance = Σ_view Σ_{i≠j} Cov_ij² / D``. The divisor ``N - 1`` is taken as at least 1: one row gives zero
    covariance, no row gives zero invariance and covariance (never ``NaN``).

    Args:
        stats: :class:`VICRegStats` or a tuple of its six fields in order.
        eps: added to each variance before the square root. Default ``1e-4``.

    Returns:
        :class:`VICRegTerms`, each a 0-d tensor with the graph of the statistics.

    Raises:
        ValueError: statistics of inconsistent shapes, or an ``eps`` that is not a finite number ``>= 0``.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> vicreg_terms(vicreg_stats(z, z), eps=0.0)  # std sqrt(2/3) per feature, uncorrelated features
        VICRegTerms(invariance=tensor(0.), variance=tensor(0.3670), covariance=tensor(0.))
    """
    sum_a, gram_a, sum_b, gram_b, sum_sq_diff, count = stats
    if not isinstance(sum_a, Tensor) or sum_a.ndim != 1:
        got = tuple(sum_a.shape) if isinstance(sum_a, Tensor) else type(sum_a).__name__
        raise ValueError(f"`stats.sum_a` must have shape (D,); got {got}")
    dim = sum_a.shape[0]
    for name, field, shape in [
        ("stats.gram_a", gram_a, (dim, dim)),
        ("stats.sum_b", sum_b, (dim,)),
        ("stats.gram_b", gram_b, (dim, dim)),
        ("stats.sum_sq_diff", sum_sq_diff, ()),
        ("stats.count", count, ()),
    ]:
        if not isinstance(field, Tensor) or field.shape != shape:
            got = tuple(field.shape) if isinstance(field, Tensor) else type(field).__name__
            raise ValueError(f"`{name}` must have shape {shape}; got {got}")
    eps = check_number("eps", eps)
    n = count.clamp(min=1)
    denominator = (count - 1).clamp(min=1)
    invariance = safe_divide(sum_sq_diff, count * dim)
    eye = torch.eye(dim, dtype=torch.bool, device=gram_a.device)
    variance = covariance = sum_sq_diff.new_zeros(())
    for total, gram in ((sum_a, gram_a), (sum_b, gram_b)):
        cov = _covariance(total, gram, n, denominator)
        var = torch.diagonal(cov).clamp(min=0)
        variance = variance + torch.relu(1 - torch.sqrt(var + eps)).mean()
        covariance = covariance + cov.masked_fill(eye, 0.0).pow(2).sum() / dim
    return VICRegTerms(invariance, variance, covariance)


def vicreg_from_stats(
    stats: VICRegStats | tuple[Tensor, ...],
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
    eps: float = 1e-4,
) -> Tensor:
    """VICReg loss (Bardes et al., 2022) from (summed) sufficient statistics.

    ``sim_coeff · invariance + std_coeff · variance + cov_coeff · covariance`` of :func:`vicreg_terms`.

    Args:
        stats: :class:`VICRegStats` or a tuple of its six fields in order.
        sim_coeff: weight of the invariance term (the paper's λ). Default ``25``.
        std_coeff: weight of the variance term (μ). Default ``25``.
        cov_coeff: weight of the covariance term (ν). Default ``1``.
        eps: added to each variance before the square root. Default ``1e-4``.

    Returns:
        The loss, a 0-d tensor.

    Raises:
        ValueError: statistics of inconsistent shapes, or a coefficient or ``eps`` that is not a finite number
            ``>= 0``.

    Example:
        >>> import torch
        >>> z = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
        >>> vicreg_from_stats(vicreg_stats(z, z))  # std > 1, uncorrelated, identical views
        tensor(0.)
    """
    named = (("sim_coeff", sim_coeff), ("std_coeff", std_coeff), ("cov_coeff", cov_coeff))
    coeffs = [check_number(name, value) for name, value in named]
    terms = vicreg_terms(stats, eps)
    return coeffs[0] * terms.invariance + coeffs[1] * terms.variance + coeffs[2] * terms.covariance


def vicreg_loss(
    za: Tensor,
    zb: Tensor,
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
    eps: float = 1e-4,
) -> Tensor:
    """VICReg loss of a full batch (the rows you pass are the whole batch).

    Args:
        za: embeddings of the first view ``(N, D)``, floating.
        zb: embeddings of the second view ``(N, D)``, same shape; row ``k`` is the same sample.
        sim_coeff: weight of the invariance term. Default ``25``.
        std_coeff: weight of the variance term. Default ``25``.
        cov_coeff: weight of the covariance term. Default ``1``.
        eps: added to each variance before the square root. Default ``1e-4``.

    Returns:
        The loss, a 0-d tensor (float64 for float64 inputs, else float32).

    Raises:
        ValueError: ``za`` is not a floating ``(N, D)`` tensor, ``zb`` has another shape, or a bad coefficient.

    Example:
        >>> import torch
        >>> za = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])
        >>> vicreg_loss(za, za)  # identical views, stds above 1, covariance 4: 2 · 4² / 2 per view
        tensor(32.)
    """
    return vicreg_from_stats(vicreg_stats(za, zb), sim_coeff, std_coeff, cov_coeff, eps)
