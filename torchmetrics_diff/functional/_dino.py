"""DINO's teacher centering as a pure function: the EMA of the global batch mean of the teacher's outputs.

DINO (Caron et al., ICCV 2021) subtracts a center from the teacher's outputs before its sharpened softmax and
updates it after each step as ``center = m · center + (1 - m) · mean(teacher_output)``, the mean over the batch.
The reference code all-reduces the per-rank sums and divides by ``rows × world size``, which is the global mean
only when every rank holds the same number of rows; here the rows are counted in the same all-reduce, so uneven
and empty ranks weigh by their rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.functional._checks import acc_dtype, as_count
from torchmetrics_diff.functional._strategy import checked_together


def _check_momentum(momentum: object) -> float:
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
        raise ValueError(f"`momentum` must be a number in [0, 1]; got {momentum!r}")
    return float(momentum)


def _check_center_inputs(center: object, teacher_output: object) -> None:
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


def dino_center_update(center: Tensor, teacher_output: Tensor, momentum: float = 0.9, *, group: Group = None) -> Tensor:
    """The next DINO center: ``momentum · center + (1 - momentum) · mean``, the mean over every rank's rows.

    One all-reduce of ``D + 1`` numbers (the rows' sum and their count), without gradient. A step in which no
    rank holds a row leaves the center as it is.

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included).

    Args:
        center: the current center ``(D,)``, floating (DINO starts from zeros); not modified.
        teacher_output: this rank's teacher outputs ``(..., D)``: every leading index is a row (all crops of
            all images). Any floating dtype; summed in at least float32. Detached here.
        momentum: the EMA momentum ``m`` in ``[0, 1]``. Default ``0.9`` (DINO's ``center_momentum``).
        group: the process group (default ``None``: the default group). Without an initialised process group,
            or with one rank, the mean of the local rows and no collective.

    Returns:
        The new center, of the shape, dtype and device of ``center``, identical on every rank, without graph.

    Raises:
        ValueError: a ``center`` that is not a floating ``(D,)`` tensor, a ``teacher_output`` whose last
            dimension is not ``D`` or that is on another device, or a ``momentum`` outside ``[0, 1]``; under a
            process group, on every rank.
        RuntimeError: on every rank, when the ranks' ``D`` or dtypes differ.

    Example:
        >>> import torch
        >>> center = torch.zeros(2)
        >>> dino_center_update(center, torch.tensor([[1.0, 2.0], [3.0, 6.0]]), momentum=0.9)
        tensor([0.2000, 0.4000])
    """
    with checked_together(group, teacher_output):
        _check_center_inputs(center, teacher_output)
        momentum = _check_momentum(momentum)
    with torch.no_grad():
        dim = center.shape[0]
        rows = teacher_output.detach().reshape(-1, dim)
        acc = acc_dtype(rows.dtype)
        packed = torch.cat([rows.to(acc).sum(dim=0), as_count(rows.shape[0], rows).reshape(1)])
        if group_size(group) > 1:
            packed = all_reduce(packed, "sum", group, grad="none")
        total, count = packed[:dim], packed[dim]
        mean = total / count.clamp(min=1)
        updated = center * momentum + mean.to(center.dtype) * (1 - momentum)
        return torch.where(count > 0, updated, center)
