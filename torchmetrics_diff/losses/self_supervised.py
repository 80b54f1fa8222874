"""Self-supervised regularizers whose statistics span the global batch: VICReg, and DINO's teacher centering."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from torchmetrics_diff import functional as F
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.losses._base import _TwoViewsLoss


class VICRegLoss(_TwoViewsLoss):
    r"""VICReg (Bardes, Ponce and LeCun, 2022) with its batch statistics over the global batch.

    .. math::
        \ell = \lambda\, s(Z_a, Z_b) + \mu\,[v(Z_a) + v(Z_b)] + \nu\,[c(Z_a) + c(Z_b)]

    with the invariance ``s`` the mean squared difference of the views over all entries, the variance
    ``v(Z) = mean_j relu(1 - sqrt(Var(z_j) + eps))`` (unbiased variance) and the covariance
    ``c(Z) = Σ_{i≠j} Cov(Z)_ij² / D`` — every mean, variance and covariance over the rows of **every rank**, as in
    the paper's Algorithm 1 on one device. Computed from all-reduced sufficient statistics (the row count, per
    view ``Σz`` and ``Σ z zᵀ``, and ``Σ||za - zb||²``): one all-reduce of ``D² + 3D + 2`` numbers whatever the
    batch size, exact gradients, uneven and empty ranks. ``strategy`` does not apply.

    The statistics are taken around the previous call's global means (every rank holds them bit for bit), so
    that the covariance from sums does not cancel catastrophically in float32 when a feature's mean dwarfs its
    spread; the first call uses no shift. The three terms of the latest call are in :attr:`last_terms`.

    Args:
        sim_coeff: ``λ``, weight of the invariance term. Default ``25``.
        std_coeff: ``μ``, weight of the variance term. Default ``25`` (the authors' released script halves this
            term: ``12.5`` here reproduces its numbers).
        cov_coeff: ``ν``, weight of the covariance term. Default ``1``.
        eps: added to each variance before the square root. Default ``1e-4``.
        kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``, ``grad_reduction``,
            ``dist_sync_on_step``...).

    Raises:
        ValueError: a coefficient or ``eps`` that is not a finite number ``>= 0``, or a bad
            :class:`~torchmetrics_diff.Metric` keyword argument.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import VICRegLoss
        >>> loss = VICRegLoss()
        >>> za = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
        >>> loss(za, za + 0.1)
        tensor(0.2500)
        >>> loss.last_terms.invariance  # the mean squared difference of the views
        tensor(0.0100)
    """

    def __init__(
        self,
        sim_coeff: float = 25.0,
        std_coeff: float = 25.0,
        cov_coeff: float = 1.0,
        eps: float = 1e-4,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("sim_coeff", sim_coeff), ("std_coeff", std_coeff), ("cov_coeff", cov_coeff), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}")
        self.sim_coeff, self.std_coeff, self.cov_coeff = float(sim_coeff), float(std_coeff), float(cov_coeff)
        self.eps = float(eps)
        #: the three unweighted terms of the latest call (detached, identical on every rank), ``None`` before one
        self.last_terms: F.VICRegTerms | None = None
        self._shift: tuple[Tensor, Tensor] | None = None  # the previous call's global means (see the docstring)

    def forward(self, za: Tensor, zb: Tensor) -> Tensor:
        """The VICReg loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            za: this rank's embeddings of the first views ``(B, D)``, floating (the expander's output).
            zb: the second views ``(B, D)``, same dtype and device; row ``i`` is the same sample.

        Returns:
            The loss of every rank's rows, identical on every rank: 0-d, float64 for float64 inputs, else float32.
        """
        return self._step(za=za, zb=zb)

    def _shift_for(self, za: Tensor) -> tuple[Tensor, Tensor] | None:
        shift = self._shift
        if shift is None or shift[0].shape[0] != za.shape[1] or shift[0].device != za.device:
            return None
        return shift

    def _loss(self, za: Tensor, zb: Tensor, *, sync: bool) -> Tensor:  # type: ignore[override]
        shift = self._shift_for(za) if isinstance(za, Tensor) and za.ndim == 2 else None
        if sync:
            stats = F.global_vicreg_stats(za, zb, shift, group=self.process_group, grad_reduction=self.grad_reduction)
        else:
            stats = F.vicreg_stats(za, zb, shift)
        terms = F.vicreg_terms(stats, self.eps)
        self._shift = stats.means(shift)
        self.last_terms = F.VICRegTerms(*(t.detach() for t in terms))
        return self.sim_coeff * terms.invariance + self.std_coeff * terms.variance + self.cov_coeff * terms.covariance


class DINOCenter(nn.Module):
    """DINO's teacher center (Caron et al., 2021): the EMA of the global batch mean of the teacher's outputs.

    ``center(teacher_output)`` returns ``teacher_output - center`` (what goes into the teacher's sharpened
    softmax); :meth:`update` then moves the center towards this step's mean over the rows of **every rank**:
    ``center = m · center + (1 - m) · mean``. The mean weighs every row alike, so ranks with fewer rows (or none)
    count for what they hold — the reference code divides each step's sum by ``rows × world size``, which is the
    global mean only for even ranks. One all-reduce of ``D + 1`` numbers per update, no gradient; the center is a
    buffer, so it is in ``state_dict`` and moves with ``.to()``. A small module rather than a
    :class:`~torchmetrics_diff.Metric`: the center is identical on every rank after each update and is not a
    reduction of what was seen (see :doc:`/guide/decisions`).

    Args:
        dim: ``D``, the size of the teacher's output (DINO: ``out_dim``).
        momentum: the EMA momentum ``m`` in ``[0, 1]``. Default ``0.9`` (DINO's ``center_momentum``).
        process_group (torch.distributed.ProcessGroup | None): the ranks whose rows make the batch (default
            ``None``: the default group; without an initialised process group, the local rows).
        dtype: the dtype of the center. Default ``torch.float32``.

    Raises:
        ValueError: a ``dim`` that is not a positive int, a ``momentum`` outside ``[0, 1]`` or a ``dtype`` that
            is not floating.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import DINOCenter
        >>> center = DINOCenter(dim=2, momentum=0.5)
        >>> teacher = torch.tensor([[1.0, 3.0], [3.0, 5.0]])
        >>> center(teacher)  # the initial center is zero
        tensor([[1., 3.],
                [3., 5.]])
        >>> center.update(teacher)
        >>> center.center
        tensor([1., 2.])
    """

    center: Tensor

    def __init__(
        self, dim: int, momentum: float = 0.9, *, process_group: Group = None, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"`dim` must be a positive int; got {dim!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"`dtype` must be a floating-point torch.dtype; got {dtype!r}")
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
            raise ValueError(f"`momentum` must be a number in [0, 1]; got {momentum!r}")
        self.momentum = float(momentum)
        self.process_group = process_group
        self.register_buffer("center", torch.zeros(dim, dtype=dtype))

    def forward(self, teacher_output: Tensor) -> Tensor:
        """The centered outputs ``teacher_output - center`` (the center is a constant: no gradient reaches it).

        Args:
            teacher_output: the teacher's outputs ``(..., D)``.

        Returns:
            ``teacher_output - center``, broadcast over the leading dimensions, in torch's promoted dtype (a
            half-precision output minus the float32 center is float32, as in the reference code).

        Raises:
            ValueError: ``teacher_output`` is not a tensor whose last dimension is ``D``.
        """
        if (
            not isinstance(teacher_output, Tensor)
            or teacher_output.ndim < 1
            or teacher_output.shape[-1] != len(self.center)
        ):
            got = tuple(teacher_output.shape) if isinstance(teacher_output, Tensor) else type(teacher_output).__name__
            raise ValueError(f"`teacher_output` must be a tensor of shape (..., {len(self.center)}); got {got}")
        return teacher_output - self.center

    @torch.no_grad()
    def update(self, teacher_output: Tensor) -> None:
        """Move the center towards the mean of this step's teacher outputs over every rank's rows.

        Every rank of ``process_group`` must call it, with its own rows (zero included); the center is then the
        same on every rank. A step in which no rank holds a row leaves it as it is.

        Args:
            teacher_output: this rank's teacher outputs ``(..., D)``, any floating dtype (summed in at least
                float32), on the center's device.

        Raises:
            ValueError: ``teacher_output`` whose last dimension is not ``D`` or on another device; under a
                process group, on every rank.
            RuntimeError: on every rank, when the ranks' ``D`` differ.
        """
        new = F.dino_center_update(self.center, teacher_output, self.momentum, group=self.process_group)
        self.center.copy_(new)

    def extra_repr(self) -> str:
        return f"dim={len(self.center)}, momentum={self.momentum}"
