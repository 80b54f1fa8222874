"""The host group of a process group: where the package's call headers travel, host to host, never waiting for a GPU.

A call header (:mod:`._call`) is a few hundred bytes of host values. It travels as a CPU tensor, so it needs a
group whose backend carries CPU tensors:

- the group itself when the backend that serves its CPU tensors declares CPU support (gloo, MPI, UCC, a
  ``"cpu:gloo,cuda:nccl"`` pair, any backend registered with ``devices`` including ``"cpu"``): no second group;
- else (NCCL alone, or any CUDA-only backend) a *twin*: a gloo backend over the same ranks, made directly on a
  store prefixed inside the group's own store. Its name is therefore the parent's on every member, whatever
  other groups exist or were made first (``torch.distributed.new_group`` names groups from a process-wide count
  or from how many groups the process knows, which differ between ranks that belong to different groups — the
  twin never goes through it). It waits as long as the parent group's timeout before raising.

Making a twin is a rendezvous of the group's members only (on the group's own store), at the first call on the
group, which every member reaches: safe at any moment relative to the user's own ``new_group`` or
``DeviceMesh`` calls.

:func:`all_gather` and :func:`max_reduce` are the two exchanges a header needs: every rank's header (the full
exchange), or the elementwise maximum of a fixed-size fingerprint in ``ceil(log2 W)`` rounds of pairwise
exchanges (recursive doubling; two rounds more when ``W`` is not a power of two), whose latency does not grow
like gloo's own ring collectives (``W - 1`` hops for an all-gather, ``2(W - 1)`` for an all-reduce).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from torchmetrics_diff.distributed._backend import _wait as wait
from torchmetrics_diff.distributed._failure import backend_error

_PREFIX = "torchmetrics_diff/host/"
_TAG = 0x7444  # the point-to-point tag of the fingerprint's rounds


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
    ``size`` ranks. ``twin`` says which."""

    __slots__ = ("_channel", "_scratch", "rank", "size", "twin")

    def __init__(self, channel: Callable[[], Any], rank: int, size: int, twin: bool) -> None:
        self.rank, self.size, self.twin = rank, size, twin
        self._channel = channel  # returns the channel: see make_host
        self._scratch: tuple[Any, ...] | None = None  # (scratch tensor, its NumPy view, the buffer, its view)

    @property
    def channel(self) -> Any:
        """The group the headers travel over."""
        return self._channel()


def make_host(group: Callable[[], Any], rank: int, size: int) -> Host:
    """The :class:`Host` of the process group that ``group()`` returns (of ``size`` ranks, this process being
    ``rank``).

    ``group`` is how the caller holds the group (a weak reference): the user's group must end when torch's
    ``destroy_process_group`` drops it (with its worker threads), not at interpreter exit, where ending a gloo
    backend can abort the process. A twin is the package's own and lives as long as the :class:`Host`.
    """
    pg = group()
    if carries_cpu(pg):
        return Host(group, rank, size, twin=False)
    twin = _twin(pg, rank, size)
    return Host(lambda: twin, rank, size, twin=True)


def _twin(pg: Any, rank: int, size: int) -> Any:
    """A gloo backend over ``pg``'s ranks, on a store prefixed inside ``pg``'s own, with ``pg``'s timeout.

    A counter in that store numbers the twins made for the group's store, so that a group made again under a
    name a destroyed one had (torch may reuse such names) does not meet the old twin's rendezvous keys.
    """
    try:
        base = pg.get_group_store()
    except (AttributeError, RuntimeError):  # an older torch or a group without its own store: the default one
        base = dist.PrefixStore(f"{pg.group_name}/", dist.distributed_c10d._get_default_store())
    store = dist.PrefixStore(_PREFIX, base)
    generation = (store.add("made", 1) - 1) // size
    return dist.ProcessGroupGloo(dist.PrefixStore(f"{generation}/", store), rank, size, group_timeout(pg))


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
    """``out[i * n:(i + 1) * n] = inp`` of rank ``i``, for a 1-D CPU ``inp`` of ``n`` elements on every rank."""
    try:
        wait(host.channel._allgather_base(out, inp), inp)
    except RuntimeError as err:
        raise backend_error("all_gather", err) from err


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
    peer = -1  # the partner of the exchange under way (named when its connection breaks)
    try:
        if rank >= low:  # an extra rank: its partner folds it in, then sends the result back
            peer = rank - low
            _send(host, buf, peer)
            _recv(host, buf, peer)
            return
        if rank + low < size:
            peer = rank + low
            _recv(host, scratch, peer)
            np.maximum(mine, theirs, out=mine)
        mask, send, recv, outgoing, incoming = 1, host.channel.send, host.channel.recv, [buf], [scratch]
        while mask < low:
            peer = rank ^ mask
            sent = send(outgoing, peer, _TAG)
            wait(recv(incoming, peer, _TAG), scratch)  # (polled: a blocked wait costs a sleep and a wake)
            sent.wait()  # (a few bytes: out of this process as soon as the peer's bytes are in)
            np.maximum(mine, theirs, out=mine)
            mask <<= 1
        if rank + low < size:
            peer = rank + low
            _send(host, buf, peer)
    except RuntimeError as err:
        raise backend_error("fingerprint exchange", err, peer if peer >= 0 else None) from err


def _send(host: Host, buf: torch.Tensor, peer: int) -> None:
    wait(host.channel.send([buf], peer, _TAG), buf)


def _recv(host: Host, buf: torch.Tensor, peer: int) -> None:
    wait(host.channel.recv([buf], peer, _TAG), buf)
