"""Spearman's rank correlation over the global batch: the rows are ``cat`` states, ranked once they are gathered."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._correlation import spearman_corrcoef_from_rows, spearman_rows
from torchmetrics_diff.functional._regression import check_num_outputs
from torchmetrics_diff.metric import Metric, dim_zero_cat


class SpearmanCorrCoef(Metric):
    """Spearman's rank correlation coefficient: Pearson's r of the ranks of ``preds`` and of ``target`` over every
    rank's rows, tied values sharing the mean of their ranks (as ``scipy.stats.spearmanr``).

    A rank depends on every row of the global batch, so the rows are kept: ``preds`` and ``target`` are ``cat``
    states of shape ``(N, num_outputs)``, stored detached in the metric's dtype (float32 by default:
    :meth:`~torchmetrics_diff.Metric.set_dtype` with ``torch.float64`` keeps float64 inputs exact, so that no
    two values tie that did not). ``compute`` gathers them in one collective and ranks the global columns.
    **Not differentiable**: ranks are piecewise constant, so the result carries no graph.

    Args:
        num_outputs: outputs per row (inputs ``(N,)`` or ``(N, num_outputs)``). Default ``1``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments (``compute_on_cpu=True`` keeps the rows
            off the accelerator).

    Raises:
        ValueError: a bad ``num_outputs``; in ``update``, shapes that differ or do not fit ``num_outputs``, or
            complex or boolean tensors.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import SpearmanCorrCoef
        >>> metric = SpearmanCorrCoef()
        >>> metric.update(torch.tensor([2.5, 0.0]), torch.tensor([3.0, -0.5]))
        >>> metric.update(torch.tensor([2.0, 8.0, 1.0]), torch.tensor([2.0, 7.0, 2.0]))
        >>> metric.compute()
        tensor(0.9747)
    """

    is_differentiable = False
    higher_is_better = True
    plot_lower_bound = -1.0
    plot_upper_bound = 1.0
    full_state_update = False
    preds: list[torch.Tensor]
    target: list[torch.Tensor]

    def __init__(self, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_outputs = check_num_outputs(num_outputs)
        self.add_state("preds", [], dist_reduce_fx="cat")
        self.add_state("target", [], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Append a batch of rows.

        Args:
            preds: predictions ``(N,)`` or ``(N, num_outputs)``, real floating or integer.
            target: targets of the shape of ``preds``.

        Raises:
            ValueError: shapes that differ or do not fit ``num_outputs``, or complex or boolean tensors.
        """
        p, t = spearman_rows(preds, target, self.num_outputs)
        # appended even when empty: a rank whose lists hold (empty) tensors agrees with the others on their dtype
        # and shape, so its syncs stay on the engine's one-collective path
        self.preds.append(p.to(self.dtype))
        self.target.append(t.to(self.dtype))

    def compute(self) -> torch.Tensor:
        """Spearman's rho of every row seen (one per output when ``num_outputs > 1``); NaN, with a warning, for a
        constant column or fewer than two rows."""
        if self.preds:
            p, t = dim_zero_cat(self.preds), dim_zero_cat(self.target)
        else:
            p = t = torch.zeros(0, self.num_outputs, dtype=self.dtype, device=self.device)
        rho = spearman_corrcoef_from_rows(p, t)
        return rho.to(self.dtype)
