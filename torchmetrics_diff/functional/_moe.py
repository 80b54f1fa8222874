"""Mixture-of-Experts router losses, their local maths: the load-balancing loss and the router z-loss.

Load balancing (Switch Transformer, Fedus et al. 2022, eq. 4-6; GShard): with ``E`` experts, ``k`` experts chosen
per token and ``N`` tokens,

    loss = E · Σ_i f_i · P_i,   f_i = (assignments to expert i) / (k · N),   P_i = (Σ_t p_{t,i}) / N,

``f`` carries no gradient (it counts a discrete choice), ``P`` does. Both are ratios of sums over tokens, so their
*sufficient statistics* — per-expert routed counts, per-expert probability sums and the token count — add up over
ranks and micro-batches (:func:`load_balancing_stats`); the loss is a function of the summed statistics
(:func:`load_balancing_from_stats`). Several MoE layers are one call with a leading layer dimension: the loss is
the mean of the layers' losses.

Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): the mean over tokens of ``logsumexp(logits)²``; its block form
:func:`router_z_block` returns ``(sum, count)`` like the normalized losses.

The ``global_*`` forms (in ``torchmetrics_diff._global.moe``) take each rank's local tensors and return the loss of
every rank's tokens under the gradient contract (:ref:`architecture-gradient-contract`): one all-reduce of the
statistics of every layer at once, then the gradient reaches this rank's probabilities through its own share, scaled
for the trainer's averaging.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_diff.functional._checks import (
    acc_dtype,
    check_positive_int,
    check_values,
    safe_divide,
)

#: the choices of ``probs_over``: where ``P`` (the mean router probability) is taken
PROBS_OVER = ("global", "local")


class LoadBalancingStats(NamedTuple):
    """The sufficient statistics of the load-balancing loss of one or several layers (sums over tokens).

    Statistics of disjoint token sets add up. Every field is in the accumulation dtype of the probabilities (at
    least float32).

    Attributes:
        counts: the assignments routed to each expert (detached), shape ``(E,)``, or ``(L, E)`` for ``L`` layers.
        prob_sums: the sum over the tokens of each expert's router probability (with the probabilities' graph),
            shape ``(E,)`` or ``(L, E)``.
        tokens: the number of (unmasked) tokens, 0-d, or ``(L,)``.
    """

    counts: Tensor
    prob_sums: Tensor
    tokens: Tensor


# ------------------------------------------------------------------------------------------------ checks
def _layers(name: str, x: object, floating: bool, width: int | None, layout: str) -> Tensor:
    """``x`` as a 3-d ``(L, T, width)`` tensor (a 2-d input is one layer), or a ``ValueError`` naming ``name``."""
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a tensor of shape {layout}; got {type(x).__name__}")
    kind_ok = (
        x.is_floating_point() if floating else not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    )
    if x.ndim not in (2, 3) or not kind_ok:
        kind = "a floating-point" if floating else "an integer"
        raise ValueError(
            f"`{name}` must be {kind} tensor of shape {layout}; got shape {tuple(x.shape)} and dtype {x.dtype}"
        )
    if width is not None and x.shape[-1] != width:
        raise ValueError(
            f"`{name}` must have {width} entries in its last dimension {layout}; got shape {tuple(x.shape)}"
        )
    return x if x.ndim == 3 else x.unsqueeze(0)


def _check_mask(mask: Tensor | None, tokens: int, like: Tensor) -> Tensor:
    """A ``(T,)`` bool mask as a ``(1, T)`` float weight in ``like``'s dtype (all ones for ``None``)."""
    if mask is None:
        return torch.ones(1, tokens, dtype=like.dtype, device=like.device)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (tokens,):
        got = f"shape {tuple(mask.shape)} and dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"`mask` must be a bool tensor of shape ({tokens},) (one entry per token); got {got}")
    if mask.device != like.device:
        raise ValueError(f"`mask` must be on the device of the router tensors ({like.device}); got {mask.device}")
    return mask.to(like.dtype).unsqueeze(0)


# --------------------------------------------------------------------------------------------- load balancing
def load_balancing_stats(
    router_probs: Tensor,
    expert_indices: Tensor,
    num_experts: int,
    mask: Tensor | None = None,
    *,
    validate_args: bool = True,
) -> LoadBalancingStats:
    """The per-expert routed counts, per-expert probability sums and token count of a batch of tokens.

    Args:
        router_probs: the router's probabilities, ``(T, E)`` for one layer or ``(L, T, E)`` for ``L`` layers that
            see the same ``T`` tokens; any floating dtype (half precision is summed in float32).
        expert_indices: the experts each token is routed to, an integer tensor ``(T, k)`` or ``(L, T, k)``
            (``k`` = top-k; a top-1 router gives ``(T, 1)``).
        num_experts: ``E``, the number of experts.
        mask: bool ``(T,)``: ``False`` leaves a token out (padding); its probabilities and indices are not read.
            Default ``None``: every token.
        validate_args: check that the unmasked indices lie in ``[0, E)``. Default ``True``: one read of a flag
            back to the host (``False`` skips it; an index out of range then fails inside ``scatter_add``).

    Returns:
        :class:`LoadBalancingStats` ``(counts, prob_sums, tokens)``, without the layer dimension for 2-d inputs.

    Raises:
        ValueError: tensors of the wrong rank, kind or width; shapes that disagree; a bad mask; an index out of
            range (with ``validate_args``).

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.9, 0.1]])
        >>> stats = load_balancing_stats(probs, torch.tensor([[0], [1], [0]]), num_experts=2)
        >>> stats.counts, stats.prob_sums, stats.tokens
        (tensor([2., 1.]), tensor([2., 1.]), tensor(3.))
    """
    num_experts = check_positive_int("num_experts", num_experts)
    layout = "(T, E) or (L, T, E)"
    probs = _layers("router_probs", router_probs, True, num_experts, layout)
    index = _layers("expert_indices", expert_indices, False, None, "(T, k) or (L, T, k)")
    if expert_indices.ndim != router_probs.ndim or index.shape[:2] != probs.shape[:2]:
        raise ValueError(
            f"`expert_indices` must have the layers and tokens of `router_probs` {tuple(router_probs.shape[:-1])} "
            f"before its last dimension (k); got shape {tuple(expert_indices.shape)}"
        )
    if index.device != probs.device:
        raise ValueError(
            f"`expert_indices` must be on the device of `router_probs` ({probs.device}); got {index.device}"
        )
    acc = acc_dtype(probs.dtype)
    n_layers, n_tokens, top_k = index.shape
    weight = _check_mask(mask, n_tokens, probs.to(acc))  # (1, T)
    if validate_args:
        bad = ((index < 0) | (index >= num_experts)) & (weight.unsqueeze(-1) > 0)
        check_values(
            bad,
            f"`expert_indices` must lie in [0, {num_experts - 1}] (num_experts={num_experts})",
            lambda: f"found {index[bad][:5].tolist()}",
        )
    if mask is not None:  # a masked token's index is never read: padding may hold anything
        index = torch.where(mask.view(1, -1, 1), index, torch.zeros_like(index))
    assignments = weight.unsqueeze(-1).expand(n_layers, n_tokens, top_k).reshape(n_layers, -1)
    counts = torch.zeros(n_layers, num_experts, dtype=acc, device=probs.device)
    counts.scatter_add_(1, index.reshape(n_layers, -1).long(), assignments)
    masked = (
        probs.to(acc) * weight.unsqueeze(-1)
        if mask is None
        else torch.where(mask.view(1, -1, 1), probs.to(acc), torch.zeros((), dtype=acc, device=probs.device))
    )
    prob_sums = masked.sum(dim=1)
    tokens = weight.sum(dim=1).expand(n_layers)
    if router_probs.ndim == 2:
        return LoadBalancingStats(counts[0], prob_sums[0], tokens[0])
    return LoadBalancingStats(counts, prob_sums, tokens.clone())


def expert_load(counts: Tensor, tokens: Tensor, top_k: int) -> Tensor:
    """``f``: the fraction of the ``k · N`` routing assignments that went to each expert (0 without tokens).

    Args:
        counts: ``(E,)`` or ``(L, E)`` routed counts (the ``counts`` of :class:`LoadBalancingStats`).
        tokens: ``()`` or ``(L,)`` token counts.
        top_k: ``k``.

    Returns:
        ``counts / (k · tokens)``, detached: each layer's row sums to 1 (or is 0 without tokens).

    Example:
        >>> import torch
        >>> expert_load(torch.tensor([3.0, 1.0]), torch.tensor(2.0), top_k=2)
        tensor([0.7500, 0.2500])
    """
    top_k = check_positive_int("top_k", top_k)
    return safe_divide(counts.detach(), (tokens.detach() * top_k).unsqueeze(-1))


def load_balancing_from_stats(counts: Tensor, prob_sums: Tensor, tokens: Tensor, top_k: int) -> Tensor:
    """``E · Σ_i f_i · P_i`` from summed statistics (the mean over layers for ``(L, E)`` statistics).

    Args:
        counts: ``(E,)`` or ``(L, E)`` routed counts.
        prob_sums: per-expert probability sums, the shape of ``counts``, with their graph.
        tokens: ``()`` or ``(L,)`` token counts.
        top_k: ``k``, the experts per token.

    Returns:
        The 0-d loss; ``f`` (from ``counts``) carries no gradient. A layer without tokens contributes 0.

    Example:
        >>> import torch
        >>> load_balancing_from_stats(torch.tensor([2.0, 2.0]), torch.tensor([2.0, 2.0]), torch.tensor(4.0), 1)
        tensor(1.)
    """
    num_experts = counts.shape[-1]
    probs = safe_divide(prob_sums, tokens.unsqueeze(-1).to(prob_sums.dtype))
    per_layer = num_experts * (expert_load(counts, tokens, top_k).to(probs.dtype) * probs).sum(dim=-1)
    return per_layer.mean()


def load_balancing_loss(
    router_probs: Tensor,
    expert_indices: Tensor,
    num_experts: int,
    mask: Tensor | None = None,
    *,
    validate_args: bool = True,
) -> Tensor:
    """The Switch Transformer load-balancing loss of tensors that hold the whole batch.

    ``E · Σ_i f_i · P_i`` with ``f_i`` the fraction of the ``k · N`` assignments routed to expert ``i`` (no
    gradient) and ``P_i`` the mean router probability of expert ``i`` over the ``N`` tokens; for ``(L, T, E)``
    inputs the mean of the ``L`` layers' losses. A perfectly balanced router scores 1, whatever ``k``.

    Args:
        router_probs: ``(T, E)`` or ``(L, T, E)`` router probabilities, any floating dtype.
        expert_indices: ``(T, k)`` or ``(L, T, k)`` integer indices of the chosen experts; ``k`` is read from it.
        num_experts: ``E``.
        mask: bool ``(T,)``, ``False`` for padding. Default ``None``.
        validate_args: check the indices' range (one host read). Default ``True``.

    Returns:
        A 0-d tensor, float64 for float64 probabilities, else float32.

    Raises:
        ValueError: as :func:`load_balancing_stats`.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        >>> load_balancing_loss(probs, torch.tensor([[0], [1]]), num_experts=2)  # balanced: 1
        tensor(1.)
        >>> load_balancing_loss(probs, torch.tensor([[0], [0]]), num_experts=2)  # all on expert 0
        tensor(1.)
        >>> load_balancing_loss(torch.tensor([[0.9, 0.1], [0.8, 0.2]]), torch.tensor([[0], [0]]), num_experts=2)
        tensor(1.7000)
    """
    stats = load_balancing_stats(router_probs, expert_indices, num_experts, mask, validate_args=validate_args)
    return load_balancing_from_stats(*stats, top_k=expert_indices.shape[-1])


# --------------------------------------------------------------------------------------------------- z-loss
def router_z_block(router_logits: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(Σ_tokens logsumexp(logits)² / L, N)``: the router z-loss's sum and its token count.

    Args:
        router_logits: ``(T, E)`` or ``(L, T, E)`` router logits, any floating dtype (half precision: the
            log-sum-exp is taken in float32).
        mask: bool ``(T,)``, ``False`` for padding (excluded with ``torch.where``: non-finite padding is harmless).
            Default ``None``.

    Returns:
        0-d ``(loss_sum, count)`` in at least float32: over ``L`` layers the sum is divided by ``L``, so that
        ``loss_sum / count`` is the mean of the layers' z-losses and blocks of tokens add up.

    Raises:
        ValueError: logits that are not a floating ``(T, E)`` or ``(L, T, E)`` tensor, or a bad mask.

    Example:
        >>> import torch
        >>> router_z_block(torch.zeros(3, 4), mask=torch.tensor([True, True, False]))  # log(4)^2 per token
        (tensor(3.8436), tensor(2.))
    """
    logits = _layers("router_logits", router_logits, True, None, "(T, E) or (L, T, E)")
    acc = acc_dtype(logits.dtype)
    n_layers, n_tokens, _ = logits.shape
    weight = _check_mask(mask, n_tokens, logits.to(acc))[0]
    z = torch.logsumexp(logits.to(acc), dim=-1)
    if mask is not None:
        z = torch.where(mask.unsqueeze(0), z, torch.zeros((), dtype=acc, device=z.device))
    return z.square().sum() / n_layers, weight.sum()


def router_z_loss(router_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """The ST-MoE router z-loss of tensors that hold the whole batch: the mean of ``logsumexp(logits)²``.

    Args:
        router_logits: ``(T, E)`` or ``(L, T, E)`` (the mean over the layers' losses), any floating dtype.
        mask: bool ``(T,)``, ``False`` for padding. Default ``None``.

    Returns:
        A 0-d tensor, float64 for float64 logits, else float32; 0 without tokens.

    Raises:
        ValueError: as :func:`router_z_block`.

    Example:
        >>> import torch
        >>> router_z_loss(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))  # (log 2)^2 and (1 + log 2)^2
        tensor(1.6736)
    """
    return safe_divide(*router_z_block(router_logits, mask))
