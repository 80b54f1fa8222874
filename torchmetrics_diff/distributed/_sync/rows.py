"""The byte rows a sync all-gathers: their layout rule, the reused buffers, the padded gather of a blob, and the
autograd functions that give a rank's own slot of a gathered table its gradient.

A row is a header followed by pieces, each starting at a multiple of 16 bytes so that any dtype can be viewed in
place. Every rank sends a row of the same size; the gathered ``(W, row_bytes)`` table is read through views.
Knows bytes and tensors, not states or plans.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_diff.distributed._backend import Group, _default_group, all_gather_flat
from torchmetrics_diff.distributed._groups import state_of

HEADER = 16  # bytes: int64 plan key (0: none), int64 metadata length; every rank's sizes follow


def align(n: int) -> int:
    """Pieces start at multiples of 16 bytes: every dtype (complex128 included) can be viewed in place."""
    return (n + 15) // 16 * 16


def oversized(capacity: int, units: int) -> bool:
    """Whether a state's room in the row is far larger than the most any rank sent: shrink it."""
    return capacity > 4 * units + 64


def layout(header_bytes: int, caps: list[int], min_row: int = 0) -> tuple[list[tuple[int, int]], int]:
    """Where each piece of ``caps[i]`` bytes starts after a ``header_bytes`` header, and the row's size.

    The one place of the layout rule: returns ``[(offset, cap)]`` and the row size (at least ``min_row`` and 16:
    never a zero-byte collective).
    """
    offset, slots = align(header_bytes), []
    for cap in caps:
        slots.append((offset, cap))
        offset += align(cap)
    return slots, max(offset, min_row, 16)


def buffer_pair(group: Group, device: torch.device, row_bytes: int, slot: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole (send, receive) buffers of ``slot`` on ``device``, kept in the group's state (released with the
    group), grown to hold a row of ``row_bytes`` if needed.

    The same objects come back until a larger row grows them, so views of them can be kept (see ``layout``): a
    sync allocates nothing on its hot path. Safe because every value a sync returns is a fresh tensor computed
    from the table (a reduction, a concatenation, a stack or a clone), never a view of it, and a rank runs one
    sync at a time.
    """
    state = state_of(_default_group() if group is None else group)
    row, table = state.rows.get((device, slot), (None, None))
    if row is None or table is None or row.numel() < row_bytes or table.numel() < state.size * row_bytes:
        row = torch.empty(row_bytes, dtype=torch.uint8, device=device)
        table = torch.empty(state.size * row_bytes, dtype=torch.uint8, device=device)
        state.rows[(device, slot)] = (row, table)
    return row, table


def gather_blob(blob: bytes, row_bytes: int, group: Group, world: int, device: torch.device) -> Any:
    """Every rank's ``blob`` (at most ``row_bytes`` long, padded to it), gathered in one collective and read back
    (the metadata of an agreement: a host read, once): a ``(world, row_bytes)`` NumPy array of bytes."""
    send, table = buffer_pair(group, device, row_bytes, "meta")
    send, table = send[:row_bytes], table[: world * row_bytes]
    send.zero_()
    if blob:
        send[: len(blob)].copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    all_gather_flat(table, send, group)
    return table.cpu().numpy().reshape(world, row_bytes)


class OwnRow(torch.autograd.Function):
    """A gathered ``(W, ...)`` table as a fresh tensor whose row ``rank`` carries the gradient to ``own`` (this
    rank's input, the first elements of its row): the other rows are constants, the backward communicates nothing."""

    @staticmethod
    def forward(ctx: Any, own: torch.Tensor, table: torch.Tensor, rank: int) -> torch.Tensor:
        ctx.rank, ctx.shape = rank, own.shape
        return table.clone()  # (the buffer is the next sync's)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return grad[ctx.rank].reshape(-1)[: ctx.shape.numel()].reshape(ctx.shape), None, None


class Attached(torch.autograd.Function):
    """``value`` (a reduction of every rank's ``own``, computed elsewhere) whose gradient reaches ``own`` times
    ``scale``: the local gradient of an all-reduced sum (1) or mean (``1 / W``)."""

    @staticmethod
    def forward(ctx: Any, own: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return value

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return grad * ctx.scale if ctx.scale != 1 else grad, None, None


class CatRows:
    """Every rank's rows of one cat state in the ``(W, capacity, *dims)`` table, rank by rank: a pair of index
    tensors (rank, row) made once per cut on the host and moved to the table's device without waiting, so that
    reading them is one indexing operation (no host round trip, nothing per rank)."""

    __slots__ = ("cat", "rank_index", "row_index", "total")

    def __init__(self, cat: Any, rows: list[int]) -> None:
        counts = torch.tensor(rows, dtype=torch.int64)
        self.cat, self.total = cat, int(counts.sum())
        ranks = torch.repeat_interleave(torch.arange(len(rows)), counts)
        starts = torch.cumsum(counts, 0) - counts
        device = cat.recv.device
        self.rank_index = ranks.to(device, non_blocking=True)
        self.row_index = (torch.arange(self.total) - torch.repeat_interleave(starts, counts)).to(
            device, non_blocking=True
        )

    def pick(self, table: torch.Tensor) -> torch.Tensor:
        """The rows of every rank, concatenated in rank order, from ``table`` (the state's ``(W, capacity, ...)``)."""
        return table[self.rank_index, self.row_index]
