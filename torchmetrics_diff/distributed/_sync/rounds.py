"""The round protocol of the general engine: round A, the fallback that agrees on a new plan, round B.

:class:`Rounds` is one sync as a short sequence of rounds; every rank walks the same sequence, decided from data
every rank holds (the gathered headers), so no rank waits in a collective the others skip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._autograd import AllReduce
from torchmetrics_diff.distributed._backend import Group, dtype_from_code
from torchmetrics_diff.distributed._call import PAYLOAD
from torchmetrics_diff.distributed._failure import (
    CollectiveError,
    collective_failed,
    failed_ranks,
    peers_failed,
)
from torchmetrics_diff.distributed._reductions import CAT
from torchmetrics_diff.distributed._sync.agreement import check_agreement
from torchmetrics_diff.distributed._sync.plan import (
    GATHER,
    UNKNOWN_DTYPE,
    Bucket,
    Entry,
    StateSignature,
    SyncPlan,
    make_plan,
    resize_capacities,
)
from torchmetrics_diff.distributed._sync.rows import HEADER, align, gather_rows


def int_bytes(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as int64, viewed as the bytes of a header."""
    return torch.tensor(values, dtype=torch.int64).view(torch.uint8).to(device)


class Rounds:
    """One sync of the general engine over ``entries`` (this rank's states), updating ``plan`` in place."""

    def __init__(
        self,
        entries: list[Entry],
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
        self._variable: list[int] | None = None

    def _rows(
        self, header: torch.Tensor, tensors: list, caps: list, min_row: int = 0, slot: str = "a", via: Any = None
    ) -> tuple:
        with self._naming_failures():
            return gather_rows(header, tensors, caps, self.group, self.rank, self.world, min_row, slot, via)

    @contextmanager
    def _naming_failures(self) -> Iterator[None]:
        try:
            yield
        except CollectiveError as err:
            raise collective_failed(err, self.owner, [e.name for e in self.entries], self.world) from err

    def _empty(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return torch.zeros(0, dtype=dtype, device=self.device)

    def _flat(self, bucket: Bucket) -> torch.Tensor:
        return torch.cat([cast(torch.Tensor, self.by_name[n].tensor).reshape(-1) for n in bucket.names])

    def variable(self) -> list[int]:
        """This rank's sizes the plan lists (cat rows, gathered shapes), computed once per sync: the call header's
        payload and round A's header carry the same ints."""
        if self._variable is None:
            self._variable = [v for e in self.entries for v in e.variable()]
        return self._variable

    def head_ints(self, local_hash: int) -> list[int] | None:
        """Round A's header as ints, for the call's header exchange (every rank then knows every rank's before
        round A, and nothing is read back from the table); ``None`` without a plan or when it would not fit."""
        plan = self.plan
        if plan.signature_hash == 0:
            return None
        fits = local_hash == plan.signature_hash
        variable = self.variable() if fits else [0] * plan.n_variable
        ints = [local_hash, -1, *variable]
        return ints if len(ints) < PAYLOAD else None

    def run(
        self, local_hash: int, local_sig: list[StateSignature], heads: list[list[int]] | None = None
    ) -> dict[str, Any]:
        """Round A, then :meth:`after_round_a` (with every rank's :meth:`head_ints` when the caller has them)."""
        return cast("dict[str, Any]", self._run(local_hash, local_sig, heads))  # (None only with `via`)

    def run_inline(self, local_hash: int, local_sig: list[StateSignature], via: Any) -> dict[str, Any] | None:
        """Round A carried by the call's header exchange: ``via(row)`` writes this rank's row into the exchange's
        inline area, runs the exchange and returns every rank's header payload (``heads``) and the gathered rows;
        ``None`` when a rank did not send a round A row this way (the caller then runs :meth:`run`)."""
        return self._run(local_hash, local_sig, None, via)

    def _run(
        self, local_hash: int, local_sig: list[StateSignature], heads: list[list[int]] | None, via: Any = None
    ) -> dict[str, Any] | None:
        plan, device = self.plan, self.device
        variable = self.variable()
        fits = local_hash == plan.signature_hash

        # Round A: the metadata itself (no plan yet), or the plan's sizes, reduction buckets and cat rows.
        gathered: dict[str, torch.Tensor] = {}
        if plan.signature_hash == 0:
            meta = self._meta(local_sig, variable)
            inline = meta if meta.numel() <= plan.row_bytes - HEADER else meta[:0]
            table, _ = self._rows(
                torch.cat([int_bytes([local_hash, meta.numel()], device), inline]), [], [], min_row=plan.row_bytes
            )
        else:
            header = int_bytes([local_hash, -1] + (variable if fits else [0] * plan.n_variable), device)
            tensors = [self._flat(b) if fits else self._empty() for b in plan.buckets]
            for name, rows in plan.capacity.items():
                t = self.by_name[name].tensor if fits else None
                tensors.append(t if t is not None and t.shape[0] <= rows else self._empty())
            table, outs = self._rows(header, tensors, plan.caps(), min_row=plan.row_bytes, via=via)
            gathered = dict(zip(plan.pieces(), outs))
            if via is not None:
                heads = via.heads
                if heads is None:  # not every rank sent its row inline: their rows are not in this table
                    return None
        return self.after_round_a(table, gathered, local_sig, heads)

    def after_round_a(
        self,
        table: torch.Tensor,
        gathered: dict[str, torch.Tensor],
        local_sig: list[StateSignature],
        heads: list[list[int]] | None = None,
    ) -> dict[str, Any]:
        """Everything after round A, from its ``(W, row_bytes)`` table and the pieces it carried (by name); the
        headers come from ``heads`` (every rank's :meth:`head_ints`) when given, else from the table."""
        plan, device = self.plan, self.device
        memo = plan.sizes_memo
        if heads is not None and memo is not None and memo[0] is heads and memo[1] == plan.signature_hash:
            return self._finish(plan, memo[2], gathered)  # the headers of an earlier sync, agreed again
        if heads is not None:
            hashes = [h[0] for h in heads]
        else:
            hashes = table[:, :HEADER].contiguous().view(torch.int64)[:, 0].tolist()
        failed = failed_ranks(hashes)
        if failed:
            raise peers_failed(self.owner, failed, sync=True)

        if plan.signature_hash != 0 and all(h == plan.signature_hash for h in hashes):
            n = plan.n_variable
            if heads is not None:
                sizes = [h[2 : 2 + n] for h in heads]
                plan.sizes_memo = (heads, plan.signature_hash, sizes)
            else:
                sizes = (
                    table[:, HEADER : HEADER + 8 * n].contiguous().view(torch.int64).tolist()
                    if n
                    else [[]] * self.world
                )
            return self._finish(plan, sizes, gathered)

        # Fallback: agree on a new plan from everyone's metadata.
        if plan.signature_hash == 0 and max(table[:, 8:16].contiguous().view(torch.int64)[:, 0].tolist()) <= (
            plan.row_bytes - HEADER
        ):
            lens = table[:, 8:16].contiguous().view(torch.int64)[:, 0].tolist()
            raw = [bytes(table[r, HEADER : HEADER + lens[r]].tolist()) for r in range(self.world)]
        else:
            meta = self._meta(local_sig, self.variable())
            lt, _ = self._rows(int_bytes([meta.numel()], device), [], [], slot="m")
            lens = lt.contiguous().view(torch.int64)[:, 0].tolist()
            mt, _ = self._rows(meta, [], [], min_row=align(max(lens)), slot="m")
            raw = [bytes(mt[r, : lens[r]].tolist()) for r in range(self.world)]
        metas = [json.loads(m) for m in raw]
        signature = check_agreement(self.owner, [StateSignature.decode(m["sig"]) for m in metas], self.world)
        sizes = [m["var"] for m in metas]
        new_plan = make_plan(signature, self.world, {})
        new_plan.local, new_plan.calls = plan.local, plan.calls
        plan.__dict__.update(new_plan.__dict__)
        return self._finish(plan, sizes, {})

    def _meta(self, signature: list[StateSignature], variable: list[int]) -> torch.Tensor:
        blob = json.dumps({"sig": signature, "var": variable}).encode()
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)

    def _finish(self, plan: SyncPlan, sizes: list[list[int]], gathered: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Round B for what round A did not carry, the all-reduces, then every state's value."""
        rows: dict[str, list[int]] = {}
        shapes: dict[str, list[tuple[int, ...]]] = {}
        cursor = 0
        for s in plan.signature:
            if s.kind == CAT:
                rows[s.name] = [size[cursor] for size in sizes]
                cursor += 1
            elif s.kind == GATHER:
                shapes[s.name] = [tuple(size[cursor : cursor + s.dims]) for size in sizes]
                cursor += s.dims

        gathered.update(self._round_b(plan, rows, shapes, gathered))
        result: dict[str, Any] = {}
        for bucket in plan.buckets:
            reduced = _reductions.reduce_rows(bucket.kind, gathered[bucket.names[0]][:, : sum(bucket.numels)])
            for name, piece, shape in zip(bucket.names, reduced.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        for bucket in plan.reduced:
            flat = self._flat(bucket)
            with self._naming_failures():
                mode = "local" if flat.requires_grad else "none"
                out = AllReduce.apply(
                    flat if flat.requires_grad else flat.detach(), bucket.kind, self.group, self.world, mode, False
                )
            for name, piece, shape in zip(bucket.names, out.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        self._cut_cats(plan, rows, gathered, result)
        for s in plan.signature:
            if s.kind == GATHER:
                table = gathered[s.name]
                pieces = [table[r, : torch.Size(sh).numel()].view(sh).clone() for r, sh in enumerate(shapes[s.name])]
                result[s.name] = _reductions.apply_stacked(self.by_name[s.name].fn, _reductions.stack_ranks(pieces))

        resize_capacities(plan, rows)
        return {e.name: result[e.name] for e in self.entries}

    def _round_b(
        self, plan: SyncPlan, rows: dict[str, list[int]], shapes: dict[str, list], gathered: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Round B: buckets not gathered yet, cat states beyond their capacity, gathered states (none: no round)."""
        late: list[tuple[str, torch.Tensor, int]] = []
        for bucket in plan.buckets:
            if bucket.names[0] not in gathered:
                late.append((bucket.names[0], self._flat(bucket), bucket.nbytes))
        for s in plan.signature:
            name = s.name
            dtype = dtype_from_code(s.dtype) if s.dtype != UNKNOWN_DTYPE else None
            if s.kind == CAT and dtype is not None and (name not in gathered or max(rows[name]) > plan.capacity[name]):
                t = self.by_name[name].tensor
                late.append(
                    (name, t if t is not None else self._empty(dtype), max(rows[name]) * plan.cat_row_bytes(name))
                )
            elif s.kind == GATHER:  # (a gathered state always has a tensor, so its dtype is known)
                late.append(
                    (
                        name,
                        cast(torch.Tensor, self.by_name[name].tensor),
                        max(torch.Size(sh).numel() for sh in shapes[name]) * cast(torch.dtype, dtype).itemsize,
                    )
                )
        if not late:
            return {}
        _, outs = self._rows(self._empty(), [t for _, t, _ in late], [c for _, _, c in late], slot="b")
        return {name: out for (name, _, _), out in zip(late, outs)}

    def _cut_cats(
        self, plan: SyncPlan, rows: dict[str, list[int]], gathered: dict[str, torch.Tensor], result: dict[str, Any]
    ) -> None:
        """Cat states: one concatenation per dtype for all of them (rank pieces in state-major order), then split."""
        by_dtype: dict[int, list[tuple[str, list, int]]] = {}
        for s in plan.signature:
            if s.kind == CAT:
                if s.dtype == UNKNOWN_DTYPE:  # empty on every rank
                    result[s.name] = []
                    continue
                by_dtype.setdefault(s.dtype, []).append((s.name, s.dims, torch.Size(s.dims).numel()))
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
