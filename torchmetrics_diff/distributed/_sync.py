"""The state-sync engine: every state of a metric or collection in as few collectives as possible.

One sync is (DESIGN §4):

1. *Round A* — one all-gather of a byte row whose size every rank knows without asking, from the cached
   :class:`SyncPlan`: a header (signature hash), the per-rank sizes (rows of ``cat`` states, shapes of gathered
   states), the small ``sum``/``mean``/``min``/``max`` states packed per (op, dtype) bucket, and each ``cat``
   state padded to the row capacity the plan remembers. When every rank's signature matches the plan and its
   rows fit, that one collective is the whole sync: reductions run locally on the gathered rows, identically on
   every rank, and cat states are cut out of them.
2. *Fallback* — when the plan is missing or a rank's signature differs from it (the first sync, a shape change,
   an empty list state), every rank's full metadata is gathered (inline in round A on the first sync),
   validated (a disagreement raises the same ``RuntimeError`` on every rank) and a new plan is agreed.
3. *Round B* — one padded all-gather of whatever round A could not carry: cat states that outgrew their
   capacity (which then grows), gathered states, and on the fallback path the data itself.
4. Large ``sum``/``mean`` buckets, where moving ``W`` copies would cost more than reducing, take one
   ``all_reduce`` each; :func:`_reduce_by_all_reduce` is the one place of that rule.

So a sync costs one collective in the steady state, cat states included, two on the first sync.

Gradients: with ``grad="local"`` each rank's own rows stay in its autograd graph (times ``grad_scale``), and
every other rank's rows are constants; the backward needs no communication.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch

from torchmetrics_diff.distributed._autograd import _AllReduce, scale_grad
from torchmetrics_diff.distributed._backend import (
    CollectiveError,
    Group,
    _grad_enabled,
    _set_grad_enabled,
    default_device,
    dtype_code,
    dtype_from_code,
    group_rank,
    group_size,
)
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._rows import (
    FAILED,
    HEADER,
    _align,
    _gather_rows,
    _layout,
    _oversized,
    _reduce_rows,
)
from torchmetrics_diff.distributed._steady import SteadyPath

State = Union[torch.Tensor, list]
Reduction = Union[str, Callable[[Any], Any], None]
REDUCTIONS = ("sum", "mean", "min", "max", "cat")

_OPS = ("sum", "mean", "min", "max")
_FIRST_ROW = 4096  # the first sync's row: header plus metadata, which almost always fits
_GATHER_REDUCE_MAX_BYTES = 64 * 1024  # above this, sum/mean buckets are all-reduced (W x fewer bytes moved)


def _reduce_by_all_reduce(payload_bytes: int, world: int) -> bool:
    """The one rule choosing all_reduce over gather-and-reduce-locally for sum/mean states.

    A collective costs about the same whatever its size up to ~100 KB (latency-bound), so small states ride in
    round A, which runs anyway: zero extra collectives. Large ones are bandwidth-bound, where an all_reduce moves
    the bytes once instead of ``world`` times.
    """
    return payload_bytes * world > _GATHER_REDUCE_MAX_BYTES


def _grown(rows: int) -> int:
    """The capacity a cat state gets after outgrowing its old one: room for some growth, never zero."""
    return max(1, math.ceil(rows * 1.25))


@dataclass
class _Entry:
    """One state as this rank sees it."""

    name: str
    kind: str  # sum | mean | min | max | cat | gather
    fn: Reduction
    tensor: torch.Tensor | None  # None: an empty list state (dtype and trailing shape come from peers)

    def signature(self) -> list:
        """The part of the metadata every rank must agree on (never row counts or gathered shapes)."""
        if self.tensor is None:
            return [self.name, self.kind, -1, None, self.tag()]
        t = self.tensor
        if self.kind == "cat":
            dims: Any = list(t.shape[1:])
        elif self.kind == "gather":
            dims = t.ndim
        else:
            dims = list(t.shape)
        return [self.name, self.kind, dtype_code(t.dtype), dims, self.tag()]

    def tag(self) -> str:
        """The reduction as text, so that ranks with different callables (or None vs a callable) disagree."""
        fn = self.fn
        if fn is None or isinstance(fn, str):
            return str(fn)
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"

    def key(self) -> tuple:
        """A cheap local stand-in for :meth:`signature`, to find its cached hash."""
        t = self.tensor
        if t is None:
            return (self.name, self.kind, None)
        return (
            self.name,
            self.kind,
            t.dtype,
            t.shape[1:] if self.kind == "cat" else t.ndim if self.kind == "gather" else t.shape,
        )

    def variable(self) -> list[int]:
        """Per-rank sizes exchanged on every sync: rows of a cat state, the shape of a gathered state."""
        if self.kind == "cat":
            return [0 if self.tensor is None else self.tensor.shape[0]]
        if self.kind == "gather":
            return list(self.tensor.shape)
        return []


@dataclass
class _Bucket:
    """Reduction states of one (op, dtype), packed side by side and reduced with one op."""

    kind: str
    dtype: torch.dtype
    names: list[str]
    shapes: list[torch.Size]

    @property
    def numels(self) -> list[int]:
        return [s.numel() for s in self.shapes]

    @property
    def nbytes(self) -> int:
        return sum(self.numels) * self.dtype.itemsize


@dataclass
class SyncPlan:
    """What all ranks agreed on at the previous sync; lets the next one fit in one collective.

    Built only from data identical on every rank, so every rank holds the same plan. Keep one per object and
    kind of sync (a metric's step syncs and its epoch syncs each have one); a fresh plan costs one collective more.
    """

    signature_hash: int = 0  # 0: nothing agreed yet
    signature: list = field(default_factory=list)
    n_variable: int = 0  # int64 sizes every rank sends (cat rows, gathered shapes)
    buckets: list[_Bucket] = field(default_factory=list)  # small reduction buckets riding in round A
    reduced: list[_Bucket] = field(default_factory=list)  # large sum/mean buckets, all-reduced
    capacity: dict[str, int] = field(default_factory=dict)  # rows of each cat state round A can carry
    row_bytes: int = _FIRST_ROW
    local: tuple = ()  # (key, hash, signature) of this rank's last signature (a cache, not agreed)
    steady: Any = None  # the plan's SteadyPath; None: not built yet; False: this plan has none

    def cat_row_bytes(self, name: str) -> int:
        return self._cat[name]

    def pieces(self) -> list[str]:
        """Names of the pieces of round A, in :meth:`caps` order (a bucket goes by its first state's name)."""
        return [b.names[0] for b in self.buckets] + list(self.capacity)

    def caps(self) -> list[int]:
        """Bytes of each piece of round A after the header: the buckets, then each cat state at its capacity."""
        return [b.nbytes for b in self.buckets] + [rows * self._cat[n] for n, rows in self.capacity.items()]

    def __post_init__(self) -> None:
        # bytes per row of every cat state whose dtype is known
        self._cat = {
            n: torch.Size(d).numel() * dtype_from_code(c).itemsize
            for n, k, c, d, *_ in self.signature
            if k == "cat" and c != -1
        }


def _hash(signature: list) -> int:
    digest = hashlib.blake2b(json.dumps(signature).encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little", signed=True)
    return value if value not in (0, FAILED) else 1  # 0: no plan yet; FAILED: a rank that raised


def _local_signature(entries: list[_Entry], plan: SyncPlan) -> tuple[int, list]:
    """This rank's signature and its hash, cached in the plan while the states keep their kind/dtype/shape."""
    key = tuple(e.key() for e in entries)
    if plan.local and plan.local[0] == key:
        return plan.local[1], plan.local[2]
    signature = [e.signature() for e in entries]
    plan.local = (key, _hash(signature), signature)
    return plan.local[1], signature


def _entries(states: dict[str, State], reductions: dict[str, Reduction]) -> list[_Entry]:
    """List states are concatenated (and synced as ``cat``; a callable then gets the concatenation)."""
    out = []
    for name, value in states.items():
        fn = reductions[name]
        if isinstance(value, list):
            rows = [v.reshape(1) if v.ndim == 0 else v for v in value]
            tensor = None if not rows else rows[0] if len(rows) == 1 else torch.cat(rows)
            out.append(_Entry(name, "cat", fn, tensor))
        elif isinstance(fn, str):
            out.append(_Entry(name, fn, fn, value.reshape(1) if fn == "cat" and value.ndim == 0 else value))
        else:
            out.append(_Entry(name, "gather", fn, value))
    return out


def _int_bytes(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).view(torch.uint8).to(device)


def _check_agreement(owner: str, metas: list[list], world: int) -> list:
    """Validate every rank's signature; return the resolved one (unknown cat dtypes filled from peers)."""
    names = [[s[0] for s in m] for m in metas]
    if any(n != names[0] for n in names):
        for name in sorted(set().union(*names)):
            missing = [r for r in range(world) if name not in names[r]]
            if missing:
                present = [r for r in range(world) if r not in missing]
                raise RuntimeError(
                    f"{owner}: cannot sync state {name!r}: it is missing on rank(s) {missing} "
                    f"but registered on rank(s) {present}"
                )
        listing = "; ".join(f"rank {r}: {n}" for r, n in enumerate(names))
        raise RuntimeError(f"{owner}: ranks registered their states in a different order ({listing})")
    resolved = []
    for i, name in enumerate(names[0]):
        column = [m[i] for m in metas]
        checks = (("reduction", 1, str), ("reduction", 4, str), ("dtype", 2, lambda c: str(dtype_from_code(c))))
        for what, idx, show in checks:
            known = [(r, c[idx]) for r, c in enumerate(column) if c[2] != -1 or idx in (1, 4)]
            if any(v != known[0][1] for _, v in known):
                listing = ", ".join(f"rank {r}: {show(v)}" for r, v in known)
                raise RuntimeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        known = [(r, c) for r, c in enumerate(column) if c[2] != -1]
        kind = column[0][1]
        what = {"cat": "trailing shape", "gather": "number of dimensions"}.get(kind, "shape")
        if any(c[3] != known[0][1][3] for _, c in known):
            listing = ", ".join(f"rank {r}: {_show_dims(c[3], kind)}" for r, c in known)
            raise RuntimeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        resolved.append(known[0][1] if known else column[0])
    return resolved


def _show_dims(dims: Any, kind: str) -> str:
    if kind == "gather":
        return f"ndim {dims}"
    return str(tuple(dims)) if kind != "cat" else f"(*, {', '.join(map(str, dims))})" if dims else "(*,)"


def _make_plan(signature: list, world: int, capacity: dict[str, int]) -> SyncPlan:
    """The layout of the next round A, from data identical on every rank."""
    n_var = sum(1 if kind == "cat" else dims if kind == "gather" else 0 for _, kind, _, dims, *_ in signature)
    buckets: dict[tuple, _Bucket] = {}
    for name, kind, code, dims, *_ in signature:
        if kind in _OPS:
            bucket = buckets.setdefault((kind, code), _Bucket(kind, dtype_from_code(code), [], []))
            bucket.names.append(name)
            bucket.shapes.append(torch.Size(dims))
    small = not _reduce_by_all_reduce(sum(_align(b.nbytes) for b in buckets.values()), world)
    gathered = [b for b in buckets.values() if small or b.kind in ("min", "max")]
    reduced = [b for b in buckets.values() if not (small or b.kind in ("min", "max"))]
    plan = SyncPlan(_hash(signature), signature, n_var, gathered, reduced, {})
    plan.capacity = {n: capacity.get(n, 0) for n in plan._cat}
    plan.row_bytes = _row_bytes(plan)
    return plan


def _row_bytes(plan: SyncPlan) -> int:
    return _layout(HEADER + 8 * plan.n_variable, plan.caps())[1]


def resize_capacities(plan: SyncPlan, rows: dict[str, list[int]]) -> None:
    """Cat capacities for the next round A, from the rows every rank sent (so every rank agrees).

    Exactly what was seen at first (steady batch sizes then fit without padding), room to grow after an
    overflow, shrunk when far too large. A changed layout drops the plan's steady path (it is rebuilt).
    """
    resized = False
    for name in plan._cat:
        most, cap = max(rows[name]), plan.capacity.get(name, 0)
        if cap == 0 or _oversized(cap, most):
            plan.capacity[name], resized = most, resized or most != cap
        elif most > cap:
            plan.capacity[name], resized = _grown(most), True
    if resized:
        plan.row_bytes = _row_bytes(plan)
        plan.steady = None


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
        _check_arguments(states, reductions, grad)
        scaled = {k: scale_state_grad(v, grad_scale) for k, v in states.items()} if grad == "local" else states
        return {k: _single(v, reductions[k], grad) for k, v in scaled.items()}
    return _sync_across(states, reductions, group, plan, grad, grad_scale, owner, device, world)


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
) -> dict[str, Any]:
    """:func:`sync_states` over more than one rank."""
    rank = group_rank(group)
    plan = plan if plan is not None else SyncPlan()
    steady = plan.steady
    if (
        steady
        and grad == "none"
        and (steady.world, steady.rank) == (world, rank)
        and (device or _first_device(states)) == steady.device
    ):
        enabled = _grad_enabled()
        if enabled:  # torch.no_grad() without its Python layers (microseconds right after a collective)
            _set_grad_enabled(False)
        try:
            done = _steady_sync(steady, states, reductions, group, plan, rank, world, owner)
        finally:
            if enabled:
                _set_grad_enabled(True)
        if done is not None:
            return done
    try:  # a bad argument, a failed concatenation, an unknown dtype on one rank: the others must not wait
        _check_arguments(states, reductions, grad)
        entries = _entries(states, reductions)
        local_hash, local_sig = _local_signature(entries, plan)
    except Exception as err:
        fail_sync(err, group, plan=plan, owner=owner, device=device)
    if device is None:
        device = next((e.tensor.device for e in entries if e.tensor is not None), torch.device("cpu"))
    track = grad == "local" and torch.is_grad_enabled()
    entries = _prepared(entries, device, track, grad_scale)
    with torch.enable_grad() if track else torch.no_grad():
        result = _Sync(entries, plan, group, rank, world, owner, device).run(local_hash, local_sig)
    if grad == "none":
        _arm(plan, local_hash, states, reductions, world, rank, device)
    return result


def _arm(
    plan: SyncPlan,
    local_hash: int,
    states: dict[str, State],
    reductions: dict[str, Reduction],
    world: int,
    rank: int,
    device: torch.device,
) -> None:
    """After a sync of the general engine: give the plan a steady path if it has none and this rank matched it."""
    if plan.steady is None and local_hash == plan.signature_hash:
        plan.steady = SteadyPath.build(plan, states, reductions, world, rank, device) or False


def _steady_sync(
    steady: SteadyPath,
    states: dict[str, State],
    reductions: dict[str, Reduction],
    group: Group,
    plan: SyncPlan,
    rank: int,
    world: int,
    owner: str,
) -> dict[str, Any] | None:
    """A sync through the plan's steady path; ``None`` (before any communication) when the states do not fit it."""
    if not steady.pack(states, reductions):
        return None
    try:
        steady.gather(group)
    except CollectiveError as err:
        raise _named(err, owner, steady.names, world) from err
    done = steady.unpack()
    if done is None:  # another rank's header differs from the plan: the general engine goes on from round A
        entries = _prepared(_entries(states, reductions), steady.device, False, 1.0)
        local_hash, local_sig = _local_signature(entries, plan)
        sync = _Sync(entries, plan, group, rank, world, owner, steady.device)
        result = sync.after_round_a(steady.grid, steady.gathered(), local_sig)
        _arm(plan, local_hash, states, reductions, world, rank, steady.device)
        return result
    values, rows = done
    if rows:
        resize_capacities(plan, rows)
    return values


def _first_device(states: dict[str, State]) -> torch.device | None:
    """The device the general engine would pick for the buffers when the first state is not an empty list."""
    first = next(iter(states.values()), None)
    if isinstance(first, list):
        first = first[0] if first else None
    return first.device if isinstance(first, torch.Tensor) else None


def _prepared(entries: list[_Entry], device: torch.device, track: bool, grad_scale: float) -> list[_Entry]:
    """Entries moved to ``device``, detached, or (``track``) keeping their graph with the gradient scaled."""
    for e in entries:
        if e.tensor is not None:
            e.tensor = e.tensor.to(device)
            e.tensor = scale_grad(e.tensor, grad_scale) if track else e.tensor.detach()
    return entries


def _named(err: CollectiveError, owner: str, names: Any, world: int) -> RuntimeError:
    """A collective that failed (a timeout, a dead peer), as an error naming the metric and the states synced."""
    return RuntimeError(f"{owner}: a collective failed while syncing states {list(names)} over {world} ranks: {err}")


def _check_arguments(states: dict[str, State], reductions: dict[str, Reduction], grad: str) -> None:
    if grad not in ("none", "local"):
        raise ValueError(f"sync_states: `grad` must be 'none' or 'local'; got {grad!r}")
    for name, fn in reductions.items():
        if not (fn is None or callable(fn) or fn in REDUCTIONS):
            raise ValueError(
                f"sync_states: reduction of state {name!r} must be one of {REDUCTIONS}, a callable or None; got {fn!r}"
            )
        value = states.get(name)
        dtype = value.dtype if isinstance(value, torch.Tensor) else None
        if fn == "mean" and dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"sync_states: state {name!r} has dist_reduce_fx='mean' but dtype {dtype}; use a float")
        if fn in ("sum", "mean") and dtype == torch.bool:
            raise ValueError(f"sync_states: state {name!r} is bool with dist_reduce_fx={fn!r}; use 'max' or 'min'")


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
    joins their round A with a failure marker instead of leaving them waiting. Just raises at world size 1.
    """
    world = group_size(group)
    if world == 1:
        raise problem
    plan = plan if plan is not None else SyncPlan()
    _Sync([], plan, group, group_rank(group), world, owner, device or default_device(group)).fail(problem)


def _single(value: State, fn: Reduction, grad: str) -> Any:
    """World size 1: the reductions of one rank, without any collective."""
    if isinstance(value, list):
        if not value:
            return []
        value = torch.cat([v.reshape(1) if v.ndim == 0 else v for v in value])
        value = value.detach() if grad == "none" else value
        return fn(value) if callable(fn) else value
    if fn == "cat" and value.ndim == 0:
        value = value.reshape(1)
    if grad == "none":
        value = value.detach()
    if fn is None or not isinstance(fn, str):
        value = value.unsqueeze(0)
        return value if fn is None else fn(value)
    return value


class _Sync:
    """One sync, as a short sequence of rounds; every rank walks the same sequence."""

    def __init__(
        self,
        entries: list[_Entry],
        plan: SyncPlan,
        group: Group,
        rank: int,
        world: int,
        owner: str,
        device: torch.device,
    ) -> None:
        self.entries, self.plan, self.group, self.rank, self.world = entries, plan, group, rank, world
        self.owner, self.device = owner, device
        self.by_name = {e.name: e for e in entries}

    def _rows(self, header: torch.Tensor, tensors: list, caps: list, min_row: int = 0, slot: str = "a") -> tuple:
        with self._naming_failures():
            return _gather_rows(header, tensors, caps, self.group, self.rank, self.world, min_row, slot)

    @contextmanager
    def _naming_failures(self) -> Iterator[None]:
        try:
            yield
        except CollectiveError as err:
            raise _named(err, self.owner, [e.name for e in self.entries], self.world) from err

    def fail(self, problem: BaseException) -> None:
        """Take part in round A with a failure marker, then raise ``problem``: the other ranks raise too."""
        self._rows(_int_bytes([FAILED, -1], self.device), [], [], min_row=self.plan.row_bytes)
        raise problem

    def _empty(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return torch.zeros(0, dtype=dtype, device=self.device)

    def _flat(self, bucket: _Bucket) -> torch.Tensor:
        return torch.cat([self.by_name[n].tensor.reshape(-1) for n in bucket.names])

    def run(self, local_hash: int, local_sig: list) -> dict[str, Any]:
        plan, device = self.plan, self.device
        variable = [v for e in self.entries for v in e.variable()]
        fits = local_hash == plan.signature_hash

        # Round A: the metadata itself (no plan yet), or the plan's sizes, reduction buckets and cat rows.
        gathered: dict[str, torch.Tensor] = {}
        if plan.signature_hash == 0:
            meta = self._meta(local_sig, variable)
            inline = meta if meta.numel() <= plan.row_bytes - HEADER else meta[:0]
            table, _ = self._rows(
                torch.cat([_int_bytes([local_hash, meta.numel()], device), inline]), [], [], min_row=plan.row_bytes
            )
        else:
            header = _int_bytes([local_hash, -1] + (variable if fits else [0] * plan.n_variable), device)
            tensors = [self._flat(b) if fits else self._empty() for b in plan.buckets]
            for name, rows in plan.capacity.items():
                t = self.by_name[name].tensor if fits else None
                tensors.append(t if t is not None and t.shape[0] <= rows else self._empty())
            table, outs = self._rows(header, tensors, plan.caps(), min_row=plan.row_bytes)
            gathered = dict(zip(plan.pieces(), outs))
        return self.after_round_a(table, gathered, local_sig)

    def after_round_a(self, table: torch.Tensor, gathered: dict[str, torch.Tensor], local_sig: list) -> dict[str, Any]:
        """Everything after round A, from its ``(W, row_bytes)`` table and the pieces it carried (by name)."""
        plan, device = self.plan, self.device
        hashes = table[:, :HEADER].contiguous().view(torch.int64)[:, 0].tolist()
        failed = [r for r, h in enumerate(hashes) if h == FAILED]
        if failed:
            raise RuntimeError(
                f"{self.owner}: rank(s) {failed} raised an error before syncing (see their message); not syncing"
            )

        if plan.signature_hash != 0 and all(h == plan.signature_hash for h in hashes):
            n = plan.n_variable
            sizes = (
                table[:, HEADER : HEADER + 8 * n].contiguous().view(torch.int64).tolist() if n else [[]] * self.world
            )
            return self._finish(plan, sizes, gathered)

        # Fallback: agree on a new plan from everyone's metadata.
        if plan.signature_hash == 0 and max(table[:, 8:16].contiguous().view(torch.int64)[:, 0].tolist()) <= (
            plan.row_bytes - HEADER
        ):
            lens = table[:, 8:16].contiguous().view(torch.int64)[:, 0].tolist()
            raw = [bytes(table[r, HEADER : HEADER + lens[r]].tolist()) for r in range(self.world)]
        else:
            meta = self._meta(local_sig, [v for e in self.entries for v in e.variable()])
            lt, _ = self._rows(_int_bytes([meta.numel()], device), [], [], slot="m")
            lens = lt.contiguous().view(torch.int64)[:, 0].tolist()
            mt, _ = self._rows(meta, [], [], min_row=_align(max(lens)), slot="m")
            raw = [bytes(mt[r, : lens[r]].tolist()) for r in range(self.world)]
        metas = [json.loads(m) for m in raw]
        signature = _check_agreement(self.owner, [m["sig"] for m in metas], self.world)
        sizes = [m["var"] for m in metas]
        new_plan = _make_plan(signature, self.world, {})
        new_plan.local = plan.local
        plan.__dict__.update(new_plan.__dict__)
        return self._finish(plan, sizes, {})

    def _meta(self, signature: list, variable: list[int]) -> torch.Tensor:
        blob = json.dumps({"sig": signature, "var": variable}).encode()
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)

    def _finish(self, plan: SyncPlan, sizes: list[list[int]], gathered: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Round B for what round A did not carry, the all-reduces, then every state's value."""
        rows: dict[str, list[int]] = {}
        shapes: dict[str, list[tuple[int, ...]]] = {}
        cursor = 0
        for name, kind, _code, dims, *_ in plan.signature:
            if kind == "cat":
                rows[name] = [s[cursor] for s in sizes]
                cursor += 1
            elif kind == "gather":
                shapes[name] = [tuple(s[cursor : cursor + dims]) for s in sizes]
                cursor += dims

        # Round B: buckets not gathered yet, cat states beyond their capacity, gathered states.
        late: list[tuple[str, torch.Tensor, int]] = []
        for bucket in plan.buckets:
            if bucket.names[0] not in gathered:
                late.append((bucket.names[0], self._flat(bucket), bucket.nbytes))
        for name, kind, code, _dims, *_ in plan.signature:
            dtype = dtype_from_code(code) if code != -1 else None
            if kind == "cat" and dtype is not None and (name not in gathered or max(rows[name]) > plan.capacity[name]):
                t = self.by_name[name].tensor
                late.append(
                    (name, t if t is not None else self._empty(dtype), max(rows[name]) * plan.cat_row_bytes(name))
                )
            elif kind == "gather":
                late.append(
                    (name, self.by_name[name].tensor, max(torch.Size(s).numel() for s in shapes[name]) * dtype.itemsize)
                )
        if late:
            _, outs = self._rows(self._empty(), [t for _, t, _ in late], [c for _, _, c in late], slot="b")
            gathered.update({name: out for (name, _, _), out in zip(late, outs)})

        result: dict[str, Any] = {}
        for bucket in plan.buckets:
            reduced = _reduce_rows(bucket.kind, gathered[bucket.names[0]][:, : sum(bucket.numels)])
            for name, piece, shape in zip(bucket.names, reduced.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        for bucket in plan.reduced:
            flat = self._flat(bucket)
            with self._naming_failures():
                mode = "local" if flat.requires_grad else "none"
                out = _AllReduce.apply(
                    flat if flat.requires_grad else flat.detach(), bucket.kind, self.group, self.world, mode, False
                )
            for name, piece, shape in zip(bucket.names, out.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        # Cat states: one concatenation per dtype for all of them (rank pieces in state-major order), then split.
        by_dtype: dict[int, list[tuple[str, list, int]]] = {}
        for name, kind, code, dims, *_ in plan.signature:
            if kind == "cat":
                if code == -1:  # empty on every rank
                    result[name] = []
                    continue
                width = torch.Size(dims).numel()
                by_dtype.setdefault(code, []).append((name, dims, width))
        for members in by_dtype.values():
            pieces, lengths = [], []
            for name, _dims, width in members:
                table = gathered[name]
                pieces += [table[r, : n * width] for r, n in enumerate(rows[name])]
                lengths.append(sum(rows[name]) * width)
            for (name, dims, _width), flat in zip(members, torch.cat(pieces).split(lengths)):
                value = flat.view(sum(rows[name]), *dims)
                fn = self.by_name[name].fn
                result[name] = fn(value) if callable(fn) else value
        for name, kind, _code, _dims, *_ in plan.signature:
            if kind == "gather":
                table = gathered[name]
                pieces = [table[r, : torch.Size(s).numel()].view(s).clone() for r, s in enumerate(shapes[name])]
                fn = self.by_name[name].fn
                stacked = torch.stack(pieces) if all(p.shape == pieces[0].shape for p in pieces) else pieces
                result[name] = stacked if fn is None else fn(stacked)

        resize_capacities(plan, rows)
        return {e.name: result[e.name] for e in self.entries}
