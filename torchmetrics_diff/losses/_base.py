"""The shared shape of a global-batch loss metric: a differentiable value per call, a detached epoch value."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_diff.functional._global import STRATEGIES
from torchmetrics_diff.metric import Metric


class GlobalBatchLoss(Metric):
    """Base of the losses: ``loss(*inputs)`` returns the global-batch loss; ``compute()`` the epoch mean.

    Subclasses implement :meth:`_loss` (the value of one call, global when ``sync``). Each call's detached
    value is recorded, and :meth:`compute` returns the mean of the recorded values over steps (and ranks).

    Args:
        strategy: ``"replicated"`` or ``"sharded"`` (see :doc:`/guide/strategies`).
        dist_sync_on_step: compute the loss over every rank's rows (default ``True``); ``False`` gives the
            plain local loss.
        kwargs: the other :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``,
            ``grad_reduction``, ...).
    """

    is_differentiable = True
    higher_is_better = False
    full_state_update = False

    def __init__(self, *, strategy: str = "sharded", dist_sync_on_step: bool = True, **kwargs: Any) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step, **kwargs)
        if strategy not in STRATEGIES:
            raise ValueError(f"`strategy` must be one of {STRATEGIES}; got {strategy!r}")
        self.strategy = strategy
        self.add_state("loss_total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("steps", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def _loss(self, *args: Any, sync: bool, **kwargs: Any) -> Tensor:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "group": self.process_group, "grad_reduction": self.grad_reduction}

    def _record(self, value: Tensor) -> None:
        self.loss_total = self.loss_total + value.detach().to(self.loss_total.dtype)
        self.steps = self.steps + 1

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The loss of this call's global batch, differentiable; also recorded for :meth:`compute`."""
        value = self._loss(*args, sync=self.dist_sync_on_step, **kwargs)
        self._computed = None
        self._add_count(1)  # not `+= 1`: an int counted in compiled code is a guard that fails every step
        self._record(value)
        return value

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Record the loss of a batch without gradient (e.g. in validation)."""
        self._record(self._loss(*args, sync=self.dist_sync_on_step, **kwargs))

    def compute(self) -> Tensor:
        """The mean of the recorded losses (NaN before any call)."""
        return self.loss_total / self.steps
