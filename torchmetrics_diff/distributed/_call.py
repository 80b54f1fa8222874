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
- the call's name (``"CLIPLoss.update: gather_all_tensors"``, ``"MeanMetric.forward"``): a 62-bit hash of the whole
  name, which is what ranks compare, and its first 48 bytes, which is what errors print,
- up to :data:`PAYLOAD` int64 of the call's own metadata (shapes, dtypes, rows), returned to the caller.

Every rank reads every rank's header and raises the same ``RuntimeError`` when they are not in the same call,
naming each rank's call and counts, before any collective whose size depends on the call.

The header is built from host values (names, shapes) and travels as a CPU tensor over the group's host
(:mod:`._hosts`): the call's own group when its backend carries CPU tensors (gloo, a ``"cpu:gloo,cuda:nccl"``
pair), else a gloo twin of it made once on the group's own store. Reading it therefore never waits for a GPU: it
is a host-to-host exchange that runs while the GPU works through its queue, not a host round trip.

In groups of more than :data:`FULL_HEADER_MAX_RANKS` ranks (under the default checks, :func:`set_checks`) every
rank's header is exchanged only when needed: each call first max-reduces a fixed-size *fingerprint* (sequence
number, count, name, the id of the table of payloads the ranks agreed on at an earlier call of this name, and
whether this rank's payload changed) in ``log2 W`` pairwise rounds; when every rank agrees, the agreed table is the
answer (the same list object as then), else every rank exchanges its header as above, in the same call. The
state the package keeps per group (counts, the inline area, the host, the checks, the agreed tables, the buffers)
is the group's :class:`~._groups.GroupState`.

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
import hashlib
from collections.abc import Sequence
from contextvars import ContextVar, Token
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from torchmetrics_diff.distributed import _hosts
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.distributed._failure import RanksDisagreeError, peers_failed, ranks_text
from torchmetrics_diff.distributed._groups import CHECKS, FINGERPRINT_INTS, INLINE_BYTES, REGISTRY, GroupState, state_of
from torchmetrics_diff.distributed._hosts import Host, make_host

#: int64 per rank in every header exchange: the same for every call, so ranks in different calls still meet
HEADER_INTS = 64
_FIXED = 13  # magic, sequence, count, status, name hash, 6 x 8 bytes of name, payload length, inline bytes wanted
_NAME_INTS = 6
_NAME = slice(4, 11)  # what two ranks in the same call have alike: the name's hash and its readable prefix
_SAME = np.r_[1, 2, 4:11]  # the columns every rank's header must share with rank 0's: sequence, count, name
_SAME.flags.writeable = False
_LENGTH, _WANT = 11, 12  # the payload's length, the inline bytes this call wanted
# a call every rank is in, ready, with payloads of one length and rows of one size: every header's first _ALIKE
# ints are this rank's
_ALIKE = _WANT + 1
#: int64 of call metadata a header carries
PAYLOAD = HEADER_INTS - _FIXED
#: the largest inline area: a larger row is bandwidth-bound (a collective of its own costs little more), and every
#: call on the group would pay for the area's bytes
MAX_INLINE_BYTES = 128 * 1024
_STEP = 4096  # the area grows to the wanted size rounded up to a multiple of this (few distinct sizes)
_WINDOW = 16  # the area is sized for the largest row wanted over this many exchanges on the group
#: bytes every rank sends in a header exchange while the group's inline area is the smallest
EXCHANGE_BYTES = 8 * HEADER_INTS + INLINE_BYTES
_MAGIC = 0x7444_6966_6643_6C6C  # never a sequence number or a small count: a rank in a foreign protocol shows
_READY, _FAILED = 0, 1

#: under ``"steady"``, groups of at most this many ranks exchange full headers (an all-gather of about 2 KiB per
#: rank, which also carries small CPU data); larger groups exchange a fixed-size fingerprint instead
FULL_HEADER_MAX_RANKS = 8
_AGREED_PER_NAME = 4  # agreed tables remembered per call name (several objects may make calls of one name)
_FULL, _FINGERPRINT, _OFF = 0, 1, 2  # how a call's header travels (see _header_route)
_IDS = 5  # the fingerprint's identity ints: sequence, count, name (2), agreed table
assert 2 * _IDS + 1 == FINGERPRINT_INTS  # (ids, -ids, changed)


#: The entry point this context's calls to the collectives run for: ``(name, count)`` as :func:`enter` set it, or
#: ``None`` outside any. ``name`` (``"CLIPLoss.forward"``) names the call in the header and in the errors; ``count``
#: is how many calls the object behind it made before (the header's count). A ``ContextVar``: each thread (and
#: asyncio task) has its own, and an entry point restores it in a ``finally``, so an error cannot leave it set.
#: Compiled code names no entry point (Dynamo cannot trace ``ContextVar.set``): its calls are named by their
#: operation and counted per name on the group, alike on every rank.
_ENTRY: ContextVar[tuple[str, int] | None] = ContextVar("torchmetrics_diff_entry", default=None)


class _Agreed:
    """A table of every rank's payload that a full exchange returned, remembered under this rank's own payload."""

    __slots__ = ("ident", "rows")

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows  # returned as is by every steady call that agrees on it: callers may cache by identity
        self.ident = hash(tuple(map(tuple, rows))) & 0x3FFF_FFFF_FFFF_FFFF or 1  # the same on every rank


def _header_route(state: GroupState) -> int:
    """How the group's headers travel now: full headers, a fingerprint, or nothing (checks off)."""
    mode = state.checks or REGISTRY.checks
    if mode == "off":
        return _OFF
    if mode == "full" or state.size <= FULL_HEADER_MAX_RANKS:
        return _FULL
    return _FINGERPRINT


def _next_count(state: GroupState, name: str) -> tuple[int, int]:
    """This process's (calls on the group so far, calls of ``name`` so far), then counts this one. The counts of
    names restart after an error of a header exchange (:func:`_failed_exchange`)."""
    seq, count = state.seq, state.names.get(name, 0)
    state.seq, state.names[name] = seq + 1, count + 1
    return seq, count


def _resize(state: GroupState, wanted: int) -> None:
    """After a full exchange every rank passed: the inline area becomes the largest row wanted over the last
    :data:`_WINDOW` exchanges (rounded up to :data:`_STEP`; a row over :data:`MAX_INLINE_BYTES` never fits and
    counts as none; ``wanted``: the largest row the exchange's headers wanted), growing at once and shrinking when
    it is under half the area (so it does not flap)."""
    recent = state.recent
    recent.append(wanted if wanted <= MAX_INLINE_BYTES else 0)
    if len(recent) > _WINDOW:
        del recent[0]
    need = max(recent)
    size = INLINE_BYTES if need <= INLINE_BYTES else min(-(-need // _STEP) * _STEP, MAX_INLINE_BYTES)
    if size > state.inline or 2 * size <= state.inline:
        state.inline = size


def _remember(state: GroupState, name: str, key: tuple[int, ...], rows: list[list[int]]) -> None:
    tables = state.agreed.setdefault(name, {})
    tables.pop(key, None)
    if len(tables) >= _AGREED_PER_NAME:
        del tables[next(iter(tables))]
    tables[key] = _Agreed(rows)


def enter(name: str, count: int) -> Token | None:
    """Name the calls to the collectives from here to :func:`leave` after ``name`` (an entry point such as
    ``"CLIPLoss.forward"``) and ``count`` (how many calls the object made before), for the header and for the error
    when ranks are in different calls.

    Returns:
        The token to hand to :func:`leave` in a ``finally``; ``None`` in compiled code, which names no entry point
        (see :data:`_ENTRY`).
    """
    if torch.compiler.is_compiling():
        return None
    return _ENTRY.set((name, count))


def leave(token: Token | None) -> None:
    """End the entry point :func:`enter` named (its token; ``None``: nothing to end)."""
    if token is not None:
        _ENTRY.reset(token)


def within_entry(part: str) -> Token | None:
    """Name the calls from here to :func:`leave` after the current entry point and ``part`` (``"CLIPLoss.forward:
    sharded"``); ``None`` (nothing to leave) outside any entry point and in compiled code."""
    entry = None if torch.compiler.is_compiling() else _ENTRY.get()
    return None if entry is None else _ENTRY.set((f"{entry[0]}: {part}", entry[1]))


def fresh_count(counted: tuple[int, int] | None, group: Group) -> tuple[int, tuple[int, int]]:
    """An object's count of its calls on ``group``: ``(calls before this one, what to store for the next)``, from what
    it stored (``None`` at first). Counts restart after an error of a header exchange on the group, which every rank
    raised alike."""
    return _counted(counted, _state(group).epoch)


def _counted(counted: tuple[int, int] | None, epoch: int) -> tuple[int, tuple[int, int]]:
    n = counted[1] if counted is not None and counted[0] == epoch else 0
    return n, (epoch, n + 1)


def opening(counted: tuple[int, int] | None, group: Group) -> tuple[int, tuple[int, int], int, int]:
    """For an object's call about to exchange its header on ``group``: :func:`fresh_count`,
    :func:`inline_capacity` and this process's rank in the group, from one look-up of the group's state (the state
    sync's steady path)."""
    state = _state(group)
    n, counted = _counted(counted, state.epoch)
    return n, counted, state.inline if _header_route(state) == _FULL else 0, state.rank


def _failed_exchange(state: GroupState) -> None:
    """A header exchange raises (or this rank joined it only to fail): the group's counts restart."""
    state.epoch += 1
    state.names = {}


def entry_name() -> str:
    """The current entry point's name (``"CLIPLoss.forward"``); ``""`` outside any (and in compiled code, which
    names none; only an error path reads it there)."""
    entry = _ENTRY.get()
    return "" if entry is None else entry[0]


def call_name(op: str) -> str:
    """``op`` inside the current entry point: ``"CLIPLoss.update: all_gather_cat"``; ``op`` outside any."""
    entry = _ENTRY.get()
    return f"{entry[0]}: {op}" if entry is not None else op


def _state(group: Group) -> GroupState:
    """The group's :class:`~._groups.GroupState`, made at its first call."""
    return state_of(dist.GroupMember.WORLD if group is None else group)


def group_state(group: Group) -> GroupState:
    """The group's state, where callers keep what they derive from a table :func:`exchange` returned (checked
    metadata, a strategy's memory), so that a steady call, which gets the same table back, derives nothing again."""
    return _state(group)


def host(group: Group) -> Host:
    """The :class:`~._hosts.Host` a call's header on ``group`` travels over, made at the group's first call."""
    return _host_of(_state(group))


def _host_of(state: GroupState) -> Host:
    if state.host is None:
        state.host = make_host(state.ref, state.rank, state.size)
    return state.host


def set_checks(mode: str, group: Group = None, *, default: bool = False) -> None:
    """Choose what the package checks before each communicating call on ``group`` moves its data.

    Every rank of the group must choose the same. See :doc:`/guide/scaling` for each mode's guarantees and cost.

    Args:
        mode: ``"steady"`` (the default): groups of up to 8 ranks exchange every
            rank's header (as ``"full"``); larger ones a fixed-size fingerprint of the call, reduced in
            ``ceil(log2 W)`` rounds, and every rank's header only on a call whose metadata changed on some rank,
            whose fingerprint differs between ranks, or where a rank failed: the same errors as ``"full"``, in the
            same call. ``"full"``: every rank's header on every call (``W`` x 512 bytes or more per call).
            ``"off"``: every rank's header only at a call whose metadata is new to this rank (the first calls of
            each kind, a new object of a kind, shapes that changed), nothing otherwise: no host work or exchange
            in the steady state, and no protection: the ranks must change together (a rank in another call, or
            whose shapes changed alone, makes the backend hang or fail, as raw collectives do).
        group: the process group (default ``None``: the default group).
        default: set the process's default for every group without a mode of its own instead (``group`` is
            then ignored); the environment variable ``TORCHMETRICS_DIFF_CHECKS`` sets it at import.

    Raises:
        ValueError: ``mode`` is not one of :data:`CHECKS`.

    Example:
        >>> from torchmetrics_diff.distributed import get_checks, set_checks
        >>> set_checks("full", default=True)
        >>> get_checks()
        'full'
        >>> set_checks("steady", default=True)
    """
    if mode not in CHECKS:
        raise ValueError(f"`mode` must be one of {CHECKS}; got {mode!r}")
    if default:
        REGISTRY.checks = mode
        return
    _state(group).checks = mode


def get_checks(group: Group = None) -> str:
    """The checks mode of ``group`` (see :func:`set_checks`); the process's default without a process group.

    Args:
        group: the process group (default ``None``: the default group).

    Returns:
        ``"full"``, ``"steady"`` or ``"off"``.

    Example:
        >>> from torchmetrics_diff.distributed import get_checks
        >>> get_checks()
        'steady'
    """
    if not (dist.is_available() and dist.is_initialized()):
        return REGISTRY.checks
    return _state(group).checks or REGISTRY.checks


def inline_capacity(group: Group) -> int:
    """The bytes of the inline area of the next header exchange on ``group``: a caller whose CPU row is no larger
    writes it there (:func:`inline_buffers`) and its call is one collective. 0 when the group's headers are
    fingerprints (or off): the data then always moves in a collective of its own.

    The same on every rank: it follows from the ``want`` of the exchanges every rank saw (an exchange that raised
    changes nothing), so ranks that reach different calls still send as many bytes as each other.
    """
    state = _state(group)
    return state.inline if _header_route(state) == _FULL else 0


@functools.lru_cache(maxsize=1024)  # a few names per program, each encoded once
def _encode(name: str) -> tuple[int, ...]:
    raw = name.encode("ascii", "replace")[: 8 * _NAME_INTS].ljust(8 * _NAME_INTS, b"\0")
    return tuple(int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8))


@functools.lru_cache(maxsize=1024)
def _name_ids(name: str) -> tuple[int, int]:
    """Two non-negative 62-bit ints that stand for ``name`` in a fingerprint (whole, not truncated)."""
    digest = hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little") >> 2, int.from_bytes(digest[8:], "little") >> 2


def _decode(ints: Sequence[int]) -> str:
    raw = b"".join(int(i).to_bytes(8, "little", signed=True) for i in ints)
    return raw.rstrip(b"\0").decode("ascii", "replace")


def _buffers(state: GroupState, inline: int) -> tuple[Any, ...]:
    """The (send, receive) byte buffers of the group's header exchanges with ``inline`` bytes of inline area, made
    once, NumPy int64 views of the send buffer's header and of every rank's header in the receive buffer (reading
    Python ints through them costs a fraction of the tensor operations that would do it), and the inline areas
    (send, table): ``(send, table, ints, heads, inline send, inline table)``."""
    bufs = state.buffers.get(inline)
    if bufs is None:
        if len(state.buffers) >= 4:  # sizes the group no longer uses: the next call of that size makes them anew
            state.buffers.clear()
        world, size = state.size, 8 * HEADER_INTS + inline
        send = torch.zeros(size, dtype=torch.uint8)
        table = torch.zeros(world * size, dtype=torch.uint8)
        heads = table.view(world, size)[:, : 8 * HEADER_INTS].view(torch.int64).numpy()
        ints = send[: 8 * HEADER_INTS].view(torch.int64).numpy()
        rows = table.view(world, size)[:, 8 * HEADER_INTS :]
        bufs = state.buffers[inline] = (send, table, ints, heads, send[8 * HEADER_INTS :], rows)
    return bufs


def inline_buffers(group: Group, inline: int = INLINE_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """The inline area of a header exchange on ``group`` whose area has ``inline`` bytes (the group's
    :func:`inline_capacity`): ``(send, table)``, ``inline`` bytes and ``(world, inline)``. A caller whose data is
    on the CPU and fits writes it into ``send`` before its :func:`exchange` and reads every rank's from ``table``
    after: its sync is then that one collective. The same buffers come back for every call of that size (views of
    them can be kept while the size stays); every header exchange of that size overwrites ``table``."""
    bufs = _buffers(_state(group), inline)
    return bufs[4], bufs[5]


def _host_rows(heads: Any) -> list[list[int]]:
    """Every rank's payload as Python ints, read through the NumPy view of the received CPU table (nothing waits
    for a device): one conversion of the payload columns, no Python per rank when every payload has one length."""
    lengths = heads[:, _LENGTH]
    longest = int(lengths.max())
    payloads = heads[:, _FIXED : _FIXED + longest].tolist()
    if int(lengths.min()) == longest:
        return payloads
    return [row[:n] for row, n in zip(payloads, lengths.tolist())]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def exchange(
    op: str,
    payload: Sequence[int],
    group: Group,
    *,
    failed: bool = False,
    who: str | None = None,
    labels: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    sync: bool = False,
    count: int | None = None,
    want: int = 0,
) -> list[list[int]]:
    """The call's header exchange: every rank's ``payload``, once every rank is known to be in the same call.

    Args:
        op: the call's name (inside an entry point named by :func:`enter`, prefixed with it).
        payload: at most :data:`PAYLOAD` ints of this call's metadata.
        group: the call's process group (of more than one rank).
        failed: this rank found a problem and joins only so its peers raise; it raises its own error after.
        who: the name errors about failed peers start with (default: the call's name).
        labels: how to name each rank in errors (default ``"rank i"``), or a function that returns them (called
            only when an error needs them).
        sync: word a failed peer as a state sync does (``True``) or as a collective does.
        count: how many calls the calling object made before (a metric's syncs): two objects of one class are
            then told apart; default: the entry point's count (:func:`enter`), else the calls of this name.
        want: the bytes of this call's CPU row (inline or not; 0: none): the group's inline area grows to fit
            such rows (:func:`inline_capacity`).

    Returns:
        Every rank's payload, by rank (only when no rank failed and every rank is in this call). When every rank's
        payload is the same as at an earlier call of this name that they all agreed on, the very list returned
        then (callers may cache what they derive from it by its identity; it must not be modified).

    Raises:
        RuntimeError: on every rank alike, when a peer failed (naming it) or when ranks are in different calls
            (naming what each group of ranks was doing).
    """
    if len(payload) > PAYLOAD:
        raise ValueError(f"a call header carries at most {PAYLOAD} ints; got {len(payload)}")
    name = call_name(op)
    state = _state(group)
    host = _host_of(state)
    host.call = name  # (a backend error in this call's collectives is named by it, and posted on its host)
    seq, named = _next_count(state, name)
    if count is None:
        entry = _ENTRY.get()
        count = named if entry is None else entry[1]
    route = _header_route(state)
    if route == _FULL:
        return _full(state, name, payload, seq, count, failed, want, state.inline, who, labels, sync)
    key = tuple(payload)
    known = state.agreed.get(name, {}).get(key)
    if route == _OFF:
        if failed:  # nobody listens: this rank raises its own error (its peers wait for their timeout)
            _failed_exchange(state)
            return []
        if known is not None:
            return known.rows
        # metadata new to this rank (a first call, a new object of the kind, shapes that changed): every rank's
        # header, once; a rank whose metadata changed alone meets peers that skip the exchange (see set_checks)
    elif _fingerprint(state, seq, count, name, None if failed else known):
        return known.rows  # type: ignore[union-attr]  # (the fingerprint agrees only on a known table)
    rows = _full(state, name, payload, seq, count, failed, want, 0, who, labels, sync)
    if rows:
        _remember(state, name, key, rows)
    return rows


def _fingerprint(state: GroupState, seq: int, count: int, name: str, known: _Agreed | None) -> bool:
    """Whether every rank is in this call (the same sequence number, count and name) and proposes the same agreed
    table of payloads (``known``: this rank's, ``None`` when it has none or failed): one fixed-size max-reduction of
    ``(ids, -ids, changed)``, whose maximum ``ids`` equal minus the maximum ``-ids`` exactly when every rank sent
    the same ids."""
    first, second = _name_ids(name)
    ident = known.ident if known is not None else 0
    view = state.view
    view[:] = (seq, count, first, second, ident, -seq, -count, -first, -second, -ident, int(known is None))
    _hosts.max_reduce(_host_of(state), state.fingerprint)
    got = view.tolist()
    return got[2 * _IDS] == 0 and all(got[i] == -got[_IDS + i] for i in range(_IDS))


def _full(
    state: GroupState,
    name: str,
    payload: Sequence[int],
    seq: int,
    count: int,
    failed: bool,
    want: int,
    inline: int,
    who: str | None,
    labels: Sequence[str] | Callable[[], Sequence[str]] | None,
    sync: bool,
) -> list[list[int]]:
    """Every rank's header, all-gathered in ``log2 W`` rounds (:func:`._hosts.all_gather`), checked identically on
    every rank with vectorised comparisons of the received table (no Python per rank)."""
    world = state.size
    status = _FAILED if failed else _READY
    header = [_MAGIC, seq, count, status, _name_ids(name)[0], *_encode(name), len(payload), want, *payload]
    send, table, ints, heads = _buffers(state, inline)[:4]
    ints[: len(header)] = header  # (a NumPy view of the send buffer's header: no tensor made per call)
    _hosts.all_gather(_host_of(state), table, send)
    if failed:  # this rank raises its own error next: the group's counts restart, as on its peers
        _failed_exchange(state)
        return []
    if (heads[:, :_ALIKE] == ints[:_ALIKE]).all():  # the usual case, in one vectorised comparison
        if inline:
            _resize(state, want)  # (every rank wanted as many bytes as this one)
        return heads[:, _FIXED : _FIXED + len(payload)].tolist()
    ours = heads[:, 0] == _MAGIC
    bad = ours & (heads[:, 3] == _FAILED)
    if bad.any() or not (ours.all() and (heads[:, _SAME] == heads[0, _SAME]).all()):
        _failed_exchange(state)
        names = labels() if callable(labels) else labels
        names = names or [f"rank {r}" for r in range(world)]
        if bad.any():
            ranks: list[int] = np.flatnonzero(bad).tolist()
            raise peers_failed(who or name, ranks if sync else [names[r] for r in ranks], sync=sync)
        raise _different_calls(heads, names)
    if inline:
        _resize(state, int(heads[:, _WANT].max()))
    return _host_rows(heads)


def _different_calls(heads: Any, names: Sequence[str]) -> RanksDisagreeError:
    """The error of ranks in different calls: the ranks grouped by what they were doing, at most a few hundred
    characters whatever the world size."""
    ours = heads[:, 0] == _MAGIC
    what = np.where(ours[:, None], heads[:, _SAME], -1)  # (every foreign header is one kind)
    _, first, inverse = np.unique(what, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the groups in the order of their lowest rank
    parts = []
    for k in order[:_GROUPS_LISTED]:
        ranks = np.flatnonzero(inverse.reshape(-1) == k).tolist()
        h = heads[ranks[0]].tolist()
        if h[0] != _MAGIC:
            parts.append(f"{ranks_text(ranks, names)}: a collective that is not a call of this package")
        else:
            call, count, seq = _decode(h[_NAME][1:]), _ordinal(h[2] + 1), h[1] + 1
            call += "..." if len(call) == 8 * _NAME_INTS else ""  # (a longer name: the whole name's hash differs)
            parts.append(
                f"{ranks_text(ranks, names)}: {call!r} (the object's {count} such call; call {seq} on the group)"
            )
    if len(order) > _GROUPS_LISTED:
        rest = int(sum((inverse.reshape(-1) == k).sum() for k in order[_GROUPS_LISTED:]))
        parts.append(f"{len(order) - _GROUPS_LISTED} other calls on {rest} ranks")
    error = RanksDisagreeError(
        "ranks are in different calls: " + "; ".join(parts) + ". Every rank must make the same calls that "
        "communicate, in the same order (the same number of update/forward/compute calls of each metric and loss)"
    )
    # what each group of ranks was doing, for an entry point that words the error of its own protocol:
    # (ranks, the call's readable name or None for a foreign collective, the header's count)
    groups: list[tuple[list[int], str | None, int]] = []
    for k in order:
        ranks = np.flatnonzero(inverse.reshape(-1) == k).tolist()
        h = heads[ranks[0]].tolist()
        name = _decode(h[_NAME][1:]) if h[0] == _MAGIC else None
        groups.append((ranks, name, h[2]))
    error.calls = groups  # type: ignore[attr-defined]
    return error


_GROUPS_LISTED = 4  # kinds of call an error names; the rest are counted
