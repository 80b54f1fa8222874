"""Differentiable regression metrics whose states are sums (sufficient statistics), never concatenations.

The value of a global batch is a function of the sums of every rank's statistics, so with
``dist_sync_on_step=True`` each of these metrics is a global-batch loss: one collective per step (every state
is a ``sum`` state), the same value on every rank, and after DDP's gradient averaging the one-device gradient
(:ref:`architecture-gradient-contract`; the base class scales each rank's own contribution by the group size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from torchmetrics_diff.functional._correlation import (
    check_multioutput,
    check_r2_args,
    explained_variance_from_stats,
    explained_variance_stats,
    pearson_corrcoef_from_stats,
    pearson_corrcoef_stats,
    r2_score_from_stats,
    r2_score_stats,
)
from torchmetrics_diff.functional._regression import (
    check_num_outputs,
    mean_absolute_error_from_stats,
    mean_absolute_error_stats,
    mean_absolute_percentage_error_stats,
    mean_squared_error_from_stats,
    mean_squared_error_stats,
    symmetric_mean_absolute_percentage_error_stats,
)
from torchmetrics_diff.functional._similarity import (
    check_cosine_reduction,
    check_kl_args,
    cosine_similarity_rows,
    kl_divergence_rows,
)
from torchmetrics_diff.metric import Metric, dim_zero_cat


class _SumStatsMetric(Metric):
    """A differentiable metric whose states are the sums its ``*_stats`` function returns for a batch.

    ``_stats(preds, target, num_outputs)`` gives a batch's sums in the order of ``_sum_states``, the states they
    are added to; subclasses declare those states (all ``sum``) and compute the value from them.
    """

    is_differentiable = True
    full_state_update = False
    num_outputs: int
    _stats: ClassVar[Callable[..., tuple[torch.Tensor, ...]]]
    _sum_states: ClassVar[tuple[str, ...]]

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch's sums.

        Args:
            preds: predictions, real floating or integer: ``(N,)`` or ``(N, num_outputs)`` (the error metrics
                with one output take any shape: every element is an observation).
            target: targets of the shape of ``preds``.

        Raises:
            ValueError: shapes that differ or do not fit ``num_outputs``, or complex or boolean tensors.
        """
        for name, value in zip(self._sum_states, self._stats(preds, target, self.num_outputs)):
            setattr(self, name, getattr(self, name) + value)


class MeanSquaredError(_SumStatsMetric):
    """Mean squared error ``Σ (p - t)² / N`` (root mean squared error with ``squared=False``).

    States: ``sum_squared_error`` (``(num_outputs,)``, ``sum``) and ``total`` (``int64``, ``sum``).

    Args:
        squared: ``False`` returns the root mean squared error. Default ``True``.
        num_outputs: outputs per row; with more than one, inputs have shape ``(N, num_outputs)`` and the result
            one value per output. With one, every element of any shape is an observation. Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: ``squared`` is not a bool, ``num_outputs`` not a positive int; in ``update``, shapes differ.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanSquaredError
        >>> metric = MeanSquaredError()
        >>> metric(torch.tensor([2.5, 5.0]), torch.tensor([3.0, 5.0]))
        tensor(0.1250)
        >>> metric.update(torch.tensor([4.0, 8.0]), torch.tensor([2.5, 7.0]))
        >>> metric.compute()
        tensor(0.8750)
    """

    higher_is_better = False
    plot_lower_bound = 0.0
    _stats = staticmethod(mean_squared_error_stats)
    _sum_states = ("sum_squared_error", "total")
    sum_squared_error: torch.Tensor
    total: torch.Tensor

    def __init__(self, squared: bool = True, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(squared, bool):
            raise ValueError(f"`squared` must be a bool; got {squared!r}")
        self.squared = squared
        self.num_outputs = check_num_outputs(num_outputs)
        self.add_state("sum_squared_error", torch.zeros(num_outputs), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        """The (root) mean squared error of every row seen; NaN before any row."""
        return mean_squared_error_from_stats(self.sum_squared_error, self.total, self.squared)


class MeanAbsoluteError(_SumStatsMetric):
    """Mean absolute error ``Σ |p - t| / N``.

    Args:
        num_outputs: as for :class:`MeanSquaredError`. Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanAbsoluteError
        >>> metric = MeanAbsoluteError()
        >>> metric.update(torch.tensor([2.5, 5.0, 4.0, 8.0]), torch.tensor([3.0, 5.0, 2.5, 7.0]))
        >>> metric.compute()
        tensor(0.7500)
    """

    higher_is_better = False
    plot_lower_bound = 0.0
    _stats = staticmethod(mean_absolute_error_stats)
    _sum_states = ("sum_abs_error", "total")
    sum_abs_error: torch.Tensor
    total: torch.Tensor

    def __init__(self, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_outputs = check_num_outputs(num_outputs)
        self.add_state("sum_abs_error", torch.zeros(num_outputs), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        """The mean absolute error of every row seen; NaN before any row."""
        return mean_absolute_error_from_stats(self.sum_abs_error, self.total)


class R2Score(_SumStatsMetric):
    """Coefficient of determination ``R² = 1 - Σ (t - p)² / Σ (t - t̄)²`` from the sums ``Σt``, ``Σt²``,
    ``Σ (t - p)²`` and ``N``.

    Args:
        adjusted: number of regressors ``k`` for the adjusted score ``1 - (1 - R²)(N - 1)/(N - k - 1)``. Default ``0``.
        multioutput: ``"uniform_average"``, ``"raw_values"`` (one score per output) or ``"variance_weighted"``.
            Default ``"uniform_average"``.
        num_outputs: outputs per row (inputs ``(N,)`` or ``(N, num_outputs)``). torchmetrics infers it from the
            first batch; here the states need their shape up front, so that a rank without rows agrees with
            the others when they sync. Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: bad arguments; in ``compute``, fewer than two observations.

    The total sum of squares is ``Σt² - (Σt)²/N``: it cancels digits when ``|t̄| ≫ std(t)``; use
    :meth:`~torchmetrics_diff.Metric.set_dtype` (``torch.float64``) for such targets.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import R2Score
        >>> metric = R2Score()
        >>> metric.update(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        >>> metric.compute()
        tensor(0.9486)
    """

    higher_is_better = True
    plot_upper_bound = 1.0
    _stats = staticmethod(r2_score_stats)
    _sum_states = ("sum_squared_obs", "sum_obs", "residual", "total")
    sum_squared_obs: torch.Tensor
    sum_obs: torch.Tensor
    residual: torch.Tensor
    total: torch.Tensor

    def __init__(
        self, adjusted: int = 0, multioutput: str = "uniform_average", num_outputs: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_outputs = check_num_outputs(num_outputs)
        check_r2_args(adjusted, multioutput)
        self.adjusted, self.multioutput = adjusted, multioutput
        for name in ("sum_squared_obs", "sum_obs", "residual"):
            self.add_state(name, torch.zeros(num_outputs), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        """R² of every row seen."""
        return r2_score_from_stats(
            self.sum_squared_obs, self.sum_obs, self.residual, self.total, self.adjusted, self.multioutput
        )


class PearsonCorrCoef(_SumStatsMetric):
    """Pearson correlation coefficient from the float64 sums ``N, Σx, Σy, Σx², Σy², Σxy``.

    ``r = (Σxy - ΣxΣy/N) / sqrt((Σx² - (Σx)²/N)(Σy² - (Σy)²/N))``, clamped to ``[-1, 1]``; NaN (with a
    warning) where a variance is zero or below the rounding noise of its sums. The sums are one float64 state of
    shape ``(6, num_outputs)`` whatever the metric's dtype (the result is cast to the metric's dtype), so the
    cancellation in the centred sums costs digits only when ``|mean| / std`` exceeds about ``1e4``;
    :meth:`~torchmetrics_diff.Metric.set_dtype` casts them too, like every floating state.

    Args:
        num_outputs: outputs per row (inputs ``(N,)`` or ``(N, num_outputs)``). Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import PearsonCorrCoef
        >>> metric = PearsonCorrCoef()
        >>> metric.update(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        >>> metric.compute()
        tensor(0.9849)
    """

    higher_is_better = None
    plot_lower_bound = -1.0
    plot_upper_bound = 1.0
    _sum_states = ("sums",)
    sums: torch.Tensor

    def __init__(self, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_outputs = check_num_outputs(num_outputs)
        self.add_state("sums", torch.zeros(6, num_outputs, dtype=torch.float64), dist_reduce_fx="sum")

    @staticmethod
    def _stats(preds: torch.Tensor, target: torch.Tensor, num_outputs: int) -> tuple[torch.Tensor, ...]:
        return (pearson_corrcoef_stats(preds, target, num_outputs),)  # the six sums are one state

    def compute(self) -> torch.Tensor:
        """Pearson's r of every row seen (one per output when ``num_outputs > 1``)."""
        return pearson_corrcoef_from_stats(self.sums).to(self.dtype)


class CosineSimilarity(Metric):
    """Cosine similarity ``⟨p, t⟩ / (|p| |t|)`` of paired rows of ``(N, D)`` inputs, summed or averaged.

    With ``reduction="sum"`` or ``"mean"`` the states are the sum of the row similarities and the row count
    (``sum`` states); with ``"none"`` (or ``None``) the per-row similarities are a ``cat`` state and the result
    is every row's similarity, in rank order.

    Args:
        reduction: ``"sum"`` (torchmetrics' default), ``"mean"``, ``"none"`` or ``None``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import CosineSimilarity
        >>> metric = CosineSimilarity(reduction="mean")
        >>> metric.update(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        >>> metric.compute()
        tensor(0.8536)
    """

    is_differentiable = True
    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    full_state_update = False
    sim_sum: torch.Tensor  # with reduction 'sum' or 'mean'
    total: torch.Tensor  # with reduction 'sum' or 'mean'
    sims: list[torch.Tensor]  # with reduction 'none'

    def __init__(self, reduction: str | None = "sum", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_cosine_reduction(reduction)
        self.reduction = reduction
        if reduction in ("sum", "mean"):
            self.add_state("sim_sum", torch.tensor(0.0), dist_reduce_fx="sum")
            self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")
        else:
            self.add_state("sims", [], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch of row pairs.

        Args:
            preds: predictions ``(N, D)``, real floating or integer.
            target: targets ``(N, D)``.

        Raises:
            ValueError: tensors that are not of one ``(N, D)`` shape, or complex or boolean tensors.
        """
        sims = cosine_similarity_rows(preds, target)
        if self.reduction in ("sum", "mean"):
            self.sim_sum = self.sim_sum + sims.sum()
            self.total = self.total + sims.shape[0]
        else:  # appended even when empty: the rank stays in the graph, and on the sync engine's one-collective path
            self.sims.append(sims)

    def compute(self) -> torch.Tensor:
        """The summed or mean similarity, or every row's similarity."""
        if self.reduction == "sum":
            return self.sim_sum
        if self.reduction == "mean":
            return self.sim_sum / self.total
        return dim_zero_cat(self.sims) if self.sims else torch.zeros(0, dtype=self.dtype, device=self.device)


class _PercentageError(_SumStatsMetric):
    """A sum of per-element percentage errors and the element count (``int64``), both ``sum`` states; the value is
    their ratio. Subclasses set ``_stats`` (the per-batch sums)."""

    higher_is_better = False
    _sum_states = ("sum_abs_per_error", "total")
    sum_abs_per_error: torch.Tensor
    total: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_outputs = 1
        self.add_state("sum_abs_per_error", torch.zeros(1), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        """The mean percentage error of every element seen; NaN before any."""
        return mean_absolute_error_from_stats(self.sum_abs_per_error, self.total)


class MeanAbsolutePercentageError(_PercentageError):
    """Mean absolute percentage error ``Σ |p - t| / max(|t|, ε) / N`` (a fraction: 0.1 is 10 %), ``ε = 1.17e-6``.

    States: ``sum_abs_per_error`` and ``total`` (``int64``), both ``sum``: every element of the inputs is an
    observation, whatever their shape.

    Args:
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanAbsolutePercentageError
        >>> metric = MeanAbsolutePercentageError()
        >>> metric.update(torch.tensor([0.9, 15.0]), torch.tensor([1.0, 10.0]))
        >>> metric.update(torch.tensor([1.2e6]), torch.tensor([1e6]))
        >>> metric.compute()
        tensor(0.2667)
    """

    _stats = staticmethod(mean_absolute_percentage_error_stats)
    plot_lower_bound = 0.0


class SymmetricMeanAbsolutePercentageError(_PercentageError):
    """Symmetric mean absolute percentage error ``Σ 2 |p - t| / max(|t| + |p|, ε) / N``, in ``[0, 2]``,
    ``ε = 1.17e-6``.

    States: ``sum_abs_per_error`` and ``total`` (``int64``), both ``sum``; every element is an observation.

    Args:
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import SymmetricMeanAbsolutePercentageError
        >>> metric = SymmetricMeanAbsolutePercentageError()
        >>> metric.update(torch.tensor([0.9, 15.0, 1.2e6]), torch.tensor([1.0, 10.0, 1e6]))
        >>> metric.compute()
        tensor(0.2290)
    """

    _stats = staticmethod(symmetric_mean_absolute_percentage_error_stats)
    plot_lower_bound = 0.0
    plot_upper_bound = 2.0


class ExplainedVariance(_SumStatsMetric):
    """Explained variance ``1 - Var(t - p) / Var(t)`` (population variances) from the sums ``Σ (t - p)``,
    ``Σ (t - p)²``, ``Σt``, ``Σt²`` and ``N``.

    As torchmetrics, an output whose error variance is exactly 0 scores 1, one whose target variance is exactly 0
    but error variance is not scores 0.

    Args:
        multioutput: ``"uniform_average"`` (default), ``"raw_values"`` (one score per output) or
            ``"variance_weighted"`` (weighted by each target's variance).
        num_outputs: outputs per row (inputs ``(N,)`` or ``(N, num_outputs)``). torchmetrics infers it from the
            first batch; here the states need their shape up front, so that a rank without rows agrees with the
            others when they sync. Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: an unknown ``multioutput`` or a bad ``num_outputs``; in ``update``, shapes that differ or do
            not fit ``num_outputs``.

    The variances are ``Σx²/N - (Σx/N)²``: they cancel digits when ``|mean| ≫ std``; use
    :meth:`~torchmetrics_diff.Metric.set_dtype` (``torch.float64``) for such targets.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import ExplainedVariance
        >>> metric = ExplainedVariance()
        >>> metric.update(torch.tensor([2.5, 0.0, 2.0, 8.0]), torch.tensor([3.0, -0.5, 2.0, 7.0]))
        >>> metric.compute()
        tensor(0.9572)
    """

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    _stats = staticmethod(explained_variance_stats)
    _sum_states = ("sum_error", "sum_squared_error", "sum_target", "sum_squared_target", "num_obs")
    sum_error: torch.Tensor
    sum_squared_error: torch.Tensor
    sum_target: torch.Tensor
    sum_squared_target: torch.Tensor
    num_obs: torch.Tensor

    def __init__(self, multioutput: str = "uniform_average", num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.multioutput = check_multioutput(multioutput)
        self.num_outputs = check_num_outputs(num_outputs)
        for name in self._sum_states[:-1]:
            self.add_state(name, torch.zeros(num_outputs), dist_reduce_fx="sum")
        self.add_state("num_obs", torch.tensor(0), dist_reduce_fx="sum")

    def compute(self) -> torch.Tensor:
        """The explained variance of every row seen (one per output with ``"raw_values"``); NaN before any."""
        return explained_variance_from_stats(
            self.sum_error,
            self.sum_squared_error,
            self.sum_target,
            self.sum_squared_target,
            self.num_obs,
            self.multioutput,
        )


class KLDivergence(Metric):
    """Kullback-Leibler divergence ``KL(p ‖ q) = Σ_d p_d log(p_d / q_d)`` of paired rows of ``(N, D)``
    distributions, averaged or summed over the rows (or per row).

    With ``reduction="mean"`` or ``"sum"`` the states are the sum of the row divergences and the row count
    (``sum`` states: a global-batch loss with ``dist_sync_on_step=True``); with ``"none"`` (or ``None``) the
    per-row divergences are a ``cat`` state and the result is every row's divergence, in rank order.

    Args:
        log_prob: ``True`` if the inputs are log-probabilities; ``False`` (default): probabilities, each row
            divided by its sum first.
        reduction: ``"mean"`` (default), ``"sum"``, ``"none"`` or ``None``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a non-bool ``log_prob`` or an unknown ``reduction``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import KLDivergence
        >>> metric = KLDivergence()
        >>> metric.update(torch.tensor([[0.36, 0.48, 0.16]]), torch.tensor([[1 / 3, 1 / 3, 1 / 3]]))
        >>> metric.compute()
        tensor(0.0853)
    """

    is_differentiable = True
    higher_is_better = False
    plot_lower_bound = 0.0
    full_state_update = False
    measures: torch.Tensor | list[torch.Tensor]  # a sum with reduction 'mean'/'sum', the rows' values with 'none'
    total: torch.Tensor

    def __init__(self, log_prob: bool = False, reduction: str | None = "mean", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_kl_args(log_prob, reduction)
        self.log_prob, self.reduction = log_prob, reduction
        if reduction in ("mean", "sum"):
            self.add_state("measures", torch.tensor(0.0), dist_reduce_fx="sum")
        else:
            self.add_state("measures", [], dist_reduce_fx="cat")
        self.add_state("total", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, p: torch.Tensor, q: torch.Tensor) -> None:
        """Add a batch of distribution pairs.

        Args:
            p: the data distributions ``(N, D)``, real floating (probabilities, or log-probabilities with
                ``log_prob=True``).
            q: the approximating distributions ``(N, D)``, given as ``p`` is.

        Raises:
            ValueError: tensors that are not of one ``(N, D)`` shape, or complex or boolean tensors.
        """
        rows = kl_divergence_rows(p, q, self.log_prob)
        if isinstance(self.measures, list):  # appended even when empty: the rank stays on the one-collective path
            self.measures.append(rows)
        else:
            self.measures = self.measures + rows.sum()
        self.total = self.total + rows.shape[0]

    def compute(self) -> torch.Tensor:
        """The mean or summed divergence, or every row's; the mean of no rows is NaN."""
        if isinstance(self.measures, list):
            empty = torch.zeros(0, dtype=self.dtype, device=self.device)
            return dim_zero_cat(self.measures) if self.measures else empty
        if self.reduction == "sum":
            return self.measures
        return self.measures / self.total
