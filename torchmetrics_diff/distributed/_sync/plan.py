"""The plan model: what every rank says about its states, and what all ranks agreed on at the previous sync.

- :class:`StateSignature`: one state as every rank must agree on it (name, kind, dtype, dims, reduction). A
  signature is a list of them; its JSON is what travels between ranks and what is hashed.
- :class:`Entry`: one state as this rank holds it, which describes itself by a :class:`StateSignature`.
- :class:`SyncPlan`: the agreed signature, what the row of the next sync holds (reduction buckets, the room of
  each ``cat`` and gathered state, the row size), its key, and the :class:`~.layout.Layout` built from it.

Everything in a plan but its caches is built from data identical on every rank, so every rank holds the same plan;
its :attr:`SyncPlan.key` stands for all of it in the call header.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import dtype_code, dtype_from_code
from torchmetrics_diff.distributed._failure import FAILED
from torchmetrics_diff.distributed._reductions import CAT, Reduction
from torchmetrics_diff.distributed._sync.rows import HEADER, align, layout, oversized

_GATHER_REDUCE_MAX_BYTES = 64 * 1024  # above this, sum/mean buckets are all-reduced (W x fewer bytes moved)
UNKNOWN_DTYPE = -1  # the dtype code of an empty list state: its dtype and trailing shape come from peers

GATHER = "gather"  # the kind of a state with a callable or None reduction: stacked, then handed to it


def reduce_by_all_reduce(payload_bytes: int, world: int) -> bool:
    """The one rule choosing all_reduce over gather-and-reduce-locally for sum/mean states.

    A small collective costs about the same whatever its size (latency-bound), so small states ride in the row,
    which travels anyway: zero extra collectives. Large ones are bandwidth-bound, where an all_reduce moves the
    bytes once instead of ``world`` times.
    """
    return payload_bytes * world > _GATHER_REDUCE_MAX_BYTES


def _grown(rows: int) -> int:
    """The room a cat or gathered state gets after outgrowing its old one: room for some growth, never zero."""
    return max(1, math.ceil(rows * 1.25))


class StateSignature(NamedTuple):
    """The part of one state's metadata every rank must agree on (never row counts or gathered shapes).

    It travels as a JSON array ``[name, kind, dtype, dims, tag]``: a ``NamedTuple`` encodes exactly as the list.
    """

    name: str
    kind: str  # sum | mean | min | max | cat | gather
    dtype: int  # the wire code of the dtype; UNKNOWN_DTYPE for an empty list state
    dims: Any  # the shape (elementwise kinds), trailing dims (cat), ndim (gather); None when unknown
    tag: str  # the reduction as text, so that ranks with different callables (or None vs a callable) disagree

    @classmethod
    def decode(cls, rows: list[list]) -> list[StateSignature]:
        """A signature from its JSON (a list of arrays)."""
        return [cls(*row) for row in rows]


@dataclass
class Entry:
    """One state as this rank sees it."""

    name: str
    kind: str  # sum | mean | min | max | cat | gather
    fn: Reduction
    tensor: torch.Tensor | None  # None: an empty list state (dtype and trailing shape come from peers)

    def signature(self) -> StateSignature:
        """This state's :class:`StateSignature`."""
        if self.tensor is None:
            return StateSignature(self.name, self.kind, UNKNOWN_DTYPE, None, self.tag())
        t = self.tensor
        if self.kind == CAT:
            dims: Any = list(t.shape[1:])
        elif self.kind == GATHER:
            dims = t.ndim
        else:
            dims = list(t.shape)
        return StateSignature(self.name, self.kind, dtype_code(t.dtype), dims, self.tag())

    def tag(self) -> str:
        """The reduction as text."""
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
            t.shape[1:] if self.kind == CAT else t.ndim if self.kind == GATHER else t.shape,
        )

    def variable(self) -> list[int]:
        """Per-rank sizes exchanged on every sync: rows of a cat state, the shape of a gathered state."""
        if self.kind == CAT:
            return [0 if self.tensor is None else self.tensor.shape[0]]
        if self.kind == GATHER:
            return list(cast(torch.Tensor, self.tensor).shape)  # (only an empty cat state has no tensor)
        return []


def entries(states: dict[str, Any], fns: dict[str, Reduction]) -> list[Entry]:
    """This rank's states as entries: list states are concatenated and synced as ``cat`` (a callable then gets
    the concatenation), tensor states by their reduction, callables and ``None`` as ``gather``."""
    out = []
    for name, value in states.items():
        fn = fns[name]
        if isinstance(value, list):
            out.append(Entry(name, CAT, fn, _reductions.cat_rows(value)))
        elif _reductions.is_named(fn):
            out.append(Entry(name, fn, fn, _reductions.as_rows(value) if _reductions.is_cat(fn) else value))
        else:
            out.append(Entry(name, GATHER, fn, value))
    return out


@dataclass
class Bucket:
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


class SteadyStatus(enum.Enum):
    """Whether a plan's :class:`~.layout.Layout` is built (for this rank, group size and device)."""

    PENDING = "pending"  # no layout yet (nothing agreed, or the plan changed): the next sync builds it
    READY = "ready"  # built: ``SyncPlan.layout`` holds it


@dataclass
class SyncPlan:
    """What all ranks agreed on at the previous sync; lets the next one fit in one collective.

    Built only from data identical on every rank, so every rank holds the same plan. Keep one per object and
    kind of sync (a metric's step syncs and its epoch syncs each have one); a fresh plan costs two collectives more.
    """

    signature_hash: int = 0  # 0: nothing agreed yet
    signature: list[StateSignature] = field(default_factory=list)
    n_variable: int = 0  # int64 sizes every rank sends (cat rows, gathered shapes)
    buckets: list[Bucket] = field(default_factory=list)  # small reduction buckets riding in the row
    reduced: list[Bucket] = field(default_factory=list)  # large sum/mean buckets, all-reduced
    capacity: dict[str, int] = field(default_factory=dict)  # room in the row: rows (cat), elements (gathered)
    row_bytes: int = 0
    key: int = 0  # stands for the whole plan in the call header (0: none); see :meth:`rekey`
    local: tuple = ()  # (key, hash, signature) of this rank's last signature (a cache, not agreed)
    layout: Any = None  # the Layout built from this plan (a cache: rebuilt for another rank, size or device)
    calls: tuple[int, int] | None = None  # syncs made with this plan (its owner's), as ``_call.fresh_count`` keeps
    # them: tells two metrics of one class apart in the header

    @property
    def steady_status(self) -> SteadyStatus:
        return SteadyStatus.PENDING if self.layout is None else SteadyStatus.READY

    def unit_bytes(self, name: str) -> int:
        """Bytes of one unit of a cat state (a row) or of a gathered state (an element)."""
        return self._unit[name]

    def pieces(self) -> list[str]:
        """Names of the pieces of the row, in :meth:`caps` order (a bucket goes by its first state's name)."""
        return [b.names[0] for b in self.buckets] + list(self.capacity)

    def caps(self) -> list[int]:
        """Bytes of each piece of the row after its header: the buckets, then each cat and gathered state at its
        capacity."""
        return [b.nbytes for b in self.buckets] + [units * self._unit[n] for n, units in self.capacity.items()]

    def rekey(self) -> None:
        """The row's size and the plan's key after its layout changed; the layout is rebuilt at the next sync."""
        self.row_bytes = layout(HEADER + 8 * self.n_variable, self.caps())[1]
        text = json.dumps([self.signature, list(self.capacity.items()), [b.names for b in self.reduced]])
        self.key = _hash(text)
        self.layout = None

    def __post_init__(self) -> None:
        # bytes per unit of every cat state whose dtype is known (a row) and of every gathered state (an element)
        self._unit = {
            s.name: (torch.Size(s.dims).numel() if s.kind == CAT else 1) * dtype_from_code(s.dtype).itemsize
            for s in self.signature
            if s.kind in (CAT, GATHER) and s.dtype != UNKNOWN_DTYPE
        }


def signature_hash(signature: list[StateSignature]) -> int:
    """The 8-byte hash of a signature's JSON, never 0 (no plan yet) nor the failure marker."""
    return _hash(json.dumps(signature))


def _hash(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little", signed=True)
    return value if value not in (0, FAILED) else 1


def local_signature(items: list[Entry], plan: SyncPlan) -> tuple[int, list[StateSignature]]:
    """This rank's signature and its hash, cached in the plan while the states keep their kind/dtype/shape."""
    key = tuple(e.key() for e in items)
    if plan.local and plan.local[0] == key:
        return plan.local[1], plan.local[2]
    signature = [e.signature() for e in items]
    plan.local = (key, signature_hash(signature), signature)
    return plan.local[1], signature


def make_plan(signature: list[StateSignature], world: int, units: list[list[int]]) -> SyncPlan:
    """The plan of an agreed (validated) signature, with room for the rows and elements every rank sent
    (``units``: every rank's sizes, :meth:`Entry.variable` in signature order); from data identical on every rank."""
    n_var = sum(1 if s.kind == CAT else s.dims if s.kind == GATHER else 0 for s in signature)
    buckets: dict[tuple, Bucket] = {}
    for s in signature:
        if _reductions.is_elementwise(s.kind):
            bucket = buckets.setdefault((s.kind, s.dtype), Bucket(s.kind, dtype_from_code(s.dtype), [], []))
            bucket.names.append(s.name)
            bucket.shapes.append(torch.Size(s.dims))
    small = not reduce_by_all_reduce(sum(align(b.nbytes) for b in buckets.values()), world)
    gathered = [b for b in buckets.values() if small or _reductions.selects(b.kind)]
    reduced = [b for b in buckets.values() if not (small or _reductions.selects(b.kind))]
    plan = SyncPlan(signature_hash(signature), signature, n_var, gathered, reduced, {})
    plan.capacity = {n: 0 for n in plan._unit}
    resize_capacities(plan, units_by_state(plan, units))
    plan.rekey()
    return plan


def units_by_state(plan: SyncPlan, sizes: list[list[int]]) -> dict[str, list[int]]:
    """Every rank's rows (cat) or elements (gathered) of each state with room in the row, from every rank's sizes."""
    out: dict[str, list[int]] = {}
    cursor = 0
    for s in plan.signature:
        if s.kind == CAT:
            if s.name in plan.capacity:
                out[s.name] = [size[cursor] for size in sizes]
            cursor += 1
        elif s.kind == GATHER:
            out[s.name] = [math.prod(size[cursor : cursor + s.dims]) for size in sizes]
            cursor += s.dims
    return out


def resize_capacities(plan: SyncPlan, units: dict[str, list[int]]) -> bool:
    """Room in the row for the next sync, from the units every rank sent (so every rank agrees); whether it changed
    (then the plan is re-keyed and its layout rebuilt).

    Exactly what was seen at first (steady batch sizes then fit without padding), room to grow after an
    overflow, shrunk when far too large.
    """
    resized = False
    for name, cap in plan.capacity.items():
        most = max(units[name])
        if cap == 0 or oversized(cap, most):
            plan.capacity[name], resized = most, resized or most != cap
        elif most > cap:
            plan.capacity[name], resized = _grown(most), True
    if resized:
        plan.rekey()
    return resized
