"""The one way states travel: a :class:`Layout`, the row of an agreed plan seen through views prepared once.

A :class:`~torchmetrics_diff.distributed._sync.plan.SyncPlan` fixes the row every rank sends: a header (the plan's
key, the length of this rank's metadata, this rank's sizes: the rows of each ``cat`` state, the shape of each
gathered state), the small ``sum``/``mean``/``min``/``max`` states packed per (op, dtype) bucket, each ``cat`` state
at its room (rows) and each gathered state (callable or ``None`` reduction) at its room (elements). Large
``sum``/``mean`` buckets are all-reduced in buffers of their own. A layout keeps typed views of the send row and
of the gathered table at the plan's offsets, so a sync is

* :meth:`Layout.pack`: a few checks that the states still match the plan (names, reductions, dtypes, shapes), one
  stack or concatenation per bucket straight into the row, one copy per ``cat`` or gathered state, and the header
  ints (:attr:`Layout.head_ints`), which travel in the call's header exchange (``distributed._call``) too, so
  every rank knows every rank's sizes before the data moves;
* :meth:`Layout.exchange_rows`: the row's all-gather (nothing when the row rode in the header exchange's inline
  area: a CPU row that fits it) and the all-reduces;
* :meth:`Layout.cut`: how to read the table, planned from every rank's header ints (``None`` when a rank sent more
  than the room the plan has: every rank sees the same ints and retries the same way);
* :meth:`Layout.unpack`: one reduction per bucket, one concatenation per group of ``cat`` states, one stack per
  gathered state; or :meth:`Layout.unpack_tracked` for a differentiable sync (``grad="local"``): the same reading
  in which this rank's own slot carries its input's gradient (:class:`~.rows.OwnRow`).

Nothing is read back from a device unless the plan has more sizes than the call header carries (more than 50 ints:
some 49 ``cat`` states); then they are read from the gathered row's header (:meth:`Layout.heads_from_table`).
"""

from __future__ import annotations

import json
import math
import operator
from typing import Any, cast

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import Group, all_gather_flat, all_reduce_, dtype_from_code
from torchmetrics_diff.distributed._call import PAYLOAD, inline_buffers
from torchmetrics_diff.distributed._reductions import CAT, as_rows, reduce_rows
from torchmetrics_diff.distributed._sync.plan import GATHER, UNKNOWN_DTYPE, Entry, SyncPlan
from torchmetrics_diff.distributed._sync.rows import HEADER, Attached, CatRows, OwnRow, buffer_pair, layout, oversized

_SLOT = "row"  # the rows' buffers (the agreement's metadata has its own)


class _BucketView:
    """One reduction bucket: which states, where in the row and the table."""

    def __init__(self, kind: str, indices: list[int], names: list[str], dtype: torch.dtype, shapes: list) -> None:
        self.kind, self.indices, self.names, self.dtype, self.shapes = kind, indices, names, dtype, shapes
        self.numels = [s.numel() for s in shapes]
        self.scalars = all(len(s) == 0 for s in shapes)  # all 0-d: stack in, unbind out
        self.expected = [(torch.Tensor, dtype, s) for s in shapes]  # what pack checks its states against
        self.send: torch.Tensor = torch.empty(0)
        self.recv: torch.Tensor = torch.empty(0)


class _CatView:
    """One cat state: its dtype (``None``: empty on every rank at the agreement), trailing dims, room (rows), where
    it sits in the row and the table, and which of the header's sizes is its rows."""

    def __init__(self, index: int, name: str, dtype: torch.dtype | None, dims: torch.Size, capacity: int) -> None:
        self.index, self.name, self.dtype, self.dims, self.capacity = index, name, dtype, dims, capacity
        self.var = 0  # its rows' position among the header's sizes
        self.fn: Any = None  # applied to the concatenation when callable
        self.lists_only = True  # a tensor value is a cat state only under reduction "cat" (else: gathered)
        self.send: torch.Tensor = torch.empty(0)  # (capacity, *dims)
        self.recv: torch.Tensor = torch.empty(0)  # (W, capacity, *dims)
        self.last_rows, self.last_dest = -1, self.send  # the slot's first rows, cached for the next pack
        self.offset = 0  # bytes from the start of the row to its slot

    def dest(self, rows: int) -> torch.Tensor:
        """The slot's first ``rows`` rows (the same view again while the batch size stays)."""
        if rows != self.last_rows:
            self.last_rows, self.last_dest = rows, self.send[:rows]
        return self.last_dest


class _GatherView:
    """One gathered state (callable or ``None`` reduction): dtype, ndim, room (elements) and its sizes (its shape)."""

    def __init__(self, index: int, name: str, dtype: torch.dtype, ndim: int, capacity: int, var: int, fn: Any):
        self.index, self.name, self.dtype, self.ndim, self.capacity, self.var, self.fn = (
            index,
            name,
            dtype,
            ndim,
            capacity,
            var,
            fn,
        )
        self.send: torch.Tensor = torch.empty(0)  # (capacity,)
        self.recv: torch.Tensor = torch.empty(0)  # (W, capacity)


class Layout:
    """The row of one plan, for one rank of one group size on one device: see the module docstring."""

    def __init__(self, plan: SyncPlan, fns: tuple, world: int, rank: int, device: torch.device) -> None:
        self.key, self.device = plan.key, device
        self.names = tuple(s.name for s in plan.signature)
        self.tags = tuple(s.tag for s in plan.signature)
        # the reductions it packs with; None when they are not those the ranks agreed on (a layout rebuilt after the
        # plan grew, under other reductions): pack then compares them anew and refuses, so the ranks agree anew
        agreed = tuple(Entry(n, "", fn, None).tag() for n, fn in zip(self.names, fns)) == self.tags
        self.fns: tuple | None = fns if agreed else None
        self.world, self.rank = world, rank  # the group shape it was built for: it is used for no other
        index = {name: i for i, name in enumerate(self.names)}

        def view(b: Any) -> _BucketView:
            return _BucketView(b.kind, [index[n] for n in b.names], list(b.names), b.dtype, list(b.shapes))

        self.buckets = [view(b) for b in plan.buckets]
        self.reduced = [view(b) for b in plan.reduced]  # large sum/mean buckets, each all-reduced in its own buffer
        for bucket in self.reduced:
            bucket.send = torch.empty(sum(bucket.numels), dtype=bucket.dtype, device=device)
        self.cats: list[_CatView] = []
        self.gathers: list[_GatherView] = []
        slotted: list[Any] = []  # the views with room in the row, in the plan's order
        var = 0
        for i, s in enumerate(plan.signature):
            if s.kind == CAT:
                dtype = dtype_from_code(s.dtype) if s.dtype != UNKNOWN_DTYPE else None
                cat = _CatView(i, s.name, dtype, torch.Size(s.dims or ()), plan.capacity.get(s.name, 0))
                cat.var, cat.fn, cat.lists_only = var, fns[i], not _reductions.is_cat(fns[i])
                self.cats.append(cat)
                slotted += [cat] if dtype is not None else []
                var += 1
            elif s.kind == GATHER:
                g = _GatherView(i, s.name, dtype_from_code(s.dtype), s.dims, plan.capacity[s.name], var, fns[i])
                self.gathers.append(g)
                slotted.append(g)
                var += s.dims
        self.n_var = var
        # cat states read out as more than their concatenation: empty everywhere ([]) or handed to a callable
        self.post = [cat for cat in self.cats if cat.dtype is None or callable(cat.fn)]
        self.row_bytes = plan.row_bytes
        self.head_bytes = HEADER + 8 * var
        self.slots, _ = layout(self.head_bytes, plan.caps(), plan.row_bytes)
        self.slotted = slotted
        # this rank's metadata when its states match the plan (what an agreement needs of it): the plan's signature
        # and this rank's sizes; its length travels in the header
        self.signature_json = json.dumps(plan.signature).encode()
        self.meta_bytes = 8 + len(self.signature_json) + 8 * var
        self.wide = 2 + var > PAYLOAD  # more sizes than the call header carries: they are read from the table
        # a row of CPU data that fits the header exchange's inline area travels in it: the sync is one collective
        # (decided at each pack: the area's size is the group's, see _call.inline_capacity)
        self.inline = False
        self._base: torch.Tensor | None = None  # the buffer the views below look into
        self._cut: tuple = ((), [], {}, {})  # (every rank's header ints, cat groups, units if shrinking, shapes)
        self._cut_heads: Any = None  # the header table of that cut (the same object: the same cut)
        self.cat_indices = [cat.index for cat in self.cats]
        self._all_lists, self._ones = (list,) * len(self.cats), (1,) * len(self.cats)
        self._memo: tuple | None = None  # (key, slots, header ints) of the last pack: see _pack_cats
        self.head_ints: list[int] = [self.key, self.meta_bytes]  # the header ints of the last pack
        self.reorder = True  # whether unpack must reorder its results into the states' order
        # the call header's table of every rank's header ints at the last cut, and that cut: a steady call may get
        # the same table object back (see _call.exchange), and then nothing is read per rank
        self.last_heads: Any = None
        self.last_cut: tuple | None = None

    @classmethod
    def build(cls, plan: SyncPlan, reductions: dict[str, Any], world: int, rank: int, device: torch.device) -> Layout:
        """The layout of ``plan`` (agreed) for this rank, group size and device, with the caller's reductions."""
        return cls(plan, tuple(reductions.get(s.name) for s in plan.signature), world, rank, device)

    def fits(self, world: int, rank: int, device: torch.device) -> bool:
        """Whether this layout was built for this rank, group size and device."""
        return self.world == world and self.rank == rank and self.device == device

    # ------------------------------------------------------------------------------------------------ views
    def _views(self, group: Group, capacity: int) -> None:
        """(Re)make the typed views when the group's buffers were replaced (or on first use, or another group)."""
        if self.inline:  # the row rides in the call's header exchange: its inline area, made once per size
            row, table = inline_buffers(group, capacity)
        else:
            row, table = buffer_pair(group, self.device, self.row_bytes, _SLOT)
        if row is self._base:
            return
        self._base, self._cut, self._memo = row, ((), [], {}, {}), None
        self.last_heads = self.last_cut = None  # cuts hold views of the old buffers
        if self.inline:
            grid = table[:, : self.row_bytes]
        else:
            grid = table[: self.world * self.row_bytes].view(self.world, self.row_bytes)
            table = table[: self.world * self.row_bytes]
        self.row, self.table, self.grid = row[: self.row_bytes], table, grid
        self.head_send = row[: self.head_bytes].view(torch.int64)
        self.head_numpy = _numpy_view(self.head_send)
        for piece, (offset, cap) in zip([*self.buckets, *self.slotted], self.slots):
            if cap == 0:  # no room: empty tensors (a (W, 0) byte view cannot always be viewed as another dtype)
                units = (0, *piece.dims) if isinstance(piece, _CatView) else (0,)
                send = torch.empty(units, dtype=piece.dtype, device=self.device)
                recv = torch.empty((self.world, *units), dtype=piece.dtype, device=self.device)
            else:
                send = row[offset : offset + cap].view(piece.dtype)
                recv = grid[:, offset : offset + cap].view(piece.dtype)
            if isinstance(piece, _CatView):
                piece.offset = offset
                send = send.view(piece.capacity, *piece.dims)
                recv = recv.view(self.world, piece.capacity, *piece.dims)
                piece.last_rows = -1  # its cached slot view belongs to the old buffer
            piece.send, piece.recv = send, recv

    # ------------------------------------------------------------------------------------------------- send
    def pack(
        self, states: dict[str, Any], reductions: dict[str, Any], group: Group, capacity: int = 0, agreed: bool = False
    ) -> list[int] | None:
        """Write this rank's row; its header ints, or ``None`` (nothing written that matters) when the states do not
        match the plan. A ``cat`` or gathered state larger than its room is not copied, but its size is in the
        header ints (every rank then sees it, and the plan grows).

        ``group``: the group whose buffers the row is written to (:mod:`.._groups`). ``capacity``: the bytes of the
        inline area of the call's header exchange; a CPU row no larger is written there. ``agreed``: right after an
        agreement, where this rank's states were validated against every rank's: states on another device are moved,
        an empty list state is a ``cat`` state of no rows. Runs under ``torch.no_grad()`` (the caller's): the
        stack/concatenation write into the row in place.
        """
        if tuple(states) != self.names:
            return None
        if tuple(reductions.values()) != self.fns and not self._same_reductions(reductions):
            return None
        values = tuple(states.values())
        if agreed:
            values = tuple(_moved(v, self.device) for v in values)
        self.inline = self.device.type == "cpu" and self.row_bytes <= capacity
        self._views(group, capacity)
        try:
            for bucket in self.buckets:
                tensors = [values[i] for i in bucket.indices]
                if [(t.__class__, t.dtype, t.shape) for t in tensors] != bucket.expected:
                    return None
                if bucket.scalars:
                    torch.stack(tensors, out=bucket.send)
                else:
                    torch.cat([t.reshape(-1) for t in tensors], out=bucket.send)
            for bucket in self.reduced:
                tensors = [values[i] for i in bucket.indices]
                if [(t.__class__, t.dtype, t.shape) for t in tensors] != bucket.expected:
                    return None
                torch.cat([t.reshape(-1) for t in tensors], out=bucket.send)
            if self.gathers:
                head = self._pack_sizes(values, agreed)
            else:
                head = self._pack_cats(values, agreed) if self.cats else [self.key, self.meta_bytes]
            if head is None:
                return None
        except (RuntimeError, TypeError, AttributeError, ValueError):  # not a tensor, another device...: agree
            return None
        if self.head_numpy is not None:
            self.head_numpy[:] = head
        else:
            self.head_send.copy_(torch.tensor(head, dtype=torch.int64))
        self.head_ints = head
        return head

    def _same_reductions(self, reductions: dict[str, Any]) -> bool:
        """The reductions in another order, or other callables of the same names: take them."""
        fns = tuple(reductions.get(n) for n in self.names)
        if tuple(Entry(n, "", fn, None).tag() for n, fn in zip(self.names, fns)) != self.tags:
            return False
        self.fns = fns
        views: list[Any] = [*self.cats, *self.gathers]
        for view in views:
            view.fn = fns[view.index]
        self.post = [cat for cat in self.cats if cat.dtype is None or callable(cat.fn)]
        return True

    def _pack_cats(self, values: tuple, agreed: bool) -> list[int] | None:
        """Copy every cat state into its slot; the header's ints (key, metadata length, rows per cat state), or
        ``None`` when a cat state does not match the plan.

        When every cat state is one tensor (or a list of one) of the same types, dtypes and shapes as at the last
        pack, the checks that pack made still hold: its slots and header are reused (a few C-level passes over
        the states instead of a Python loop with a dozen operations per state).
        """
        sources = [values[i] for i in self.cat_indices]
        kinds = tuple(map(type, sources))
        key = None
        if kinds == self._all_lists and tuple(map(len, sources)) == self._ones:
            sources = list(map(_first, sources))
            key = (kinds, tuple(map(_dtype_shape, sources)))
        elif list not in kinds:
            key = (kinds, tuple(map(_dtype_shape, sources)))
        memo = self._memo
        if key is not None and memo is not None and key == memo[0]:
            _copy_all(memo[1], sources)
            return memo[2]
        dests: list[torch.Tensor] = []
        head, sources = [self.key, self.meta_bytes], []
        for cat in self.cats:
            n = _rows_into(values[cat.index], cat, dests, sources, agreed)
            if n < 0:
                return None
            head.append(n)
        if dests:
            _copy_all(dests, sources)
        # remembered only when every state was one tensor that fit: then ``dests`` has one slot per state, in order
        self._memo = (key, dests, head) if key is not None and len(dests) == len(self.cats) else None
        return head

    def _pack_sizes(self, values: tuple, agreed: bool) -> list[int] | None:
        """:meth:`_pack_cats` with gathered states among them (their shapes are sizes too), without the memo."""
        sizes: list[int] = []
        dests: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        views: list[Any] = sorted([*self.cats, *self.gathers], key=operator.attrgetter("index"))
        for view in views:
            value = values[view.index]
            if isinstance(view, _CatView):
                n = _rows_into(value, view, dests, sources, agreed)
                if n < 0:
                    return None
                sizes.append(n)
                continue
            if not isinstance(value, torch.Tensor) or value.dtype is not view.dtype or value.ndim != view.ndim:
                return None
            if value.numel() <= view.capacity:
                dests.append(view.send[: value.numel()])
                sources.append(value.reshape(-1))
            sizes += value.shape
        if dests:
            _copy_all(dests, sources)
        return [self.key, self.meta_bytes, *sizes]

    def metadata(self) -> bytes:
        """This rank's metadata for an agreement when its states matched the plan at :meth:`pack`."""
        sizes = torch.tensor(self.head_ints[2:], dtype=torch.int64).numpy().tobytes()
        return len(self.signature_json).to_bytes(8, "little") + self.signature_json + sizes

    # ---------------------------------------------------------------------------------------- exchanging rows
    def exchange_rows(self, group: Group) -> None:
        """The sync's data collectives: every rank's row into the table (nothing when the row rode inline in the
        call's header exchange), then each large bucket's all-reduce."""
        if not self.inline and (self.buckets or self.slotted or self.wide):
            all_gather_flat(self.table, self.row, group)
        for bucket in self.reduced:
            all_reduce_(bucket.send, _reductions.all_reduce_op(bucket.kind), group)

    def heads_from_table(self) -> list[list[int]]:
        """Every rank's header ints read from the gathered rows (a plan with more sizes than the call header
        carries; a host read on a GPU)."""
        return self.grid[:, : self.head_bytes].contiguous().view(torch.int64).tolist()

    # ------------------------------------------------------------------------------------------------ receive
    def units(self, heads: list[list[int]]) -> dict[str, list[int]]:
        """Every rank's rows (cat) or elements (gathered) of each state with room in the row."""
        out = {cat.name: [h[2 + cat.var] for h in heads] for cat in self.cats if cat.dtype is not None}
        for g in self.gathers:
            out[g.name] = [math.prod(h[2 + g.var : 2 + g.var + g.ndim]) for h in heads]
        return out

    def cut(self, heads: list[list[int]]) -> tuple | None:
        """How to read the table that every rank's ``heads`` (their :attr:`head_ints`) describe; ``None`` when a
        rank sent more than the room of a state (every rank sees the same heads, so every rank grows the plan)."""
        if heads is self._cut_heads:  # (the very table of the last cut: an agreed table comes back as itself)
            return self._cut
        key = tuple(map(tuple, heads)) if self.cats or self.gathers else 0  # (no sizes: nothing to cut by)
        if key != self._cut[0]:  # not the headers of the previous sync: check them, cut anew
            cut = self._cut_plan(heads)
            if cut is None:
                return None
            self._cut = (key, *cut)
            produced = [n for b in self.buckets for n in b.names] + [n for b in self.reduced for n in b.names]
            produced += [n for names, _, _ in cut[0] for n in names] + [g.name for g in self.gathers]
            produced += [cat.name for cat in self.cats if cat.dtype is None]
            self.reorder = tuple(produced) != self.names  # results come out bucket by bucket, group by group
        self._cut_heads = heads
        return self._cut

    def _cut_plan(self, heads: list[list[int]]) -> tuple | None:
        units = self.units(heads)
        views: list[Any] = [cat for cat in self.cats if cat.dtype is not None] + self.gathers
        if any(max(units[v.name]) > v.capacity for v in views):
            return None
        shrink = any(oversized(v.capacity, max(units[v.name])) for v in views)
        shapes = {g.name: [tuple(h[2 + g.var : 2 + g.var + g.ndim]) for h in heads] for g in self.gathers}
        by_kind: dict[tuple, list[_CatView]] = {}
        for cat in self.cats:
            if cat.dtype is not None:
                by_kind.setdefault((cat.dtype, cat.dims), []).append(cat)
        groups: list[tuple[list[str], list[Any], list[int] | None]] = []
        for cats in by_kind.values():
            names = [cat.name for cat in cats]
            if self.world > _VIEWS_MAX_WORLD:  # every rank's rows picked by one index per state, no view per rank
                picks = [CatRows(cat, units[cat.name]) for cat in cats]
                groups.append((names, picks, [p.total for p in picks]))
                continue
            uniform = self._uniform_views(cats, units)
            if uniform is not None:
                groups.append((names, uniform, None))
                continue
            # views of every rank's rows: one concatenation gives all of the group's states (rank pieces in
            # state-major order), then a split; this rank's rows come from its own send row (the same bytes, still
            # in this core's cache)
            pieces = [
                cat.send[:n] if r == self.rank else cat.recv[r, :n]
                for cat in cats
                for r, n in enumerate(units[cat.name])
            ]
            groups.append((names, pieces, [sum(units[cat.name]) for cat in cats]))
        return groups, units if shrink else {}, shapes

    def _uniform_views(self, cats: list[_CatView], rows: dict[str, list[int]]) -> list[torch.Tensor] | None:
        """For cat states of one dtype and trailing dims whose slots are evenly spaced in the row and whose rows agree
        rank by rank (e.g. predictions and targets): one ``(states, rows, *dims)`` strided view per rank, so that
        one concatenation along dim 1 gives every state's result. ``None`` otherwise."""
        first = cats[0]
        if len(cats) < 2 or any(rows[cat.name] != rows[first.name] for cat in cats):
            return None
        step = cats[1].offset - first.offset
        itemsize = first.send.element_size()
        if step % itemsize or any(b.offset - a.offset != step for a, b in zip(cats, cats[1:])):
            return None
        views = []
        for r, n in enumerate(rows[first.name]):
            slot = first.send[:n] if r == self.rank else first.recv[r, :n]  # the first state's rows of rank r
            size, stride = (len(cats), *slot.shape), (step // itemsize, *slot.stride())
            views.append(slot.as_strided(size, stride, slot.storage_offset()))
        return views

    def unpack(self, cut: tuple) -> dict[str, Any]:
        """Every state's synced value read from the gathered table as ``cut`` (from :meth:`cut`) says."""
        result: dict[str, Any] = {}
        for bucket in self.buckets:
            reduced = reduce_rows(bucket.kind, bucket.recv)
            if bucket.scalars:
                result.update(zip(bucket.names, reduced.unbind(0)))
            else:
                for name, piece, shape in zip(bucket.names, reduced.split(bucket.numels), bucket.shapes):
                    result[name] = piece.view(shape)
        for bucket in self.reduced:
            flat = bucket.send.clone()  # (the buffer is the next sync's)
            if _reductions.averages(bucket.kind):
                flat /= self.world
            for name, piece, shape in zip(bucket.names, flat.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        for names, pieces, totals in cut[1]:
            if totals is None:  # one (states, rows, *dims) view per rank: concatenate the ranks, one result per state
                result.update(zip(names, torch.cat(pieces, 1).unbind(0)))
            elif isinstance(pieces[0], CatRows):
                result.update(zip(names, (p.pick(p.cat.recv) for p in pieces)))
            else:
                result.update(zip(names, torch.split_with_sizes(torch.cat(pieces), totals)))
        for g in self.gathers:
            result[g.name] = self._gathered(g, g.recv, cut[3][g.name], copy=True)
        self._finish_cats(result)
        if self.reorder:
            result = {name: result[name] for name in self.names}
        return result

    def unpack_tracked(self, cut: tuple, own: dict[str, torch.Tensor | None]) -> dict[str, Any]:
        """:meth:`unpack` for ``grad="local"``: ``own`` holds this rank's inputs (list states concatenated, the
        gradient already scaled), and every result reaches them through this rank's slot only."""
        result: dict[str, Any] = {}
        for bucket in self.buckets:
            rows = _own_row(bucket.recv, [own[n] for n in bucket.names], self.rank)
            reduced = reduce_rows(bucket.kind, rows)
            for name, piece, shape in zip(bucket.names, reduced.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        for bucket in self.reduced:
            flat = bucket.send.clone()
            if _reductions.averages(bucket.kind):
                flat /= self.world
            mine = [own[n] for n in bucket.names]
            if any(t is not None and t.requires_grad for t in mine):
                scale = 1 / self.world if _reductions.averages(bucket.kind) else 1
                flat = Attached.apply(torch.cat([_flat(t) for t in mine]), flat, scale)
            for name, piece, shape in zip(bucket.names, flat.split(bucket.numels), bucket.shapes):
                result[name] = piece.view(shape)
        units = cut[2] or self.units(cut[0])
        for cat in self.cats:
            if cat.dtype is not None:
                table = _own_row(cat.recv, [own[cat.name]], self.rank)
                if self.world > _VIEWS_MAX_WORLD:
                    result[cat.name] = CatRows(cat, units[cat.name]).pick(table)
                else:
                    result[cat.name] = torch.cat([table[r, :n] for r, n in enumerate(units[cat.name])])
        for g in self.gathers:
            table = _own_row(g.recv, [own[g.name]], self.rank)
            result[g.name] = self._gathered(g, table, cut[3][g.name], copy=table is g.recv)
        self._finish_cats(result)
        return {name: result[name] for name in self.names}

    def _finish_cats(self, result: dict[str, Any]) -> None:
        if not self.post:
            return
        for cat in self.post:
            if cat.dtype is None:  # empty on every rank
                result[cat.name] = []
            elif callable(cat.fn):
                result[cat.name] = cat.fn(result[cat.name])

    @staticmethod
    def _gathered(g: _GatherView, table: torch.Tensor, shapes: list[tuple], copy: bool) -> Any:
        pieces = []
        for r, shape in enumerate(shapes):
            piece = table[r, : math.prod(shape)].view(shape)
            pieces.append(piece.clone() if copy else piece)
        return _reductions.apply_stacked(g.fn, _reductions.stack_ranks(pieces))


def _flat(t: torch.Tensor | None) -> torch.Tensor:
    return cast(torch.Tensor, t).reshape(-1)  # (only a cat state can be empty: no tensor)


def _own_row(table: torch.Tensor, own: list[torch.Tensor | None], rank: int) -> torch.Tensor:
    """``table`` whose row ``rank`` carries the gradient to ``own`` (concatenated) when one of them needs it."""
    if not any(t is not None and t.requires_grad for t in own):
        return table
    mine = own[0] if len(own) == 1 else torch.cat([_flat(t) for t in own])
    return OwnRow.apply(mine, table, rank)


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, list):
        return [_moved(v, device) for v in value]
    return value.to(device) if isinstance(value, torch.Tensor) else value


#: above this many ranks a cut reads every rank's rows of a cat state with one index (built once per cut) instead of
#: one view per rank (a few microseconds each: 10 ms at 4096 ranks)
_VIEWS_MAX_WORLD = 16


def _rows_into(value: Any, cat: _CatView, dests: list, sources: list, agreed: bool) -> int:
    """Queue the copy of a cat state (a tensor or a list of them) into its slot; returns its rows, or -1 when it does
    not match the plan (dtype, trailing dims; an empty list except right after an agreement). Rows beyond the room
    are not copied. A list of several tensors is concatenated into the slot at once."""
    if cat.dtype is None:  # empty on every rank at the agreement: it must still be
        return 0 if isinstance(value, list) and not value else -1
    if isinstance(value, list):
        if len(value) != 1:
            if not value:
                return 0 if agreed else -1
            rows = []
            for t in value:
                if not isinstance(t, torch.Tensor) or t.dtype is not cat.dtype:
                    return -1
                t = as_rows(t)
                if t.shape[1:] != cat.dims:
                    return -1
                rows.append(t)
            n = sum(t.shape[0] for t in rows)
            if n <= cat.capacity:
                torch.cat(rows, out=cat.send[:n])
            return n
        value = value[0]
    elif cat.lists_only:
        return -1
    if not isinstance(value, torch.Tensor) or value.dtype is not cat.dtype:
        return -1
    value = as_rows(value)
    n = value.shape[0]
    if value.shape[1:] != cat.dims:
        return -1
    if n <= cat.capacity:
        dests.append(cat.dest(n))
        sources.append(value)
    return n


_first = operator.itemgetter(0)
_dtype_shape = operator.attrgetter("dtype", "shape")


def _numpy_view(t: torch.Tensor) -> Any:
    """A NumPy array sharing ``t``'s memory (writing a few ints into it costs far less than making a tensor),
    or ``None`` off the CPU or without NumPy."""
    if t.device.type != "cpu":
        return None
    try:
        return t.numpy()
    except (RuntimeError, ImportError):
        return None


def _copy_loop(dests: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for dest, source in zip(dests, sources):
        dest.copy_(source)


# one kernel launch for every cat state where torch has it (a private but long-standing op: optimizers use it)
_copy_all = getattr(torch, "_foreach_copy_", None) or _copy_loop
