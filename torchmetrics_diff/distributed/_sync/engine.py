"""The state-sync engine's entry points: every state of a metric or collection in as few collectives as possible.

One sync (:ref:`architecture-sync-engine`), from :func:`sync_states` to the wire:

1. *Pack* — when the caller's :class:`~torchmetrics_diff.distributed._sync.plan.SyncPlan` holds an agreed plan, its
   :class:`~torchmetrics_diff.distributed._sync.layout.Layout` writes this rank's states into the plan's row and
   returns the row's header ints: the plan's key, the length of this rank's metadata and its sizes (the rows of
   each ``cat`` state, the shape of each gathered state). A rank without a plan, or whose states do not match it
   (another signature, an empty list state), sends ``[0, length of its metadata]`` instead.
2. *The call header* — every rank's ints travel in the call's header exchange (``distributed._call``), and a
   CPU row that fits the exchange's inline area rides in it. Every rank sees every rank's ints, so every rank takes
   the same branch:
3. every rank sent the same key: the row (if it did not ride inline) and the large ``sum``/``mean`` buckets move,
   and every state is read from the gathered table. A ``cat`` or gathered state that outgrew its room in the row
   (the sizes say so) makes every rank grow the plan alike and send again: one collective more;
4. otherwise *agreement*: one all-gather of every rank's metadata, validated on every rank alike (a disagreement
   raises the same ``RuntimeError`` everywhere, :mod:`.agreement`), a new plan made from it, and the data moved
   through the new plan's layout.

So a sync of small CPU states costs one collective in the steady state, cat states included, three when the ranks
agree on a plan. The plan is :mod:`.plan`, the layout :mod:`.layout`, the byte rows :mod:`.rows`, the checks
:mod:`.agreement`; what a reduction means is :mod:`torchmetrics_diff.distributed._reductions`.

Gradients: with ``grad="local"`` each rank's own contribution stays in its autograd graph (times ``grad_scale``),
and every other rank's is a constant; the backward needs no communication.
"""

from __future__ import annotations

import operator
from typing import Any, cast

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import (
    Group,
    grad_enabled,
    group_size,
    set_grad_enabled,
)
from torchmetrics_diff.distributed._call import exchange, fresh_count, opening
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._failure import CollectiveError, collective_failed, fail_on_every_rank
from torchmetrics_diff.distributed._reductions import Reduction, State
from torchmetrics_diff.distributed._sync.agreement import GRADS, agree, check_arguments, metadata
from torchmetrics_diff.distributed._sync.layout import Layout
from torchmetrics_diff.distributed._sync.plan import (
    SyncPlan,
    entries,
    local_signature,
    make_plan,
    resize_capacities,
)
from torchmetrics_diff.distributed._sync.rows import align, gather_blob


def sync_states(
    states: dict[str, State],
    reductions: dict[str, Reduction],
    group: Group = None,
    *,
    plan: SyncPlan | None = None,
    grad: str = "none",
    grad_scale: float = 1.0,
    owner: str = "sync_states",
    device: torch.device | None = None,
    call: str = "sync",
) -> dict[str, Any]:
    """Sync every state across ``group`` and return the reduced values.

    Args:
        states: name -> tensor or list of tensors (list states are concatenated along dim 0 first).
        reductions: name -> ``"sum"``, ``"mean"``, ``"min"``, ``"max"``, ``"cat"``, a callable or ``None``.
            For tensor states, callables receive the per-rank values stacked along a new dim 0 (a list when
            their shapes differ) and ``None`` returns that stack itself; list states are always concatenated
            across ranks and a callable then receives the concatenation.
        group: the process group (``None``: default).
        plan: the caller's :class:`SyncPlan`, updated in place; ``None`` costs one collective more.
        grad: ``"none"`` (detached result) or ``"local"`` (each rank's own contribution keeps its graph).
        grad_scale: multiplies the gradient reaching the local inputs (a trainer that averages gradients over
            ``W`` ranks needs ``W``).
        owner: a name for error messages, e.g. the metric's class.
        device: where the communication buffers live (default: the first state's device).
        call: what the sync is for (``"forward"``, ``"compute"``, ...): with ``owner`` it names the call in the
            header every rank exchanges first, so ranks in different calls raise instead of mixing their states.

    Returns:
        name -> synced value. A list state that is empty on every rank stays an empty list.

    Raises:
        RuntimeError: on every rank, naming the state and the ranks, when ranks disagree on the set of
            states, a reduction, a dtype or a shape, or when a rank failed before syncing.

    Example:
        >>> import torch
        >>> sync_states({"total": torch.tensor(3.0)}, {"total": "sum"})  # one process: unchanged
        {'total': tensor(3.)}
    """
    world = group_size(group)
    if world == 1:
        check_arguments(states, reductions, grad)
        scaled = {k: scale_state_grad(v, grad_scale) for k, v in states.items()} if grad == "local" else states
        return {k: _single(v, reductions[k], grad) for k, v in scaled.items()}
    return _sync_across(states, reductions, group, plan, grad, grad_scale, owner, device, world, call)


@outside_graph  # plans, byte rows and validation are Python on the host: one graph break when compiled
def _sync_across(
    states: dict[str, State],
    reductions: dict[str, Reduction],
    group: Group,
    plan: SyncPlan | None,
    grad: str,
    grad_scale: float,
    owner: str,
    device: torch.device | None,
    world: int,
    call: str,
) -> dict[str, Any]:
    """:func:`sync_states` over more than one rank: see the module docstring."""
    plan = plan if plan is not None else SyncPlan()
    # the object's count of calls, the bytes a CPU row may ride in the call's header exchange, this rank
    count, plan.calls, capacity, rank = opening(plan.calls, group)
    device = device if device is not None else _first_device(states)
    layout = plan.layout
    if plan.key and (layout is None or not layout.fits(world, rank, device)):
        layout = plan.layout = Layout.build(plan, reductions, world, rank, device)
    head = None
    if layout is not None and grad in GRADS:
        enabled = grad_enabled()
        if enabled:  # torch.no_grad() without its Python layers (they are slow right after a collective)
            set_grad_enabled(False)
        try:
            head = layout.pack(states, reductions, group, capacity)
        finally:
            if enabled:
                set_grad_enabled(True)
    problem: Exception | None = None
    if head is not None:
        payload = head if not layout.wide else head[:2]  # (a wide plan's sizes are read from its rows)
        want = layout.row_bytes if device.type == "cpu" else 0  # (the group's inline area grows to fit such rows)
    else:
        blob, want = b"", 0  # (the row is not known yet: the next sync's header asks for its room)
        try:  # a bad argument, a failed concatenation, an unknown dtype on one rank: the others must not wait
            check_arguments(states, reductions, grad)
            items = entries(states, reductions)
            signature = local_signature(items, plan)[1]
            sizes = [v for e in items for v in e.variable()]
            blob = metadata(signature, sizes)
        except Exception as err:
            problem = err
        payload = [0, len(blob)]
    try:
        heads = exchange(
            f"{owner}.{call}", payload, group, failed=problem is not None, who=owner, sync=True, count=count,
            want=want,
        )  # fmt: skip
        if problem is not None:
            raise problem
        track = grad == "local" and grad_enabled() and _needs_grad(states)
        # every rank packed this plan's row (the same table object as at the last sync that did: see _call.exchange)
        if head is not None and (heads is layout.last_heads or (heads[0][0] != 0 and _same_key(heads))):
            return _through_layout(plan, layout, heads, states, reductions, group, track, grad_scale)
        mine = layout.metadata() if head is not None else blob
        return _agree(plan, mine, heads, states, reductions, group, world, rank, device, owner, track, grad_scale)
    except CollectiveError as err:
        raise collective_failed(err, owner, list(states), world) from err


def _through_layout(
    plan: SyncPlan,
    layout: Layout,
    heads: list[list[int]],
    states: dict[str, State],
    reductions: dict[str, Reduction],
    group: Group,
    track: bool,
    grad_scale: float,
) -> dict[str, Any]:
    """Every rank packed the plan's row: move it and read it (every rank's header ints are known, unless the plan
    is wide: then they are read from the rows). A state that outgrew its room grows the plan; every rank sends
    again."""
    if layout.wide:
        layout.exchange_rows(group)
        heads = layout.heads_from_table()
        cut = layout.cut(heads)
    else:
        if heads is not layout.last_heads:  # (the same table as at the last sync: its cut holds)
            layout.last_cut, layout.last_heads = layout.cut(heads), heads
        cut = layout.last_cut
        if cut is not None:
            layout.exchange_rows(group)
    if cut is None:  # every rank sees the same sizes: every rank grows the plan alike
        resize_capacities(plan, layout.units(heads))
        layout = plan.layout = Layout.build(plan, reductions, layout.world, layout.rank, layout.device)
        with _no_grad():
            layout.pack(states, reductions, group)  # (the states matched the plan: only the room changed)
        layout.exchange_rows(group)
        cut = cast(tuple, layout.cut(heads))  # (it fits now)
    values = _read(layout, cut, states, reductions, track, grad_scale)
    if cut[2]:  # a room far larger than what every rank sent: the next sync's plan shrinks it
        resize_capacities(plan, cut[2])
    return values


def _agree(
    plan: SyncPlan,
    mine: bytes,
    heads: list[list[int]],
    states: dict[str, State],
    reductions: dict[str, Reduction],
    group: Group,
    world: int,
    rank: int,
    device: torch.device,
    owner: str,
    track: bool,
    grad_scale: float,
) -> dict[str, Any]:
    """No plan, or a rank whose states do not match it: gather every rank's metadata, validate it, make the plan
    from it and move the data through its layout."""
    lengths = [h[1] for h in heads]
    blobs = gather_blob(mine, align(max(lengths)), group, world, device)
    signature, sizes = agree(owner, blobs, lengths, world)
    agreed = make_plan(signature, world, sizes)
    agreed.local, agreed.calls = plan.local, plan.calls
    plan.__dict__.update(agreed.__dict__)
    layout = plan.layout = Layout.build(plan, reductions, world, rank, device)
    with _no_grad():
        packed = layout.pack(states, reductions, group, agreed=True)
    layout.exchange_rows(group)  # (its peers wait for this rank's row)
    if packed is None:  # its states passed the agreement: they fit the plan made from it
        raise RuntimeError(f"{owner}: internal error: this rank's states do not fit the plan every rank agreed on")
    cut = layout.cut([[plan.key, 0, *s] for s in sizes] if layout.cats or layout.gathers else [])
    return _read(layout, cut, states, reductions, track, grad_scale)


def _read(
    layout: Layout,
    cut: Any,
    states: dict[str, State],
    reductions: dict[str, Reduction],
    track: bool,
    grad_scale: float,
) -> dict[str, Any]:
    """Every state's value from the gathered table; with ``track``, this rank's own contribution keeps its graph
    (its gradient times ``grad_scale``)."""
    if track:
        device = layout.device
        own = {
            e.name: None if e.tensor is None else scale_grad(e.tensor.to(device), grad_scale)
            for e in entries(states, reductions)
        }
        return layout.unpack_tracked(cut, own)
    enabled = grad_enabled()
    if enabled:
        set_grad_enabled(False)
    try:
        return layout.unpack(cut)
    finally:
        if enabled:
            set_grad_enabled(True)


class _no_grad:  # torch.no_grad() without its Python layers (they are slow right after a collective)
    __slots__ = ("enabled",)

    def __enter__(self) -> None:
        self.enabled = grad_enabled()
        if self.enabled:
            set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            set_grad_enabled(True)


def _same_key(heads: list[list[int]]) -> bool:
    """Whether every rank's header starts with the same key (C-level passes: groups can be large)."""
    keys = set(map(_first, heads))
    return len(keys) == 1


_first = operator.itemgetter(0)


def _needs_grad(states: dict[str, State]) -> bool:
    """Whether a state (or an item of a list state) requires gradient."""
    for value in states.values():
        if isinstance(value, list):
            if any(v.requires_grad for v in value if isinstance(v, torch.Tensor)):
                return True
        elif isinstance(value, torch.Tensor) and value.requires_grad:
            return True
    return False


def _first_device(states: dict[str, State]) -> torch.device:
    """The device of the first tensor among the states (the CPU when there is none)."""
    for value in states.values():
        first = value[0] if isinstance(value, list) and value else value
        if isinstance(first, torch.Tensor):
            return first.device
    return torch.device("cpu")


def scale_state_grad(value: State, scale: float) -> State:
    """A tensor or list state whose gradient is multiplied by ``scale`` (values unchanged)."""
    if isinstance(value, list):
        return [scale_grad(v, scale) for v in value]
    return scale_grad(value, scale)


def fail_sync(
    problem: BaseException,
    group: Group = None,
    *,
    plan: SyncPlan | None = None,
    owner: str = "sync_states",
    device: torch.device | None = None,
) -> None:
    """Raise ``problem`` here and a ``RuntimeError`` on the ranks syncing with the same ``plan`` meanwhile.

    For a rank that failed (say, inside ``update``) while the others are about to call :func:`sync_states`: it
    joins their header exchange with a failure marker instead of leaving them waiting. Just raises at world size 1.
    """
    world = group_size(group)

    if plan is not None:  # the sync this rank joins counts for the plan as for the peers' (see _sync_across)
        plan.calls = fresh_count(plan.calls, group)[1]

    def join() -> None:
        exchange(f"{owner}.sync", [], group, failed=True)

    fail_on_every_rank(problem, world, join)


def _single(value: State, fn: Reduction, grad: str) -> Any:
    """World size 1: the reductions of one rank, without any collective."""
    if isinstance(value, list):
        if not value:
            return []
        value = torch.cat([_reductions.as_rows(v) for v in value])
        value = value.detach() if grad == "none" else value
        return fn(value) if callable(fn) else value
    if _reductions.is_cat(fn):
        value = _reductions.as_rows(value)
    if grad == "none":
        value = value.detach()
    if not _reductions.is_named(fn):
        return _reductions.apply_stacked(fn, _reductions.stack_ranks([value]))
    return value
