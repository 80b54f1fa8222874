"""The cosine similarity and the KL divergence as pure functions: a value per row, then reduced (summed, averaged,
or kept per row: without reduction the KL divergence is not a sum, and its metric keeps the rows). The validation
helpers are in ``_regression``.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._errors import ShapeMismatchError
from torchmetrics_diff.functional._regression import _as_float, _check_pair

COSINE_REDUCTIONS = ("sum", "mean", "none", None)


# ------------------------------------------------------------------------------------------ cosine similarity
def cosine_similarity_rows(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-row cosine similarity ``⟨p, t⟩ / (|p| |t|)`` of two ``(N, D)`` tensors (NaN for a zero row)."""
    _check_pair(preds, target)
    if preds.ndim != 2:
        raise ValueError(f"`preds` and `target` must be 2-D (N, D); got shape {tuple(preds.shape)}")
    p, t = _as_float(preds), _as_float(target)
    return (p * t).sum(-1) / (p.norm(dim=-1) * t.norm(dim=-1))


def check_cosine_reduction(reduction: str | None) -> None:
    """``reduction`` one of :data:`COSINE_REDUCTIONS`."""
    if reduction not in COSINE_REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {COSINE_REDUCTIONS}; got {reduction!r}")


def cosine_similarity(preds: torch.Tensor, target: torch.Tensor, reduction: str | None = "sum") -> torch.Tensor:
    """Cosine similarity ``⟨p, t⟩ / (|p| |t|)`` of the rows of a batch, summed, averaged or per row.

    The functional form of :class:`~torchmetrics_diff.CosineSimilarity`; no collective; differentiable.

    Args:
        preds: predictions of shape ``(N, D)``, real floating or integer.
        target: targets of shape ``(N, D)``.
        reduction: ``"sum"`` (default) over the rows, ``"mean"``, or ``"none"``/``None`` (one value per row).

    Returns:
        0-d, or shape ``(N,)`` without reduction; a zero row gives NaN.
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: tensors that are not of one ``(N, D)`` shape, complex or boolean tensors, or an unknown
            ``reduction``.

    Example:
        >>> import torch
        >>> cosine_similarity(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        tensor(1.7071)
    """
    check_cosine_reduction(reduction)
    sims = cosine_similarity_rows(preds, target)
    if reduction == "sum":
        return sims.sum()
    if reduction == "mean":
        return sims.mean()
    return sims


# ------------------------------------------------------------------------------------------- KL divergence
KL_REDUCTIONS = ("mean", "sum", "none", None)


def check_kl_args(log_prob: Any, reduction: Any) -> None:
    """``log_prob`` a bool, ``reduction`` one of :data:`KL_REDUCTIONS`."""
    if not isinstance(log_prob, bool):
        raise ValueError(f"`log_prob` must be a bool; got {log_prob!r}")
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {KL_REDUCTIONS}; got {reduction!r}")


def kl_divergence_rows(p: torch.Tensor, q: torch.Tensor, log_prob: bool = False) -> torch.Tensor:
    """``KL(p_i ‖ q_i)`` of each row of two ``(N, D)`` distributions, shape ``(N,)``.

    With ``log_prob=False`` each row is first divided by its sum; a term with ``p = 0`` is 0 (with a zero
    gradient), one with ``p > 0`` and ``q = 0`` is ``inf``. With ``log_prob=True`` the rows are log-probabilities
    and the divergence is ``Σ exp(p) (p - q)``.
    """
    for name, value in (("p", p), ("q", q)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(value).__name__}")
        if value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"`{name}` must be a real floating or integer tensor; got dtype {value.dtype}")
        if value.ndim != 2:
            raise ValueError(f"`{name}` must be a 2-D (N, D) distribution; got shape {tuple(value.shape)}")
    if p.shape != q.shape:
        raise ShapeMismatchError(f"`p` and `q` must have the same shape; got p {tuple(p.shape)} and q {tuple(q.shape)}")
    if not isinstance(log_prob, bool):
        raise ValueError(f"`log_prob` must be a bool; got {log_prob!r}")
    p, q = _as_float(p), _as_float(q)
    if log_prob:
        return (p.exp() * (p - q)).sum(-1)
    p = p / p.sum(-1, keepdim=True)
    q = q / q.sum(-1, keepdim=True)
    present = p > 0
    safe_p = torch.where(present, p, torch.ones_like(p))  # log(0) is not evaluated: no NaN in the gradient
    return torch.where(present, p * torch.log(safe_p / q), torch.zeros_like(p)).sum(-1)


def kl_divergence(
    p: torch.Tensor, q: torch.Tensor, log_prob: bool = False, reduction: str | None = "mean"
) -> torch.Tensor:
    """Kullback-Leibler divergence ``KL(p ‖ q) = Σ_d p_d log(p_d / q_d)`` of each row pair, reduced over rows.

    The functional form of :class:`~torchmetrics_diff.KLDivergence`; no collective; differentiable.

    Args:
        p: the data distributions, shape ``(N, D)``, real floating (or integer counts): probabilities (each row
            is divided by its sum) or, with ``log_prob=True``, log-probabilities.
        q: the approximating distributions, shape ``(N, D)``, given as ``p`` is.
        log_prob: ``True`` if ``p`` and ``q`` are log-probabilities. Default ``False``.
        reduction: ``"mean"`` (default) over the rows, ``"sum"``, or ``"none"``/``None`` (one value per row).

    Returns:
        0-d, or shape ``(N,)`` without reduction; ``mean`` of no rows is NaN. A row where ``q`` is 0 and ``p``
        is not gives ``inf``. The dtype is the inputs' for float32 and float64 inputs, float32 for
        half-precision ones, the default dtype for integer ones.

    Raises:
        ValueError: tensors that are not of one ``(N, D)`` shape, complex or boolean tensors, a non-bool
            ``log_prob`` or an unknown ``reduction``.

    Example:
        >>> import torch
        >>> kl_divergence(torch.tensor([[0.36, 0.48, 0.16]]), torch.tensor([[1 / 3, 1 / 3, 1 / 3]]))
        tensor(0.0853)
    """
    check_kl_args(log_prob, reduction)
    rows = kl_divergence_rows(p, q, log_prob)
    if reduction == "mean":
        return rows.mean()
    if reduction == "sum":
        return rows.sum()
    return rows
