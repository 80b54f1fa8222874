"""Exact binary AUROC from ``cat`` states: every rank's scores and targets, gathered in one collective."""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.functional._classification import (
    binary_auroc_exact,
    binary_auroc_inputs,
    check_ignore_index,
)
from torchmetrics_diff.metric import Metric, dim_zero_cat


class AUROC(Metric):
    """Area under the ROC curve of a binary task, exact (no thresholds binning) over every rank's rows.

    The scores and targets are ``cat`` list states; ``compute`` ranks the gathered scores once (ties share their
    mean rank, which equals the trapezoidal area of the exact ROC curve, as torchmetrics computes it). Logits
    (any score outside ``[0, 1]`` in a batch) go through a sigmoid, as in torchmetrics. Without a positive or
    without a negative target the value is 0, with a warning (torchmetrics' result).

    Args:
        task: ``"binary"`` (the only one implemented). Default ``"binary"``.
        ignore_index: target value whose entries are left out. Default ``None``.
        validate_args: check that targets lie in ``{0, 1}``. Default ``True``.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: another task; in ``update``, inputs of different shapes, integer scores or bad targets.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import AUROC
        >>> metric = AUROC(task="binary")
        >>> metric.update(torch.tensor([0.1, 0.4]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([0.35, 0.8]), torch.tensor([1, 1]))
        >>> metric.compute()
        tensor(0.7500)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    preds: list[torch.Tensor]
    target: list[torch.Tensor]

    def __init__(
        self, task: str = "binary", ignore_index: int | None = None, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if task != "binary":
            raise ValueError(f"`task` must be 'binary'; got {task!r}")
        check_ignore_index(ignore_index)
        self.task, self.ignore_index, self.validate_args = task, ignore_index, validate_args
        self.add_state("preds", [], dist_reduce_fx="cat")
        self.add_state("target", [], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Append a batch's scores and targets.

        Args:
            preds: floating scores ``(N, ...)``: probabilities, or logits (a sigmoid is applied when any value
                lies outside ``[0, 1]``).
            target: integer labels in ``{0, 1}`` of the shape of ``preds``.

        Raises:
            ValueError: tensors of different shapes, integer ``preds``, or (``validate_args``) targets outside
                ``{0, 1}``.
        """
        p, t = binary_auroc_inputs(preds, target, self.ignore_index, self.validate_args)
        # appended even when empty: a rank whose list states hold (empty) tensors agrees with the others on their
        # dtype and shape, so its syncs stay on the engine's one-collective path
        self.preds.append(p.to(self.dtype))
        self.target.append(t)

    def compute(self) -> torch.Tensor:
        """The AUROC of every row seen (0 with a warning before any positive and negative target).

        Returns:
            A 0-d tensor in the default dtype.
        """
        if not self.preds:
            return binary_auroc_exact(torch.zeros(0, device=self.device), torch.zeros(0, dtype=torch.int64))
        return binary_auroc_exact(dim_zero_cat(self.preds), dim_zero_cat(self.target))
