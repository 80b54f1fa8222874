"""Perplexity over every rank's tokens: two ``sum`` states, so the global token count normalizes it."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._checks import check_ignore_index
from torchmetrics_diff.functional._text import perplexity_from_stats, perplexity_stats
from torchmetrics_diff.metric import Metric


class Perplexity(Metric):
    """Perplexity ``exp(Σ -log p(target) / N)`` over the tokens of every rank, ``N`` the *global* number of
    tokens whose target is not ``ignore_index``.

    ``update(preds, target)``: ``preds`` logits or log-probabilities ``(B, T, V)``, ``target`` ``(B, T)`` token
    ids. The states are ``total`` (``Σ -log p``, ``sum``) and ``count`` (``int64``, ``sum``), so the metric is
    differentiable: with ``dist_sync_on_step=True`` its value is the global-batch perplexity and its gradient,
    after DDP's averaging, the one-device gradient even when ranks hold different numbers of valid tokens.
    Log-probabilities come from a ``log_softmax`` (torchmetrics takes the log of a softmax: the same value up to
    rounding, without underflow to ``-inf`` for very unlikely tokens).

    Args:
        ignore_index: target id whose tokens are left out (e.g. padding). Default ``None``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a bad ``ignore_index``; in ``update``, wrong shapes, dtypes or ids out of range.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import Perplexity
        >>> metric = Perplexity(ignore_index=-100)
        >>> preds = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
        >>> metric.update(preds, torch.tensor([[0, 1, -100]]))
        >>> metric.compute()  # exp(-(log 0.5 + log 0.75) / 2)
        tensor(1.6330)
    """

    is_differentiable = True
    higher_is_better = False
    full_state_update = False
    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, ignore_index: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_ignore_index(ignore_index)
        self.ignore_index = ignore_index
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's negative log-likelihood and token count.

        Args:
            preds: logits or log-probabilities ``(B, T, V)``, floating.
            target: token ids ``(B, T)``, integer, in ``[0, V)`` or equal to ``ignore_index``.

        Raises:
            ValueError: wrong shapes or dtypes, or target ids out of range.
        """
        total, count = perplexity_stats(preds, target, self.ignore_index)
        self.total = self.total + total
        self.count = self.count + count.to(self.count.device)

    def compute(self) -> torch.Tensor:
        """Perplexity of every token seen (NaN before any)."""
        return perplexity_from_stats(self.total, self.count)
