"""The sync of one :class:`~torchmetrics_diff.Metric` across ranks: ``sync`` / ``unsync`` / ``sync_context``, and
whether a sync has anything to do.

``_MetricSyncing`` is a base class of ``Metric`` (as ``_MetricBatchSteps`` of ``torchmetrics_diff._batch_step``).
It holds the metric's side of syncing: the questions (``_distributed_available``, ``_compute_syncs``,
``_joins_compute_sync``; the step's are ``_MetricBatchSteps``'), what the metric hands the engine
(``_sync_spec``, ``_sync_values``, its agreed plans ``_plan``), and the synced states held in place until
``unsync`` (``_hold_synced``, ``_is_synced``), which a ``MetricCollection`` also uses to sync all its members in
one call. Turning metric states into one engine call is ``torchmetrics_diff._metric_sync``'s job; the bytes move
in ``torchmetrics_diff.distributed``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable

import torch

from torchmetrics_diff._metric_sync import SyncSpec, gather_each, sync_metric_states
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.distributed._sync import SyncPlan
from torchmetrics_diff.exceptions import TorchMetricsUserError


class _MetricSyncing:
    """:class:`~torchmetrics_diff.Metric`'s sync across ranks, and its questions about syncing on compute.

    The attributes and methods below the ``TYPE_CHECKING`` guard are what the sync reads of the metric (its
    settings, made by ``Metric.__init__``, and the state registry of ``torchmetrics_diff._metric_states``).
    """

    if TYPE_CHECKING:
        sync_on_compute: bool
        process_group: Group
        dist_sync_fn: Callable | None
        grad_reduction: str
        distributed_available_fn: Callable[[], bool] | None
        _defaults: dict[str, torch.Tensor | list]
        _reductions: dict[str, str | Callable | None]
        _list_states: tuple[str, ...]
        _callable_lists: tuple[str, ...]
        _device: torch.device
        _synced_cache: dict[str, Any] | None
        _sync_plans: dict[str, SyncPlan]

        @property
        def metric_state(self) -> dict[str, torch.Tensor | list]: ...
        def _set_states(self, values: dict[str, Any]) -> None: ...
        def _cache_usable(self) -> bool: ...

    def _distributed_available(
        self, group: Group = None, fn: Callable[[], bool] | None = None, sync_fn: Callable | None = None
    ) -> bool:
        """Whether a sync has anything to do: ``distributed_available_fn`` (if any) agrees and the group has peers
        (or a custom gather, this call's ``sync_fn`` or the metric's, runs where the callable says so)."""
        fn = fn if fn is not None else self.distributed_available_fn
        if fn is not None and not fn():
            return False
        if group_size(group if group is not None else self.process_group) > 1:
            return True
        # a custom gather is the caller's own business: when the caller's `distributed_available_fn` says so, it
        # runs even without a process group (as in torchmetrics, whose tests emulate ranks that way)
        return fn is not None and (sync_fn or self.dist_sync_fn) is not None

    def _compute_syncs(self) -> bool:
        """Whether :meth:`compute` syncs across ranks (then, under ``torch.compile``, it runs eagerly)."""
        return self.sync_on_compute and self._distributed_available()

    def _joins_compute_sync(self) -> bool:
        """Whether :meth:`compute` would sync through the engine now, so a collection may sync it with others."""
        return (
            self.sync_on_compute
            and self._synced_cache is None
            and not self._cache_usable()
            and self.dist_sync_fn is None
            and bool(self._defaults)
            and self._distributed_available()
        )

    def _sync_spec(self) -> SyncSpec:
        """What the sync needs to know about this metric (its reductions, list states, device, ...)."""
        return SyncSpec(
            owner=type(self).__name__,
            reductions=self._reductions,
            list_states=self._list_states,
            callable_lists=self._callable_lists,
            grad_reduction=self.grad_reduction,
            device=self._device,
        )

    def _sync_values(self, states: dict[str, Any], grad: str) -> dict[str, Any]:
        """Synced copies of ``states`` (list states become a one-element list holding the concatenation)."""
        if self.dist_sync_fn is not None:
            return gather_each(self._sync_spec(), states, self.dist_sync_fn, self.process_group, grad)
        call = "forward" if grad == "local" else "sync"
        return sync_metric_states(
            {"": self._sync_spec()}, {"": states}, self.process_group, self._plan(grad), grad, call
        )[""]

    def _plan(self, grad: str) -> SyncPlan:
        """Step syncs (batch states, input dtype) and epoch syncs (accumulators) keep separate agreed plans."""
        return self._sync_plans["step" if grad == "local" else "epoch"]

    @property
    def _is_synced(self) -> bool:
        """Whether the synced states are in place (between :meth:`sync` and :meth:`unsync`)."""
        return self._synced_cache is not None

    def _hold_synced(self, local: dict[str, Any], synced: dict[str, Any]) -> None:
        """Put the ``synced`` states in place and keep the ``local`` ones for :meth:`unsync` (what :meth:`sync`
        does after syncing; a collection syncs every member in one call, then hands each its states here)."""
        self._synced_cache = local
        self._set_states(synced)

    def sync(
        self,
        dist_sync_fn: Callable | None = None,
        process_group: Group = None,
        should_sync: bool = True,
        distributed_available: Callable[[], bool] | None = None,
    ) -> None:
        """Replace the local states by the synced ones (detached); :meth:`unsync` restores them.

        Args:
            dist_sync_fn: overrides the metric's ``dist_sync_fn`` for this call.
            process_group: overrides the metric's ``process_group`` for this call.
            should_sync: ``False`` makes this a no-op.
            distributed_available: a callable returning whether to sync (default: the metric's
                ``distributed_available_fn``); there is nothing to sync without a group of more than one rank.

        Raises:
            TorchMetricsUserError: the metric is already synced (a ``RuntimeError``).
            RuntimeError: ranks disagree on the states.
        """
        if not should_sync or not self._defaults:
            return
        if self._synced_cache is not None:
            raise TorchMetricsUserError(f"{type(self).__name__} is already synced; call unsync() first")
        group = process_group if process_group is not None else self.process_group
        if not self._distributed_available(group, distributed_available, dist_sync_fn):
            return
        local = self.metric_state
        overrides = dist_sync_fn is not None or group is not self.process_group
        if overrides:  # this call's gather and group, for this call only
            saved_fn, saved_group = self.dist_sync_fn, self.process_group
            self.dist_sync_fn = dist_sync_fn or self.dist_sync_fn
            self.process_group = group
        try:
            synced = self._sync_values(local, grad="none")  # detached: the engine runs without grad for "none"
        finally:
            if overrides:
                self.dist_sync_fn, self.process_group = saved_fn, saved_group
        self._hold_synced(local, synced)

    def unsync(self, should_unsync: bool = True) -> None:
        """Restore the local states saved by :meth:`sync`.

        Args:
            should_unsync: ``False`` makes the call a no-op. Default ``True``.

        Raises:
            TorchMetricsUserError: the metric is not synced (a ``RuntimeError``).
        """
        if not should_unsync:
            return
        if self._synced_cache is None:
            raise TorchMetricsUserError(f"{type(self).__name__} is not synced; nothing to unsync")
        self._set_states(self._synced_cache)
        self._synced_cache = None

    @contextmanager
    def sync_context(
        self,
        dist_sync_fn: Callable | None = None,
        process_group: Group = None,
        should_sync: bool = True,
        should_unsync: bool = True,
        distributed_available: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """Within the block the states are synced; afterwards the local ones are back (when ``should_unsync``).

        Args:
            dist_sync_fn: a custom gather for this sync, as the constructor's. Default ``None``: the metric's.
            process_group: the group to sync over. Default ``None``: the metric's.
            should_sync: ``False`` leaves the states local. Default ``True``.
            should_unsync: restore the local states when the block ends. Default ``True``.
            distributed_available: a callable returning whether to sync at all. Default ``None``: the metric's.

        Example:
            >>> import torch
            >>> from torchmetrics_diff import SumMetric
            >>> metric = SumMetric()
            >>> metric.update(torch.tensor([1.0, 2.0]))
            >>> with metric.sync_context():  # one process: nothing to sync
            ...     metric.sum_value
            tensor(3.)
        """
        was_synced = self._synced_cache is not None
        self.sync(dist_sync_fn, process_group, should_sync, distributed_available)
        synced = self._synced_cache is not None and not was_synced
        try:
            yield
        finally:
            if synced and should_unsync:
                self.unsync()
