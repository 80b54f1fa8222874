"""DINO's teacher centering, its local maths: the checks, the rows' sums and the EMA from summed sums.

DINO (Caron et al., ICCV 2021) subtracts a center from the teacher's outputs before its sharpened softmax and
updates it after each step as ``center = m · center + (1 - m) · mean(teacher_output)``, the mean over the batch.
The reference code all-reduces the per-rank sums and divides by ``rows × world size``, which is the global mean
only when every rank holds the same number of rows; here the rows are counted in the same all-reduce, so uneven
and empty ranks weigh by their rows.

The sums of a rank's rows (:func:`center_sums`) add up over ranks; :func:`center_from_sums` makes the next center
from them. ``dino_center_update`` (in ``torchmetrics_diff._global.dino``) sums them over the ranks in between.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff.functional._checks import acc_dtype, as_count


def check_momentum(momentum: object) -> float:
    """``momentum`` as a ``float`` in ``[0, 1]``, else a ``ValueError`` naming it."""
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
        raise ValueError(f"`momentum` must be a number in [0, 1]; got {momentum!r}")
    return float(momentum)


def check_center_inputs(center: object, teacher_output: object) -> None:
    """A floating ``(D,)`` center and floating ``(..., D)`` teacher outputs on its device, else a ``ValueError``."""
    if not isinstance(center, Tensor) or center.ndim != 1 or not center.is_floating_point():
        got = f"shape {tuple(center.shape)} and dtype {center.dtype}" if isinstance(center, Tensor) else type(center)
        raise ValueError(f"`center` must be a floating-point tensor of shape (D,); got {got}")
    dim = center.shape[0]
    if not isinstance(teacher_output, Tensor):
        raise ValueError(
            f"`teacher_output` must be a tensor of shape (..., {dim}); got {type(teacher_output).__name__}"
        )
    if teacher_output.ndim < 1 or teacher_output.shape[-1] != dim or not teacher_output.is_floating_point():
        raise ValueError(
            f"`teacher_output` must be a floating-point tensor of shape (..., {dim}) (the center's D); "
            f"got shape {tuple(teacher_output.shape)} and dtype {teacher_output.dtype}"
        )
    if teacher_output.device != center.device:
        raise ValueError(
            f"`teacher_output` must be on the device of `center` ({center.device}); got {teacher_output.device}"
        )


def center_sums(center: Tensor, teacher_output: Tensor) -> Tensor:
    """``[Σ rows, count]``: the sum of the teacher's rows ``(..., D)`` and their number, ``(D + 1,)``, detached.

    In the accumulation dtype of the rows (at least float32); the sums of several ranks' rows add up.

    Example:
        >>> import torch
        >>> center_sums(torch.zeros(2), torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
        tensor([4., 8., 2.])
    """
    dim = center.shape[0]
    rows = teacher_output.detach().reshape(-1, dim)
    acc = acc_dtype(rows.dtype)
    return torch.cat([rows.to(acc).sum(dim=0), as_count(rows.shape[0], rows).reshape(1)])


def center_from_sums(center: Tensor, sums: Tensor, momentum: float) -> Tensor:
    """``momentum · center + (1 - momentum) · mean`` from (summed) :func:`center_sums`; ``center`` without rows.

    Example:
        >>> import torch
        >>> center_from_sums(torch.zeros(2), torch.tensor([4.0, 8.0, 2.0]), 0.9)
        tensor([0.2000, 0.4000])
    """
    dim = center.shape[0]
    total, count = sums[:dim], sums[dim]
    mean = total / count.clamp(min=1)
    updated = center * momentum + mean.to(center.dtype) * (1 - momentum)
    return torch.where(count > 0, updated, center)
