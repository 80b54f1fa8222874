"""DINO's teacher center over the global batch: the EMA of the mean of every rank's teacher outputs.

The checks and the maths are ``functional._dino``'s; here the rows' sums and count travel in one all-reduce.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff._global.strategy import checked_together
from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.functional._dino import center_from_sums, center_sums, check_center_inputs, check_momentum


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
        check_center_inputs(center, teacher_output)
        momentum = check_momentum(momentum)
    with torch.no_grad():
        packed = center_sums(center, teacher_output)
        if group_size(group) > 1:
            packed = all_reduce(packed, "sum", group, grad="none")
        return center_from_sums(center, packed, momentum)
