"""``BootStrapper``: bootstrap statistics (mean, std, quantile) of a metric over resampled batches."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch
from torch import Generator, nn

from torchmetrics_diff._tensors import map_tensors
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import Member, WrapperMetric
from torchmetrics_diff.wrappers.minmax import _check_metric

_STRATEGIES = ("poisson", "multinomial")


def _bootstrap_indices(size: int, sampling_strategy: str, generator: Generator | None = None) -> torch.Tensor:
    """Row indices of one bootstrap resample of ``size`` rows.

    Args:
        size: the number of rows of the batch.
        sampling_strategy: ``"poisson"`` (each row repeated a Poisson(1) number of times, so the resample's size
            varies) or ``"multinomial"`` (``size`` rows drawn with replacement).
        generator: the random generator. Default ``None``: torch's global one.

    Returns:
        A 1-D ``int64`` tensor of indices into the rows, on the CPU.

    Raises:
        ValueError: an unknown ``sampling_strategy``.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.wrappers.bootstrap import _bootstrap_indices
        >>> _bootstrap_indices(4, "multinomial", torch.Generator().manual_seed(0)).shape
        torch.Size([4])
    """
    if sampling_strategy == "poisson":
        counts = torch.poisson(torch.ones(size), generator=generator).long()
        return torch.arange(size).repeat_interleave(counts)
    if sampling_strategy == "multinomial":
        if size == 0:  # (torch.multinomial refuses to draw nothing)
            return torch.zeros(0, dtype=torch.int64)
        return torch.multinomial(torch.ones(size), num_samples=size, replacement=True, generator=generator)
    raise ValueError(f"`sampling_strategy` must be one of {_STRATEGIES}; got {sampling_strategy!r}")


class BootStrapper(WrapperMetric):
    """Bootstrap statistics of a metric: ``num_bootstraps`` copies, each updated with a resample of every batch.

    Each batch is resampled once per copy (rows drawn along dim 0 of every tensor argument); ``compute`` returns
    statistics of the copies' values. Under DDP every rank resamples its own rows, so a copy's sample of the
    global batch is the union of the ranks' resamples (a bootstrap stratified by rank); all copies' states are
    synced in the same single collective.

    Args:
        base_metric: the metric to bootstrap (copied ``num_bootstraps`` times).
        num_bootstraps: the number of copies. Default 10.
        mean: return the mean of the copies' values. Default ``True``.
        std: return their standard deviation (Bessel-corrected). Default ``True``.
        quantile: return this quantile (a float in [0, 1] or a tensor of them) of the values. Default ``None``.
        raw: return every copy's value, stacked on dim 0. Default ``False``.
        sampling_strategy: ``"poisson"`` (default: each row repeated a Poisson(1) number of times) or
            ``"multinomial"`` (as many rows as the batch has, drawn with replacement).
        generator: the random generator of the resamples, or a seed for a new CPU one. Default ``None``: torch's
            global generator (then ``torch.manual_seed`` gives torchmetrics' samples).
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments.

    Returns:
        ``forward`` (statistics of the batch) and ``compute`` return a dict with the keys ``"mean"``, ``"std"``,
        ``"quantile"`` and ``"raw"`` that were asked for.

    Raises:
        ValueError: ``base_metric`` is not a metric, ``num_bootstraps`` is not a positive int, an unknown
            ``sampling_strategy``, or an ``update`` without tensor arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanSquaredError
        >>> from torchmetrics_diff.wrappers import BootStrapper
        >>> metric = BootStrapper(MeanSquaredError(), num_bootstraps=20, generator=0)
        >>> metric.update(torch.linspace(0, 1, 50), torch.zeros(50))
        >>> sorted(metric.compute())
        ['mean', 'std']
    """

    def __init__(
        self,
        base_metric: Metric,
        num_bootstraps: int = 10,
        mean: bool = True,
        std: bool = True,
        quantile: float | torch.Tensor | None = None,
        raw: bool = False,
        sampling_strategy: str = "poisson",
        generator: Generator | int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_metric(base_metric, "base_metric")
        if not isinstance(num_bootstraps, int) or isinstance(num_bootstraps, bool) or num_bootstraps < 1:
            raise ValueError(f"`num_bootstraps` must be a positive int; got {num_bootstraps!r}")
        if sampling_strategy not in _STRATEGIES:
            raise ValueError(f"`sampling_strategy` must be one of {_STRATEGIES}; got {sampling_strategy!r}")
        if generator is not None and not isinstance(generator, (Generator, int)):
            raise ValueError(f"`generator` must be a torch.Generator, an int seed or None; got {generator!r}")
        self.metrics = nn.ModuleList([deepcopy(base_metric) for _ in range(num_bootstraps)])
        self.num_bootstraps = num_bootstraps
        self.mean = mean
        self.std = std
        self.quantile = quantile
        self.raw = raw
        self.sampling_strategy = sampling_strategy
        self.generator = torch.Generator().manual_seed(generator) if isinstance(generator, int) else generator

    def _members(self) -> dict[str, Member]:
        return {str(i): m for i, m in enumerate(self.metrics)}  # type: ignore[misc]  # (copies of a Metric)

    def _kwargs_target(self) -> Metric:
        return self.metrics[0]  # type: ignore[return-value]  # (a copy of a Metric)

    def _route(self, key: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        sizes = [t.shape[0] for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.ndim > 0]
        if not sizes:
            raise ValueError("BootStrapper.update needs a tensor argument with rows (dim 0) to resample; got none")
        if len(set(sizes)) > 1:
            raise ValueError(
                f"BootStrapper resamples the rows (dim 0) of every tensor argument together: they must have the same "
                f"number of rows; got {sizes}"
            )
        idx = _bootstrap_indices(sizes[0], self.sampling_strategy, self.generator)
        # as torchmetrics, update() skips a copy whose resample is empty; forward() still passes the empty
        # resample (every copy takes part in the batch's sync, on every rank)
        if idx.numel() == 0 and self.__dict__.get("_current_step") is None:
            return None

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, idx.to(t.device))

        return map_tensors(pick, args), map_tensors(pick, kwargs)

    def result_keys(self) -> list[str]:
        """The keys of the value, those of the statistics asked for: a :class:`~torchmetrics_diff.MetricCollection`
        holding the metric gives each a tensor-valued view in ``items()``, which Lightning's
        ``self.log_dict(collection)`` logs (``"quantile"`` of several levels and ``"raw"`` are not scalars, which
        Lightning refuses to log).

        Example:
            >>> from torchmetrics_diff import MeanMetric
            >>> from torchmetrics_diff.wrappers import BootStrapper
            >>> BootStrapper(MeanMetric(), num_bootstraps=4, quantile=0.95).result_keys()
            ['mean', 'std', 'quantile']
        """
        asked = (("mean", self.mean), ("std", self.std), ("quantile", self.quantile is not None), ("raw", self.raw))
        return [key for key, on in asked if on]

    def _stats(self, values: list[Any]) -> dict[str, torch.Tensor]:
        stacked = torch.stack([torch.as_tensor(v) for v in values], dim=0)
        out: dict[str, torch.Tensor] = {}
        if self.mean:
            out["mean"] = stacked.mean(dim=0)
        if self.std:
            out["std"] = stacked.std(dim=0)
        if self.quantile is not None:
            q = torch.as_tensor(self.quantile, dtype=stacked.dtype, device=stacked.device)
            out["quantile"] = torch.quantile(stacked, q)
        if self.raw:
            out["raw"] = stacked
        return out

    def _step_value(self, values: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self._stats([values[str(i)] for i in range(self.num_bootstraps)])

    def _compute_value(self) -> dict[str, torch.Tensor]:
        return self._stats([m.compute() for m in self._members().values()])
