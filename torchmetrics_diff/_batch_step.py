"""The batch-step protocol: how ``forward`` folds one batch in, written once for every class that steps.

``forward`` is five steps, and :func:`run_batch_step` is the only loop that runs them::

    step = target._begin_batch()          # refuse a synced target, count the update, fresh batch states
    try:
        target._update_batch(step, args, kwargs)     # fold the batch in, with the caller's autograd mode
        if target._step_syncs():
            target._sync_batch(step)      # the batch states over every rank, differentiably
        value = target._batch_value()     # the value of the batch states
    except BaseException:
        target._abort_batch(step)         # put everything back
        raise
    return target._finish_batch(step, value)   # merge the detached batch into the accumulated states

Who provides the hooks (a :class:`Stepper`), and who may call what:

- :class:`~torchmetrics_diff.Metric` gets its hooks from :class:`_MetricBatchSteps` (below); its ``forward`` runs
  :func:`run_batch_step` on itself.
- ``WrapperMetric`` (``wrappers/_base.py``) overrides the hooks to run them over its members (each member's
  hooks, in the same order) and inherits ``forward``.
- :class:`~torchmetrics_diff.MetricCollection` implements the hooks over its members, syncing all of them in
  one engine call in its ``_sync_batch``, and its ``forward`` runs :func:`run_batch_step` on itself.
- The losses compute (and sync) their value themselves, so their steps have no update or sync of the batch
  states: they call :func:`record_step` only.

A collection and a wrapper call their *members'* hooks one by one (that is how several members share one
sync); nothing else calls a hook directly. Besides the hooks, a collection reads ``_snapshot``/``_restore``
(an all-or-nothing ``update``), ``_sync_spec``, ``_hold_synced``, ``_joins_compute_sync`` (one sync for every
member at ``compute``) and the predicates of :class:`_MetricBatchSteps`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, cast

import torch

from torchmetrics_diff._dynamo import folded_lists
from torchmetrics_diff._tensors import detach, unhalved
from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._reductions import merge
from torchmetrics_diff.distributed._sync import SyncPlan, fail_sync

if TYPE_CHECKING:
    from torchmetrics_diff._metric_sync import SyncSpec
    from torchmetrics_diff.distributed._backend import Group
    from torchmetrics_diff.exceptions import TorchMetricsUserError

_CPU = torch.device("cpu")


class BatchStep:
    """One batch on its way through the protocol: what undoing or finishing it needs.

    Attributes:
        accumulated: the accumulated states, set aside while the batch states are in place.
        computed: the cached ``compute`` value of the accumulated states (put back by an abort).
        batch: the batch states as ``update`` left them, before any sync; ``None`` (a step that folds the batch
            itself and does not sync the states, as the losses'): the states in place.
        args: the positional arguments of the batch.
        kwargs: the keyword arguments of the batch.
    """

    __slots__ = ("accumulated", "args", "batch", "computed", "kwargs")

    def __init__(self, accumulated: dict[str, Any], computed: Any) -> None:
        self.accumulated = accumulated
        self.computed = computed
        self.batch: dict[str, Any] | None = None
        self.args: tuple = ()
        self.kwargs: dict[str, Any] = {}


class Stepper(Protocol):
    """The hooks a class provides to run the protocol (:func:`run_batch_step`)."""

    def _begin_batch(self) -> Any:
        """Refuse a synced target, count the update and swap in fresh batch states; the step the others take.
        It raises only before changing anything."""

    def _update_batch(self, step: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Fold the batch into the batch states with the caller's autograd mode. If it raises while peers are
        about to sync, it announces the error to them first (their sync raises too)."""

    def _step_syncs(self) -> bool:
        """Whether this step syncs the batch states across ranks (by the engine or a custom gather)."""

    def _sync_batch(self, step: Any) -> None:
        """Replace the batch states by their values over every rank, differentiably."""

    def _batch_value(self) -> Any:
        """The value of the batch states in place (``compute`` without sync or cache)."""

    def _finish_batch(self, step: Any, value: Any) -> Any:
        """Merge the detached batch states into the accumulated ones, keep the detached value as
        ``_forward_cache``; return ``value``."""

    def _abort_batch(self, step: Any) -> None:
        """Undo :meth:`_begin_batch` and whatever came after it."""


def run_batch_step(target: Stepper, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``forward``'s body: run the five steps of the protocol on ``target`` (see the module docstring)."""
    step = target._begin_batch()
    try:
        target._update_batch(step, args, kwargs)
        if target._step_syncs():
            target._sync_batch(step)
        value = target._batch_value()
    except BaseException:
        target._abort_batch(step)
        raise
    return target._finish_batch(step, value)


def record_step(target: Stepper, value: Any, record: Callable[[], None]) -> Any:
    """A step whose value the caller computed (and synced) itself, as the losses' ``forward``: ``record()``
    folds the call into the fresh batch states, which then merge into the accumulated ones.

    The step begins once the value is there: a call that failed (here or on a peer) has nothing to undo, and no
    collective runs inside a ``try`` (under ``torch.compile`` a graph break there would split the frame).
    """
    step = target._begin_batch()
    record()
    return target._finish_batch(step, value)


class _MetricBatchSteps:
    """:class:`~torchmetrics_diff.Metric`'s hooks of the protocol, and its questions about syncing on step.

    The attributes and methods below the ``TYPE_CHECKING`` guard are what the hooks read of the metric (the
    state registry of :mod:`torchmetrics_diff._metric_states` and the sync of
    :mod:`torchmetrics_diff._metric_syncing`).
    """

    if TYPE_CHECKING:
        dist_sync_on_step: bool
        dist_sync_fn: Callable | None
        process_group: Group
        compute_on_cpu: bool
        _defaults: dict[str, torch.Tensor | list]
        _reductions: dict[str, Any]
        _list_states: tuple[str, ...]
        _merged_by_reduction: bool
        _weighs_count: bool
        _raw_update: ClassVar[Callable[..., Any]]
        _raw_compute: ClassVar[Callable[..., Any]]

        @property
        def device(self) -> torch.device: ...
        @property
        def metric_state(self) -> dict[str, Any]: ...
        @property
        def _update_count(self) -> Any: ...
        def _synced_error(self, what: str) -> TorchMetricsUserError: ...
        def _add_count(self, delta: int) -> None: ...
        def _run_in_lifecycle(self, fn: Callable, *args: Any, **kwargs: Any) -> Any: ...
        def _set_states(self, values: dict[str, Any]) -> None: ...
        def _sync_values(self, states: dict[str, Any], grad: str) -> dict[str, Any]: ...
        def _plan(self, grad: str) -> SyncPlan: ...
        def _sync_spec(self) -> SyncSpec: ...
        def _move_list_states(self, device: torch.device) -> None: ...
        def _distributed_available(
            self, group: Group = None, fn: Callable[[], bool] | None = None, sync_fn: Callable | None = None
        ) -> bool: ...

    #: whether ``forward`` always runs eagerly under ``torch.compile`` (see ``_dynamo.steps_outside_graph``)
    _forward_outside_graph = False
    #: the loop as a method, so that each metric class runs its own copy of its code (``Metric._per_class_code``)
    _run_batch_step = run_batch_step

    def _step_syncs(self) -> bool:
        """Whether ``forward`` syncs the batch across ranks, by the engine or a custom gather (then, under
        ``torch.compile``, the whole ``forward`` runs eagerly behind one graph break)."""
        return self.dist_sync_on_step and self._distributed_available()

    def _step_syncs_by_engine(self) -> bool:
        """Whether ``forward`` syncs through the engine (so peers wait in its first round, and a collection may
        sync it with its other members)."""
        return self.dist_sync_on_step and self.dist_sync_fn is None and self._distributed_available()

    def _begin_batch(self) -> BatchStep:
        """Refuse a synced metric, count the update and swap in fresh batch states.

        Raises:
            TorchMetricsUserError: the metric is synced (its batch would be lost at ``unsync``).
        """
        state = self.__dict__
        if state["_synced_cache"] is not None:
            raise self._synced_error("forward")
        step = BatchStep({name: state[name] for name in self._defaults}, state["_computed"])
        state["_computed"] = None
        self._add_count(1)  # not `+= 1`: under torch.compile, see _add_count
        state.update({n: d.clone() if isinstance(d, torch.Tensor) else [] for n, d in self._defaults.items()})
        return step

    def _update_batch(self, step: BatchStep, args: tuple, kwargs: dict[str, Any], announce: bool = True) -> None:
        """Fold the batch into the batch states with the caller's autograd mode (``update``).

        If ``update`` raises while the other ranks are about to sync, the error is announced to them through the
        sync's first round (``announce``; a collection announces once for all its members), so every rank raises
        instead of waiting. The caller aborts the step.
        """
        step.args, step.kwargs = args, kwargs
        try:
            self._run_in_lifecycle(type(self)._raw_update, *args, **kwargs)
        except Exception as err:
            if announce and self._step_syncs_by_engine():
                fail_sync(
                    err, self.process_group, plan=self._plan("local"), owner=type(self).__name__, device=self.device
                )
            raise
        state = self.__dict__
        step.batch = {name: unhalved(state[name], default) for name, default in self._defaults.items()}
        state.update(step.batch)  # (a state left in half precision is widened to its default's dtype)

    def _sync_batch(self, step: BatchStep, synced: dict[str, Any] | None = None) -> None:
        """Replace the batch states by their values over every rank, differentiably (``grad="local"``).

        Args:
            step: the step whose batch states to sync.
            synced: the synced states when the caller synced them with others' (a collection); ``None``: sync
                them here.
        """
        batch = cast("dict[str, Any]", step.batch)  # (set by _update_batch)
        self._set_states(synced if synced is not None else self._sync_values(batch, grad="local"))

    def _batch_value(self) -> Any:
        """The value of the states in place (``compute`` without sync or cache)."""
        return self._run_in_lifecycle(type(self)._raw_compute)

    def _finish_batch(self, step: BatchStep, value: Any) -> Any:
        """Fold the detached batch states into the accumulated ones; keep the detached value; return ``value``."""
        if self._merged_by_reduction:
            # the count only weighs `mean` states: reading it in traced code would guard on the eager count
            count = self._update_count if self._weighs_count else 1
            batch = step.batch if step.batch is not None else self.metric_state
            # (a batch state without a graph merges as it is: the merge makes new tensors or extends a list)
            batch = {
                n: v if isinstance(v, torch.Tensor) and not v.requires_grad else detach(v) for n, v in batch.items()
            }
            self._set_states(self._merged(step.accumulated, batch, count))
        else:  # no known reduction to merge by: replay ``update`` on the accumulated states
            self._set_states(step.accumulated)
            with torch.no_grad():
                self._run_in_lifecycle(type(self)._raw_update, *detach(step.args), **detach(step.kwargs))
        if self.compute_on_cpu:
            self._move_list_states(_CPU)
        self.__dict__["_forward_cache"] = detach(value)
        return value

    def _abort_batch(self, step: BatchStep) -> None:
        """Undo :meth:`_begin_batch` and whatever came after it: the accumulated states, count and cache return."""
        self._set_states(step.accumulated)
        self._add_count(-1)
        self.__dict__["_computed"] = step.computed

    def _merged(self, acc: dict[str, Any], new: dict[str, Any], count: float) -> dict[str, Any]:
        """Fold states ``new`` (detached) into ``acc``; a ``mean`` state moves ``1/count`` of the way to new (the
        batch fold of :meth:`_finish_batch`, and ``merge_state``)."""
        owner = type(self).__name__
        if compiling() and self._list_states:  # traced: a list state stays one tensor (see folded_lists)
            lists = folded_lists({n: acc[n] for n in self._list_states}, new)
            return {
                n: lists[n] if n in lists else merge(fx, acc[n], new[n], count, owner=owner, name=n)
                for n, fx in self._reductions.items()
            }
        return {n: merge(fx, acc[n], new[n], count, owner=owner, name=n) for n, fx in self._reductions.items()}


class QuietBatchValue:
    """A base class for metrics whose ``compute`` behaves differently for ``forward``'s batch value: while
    :meth:`_batch_value` runs (eagerly), the instance holds ``_in_batch_value = True``. The NaN policies read it
    so that a batch value drops NaNs without a warning or a count, which the epoch's ``compute`` reports once.
    Traced code never warns, so under ``torch.compile`` nothing is marked. List it before ``Metric``'s bases."""

    _internal_base = True  # not a base the API reference shows (docs/conf.py)

    def _batch_value(self) -> Any:
        if compiling():
            return super()._batch_value()  # type: ignore[misc]
        state = self.__dict__
        state["_in_batch_value"] = True
        try:
            return super()._batch_value()  # type: ignore[misc]
        finally:
            state["_in_batch_value"] = False
