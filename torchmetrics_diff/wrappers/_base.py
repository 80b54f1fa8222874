"""``WrapperMetric``: a metric made of inner metrics whose states sync as one metric's.

A wrapper holds inner metrics (its *members*: metrics, other wrappers, or collections) and adds logic on top
(copies per bootstrap, a window of updates, a copy per epoch, a value reshaped into a dict). Syncing each member
on its own would cost a collective per member; instead the wrapper presents every member's states under one
flat namespace (``"<member key>.<state>"``) and one :class:`~torchmetrics_diff._state_sync.SyncSpec`, so that
its own ``compute`` and ``forward``, and a :class:`~torchmetrics_diff.MetricCollection` holding it, hand all of
them to the sync engine in one call: the steady state is one collective, however many members there are.

A wrapper runs the batch-step protocol (``torchmetrics_diff._batch_step``) over its members: its hooks call each
member's in turn, and ``forward`` is :class:`~torchmetrics_diff.Metric`'s (each member's batch states are synced
between its ``update`` and its value, differentiably), so the value of ``forward``
keeps the members' exact gradients. A subclass says which members a batch goes to
(:meth:`WrapperMetric._step_members`), what each of them receives (:meth:`WrapperMetric._route`), and how the
members' values make the wrapper's (:meth:`WrapperMetric._step_value`, :meth:`WrapperMetric._compute_value`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Union, cast

import torch

from torchmetrics_diff._batch_step import BatchStep
from torchmetrics_diff._state_sync import SyncSpec, sync_metric_states
from torchmetrics_diff._tensors import detach
from torchmetrics_diff.collections import MetricCollection
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.distributed._sync import fail_sync
from torchmetrics_diff.exceptions import TorchMetricsUserError
from torchmetrics_diff.metric import Metric

Member = Union[Metric, MetricCollection]


class _WrapperStep(BatchStep):
    """A wrapper's batch: each member metric's own step, and the collections (which run their own ``forward``)."""

    __slots__ = ("collections", "inner", "undo", "values")

    def __init__(self, computed: Any) -> None:
        super().__init__({}, computed)
        self.inner: dict[str, tuple[Metric, BatchStep]] = {}
        self.collections: dict[str, MetricCollection] = {}
        self.values: dict[str, Any] = {}
        self.undo: Any = None


class WrapperMetric(Metric):
    """Base class of the wrappers: inner metrics driven, synced and restored as one metric.

    Subclasses register their members as submodules and implement ``_members``; the defaults send every
    batch to every member unchanged and return the member's value when there is one member.

    Args:
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments; ``process_group`` and the sync
            settings of the members are the members' own (a wrapper syncs its members as they are configured).

    Raises:
        ValueError: a bad :class:`~torchmetrics_diff.Metric` keyword argument.
    """

    full_state_update = True  # a wrapper's value is not a merge of batch states: never merged by reductions
    _wrap_lifecycle = False  # update/compute drive the members, which run their own lifecycle
    _forward_outside_graph = True  # under torch.compile, forward runs eagerly (its members' protocol is host code)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        cls._wrap_lifecycle = False  # (read from each class's own namespace)
        super().__init_subclass__(**kwargs)

    # ------------------------------------------------------------------- what a subclass says
    def _members(self) -> dict[str, Member]:
        """Every inner metric or collection, by a key unique within the wrapper."""
        raise NotImplementedError(f"{type(self).__name__} must implement `_members`")

    def _step_members(self) -> dict[str, Member]:
        """The members a batch (``update`` or ``forward``) goes to. Default: all of them."""
        return self._members()

    def _compute_members(self) -> dict[str, Member]:
        """The members whose states :meth:`compute` needs synced. Default: all of them."""
        return self._members()

    def _all_members(self) -> dict[str, Member]:
        """Every key a member is known by: :meth:`_members` and the keys of the step and compute members (a
        subclass may give the member a batch goes to a fixed key, so that the step sync keeps its plan)."""
        return {**self._members(), **self._step_members(), **self._compute_members()}

    def _unique_leaves(self) -> list[Metric]:
        seen: dict[int, Metric] = {}
        for leaf in self._leaves(self._all_members()).values():
            seen.setdefault(id(leaf), leaf)
        return list(seen.values())

    def _route(self, key: str, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The arguments member ``key`` receives for a batch. Default: the batch unchanged."""
        return args, kwargs

    def _step_value(self, values: dict[str, Any]) -> Any:
        """The wrapper's value of a batch from its step members' values. Default: the only member's value."""
        return next(iter(values.values()))

    def _compute_value(self) -> Any:
        """The wrapper's value from its members (their states synced when there are ranks). Default: the only
        member's ``compute()``."""
        return next(iter(self._compute_members().values())).compute()

    def _start_step(self) -> Any:
        """Called when a batch starts (``update`` or ``forward``); returns what :meth:`_undo_step` needs."""
        return None

    def _undo_step(self, undo: Any) -> None:
        """Undo :meth:`_start_step` (the batch failed)."""

    def _end_step(self) -> None:
        """Called when a batch has been folded into the members."""

    # ------------------------------------------------------------------- the members' states, flattened
    @staticmethod
    def _leaves(members: dict[str, Member]) -> dict[str, Metric]:
        """The metrics that hold states: the members, a collection replaced by its updating members."""
        out: dict[str, Metric] = {}
        for key, m in members.items():
            if isinstance(m, MetricCollection):
                out.update({f"{key}/{name}": leaf for name, leaf in m._leaders().items()})
            else:
                out[key] = m
        return out

    @staticmethod
    def _flat(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {f"{key}.{name}": value for key, own in states.items() for name, value in own.items()}

    def _split(self, flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """``flat`` (names ``"<leaf key>.<state>"``) back per leaf key (the keys of :meth:`_all_members`)."""
        owners = {
            f"{key}.{name}": (key, name)
            for key, leaf in self._leaves(self._all_members()).items()
            for name in leaf._sync_spec().reductions
        }
        out: dict[str, dict[str, Any]] = {}
        for flat_name, value in flat.items():
            key, name = owners[flat_name]
            out.setdefault(key, {})[name] = value
        return out

    @property
    def metric_state(self) -> dict[str, torch.Tensor | list]:
        """The states of the members :meth:`compute` reads, named ``"<member key>.<state>"``."""
        return self._flat({k: leaf.metric_state for k, leaf in self._leaves(self._compute_members()).items()})

    def _set_states(self, values: dict[str, Any]) -> None:
        leaves = self._leaves(self._all_members())
        for key, own in self._split(values).items():
            leaves[key]._set_states(own)

    def _sync_spec(self) -> SyncSpec:
        """One spec for every member's states (what a collection syncs the wrapper by)."""
        leaves = self._leaves(self._all_members())
        specs = {key: leaf._sync_spec() for key, leaf in leaves.items()}
        modes = {spec.grad_reduction for spec in specs.values()}
        if len(modes) > 1:
            raise ValueError(
                f"{type(self).__name__}: the inner metrics must share one `grad_reduction` (they are synced as one "
                f"metric); got {sorted(modes)}"
            )
        return SyncSpec(
            owner=type(self).__name__,
            reductions={f"{k}.{n}": fx for k, s in specs.items() for n, fx in s.reductions.items()},
            list_states=tuple(f"{k}.{n}" for k, s in specs.items() for n in s.list_states),
            callable_lists=tuple(f"{k}.{n}" for k, s in specs.items() for n in s.callable_lists),
            grad_reduction=modes.pop() if modes else self.grad_reduction,
            device=next(iter(specs.values())).device if specs else self._device,
        )

    def _group(self, leaves: dict[str, Metric]) -> Group:
        groups = {id(leaf.process_group): leaf.process_group for leaf in leaves.values()}
        if len(groups) > 1:
            raise ValueError(
                f"{type(self).__name__}: the inner metrics must share one `process_group` (they are synced as one "
                f"metric); got {len(groups)} different groups"
            )
        return next(iter(groups.values()), self.process_group)

    # ------------------------------------------------------------------- epoch sync: one engine call
    @property
    def _is_synced(self) -> bool:
        return any(leaf._is_synced for leaf in self._unique_leaves())

    def _joins_compute_sync(self) -> bool:
        leaves = self._leaves(self._compute_members())
        return bool(leaves) and all(leaf._joins_compute_sync() for leaf in leaves.values())

    def _hold_synced(self, local: dict[str, Any], synced: dict[str, Any]) -> None:
        leaves = self._leaves(self._all_members())
        mine = self._split(local)
        for key, own in self._split(synced).items():
            leaves[key]._hold_synced(mine[key], own)

    def _sync_members(self, leaves: dict[str, Metric]) -> bool:
        """Sync the states of ``leaves`` in one engine call and hold them; whether anything was synced."""
        joining = {k: leaf for k, leaf in leaves.items() if leaf._joins_compute_sync()}
        if not joining:
            return False
        local = self._flat({k: leaf.metric_state for k, leaf in joining.items()})
        synced = sync_metric_states(
            {"": self._sync_spec()}, {"": local}, self._group(joining), self._plan("none"), "none"
        )
        self._hold_synced(local, synced[""])
        return True

    @contextmanager
    def _synced_members(self, leaves: dict[str, Metric]) -> Iterator[None]:
        """Within the block the states of ``leaves`` are synced (unless a caller holds them synced already)."""
        held = not any(leaf._is_synced for leaf in leaves.values()) and self._sync_members(leaves)
        try:
            yield
        finally:
            if held:
                for leaf in leaves.values():
                    if leaf._is_synced:
                        leaf.unsync()

    def compute(self) -> Any:
        """The wrapper's value; every member's states synced in one engine call first (when there are ranks)."""
        with self._synced_members(self._leaves(self._compute_members())):
            return self._compute_value()

    def sync(
        self,
        dist_sync_fn: Callable | None = None,
        process_group: Group = None,
        should_sync: bool = True,
        distributed_available: Callable[[], bool] | None = None,
    ) -> None:
        """Replace the members' local states by the synced ones, in one engine call; :meth:`unsync` restores them.

        A custom ``dist_sync_fn``, ``process_group`` or ``distributed_available`` syncs each member on its own
        with them.

        Args:
            dist_sync_fn: a custom gather for this sync. Default ``None``: the engine.
            process_group: the group to sync over. Default ``None``: the members'.
            should_sync: ``False`` makes this a no-op. Default ``True``.
            distributed_available: a callable returning whether to sync. Default ``None``: the members'.

        Raises:
            TorchMetricsUserError: the wrapper is already synced.
        """
        if not should_sync:
            return
        if self._is_synced:
            raise TorchMetricsUserError(f"{type(self).__name__} is already synced; call unsync() first")
        leaves = self._leaves(self._compute_members())
        if dist_sync_fn is None and process_group is None and distributed_available is None:
            self._sync_members(leaves)
            return
        for leaf in leaves.values():
            leaf.sync(dist_sync_fn, process_group, should_sync, distributed_available)

    def unsync(self, should_unsync: bool = True) -> None:
        """Restore the members' local states saved by :meth:`sync`.

        Args:
            should_unsync: ``False`` makes the call a no-op. Default ``True``.

        Raises:
            TorchMetricsUserError: no member is synced.
        """
        if not should_unsync:
            return
        synced = [leaf for leaf in self._unique_leaves() if leaf._is_synced]
        if not synced:
            raise TorchMetricsUserError(f"{type(self).__name__} is not synced; nothing to unsync")
        for leaf in synced:
            leaf.unsync()

    # ------------------------------------------------------------------- update
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Send the batch to the members (all or nothing: a member that raises leaves every member as it was).

        Args:
            args: the batch, as the inner metric's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the inner metric's ``update`` takes them.
        """
        if self._is_synced:
            raise self._synced_error("update")
        if len(self._step_members()) == 1 and type(self)._start_step is WrapperMetric._start_step:
            # one member, whose own update is all or nothing, and nothing of the wrapper's to put back but the count
            count = self._update_count
            try:
                self._run_update(args, kwargs)
            except BaseException:
                self._update_count = count
                raise
            return
        snapshot = self._snapshot()
        try:
            self._run_update(args, kwargs)
        except BaseException:
            self._restore(snapshot)
            raise

    def _run_update(self, args: tuple, kwargs: dict[str, Any]) -> None:
        self._computed = None
        self._add_count(1)
        self._start_step()
        for key, member in self._step_members().items():
            routed = self._route(key, args, kwargs)
            if routed is not None:
                member.update(*routed[0], **routed[1])
        self._end_step()

    def _snapshot(self) -> Any:
        leaves = self._leaves(self._step_members())
        return {k: leaf._snapshot() for k, leaf in leaves.items()}, self._update_count, self._extra_snapshot()

    def _restore(self, snapshot: Any) -> None:
        states, count, extra = snapshot
        leaves = self._leaves(self._all_members())
        for key, saved in states.items():
            leaves[key]._restore(saved)
        self._update_count = count
        self._restore_extra(extra)

    def _extra_snapshot(self) -> Any:
        """The wrapper's own bookkeeping, for an all-or-nothing update. Default: none."""
        return None

    def _restore_extra(self, extra: Any) -> None:
        """Put back :meth:`_extra_snapshot`."""

    # ------------------------------------------------------------------- the batch-step protocol's hooks
    def _begin_batch(self) -> BatchStep:
        if self._is_synced:
            raise self._synced_error("forward")
        step = _WrapperStep(self._computed)
        self._computed = None
        self._add_count(1)
        step.undo = (self._extra_snapshot(), self._start_step())
        for key, member in self._step_members().items():
            if isinstance(member, MetricCollection):
                step.collections[key] = member
            else:
                step.inner[key] = (member, member._begin_batch())
        self.__dict__["_current_step"] = step
        return step

    def _update_batch(self, step: BatchStep, args: tuple, kwargs: dict[str, Any], announce: bool = True) -> None:
        step = cast("_WrapperStep", step)  # (made by _begin_batch)
        step.args, step.kwargs = args, kwargs
        try:
            for key, (member, own) in step.inner.items():
                margs, mkwargs = self._route(key, args, kwargs)
                member._update_batch(own, margs, mkwargs, announce=False)
            for key, coll in step.collections.items():  # its own forward (and its own sync)
                margs, mkwargs = self._route(key, args, kwargs)
                step.values[key] = coll(*margs, **mkwargs)
        except Exception as err:
            engine = self._engine_steps(step)
            if announce and engine:
                device = self._sync_spec().device
                fail_sync(err, self._group(engine), plan=self._plan("local"), owner=type(self).__name__, device=device)
            raise
        step.batch = self._flat({k: cast("dict[str, Any]", step.inner[k][1].batch) for k in self._engine_steps(step)})

    @staticmethod
    def _engine_steps(step: _WrapperStep) -> dict[str, Metric]:
        """The step members that sync their batch through the engine."""
        return {k: m for k, (m, _) in step.inner.items() if m._step_syncs_by_engine()}

    def _sync_batch(self, step: BatchStep, synced: dict[str, Any] | None = None) -> None:
        step = cast("_WrapperStep", step)
        for member, own in step.inner.values():  # members with a custom gather sync alone
            if member.dist_sync_fn is not None and member._step_syncs():
                member._sync_batch(own)
        engine = self._engine_steps(step)
        if not engine:
            return
        if synced is None:
            specs, batch = {"": self._sync_spec()}, {"": step.batch or {}}
            synced = sync_metric_states(specs, batch, self._group(engine), self._plan("local"), "local", "forward")[""]
        for key, states in self._split(synced).items():
            member, own = step.inner[key]
            member._sync_batch(own, states)

    def _batch_value(self) -> Any:
        step: _WrapperStep = self.__dict__["_current_step"]
        for key, (member, _) in step.inner.items():
            step.values[key] = member._batch_value()
        return self._step_value(dict(step.values))

    def _finish_batch(self, step: BatchStep, value: Any) -> Any:
        step = cast("_WrapperStep", step)
        for key, (member, own) in step.inner.items():
            member._finish_batch(own, step.values[key])
        self._end_step()
        self.__dict__["_current_step"] = None
        self.__dict__["_forward_cache"] = detach(value)
        return value

    def _abort_batch(self, step: BatchStep) -> None:
        step = cast("_WrapperStep", step)
        for member, own in step.inner.values():
            member._abort_batch(own)
        extra, undo = step.undo
        self._undo_step(undo)
        self._restore_extra(extra)
        self._add_count(-1)
        self.__dict__["_computed"] = step.computed
        self.__dict__["_current_step"] = None

    def _step_syncs_by_engine(self) -> bool:
        return any(isinstance(m, Metric) and m._step_syncs_by_engine() for m in self._step_members().values())

    def _step_syncs(self) -> bool:
        return any(isinstance(m, Metric) and m._step_syncs() for m in self._step_members().values())

    def _compute_syncs(self) -> bool:
        return any(leaf._compute_syncs() for leaf in self._leaves(self._compute_members()).values())

    def _same_update(self, other: Metric) -> bool:
        return False  # wrappers are never merged into a compute group

    # ------------------------------------------------------------------- the rest of the lifecycle
    def reset(self) -> None:
        """Reset every member and the wrapper's own bookkeeping."""
        super().reset()
        self.__dict__["_current_step"] = None
        for member in self._members().values():
            member.reset()

    def persistent(self, mode: bool = False) -> None:
        """Set whether the members' states are saved in ``state_dict``.

        Args:
            mode: ``True`` saves the states in ``state_dict``. Default ``False``.
        """
        for member in self._members().values():
            member.persistent(mode)

    def set_dtype(self, dst_type: str | torch.dtype) -> WrapperMetric:
        """Cast every member's floating states (see :meth:`~torchmetrics_diff.Metric.set_dtype`).

        Args:
            dst_type: ``torch.float32`` or ``torch.float64`` (or their names).
        """
        super().set_dtype(dst_type)
        for member in self._members().values():
            member.set_dtype(dst_type)
        return self

    def _filter_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        target = self._kwargs_target()
        return kwargs if target is None else target._filter_kwargs(**kwargs)

    def _kwargs_target(self) -> Metric | None:
        """The metric whose ``update`` decides which keyword arguments a collection passes on (``None``: all)."""
        return None
