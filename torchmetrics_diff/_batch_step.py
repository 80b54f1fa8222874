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

- :class:`~torchmetrics_diff.Metric` defines its own hooks (in ``torchmetrics_diff.metric``, next to its
  ``forward``); its ``forward`` runs :func:`run_batch_step` on itself when it syncs or is compiled, and the same
  steps inline when it does neither (a class that overrides a hook always takes the loop).
- ``WrapperMetric`` (``wrappers/_base.py``) overrides the hooks to run them over its members (each member's
  hooks, in the same order) and inherits ``forward``.
- :class:`~torchmetrics_diff.MetricCollection` implements the hooks over its members, syncing all of them in
  one engine call in its ``_sync_batch``, and its ``forward`` runs :func:`run_batch_step` on itself.
- The losses compute (and sync) their value themselves, so their steps have no update or sync of the batch
  states: they call :func:`record_step` only.

A collection and a wrapper call their *members'* hooks one by one (that is how several members share one
sync); nothing else calls a hook directly. Besides the hooks, a collection reads ``_snapshot``/``_restore``
(an all-or-nothing ``update``), ``_sync_spec``, ``_hold_synced``, ``_joins_compute_sync`` (one sync for every
member at ``compute``) and the predicates ``_step_syncs`` and ``_step_syncs_by_engine`` of ``Metric``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol


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


class QuietBatchValue:
    """A base class for metrics whose ``compute`` behaves differently for ``forward``'s batch value: while
    ``Metric._batch_value`` (or its inline form in an eager ``forward``) computes it, the instance holds
    ``_in_batch_value = True``. The NaN policies read it so that a batch value drops NaNs without a warning or a
    count, which the epoch's ``compute`` reports once. Traced code never warns, so under ``torch.compile``
    nothing is marked. A marker: ``Metric`` reads :attr:`_quiet_batch_value`. List it before ``Metric``'s bases."""

    _internal_base = True  # not a base the API reference shows (docs/conf.py)
    _quiet_batch_value = True
