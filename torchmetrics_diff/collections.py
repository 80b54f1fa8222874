"""``MetricCollection``: several metrics called as one, synced together in the same buckets.

Syncing member by member would cost one collective per member (or more); the collection hands every member's
states to the sync engine at once, so the whole collection costs what one metric with all those states costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from torchmetrics_diff.composition import _route_kwargs
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.distributed._compile import compiling, outside_graph
from torchmetrics_diff.distributed._sync import SyncPlan, fail_sync
from torchmetrics_diff.metric import Metric, sync_metrics


class MetricCollection(nn.ModuleDict):
    """A dict of metrics updated, computed, reset and synced together.

    Args:
        metrics: a metric, a sequence of metrics (keyed by class name), a dict name -> metric, or nested
            collections (their members join this one under their own prefixed names).
        prefix: put before every key of the results.
        postfix: put after every key of the results.
        compute_groups: lists of member names whose states are identical by construction (same states, same
            ``update``); only the first of each group updates, the others read its states. Never inferred.

    Raises:
        ValueError: duplicate names, members that are not metrics, or a compute group whose members differ in
            their states or are unknown.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MetricCollection, SumMetric, MeanMetric, MaxMetric
        >>> metrics = MetricCollection([SumMetric(), MeanMetric(), MaxMetric()], prefix="train/")
        >>> out = metrics(torch.tensor([1.0, 2.0, 6.0]))
        >>> {k: round(v.item(), 2) for k, v in out.items()}
        {'train/SumMetric': 9.0, 'train/MeanMetric': 3.0, 'train/MaxMetric': 6.0}
    """

    def __init__(
        self,
        metrics: Metric | Sequence[Metric] | dict[str, Metric | MetricCollection],
        *additional_metrics: Metric,
        prefix: str | None = None,
        postfix: str | None = None,
        compute_groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"`{name}` must be a string or None; got {type(value).__name__}")
        self.prefix = prefix or ""
        self.postfix = postfix or ""
        for name, metric in self._named(metrics, additional_metrics):
            if name in self:
                raise ValueError(f"two members of the collection are named {name!r}; use a dict to name them")
            self[name] = metric
        self._groups = self._check_groups(compute_groups or [])
        self._sync_plans: dict[tuple[str, Any], SyncPlan] = {}

    @staticmethod
    def _named(metrics: Any, extra: Iterable[Metric]) -> list[tuple[str, Metric]]:
        if isinstance(metrics, (Metric, MetricCollection)):
            metrics = [metrics]
        if isinstance(metrics, dict):
            items = list(metrics.items())
        elif isinstance(metrics, Sequence):
            items = [(None, m) for m in [*metrics, *extra]]
        else:
            raise ValueError(f"`metrics` must be a Metric, a sequence or a dict of them; got {type(metrics).__name__}")
        out = []
        for name, m in items:
            if isinstance(m, MetricCollection):
                out += [(m._key(k), v) for k, v in m.items()]
            elif isinstance(m, Metric):
                out.append((name if name is not None else type(m).__name__, m))
            else:
                raise ValueError(f"every member must be a Metric or a MetricCollection; got {type(m).__name__}")
        return out

    def _check_groups(self, groups: Sequence[Sequence[str]]) -> list[list[str]]:
        if (
            isinstance(groups, (str, bytes))
            or not isinstance(groups, Sequence)
            or any(
                isinstance(g, (str, bytes)) or not isinstance(g, Sequence) or not all(isinstance(n, str) for n in g)
                for g in groups
            )
        ):
            raise ValueError(f"`compute_groups` must be a list of lists of member names; got {groups!r}")
        seen: set[str] = set()
        out = []
        for group in groups:
            group = list(group)
            unknown = [n for n in group if n not in self]
            if unknown or len(group) < 2:
                raise ValueError(f"compute group {group} must name at least two members of {list(self)}")
            if seen & set(group):
                raise ValueError(f"member(s) {sorted(seen & set(group))} appear in two compute groups")
            seen |= set(group)
            leader = self[group[0]]
            for name in group[1:]:
                other = self[name]
                if other._reductions != leader._reductions or type(other)._raw_update is not type(leader)._raw_update:
                    raise ValueError(
                        f"compute group {group}: {name!r} does not have the states and update of {group[0]!r}"
                    )
            out.append(group)
        return out

    def _plan(self, kind: str, group: Group) -> SyncPlan:
        """One agreed plan per (step | epoch, process group): ranks of a group see the same sequence of syncs."""
        return self._sync_plans.setdefault((kind, group), SyncPlan())

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}{self.postfix}"

    def _leaders(self) -> dict[str, Metric]:
        followers = {n for g in self._groups for n in g[1:]}
        return {n: m for n, m in self.items() if n not in followers}

    def _share_group_states(self) -> None:
        for group in self._groups:
            leader = self[group[0]]
            for name in group[1:]:
                self[name]._set_states(leader.metric_state)
                self[name]._update_count = leader._update_count  # (a tensor when compiled: no guard, no break)
                self[name]._computed = None

    def _results(self, values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in values.items():
            if isinstance(value, dict):
                out.update({self._key(f"{name}_{k}"): v for k, v in value.items()})
            else:
                out[self._key(name)] = value
        return out

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Update every member; keyword arguments go to the members whose ``update`` accepts them."""
        leaders = self._leaders()
        snapshots = {name: m._snapshot() for name, m in leaders.items()}
        try:
            for m in leaders.values():
                m.update(*args, **_route_kwargs(m, kwargs))
        except BaseException:  # all or nothing: a retry must not count the batch twice in some members
            for name, m in leaders.items():
                m._restore(snapshots[name])
            raise
        finally:
            self._share_group_states()

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Every member's batch value; members with ``dist_sync_on_step`` are synced in one engine call."""
        if compiling() and any(m._syncs_on_step_eagerly() for m in self.values()):
            return _eager_forward(self, *args, **kwargs)  # one graph break: see Metric._syncs_on_step_eagerly
        leaders = self._leaders()
        routed = {n: _route_kwargs(m, kwargs) for n, m in leaders.items()}
        accumulated: dict[str, dict[str, Any]] = {}
        syncing = self._syncing({n: m for n, m in leaders.items() if m._syncs_on_step()})
        try:
            for name, m in leaders.items():
                accumulated[name] = m._begin_batch(args, routed[name], fail_with_peers=False)
        except Exception as err:
            for name, acc in accumulated.items():
                leaders[name]._abort_batch(acc)
            for group in syncing:  # the other ranks wait in these syncs: let them raise too
                try:
                    device = next(iter(syncing[group].values())).device
                    fail_sync(err, group, plan=self._plan("step", group), owner="MetricCollection", device=device)
                except Exception as announced:
                    if announced is not err:
                        raise
            raise
        try:
            batches = {name: m.metric_state for name, m in leaders.items()}
            for name, m in leaders.items():
                if m.dist_sync_on_step and m.dist_sync_fn is not None and group_size(m.process_group) > 1:
                    m._set_states(m._sync_values(batches[name], grad="local"))
            for group, members in syncing.items():
                synced = sync_metrics(
                    members, {n: batches[n] for n in members}, group, self._plan("step", group), "local"
                )
                for n, states in synced.items():
                    leaders[n]._set_states(states)
            self._share_group_states()
            values = {name: m._batch_value() for name, m in self.items()}
        except BaseException:
            for name, acc in accumulated.items():
                leaders[name]._abort_batch(acc)
            self._share_group_states()
            raise
        for name, m in leaders.items():
            m._end_batch(accumulated[name], batches[name], args, routed[name])
        self._share_group_states()
        return self._results(values)

    @staticmethod
    def _syncing(members: dict[str, Metric]) -> dict[Group, dict[str, Metric]]:
        """Members that sync through the engine, by process group (all of them in one engine call per group)."""
        out: dict[Any, dict[str, Metric]] = {}
        for name, m in members.items():
            out.setdefault(m.process_group, {})[name] = m
        return out

    def compute(self) -> dict[str, Any]:
        """Every member's epoch value; all members' states synced in one engine call."""
        if compiling() and any(m.sync_on_compute and group_size(m.process_group) > 1 for m in self.values()):
            return _eager_compute(self)  # one graph break: the sync runs inside try/finally
        leaders = self._leaders()
        syncing = {
            n: m for n, m in leaders.items() if m.sync_on_compute and m._synced_cache is None and not m._cache_usable()
        }
        synced_here: list[Metric] = []
        try:
            for group, members in self._syncing_for_compute(syncing).items():
                states = {n: m.metric_state for n, m in members.items()}
                synced = sync_metrics(members, states, group, self._plan("epoch", group), "none")
                for n, m in members.items():
                    m._synced_cache = states[n]
                    m._set_states(synced[n])
                    synced_here.append(m)
            self._share_group_states()
            values = {name: m.compute() for name, m in self.items()}
        finally:
            for m in synced_here:
                m.unsync()
            self._share_group_states()
        return self._results(values)

    def _syncing_for_compute(self, members: dict[str, Metric]) -> dict[Any, dict[str, Metric]]:
        out: dict[Any, dict[str, Metric]] = {}
        for name, m in members.items():
            if m.dist_sync_fn is None and m._defaults and group_size(m.process_group) > 1:
                out.setdefault(m.process_group, {})[name] = m
        return out

    def reset(self) -> None:
        """Reset every member."""
        for m in self.values():
            m.reset()

    def clone(self, prefix: str | None = None, postfix: str | None = None) -> MetricCollection:
        """A deep copy, optionally with a new prefix/postfix."""
        from copy import deepcopy

        new = deepcopy(self)
        new._sync_plans = {}
        if prefix is not None:
            new.prefix = prefix
        if postfix is not None:
            new.postfix = postfix
        return new

    def __getstate__(self) -> dict[str, Any]:
        # pickles and deep copies start without agreed plans: a plan is only valid while every rank of its group
        # holds the same one, which a copy made (or loaded) on some ranks does not guarantee
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state["_sync_plans"] = {}
        return state

    def persistent(self, mode: bool = True) -> None:
        """Set persistence of every member's states."""
        for m in self.values():
            m.persistent(mode)

    def __repr__(self) -> str:
        inner = ",\n".join(f"  ({k}): {m!r}" for k, m in self.items())
        extra = "".join(f", {n}={v!r}" for n, v in (("prefix", self.prefix), ("postfix", self.postfix)) if v)
        return f"{type(self).__name__}(\n{inner}{extra}\n)"


# Under torch.compile with more than one rank, forward and compute run eagerly behind one graph break each.
_eager_forward = outside_graph(MetricCollection.forward)
_eager_compute = outside_graph(MetricCollection.compute)
