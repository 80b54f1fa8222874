"""Regression metrics as pure functions, each split into sufficient statistics and a value computed from them.

Every statistic is a *sum* over rows, so the statistics of a global batch are the sums of every rank's
statistics: that is what lets the :mod:`torchmetrics_diff.regression` metrics sync with one ``all_reduce``-like
collective (``sum`` states, never ``cat``) and keep exact gradients (:ref:`architecture-gradient-contract`). The
``*_stats`` functions give the statistics of a batch, the ``*_from_stats`` functions the value; the plain
functions are both in one call.

The statistics are sums in at least float32 (half-precision inputs are cast to float32 first; Pearson's are
float64), so the values of half-precision inputs are float32.

Two are not sums of rows alone: the KL divergence without reduction is a value per row, and Spearman's rank
correlation needs the ranks of the whole batch (:func:`rank_columns`), so its metric keeps the rows themselves.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.functional._checks import acc_dtype, check_positive_int, check_values
from torchmetrics_diff.functional._errors import ShapeMismatchError

MULTIOUTPUTS = ("raw_values", "uniform_average", "variance_weighted")
COSINE_REDUCTIONS = ("sum", "mean", "none", None)


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


def mean_squared_error(
    preds: torch.Tensor, target: torch.Tensor, squared: bool = True, num_outputs: int = 1
) -> torch.Tensor:
    """Mean squared error ``Σ (preds - target)² / N`` (its square root with ``squared=False``) of a batch.

    The functional form of :class:`~torchmetrics_diff.MeanSquaredError`; no collective; differentiable.

    Args:
        preds: predictions, a real floating or integer tensor. With ``num_outputs=1`` any shape (every element
            is one observation); else ``(N, num_outputs)``.
        target: targets of the shape of ``preds``.
        squared: ``True`` (default) for the MSE, ``False`` for the root mean squared error.
        num_outputs: the number of outputs ``M``, scored separately. Default 1.

    Returns:
        0-d with one output, else shape ``(num_outputs,)``, NaN for empty inputs.
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: ``preds`` and ``target`` of different shapes, complex or boolean tensors, a non-positive
            ``num_outputs``, or a shape that is not ``(N, num_outputs)``.

    Example:
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


def mean_absolute_error(preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1) -> torch.Tensor:
    """Mean absolute error ``Σ |preds - target| / N`` of a batch.

    The functional form of :class:`~torchmetrics_diff.MeanAbsoluteError`; no collective; differentiable.

    Args:
        preds: predictions, a real floating or integer tensor. With ``num_outputs=1`` any shape (every element
            is one observation); else ``(N, num_outputs)``.
        target: targets of the shape of ``preds``.
        num_outputs: the number of outputs ``M``, scored separately. Default 1.

    Returns:
        0-d with one output, else shape ``(num_outputs,)``, NaN for empty inputs.
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: ``preds`` and ``target`` of different shapes, complex or boolean tensors, a non-positive
            ``num_outputs``, or a shape that is not ``(N, num_outputs)``.

    Example:
        >>> import torch
        >>> mean_absolute_error(torch.tensor([2.5, 5.0, 4.0, 8.0]), torch.tensor([3.0, 5.0, 2.5, 7.0]))
        tensor(0.7500)
    """
    return mean_absolute_error_from_stats(*mean_absolute_error_stats(preds, target, num_outputs))


# -------------------------------------------------------------------------------------------------------- R²
def r2_score_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Σ t², Σ t, Σ (t - p)², N)`` per output (``N`` a scalar)."""
    p, t = _columns(preds, target, num_outputs, flatten=False)
    count = torch.full((), p.shape[0], dtype=torch.int64, device=p.device)
    return (t * t).sum(0), t.sum(0), ((t - p) ** 2).sum(0), count


def check_r2_args(adjusted: int, multioutput: str) -> None:
    """``adjusted`` an int ``>= 0``, ``multioutput`` one of :data:`MULTIOUTPUTS`."""
    if not isinstance(adjusted, int) or isinstance(adjusted, bool) or adjusted < 0:
        raise ValueError(f"`adjusted` must be an int >= 0; got {adjusted!r}")
    if multioutput not in MULTIOUTPUTS:
        raise ValueError(f"`multioutput` must be one of {MULTIOUTPUTS}; got {multioutput!r}")


def r2_score_from_stats(
    sum_sq_obs: torch.Tensor,
    sum_obs: torch.Tensor,
    rss: torch.Tensor,
    count: torch.Tensor,
    adjusted: int = 0,
    multioutput: str = "uniform_average",
) -> torch.Tensor:
    """R² from the sums of :func:`r2_score_stats`.

    Like torchmetrics: an output whose residual sum is ~0 (``|rss| <= 1e-4``) scores 1, one whose target is
    ~constant (``|tss| <= 1e-4``) but residual is not scores 0.

    Under ``torch.compile`` the count is not read on the host: fewer than two observations fail a device
    assertion (a ``RuntimeError``), and ``adjusted`` falls back to the unadjusted score without the warning.

    Raises:
        ValueError: fewer than two observations, or a bad ``adjusted``/``multioutput``.
    """
    check_r2_args(adjusted, multioutput)
    check_values(count < 2, "R2 score needs at least two observations", lambda: f"got {int(count)}")
    tss = sum_sq_obs - sum_obs * sum_obs / count
    rss_zero = rss.abs() <= 1e-4
    tss_zero = tss.abs() <= 1e-4
    usable = ~rss_zero & ~tss_zero
    ratio = rss / torch.where(usable, tss, torch.ones_like(tss))  # no inf/NaN in the branch not taken
    raw = torch.where(usable, 1 - ratio, torch.where(rss_zero, torch.ones_like(rss), torch.zeros_like(rss)))
    if multioutput == "raw_values":
        r2 = raw
    elif multioutput == "uniform_average":
        r2 = raw.mean()
    else:
        r2 = (tss / tss.sum() * raw).sum()
    if adjusted and compiling():  # the count stays a tensor: the unadjusted score where there are too few
        rows = count.to(r2.dtype)
        too_few = rows <= adjusted + 1
        r2 = torch.where(too_few, r2, 1 - (1 - r2) * (rows - 1) / torch.where(too_few, 1.0, rows - adjusted - 1))
    elif adjusted:
        n = int(count)
        if adjusted >= n - 1:
            warnings.warn(
                f"`adjusted`={adjusted} regressors need more than {adjusted + 1} observations (got {n}); "
                "returning the unadjusted R2 score",
                UserWarning,
                stacklevel=2,
            )
        else:
            r2 = 1 - (1 - r2) * (n - 1) / (n - adjusted - 1)
    return r2


def r2_score(
    preds: torch.Tensor, target: torch.Tensor, adjusted: int = 0, multioutput: str = "uniform_average"
) -> torch.Tensor:
    """Coefficient of determination ``1 - Σ (t - p)² / Σ (t - t̄)²`` of a batch.

    The functional form of :class:`~torchmetrics_diff.R2Score`; no collective; differentiable. Like torchmetrics,
    an output whose residual sum is ~0 (``<= 1e-4``) scores 1, one whose target is ~constant but residual is not
    scores 0.

    Args:
        preds: predictions of shape ``(N,)`` or ``(N, M)`` (``M`` outputs), real floating or integer.
        target: targets of the shape of ``preds``.
        adjusted: the number of regressors ``k`` of the adjusted R², ``1 - (1 - R²)(N - 1)/(N - k - 1)``;
            0 (default) for the plain R². With ``k >= N - 1`` the plain R² is returned, with a ``UserWarning``.
        multioutput: how ``M`` outputs combine: ``"uniform_average"`` (default: their mean), ``"raw_values"``
            (one score per output) or ``"variance_weighted"`` (weighted by each target's variance).

    Returns:
        0-d, or shape ``(M,)`` with ``multioutput="raw_values"``.
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: fewer than two observations, shapes that differ or are not ``(N,)``/``(N, M)``, a negative
            or non-int ``adjusted``, or an unknown ``multioutput``.

    Example:
        >>> import torch
        >>> r2_score(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        tensor(0.9486)
    """
    check_r2_args(adjusted, multioutput)
    stats = r2_score_stats(preds, target, _outputs_of(preds))
    return r2_score_from_stats(*stats, adjusted=adjusted, multioutput=multioutput)


# -------------------------------------------------------------------------------------------------- Pearson
def pearson_corrcoef_stats(preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1) -> torch.Tensor:
    """The six sums ``(N, Σx, Σy, Σx², Σy², Σxy)`` stacked into one float64 tensor of shape ``(6, num_outputs)``.

    Accumulated in float64 whatever the input dtype (the gradient still flows back to float32 inputs).
    """
    x, y = _columns(preds, target, num_outputs, flatten=False)
    x, y = x.to(torch.float64), y.to(torch.float64)
    n = x.new_full((x.shape[1],), float(x.shape[0]))
    return torch.stack([n, x.sum(0), y.sum(0), (x * x).sum(0), (y * y).sum(0), (x * y).sum(0)])


def pearson_corrcoef_from_stats(stats: torch.Tensor) -> torch.Tensor:
    """Pearson's r from the six sums of :func:`pearson_corrcoef_stats` (NaN, with a warning, for ~zero variance).

    The centred sums are ``Σx² - (Σx)²/N`` etc.: when ``|mean| ≫ std`` they lose about ``log10(mean²/var)``
    digits to cancellation, which float64 accumulation keeps harmless for everyday data. A centred sum below
    ``4 · N · eps · Σx²`` is indistinguishable from rounding error and counts as zero variance.
    """
    n, sx, sy, sxx, syy, sxy = stats
    vx = sxx - sx * sx / n
    vy = syy - sy * sy / n
    cxy = sxy - sx * sy / n
    eps = torch.finfo(stats.dtype).eps
    noise_x, noise_y = 4 * n * eps * sxx, 4 * n * eps * syy
    valid = (vx > noise_x) & (vy > noise_y) & torch.isfinite(vx) & torch.isfinite(vy) & torch.isfinite(cxy)
    if not compiling() and not bool(valid.all()):  # (no host read, and so no warning, under torch.compile)
        warnings.warn(
            "The variance of `preds` or `target` is zero (or lost to rounding); Pearson's r is NaN there",
            UserWarning,
            stacklevel=2,
        )
    denom = torch.where(valid, vx * vy, torch.ones_like(vx))  # no inf/NaN gradient from the branch not taken
    r = torch.where(valid, (cxy / torch.sqrt(denom)).clamp(-1.0, 1.0), torch.full_like(vx, math.nan))
    return _squeeze_single(r)


def pearson_corrcoef(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Pearson correlation coefficient of a batch, per column of ``(N, M)`` inputs.

    The functional form of :class:`~torchmetrics_diff.PearsonCorrCoef`; no collective; differentiable. The six
    sums it is computed from are accumulated in float64, whatever the inputs' dtype.

    Args:
        preds: predictions of shape ``(N,)`` or ``(N, M)``, real floating or integer.
        target: targets of the shape of ``preds``.

    Returns:
        0-d for ``(N,)`` inputs, else shape ``(M,)``, in [-1, 1]; NaN, with a ``UserWarning``, where the
        variance of ``preds`` or ``target`` is zero (or lost to rounding).
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: shapes that differ or are not ``(N,)``/``(N, M)``, or complex or boolean tensors.

    Example:
        >>> import torch
        >>> pearson_corrcoef(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        tensor(0.9849)
    """
    r = pearson_corrcoef_from_stats(pearson_corrcoef_stats(preds, target, _outputs_of(preds)))
    return r.to(acc_dtype(preds.dtype) if preds.is_floating_point() else torch.get_default_dtype())


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


# ------------------------------------------------------------------------------------- percentage errors
#: the floor of a percentage error's denominator (scikit-learn's and torchmetrics' value): a target of 0 gives a
#: large finite error, never ``inf``
PERCENTAGE_EPSILON = 1.17e-06


def mean_absolute_percentage_error_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ |p - t| / max(|t|, ε), N)`` per output, ``ε`` = :data:`PERCENTAGE_EPSILON`."""
    p, t = _columns(preds, target, num_outputs)
    ratio = (p - t).abs() / t.abs().clamp(min=PERCENTAGE_EPSILON)
    return ratio.sum(0), torch.full((), p.shape[0], dtype=torch.int64, device=p.device)


def mean_absolute_percentage_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean absolute percentage error ``Σ |p - t| / max(|t|, ε) / N`` of a batch (a fraction: 0.1 is 10 %).

    The functional form of :class:`~torchmetrics_diff.MeanAbsolutePercentageError`; no collective;
    differentiable. ``ε = 1.17e-6`` (scikit-learn's and torchmetrics' floor) keeps a zero target finite.

    Args:
        preds: predictions, a real floating or integer tensor of any shape (every element is one observation).
        target: targets of the shape of ``preds``.

    Returns:
        0-d; NaN for empty inputs. The dtype is the inputs' for float32 and float64 inputs, float32 for
        half-precision ones, the default dtype for integer ones.

    Raises:
        ValueError: ``preds`` and ``target`` of different shapes, or complex or boolean tensors.

    Example:
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


def symmetric_mean_absolute_percentage_error(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Symmetric mean absolute percentage error ``Σ 2 |p - t| / max(|t| + |p|, ε) / N`` of a batch, in ``[0, 2]``.

    The functional form of :class:`~torchmetrics_diff.SymmetricMeanAbsolutePercentageError`; no collective;
    differentiable. ``ε = 1.17e-6``, as torchmetrics.

    Args:
        preds: predictions, a real floating or integer tensor of any shape (every element is one observation).
        target: targets of the shape of ``preds``.

    Returns:
        0-d; NaN for empty inputs. The dtype is the inputs' for float32 and float64 inputs, float32 for
        half-precision ones, the default dtype for integer ones.

    Raises:
        ValueError: ``preds`` and ``target`` of different shapes, or complex or boolean tensors.

    Example:
        >>> import torch
        >>> symmetric_mean_absolute_percentage_error(torch.tensor([0.9, 15.0, 1.2e6]), torch.tensor([1.0, 10.0, 1e6]))
        tensor(0.2290)
    """
    return _mean(*symmetric_mean_absolute_percentage_error_stats(preds, target))


# ---------------------------------------------------------------------------------------- explained variance
def explained_variance_stats(
    preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Σ (t - p), Σ (t - p)², Σ t, Σ t², N)`` per output (``N`` a scalar)."""
    p, t = _columns(preds, target, num_outputs, flatten=False)
    err = t - p
    count = torch.full((), p.shape[0], dtype=torch.int64, device=p.device)
    return err.sum(0), (err * err).sum(0), t.sum(0), (t * t).sum(0), count


def check_multioutput(multioutput: Any) -> str:
    """``multioutput`` if it is one of :data:`MULTIOUTPUTS`."""
    if multioutput not in MULTIOUTPUTS:
        raise ValueError(f"`multioutput` must be one of {MULTIOUTPUTS}; got {multioutput!r}")
    return multioutput


def explained_variance_from_stats(
    sum_error: torch.Tensor,
    sum_squared_error: torch.Tensor,
    sum_target: torch.Tensor,
    sum_squared_target: torch.Tensor,
    count: torch.Tensor,
    multioutput: str = "uniform_average",
) -> torch.Tensor:
    """``1 - Var(t - p) / Var(t)`` per output from the sums of :func:`explained_variance_stats`, combined as
    ``multioutput`` says.

    As torchmetrics (and scikit-learn): an output whose error variance is exactly 0 scores 1, one whose target
    variance is exactly 0 but error variance is not scores 0; ``"variance_weighted"`` weights each output by its
    target variance. Computed with ``torch.where``, so the gradient stays finite.
    """
    check_multioutput(multioutput)
    mean_error = sum_error / count
    numerator = sum_squared_error / count - mean_error * mean_error
    mean_target = sum_target / count
    denominator = sum_squared_target / count - mean_target * mean_target
    num_zero, den_zero = numerator == 0, denominator == 0
    usable = ~num_zero & ~den_zero
    ratio = numerator / torch.where(usable, denominator, torch.ones_like(denominator))
    ones = torch.ones_like(ratio)
    scores = torch.where(usable, 1 - ratio, torch.where(num_zero, ones, torch.zeros_like(ratio)))
    if multioutput == "raw_values":
        return _squeeze_single(scores)
    if multioutput == "uniform_average":
        return scores.mean()
    return (denominator / denominator.sum() * scores).sum()


def explained_variance(preds: torch.Tensor, target: torch.Tensor, multioutput: str = "uniform_average") -> torch.Tensor:
    """Explained variance ``1 - Var(t - p) / Var(t)`` of a batch (population variances), per column of ``(N, M)``
    inputs.

    The functional form of :class:`~torchmetrics_diff.ExplainedVariance`; no collective; differentiable. An
    output whose error variance is 0 scores 1; one whose target is constant but error variance is not scores 0.

    Args:
        preds: predictions of shape ``(N,)`` or ``(N, M)``, real floating or integer.
        target: targets of the shape of ``preds``.
        multioutput: how ``M`` outputs combine: ``"uniform_average"`` (default: their mean), ``"raw_values"``
            (one score per output) or ``"variance_weighted"`` (weighted by each target's variance).

    Returns:
        0-d, or shape ``(M,)`` with ``multioutput="raw_values"`` and ``M > 1``; NaN for empty inputs.
        The dtype is the inputs' for float32 and float64 inputs, float32 for half-precision ones, the default
        dtype for integer ones.

    Raises:
        ValueError: shapes that differ or are not ``(N,)``/``(N, M)``, complex or boolean tensors, or an unknown
            ``multioutput``.

    Example:
        >>> import torch
        >>> target = torch.tensor([[0.5, 1.0], [-1.0, 1.0], [7.0, -6.0]])
        >>> preds = torch.tensor([[0.0, 2.0], [-1.0, 2.0], [8.0, -5.0]])
        >>> explained_variance(preds, target, multioutput="raw_values")
        tensor([0.9677, 1.0000])
    """
    check_multioutput(multioutput)
    stats = explained_variance_stats(preds, target, _outputs_of(preds))
    return explained_variance_from_stats(*stats, multioutput=multioutput)


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


# ------------------------------------------------------------------------------------------------ Spearman
def rank_columns(x: torch.Tensor) -> torch.Tensor:
    """The rank (1 = smallest) of every element of ``x`` within its column, ties given the mean of their ranks
    (``scipy.stats.rankdata``'s ``"average"``); float64 of the shape of ``x`` (``(N,)`` or ``(N, M)``)."""
    values, order = x.sort(dim=0, stable=True)
    n = x.shape[0]
    pos = torch.arange(n, device=x.device).reshape(-1, *([1] * (x.ndim - 1))).expand_as(values)
    if n == 0:
        return torch.zeros_like(x, dtype=torch.float64)
    first = torch.ones_like(values[:1], dtype=torch.bool)
    starts = torch.cat([first, values[1:] != values[:-1]])  # a tie group begins here
    ends = torch.cat([values[:-1] != values[1:], first])  # a tie group ends here
    start = torch.where(starts, pos, torch.zeros_like(pos)).cummax(0).values
    end = torch.where(ends, pos, torch.full_like(pos, n - 1)).flip(0).cummin(0).values.flip(0)
    average = (start + end).to(torch.float64) / 2 + 1
    return torch.empty_like(average).scatter_(0, order, average)


def spearman_corrcoef_from_rows(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Spearman's rho of ``(N, M)`` columns: Pearson's r of their tie-averaged ranks (float64, NaN with a warning
    for a constant column)."""
    return pearson_corrcoef_from_stats(
        pearson_corrcoef_stats(rank_columns(preds), rank_columns(target), preds.shape[1])
    )


def spearman_rows(preds: torch.Tensor, target: torch.Tensor, num_outputs: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``preds`` and ``target`` checked and as detached ``(N, num_outputs)`` float tensors."""
    p, t = _columns(preds, target, num_outputs, flatten=False)
    return p.detach(), t.detach()


def spearman_corrcoef(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation coefficient of a batch, per column of ``(N, M)`` inputs: Pearson's r of the
    ranks, tied values sharing the mean of their ranks (as ``scipy.stats.spearmanr``).

    The functional form of :class:`~torchmetrics_diff.SpearmanCorrCoef`; no collective; **not differentiable**
    (ranks are piecewise constant; the result carries no graph).

    Args:
        preds: predictions of shape ``(N,)`` or ``(N, M)``, real floating or integer.
        target: targets of the shape of ``preds``.

    Returns:
        0-d for ``(N,)`` inputs, else shape ``(M,)``, in [-1, 1]; NaN, with a ``UserWarning``, for a constant
        column (or fewer than two rows). The dtype is the inputs' for float32 and float64 inputs, float32 for
        half-precision ones, the default dtype for integer ones.

    Raises:
        ValueError: shapes that differ or are not ``(N,)``/``(N, M)``, or complex or boolean tensors.

    Example:
        >>> import torch
        >>> spearman_corrcoef(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        tensor(1.)
    """
    p, t = spearman_rows(preds, target, _outputs_of(preds))
    rho = spearman_corrcoef_from_rows(p, t)
    return rho.to(acc_dtype(preds.dtype) if preds.is_floating_point() else torch.get_default_dtype())
