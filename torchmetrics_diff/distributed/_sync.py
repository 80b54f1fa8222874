"""The state-sync engine: every state of a metric or collection in as few collectives as possible.

One sync is (DESIGN §4):

1. *Round A* — one all-gather of a byte row whose size every rank knows without asking: a fixed header
   (signature hash, metadata length) followed by what the cached :class:`SyncPlan` says: the row counts of
   ``cat`` states, the shapes of gathered states and, when they are small, the packed bytes of every
   ``sum``/``mean``/``min``/``max`` state. When every rank's signature matches the plan, that one collective
   is the whole sync for metrics without ``cat`` states: the reductions run locally on the gathered rows,
   identically on every rank.
2. *Fallback* — when the plan is missing or any rank's signature differs from it (the first sync, a shape
   change, an empty list state), every rank's full metadata is gathered, validated (a disagreement raises the
   same ``RuntimeError`` on every rank) and a new plan is agreed.
3. *Round B* — one padded all-gather of the variable-size bytes (``cat`` rows, gathered states, and on the
   fallback path the small reduction states too).
4. Large ``sum``/``mean`` states, where moving ``W`` copies would cost more than reducing, take one
   ``all_reduce`` per (op, dtype) bucket instead; :func:`_reduce_by_all_reduce` is the one place of that rule.

Gradients: with ``grad="local"`` each rank's own rows stay in its autograd graph (times ``grad_scale``), and
every other rank's rows are constants; the backward needs no communication.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch

from torchmetrics_diff.distributed._autograd import _AllReduce, scale_grad
from torchmetrics_diff.distributed._backend import (
    Group,
    all_gather_flat,
    dtype_code,
    dtype_from_code,
    group_rank,
    group_size,
)

State = Union[torch.Tensor, list]
Reduction = Union[str, Callable[[Any], Any], None]
REDUCTIONS = ("sum", "mean", "min", "max", "cat")

_HEADER = 16  # bytes: int64 signature hash, int64 metadata length
_FIRST_ROW = 4096  # the first sync's row: header plus metadata, which almost always fits
_GATHER_REDUCE_MAX_BYTES = 64 * 1024  # above this, sum/mean states are all-reduced (W x fewer bytes moved)


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


def _reduce_by_all_reduce(payload_bytes: int, world: int) -> bool:
    """The one rule choosing all_reduce over gather-and-reduce-locally for sum/mean states.

    A collective costs about the same whatever its size up to ~100 KB (latency-bound), so small states ride in
    the gather that carries the metadata anyway: zero extra collectives. Large ones are bandwidth-bound, where
    an all_reduce moves the bytes once instead of ``world`` times.
    """
    return payload_bytes * world > _GATHER_REDUCE_MAX_BYTES


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
            return [self.name, self.kind, -1, None]
        t = self.tensor
        if self.kind == "cat":
            dims: Any = list(t.shape[1:])
        elif self.kind == "gather":
            dims = t.ndim
        else:
            dims = list(t.shape)
        return [self.name, self.kind, dtype_code(t.dtype), dims]

    def variable(self) -> list[int]:
        """Per-rank sizes exchanged on every sync: rows of a cat state, the shape of a gathered state."""
        if self.kind == "cat":
            return [0 if self.tensor is None else self.tensor.shape[0]]
        if self.kind == "gather":
            return list(self.tensor.shape)
        return []


@dataclass
class SyncPlan:
    """What all ranks agreed on at the previous sync; lets the next one start with the right row size.

    Built only from data identical on every rank, so every rank holds the same plan. Keep one per object that
    syncs (a metric or a collection); a fresh plan costs one extra collective on the first sync.
    """

    signature_hash: int = 0  # 0: nothing agreed yet
    signature: list = field(default_factory=list)
    n_variable: int = 0  # int64 sizes every rank sends (cat rows, gathered shapes)
    payload: list = field(default_factory=list)  # (name, nbytes) of reduction states riding in round A
    row_bytes: int = _FIRST_ROW


def _hash(signature: list) -> int:
    digest = hashlib.blake2b(json.dumps(signature).encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little", signed=True)
    return value if value not in (0, _FAILED) else 1  # 0: no plan yet; _FAILED: a rank that raised


_FAILED = -1  # the signature hash of a rank that raised before syncing (see :func:`fail_sync`)


def _entries(states: dict[str, State], reductions: dict[str, Reduction]) -> list[_Entry]:
    out = []
    for name, value in states.items():
        fn = reductions[name]
        kind = fn if isinstance(fn, str) else "gather"
        if isinstance(value, list):
            kind = "cat" if kind != "gather" else kind
            rows = [v.reshape(1) if v.ndim == 0 else v for v in value]
            tensor = torch.cat(rows) if rows else None
            if kind == "gather" and tensor is None:
                kind = "cat"
        else:
            tensor = value.reshape(1) if kind == "cat" and value.ndim == 0 else value
        out.append(_Entry(name, kind, fn, tensor))
    return out


class _GatherRows(torch.autograd.Function):
    """All-gather one byte row built from a header and tensors; return each tensor's column block per rank.

    Output ``i`` has shape ``(W, cap_i / itemsize)``: row ``r`` holds rank ``r``'s tensor ``i``, flattened and
    zero-padded. Backward (``"local"`` semantics) returns each input the gradient of its own rank's row.
    """

    @staticmethod
    def forward(ctx: Any, job: _RowJob, header: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        row = torch.zeros(job.row_bytes, dtype=torch.uint8, device=header.device)
        row[: header.numel()] = header
        for t, (offset, _cap) in zip(tensors, job.slots):
            raw = t.detach().contiguous().view(-1).view(torch.uint8)
            row[offset : offset + raw.numel()] = raw
        table = row.new_empty(job.world * job.row_bytes)
        all_gather_flat(table, row, job.group)
        job.table = table.view(job.world, job.row_bytes)
        ctx.rank, ctx.shapes = job.rank, [t.shape for t in tensors]
        outs = []
        for t, (offset, cap) in zip(tensors, job.slots):
            outs.append(job.table[:, offset : offset + cap].contiguous().view(t.dtype))
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local = [
            None if g is None else g[ctx.rank, : shape.numel()].reshape(shape) for g, shape in zip(grads, ctx.shapes)
        ]
        return (None, None, *local)


@dataclass
class _RowJob:
    """One byte all-gather: where each tensor goes in the row, and (after it ran) the gathered table."""

    group: Group
    rank: int
    world: int
    row_bytes: int
    slots: list  # (offset, capacity in bytes) per tensor
    table: torch.Tensor | None = None


def _gather_rows(
    header: torch.Tensor,
    tensors: list[torch.Tensor],
    caps: list[int],
    group: Group,
    rank: int,
    world: int,
    min_row: int = 0,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    offset, slots = _align(header.numel()), []
    for cap in caps:
        slots.append((offset, cap))
        offset += _align(cap)
    job = _RowJob(group, rank, world, max(offset, min_row), slots)
    outs = _GatherRows.apply(job, header, *tensors)
    return job.table, list(outs)


def _int_bytes(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).view(torch.uint8).to(device)


def _check_agreement(owner: str, metas: list[list], world: int) -> list:
    """Validate every rank's signature; return the resolved one (unknown cat dtypes filled from peers)."""
    names = [[s[0] for s in m] for m in metas]
    if any(n != names[0] for n in names):
        every = sorted(set().union(*names))
        for name in every:
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
        for what, idx, show in (("reduction", 1, str), ("dtype", 2, lambda c: str(dtype_from_code(c)))):
            known = [(r, c[idx]) for r, c in enumerate(column) if c[2] != -1 or idx == 1]
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


def _make_plan(signature: list, world: int) -> SyncPlan:
    n_var = sum(1 if kind == "cat" else dims if kind == "gather" else 0 for _, kind, _, dims in signature)
    reduce = [(n, torch.Size(d).numel() * dtype_from_code(c).itemsize, k) for n, k, c, d in signature if k in _OPS]
    small = not _reduce_by_all_reduce(sum(_align(b) for _, b, _ in reduce), world)
    payload = [(n, b) for n, b, k in reduce if small or k in ("min", "max")]
    row = _align(_HEADER + 8 * n_var) + sum(_align(b) for _, b in payload)
    return SyncPlan(_hash(signature), signature, n_var, payload, row)


_OPS = ("sum", "mean", "min", "max")


def _reduce_rows(kind: str, rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce the ``(W, n)`` gathered rows locally; the same bits on every rank."""
    if rows.dtype == torch.bool:
        out = rows.all(0) if kind == "min" else rows.any(0)
    elif kind == "sum":
        out = rows.sum(0, dtype=rows.dtype)
    elif kind == "mean":
        out = rows.mean(0) if rows.is_floating_point() or rows.is_complex() else rows.sum(0) / rows.shape[0]
    else:
        out = rows.amax(0) if kind == "max" else rows.amin(0)
    return out.reshape(shape)


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
            Callables receive the per-rank values stacked along a new dim 0 (a list when their shapes
            differ); ``None`` returns that stack itself.
        group: the process group (``None``: default).
        plan: the caller's :class:`SyncPlan`, updated in place; ``None`` costs one collective more.
        grad: ``"none"`` (detached result) or ``"local"`` (each rank's own contribution keeps its graph).
        grad_scale: multiplies the gradient reaching the local inputs (a trainer that averages gradients over
            ``W`` ranks needs ``W``).
        owner: a name for error messages, e.g. the metric's class.
        device: where the communication buffers live (default: the first state's device).

    Returns:
        name -> synced value. A ``cat`` state that is empty on every rank stays an empty list.

    Raises:
        RuntimeError: on every rank, naming the state and the ranks, when ranks disagree on the set of
            states, a reduction, a dtype or a shape.

    Example:
        >>> import torch
        >>> sync_states({"total": torch.tensor(3.0)}, {"total": "sum"})  # one process: unchanged
        {'total': tensor(3.)}
    """
    if grad not in ("none", "local"):
        raise ValueError(f"sync_states: `grad` must be 'none' or 'local'; got {grad!r}")
    for name, fn in reductions.items():
        if not (fn is None or callable(fn) or fn in REDUCTIONS):
            raise ValueError(
                f"sync_states: reduction of state {name!r} must be one of {REDUCTIONS}, a callable or None; got {fn!r}"
            )
    world = group_size(group)
    if world == 1:
        return {k: _single(v, reductions[k], grad) for k, v in states.items()}
    rank = group_rank(group)
    try:  # concatenating list states or reading dtypes can fail on one rank: the others must not wait
        entries = _entries(states, reductions)
        for e in entries:
            e.signature()
    except Exception as err:
        fail_sync(err, group, plan=plan, owner=owner, device=device)
    if device is None:
        device = next((e.tensor.device for e in entries if e.tensor is not None), torch.device("cpu"))
    track = grad == "local" and torch.is_grad_enabled()
    for e in entries:
        if e.tensor is not None:
            e.tensor = e.tensor.to(device)
            e.tensor = scale_grad(e.tensor, grad_scale) if track else e.tensor.detach()
    with torch.enable_grad() if track else torch.no_grad():
        return _Sync(entries, plan if plan is not None else SyncPlan(), group, rank, world, owner, device).run()


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
    joins their first round with a failure marker instead of leaving them waiting. Just raises at world size 1.
    """
    world = group_size(group)
    if world == 1:
        raise problem
    plan = plan if plan is not None else SyncPlan()
    _Sync([], plan, group, group_rank(group), world, owner, device or torch.device("cpu")).fail(problem)


def _single(value: State, fn: Reduction, grad: str) -> Any:
    """World size 1: the reductions of one rank, without any collective."""
    if isinstance(value, list):
        if not value:
            return []
        value = torch.cat([v.reshape(1) if v.ndim == 0 else v for v in value])
    elif fn == "cat" and value.ndim == 0:
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

    def _rows(self, header: torch.Tensor, tensors: list, caps: list, min_row: int = 0) -> tuple:
        with self._naming_failures():
            return _gather_rows(header, tensors, caps, self.group, self.rank, self.world, min_row)

    @contextmanager
    def _naming_failures(self) -> Iterator[None]:
        """A collective that fails (a timeout, a dead peer) names the metric and the states being synced."""
        try:
            yield
        except RuntimeError as err:
            names = [e.name for e in self.entries]
            raise RuntimeError(
                f"{self.owner}: a collective failed while syncing states {names} over {self.world} ranks: {err}"
            ) from err

    def fail(self, problem: BaseException) -> None:
        """Take part in round A with a failure marker, then raise ``problem``: the other ranks raise too."""
        header = _int_bytes([_FAILED, 0], self.device)
        self._rows(header, [], [], min_row=self.plan.row_bytes)
        raise problem

    def run(self) -> dict[str, Any]:
        plan, device = self.plan, self.device
        local_sig = [e.signature() for e in self.entries]
        local_hash = _hash(local_sig)
        variable = [v for e in self.entries for v in e.variable()]
        meta = json.dumps({"sig": local_sig, "var": variable}).encode()
        meta_bytes = torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(device)

        # Round A: header, then either the metadata itself (no plan yet) or the plan's sizes and payload.
        fits = local_hash == plan.signature_hash
        reduced: dict[str, torch.Tensor] = {}
        if plan.signature_hash == 0:
            inline = len(meta) <= plan.row_bytes - _HEADER
            header = torch.cat([_int_bytes([local_hash, len(meta)], device), meta_bytes if inline else meta_bytes[:0]])
            table, _ = self._rows(header, [], [], min_row=plan.row_bytes)
        else:
            header = _int_bytes([local_hash, len(meta)] + (variable if fits else [0] * plan.n_variable), device)
            tensors = [
                self.by_name[n].tensor if fits else torch.zeros(0, dtype=torch.uint8, device=device)
                for n, _ in plan.payload
            ]
            table, outs = self._rows(header, tensors, [b for _, b in plan.payload], min_row=plan.row_bytes)
            if fits:
                reduced = {n: o for (n, _), o in zip(plan.payload, outs)}
        ints = table[:, :_HEADER].contiguous().view(torch.int64).tolist()
        hashes, lens = [r[0] for r in ints], [r[1] for r in ints]
        failed = [r for r, h in enumerate(hashes) if h == _FAILED]
        if failed:
            raise RuntimeError(
                f"{self.owner}: rank(s) {failed} raised an error before syncing (see their message); not syncing"
            )

        if plan.signature_hash != 0 and all(h == plan.signature_hash for h in hashes):
            n = plan.n_variable
            sizes = (
                table[:, _HEADER : _HEADER + 8 * n].contiguous().view(torch.int64).tolist() if n else [[]] * self.world
            )
            signature = plan.signature
        else:
            reduced = {}
            if plan.signature_hash == 0 and max(lens) <= plan.row_bytes - _HEADER:
                raw = [bytes(table[r, _HEADER : _HEADER + lens[r]].tolist()) for r in range(self.world)]
            else:  # fallback: a rank differs from the plan, or the metadata did not fit in the first row
                mt, _ = self._rows(meta_bytes, [], [], min_row=_align(max(lens)))
                raw = [bytes(mt[r, : lens[r]].tolist()) for r in range(self.world)]
            metas = [json.loads(m) for m in raw]
            signature = _check_agreement(self.owner, [m["sig"] for m in metas], self.world)
            self.plan.__dict__.update(_make_plan(signature, self.world).__dict__)
            sizes = [m["var"] for m in metas]
        return self._finish(signature, sizes, reduced)

    def _finish(self, signature: list, sizes: list[list[int]], reduced: dict[str, torch.Tensor]) -> dict[str, Any]:
        # Per-rank shapes of every variable-size state, read from the exchanged sizes.
        shapes: dict[str, list[tuple[int, ...]]] = {}
        cursor = 0
        for name, kind, _code, dims in signature:
            if kind == "cat":
                shapes[name] = [(s[cursor], *(dims or ())) for s in sizes]
                cursor += 1
            elif kind == "gather":
                shapes[name] = [tuple(s[cursor : cursor + dims]) for s in sizes]
                cursor += dims

        # Round B: variable-size states, and the reduction states not already reduced or all-reduced.
        payload = {n for n, _ in self.plan.payload}
        round_b, caps = [], []
        for name, kind, code, dims in signature:
            if code == -1 or name in reduced:
                continue
            if kind in _OPS and name not in payload:
                continue  # large sum/mean: all-reduced below
            dtype = dtype_from_code(code)
            if kind in _OPS:
                nbytes = [torch.Size(dims).numel() * dtype.itemsize] * self.world
            else:
                nbytes = [torch.Size(s).numel() * dtype.itemsize for s in shapes[name]]
            round_b.append((name, kind, dtype))
            caps.append(max(nbytes))
        gathered: dict[str, torch.Tensor] = {}
        if round_b:
            tensors = [
                self.by_name[n].tensor
                if self.by_name[n].tensor is not None
                else torch.zeros(0, dtype=dt, device=self.device)
                for n, _, dt in round_b
            ]
            empty = torch.zeros(0, dtype=torch.uint8, device=self.device)
            _, outs = self._rows(empty, tensors, caps)
            gathered = {n: o for (n, _, _), o in zip(round_b, outs)}
        reduced = {**reduced, **gathered}

        # Large sum/mean states: one all_reduce per (op, dtype) bucket.
        buckets: dict[tuple, list[str]] = {}
        for name, kind, code, _dims in signature:
            if kind in ("sum", "mean") and name not in reduced:
                buckets.setdefault((kind, code), []).append(name)
        result: dict[str, Any] = {}
        for (kind, _code), names in buckets.items():
            flat = torch.cat([self.by_name[n].tensor.reshape(-1) for n in names])
            wants = flat.requires_grad
            with self._naming_failures():
                out = (
                    _AllReduce.apply(flat, kind, self.group, self.world, "local", False)
                    if wants
                    else _all_reduced(flat, kind, self.group, self.world)
                )
            for n, piece in zip(names, out.split([self.by_name[n].tensor.numel() for n in names])):
                result[n] = piece.view(self.by_name[n].tensor.shape)

        for name, kind, code, dims in signature:
            if name in result:
                continue
            if code == -1:  # an empty cat state on every rank
                result[name] = []
                continue
            rows = reduced[name]
            if kind in _OPS:
                result[name] = _reduce_rows(kind, rows[:, : torch.Size(dims).numel()], torch.Size(dims))
                continue
            pieces = [rows[r, : torch.Size(s).numel()].view(s) for r, s in enumerate(shapes[name])]
            if kind == "cat":
                result[name] = torch.cat(pieces)
            else:
                fn = self.by_name[name].fn
                stacked = torch.stack(pieces) if all(p.shape == pieces[0].shape for p in pieces) else pieces
                result[name] = stacked if fn is None else fn(stacked)
        return {e.name: result[e.name] for e in self.entries}


def _all_reduced(flat: torch.Tensor, kind: str, group: Group, world: int) -> torch.Tensor:
    return _AllReduce.apply(flat.detach(), kind, group, world, "local", False)
