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
    *,
    class_dim: int = -1,
    validate_args: bool = False,
) -> tuple[Tensor, Tensor]:
    """Sum of per-token cross-entropies over non-ignored tokens, and their number.

    Args:
        logits: unnormalized scores with the classes in dimension ``class_dim``: ``(..., C)`` by default (the
            language-model layout, ``(B, T, C)``), ``(B, C, ...)`` with ``class_dim=1`` (the layout of
            :func:`torch.nn.functional.cross_entropy`, ``(B, C, T)``).
        target: class indices, the shape of ``logits`` without dimension ``class_dim``.
        ignore_index: target value of tokens to skip (padding). Default ``-100``.
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.
        class_dim: the dimension of ``logits`` that holds the classes. Default ``-1``. The layout is taken from
            this argument, never guessed from the shapes: with ``T == C`` both layouts fit, and only
            ``class_dim`` says which dimension holds the classes.
        validate_args: check that every target is ``ignore_index`` or in ``[0, C)`` before computing, on any
            device: one reduction over ``target`` and a host synchronization per call. Default ``False``: on the
            CPU an out-of-range target raises the same error anyway (found when the cross-entropy fails, at no
            cost); on a GPU it trips an asynchronous device-side assert instead.

    Returns:
        ``(loss_sum, count)``: 0-d tensors in at least float32; ``count`` is the number of tokens whose target
        is not ``ignore_index``. Half-precision logits are cast to float32 first (what autocast does to
        ``cross_entropy``): the log-sum-exp over the classes is taken in float32, at the cost of a float32
        copy of the logits.

    Raises:
        ValueError: on mismatched shapes (naming the layout read from ``class_dim`` and the target shape it needs),
            a bad ``class_dim``, a non-integer target or ``label_smoothing`` outside ``[0, 1]``.
        IndexError: a target that is neither ``ignore_index`` nor in ``[0, C)``, naming it and the range (on the
            CPU always; on other devices with ``validate_args=True``).

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 4)  # (batch, sequence, classes): uniform predictions
        >>> target = torch.tensor([[1, 2, -100], [3, -100, -100]])
        >>> total, count = token_cross_entropy_block(logits, target)
        >>> count, torch.allclose(total, 3 * torch.log(torch.tensor(4.0)))
        (tensor(3.), True)
        >>> total_t, _ = token_cross_entropy_block(logits.transpose(1, 2), target, class_dim=1)  # (B, C, T)
        >>> torch.equal(total, total_t)
        True
    """
    check_float_tensor("logits", logits, None, "(..., C)" if class_dim == -1 else f"with classes in dim {class_dim}")
    if isinstance(class_dim, bool) or not isinstance(class_dim, int) or not -logits.ndim <= class_dim < logits.ndim:
        raise ValueError(
            f"`class_dim` must be a dimension of `logits` (shape {tuple(logits.shape)}): an int in "
            f"[{-logits.ndim}, {logits.ndim}); got {class_dim!r}"
        )
    dim = class_dim % logits.ndim
    expected = _without(logits.shape, dim)
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex():
        got = f"dtype {target.dtype}" if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"`target` must be an integer tensor of shape {expected}; got {got}")
    if tuple(target.shape) != expected:
        raise ValueError(_layout_error(tuple(logits.shape), tuple(target.shape), class_dim))
    if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"`label_smoothing` must be a number in [0, 1]; got {label_smoothing!r}")
    if dim != logits.ndim - 1:
        logits = logits.movedim(dim, -1)  # (a view: the cross-entropy below reads the classes last)

    classes = logits.shape[-1]
    flat_target = target.reshape(-1).long()
    if validate_args:
        _check_targets(flat_target, classes, ignore_index)
    acc = acc_dtype(logits.dtype)
    try:
        per_token = F.cross_entropy(
            logits.reshape(-1, classes).to(acc),
            flat_target,
            ignore_index=ignore_index,
            reduction="none",
            label_smoothing=label_smoothing,
        )
    except IndexError:  # (the CPU kernel's "Target 7 is out of bounds."): say which target and the valid range
        _check_targets(flat_target, classes, ignore_index)
        raise
    return per_token.to(acc).sum(), as_count((flat_target != ignore_index).sum(), logits)


def _without(shape: torch.Size | tuple[int, ...], dim: int) -> tuple[int, ...]:
    return tuple(shape[:dim]) + tuple(shape[dim + 1 :])


def _layout(ndim: int, dim: int) -> str:
    """``"(B, T, C)"`` for 3-d logits with the classes in dimension 2, ``"(B, C, T)"`` in dimension 1, ..."""
    others = {1: ["N"], 2: ["B", "T"]}.get(ndim - 1) or ["B"] + [f"d{i}" for i in range(1, ndim - 1)]
    others.insert(dim, "C")
    return f"({', '.join(others)})"


def _layout_error(logits: tuple[int, ...], target: tuple[int, ...], class_dim: int) -> str:
    """The shape error: the layout ``class_dim`` reads, the target shape it needs, and a ``class_dim`` that fits."""
    ndim, dim = len(logits), class_dim % len(logits)
    message = (
        f"`target` must have the shape of `logits` without its class dimension: `logits` of shape {logits} read "
        f"as {_layout(ndim, dim)} (class_dim={class_dim}) needs `target` of shape {_without(logits, dim)}; "
        f"got {target}"
    )
    fits = [d for d in range(ndim) if d != dim and _without(logits, d) == target]
    if fits:
        d = fits[0]
        name = " (the layout of torch's F.cross_entropy)" if d == 1 else ""
        message += f". It fits class_dim={d if d != ndim - 1 else -1}, logits {_layout(ndim, d)}{name}"
    return message


def _check_targets(target: Tensor, classes: int, ignore_index: int) -> None:
    """Raise ``IndexError`` naming a target that is neither ``ignore_index`` nor in ``[0, classes)`` (one masked
    reduction; reading its result synchronizes with the device)."""
    bad = (target != ignore_index) & ((target < 0) | (target >= classes))
    if bool(bad.any()):
        value = int(target[bad][0])
        raise IndexError(
            f"`target` holds {value}, outside the valid classes [0, {classes}) of `logits` (C = {classes}); "
            f"targets equal to ignore_index={ignore_index} are skipped"
        )


def token_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    *,
    class_dim: int = -1,
    validate_args: bool = False,
) -> Tensor:
    """Mean cross-entropy over the non-ignored tokens; ``0`` with zero gradient if all are ignored.

    Args:
        logits: unnormalized scores, the classes in dimension ``class_dim``: ``(..., C)`` by default.
        target: class indices, the shape of ``logits`` without dimension ``class_dim``.
        ignore_index: target value of tokens to skip (padding). Default ``-100``.
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.
        class_dim: the dimension of ``logits`` holding the classes: ``-1`` (default, ``(B, T, C)``) or ``1``
            (torch's ``(B, C, T)``); taken from this argument, never guessed (see :func:`token_cross_entropy_block`).
        validate_args: check the targets' range on any device (a host synchronization); see
            :func:`token_cross_entropy_block`. Default ``False``.

    Returns:
        A 0-d tensor (float64 for float64 logits, else float32).

    Raises:
        ValueError: ``target`` that is not an integer tensor of ``logits``' shape without dimension ``class_dim``,
            or a ``label_smoothing`` outside ``[0, 1]``.
        IndexError: a target outside ``[0, C)`` that is not ``ignore_index`` (see :func:`token_cross_entropy_block`).

    Example:
        >>> import torch
        >>> token_cross_entropy(torch.zeros(1, 2, 2), torch.tensor([[0, -100]]))
        tensor(0.6931)
    """
    block = token_cross_entropy_block(
        logits, target, ignore_index, label_smoothing, class_dim=class_dim, validate_args=validate_args
    )
    return safe_divide(*block)
