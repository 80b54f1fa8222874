"""``MetricCollection``: several metrics called as one, synced together in the same buckets.

Syncing member by member would cost one collective per member (or more); the collection hands every member's
states to the sync engine at once, so the whole collection costs what one metric with all those states costs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from copy import deepcopy
from typing import Any, Callable, ClassVar, cast

from torch import nn

from torchmetrics_diff._batch_step import BatchStep, run_batch_step
from torchmetrics_diff._collection_views import (
    ValueView,
    build_views,
    clear_views,
    declared_keys,
    register_views_with_torchmetrics,
)
from torchmetrics_diff._dynamo import run_outside_graph, steps_outside_graph
from torchmetrics_diff._state_sync import sync_metric_states
from torchmetrics_diff._tensors import detach
from torchmetrics_diff._torchmetrics import synced_hint
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._sync import SyncPlan, fail_sync
from torchmetrics_diff.metric import Metric


class _CollectionStep:
    """A collection's batch (the batch-step protocol): each updating member's own step, the members that sync
    through the engine by process group, and whether every member updated (an abort then shares the restored
    states with the followers)."""

    __slots__ = ("leaders", "steps", "syncing", "updated")

    def __init__(self, leaders: dict[str, Metric], syncing: dict[Group, dict[str, Metric]]) -> None:
        self.leaders = leaders
        self.syncing = syncing
        self.steps: dict[str, BatchStep] = {}
        self.updated = False


class MetricCollection(nn.ModuleDict):
    """A dict of metrics updated, computed, reset and synced together.

    Keys follow torchmetrics: iteration, :meth:`keys` and :meth:`items` give the names with ``prefix`` and
    ``postfix`` (``keep_base=True`` for the bare member names), and ``collection[key]`` accepts either form.

    Args:
        metrics: a metric, a sequence of metrics (keyed by class name), a dict name -> metric (added in sorted
            key order), or nested collections (a nested collection's members join under their prefixed names;
            in a dict, under ``f"{key}_{name}"``).
        additional_metrics: more metrics when ``metrics`` is a metric or a sequence; anything else among them is
            ignored with a warning.
        prefix: put before every key of the results. Default ``None``.
        postfix: put after every key of the results. Default ``None``.
        compute_groups: lists of member names whose states are identical by construction (same states, same
            ``update``); only the first of each group updates, the others read its states. A group may have one
            member. ``True``, ``False`` or ``None``: no groups (they are never inferred from values).

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

    _modules: dict[str, Metric]  # type: ignore[assignment]  # every member is a Metric (add_metrics checks it)
    # forward and compute run eagerly behind one graph break (_dynamo.run_outside_graph)
    _outside_forward: ClassVar[Callable[..., Any]]
    _outside_compute: ClassVar[Callable[..., Any]]

    def __init__(
        self,
        metrics: Metric | Sequence[Metric] | dict[str, Metric | MetricCollection],
        *additional_metrics: Metric,
        prefix: str | None = None,
        postfix: str | None = None,
        compute_groups: Sequence[Sequence[str]] | bool | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"`{name}` must be a string or None; got {type(value).__name__}")
        self.prefix = prefix or ""
        self.postfix = postfix or ""
        self._affixes: dict[str, tuple[str, str]] = {}  # member -> prefix/postfix of the collection it came from
        self._sync_plans: dict[tuple[str, Any], SyncPlan] = {}
        self._group_spec = [] if isinstance(compute_groups, bool) or compute_groups is None else compute_groups
        # the views of the dict-valued members' entries (see items()), rebuilt when the layout they follow changes
        self._views: tuple[Any, dict[str, dict[str, ValueView]]] | None = None
        register_views_with_torchmetrics()
        self._groups: list[list[str]] = []
        self.add_metrics(metrics, *additional_metrics)

    def add_metrics(
        self, metrics: Metric | Sequence[Metric] | dict[str, Metric | MetricCollection], *additional_metrics: Metric
    ) -> None:
        """Add members, named as in the constructor; the compute groups are checked again.

        Args:
            metrics: a metric, a sequence of metrics (named by their class), or a dict of metrics and collections
                (named by their key).
            additional_metrics: more metrics, when ``metrics`` is one.

        Raises:
            ValueError: a name already taken, a member that is not a metric, or extra arguments after a dict.

        Example:
            >>> from torchmetrics_diff import MetricCollection, SumMetric, MaxMetric
            >>> metrics = MetricCollection([SumMetric()], prefix="val/")
            >>> metrics.add_metrics({"peak": MaxMetric()})
            >>> list(metrics)
            ['val/SumMetric', 'val/peak']
        """
        for name, metric, affixes in self._named(metrics, additional_metrics):
            if name in self._modules:
                raise ValueError(f"two members of the collection are named {name!r}; use a dict to name them")
            self.add_module(name, metric)
            if affixes != ("", ""):
                self._affixes[name] = affixes
        self._sync_plans = {}
        self._views = None
        self._groups = self._check_groups(self._group_spec)

    @staticmethod
    def _named(metrics: Any, extra: tuple) -> list[tuple[str, Metric, tuple[str, str]]]:
        """(name, member, (prefix, postfix) of the nested collection it came from) for every new member."""
        if isinstance(metrics, (Metric, MetricCollection)):
            metrics = [metrics]
        if isinstance(metrics, dict):
            if extra:
                raise ValueError(
                    "`additional_metrics` cannot follow a dict of metrics (put them in the dict); "
                    f"got {len(extra)} extra argument(s)"
                )
            items = [(key, metrics[key]) for key in sorted(metrics)]
        elif isinstance(metrics, Sequence) and not isinstance(metrics, (str, bytes)):
            ignored = [m for m in extra if not isinstance(m, (Metric, MetricCollection))]
            if ignored:
                warnings.warn(
                    f"MetricCollection: extra arguments {ignored!r} are not metrics and are ignored",
                    UserWarning,
                    stacklevel=3,
                )
            items = [(None, m) for m in [*metrics, *(m for m in extra if isinstance(m, (Metric, MetricCollection)))]]
        else:
            raise ValueError(f"`metrics` must be a Metric, a sequence or a dict of them; got {type(metrics).__name__}")
        out = []
        for name, m in items:
            if isinstance(m, MetricCollection):
                affixes = (m.prefix, m.postfix)
                for key, member in zip(m.keys(), m.values()):
                    out.append((key if name is None else f"{name}_{key}", member, affixes))
            elif isinstance(m, Metric):
                out.append((name if name is not None else type(m).__name__, m, ("", "")))
            else:
                raise ValueError(
                    f"every member must be a Metric or a MetricCollection; got {type(m).__name__}{synced_hint(m)}"
                )
        return out

    @property
    def compute_groups(self) -> dict[int, list[str]]:
        """The compute groups by index, members outside any given group each in a group of their own."""
        grouped = {n for g in self._groups for n in g}
        every = [*self._groups, *([n] for n in self._modules if n not in grouped)]
        return {i: list(g) for i, g in enumerate(every)}

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
            unknown = [n for n in group if n not in self._modules]
            if unknown or not group:
                raise ValueError(
                    f"compute group {group} must name members of the collection {list(self._modules)}; "
                    f"unknown: {unknown}"
                )
            if seen & set(group):
                raise ValueError(f"member(s) {sorted(seen & set(group))} appear in two compute groups")
            seen |= set(group)
            leader = self._modules[group[0]]
            for name in group[1:]:
                other = self._modules[name]
                if not leader._same_update(other):
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

    def _base(self, key: str) -> str:
        """A member's bare name from its key with or without this collection's prefix and postfix."""
        if key in self._modules:
            return key
        if self.prefix and key.startswith(self.prefix):
            key = key[len(self.prefix) :]
        if self.postfix and key.endswith(self.postfix):
            key = key[: len(key) - len(self.postfix)]
        return key

    # ------------------------------------------------ dict access, as torchmetrics' MetricCollection
    def keys(self, keep_base: bool = False) -> Iterable[str]:  # type: ignore[override]
        """The members' keys: with prefix and postfix, or the bare names with ``keep_base=True``.

        Args:
            keep_base: ``True`` gives the names without prefix and postfix. Default ``False``.
        """
        return self._modules.keys() if keep_base else {self._key(n): m for n, m in self._modules.items()}.keys()

    def items(self, keep_base: bool = False, copy_state: bool = True) -> Iterable[tuple[str, Any]]:  # type: ignore[override]
        """``(key, metric)`` pairs, one per value that :meth:`compute` returns: what Lightning's
        ``self.log_dict(collection)`` logs.

        A member with a tensor value is itself, under its key (as in :meth:`keys`). A member whose value is a dict
        and which declares that dict's keys (``result_keys()``: the cross-modal retrieval metrics, a
        :class:`~torchmetrics_diff.wrappers.ClasswiseWrapper` with ``labels`` or a metric that has
        ``num_classes``/``num_labels``, ``MinMaxMetric``, ``BootStrapper``, a ``MultitaskWrapper`` of tensor-valued
        tasks) gives one tensor-valued view per entry, under the entry's key in
        :meth:`compute`'s flattened results; the views share the member's states and compute it once for all of
        them. ``keep_base=True`` gives the members under their bare names, views never.

        Args:
            keep_base: ``True`` gives the members under the names without prefix and postfix. Default ``False``.
            copy_state: ignored (torchmetrics' argument). Default ``True``.
        """
        if keep_base:
            return self._modules.items()
        views = self._entry_views()
        out: dict[str, Any] = {}
        for name, m in self._modules.items():
            if name in views:
                out.update(views[name])
            else:
                out[self._key(name)] = m
        return out.items()

    def _entry_views(self) -> dict[str, dict[str, ValueView]]:
        """The views of the members that declare dict keys: ``{member: {flattened key: view}}``, the same objects
        as long as the members, their keys and the prefix/postfix stay (Lightning finds them by identity)."""
        register_views_with_torchmetrics()
        declared = {n: k for n, k in ((n, declared_keys(m)) for n, m in self._modules.items()) if k is not None}
        layout = (
            self.prefix,
            self.postfix,
            tuple((n, id(m), tuple(declared.get(n, ()))) for n, m in self._modules.items()),
        )
        if self._views is None or self._views[0] != layout:
            names = self._flat_names({n: declared.get(n) for n in self._modules})
            built = build_views(self._modules, declared)
            views = {n: {names[n][k]: view for k, view in built[n].items()} for n in declared}
            self._views = (layout, views)
        return self._views[1]

    def named_modules(
        self, memo: set[Any] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Any]]:
        """``nn.Module``'s, then the views of the dict-valued members' entries (see :meth:`items`), named
        ``"<member>[<entry>]"``: Lightning finds a metric passed to ``self.log`` among the module's
        ``named_modules()``. The views hold no parameter, buffer or state, and are not children (``state_dict``,
        ``.to()`` and ``children()`` do not see them)."""
        memo = set() if memo is None else memo
        visited = self in memo
        yield from super().named_modules(memo, prefix, remove_duplicate)
        if visited:
            return
        for name, by_key in self._entry_views().items():
            for view in by_key.values():
                if view in memo:
                    continue
                if remove_duplicate:
                    memo.add(view)
                yield f"{prefix}{'.' if prefix else ''}{name}[{view.key}]", view

    def values(self, copy_state: bool = True) -> Iterable[Metric]:  # type: ignore[override]
        """The members. ``copy_state`` is accepted for torchmetrics' sake.

        Args:
            copy_state: ignored (torchmetrics' argument). Default ``True``.
        """
        return self._modules.values()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __getitem__(self, key: str, copy_state: bool = True) -> Metric:
        """A member by bare name or by key with this collection's prefix/postfix."""
        try:
            return self._modules[self._base(key)]
        except KeyError:
            raise KeyError(f"{key!r} is not a member of the collection; members: {list(self.keys())}") from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._base(key) in self._modules

    def __setitem__(self, key: str, metric: Metric) -> None:  # type: ignore[override]
        if not isinstance(metric, Metric):
            hint = synced_hint(metric)
            raise ValueError(f"every member must be a Metric; got {type(metric).__name__} for {key!r}{hint}")
        self.add_metrics({key: metric})

    def _leaders(self) -> dict[str, Metric]:
        followers = {n for g in self._groups for n in g[1:]}
        return {n: m for n, m in self._modules.items() if n not in followers}

    def _share_group_states(self) -> None:
        for group in self._groups:
            leader = self._modules[group[0]]
            for name in group[1:]:
                self._modules[name]._share_states(leader)

    def _flat_names(self, keys: dict[str, list[str] | None]) -> dict[str, dict[str, str]]:
        """Where each entry of a dict value goes in the flat results, from the members' keys (``None``: a tensor
        value): ``{member: {entry: flattened key}}``; ``{member}_{entry}`` only on clashes, as torchmetrics."""
        seen: set[str] = set()
        clash = False
        for name, entries in keys.items():
            for key in entries if entries is not None else (name,):
                clash = clash or key in seen
                seen.add(key)
        out: dict[str, dict[str, str]] = {}
        for name, entries in keys.items():
            if entries is None:
                continue
            prefix, postfix = self._affixes.get(name, ("", ""))
            out[name] = {}
            for entry in entries:
                key = entry
                if clash:  # as torchmetrics: the member's name without its nested affixes, then the key
                    stripped = name.replace(prefix, "") if prefix else name
                    stripped = stripped.replace(postfix, "") if postfix else stripped
                    key = f"{stripped}_{key}"
                out[name][entry] = self._key(f"{prefix}{key}{postfix}")
        return out

    def _results(self, values: dict[str, Any]) -> dict[str, Any]:
        """One flat dict: a member's dict value is spread by its own keys (``{member}_{key}`` only on clashes)."""
        names = self._flat_names({n: list(v) if isinstance(v, dict) else None for n, v in values.items()})
        out = {}
        for name, value in values.items():
            if isinstance(value, dict):
                out.update({names[name][key]: v for key, v in value.items()})
            else:
                out[self._key(name)] = value
        return out

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Update every member; keyword arguments go to the members whose ``update`` accepts them.

        Args:
            args: the batch, passed to every member's ``update``.
            kwargs: keyword arguments, each passed to the members whose ``update`` accepts it.
        """
        leaders = self._leaders()
        snapshots = {name: m._snapshot() for name, m in leaders.items()}
        try:
            for m in leaders.values():
                m.update(*args, **m._filter_kwargs(**kwargs))
        except BaseException:  # all or nothing: a retry must not count the batch twice in some members
            for name, m in leaders.items():
                m._restore(snapshots[name])
            raise
        finally:
            self._share_group_states()

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Every member's batch value; members with ``dist_sync_on_step`` are synced in one engine call.

        The collection runs the batch-step protocol (``torchmetrics_diff._batch_step``) over its members: each
        member's hooks in turn, and the members that sync through the engine synced together between their
        ``update`` and their value.

        Args:
            args: the batch, passed to every member.
            kwargs: keyword arguments, each passed to the members whose ``update`` accepts it.
        """
        if compiling() and any(steps_outside_graph(m) for m in self._modules.values()):
            return self._outside_forward(self, *args, **kwargs)  # one graph break: see _dynamo.steps_outside_graph
        return run_batch_step(self, args, kwargs)

    # ------------------------------------------------ the batch-step protocol over the members (see _batch_step)
    def _begin_batch(self) -> _CollectionStep:
        leaders = self._leaders()
        return _CollectionStep(leaders, self._by_group({n: m for n, m in leaders.items() if m._step_syncs_by_engine()}))

    def _update_batch(self, step: _CollectionStep, args: tuple, kwargs: dict[str, Any]) -> None:
        """Begin and update every updating member; a failure is announced once per process group that syncs."""
        try:
            for name, m in step.leaders.items():
                step.steps[name] = m._begin_batch()
                m._update_batch(step.steps[name], args, m._filter_kwargs(**kwargs), announce=False)
        except Exception as err:
            for group, members in step.syncing.items():  # the other ranks wait in these syncs: let them raise too
                try:
                    device = next(iter(members.values())).device
                    fail_sync(err, group, plan=self._plan("step", group), owner="MetricCollection", device=device)
                except Exception as announced:
                    if announced is not err:
                        raise
            raise
        step.updated = True

    def _step_syncs(self) -> bool:
        return True  # (_sync_batch syncs the members that sync on step: none is nothing to do)

    def _sync_batch(self, step: _CollectionStep) -> None:
        """The members with a custom gather alone, the others in one engine call per process group."""
        for name, m in step.leaders.items():
            if m.dist_sync_fn is not None and m._step_syncs():  # its own gather: alone
                m._sync_batch(step.steps[name])
        for group, members in step.syncing.items():
            specs = {n: m._sync_spec() for n, m in members.items()}
            batches = {n: cast("dict[str, Any]", step.steps[n].batch) for n in members}  # set by _update_batch
            synced = sync_metric_states(specs, batches, group, self._plan("step", group), "local", "forward")
            for n, states in synced.items():
                step.leaders[n]._sync_batch(step.steps[n], states)
        self._share_group_states()

    def _batch_value(self) -> dict[str, Any]:
        return {name: m._batch_value() for name, m in self._modules.items()}

    def _finish_batch(self, step: _CollectionStep, values: dict[str, Any]) -> dict[str, Any]:
        for name, m in step.leaders.items():
            m._finish_batch(step.steps[name], values[name])
        self._share_group_states()
        for name, m in self._modules.items():
            m._forward_cache = detach(values[name])
        return self._results(values)

    def _abort_batch(self, step: _CollectionStep) -> None:
        for name, own in step.steps.items():
            step.leaders[name]._abort_batch(own)
        if step.updated:
            self._share_group_states()

    @staticmethod
    def _by_group(members: dict[str, Metric]) -> dict[Group, dict[str, Metric]]:
        """``members`` by process group (all of them in one engine call per group)."""
        out: dict[Any, dict[str, Metric]] = {}
        for name, m in members.items():
            out.setdefault(m.process_group, {})[name] = m
        return out

    def compute(self) -> dict[str, Any]:
        """Every member's epoch value; all members' states synced in one engine call."""
        if compiling() and any(m._compute_syncs() for m in self._modules.values()):
            return self._outside_compute(self)  # one graph break: the sync runs inside try/finally
        leaders = self._leaders()
        synced_here: list[Metric] = []
        try:
            for group, members in self._by_group({n: m for n, m in leaders.items() if m._joins_compute_sync()}).items():
                states = {n: m.metric_state for n, m in members.items()}
                specs = {n: m._sync_spec() for n, m in members.items()}
                synced = sync_metric_states(specs, states, group, self._plan("epoch", group), "none")
                for n, m in members.items():
                    m._hold_synced(states[n], synced[n])
                    synced_here.append(m)
            for group in self._groups:  # followers read their leader's synced states: they must not sync them again
                leader = self._modules[group[0]]
                if leader._is_synced:
                    for name in group[1:]:
                        local = cast("dict[str, Any]", leader._synced_cache)  # (not None: the leader is synced)
                        self._modules[name]._hold_synced(local, leader.metric_state)
                        synced_here.append(self._modules[name])
            self._share_group_states()
            values = {name: m.compute() for name, m in self._modules.items()}
        finally:
            for m in synced_here:
                m.unsync()
            self._share_group_states()
        return self._results(values)

    def reset(self) -> None:
        """Reset every member."""
        for m in self._modules.values():
            m.reset()
        if self._views is not None:
            clear_views(self._views[1])

    def clone(self, prefix: str | None = None, postfix: str | None = None) -> MetricCollection:
        """A deep copy, optionally with a new prefix/postfix.

        Args:
            prefix: the copy's prefix. Default ``None``: this collection's.
            postfix: the copy's postfix. Default ``None``: this collection's.
        """
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
        state["_views"] = None  # rebuilt on first use, around the copy's own members
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        register_views_with_torchmetrics()

    def persistent(self, mode: bool = True) -> None:
        """Set persistence of every member's states.

        Args:
            mode: ``True`` saves the states in ``state_dict``. Default ``True``.
        """
        for m in self._modules.values():
            m.persistent(mode)

    def set_dtype(self, dst_type: Any) -> MetricCollection:
        """Cast every member's floating states (see :meth:`Metric.set_dtype`).

        Args:
            dst_type: the dtype (a ``torch.dtype`` or its name).
        """
        for m in self._modules.values():
            m.set_dtype(dst_type)
        return self

    def plot(self, val: Any = None, ax: Any = None, together: bool = False) -> Any:
        """Plot the members' values: one figure per member, or all of them in one with ``together=True``.

        Args:
            val: a result of ``forward``/``compute`` (a dict by key), a sequence of them, or ``None`` for
                :meth:`compute`.
            ax: an ``Axes`` (``together=True``) or a sequence of one per member; ``None`` makes new figures.
            together: draw every member into one axes.

        Returns:
            ``(figure, axes)`` with ``together=True``, else a list of them, one per member.

        Raises:
            ValueError: ``together`` is not a bool, or ``ax`` does not match it.
            ModuleNotFoundError: matplotlib is not installed (the ``plot`` extra: ``pip install 'matplotlib>=3.6'``).
        """
        if not isinstance(together, bool):
            raise ValueError(f"`together` must be a bool; got {type(together).__name__}")
        val = self.compute() if val is None else val
        if together:
            from torchmetrics_diff._plot import plot_values

            return plot_values(val, ax=ax, name=type(self).__name__)
        keys = list(self.keys())
        if ax is not None and (not isinstance(ax, Sequence) or len(ax) != len(keys)):
            raise ValueError(f"`ax` must be a sequence of {len(keys)} axes (one per member) when together=False")
        out = []
        for i, (key, m) in enumerate(zip(keys, self._modules.values())):
            mine = val[key] if isinstance(val, dict) else [v[key] for v in val]
            out.append(m.plot(mine, ax=None if ax is None else ax[i]))
        return out

    def __repr__(self) -> str:
        """torchmetrics' layout: ``nn.Module``'s, then ``prefix=...`` and ``postfix=...`` lines (unquoted)."""
        text = super().__repr__()[:-2] if self._modules else f"{type(self).__name__}("
        if self.prefix:
            text += f",\n  prefix={self.prefix}{',' if self.postfix else ''}"
        if self.postfix:
            text += f"{',' if not self.prefix else ''}\n  postfix={self.postfix}"
        return text + ("\n)" if self._modules or self.prefix or self.postfix else ")")


# Under torch.compile with more than one rank, forward and compute run eagerly behind one graph break each.
run_outside_graph(MetricCollection, {"_outside_forward": "forward", "_outside_compute": "compute"})
