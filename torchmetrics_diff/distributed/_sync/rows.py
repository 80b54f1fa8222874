"""The byte rows a sync all-gathers: their layout, the reused buffers, and the gather itself (with autograd).

A row is a header followed by pieces, each starting at a multiple of 16 bytes so that any dtype can be viewed in
place. Every rank sends a row of the same size; the gathered ``(W, row_bytes)`` table is read through views.
Knows bytes and tensors, not states or plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from torchmetrics_diff.distributed._backend import Group, all_gather_flat

HEADER = 16  # bytes: int64 signature hash (or the failure marker), int64 metadata length (-1: not sent)


def align(n: int) -> int:
    """Pieces start at multiples of 16 bytes: every dtype (complex128 included) can be viewed in place."""
    return (n + 15) // 16 * 16


def oversized(capacity: int, rows: int) -> bool:
    """Whether a cat state's capacity in the row is far larger than the most rows any rank sent: shrink it."""
    return capacity > 4 * rows + 64


def layout(header_bytes: int, caps: list[int], min_row: int = 0) -> tuple[list[tuple[int, int]], int]:
    """Where each piece of ``caps[i]`` bytes starts after a ``header_bytes`` header, and the row's size.

    The one place of the layout rule, shared by every writer and reader of a row: returns ``[(offset, cap)]``
    and the row size (at least ``min_row`` and 16: never a zero-byte collective).
    """
    offset, slots = align(header_bytes), []
    for cap in caps:
        slots.append((offset, cap))
        offset += align(cap)
    return slots, max(offset, min_row, 16)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a flat uint8 tensor (a view when ``t`` is dense with unit stride, else a copy)."""
    flat = t.detach().reshape(-1)
    if flat.stride(0) != 1:  # a 0- or 1-element slice counts as contiguous with any stride (clone keeps it)
        flat = flat.new_empty(flat.shape).copy_(flat)
    return flat.view(torch.uint8)


_ZEROS: dict[torch.device, torch.Tensor] = {}


def _zeros(n: int, device: torch.device) -> torch.Tensor:
    """``n`` zero bytes, sliced from a cached buffer (padding must not cost an allocation per piece)."""
    buf = _ZEROS.get(device)
    if buf is None or buf.numel() < n:
        buf = _ZEROS[device] = torch.zeros(max(n, 4096), dtype=torch.uint8, device=device)
    return buf[:n]


@dataclass
class _RowJob:
    """One byte all-gather: where each tensor goes in the row, and (after it ran) the gathered table."""

    group: Group
    rank: int
    world: int
    row_bytes: int
    slots: list  # (offset, capacity in bytes) per tensor
    slot: str = "a"  # which reusable buffer pair: rounds of one sync must not share one
    table: torch.Tensor | None = None
    via: Any = None  # gathers the row itself (the call's header exchange, inline): row -> (W, row_bytes) table

    def run(self, header: torch.Tensor, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        device, pieces, pos = header.device, [header], header.numel()
        for t, (offset, _cap) in zip(tensors, self.slots):
            raw = _bytes_of(t)
            if offset > pos:
                pieces.append(_zeros(offset - pos, device))
            pieces.append(raw)
            pos = offset + raw.numel()
        if self.row_bytes > pos:
            pieces.append(_zeros(self.row_bytes - pos, device))
        if self.via is not None:
            self.table = self.via(pieces, self.row_bytes)
        else:
            row, table = _buffers(device, self.row_bytes, self.world, self.slot)
            torch.cat(pieces, out=row)
            all_gather_flat(table, row, self.group)
            self.table = table.view(self.world, self.row_bytes)
        return tuple(
            self.table[:, off : off + cap].view(t.dtype) if cap else t.new_empty((self.world, 0))
            for t, (off, cap) in zip(tensors, self.slots)
        )


# Reused send/receive buffers, one pair per device: a sync allocates nothing on its hot path. Safe because every
# value a sync returns is a fresh tensor computed from the table (a reduction, a concatenation, a stack or a
# clone), never a view of it, and a rank runs one sync at a time.
# Rounds A and B of one sync use different buffers (A's results are read after B).
_BUFFERS: dict[tuple[torch.device, str], tuple[torch.Tensor, torch.Tensor]] = {}


def buffer_pair(device: torch.device, row_bytes: int, world: int, slot: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole cached (send, receive) buffers of ``slot``, grown to hold a row of ``row_bytes`` if needed.

    The same objects come back until a larger row grows them, so views of them can be kept (see ``steady``).
    """
    row, table = _BUFFERS.get((device, slot), (None, None))
    if row is None or table is None or row.numel() < row_bytes or table.numel() < world * row_bytes:
        row = torch.empty(row_bytes, dtype=torch.uint8, device=device)
        table = torch.empty(world * row_bytes, dtype=torch.uint8, device=device)
        _BUFFERS[(device, slot)] = (row, table)
    return row, table


def _buffers(device: torch.device, row_bytes: int, world: int, slot: str) -> tuple[torch.Tensor, torch.Tensor]:
    row, table = buffer_pair(device, row_bytes, world, slot)
    return row[:row_bytes], table[: world * row_bytes]


class _GatherRows(torch.autograd.Function):
    """:meth:`_RowJob.run` with autograd: backward gives each input the gradient of its own rank's row."""

    @staticmethod
    def forward(ctx: Any, job: _RowJob, header: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rank, ctx.shapes = job.rank, [t.shape for t in tensors]
        # copies: autograd may keep these (amax saves its input) past the next sync, which reuses the buffer
        outs = tuple(o.clone() for o in job.run(header, tensors))
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        local = [
            None if g is None else g[ctx.rank, : shape.numel()].reshape(shape) for g, shape in zip(grads, ctx.shapes)
        ]
        return (None, None, *local)


def gather_rows(
    header: torch.Tensor,
    tensors: list[torch.Tensor],
    caps: list[int],
    group: Group,
    rank: int,
    world: int,
    min_row: int = 0,
    slot: str = "a",
    via: Any = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """All-gather ``header`` and ``tensors`` (tensor ``i`` padded to ``caps[i]`` bytes) in one row per rank.

    Returns the gathered ``(W, row_bytes)`` byte table and, per tensor, a ``(W, caps[i] / itemsize)`` view of
    every rank's copy. Autograd is involved only when a tensor requires gradient. ``via(pieces, row_bytes)``, when
    given, writes the row's pieces where it wants and gathers them itself, returning the ``(W, row_bytes)`` table.
    """
    slots, row_bytes = layout(header.numel(), caps, min_row)
    job = _RowJob(group, rank, world, row_bytes, slots, slot, via=via)
    if any(t.requires_grad for t in tensors):
        outs = _GatherRows.apply(job, header, *tensors)
    else:
        outs = job.run(header, tuple(tensors))
    return cast(torch.Tensor, job.table), list(outs)  # (set by the gather)
