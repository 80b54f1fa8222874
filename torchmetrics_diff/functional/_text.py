"""Perplexity as a pure function, split into the global-batch sums (``Σ -log p``, token count) and the value."""

from __future__ import annotations

import torch

from torchmetrics_diff.functional._checks import acc_dtype, check_ignore_index, check_values


def perplexity_stats(
    preds: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ -log p(target), number of tokens)`` over the tokens whose target is not ``ignore_index``.

    ``preds`` are logits or log-probabilities ``(B, T, V)`` (a log-softmax over ``V`` is applied; it leaves
    log-probabilities unchanged), ``target`` ``(B, T)`` token ids in ``[0, V)`` or ``ignore_index``. The sum is in
    at least float32 (half-precision ``preds`` get their log-softmax in float32).

    Raises:
        ValueError: wrong shapes or dtypes, or target ids out of range.
    """
    if not isinstance(preds, torch.Tensor) or preds.ndim != 3 or not preds.is_floating_point():
        shown: object = tuple(preds.shape) if isinstance(preds, torch.Tensor) else type(preds).__name__
        raise ValueError(f"`preds` must be a floating tensor of shape (B, T, V); got {shown}")
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.shape != preds.shape[:2]:
        shown = (tuple(target.shape), target.dtype) if isinstance(target, torch.Tensor) else type(target).__name__
        raise ValueError(f"`target` must be an integer tensor of shape {tuple(preds.shape[:2])} (B, T); got {shown}")
    check_ignore_index(ignore_index)
    vocab = preds.shape[-1]
    t = target.reshape(-1)
    keep = torch.ones_like(t, dtype=torch.bool) if ignore_index is None else t != ignore_index
    bad = keep & ((t < 0) | (t >= vocab))
    check_values(
        bad, f"`target` ids must lie in [0, {vocab - 1}] or be ignore_index", lambda: f"found {t[bad][:5].tolist()}"
    )
    # half-precision logits: the log-softmax in float32 (as autocast runs it), so the sum is float32 too
    log_probs = torch.log_softmax(preds.reshape(-1, vocab).to(acc_dtype(preds.dtype)), dim=-1)
    picked = log_probs.gather(1, torch.where(keep, t, 0).long()[:, None])[:, 0]
    # where, not a product: an ignored position may hold -inf (a masked vocabulary), and -inf * 0 is NaN
    return -torch.where(keep, picked, torch.zeros_like(picked)).sum(), keep.sum()


def perplexity_from_stats(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``exp(Σ -log p / count)`` (NaN without tokens)."""
    return torch.exp(total / count)


def perplexity(preds: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None) -> torch.Tensor:
    """Perplexity ``exp(mean -log p(target))`` of a batch of token predictions.

    The functional form of :class:`~torchmetrics_diff.Perplexity`; no collective; differentiable.

    Args:
        preds: logits or log-probabilities of shape ``(B, T, V)``, floating (a log-softmax over ``V`` is applied;
            it leaves log-probabilities unchanged; half-precision ``preds`` get it in float32).
        target: token ids of shape ``(B, T)``, integer, in ``[0, V)`` or equal to ``ignore_index``.
        ignore_index: target value whose tokens are left out. Default ``None``.

    Returns:
        A 0-d tensor, in the dtype of ``preds`` (float32 for half-precision ``preds``); NaN without tokens.

    Raises:
        ValueError: ``preds`` that is not a floating ``(B, T, V)`` tensor, ``target`` that is not an integer
            ``(B, T)`` tensor, or target ids out of range.

    Example:
        >>> import torch
        >>> preds = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))
        >>> perplexity(preds, torch.tensor([[0, 1]]))  # exp(-(log 0.5 + log 0.75) / 2)
        tensor(1.6330)
        >>> perplexity(preds, torch.tensor([[0, -100]]), ignore_index=-100)
        tensor(2.)
    """
    return perplexity_from_stats(*perplexity_stats(preds, target, ignore_index))
