"""Syncing the states of one or several metrics: what a metric hands the sync engine, and what comes back.

The engine (:func:`~torchmetrics_diff.distributed._sync.sync_states`) knows tensors, not metrics; a
:class:`~torchmetrics_diff.Metric` knows its states, not collectives. This module is the boundary, as plain
functions over plain data: a metric describes itself as a :class:`SyncSpec` (``Metric._sync_spec``),
:func:`sync_metric_states` syncs the states of any number of such metrics in one engine call (the same buckets, so
a ``MetricCollection`` or a wrapper costs what one metric with all those states costs), and :func:`gather_each` is
the slow path for a user-provided gather. ``Metric.sync``, ``Metric.forward`` (with ``dist_sync_on_step``), a
collection's ``forward`` and ``compute`` and the wrappers call it; the bytes move in
``torchmetrics_diff.distributed``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Union, cast

import torch

from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.distributed._reductions import (
    apply_stacked,
    as_rows,
    cat_rows,
    is_cat,
    is_elementwise,
    reduce_rows,
)
from torchmetrics_diff.distributed._sync import SyncPlan, scale_state_grad, sync_states

Reduction = Union[str, Callable, None]

_ROWS = ":rows"  # suffix of the row-count companion of a list state with a callable reduction


class ItemReduction:
    """The reduction of a list state that receives the items themselves rather than each rank's rows.

    Called with one list per rank (in rank order) of the tensors that rank's list holds, each with the shape it
    was appended with (a 0-d item stays 0-d); what it returns becomes the synced state as it is. The items travel
    as the rows of a ``cat`` state, their row counts in a companion of the same collective. Subclasses define
    ``__call__``; the torchmetrics adapter rebuilds torchmetrics' own sync of such states with it.
    """

    def __call__(self, ranks: list[list[torch.Tensor]]) -> Any:
        """The synced state from every rank's items (``ranks[r]`` holds rank ``r``'s)."""
        raise NotImplementedError


@dataclass(frozen=True)
class SyncSpec:
    """What the sync needs to know about one metric.

    Attributes:
        owner: the metric's class name, for error messages.
        reductions: every state's ``dist_reduce_fx``, in registration order.
        list_states: the names of the list states.
        callable_lists: the list states whose reduction is a callable (it receives every rank's rows).
        grad_reduction: ``"mean"`` scales the local gradient by the group size, ``"sum"`` leaves it.
        device: the device of the metric's states.
    """

    owner: str
    reductions: dict[str, Reduction]
    list_states: tuple[str, ...]
    callable_lists: tuple[str, ...]
    grad_reduction: str
    device: torch.device


def scaled(spec: SyncSpec, states: dict[str, Any], group: Group) -> dict[str, Any]:
    """``states`` whose gradient is multiplied by the group size under ``grad_reduction="mean"``."""
    scale = group_size(group) if spec.grad_reduction == "mean" else 1
    if scale == 1 or not torch.is_grad_enabled():
        return states
    return {n: scale_state_grad(v, scale) for n, v in states.items()}


def sync_metric_states(
    specs: dict[str, SyncSpec],
    states: dict[str, dict[str, Any]],
    group: Group,
    plan: SyncPlan,
    grad: str,
    call: str = "sync",
) -> dict[str, dict[str, Any]]:
    """Sync the states of several metrics in one engine call (the same buckets); returns them per metric.

    Args:
        specs: key -> that metric's :class:`SyncSpec`; a key prefixes the metric's state names in error messages
            ("" for none).
        states: key -> that metric's states to sync.
        group: the process group.
        plan: the caller's :class:`~torchmetrics_diff.distributed._sync.SyncPlan`.
        grad: ``"none"`` or ``"local"`` (each metric's ``grad_reduction`` scales its local gradient).
        call: what the sync is for (``"forward"``, ``"sync"``): names it in the header every rank exchanges first.

    Returns:
        key -> the synced states; a list state comes back as a one-element list holding every rank's rows.
    """
    if any(spec.callable_lists for spec in specs.values()):
        return _sync_callable_lists(specs, states, group, plan, grad, call)
    if len(specs) == 1 and "" in specs:  # one metric under its own names (Metric.sync, forward): no renaming
        spec, own = specs[""], states[""]
        own = scaled(spec, own, group) if grad == "local" else own
        every = spec.reductions  # states in add_state order, as metric_state and the batch states are
        reductions = every if len(own) == len(every) else {name: every[name] for name in own}
        synced = sync_states(
            own, reductions, group, plan=plan, grad=grad, owner=spec.owner, device=spec.device, call=call
        )
        return {"": _as_lists(spec, synced)}
    names = {key: {name: f"{key}.{name}" if key else name for name in states[key]} for key in specs}
    owned = {key: scaled(s, states[key], group) if grad == "local" else states[key] for key, s in specs.items()}
    flat = {names[key][name]: value for key, own in owned.items() for name, value in own.items()}
    reductions = {names[key][name]: specs[key].reductions[name] for key, own in owned.items() for name in own}
    first = next(iter(specs.values()))
    owner = first.owner if len(specs) == 1 else "MetricCollection"
    synced = sync_states(flat, reductions, group, plan=plan, grad=grad, owner=owner, device=first.device, call=call)
    return {
        key: _as_lists(spec, {name: synced[flat_name] for name, flat_name in names[key].items()})
        for key, spec in specs.items()
    }


def _rows_of(value: list) -> int:
    return sum(1 if t.ndim == 0 else t.shape[0] for t in value)


def _counts(value: list, fx: Any) -> list[int]:
    """What the row-count companion of a callable list state carries for one rank: its rows, or for an
    :class:`ItemReduction` its number of items and each item's rows (-1 for a 0-d item)."""
    if isinstance(fx, ItemReduction):
        return [len(value), *(-1 if t.ndim == 0 else t.shape[0] for t in value)]
    return [_rows_of(value)]


def _items(rows: torch.Tensor | None, counts: list[int]) -> list[list[torch.Tensor]]:
    """Every rank's items, cut from the concatenated ``rows`` by every rank's :func:`_counts`, concatenated."""
    out: list[list[torch.Tensor]] = []
    at = offset = 0
    while at < len(counts):
        sizes = counts[at + 1 : at + 1 + counts[at]]
        at += 1 + counts[at]
        spans = [1 if n < 0 else n for n in sizes]
        if rows is None or not spans:
            out.append([])
            continue
        pieces = torch.split(rows[offset : offset + sum(spans)], spans)
        out.append([p.reshape(()) if n < 0 else p for p, n in zip(pieces, sizes)])
        offset += sum(spans)
    return out


def _as_cat(spec: SyncSpec) -> SyncSpec:
    """``spec`` with its callable list reductions read as ``cat``, each with a ``cat`` row-count companion."""
    reductions = dict(spec.reductions)
    for name in spec.callable_lists:
        reductions[name] = "cat"
        reductions[name + _ROWS] = "cat"
    return dataclasses.replace(spec, reductions=reductions, callable_lists=())


def _sync_callable_lists(
    specs: dict[str, SyncSpec], states: dict[str, dict[str, Any]], group: Group, plan: SyncPlan, grad: str, call: str
) -> dict[str, dict[str, Any]]:
    """:func:`sync_metric_states` for metrics with list states whose reduction is a callable.

    torchmetrics hands such a callable the list of every rank's rows (one tensor per rank), so
    ``dist_reduce_fx=torch.cat`` works. Those states travel as ``cat`` states with a companion ``cat`` state of
    their row count (in the same collective), and are split by rank before the callable runs; an
    :class:`ItemReduction` gets every rank's items instead (the companion then counts each item's rows).
    """
    sent_specs: dict[str, SyncSpec] = {}
    sent: dict[str, dict[str, Any]] = {}
    for key, spec in specs.items():
        own = dict(states[key])
        for name in spec.callable_lists:
            if name in own:
                counts = _counts(own[name], spec.reductions[name])
                own[name + _ROWS] = torch.tensor(counts, dtype=torch.int64, device=spec.device)
        sent_specs[key] = _as_cat(spec) if spec.callable_lists else spec
        sent[key] = own
    synced = sync_metric_states(sent_specs, sent, group, plan, grad, call)
    for key, spec in specs.items():
        values = synced[key]
        for name in spec.callable_lists:
            if name not in values:
                continue
            counts = values.pop(name + _ROWS)
            rows = values[name]
            fx = spec.reductions[name]
            if isinstance(fx, ItemReduction):  # (a list: empty on every rank, or their rows in one tensor)
                values[name] = fx(_items(rows[0] if rows else None, counts.tolist()))
                continue
            if isinstance(rows, list):
                if not rows:  # empty on every rank: nothing to reduce, as torchmetrics leaves it
                    continue
                rows = rows[0]
            fn = cast("Callable[[Any], Any]", fx)  # (a callable list state's reduction)
            values[name] = [fn(list(torch.split(rows, counts.tolist())))]
    return synced


def _as_lists(spec: SyncSpec, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each list state's synced concatenation wrapped in a one-element list, as metrics hold it."""
    for name in spec.list_states:
        value = values.get(name)
        if isinstance(value, torch.Tensor):
            values[name] = [value]
    return values


def gather_each(spec: SyncSpec, states: dict[str, Any], gather: Callable, group: Group, grad: str) -> dict[str, Any]:
    """The slow path for a user-provided ``gather(tensor, group=...)``: one call per state, reduced locally.

    Args:
        spec: the metric's :class:`SyncSpec`.
        states: the states to sync.
        gather: returns every rank's tensor, as ``torchmetrics.utilities.distributed.gather_all_tensors``.
        group: the process group.
        grad: ``"local"`` keeps the local gradient (scaled by ``grad_reduction``); ``"none"`` runs without grad.
    """
    if grad == "local":
        return _gather_each(spec, scaled(spec, states, group), gather, group)
    with torch.no_grad():
        return _gather_each(spec, states, gather, group)


def _gather_each(spec: SyncSpec, states: dict[str, Any], gather: Callable, group: Group) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in states.items():
        fx = spec.reductions[name]
        is_list = name in spec.list_states
        if isinstance(value, list):
            value = cat_rows(value)
            value = value if value is not None else torch.zeros(0, device=spec.device)
        pieces = gather(value, group=group)
        if isinstance(fx, ItemReduction):  # every rank's items, cut by every rank's counts (a second gather)
            mine = torch.tensor(_counts(states[name], fx), dtype=torch.int64, device=value.device)
            counts = [c.tolist() for c in gather(mine, group=group)]
            out[name] = fx([_items(p, c)[0] for p, c in zip(pieces, counts)])
            continue
        if name in spec.callable_lists:  # a list state's callable gets every rank's rows, one tensor each
            out[name] = [cast("Callable[[Any], Any]", fx)(list(pieces))]
            continue
        if is_cat(fx) or is_list:
            cat = torch.cat([as_rows(p) for p in pieces])
            out[name] = [cat] if is_list else cat
            continue
        stacked = torch.stack(pieces)
        out[name] = reduce_rows(fx, stacked) if is_elementwise(fx) else apply_stacked(fx, stacked)
    return out
