"""R², explained variance, Pearson's and Spearman's correlation as pure functions: statistics of the variances and
covariances of the predictions and the targets, and the values from them (the shared validation is in
``_regression``).

R², explained variance and Pearson's correlation are functions of sums over rows, which add up over ranks.
Spearman's rank correlation is not: it needs the ranks of the whole batch (:func:`rank_columns`), so its metric
keeps the rows themselves.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from torchmetrics_diff.functional._checks import acc_dtype, check_values, compiling
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.functional._regression import _columns, _outputs_of, _squeeze_single

MULTIOUTPUTS = ("raw_values", "uniform_average", "variance_weighted")


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
#: the ``Raises`` of Pearson's and Spearman's correlations, and the heading of their examples
_RAISES = """Raises:
    ValueError: shapes that differ or are not ``(N,)``/``(N, M)``, or complex or boolean tensors.

Example:"""


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


@shared_docs(raises=_RAISES)
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

    {raises}
        >>> import torch
        >>> pearson_corrcoef(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        tensor(0.9849)
    """
    r = pearson_corrcoef_from_stats(pearson_corrcoef_stats(preds, target, _outputs_of(preds)))
    return r.to(acc_dtype(preds.dtype) if preds.is_floating_point() else torch.get_default_dtype())


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


@shared_docs(raises=_RAISES)
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

    {raises}
        >>> import torch
        >>> spearman_corrcoef(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        tensor(1.)
    """
    p, t = spearman_rows(preds, target, _outputs_of(preds))
    rho = spearman_corrcoef_from_rows(p, t)
    return rho.to(acc_dtype(preds.dtype) if preds.is_floating_point() else torch.get_default_dtype())
