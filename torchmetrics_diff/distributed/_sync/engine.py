"""The state-sync engine's entry points: every state of a metric or collection in as few collectives as possible.

One sync (:ref:`architecture-sync-engine`):

1. *Round A* — one all-gather of a byte row whose size every rank knows without asking, from the cached
   :class:`~torchmetrics_diff.distributed._sync.plan.SyncPlan`: a header (signature hash), the per-rank sizes
   (rows of ``cat`` states, shapes of gathered states), the small ``sum``/``mean``/``min``/``max`` states packed
   per (op, dtype) bucket, and each ``cat`` state padded to the row capacity the plan remembers. When every
   rank's signature matches the plan and its rows fit, that one collective is the whole sync: reductions run
   locally on the gathered rows, identically on every rank, and cat states are cut out of them.
2. *Fallback* — when the plan is missing or a rank's signature differs from it (the first sync, a shape change,
   an empty list state), every rank's full metadata is gathered (inline in round A on the first sync),
   validated (a disagreement raises the same ``RuntimeError`` on every rank) and a new plan is agreed.
3. *Round B* — one padded all-gather of whatever round A could not carry: cat states that outgrew their
   capacity (which then grows), gathered states, and on the fallback path the data itself.
4. Large ``sum``/``mean`` buckets, where moving ``W`` copies would cost more than reducing, take one
   ``all_reduce`` each (:func:`~torchmetrics_diff.distributed._sync.plan.reduce_by_all_reduce`).

So a sync of small CPU states costs one collective in the steady state, cat states included, three on the
first sync. Rounds are in :mod:`.rounds`, the plan in :mod:`.plan`, the checks in :mod:`.agreement`, the byte rows
in :mod:`.rows`, and the steady state's fast path in :mod:`.steady`; what a reduction means is
:mod:`torchmetrics_diff.distributed._reductions`.

Gradients: with ``grad="local"`` each rank's own rows stay in its autograd graph (times ``grad_scale``), and
every other rank's rows are constants; the backward needs no communication.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import (
    Group,
    grad_enabled,
    group_rank,
    group_size,
    set_grad_enabled,
)
from torchmetrics_diff.distributed._call import exchange, fresh_count, inline_buffers, inline_capacity
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._failure import CollectiveError, collective_failed, fail_on_every_rank
from torchmetrics_diff.distributed._reductions import Reduction, State
from torchmetrics_diff.distributed._sync.agreement import check_arguments
from torchmetrics_diff.distributed._sync.plan import (
    Entry,
    SteadyStatus,
    SyncPlan,
    entries,
    local_signature,
    resize_capacities,
)
from torchmetrics_diff.distributed._sync.rounds import Rounds
from torchmetrics_diff.distributed._sync.steady import SteadyPath


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
    """:func:`sync_states` over more than one rank: this rank's part prepared, the call's header exchanged (every
    rank's steady-path header, or a marker), then the steady path when every rank can take it, else the rounds."""
    rank = group_rank(group)
    plan = plan if plan is not None else SyncPlan()
    count, plan.calls = fresh_count(plan.calls)
    steady = plan.steady  # None unless the plan's steady path is READY
    if not (
        steady is not None
        and grad == "none"
        and (steady.world, steady.rank) == (world, rank)
        and (device or _first_device(states)) == steady.device
    ):
        steady = None
    enabled = grad_enabled()
    capacity = inline_capacity(group)  # the bytes a CPU row may ride in the call's header exchange
    want = 0  # the bytes of this rank's CPU row (the group's inline area grows to fit such rows)
    if steady is not None:
        if enabled:  # torch.no_grad() without its Python layers (they are slow right after a collective)
            set_grad_enabled(False)
        try:
            if not steady.pack(states, reductions, capacity):
                steady = None
        finally:
            if enabled:
                set_grad_enabled(True)
    problem: Exception | None = None
    if steady is None:
        try:  # a bad argument, a failed concatenation, an unknown dtype on one rank: the others must not wait
            check_arguments(states, reductions, grad)
            items = entries(states, reductions)
            local_hash, local_sig = local_signature(items, plan)
        except Exception as err:
            problem = err
        if device is None and problem is None:
            device = next((e.tensor.device for e in items if e.tensor is not None), torch.device("cpu"))
        device = device if device is not None else torch.device("cpu")  # (unused when this rank failed)
    else:
        device = steady.device
        want = steady.row_bytes if device.type == "cpu" else 0
    rounds: Rounds | None = None
    inline: _InlineRoundA | None = None
    name = f"{owner}.{call}"
    if steady is not None:
        payload = [_STEADY, *steady.head_ints]
    elif problem is None:
        track = grad == "local" and torch.is_grad_enabled()
        items = _prepared(items, device, track, grad_scale)
        rounds = Rounds(items, plan, group, rank, world, owner, device)
        ints = rounds.head_ints(local_hash)
        payload = [_ROUNDS, *ints] if ints is not None else [_UNKNOWN]
        if ints is not None and device.type == "cpu":
            want = plan.row_bytes
            if plan.row_bytes <= capacity:
                inline = _InlineRoundA(name, payload, group, world, owner, count, capacity)
    else:
        payload = []
    try:
        if inline is not None and rounds is not None:  # round A rides in the header exchange
            with torch.enable_grad() if track else torch.no_grad():
                result = rounds.run_inline(local_hash, local_sig, inline)
            if result is not None:
                if grad == "none":
                    _arm(plan, local_hash, states, reductions, world, rank, device)
                return result
            heads = inline.all_heads
        else:
            heads = exchange(
                name, payload, group, world, failed=problem is not None, who=owner, sync=True, count=count, want=want
            )
    except CollectiveError as err:
        raise collective_failed(err, owner, list(states), world) from err
    if problem is not None:
        raise problem
    if steady is not None:
        if heads is not steady.last_heads:  # (the same table as at the last sync: its cut holds; see steady.py)
            kinds = {h[0] for h in heads}
            steady.last_cut = steady.cut([h[1:] for h in heads]) if kinds == {_STEADY} else None
            steady.last_heads = heads
        cut = steady.last_cut
        if cut is not None:  # every rank packed this plan's row and every cat state fits: the one data collective
            if enabled:
                set_grad_enabled(False)
            try:
                return _steady_sync(steady, cut, group, plan, world, owner)
            finally:
                if enabled:
                    set_grad_enabled(True)
        items = _prepared(entries(states, reductions), device, False, grad_scale)  # passed the steady checks
        local_hash, local_sig = local_signature(items, plan)
        rounds = Rounds(items, plan, group, rank, world, owner, device)
    # every rank's round A header is known when every rank sent one (else round A's table is read for them)
    memo = plan.heads_memo
    if memo is not None and memo[0] is heads:
        known = memo[1]
    else:
        known = [h[1:] for h in heads] if {h[0] for h in heads} == {_ROUNDS} else None
        plan.heads_memo = (heads, known)
    track = grad == "local" and torch.is_grad_enabled()
    with torch.enable_grad() if track else torch.no_grad():
        result = cast(Rounds, rounds).run(local_hash, local_sig, known)
    if grad == "none":
        _arm(plan, local_hash, states, reductions, world, rank, device)
    return result


# what a rank's payload in the call's header starts with: the steady path's header ints, round A's, or neither
_STEADY, _ROUNDS, _UNKNOWN = 1, 2, 3


class _InlineRoundA:
    """Round A of CPU states through the call's header exchange: the row goes into the exchange's inline area, so
    the exchange that identifies the call also moves the data. Called by the row job with the row's pieces."""

    def __init__(
        self, name: str, payload: list[int], group: Group, world: int, owner: str, count: int, capacity: int
    ) -> None:
        self.name, self.payload, self.group, self.world, self.owner = name, payload, group, world, owner
        self.count, self.capacity = count, capacity
        self.all_heads: list[list[int]] = []
        self.heads: list[list[int]] | None = None  # every rank's round A header, when every rank sent its row inline

    def __call__(self, pieces: list[torch.Tensor], row_bytes: int) -> torch.Tensor:
        send, grid = inline_buffers(self.world, self.capacity)
        torch.cat(pieces, out=send[:row_bytes])
        heads = exchange(
            self.name, self.payload, self.group, self.world, who=self.owner, sync=True, count=self.count, want=row_bytes
        )
        self.all_heads = heads
        if {h[0] for h in heads} == {_ROUNDS} and len({len(h) for h in heads}) == 1:
            self.heads = [h[1:] for h in heads]
        return grid[:, :row_bytes]


def _arm(
    plan: SyncPlan,
    local_hash: int,
    states: dict[str, State],
    reductions: dict[str, Reduction],
    world: int,
    rank: int,
    device: torch.device,
) -> None:
    """After a sync of the general engine: build the plan's steady path if it is pending and this rank matched it."""
    if plan.steady_status is SteadyStatus.PENDING and local_hash == plan.signature_hash:
        plan.set_steady(SteadyPath.build(plan, states, reductions, world, rank, device))


def _steady_sync(steady: SteadyPath, cut: Any, group: Group, plan: SyncPlan, world: int, owner: str) -> dict[str, Any]:
    """The steady path's one data collective and its reading (every rank's header is known: nothing is read back)."""
    try:
        steady.gather(group)
    except CollectiveError as err:
        raise collective_failed(err, owner, steady.names, world) from err
    values, rows = steady.unpack(cut)
    if rows:
        resize_capacities(plan, rows)
    return values


def _first_device(states: dict[str, State]) -> torch.device | None:
    """The device the general engine would pick for the buffers when the first state is not an empty list."""
    first = next(iter(states.values()), None)
    if isinstance(first, list):
        first = first[0] if first else None
    return first.device if isinstance(first, torch.Tensor) else None


def _prepared(items: list[Entry], device: torch.device, track: bool, grad_scale: float) -> list[Entry]:
    """Entries moved to ``device``, detached, or (``track``) keeping their graph with the gradient scaled."""
    for e in items:
        if e.tensor is not None:
            e.tensor = e.tensor.to(device)
            e.tensor = scale_grad(e.tensor, grad_scale) if track else e.tensor.detach()
    return items


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
        plan.calls = fresh_count(plan.calls)[1]

    def join() -> None:
        exchange(f"{owner}.sync", [], group, world, failed=True)

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
