"""Regression metrics as pure functions, each split into sufficient statistics and a value computed from them: the
shared validation and the errors (squared, absolute, percentage). R², explained variance, Pearson and Spearman are
in ``_correlation``, the cosine similarity and the KL divergence in ``_similarity``.

Every statistic is a *sum* over rows, so the statistics of a global batch are the sums of every rank's
statistics: that is what lets the :mod:`torchmetrics_diff.regression` metrics sync with one ``all_reduce``-like
collective (``sum`` states, never ``cat``) and keep exact gradients (:ref:`architecture-gradient-contract`). The
``*_stats`` functions give the statistics of a batch, the ``*_from_stats`` functions the value; the plain
functions are both in one call.

The statistics are sums in at least float32 (half-precision inputs are cast to float32 first; Pearson's are
float64), so the values of half-precision inputs are float32.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._checks import acc_dtype, check_positive_int
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.functional._errors import ShapeMismatchError


# ------------------------------------------------------------------------------------------------ validation
def _as_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a floating tensor in at least float32: the statistics are sums, never half-precision ones."""
    return x.to(acc_dtype(x.dtype)) if x.is_floating_point() else x.to(torch.get_default_dtype())


def _check_pair(preds: torch.Tensor, target: torch.Tensor) -> None:
    for name, value in (("preds", preds), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(value).__name__}")
        if value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"`{name}` must be a real floating or integer tensor; got dtype {value.dtype}")
    if preds.shape != target.shape:
        raise ShapeMismatchError(
            f"`preds` and `target` must have the same shape; got preds {tuple(preds.shape)} "
            f"and target {tuple(target.shape)}"
        )


def check_num_outputs(num_outputs: Any) -> int:
    """``num_outputs`` if it is a positive int."""
    return check_positive_int("num_outputs", num_outputs)


def _outputs_of(preds: Any) -> int:
    """The number of outputs of ``(N,)`` or ``(N, M)`` inputs (the pair is checked later)."""
    if isinstance(preds, torch.Tensor) and preds.ndim > 2:
        raise ValueError(f"`preds` must have shape (N,) or (N, M); got {tuple(preds.shape)}")
    return preds.shape[1] if isinstance(preds, torch.Tensor) and preds.ndim == 2 else 1


def _columns(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int, flatten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, num_outputs)`` float views of ``preds``/``target``.

    With one output, ``flatten`` accepts any shape (every element an observation, as torchmetrics' errors do);
    otherwise the shape must be ``(N,)`` (one output) or ``(N, num_outputs)``.
    """
    _check_pair(preds, target)
    check_num_outputs(num_outputs)
    if num_outputs == 1 and (flatten or preds.ndim <= 1):
        return _as_float(preds).reshape(-1, 1), _as_float(target).reshape(-1, 1)
    if preds.ndim != 2 or preds.shape[1] != num_outputs:
        raise ValueError(
            f"`preds` and `target` must have shape (N, num_outputs={num_outputs}); got {tuple(preds.shape)}"
        )
    return _as_float(preds), _as_float(target)


def _mean(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``total / count`` per output, a scalar for one output (NaN when ``count == 0``)."""
    return _squeeze_single(total / count)


def _squeeze_single(value: torch.Tensor) -> torch.Tensor:
    return value.reshape(()) if value.numel() == 1 else value


# ------------------------------------------------------------------------------------------- squared / abs error
#: the ``Args`` of the errors with ``num_outputs``: ``preds`` and ``target``; ``num_outputs``, then their ``Returns``
#: and ``Raises`` and the heading of their examples (the first line an ``Args`` entry, indented as one)
_OUTPUTS_DOCS = {
    "inputs": """preds: predictions, a real floating or integer tensor. With ``num_outputs=1`` any shape (every element
    is one observation); else ``(N, num_outputs)``.
target: targets of the shape of ``preds``.""",
    "outputs": """\
    num_outputs: the number of outputs ``M``, scored separately. Default 1.

Returns:
    0-d with one output, else shape ``(num_outputs,)``, NaN for empty inputs.
    The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
    dtype for integer ones.

Raises:
    ValueError: ``preds`` and ``target`` of different shapes, complex or boolean tensors, a non-positive
        ``num_outputs``, or a shape that is not ``(N, num_outputs)``.

Example:""",
}


def mean_squared_error_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ (preds - target)², N)`` per output, shapes ``(num_outputs,)`` and ``()``."""
    p, t = _columns(preds, target, num_outputs)
    diff = p - t
    return (diff * diff).sum(0), torch.full((), p.shape[0], dtype=torch.int64, device=p.device)


def mean_squared_error_from_stats(sum_sq: torch.Tensor, count: torch.Tensor, squared: bool = True) -> torch.Tensor:
    """``Σ (p - t)² / N``, or its square root when ``squared=False``; NaN when ``N == 0``."""
    mse = _mean(sum_sq, count)
    return mse if squared else torch.sqrt(mse)


@shared_docs(**_OUTPUTS_DOCS)
def mean_squared_error(
    preds: torch.Tensor, target: torch.Tensor, squared: bool = True, num_outputs: int = 1
) -> torch.Tensor:
    """Mean squared error ``Σ (preds - target)² / N`` (its square root with ``squared=False``) of a batch.

    The functional form of :class:`~torchmetrics_diff.MeanSquaredError`; no collective; differentiable.

    Args:
        {inputs}
        squared: ``True`` (default) for the MSE, ``False`` for the root mean squared error.
    {outputs}
        >>> import torch
        >>> mean_squared_error(torch.tensor([2.5, 5.0, 4.0, 8.0]), torch.tensor([3.0, 5.0, 2.5, 7.0]))
        tensor(0.8750)
    """
    return mean_squared_error_from_stats(*mean_squared_error_stats(preds, target, num_outputs), squared=squared)


def mean_absolute_error_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ |preds - target|, N)`` per output."""
    p, t = _columns(preds, target, num_outputs)
    return (p - t).abs().sum(0), torch.full((), p.shape[0], dtype=torch.int64, device=p.device)


def mean_absolute_error_from_stats(sum_abs: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``Σ |p - t| / N``; NaN when ``N == 0``."""
    return _mean(sum_abs, count)


@shared_docs(**_OUTPUTS_DOCS)
def mean_absolute_error(preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1) -> torch.Tensor:
    """Mean absolute error ``Σ |preds - target| / N`` of a batch.

    The functional form of :class:`~torchmetrics_diff.MeanAbsoluteError`; no collective; differentiable.

    Args:
        {inputs}
    {outputs}
        >>> import torch
        >>> mean_absolute_error(torch.tensor([2.5, 5.0, 4.0, 8.0]), torch.tensor([3.0, 5.0, 2.5, 7.0]))
        tensor(0.7500)
    """
    return mean_absolute_error_from_stats(*mean_absolute_error_stats(preds, target, num_outputs))


# ------------------------------------------------------------------------------------- percentage errors
#: the floor of a percentage error's denominator (scikit-learn's and torchmetrics' value): a target of 0 gives a
#: large finite error, never ``inf``
PERCENTAGE_EPSILON = 1.17e-06
#: the ``Args``, ``Returns`` and ``Raises`` of both percentage errors (and the heading of their examples)
_PERCENTAGE_DOCS = """Args:
    preds: predictions, a real floating or integer tensor of any shape (every element is one observation).
    target: targets of the shape of ``preds``.

Returns:
    0-d; NaN for empty inputs. The dtype is the inputs' for float32 and float64 inputs, float32 for
    half-precision ones, the default dtype for integer ones.

Raises:
    ValueError: ``preds`` and ``target`` of different shapes, or complex or boolean tensors.

Example:"""


def mean_absolute_percentage_error_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ |p - t| / max(|t|, ε), N)`` per output, ``ε`` = :data:`PERCENTAGE_EPSILON`."""
    p, t = _columns(preds, target, num_outputs)
    ratio = (p - t).abs() / t.abs().clamp(min=PERCENTAGE_EPSILON)
    return ratio.sum(0), torch.full((), p.shape[0], dtype=torch.int64, device=p.device)


@shared_docs(sections=_PERCENTAGE_DOCS)
def mean_absolute_percentage_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean absolute percentage error ``Σ |p - t| / max(|t|, ε) / N`` of a batch (a fraction: 0.1 is 10 %).

    The functional form of :class:`~torchmetrics_diff.MeanAbsolutePercentageError`; no collective;
    differentiable. ``ε = 1.17e-6`` (scikit-learn's and torchmetrics' floor) keeps a zero target finite.

    {sections}
        >>> import torch
        >>> mean_absolute_percentage_error(torch.tensor([0.9, 15.0, 1.2e6]), torch.tensor([1.0, 10.0, 1e6]))
        tensor(0.2667)
    """
    return _mean(*mean_absolute_percentage_error_stats(preds, target))


def symmetric_mean_absolute_percentage_error_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ 2 |p - t| / max(|t| + |p|, ε), N)`` per output, ``ε`` = :data:`PERCENTAGE_EPSILON`."""
    p, t = _columns(preds, target, num_outputs)
    ratio = 2 * (p - t).abs() / (t.abs() + p.abs()).clamp(min=PERCENTAGE_EPSILON)
    return ratio.sum(0), torch.full((), p.shape[0], dtype=torch.int64, device=p.device)


@shared_docs(sections=_PERCENTAGE_DOCS)
def symmetric_mean_absolute_percentage_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Symmetric mean absolute percentage error ``Σ 2 |p - t| / max(|t| + |p|, ε) / N`` of a batch, in ``[0, 2]``.

    The functional form of :class:`~torchmetrics_diff.SymmetricMeanAbsolutePercentageError`; no collective;
    differentiable. ``ε = 1.17e-6``, as torchmetrics.

    {sections}
        >>> import torch
        >>> symmetric_mean_absolute_percentage_error(torch.tensor([0.9, 15.0, 1.2e6]), torch.tensor([1.0, 10.0, 1e6]))
        tensor(0.2290)
    """
    return _mean(*symmetric_mean_absolute_percentage_error_stats(preds, target))
