"""The first exchange of every communicating call: a fixed-size header that says which call this rank is in.

Collectives only work when every rank enters the same one with the same sizes; a rank that makes one call more
than its peers (an extra ``update`` on a longer validation shard, say) would otherwise meet a different
collective of theirs, and the backend aborts the process (gloo) or hangs (NCCL). So every call of this package
that communicates (a collective of :mod:`._collectives`, a state sync, the ring's plan) starts with
:func:`exchange`: one all-gather of :data:`HEADER_INTS` int64 per rank, the same size for every call, holding

- a marker (:data:`_MAGIC`), this process's sequence number of calls on the group, and how many calls the calling
  object made before (a metric's syncs, a loss's calls; else the calls of this name),
- a status: ready, or *failed* (the rank found a problem before communicating and joins only to tell its peers,
  see :mod:`._failure`),
- the call's name (``"CLIPLoss.update: gather_all_tensors"``, ``"MeanMetric.forward"``), truncated to 48 bytes,
- up to :data:`PAYLOAD` int64 of the call's own metadata (shapes, dtypes, rows), returned to the caller.

Every rank reads every rank's header and raises the same ``RuntimeError`` when they are not in the same call,
naming each rank's call and counts, before any collective whose size depends on the call.

The header is built from host values (names, shapes) and travels as a CPU tensor over a group that carries CPU
tensors: the call's own group when its backend has gloo (or a ``"cpu:gloo,cuda:nccl"`` pair), else a gloo twin
of it made once (:func:`host_group`). Reading it therefore never waits for a GPU: it is a host-to-host exchange
that runs while the GPU works through its queue, not a host round trip.

Every exchange sends the header, then an inline area that a state sync of CPU data fills with its own row when it
fits (:func:`inline_buffers`), so that on CPU/gloo a sync is one collective. The area's size is the group's, the
same for every call on it: :data:`INLINE_BYTES` at first, then the largest CPU row that calls on the group wanted
to send over the last :data:`_WINDOW` exchanges (each header says what its call wanted, so every rank derives the
same size from the exchanges they all saw; see :func:`inline_capacity`), up to :data:`MAX_INLINE_BYTES`. Ranks in
different calls therefore still meet in a collective of one size. A sync of GPU data moves its row in a
collective of its own on the device.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from torchmetrics_diff.distributed._backend import Group, all_gather_flat
from torchmetrics_diff.distributed._failure import peers_failed

#: int64 per rank in every header exchange: the same for every call, so ranks in different calls still meet
HEADER_INTS = 64
_FIXED = 12  # magic, sequence, count, status, payload length, inline bytes wanted, 6 x 8 bytes of name
_NAME_INTS = 6
#: int64 of call metadata a header carries
PAYLOAD = HEADER_INTS - _FIXED
#: the inline area's size on a group where no call wanted a larger one (see :func:`inline_capacity`)
INLINE_BYTES = 1536
#: the largest inline area: a larger row is bandwidth-bound (a collective of its own costs little more), and every
#: call on the group would pay for the area's bytes
MAX_INLINE_BYTES = 128 * 1024
_STEP = 4096  # the area grows to the wanted size rounded up to a multiple of this (few distinct sizes)
_WINDOW = 16  # the area is sized for the largest row wanted over this many exchanges on the group
#: bytes every rank sends in a header exchange while the group's inline area is the smallest
EXCHANGE_BYTES = 8 * HEADER_INTS + INLINE_BYTES
_MAGIC = 0x7444_6966_6643_6C6C  # never a sequence number or a small count: a rank in a foreign protocol shows
_READY, _FAILED = 0, 1

# the entry point a collective runs for ("CLIPLoss.forward"), set by the loss classes: names the call (see enter)
_caller = ""
_caller_count = 0
# bumped on every rank alike when a header exchange raises (peers in different calls, a failed peer): the objects'
# call counts restart from it, so the ranks agree again after an error they all raised (see fresh_count)
_epoch = 0

# per group (by id of the group object, with a weak reference to tell a live group from a new one at that id):
# [weakref, calls so far, {name: calls of that name so far}, the error epoch those counts belong to,
#  the inline area's bytes, the largest inline row wanted by each of the last _WINDOW exchanges]
_COUNTS: dict[int, list[Any]] = {}
# the group each group's headers travel over (itself, or a gloo twin), by id of the group object
_HOSTS: dict[int, tuple[Any, Any]] = {}
_FORCE_TWIN = False  # tests: give gloo groups a twin too, so that the twin path runs without NCCL
# the header exchange's (send, receive, NumPy views of the send header and of the received headers) buffers, by
# (world size, inline bytes)
_BUFFERS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, Any, Any]] = {}
# their inline areas (send, table): the same view objects every call, so callers can tell a new buffer by identity
_INLINE: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def enter(name: str, count: int) -> None:
    """Name the calls to the collectives from here to :func:`leave` after ``name`` (an entry point such as
    ``"CLIPLoss.forward"``) and ``count`` (how many calls the object made before), for the header and for the error
    when ranks are in different calls.

    A plain module attribute rather than a context manager: ``torch.compile`` traces the assignment, while a
    ``try`` around a graph break would split the compiled frame. An entry point that raises leaves it set; the
    next entry point replaces it.
    """
    global _caller, _caller_count
    _caller, _caller_count = name, count


def leave() -> None:
    """End the entry point :func:`enter` named."""
    global _caller
    _caller = ""


def fresh_count(counted: tuple[int, int] | None) -> tuple[int, tuple[int, int]]:
    """An object's count of its calls: ``(calls before this one, what to store for the next)``, from what it stored
    (``None`` at first). Counts restart after an error of a header exchange, which every rank raised alike."""
    n = counted[1] if counted is not None and counted[0] == _epoch else 0
    return n, (_epoch, n + 1)


def _failed_exchange() -> None:
    """A header exchange raises (or this rank joined it only to fail): the entry point ends; counts restart."""
    global _epoch
    _epoch += 1
    leave()


def call_name(op: str) -> str:
    """``op`` inside the current entry point: ``"CLIPLoss.update: all_gather_cat"``; ``op`` outside any."""
    return f"{_caller}: {op}" if _caller else op


def _world_group() -> Any:
    return dist.GroupMember.WORLD


def _entry(group: Group) -> list[Any]:
    """The group's counts and inline area (see :data:`_COUNTS`), made at its first call."""
    pg = _world_group() if group is None else group
    entry = _COUNTS.get(id(pg))
    if entry is None or entry[0]() is not pg:
        try:
            ref: Any = weakref.ref(pg)
        except TypeError:  # a group object without weak references: held for the process's lifetime
            ref = (lambda obj: lambda: obj)(pg)
        entry = _COUNTS[id(pg)] = [ref, 0, {}, _epoch, INLINE_BYTES, []]
    return entry


def inline_capacity(group: Group) -> int:
    """The bytes of the inline area of the next header exchange on ``group``: a caller whose CPU row is no larger
    writes it there (:func:`inline_buffers`) and its call is one collective.

    The same on every rank: it follows from the ``want`` of the exchanges every rank saw (an exchange that raised
    changes nothing), so ranks that reach different calls still send as many bytes as each other.
    """
    return _entry(group)[4]


def _resize(entry: list[Any], rows: list[list[int]]) -> None:
    """After an exchange every rank passed: the group's inline area becomes the largest row wanted over the last
    :data:`_WINDOW` exchanges (rounded up to :data:`_STEP`; a row over :data:`MAX_INLINE_BYTES` never fits and
    counts as none), growing at once and shrinking when it is under half the area (so it does not flap)."""
    wanted = max(h[5] for h in rows)
    recent = entry[5]
    recent.append(wanted if wanted <= MAX_INLINE_BYTES else 0)
    if len(recent) > _WINDOW:
        del recent[0]
    need = max(recent)
    size = INLINE_BYTES if need <= INLINE_BYTES else min(-(-need // _STEP) * _STEP, MAX_INLINE_BYTES)
    if size > entry[4] or 2 * size <= entry[4]:
        entry[4] = size


def _next_count(group: Group, name: str) -> tuple[int, int]:
    """This process's (calls on ``group`` so far, calls of ``name`` so far), then counts this one. The counts of
    names restart after an error of a header exchange, as objects' counts do (:func:`fresh_count`)."""
    entry = _entry(group)
    if entry[3] != _epoch:
        entry[2], entry[3] = {}, _epoch
    seq, names = entry[1], entry[2]
    count = names.get(name, 0)
    entry[1], names[name] = seq + 1, count + 1
    return seq, count


def host_group(group: Group) -> Group:
    """The group the header of a call on ``group`` travels over: one that carries CPU tensors.

    ``group`` itself when its backend has gloo (or MPI); else (NCCL alone) a gloo group over the same ranks, made
    once per group (every member makes it at its first call on the group, as every member reaches the same header
    exchange). Remembered per group object.
    """
    pg = _world_group() if group is None else group
    known = _HOSTS.get(id(pg))
    if known is not None and known[0] is pg:
        return known[1]
    backend = str(dist.get_backend(pg))
    if not _FORCE_TWIN and ("gloo" in backend or "mpi" in backend):
        host = group
    else:
        host = dist.new_group(ranks=dist.get_process_group_ranks(pg), backend="gloo", use_local_synchronization=True)
    _HOSTS[id(pg)] = (pg, host)
    return host


@functools.lru_cache(maxsize=1024)  # a few names per program, each encoded once
def _encode(name: str) -> tuple[int, ...]:
    raw = name.encode("ascii", "replace")[: 8 * _NAME_INTS].ljust(8 * _NAME_INTS, b"\0")
    return tuple(int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8))


def _decode(ints: Sequence[int]) -> str:
    raw = b"".join(int(i).to_bytes(8, "little", signed=True) for i in ints)
    return raw.rstrip(b"\0").decode("ascii", "replace")


def _buffers(world: int, inline: int) -> tuple[torch.Tensor, torch.Tensor, Any, Any]:
    """The (send, receive) byte buffers of the header exchanges of ``world`` ranks with ``inline`` bytes of inline
    area, made once, and NumPy int64 views of the send buffer's header and of every rank's header in the receive
    buffer (reading Python ints through them costs a fraction of the tensor operations that would do it)."""
    bufs = _BUFFERS.get((world, inline))
    if bufs is None:
        if len(_BUFFERS) >= 8:  # sizes a group no longer uses: the next call of that size makes its buffers anew
            _BUFFERS.clear()
            _INLINE.clear()
        size = 8 * HEADER_INTS + inline
        send = torch.zeros(size, dtype=torch.uint8)
        table = torch.zeros(world * size, dtype=torch.uint8)
        heads = table.view(world, size)[:, : 8 * HEADER_INTS].view(torch.int64).numpy()
        bufs = _BUFFERS[world, inline] = (send, table, send[: 8 * HEADER_INTS].view(torch.int64).numpy(), heads)
    return bufs


def inline_buffers(world: int, inline: int = INLINE_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """The inline area of a header exchange of ``world`` ranks whose area has ``inline`` bytes (the group's
    :func:`inline_capacity`): ``(send, table)``, ``inline`` bytes and ``(world, inline)``. A caller whose data is
    on the CPU and fits writes it into ``send`` before its :func:`exchange` and reads every rank's from ``table``
    after: its sync is then that one collective. The same buffers come back for every call of that size (views of
    them can be kept while the size stays); every header exchange of that size overwrites ``table``."""
    send, table, _, _ = _buffers(world, inline)
    views = _INLINE.get((world, inline))
    if views is None or views[0]._base is not send:  # (made anew with its buffers)
        size = 8 * HEADER_INTS + inline
        views = _INLINE[world, inline] = (send[8 * HEADER_INTS :], table.view(world, size)[:, 8 * HEADER_INTS :])
    return views


def _host_rows(heads: Any) -> list[list[int]]:
    """Every rank's header as Python ints, read through the NumPy view of the received CPU table (nothing waits
    for a device)."""
    return heads.tolist()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def exchange(
    op: str,
    payload: Sequence[int],
    group: Group,
    world: int,
    *,
    failed: bool = False,
    who: str | None = None,
    labels: Sequence[str] | None = None,
    sync: bool = False,
    count: int | None = None,
    want: int = 0,
) -> list[list[int]]:
    """The call's header exchange: every rank's ``payload``, once every rank is known to be in the same call.

    Args:
        op: the call's name (inside an entry point named by :func:`enter`, prefixed with it).
        payload: at most :data:`PAYLOAD` ints of this call's metadata.
        group: the call's process group; ``world`` its size (> 1).
        failed: this rank found a problem and joins only so its peers raise; it raises its own error after.
        who: the name errors about failed peers start with (default: the call's name).
        labels: how to name each rank in errors (default ``"rank i"``).
        sync: word a failed peer as a state sync does (``True``) or as a collective does.
        count: how many calls the calling object made before (a metric's syncs): two objects of one class are
            then told apart; default: the entry point's count (:func:`enter`), else the calls of this name.
        want: the bytes of this call's CPU row (inline or not; 0: none): the group's inline area grows to fit
            such rows (:func:`inline_capacity`).

    Returns:
        Every rank's payload, by rank (only when no rank failed and every rank is in this call).

    Raises:
        RuntimeError: on every rank alike, when a peer failed (naming it) or when ranks are in different calls
            (naming each rank's call and how many calls each made).
    """
    if len(payload) > PAYLOAD:
        raise ValueError(f"a call header carries at most {PAYLOAD} ints; got {len(payload)}")
    name = call_name(op)
    entry = _entry(group)
    seq, named = _next_count(group, name)
    if count is None:
        count = _caller_count if _caller else named
    header = [_MAGIC, seq, count, _FAILED if failed else _READY, len(payload), want, *_encode(name), *payload]
    send, table, ints, heads = _buffers(world, entry[4])
    ints[: len(header)] = header  # (a NumPy view of the send buffer's header: no tensor made per call)
    all_gather_flat(table, send, host_group(group))
    rows = _host_rows(heads)
    labels = labels or [f"rank {r}" for r in range(world)]
    if failed:  # this rank raises its own error next: its entry point ends there
        _failed_exchange()
        return []
    bad = [r for r, h in enumerate(rows) if h[0] == _MAGIC and h[3] == _FAILED]
    if bad:
        _failed_exchange()
        raise peers_failed(who or name, [labels[r] if not sync else r for r in bad], sync=sync)
    if any(h[0] != _MAGIC or h[1:3] != rows[0][1:3] or h[6:_FIXED] != rows[0][6:_FIXED] for h in rows):
        _failed_exchange()
        raise _different_calls(rows, labels)
    _resize(entry, rows)
    return [h[_FIXED : _FIXED + h[4]] for h in rows]


def _different_calls(rows: list[list[int]], labels: Sequence[str]) -> RuntimeError:
    parts = []
    for label, h in zip(labels, rows):
        if h[0] != _MAGIC:
            parts.append(f"{label}: a collective that is not a call of this package")
        else:
            call, count, seq = _decode(h[6:_FIXED]), _ordinal(h[2] + 1), h[1] + 1
            parts.append(f"{label}: {call!r} (the object's {count} such call; call {seq} on the group)")
    return RuntimeError(
        "ranks are in different calls: " + "; ".join(parts) + ". Every rank must make the same calls that "
        "communicate, in the same order (the same number of update/forward/compute calls of each metric and loss)"
    )
