"""HuggingFace Accelerate: evaluate without counting the rows that ``even_batches`` repeats.

With its default ``even_batches=True``, a DataLoader prepared by Accelerate gives every process the same number
of equal batches: when the dataset does not divide, the last batches are completed with samples from the start
of the dataset. ``accelerator.gather_for_metrics`` drops them after gathering; our metrics and losses gather
themselves, so they are fed this process's batch and must drop them before: :func:`drop_padding` (or
:func:`real_rows` and a slice) does, with no communication. Never feed them ``gather_for_metrics`` output: they
would count the global batch once per process. See :doc:`/guide/accelerate`.

Which rows repeat, read from Accelerate's own bookkeeping (what ``gather_for_metrics`` uses): only the batch the
prepared DataLoader yields last (``accelerator.gradient_state.end_of_dataloader``) holds padding. Put that last
batch of every process side by side in process order — ``n`` rows each — and its first ``remainder`` rows are
real samples (``gradient_state.remainder``: the dataset length modulo the rows of one global batch); the rest,
always at the end of a process's batch, repeat. So process ``p`` keeps ``min(n, max(0, remainder - p * n))``
rows, none where ``remainder`` is 0. This holds with and without ``split_batches``, and for batches dispatched
from process 0 (``dispatch_batches=True``).

Accelerate is imported when a function is first called; this module imports without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["drop_padding", "real_rows"]


def _accelerate() -> Any:
    try:
        import accelerate.data_loader
        import accelerate.utils
    except ModuleNotFoundError as err:  # pragma: no cover - the test extra installs it
        raise ModuleNotFoundError(
            "torchmetrics_diff.integrations.accelerate needs HuggingFace Accelerate (the accelerate extra), "
            "which is not installed: pip install 'accelerate>=1.0'"
        ) from err
    return accelerate


def _pads(dataloader: Any) -> bool:
    """Whether the active prepared DataLoader repeats samples to even the last batches."""
    shard = _accelerate().data_loader.BatchSamplerShard
    for sampler in (getattr(dataloader, "batch_sampler", None), getattr(dataloader, "sampler", None)):
        if isinstance(sampler, shard):
            return bool(sampler.even_batches)  # even_batches=False: short last batches, nothing repeated
    return True  # dispatched or iterable batches: Accelerate always completes the last one


def real_rows(accelerator: Any, batch: Any) -> int:
    """How many leading rows of this process's current batch are real samples, not ``even_batches`` padding.

    Call it inside the loop over a DataLoader prepared by ``accelerator``, on the batch (or a model output
    computed from it) of the current iteration. It communicates nothing.

    Args:
        accelerator: the ``accelerate.Accelerator`` that prepared the DataLoader.
        batch: this process's batch: a tensor, a (nested) tuple, list or dict of tensors whose first dimension is
            the batch (as ``gather_for_metrics`` takes), or the number of rows.

    Returns:
        The number of real rows: every row except in the last batch, where padded rows are always at the end.

    Raises:
        ValueError: the last batch may hold padding but Accelerate does not know the dataset's length (an
            iterable dataset without ``__len__``), so no one can tell which rows repeat.
        TypeError: ``batch`` holds no tensor.

    Example:
        >>> import torch
        >>> from accelerate import Accelerator
        >>> from torchmetrics_diff.integrations.accelerate import real_rows
        >>> accelerator = Accelerator(cpu=True)  # one process here: nothing is padded
        >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4))
        >>> [real_rows(accelerator, batch) for batch in loader]
        [4, 4, 2]
    """
    rows = batch if isinstance(batch, int) else _accelerate().utils.find_batch_size(batch)
    state = accelerator.gradient_state
    if not state.end_of_dataloader:
        return rows
    remainder, loader = state.remainder, state.active_dataloader
    if remainder == 0 or not _pads(loader):
        return rows
    if remainder < 0:
        if getattr(loader, "_drop_last", False):  # no last batch to complete
            return rows
        raise ValueError(
            "real_rows: Accelerate does not know the length of the dataset (`gradient_state.remainder` is -1), "
            "so the repeated rows of the last batch cannot be told apart; give the dataset a `__len__`, "
            "or prepare the DataLoader with `drop_last=True`"
        )
    return min(rows, max(0, remainder - accelerator.process_index * rows))


def drop_padding(accelerator: Any, data: Any) -> Any:
    """This process's batch without the rows that ``even_batches`` repeats: what to feed our metrics and losses.

    The per-process counterpart of ``accelerator.gather_for_metrics``, for metrics that gather themselves: the
    same rows are dropped, nothing is gathered. Call it inside the loop over the prepared DataLoader.

    Args:
        accelerator: the ``accelerate.Accelerator`` that prepared the DataLoader.
        data: a tensor, or a (nested) tuple, list or dict of tensors, all with the batch as first dimension.

    Returns:
        ``data`` with each tensor cut to its first :func:`real_rows` rows (views, autograd kept), same structure.

    Raises:
        ValueError: as :func:`real_rows`.

    Example:
        >>> import torch
        >>> from accelerate import Accelerator
        >>> from torchmetrics_diff import MeanSquaredError
        >>> from torchmetrics_diff.integrations.accelerate import drop_padding
        >>> accelerator = Accelerator(cpu=True)
        >>> loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4))
        >>> mse = MeanSquaredError()
        >>> for target in loader:
        ...     preds = target + 0.5  # the model's output
        ...     mse.update(*drop_padding(accelerator, (preds, target)))
        >>> mse.compute()
        tensor(0.2500)
    """
    n = real_rows(accelerator, data)
    return _accelerate().utils.recursively_apply(lambda t: t[:n], data)
