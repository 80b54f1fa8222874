"""The Mixture-of-Experts router losses over the global batch: load balancing and the router z-loss.

The statistics and the losses from them are ``functional._moe``'s. Here each ``global_*`` form takes this rank's
tensors and returns the loss of every rank's tokens under the gradient contract
(:ref:`architecture-gradient-contract`): one all-reduce of the statistics of every layer at once, then the gradient
reaches this rank's probabilities through its own share, scaled for the trainer's averaging.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torchmetrics_diff._global.strategy import check_grad_reduction, checked_together, grad_factor
from torchmetrics_diff.distributed import all_reduce
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.distributed._failure import RanksDisagreeError
from torchmetrics_diff.functional._checks import check_choice, safe_divide
from torchmetrics_diff.functional._moe import (
    PROBS_OVER,
    LoadBalancingStats,
    expert_load,
    load_balancing_stats,
    router_z_block,
)


def _sum_across_ranks(buffer: Tensor, group: Group, disagreement: str) -> Tensor:
    """``all_reduce(buffer, "sum", grad="none")``; a shape or dtype disagreement, which every rank sees in the
    collective's header, raises on every rank with ``disagreement`` saying what the inputs must agree on."""
    try:
        return all_reduce(buffer, "sum", group, grad="none")
    except RuntimeError as err:
        if "ranks disagree" not in str(err):
            raise
        raise RanksDisagreeError(f"{disagreement}; {err}") from err


# --------------------------------------------------------------------------------------------- load balancing
class LoadBalancingStep(NamedTuple):
    """What :func:`load_balancing_global_step` returns: the value and the global statistics behind ``f``."""

    value: Tensor  #: the 0-d loss (or this call's share of the step's loss), with the gradient contract
    counts: Tensor  #: ``(L, E)`` routed counts over every rank (and the earlier micro-batches given), detached
    tokens: Tensor  #: ``(L,)`` tokens those counts came from, detached


def load_balancing_global_step(
    stats: LoadBalancingStats,
    top_k: int,
    *,
    probs_over: str = "global",
    seen: tuple[Tensor, Tensor] | None = None,
    total: Tensor | float | None = None,
    micro_batches: int = 1,
    group: Group = None,
    grad_reduction: str = "mean",
    sync: bool = True,
) -> LoadBalancingStep:
    """The global load-balancing loss from this rank's (layered) statistics, in one all-reduce.

    The building block of :func:`global_load_balancing_loss` and of
    :class:`~torchmetrics_diff.losses.LoadBalancingLoss`'s gradient accumulation: ``seen`` are the global counts
    and tokens of earlier micro-batches of the step (``f`` then covers them too), ``total`` the step's global
    token count (``P``'s denominator with ``probs_over="global"``), ``micro_batches`` the ``k`` that divides a
    ``"local"`` share. ``sync=False`` (or one rank): no collective, this rank's tokens are the global batch.

    Returns:
        :class:`LoadBalancingStep`.
    """
    check_grad_reduction(grad_reduction)
    probs_over = check_choice("probs_over", probs_over, PROBS_OVER)
    counts, prob_sums, tokens = (s if s.ndim == (2 if i < 2 else 1) else s.unsqueeze(0) for i, s in enumerate(stats))
    n_layers, num_experts = counts.shape
    acc = prob_sums.dtype
    local_probs = safe_divide(prob_sums.detach(), tokens.unsqueeze(-1))
    parts = [counts.detach(), prob_sums.detach(), tokens.detach().unsqueeze(-1)]
    if probs_over == "local":
        parts.append(local_probs)
    buffer = torch.cat(parts, dim=1).to(acc)  # (L, 2E + 1 [+ E]): every layer in one collective
    world = group_size(group) if sync else 1
    if world > 1:
        buffer = _sum_across_ranks(
            buffer,
            group,
            "the ranks' router inputs disagree: every rank must pass the same number of layers and experts and "
            "probabilities of one accumulation dtype (float64, or float32 and half precision)",
        )
    g_counts, g_sums, g_tokens = (
        buffer[:, :num_experts],
        buffer[:, num_experts : 2 * num_experts],
        buffer[:, 2 * num_experts],
    )
    if seen is not None:
        g_counts, g_tokens = g_counts + seen[0], g_tokens + seen[1]
    load = expert_load(g_counts, g_tokens, top_k)  # (L, E), f over every rank (and micro-batch) so far
    factor = grad_factor(world, grad_reduction)
    if probs_over == "global":
        denominator = g_tokens if total is None else torch.full_like(g_tokens, float(total))
        denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator)).unsqueeze(-1)
        coefficient = num_experts * load / denominator / n_layers  # d value / d prob_sums
        value = (coefficient * g_sums).sum()
        share = (coefficient * prob_sums).sum() * factor
    else:  # the mean over ranks of each rank's E · Σ f_i P_i(local), divided over the step's micro-batches
        coefficient = num_experts * load / (n_layers * world * micro_batches)
        value = (coefficient * buffer[:, 2 * num_experts + 1 :]).sum()
        share = (coefficient * safe_divide(prob_sums, tokens.unsqueeze(-1))).sum() * factor
    value = value + (share - share.detach())
    return LoadBalancingStep(value, g_counts, g_tokens)


def global_load_balancing_loss(
    router_probs: Tensor,
    expert_indices: Tensor,
    num_experts: int,
    mask: Tensor | None = None,
    *,
    probs_over: str = "global",
    group: Group = None,
    grad_reduction: str = "mean",
    validate_args: bool = True,
) -> Tensor:
    """The load-balancing loss of every rank's tokens: ``f`` and ``P`` over the global batch, one all-reduce.

    Args:
        router_probs: this rank's ``(T, E)`` or ``(L, T, E)`` router probabilities (``T`` may differ between
            ranks, and be 0).
        expert_indices: this rank's ``(T, k)`` or ``(L, T, k)`` chosen experts.
        num_experts: ``E``.
        mask: bool ``(T,)``, ``False`` for padding. Default ``None``.
        probs_over: ``"global"`` (default): ``P`` over every rank's tokens — the loss of the concatenated batch.
            ``"local"``: the global-batch form of Qwen's "Demons in the Detail": ``f`` over every rank's tokens,
            ``P`` over this rank's, the value the mean over ranks of the ranks' losses.
        group: the process group. Default ``None``.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``. Default ``"mean"``.
        validate_args: check the indices' range (one host read). Default ``True``.

    Returns:
        The 0-d value, identical on every rank, differentiable with respect to the local probabilities: float64
        for float64 probabilities, else float32. Without a process group, or with one rank,
        :func:`load_balancing_loss` and no collective.

    Raises:
        ValueError: bad inputs (as :func:`load_balancing_stats`), ``probs_over`` or ``grad_reduction``; under a
            process group, on every rank.
        RuntimeError: on every rank, when the ranks' layer counts, expert counts or dtypes differ.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2]])
        >>> global_load_balancing_loss(probs, torch.tensor([[0], [0]]), num_experts=2)
        tensor(1.7000)
    """
    with checked_together(group, router_probs):
        check_grad_reduction(grad_reduction)
        check_choice("probs_over", probs_over, PROBS_OVER)
        stats = load_balancing_stats(router_probs, expert_indices, num_experts, mask, validate_args=validate_args)
    top_k = expert_indices.shape[-1]
    return load_balancing_global_step(
        stats, top_k, probs_over=probs_over, group=group, grad_reduction=grad_reduction
    ).value


# --------------------------------------------------------------------------------------------------- z-loss
def global_router_z_loss(
    router_logits: Tensor,
    mask: Tensor | None = None,
    *,
    total: Tensor | float | None = None,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """The router z-loss over every rank's tokens (divided by their global count, or by ``total``).

    Args:
        router_logits: this rank's ``(T, E)`` or ``(L, T, E)`` logits.
        mask: bool ``(T,)``, ``False`` for padding. Default ``None``.
        total: the global token count of the whole optimizer step, when accumulating gradients. Default ``None``.
        group: the process group. Default ``None``.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``. Default ``"mean"``.

    Returns:
        The 0-d value, identical on every rank, differentiable with respect to the local logits (float64 for
        float64 logits, else float32); 0 without tokens. One all-reduce of two numbers (and the call header).

    Raises:
        ValueError: bad logits, mask or ``grad_reduction``; under a process group, on every rank.

    Example:
        >>> import torch
        >>> global_router_z_loss(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        tensor(1.6736)
    """
    with checked_together(group, router_logits):
        check_grad_reduction(grad_reduction)
        loss_sum, count = router_z_block(router_logits, mask)
    world = group_size(group)
    if world == 1:
        denominator = count if total is None else torch.full_like(count, float(total))
        return safe_divide(loss_sum, denominator)
    totals = _sum_across_ranks(
        torch.stack([loss_sum.detach(), count]),
        group,
        "the ranks' router logits disagree: every rank must pass logits of one accumulation dtype (float64, or "
        "float32 and half precision)",
    )
    denominator = totals[1] if total is None else torch.full_like(totals[1], float(total))
    denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    share = loss_sum * grad_factor(world, grad_reduction) / denominator
    return totals[0] / denominator + (share - share.detach())
