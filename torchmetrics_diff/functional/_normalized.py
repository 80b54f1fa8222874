"""Normalized losses as pure functions: the weighted (masked) mean and the token-level cross-entropy.

Each comes as a *block* form ``*_block(...) -> (loss_sum, count)`` (a shard's sum and its weight) and a mean form,
the block's sum over its count. Across ranks the sums and counts add up: the ``global_*`` forms of
``torchmetrics_diff._global.normalized`` divide the summed sums by the summed counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from torchmetrics_diff.functional._checks import acc_dtype, as_count, check_broadcast, check_float_tensor, safe_divide


def weighted_mean_block(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Weighted sum of ``values`` and the sum of the weights.

    Args:
        values: any shape; non-floating values are cast to the default float dtype.
        weight: broadcastable to ``values``' shape; ``None`` means 1. Default ``None``.
        mask: bool, broadcastable to ``values``' shape; masked-out elements count as weight 0 and are
            excluded with ``torch.where``, so non-finite values there (padding) do not leak in. Default ``None``.

    Returns:
        ``(sum(values * weight), sum(weight))``: 0-d tensors in at least float32 (half-precision values are
        weighted and summed in float32); ``weight`` is expanded to ``values``' shape before it is summed.

    Raises:
        ValueError: if ``weight`` or ``mask`` does not broadcast to ``values``' shape, or ``mask`` is not
            bool.

    Example:
        >>> import torch
        >>> values = torch.tensor([1.0, 2.0, float("nan")])
        >>> weighted_mean_block(values, mask=torch.tensor([True, True, False]))
        (tensor(3.), tensor(2.))
        >>> weighted_mean_block(torch.tensor([1.0, 2.0]), weight=torch.tensor([3.0, 1.0]))
        (tensor(5.), tensor(4.))
    """
    if not isinstance(values, Tensor):
        raise ValueError(f"`values` must be a tensor; got {type(values).__name__}")
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    acc = acc_dtype(values.dtype)
    values = values.to(acc)  # half precision: weighted and summed in float32 (float32 and float64: unchanged)
    if weight is None:
        weight = torch.ones((), dtype=values.dtype, device=values.device)
    elif not isinstance(weight, Tensor):
        weight = torch.full((), float(weight), dtype=values.dtype, device=values.device)
    check_broadcast("weight", weight, values)
    weighted = values * weight
    weight = weight.expand(values.shape)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"`mask` must be a bool tensor; got {got}")
        check_broadcast("mask", mask, values)
        weighted = torch.where(mask, weighted, torch.zeros_like(weighted))
        weight = torch.where(mask, weight, torch.zeros_like(weight))
    return weighted.to(acc).sum(), weight.to(acc).sum()


def weighted_mean(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Weighted mean ``sum(values * weight) / sum(weight)``; ``0`` with zero gradient if no weight.

    Args:
        values: any shape.
        weight: broadcastable to ``values``' shape; ``None`` means 1. Default ``None``.
        mask: bool, broadcastable to ``values``' shape; equivalent to a 0/1 weight. Default ``None``.

    Returns:
        A 0-d tensor (float64 for float64 values, else float32).

    Raises:
        ValueError: a ``weight`` not broadcastable to ``values``, or a ``mask`` that is not a bool tensor
            broadcastable to ``values``.

    Example:
        >>> import torch
        >>> weighted_mean(torch.tensor([1.0, 2.0, 6.0]), mask=torch.tensor([True, True, False]))
        tensor(1.5000)
    """
    return safe_divide(*weighted_mean_block(values, weight, mask))


def token_cross_entropy_block(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Sum of per-token cross-entropies over non-ignored tokens, and their number.

    Args:
        logits: unnormalized scores (..., C), the class dimension last.
        target: class indices (...), the shape of ``logits`` without its last dimension.
        ignore_index: target value of tokens to skip (padding). Default ``-100``.
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.

    Returns:
        ``(loss_sum, count)``: 0-d tensors in at least float32; ``count`` is the number of tokens whose target
        is not ``ignore_index``. Half-precision logits are cast to float32 first (what autocast does to
        ``cross_entropy``): the log-sum-exp over the classes is taken in float32, at the cost of a float32
        copy of the logits.

    Raises:
        ValueError: on mismatched shapes, a non-integer target or ``label_smoothing`` outside ``[0, 1]``.

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 4)  # (batch, sequence, classes): uniform predictions
        >>> target = torch.tensor([[1, 2, -100], [3, -100, -100]])
        >>> total, count = token_cross_entropy_block(logits, target)
        >>> count, torch.allclose(total, 3 * torch.log(torch.tensor(4.0)))
        (tensor(3.), True)
    """
    check_float_tensor("logits", logits, None, "(..., C)")
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex():
        got = f"dtype {target.dtype}" if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"`target` must be an integer tensor of shape {tuple(logits.shape)[:-1]}; got {got}")
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"`target` must have the shape of `logits` without its last dimension {tuple(logits.shape)[:-1]}; "
            f"got {tuple(target.shape)}"
        )
    if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"`label_smoothing` must be a number in [0, 1]; got {label_smoothing!r}")

    flat_target = target.reshape(-1).long()
    acc = acc_dtype(logits.dtype)
    per_token = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).to(acc),
        flat_target,
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=label_smoothing,
    )
    return per_token.to(acc).sum(), as_count((flat_target != ignore_index).sum(), logits)


def token_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Mean cross-entropy over the non-ignored tokens; ``0`` with zero gradient if all are ignored.

    Args:
        logits: unnormalized scores (..., C), the class dimension last.
        target: class indices (...).
        ignore_index: target value of tokens to skip (padding). Default ``-100``.
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.

    Returns:
        A 0-d tensor (float64 for float64 logits, else float32).

    Raises:
        ValueError: ``target`` that is not an integer tensor of ``logits``' shape without its last dimension,
            or a ``label_smoothing`` outside ``[0, 1]``.

    Example:
        >>> import torch
        >>> token_cross_entropy(torch.zeros(1, 2, 2), torch.tensor([[0, -100]]))
        tensor(0.6931)
    """
    return safe_divide(*token_cross_entropy_block(logits, target, ignore_index, label_smoothing))
