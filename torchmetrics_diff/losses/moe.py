"""Mixture-of-Experts router losses over the global batch: Switch/GShard load balancing and the ST-MoE z-loss.

Both are ratios of sums over tokens, so they take the shape of :class:`~.normalized.GlobalMeanLoss`: one
all-reduce of every layer's statistics per call, the exact gradient of the global objective, and
:meth:`~.normalized.GlobalMeanLoss.accumulate` for the micro-batches of one optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from torchmetrics_diff import functional as F
from torchmetrics_diff._batch_step import record_step
from torchmetrics_diff._global.moe import load_balancing_global_step
from torchmetrics_diff._global.strategy import checked_together
from torchmetrics_diff.functional._checks import check_choice, check_positive_int
from torchmetrics_diff.functional._moe import PROBS_OVER, load_balancing_stats
from torchmetrics_diff.losses._base import named_call, note_value_dtype
from torchmetrics_diff.losses.normalized import GlobalMeanLoss


class LoadBalancingLoss(GlobalMeanLoss):
    """The Switch Transformer / GShard auxiliary loss ``E · Σ_i f_i · P_i`` over every rank's tokens.

    Called as ``loss(router_probs, expert_indices, mask=None)`` with this rank's router probabilities ``(T, E)``
    and chosen experts ``(T, k)`` — or ``(L, T, E)`` and ``(L, T, k)`` for ``L`` MoE layers in one call, whose
    value is the mean of the layers' losses and whose statistics travel in **one** all-reduce whatever ``L``.
    ``f_i`` is the fraction of the ``k·N`` routing assignments of the global batch that went to expert ``i``
    (every rank's tokens, and every micro-batch so far inside :meth:`accumulate`); it carries no gradient.
    ``P_i`` is the mean router probability of expert ``i``: over every rank's tokens (``probs_over="global"``,
    the loss of the concatenated batch), or over this rank's micro-batch (``"local"``, the global-batch balancing
    of Qwen's "Demons in the Detail": the value is then the mean over ranks of the ranks' losses). A perfectly
    balanced router scores 1.

    The value is identical on every rank, and its gradient is the one-big-device gradient
    (:ref:`architecture-gradient-contract`). :attr:`expert_load` holds the last call's global ``f`` (detached) for
    logging; :meth:`compute` returns the mean of the optimizer steps' losses.

    Args:
        num_experts: ``E``.
        top_k: ``k``, the experts each token is routed to (the last dimension of ``expert_indices``).
        probs_over: ``"global"`` (default) or ``"local"``, where ``P`` is taken (see above and :doc:`/losses/moe`).
        validate_args: check that the indices lie in ``[0, E)`` (one read of a flag back to the host per call).
            Default ``True``.
        dist_sync_on_step: ``f`` and ``P`` over every rank's tokens (default ``True``); ``False``: this rank's.
        kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``, ``grad_reduction``...).

    Raises:
        ValueError: a bad ``num_experts``, ``top_k`` or ``probs_over``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import LoadBalancingLoss
        >>> loss = LoadBalancingLoss(num_experts=2, top_k=1)
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]])
        >>> loss(probs, torch.tensor([[0], [0], [1]]))  # f = (2/3, 1/3), P = (2/3, 1/3): 2 * 5/9
        tensor(1.1111)
        >>> loss.expert_load
        tensor([0.6667, 0.3333])
    """

    _same_dtype = ("router_probs",)
    _not_flat = (
        "the loss E·Σ f_i·P_i multiplies two global means, so the micro-batches' unnormalized sums cannot be "
        "normalized afterwards"
    )

    def __init__(
        self,
        num_experts: int,
        top_k: int = 1,
        *,
        probs_over: str = "global",
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = check_positive_int("top_k", top_k)
        if self.top_k > self.num_experts:
            raise ValueError(f"`top_k` must be at most `num_experts` ({num_experts}); got {top_k}")
        self.probs_over = check_choice("probs_over", probs_over, PROBS_OVER)
        self.validate_args = bool(validate_args)
        self._load: Tensor | None = None
        # inside accumulate(): the global counts and tokens of the step's earlier micro-batches, and k
        self._seen: tuple[Tensor, Tensor] | None = None
        self._micro_batches = 1

    @property
    def expert_load(self) -> Tensor | None:
        """``f`` of the last call, detached: ``(E,)``, or ``(L, E)`` for layered inputs; each row sums to 1.

        The fraction of the routing assignments of every rank's tokens that went to each expert (inside
        :meth:`accumulate`, of every micro-batch of the step so far). ``None`` before the first call; no
        communication (it was part of the call's all-reduce).
        """
        return self._load

    @contextmanager
    def accumulate(self, items: Sequence[Any] | None = None, *, total: float | Tensor | None = None) -> Iterator[None]:
        """The micro-batches of one optimizer step: ``f`` over all of them so far, ``P`` over the step's tokens.

        Inside the block, each call's ``f`` counts the assignments of every micro-batch of the step so far on
        every rank (the last call's ``f`` is the whole step's), ``P``'s denominator is the step's token count
        on every rank, and each call returns its share of the step's loss. With ``probs_over="local"`` the
        shares are the ranks' mean losses divided by the number of micro-batches.

        Args:
            items: what each micro-batch of this rank will pass as ``mask`` (or its token count, an int), one
                per micro-batch: their global total is ``P``'s denominator. Required with ``"local"`` (their
                number divides the shares).
            total: the step's global token count itself (no collective).

        Raises:
            ValueError: neither or both of ``items`` and ``total``; ``total`` with ``probs_over="local"``.
            RuntimeError: on leaving the block, when the calls inside did not add up to the planned tokens.
        """
        if self.probs_over == "local" and items is None:
            raise ValueError("accumulate() with probs_over='local' needs `items` (one per micro-batch); got `total`")
        self._seen, self._micro_batches = None, 1 if items is None else max(1, len(items))
        try:
            with super().accumulate(items, total=total):
                yield
                self._add_block(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64))
        finally:
            self._seen, self._micro_batches = None, 1

    def forward(  # type: ignore[override]
        self, router_probs: Tensor, expert_indices: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """This call's loss (its share of the step's loss inside :meth:`accumulate`), differentiable.

        Args:
            router_probs: this rank's ``(T, E)`` or ``(L, T, E)`` router probabilities, any floating dtype
                (half precision is computed in float32). ``T`` may differ between ranks, and be 0.
            expert_indices: ``(T, k)`` or ``(L, T, k)`` integer indices of the chosen experts.
            mask: bool ``(T,)``, ``False`` for padding tokens. Default ``None``.

        Returns:
            The 0-d loss, identical on every rank: float64 for float64 probabilities, else float32.

        Raises:
            ValueError: wrong shapes, dtypes or devices, ``k != top_k``, an index out of range; under sync on
                every rank (the others raise a ``RuntimeError`` naming this one).
        """
        return self._step(router_probs=router_probs, expert_indices=expert_indices, mask=mask)

    def update(  # type: ignore[override]
        self, router_probs: Tensor, expert_indices: Tensor, mask: Tensor | None = None
    ) -> None:
        """Record the loss of a batch without gradient (it communicates like a call); arguments as in :meth:`forward`.

        Args:
            router_probs: as for :meth:`forward`.
            expert_indices: as for :meth:`forward`.
            mask: as for :meth:`forward`.
        """
        self._update_from(router_probs=router_probs, expert_indices=expert_indices, mask=mask)

    def _stats(self, router_probs: Tensor, expert_indices: Tensor, mask: Tensor | None) -> F.LoadBalancingStats:
        if isinstance(expert_indices, Tensor) and expert_indices.ndim >= 1 and expert_indices.shape[-1] != self.top_k:
            raise ValueError(
                f"`expert_indices` must have top_k={self.top_k} entries in its last dimension; got shape "
                f"{tuple(expert_indices.shape)}"
            )
        return load_balancing_stats(
            router_probs, expert_indices, self.num_experts, mask, validate_args=self.validate_args
        )

    def _value(self, inputs: dict[str, Any], method: str) -> tuple[Tensor, Tensor]:
        """The call's value and its local token count: checks (failing on every rank), one all-reduce."""
        return named_call(self, method, self._global_value, inputs)

    def _global_value(self, inputs: dict[str, Any]) -> tuple[Tensor, Tensor]:
        if self._step_syncs():
            with checked_together(self.process_group, inputs["router_probs"]):
                self._check_inputs(inputs)
                stats = self._stats(**inputs)
        else:
            self._check_inputs(inputs)
            stats = self._stats(**inputs)
        total = None if self._accumulation is None else self._accumulation[0]
        step = load_balancing_global_step(
            stats,
            self.top_k,
            probs_over=self.probs_over,
            seen=self._seen,
            total=total,
            micro_batches=self._micro_batches,
            group=self.process_group,
            grad_reduction=self.grad_reduction,
            sync=self.dist_sync_on_step,
        )
        if self._accumulation is not None:
            self._seen = (step.counts, step.tokens)
        load = F.expert_load(step.counts, step.tokens, self.top_k)
        self._load = load[0] if inputs["router_probs"].ndim == 2 else load
        return step.value, stats.tokens

    def _step(self, **inputs: Any) -> Tensor:
        """``forward``'s body, a step of the batch-step protocol (``_batch_step.record_step``): the step's value
        is recorded once every rank has it (a failing call leaves nothing to undo)."""
        if self._is_synced:
            raise self._synced_error("forward")
        value, tokens = self._value(inputs, "forward")
        return record_step(self, value, lambda: self._record(value, tokens))

    def _update_from(self, **inputs: Any) -> None:
        value, tokens = self._value(inputs, "update")
        self._record(value, tokens)

    def _record(self, value: Tensor, tokens: Tensor) -> None:
        # one optimizer step per call, or per accumulate() block (counted when the block opens)
        steps = 0.0 if self._accumulation is not None else 1.0
        self._add_block(value.detach(), torch.tensor(steps, dtype=torch.float64))
        note_value_dtype(self, value)
        if self._accumulation is not None:
            self._accumulation[2] += float(tokens.reshape(-1)[0]) if tokens.numel() else 0.0

    def compute(self) -> Tensor:
        """The mean of the optimizer steps' losses since the last reset (every rank's, when ``sync_on_compute``).

        Each call outside :meth:`accumulate`, and each block, is one step. Every rank records the same global
        values, so the synced mean is the mean over steps.
        """
        return super().compute()


class RouterZLoss(GlobalMeanLoss):
    """The ST-MoE router z-loss: the mean over every rank's tokens of ``logsumexp(router_logits)²``.

    Called as ``loss(router_logits, mask=None)`` with this rank's ``(T, E)`` logits, or ``(L, T, E)`` for ``L``
    MoE layers (the mean of the layers' losses, one all-reduce for all of them). The denominator is the token
    count of every rank — of every micro-batch of the optimizer step inside
    :meth:`~GlobalMeanLoss.accumulate`, whose ``items`` are the micro-batches' masks (or token counts). The value is
    identical on every rank, with the one-big-device gradient; ``compute()`` is the mean over every token seen.

    Args:
        dist_sync_on_step: normalize by the token count of every rank (default ``True``); ``False``: this rank's
            mean.
        kwargs: :class:`GlobalMeanLoss` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import RouterZLoss
        >>> loss = RouterZLoss()
        >>> loss(torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]]), mask=torch.tensor([True, True, False]))
        tensor(1.6736)
    """

    _same_dtype = ("router_logits",)

    def forward(self, router_logits: Tensor, mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """This call's loss (its share of the step's loss inside :meth:`~GlobalMeanLoss.accumulate`).

        Args:
            router_logits: this rank's ``(T, E)`` or ``(L, T, E)`` router logits, any floating dtype (half
                precision: the log-sum-exp is taken in float32).
            mask: bool ``(T,)``, ``False`` for padding tokens. Default ``None``.

        Returns:
            The mean z-loss over every rank's tokens, identical on every rank: 0-d, float64 for float64 logits,
            else float32; 0 without tokens.

        Raises:
            ValueError: logits that are not a floating ``(T, E)`` / ``(L, T, E)`` tensor, or a bad mask; under sync
                on every rank.
        """
        return self._step(router_logits=router_logits, mask=mask)

    def update(self, router_logits: Tensor, mask: Tensor | None = None) -> None:  # type: ignore[override]
        """Accumulate a batch's z-loss sum and token count (no gradient); arguments as in :meth:`forward`.

        Args:
            router_logits: as for :meth:`forward`.
            mask: as for :meth:`forward`.
        """
        self._update_from(router_logits=router_logits, mask=mask)

    def _block(self, router_logits: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return F.router_z_block(router_logits, mask)
