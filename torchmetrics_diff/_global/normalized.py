"""The normalized losses over the global batch: the weighted mean and the token cross-entropy of every rank's
elements, divided by their global weight or count (or by a ``total`` known in advance).

Their block forms are ``functional._normalized``'s; :func:`~.strategy.global_normalized` all-reduces the sums.
"""

from __future__ import annotations

from torch import Tensor

from torchmetrics_diff._global.strategy import checked_together, global_normalized
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.functional._normalized import token_cross_entropy_block, weighted_mean_block

#: the last arguments of both losses, and what they return
_DOCS = {
    "group": """group: the process group. Default ``None``.
grad_reduction: ``"mean"`` (DDP) or ``"sum"``. Default ``"mean"``.""",
    "returns": """Returns:
    The 0-d value, identical on every rank, differentiable with respect to the local inputs: float64 for
    float64 inputs, else float32; 0 when the denominator is 0. Without an initialised process group, or
    with one rank, the local value and no collective.""",
}


@shared_docs(**_DOCS)
def global_weighted_mean(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
    *,
    total: Tensor | float | None = None,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """``Σ w·v / Σ w`` over every rank's elements: a per-element loss normalized by the global weight.

    Args:
        values: per-element losses, any shape.
        weight: weights broadcastable to ``values`` (``None``: 1).
        mask: bool mask broadcastable to ``values``; masked elements are excluded (NaN there is harmless).
            Default ``None``.
        total: the global denominator when it is known in advance (gradient accumulation: the weight of
            every micro-batch of the optimizer step on every rank); the value is then this call's global
            weighted sum over ``total``, and the values of the step's calls add up to the step's loss. Default ``None``.
        {group}

    {returns}

    Raises:
        ValueError: ``weight`` or ``mask`` not broadcastable to ``values``, or an unknown ``grad_reduction``; under a
            process group, on every rank.

    Example:
        >>> import torch
        >>> global_weighted_mean(torch.tensor([1.0, 2.0, 9.0]), mask=torch.tensor([True, True, False]))
        tensor(1.5000)
    """
    with checked_together(group, values):
        loss_sum, count = weighted_mean_block(values, weight, mask)
    return global_normalized(loss_sum, count, total, group, grad_reduction)


@shared_docs(**_DOCS)
def global_token_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    *,
    total: Tensor | float | None = None,
    group: Group = None,
    grad_reduction: str = "mean",
    class_dim: int = -1,
    validate_args: bool = False,
) -> Tensor:
    """Token-level cross-entropy divided by the number of valid tokens of every rank (or by ``total``).

    Args:
        logits: the classes in dimension ``class_dim``: ``(..., C)`` by default, ``(B, C, T)`` with ``class_dim=1``.
        target: class indices, the shape of ``logits`` without dimension ``class_dim``; ``ignore_index`` marks
            padding.
        ignore_index: target value to skip. Default ``-100``.
        label_smoothing: as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.
        class_dim: the dimension of ``logits`` holding the classes (taken from this argument, never guessed).
            Default ``-1``.
        validate_args: check the targets' range on any device (a host synchronization); on the CPU an
            out-of-range target raises a named ``IndexError`` anyway. Default ``False``.
        total: the global number of valid tokens of the whole optimizer step, when accumulating gradients.
            Default ``None``.
        {group}

    {returns}

    Raises:
        ValueError: ``logits`` and ``target`` of mismatched shapes or dtypes, a bad ``label_smoothing``, or an unknown
            ``grad_reduction``; under a process group, on every rank.

    Example:
        >>> import torch
        >>> logits = torch.zeros(1, 3, 4)
        >>> global_token_cross_entropy(logits, torch.tensor([[0, 1, -100]]))  # log(4)
        tensor(1.3863)
    """
    with checked_together(group, logits):
        loss_sum, count = token_cross_entropy_block(
            logits, target, ignore_index, label_smoothing, class_dim=class_dim, validate_args=validate_args
        )
    return global_normalized(loss_sum, count, total, group, grad_reduction)
