"""Neighbour exchange around the ranks of a group, and the ring schedule the ring losses run on
(:ref:`architecture-strategies`).

A :class:`Ring` sends to group rank ``r + 1`` and receives from ``r - 1`` with asynchronous point-to-point
operations, so a transfer overlaps whatever the caller computes before it waits. Each exchange posts its sends
and receives as one batch (``torch.distributed.batch_isend_irecv``): on NCCL that is one grouped launch, in which
a rank's send to the next rank and its receive from the previous one progress together (posted one by one, every
rank's send could wait for a receive that its neighbour has not posted yet, all around the ring); a backend
without grouped launches (gloo) gets the same sends and receives, in list order.

:func:`circulate` walks every rank's block around the ring once: at step ``k`` rank ``r`` holds the block of rank
``(r - k) mod W``, starts passing it on (and receiving the next one), visits it, and, when the visit produces a
per-block accumulator (a gradient, column statistics), combines it with the accumulator that came with the block
and sends the result on, so that after ``W`` steps the accumulator of each block is complete and back with its
owner.

Every rank issues the same sequence of exchanges whatever its data: sizes come from the caller (each rank's
block shapes, exchanged once beforehand). A zero-size tensor is left out of the batch on both sides, which both
know its size; an exchange with nothing left posts nothing. The first exchange on a group must come after a
collective on it (the ring losses' shape exchange is one): NCCL creates a batch's communicator with every rank
of the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, overload

import torch
import torch.distributed as dist
from torch import Tensor

from torchmetrics_diff.distributed._backend import Group, board_of, group_rank, group_size
from torchmetrics_diff.distributed._failure import backend_error

_BLOCK_TAG, _ACC_TAG = 17, 18  # blocks and accumulators are matched in their own order


class _Pending:
    """Posted sends and receives; :meth:`wait` returns the received tensors."""

    def __init__(self, works: list, received: list[Tensor], keep: Sequence[Tensor], group: Group) -> None:
        self._works, self._received, self._keep, self._group = works, received, keep, group

    def wait(self) -> list[Tensor]:
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as err:
            raise backend_error("ring exchange", err, None, board_of(self._group)) from err
        self._works, self._keep = [], ()
        return self._received


class Ring:
    """The ranks of ``group`` in a ring: this rank sends to the next and receives from the previous.

    Example:
        >>> ring = Ring()  # not distributed: a ring of one
        >>> ring.size, ring.rank
        (1, 0)
    """

    def __init__(self, group: Group = None) -> None:
        self.group, self.size, self.rank = group, group_size(group), group_rank(group)
        nxt, prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        if self.size > 1 and group is not None:
            nxt, prev = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prev)
        self._next, self._prev = nxt, prev

    def exchange(self, sends: Sequence[Tensor], receives: Sequence[Tensor], tag: int = _BLOCK_TAG) -> _Pending:
        """Post ``sends`` to the next rank and ``receives`` (pre-allocated, filled in place) from the previous, as
        one batch of point-to-point operations; the receiver's ``receives`` match the sender's ``sends`` in order
        and size. Zero-size tensors are not posted (their peer leaves them out too)."""
        ops = [dist.P2POp(dist.isend, t, self._next, self.group, tag) for t in sends if t.numel()]
        ops += [dist.P2POp(dist.irecv, t, self._prev, self.group, tag) for t in receives if t.numel()]
        try:
            works = [w for w in dist.batch_isend_irecv(ops) if w is not None] if ops else []
        except RuntimeError as err:
            raise backend_error("ring exchange", err, None, board_of(self.group)) from err
        return _Pending(works, list(receives), sends, self.group)


@overload
def circulate(
    ring: Ring,
    own: Sequence[Tensor],
    empty_block: Callable[[int], list[Tensor]],
    visit: Callable[[int, list[Tensor]], Tensor | None],
    empty_acc: Callable[[int], Tensor],
    combine: Callable[[Tensor, Tensor], Tensor] = ...,
) -> Tensor: ...
@overload
def circulate(
    ring: Ring,
    own: Sequence[Tensor],
    empty_block: Callable[[int], list[Tensor]],
    visit: Callable[[int, list[Tensor]], Tensor | None],
    empty_acc: None = None,
    combine: Callable[[Tensor, Tensor], Tensor] = ...,
) -> Tensor | None: ...
def circulate(
    ring: Ring,
    own: Sequence[Tensor],
    empty_block: Callable[[int], list[Tensor]],
    visit: Callable[[int, list[Tensor]], Tensor | None],
    empty_acc: Callable[[int], Tensor] | None = None,
    combine: Callable[[Tensor, Tensor], Tensor] = torch.add,
) -> Tensor | None:
    """Visit every rank's block once, in ring order (this rank's own first); return its own accumulator.

    Args:
        ring: the ring of the group.
        own: this rank's block, a list of contiguous tensors (read-only while it travels).
        empty_block: ``empty_block(owner)`` allocates the receive buffers of rank ``owner``'s block.
        visit: ``visit(owner, block) -> part``: the work on rank ``owner``'s block; ``part`` is this rank's
            contribution to that block's accumulator, or ``None`` when there is none (then ``empty_acc`` is
            ``None`` too and nothing but blocks travels).
        empty_acc: ``empty_acc(owner)`` allocates the receive buffer of rank ``owner``'s accumulator.
        combine: ``combine(incoming, part)``: folds this rank's part into the accumulator that arrived with the
            block (it may work in place on ``incoming``).

    Returns:
        The combination of every rank's part for this rank's block (``None`` without accumulators).

    The block of step ``k + 1`` is received while step ``k`` is visited; the accumulator of step ``k`` is
    sent on once this rank's part is folded in, and received by the next rank while it visits that block.
    A rank holds at most two blocks (the visited one and the incoming one) and three accumulators.
    """
    world, rank = ring.size, ring.rank
    held: list[Tensor] = list(own)
    acc_in: _Pending | None = None  # the accumulator travelling with the held block (and the previous send)
    for step in range(world):
        owner = (rank - step) % world
        incoming = ring.exchange(held, empty_block((owner - 1) % world)) if step < world - 1 else None
        part = visit(owner, held)
        if part is not None and world > 1:
            if acc_in is not None:  # waits for the previous step's send as well
                part = combine(acc_in.wait()[0], part)
            assert empty_acc is not None
            # the next owner's accumulator arrives from the previous rank; after the last step, this rank's own
            acc_in = ring.exchange([part.contiguous()], [empty_acc((owner - 1) % world)], tag=_ACC_TAG)
        elif part is not None:
            return part
        if incoming is not None:
            held = incoming.wait()
    if acc_in is None:
        return None
    return acc_in.wait()[0]
