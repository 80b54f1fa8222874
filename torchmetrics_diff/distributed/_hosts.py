"""The host group of a process group: where the package's call headers travel, host to host, never waiting for a GPU.

A call header (:mod:`._call`) is a few hundred bytes of host values. It travels as a CPU tensor, so it needs a
group whose backend carries CPU tensors:

- the group itself when the backend that serves its CPU tensors declares CPU support (gloo, MPI, UCC, a
  ``"cpu:gloo,cuda:nccl"`` pair, any backend registered with ``devices`` including ``"cpu"``): no second group;
- else (NCCL alone, or any CUDA-only backend) a *twin*: a gloo backend over the same ranks, made directly on a
  store prefixed inside the group's own store. Its name is therefore the parent's on every member, whatever
  other groups exist or were made first (``torch.distributed.new_group`` names groups from a process-wide count
  or from how many groups the process knows, which differ between ranks that belong to different groups — the
  twin never goes through it). It waits as long as the parent group's timeout before raising. Above
  :data:`EAGER_MAX_RANKS` ranks it connects lazily (gloo's lazy initialisation): a rank opens a connection to a
  peer at their first message, so it holds one per partner of the exchanges below (``log2 W`` of them, one more
  when ``W`` is not a power of two), not one per rank.

Making a twin is a rendezvous of the group's members only (on the group's own store), at the first call on the
group, which every member reaches: safe at any moment relative to the user's own ``new_group`` or
``DeviceMesh`` calls.

:func:`all_gather` and :func:`max_reduce` are the two exchanges a header needs: every rank's header (the full
exchange), or the elementwise maximum of a fixed-size fingerprint. Both are log-depth over point-to-point
messages with the same partners (recursive doubling: ``ceil(log2 W)`` rounds, one or two more when ``W`` is not
a power of two), where gloo's own ring collectives take ``W - 1`` hops (an all-gather) or ``2(W - 1)`` (an
all-reduce).

*A peer that leaves* (its process exits or its connection breaks) is seen at once only by the ranks that exchange
with it; the others would wait for the group's timeout on partners that are themselves stuck. So the first rank that
sees it posts it on the group's *board* (a key of the group's store, :meth:`Host.post`) and sends each of its own
partners a *notice*: a 16-byte message (a marker, then the rank that left), on the tags they receive on, that
completes whatever receive they have posted, or their next one (gloo accepts a message shorter than the receive). A
rank that receives a notice reads the board, sends notices to its own partners and raises the same
:class:`~._failure.PeerLeftError`, naming the rank that left; so the news crosses the partner graph in at most
``log2 W`` hops. A rank waiting in one of gloo's own collectives on the group instead reads the board while it waits
(:func:`._backend._wait`). Once a peer left, every later exchange on the host raises at once.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from torchmetrics_diff.distributed._backend import _wait as wait
from torchmetrics_diff.distributed._failure import PeerLeftError, backend_error, departure, is_departure

_PREFIX = "torchmetrics_diff/host/"
_TAG = 0x7444  # the point-to-point tag of the fingerprint's rounds
_GATHER_TAG = 0x7445  # and of the header all-gather's
#: the first int64 of a notice that a peer left: never a header's first int64 (its magic) nor a fingerprint's (a
#: sequence number, never negative), nor the first of an all-gather's slots (a header)
_NOTICE = -0x7444_4C65_6674_4E6F
#: up to this many ranks the full exchange is gloo's own all-gather (a ring of at most 7 hops): its work completes
#: on gloo's thread and is polled, while a point-to-point receive completes only in a blocked ``wait()``, whose sleep
#: and wake-up cost more than the ring's extra hops at this size (measured at W=2 on a 2-core machine: a sync of 16
#: scalar states took 1.48 ms over point-to-point, 1.03 ms over gloo's all-gather)
RING_MAX_RANKS = 8
#: a twin of at most this many ranks connects to every peer when it is made (at most 3 connections per rank): a
#: lazily connecting rank that reaches a call after its peers gave up on it waits for their addresses beyond the
#: group's timeout (measured: a rank 4.5 s late in a group of 4 with a 3 s timeout raised after 16.5 s, against at
#: most twice the timeout when connected beforehand)
EAGER_MAX_RANKS = 4
_ROLL_S = 1.5  # how long the ranks that read of a departure without a rank wait for every survivor to answer


def carries_cpu(pg: Any) -> bool:
    """Whether the backend serving ``pg``'s CPU tensors declares CPU support (``Backend.backend_capability``).

    A backend torch knows by a single name serves the devices it declares; a ``"cpu:x,cuda:y"`` group serves CPU
    tensors with ``x``. A backend whose capability torch does not know is taken to carry CPU tensors, as torch
    itself assumes.
    """
    try:
        config = str(dist.get_backend_config(pg))
    except (RuntimeError, ValueError, AttributeError):  # a group torch's registry does not describe
        config = str(dist.get_backend(pg))
    pairs = [part.split(":", 1) for part in config.lower().split(",")]
    if all(len(p) == 2 for p in pairs):
        names = [name for device, name in pairs if device.strip() == "cpu"]
        if not names:
            return False
    else:
        names = [config.lower()]
    capability = dist.Backend.backend_capability
    return all("cpu" in capability.get(name.strip(), ["cpu", "cuda"]) for name in names)


class Host:
    """How one group's headers travel: over ``channel`` (the group itself, or its gloo twin), as ``rank`` of
    ``size`` ranks. ``twin`` says which; ``store`` is the group's board (see the module docstring)."""

    __slots__ = (
        "_channel",
        "_notices",
        "_scratch",
        "_store",
        "_views",
        "_work",
        "call",
        "gone",
        "rank",
        "size",
        "twin",
    )

    def __init__(self, channel: Callable[[], Any], rank: int, size: int, twin: bool, store: Any = None) -> None:
        self.rank, self.size, self.twin = rank, size, twin
        self._channel = channel  # returns the channel: see make_host
        self._store = store  # the group's board; None: none (a departure is then seen by the partners alone)
        self._scratch: tuple[Any, ...] | None = None  # (scratch tensor, its NumPy view, the buffer, its view)
        self._work: torch.Tensor | None = None  # the all-gather's slots when W is not a power of two
        self._notices: list[Any] = []  # the notices sent (their works are kept until the host ends)
        self._views: dict[int, tuple[torch.Tensor, Any]] = {}  # NumPy byte views of the all-gather's buffers
        self.gone: tuple[int | None, str, str] | None = None  # (rank, call, detail) once a peer left
        self.call = ""  # the call running on the group, set by its header exchange (see _failure.Board)

    @property
    def channel(self) -> Any:
        """The group the headers travel over."""
        return self._channel()

    def partners(self) -> list[int]:
        """The ranks this rank exchanges with in :func:`all_gather` and :func:`max_reduce`."""
        size, rank = self.size, self.rank
        low = 1 << (size.bit_length() - 1)
        if rank >= low:
            return [rank - low]
        mine = [rank ^ (1 << k) for k in range(low.bit_length() - 1)]
        return [*mine, rank + low] if rank + low < size else mine

    # ------------------------------------------------------------------------------------------------ the board
    def post(self, rank: int | None, call: str, detail: str) -> None:
        """Post on the group's board that ``rank`` (``None``: a peer the backend did not name) left during ``call``.
        A named post stands once made (``compare_set`` on an absent key); an unnamed one goes to a key of its own."""
        if self._store is None:
            return
        with contextlib.suppress(Exception):  # the store may be gone with the rank that hosted it: nothing to tell
            self._store.compare_set("left" if rank is not None else "left?", "", f"{rank}\n{call}\n{detail}")

    def read(self) -> tuple[int | None, str, str] | None:
        """What is posted on the board (``(rank, call, detail)``; a named post first), or ``None``."""
        if self._store is None:
            return None
        try:
            for key in ("left", "left?"):
                if self._store.check([key]):
                    rank, call, detail = self._store.get(key).decode("utf-8", "replace").split("\n", 2)
                    return (None if rank == "None" else int(rank)), call, detail
        except Exception:  # a store that cannot answer tells nothing; the backend's timeout remains
            return None
        return None

    def departed(self, peer: int | None, detail: str, *, notice: bool = False) -> PeerLeftError:
        """The error to raise now that a peer left: ``peer``'s connection broke (``detail``: the backend's text)
        or, with ``notice``, a partner's notice arrived (naming ``peer`` when it knew). What the board says wins
        (the first rank that saw the departure posted it); else this rank posts what it saw. Sends the notices at
        once, and marks the host gone."""
        if self.gone is None:
            posted = self.read()
            if posted is None and not notice:
                self.post(peer, self.call, detail)
                posted = self.read()
            posted = posted or (peer, self.call, detail or "a partner's notice; the group's store did not answer")
            self._notify(posted[0])
            if posted[0] is None:  # no rank named: ask who is still here
                posted = self._roll_call(posted)
            self.gone = posted
        return departure(self.gone, self.call, seen=not notice and self.gone[0] == peer)

    def _notify(self, left: int | None) -> None:
        """Send every partner but ``left`` a notice naming ``left`` on both tags (not waited for: the partner may
        be stuck)."""
        notice = torch.tensor([_NOTICE, -1 if left is None else left], dtype=torch.int64)
        channel = self.channel
        for peer in self.partners():
            if peer == left:
                continue
            for tag in (_TAG, _GATHER_TAG):
                with contextlib.suppress(RuntimeError):
                    self._notices.append(channel.send([notice], peer, tag))

    def _roll_call(self, posted: tuple[int | None, str, str]) -> tuple[int | None, str, str]:
        """A departure posted without a rank (the backend's collective did not say whose connection broke): every
        rank that reads it says it is here, and waits up to :data:`_ROLL_S` for every rank but one to say so, or for
        a named post; one rank then reads who answered (``W`` requests to the store, once per group) and posts the
        one that did not as the rank that left; the others wait up to :data:`_ROLL_S` more for that verdict."""
        store = self._store
        try:
            store.set(f"here/{self.rank}", "")
            answered = store.add("here", 1)
            deadline = time.monotonic() + _ROLL_S
            while answered < self.size - 1 and time.monotonic() < deadline and not store.check(["left"]):
                time.sleep(0.02)
                answered = store.add("here", 0)
            if not store.check(["left"]) and store.add("scans", 1) == 1:  # one rank reads the answers (W requests)
                missing = [r for r in range(self.size) if r != self.rank and not store.check([f"here/{r}"])]
                if len(missing) == 1:
                    self.post(missing[0], posted[1], posted[2])
            deadline = time.monotonic() + _ROLL_S
            while not store.check(["left"]) and time.monotonic() < deadline:  # the others wait for its verdict
                time.sleep(0.02)
        except Exception:  # a store that cannot answer: the departure stays unnamed
            return posted
        return self.read() or posted


def make_host(group: Callable[[], Any], rank: int, size: int) -> Host:
    """The :class:`Host` of the process group that ``group()`` returns (of ``size`` ranks, this process being
    ``rank``).

    ``group`` is how the caller holds the group (a weak reference): the user's group must end when torch's
    ``destroy_process_group`` drops it (with its worker threads), not at interpreter exit, where ending a gloo
    backend can abort the process. A twin is the package's own and lives as long as the :class:`Host`.

    The host's keys (its board, a twin's rendezvous) live in the group's store under a prefix numbered by a
    counter there, so that a group made again under a name a destroyed one had (torch may reuse such names) does
    not meet the old keys.
    """
    pg = group()
    store = _group_store(pg)
    if store is not None:  # (a group torch made has one)
        store = dist.PrefixStore(_PREFIX, store)
        generation = (store.add("made", 1) - 1) // size
        store = dist.PrefixStore(f"{generation}/", store)
    if carries_cpu(pg):
        return Host(group, rank, size, twin=False, store=store)
    timeout = group_timeout(pg)
    if size > EAGER_MAX_RANKS:
        twin = _lazy_gloo(store, rank, size, timeout)
    else:
        twin = dist.ProcessGroupGloo(store, rank, size, timeout)
    return Host(lambda: twin, rank, size, twin=True, store=store)


def _lazy_gloo(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    """A gloo backend that connects to a peer at their first message, not to every peer when it is made.

    torch reads ``TORCH_GLOO_LAZY_INIT`` when it makes a gloo backend; it is set for this one only.
    """
    saved = os.environ.get(_LAZY)
    os.environ[_LAZY] = "1"
    try:
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    finally:
        if saved is None:
            del os.environ[_LAZY]
        else:
            os.environ[_LAZY] = saved


_LAZY = "TORCH_GLOO_LAZY_INIT"


def _group_store(pg: Any) -> Any:
    """``pg``'s own store (torch prefixes it with the group's name), where its host's keys live; ``None`` when
    there is none (a backend made without torch's registry)."""
    try:
        store = pg.get_group_store()
    except (AttributeError, RuntimeError):  # an older torch: the default store, prefixed with the group's name
        store = None
    if store is None:
        with contextlib.suppress(AttributeError, RuntimeError, ValueError):
            store = dist.PrefixStore(f"{pg.group_name}/", dist.distributed_c10d._get_default_store())
    return store


def group_timeout(pg: Any) -> datetime.timedelta:
    """The timeout ``pg`` was made with (that of its first backend); torch's default when it does not say."""
    for device in getattr(pg, "_device_types", ()):
        try:
            timeout = pg._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, datetime.timedelta):
            return timeout
    return dist.distributed_c10d.default_pg_timeout


def all_gather(host: Host, out: torch.Tensor, inp: torch.Tensor) -> None:
    """``out[i * n:(i + 1) * n] = inp`` of rank ``i``, for a 1-D CPU ``inp`` of ``n`` bytes (uint8) on every rank.

    Up to :data:`RING_MAX_RANKS` ranks, gloo's own all-gather. Beyond, log-depth, over point-to-point messages with
    the partners of :func:`max_reduce`: recursive doubling over the largest power of two ``L <= W`` ranks, each
    holding a *slot* of its own block and, when ``W > L``, the block of rank ``r + L`` (handed over first); round
    ``k`` swaps the ``2^k`` slots a rank holds with those of rank ``r XOR 2^k``; the ranks beyond ``L`` get the
    whole table back at the end. ``log2 L`` rounds (two more when ``W`` is not a power of two) where gloo's ring
    takes ``W - 1``; every rank receives the same ``(W - 1) n`` bytes.
    """
    size, rank = host.size, host.rank
    n = inp.numel()
    low = 1 << (size.bit_length() - 1)
    _check(host)
    peer = -1
    try:
        if size <= RING_MAX_RANKS:  # gloo's own all-gather: its work can be polled (see RING_MAX_RANKS)
            wait(host.channel._allgather_base(out, inp), inp, host)
            return
        if rank >= low:  # an extra rank: its partner holds its block and sends the whole table back
            peer = rank - low
            _swap(host, inp, out, peer, _GATHER_TAG, _bytes(host, out), 0)
            return
        extra = size > low
        slot = 2 * n if extra else n
        work = _work(host, low * slot) if extra else out
        seen = _bytes(host, work)
        mine = work[rank * slot : (rank + 1) * slot]
        mine[:n].copy_(inp)
        if extra and rank + low < size:
            peer = rank + low
            _recv(host, mine[n:], peer, _GATHER_TAG)
            _received(seen, rank * slot + n)
        mask = 1
        while mask < low:
            peer = rank ^ mask
            base, theirs = (rank & ~(mask - 1)) * slot, (peer & ~(mask - 1)) * slot
            incoming = work[theirs : theirs + mask * slot]
            _swap(host, work[base : base + mask * slot], incoming, peer, _GATHER_TAG, seen, theirs)
            mask <<= 1
        if extra:  # rank i's block is in slot i, rank i + L's beside it
            pairs = work.view(low, 2, n)
            out.view(size, n)[:low].copy_(pairs[:, 0])
            out.view(size, n)[low:].copy_(pairs[: size - low, 1])
            if rank + low < size:
                peer = rank + low
                _send(host, out, peer, _GATHER_TAG)
    except RuntimeError as err:
        raise _failed(host, "all_gather", err, peer) from err


def _bytes(host: Host, buf: torch.Tensor) -> Any:
    """A NumPy view of ``buf``'s bytes, made once per buffer (the exchanges' buffers are kept by their callers)."""
    hit = host._views.get(id(buf))
    if hit is None or hit[0] is not buf:
        if len(host._views) >= 8:
            host._views.clear()
        hit = host._views[id(buf)] = (buf, buf.numpy())
    return hit[1]


def _work(host: Host, numel: int) -> torch.Tensor:
    """The all-gather's slot buffer when ``W`` is not a power of two, kept on the host for the next exchange."""
    work = host._work
    if work is None or work.numel() != numel:
        work = host._work = torch.zeros(numel, dtype=torch.uint8)
    return work


def max_reduce(host: Host, buf: torch.Tensor) -> None:
    """In place: ``buf`` (1-D CPU int64, the same size on every rank) becomes the elementwise maximum over the ranks.

    Recursive doubling over point-to-point exchanges: ``floor(log2 W)`` rounds in which rank ``r`` swaps its
    partial maximum with rank ``r XOR 2^k``; the ``W - 2^k`` ranks beyond the largest power of two first hand
    theirs to a partner and get the result back at the end. Every rank ends with the same values.
    """
    size, rank = host.size, host.rank
    scratch = host._scratch
    if scratch is None or scratch[0].shape != buf.shape or scratch[2] is not buf:
        # NumPy views made once per buffer (NumPy's maximum of a few ints costs less than torch's)
        other = torch.empty_like(buf)
        scratch = host._scratch = (other, other.numpy(), buf, buf.numpy())
    theirs, mine = scratch[1], scratch[3]
    scratch = scratch[0]
    low = 1 << (size.bit_length() - 1)  # the largest power of two <= size
    _check(host)
    peer = -1  # the partner of the exchange under way (named when its connection breaks)
    try:
        if rank >= low:  # an extra rank: its partner folds it in, then sends the result back
            peer = rank - low
            _swap(host, buf, scratch, peer, _TAG, theirs, 0)  # (receiving at once: a notice can end the wait)
            mine[:] = theirs
            return
        if rank + low < size:
            peer = rank + low
            _recv(host, scratch, peer)
            _received(theirs, 0)
            np.maximum(mine, theirs, out=mine)
        mask = 1
        while mask < low:
            peer = rank ^ mask
            _swap(host, buf, scratch, peer, _TAG, theirs, 0)
            np.maximum(mine, theirs, out=mine)
            mask <<= 1
        if rank + low < size:
            peer = rank + low
            _send(host, buf, peer)
    except RuntimeError as err:
        raise _failed(host, "fingerprint exchange", err, peer) from err


class _Notice(RuntimeError):
    """A partner's notice that a peer left (``left``: its rank, ``None`` when the partner did not know it) arrived
    instead of its data."""

    def __init__(self, left: int | None) -> None:
        super().__init__("a partner's notice that a peer left")
        self.left = left


def _check(host: Host) -> None:
    """Raise at once when a peer of the host already left (its partners may be gone: nothing would answer)."""
    if host.gone is not None:
        raise host.departed(None, "", notice=True)


def _failed(host: Host, op: str, err: RuntimeError, peer: int) -> RuntimeError:
    """The error for ``err`` in exchange ``op`` with partner ``peer``: a departure (a broken connection, a notice)
    is posted, told to the partners and named; anything else (a timeout) is the backend's error."""
    if isinstance(err, _Notice):
        return host.departed(err.left, "", notice=True)
    if is_departure(err):
        return host.departed(peer if peer >= 0 else None, str(err).strip())
    return backend_error(op, err, peer if peer >= 0 else None, host)


def _received(view: Any, offset: int) -> None:
    """Raise :class:`_Notice` when what arrived at ``offset`` of ``view`` (a NumPy view: int64, or bytes) is a
    partner's notice, not data."""
    ints = view[offset : offset + 2] if view.dtype == np.int64 else view[offset : offset + 16].view(np.int64)
    if ints[0] == _NOTICE:
        raise _Notice(None if ints[1] < 0 else int(ints[1]))


def _swap(
    host: Host, outgoing: torch.Tensor, incoming: torch.Tensor, peer: int, tag: int, view: Any, offset: int
) -> None:
    """Send ``outgoing`` to ``peer`` and receive ``incoming`` from it (at ``offset`` of ``view``, a NumPy view of
    its buffer). Waited for without polling: a gloo point-to-point work completes only inside ``wait()``. A send
    completes once the peer posted its receive: after a notice it is not waited for (the peer will not)."""
    channel = host.channel
    sent = channel.send([outgoing], peer, tag)
    channel.recv([incoming], peer, tag).wait()
    _received(view, offset)
    sent.wait()


def _send(host: Host, buf: torch.Tensor, peer: int, tag: int = _TAG) -> None:
    host.channel.send([buf], peer, tag).wait()


def _recv(host: Host, buf: torch.Tensor, peer: int, tag: int = _TAG) -> None:
    host.channel.recv([buf], peer, tag).wait()
