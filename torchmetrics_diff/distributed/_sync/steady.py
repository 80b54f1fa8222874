"""The steady-state sync: round A written into, and read from, views prepared once per plan.

Once ranks have agreed on a :class:`~torchmetrics_diff.distributed._sync.plan.SyncPlan`, most syncs look exactly like
the previous one: the same states with the same dtypes and shapes, cat states within their capacity. For those the
general engine's work (describing every state, hashing the description, cutting and padding pieces, building the
row with a concatenation) is the same every time. A :class:`SteadyPath` does it once: it keeps typed views of
the send row and the receive table at the plan's offsets, and a sync becomes

* a few checks that the states still match the plan (names, reductions, dtypes, shapes, cat rows <= capacity),
* one stack/concatenation per reduction bucket straight into the row, one copy per cat state, the header ints
  (:attr:`SteadyPath.head_ints`: the plan's hash and each cat state's rows), which travel in the call's header
  exchange (``distributed._call``), so every rank knows every rank's before the data moves,
* the all-gather of the rows,
* one reduction per bucket and one concatenation per group of cat states, read from the table as
  :meth:`SteadyPath.cut` planned it from the headers: nothing is read back from the device.

The row it writes is byte for byte the general engine's round A for the same states (padding aside, which no
rank reads). When the states do not match, :meth:`SteadyPath.pack` says so before any communication and the rank
sends a marker in its header instead; when any rank's header does not match the plan (a marker, or more rows
than a capacity), :meth:`SteadyPath.cut` says so on every rank alike and every rank takes the general engine's
rounds. Gradients are not supported here (``grad="none"`` syncs only): a differentiable sync needs the general
engine's autograd function.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import Group, all_gather_flat, all_reduce_, dtype_from_code
from torchmetrics_diff.distributed._call import PAYLOAD, inline_buffers
from torchmetrics_diff.distributed._reductions import as_rows, reduce_rows
from torchmetrics_diff.distributed._sync.plan import UNKNOWN_DTYPE, SyncPlan
from torchmetrics_diff.distributed._sync.rows import HEADER, buffer_pair, layout, oversized

_SLOT = "a"  # round A's buffers: the steady path is a round A


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
    """One cat state: its dtype, trailing dims, capacity and where it sits in the row and the table."""

    def __init__(self, index: int, name: str, dtype: torch.dtype, dims: torch.Size, capacity: int) -> None:
        self.index, self.name, self.dtype, self.dims, self.capacity = index, name, dtype, dims, capacity
        self.send: torch.Tensor = torch.empty(0)  # (capacity, *dims)
        self.recv: torch.Tensor = torch.empty(0)  # (W, capacity, *dims)
        self.last_rows, self.last_dest = -1, self.send  # the slot's first rows, cached for the next pack
        self.offset = 0  # bytes from the start of the row to its slot

    def dest(self, rows: int) -> torch.Tensor:
        """The slot's first ``rows`` rows (the same view again while the batch size stays)."""
        if rows != self.last_rows:
            self.last_rows, self.last_dest = rows, self.send[:rows]
        return self.last_dest


class SteadyPath:
    """Round A of one plan through cached views: see the module docstring.

    Build it with :meth:`build` right after a sync in which this rank's states matched the plan.
    """

    def __init__(
        self,
        plan: SyncPlan,
        names: tuple[str, ...],
        fns: tuple,
        buckets: list[_BucketView],
        cats: list[_CatView],
        world: int,
        rank: int,
        device: torch.device,
    ) -> None:
        self.hash, self.names, self.fns, self.device = plan.signature_hash, names, fns, device
        self.world, self.rank = world, rank  # the group shape it was built for: it is used for no other
        self.buckets, self.cats = buckets, cats
        self.row_bytes = plan.row_bytes
        # a row of CPU data that fits the header exchange's inline area travels in it: the sync is one collective
        # (decided at each pack: the area's size is the group's, see _call.inline_capacity)
        self.inline = False
        self._capacity = 0  # the inline area's size the views were made for
        self.head_bytes = HEADER + 8 * len(cats)
        self.slots, _ = layout(self.head_bytes, plan.caps(), plan.row_bytes)
        self.piece_names = plan.pieces()
        self._base: torch.Tensor | None = None  # the buffer the views below look into
        self._cut: tuple = ((), [], {})  # (every rank's header, how to cut cat states, rows if shrinking)
        self.cat_indices = [cat.index for cat in cats]
        self._all_lists, self._ones = (list,) * len(cats), (1,) * len(cats)
        self._no_rows = [self.hash, -1]
        self._memo: tuple | None = None  # (key, slots, header ints) of the last pack: see _pack_cats
        self.head_ints: list[int] = self._no_rows  # the header ints of the last pack, for the call's header
        self.reorder = True  # whether unpack must reorder its results into the states' order
        self.reduced: list[_BucketView] = []  # large sum/mean buckets, each all-reduced in its own buffer
        # the call header's table of every rank's header ints at the last cut, and that cut: a steady call gets the
        # same table object back (see _call.exchange), and then nothing is read per rank
        self.last_heads: Any = None
        self.last_cut: tuple | None = None

    @classmethod
    def build(
        cls,
        plan: SyncPlan,
        states: dict[str, Any],
        reductions: dict[str, Any],
        world: int,
        rank: int,
        device: torch.device,
    ) -> SteadyPath | None:
        """The plan's steady path, or ``None`` when the plan has parts it cannot do (the general engine does)."""
        names = tuple(states)
        if names != tuple(s.name for s in plan.signature):
            return None
        index = {name: i for i, name in enumerate(names)}
        buckets = [
            _BucketView(b.kind, [index[n] for n in b.names], list(b.names), b.dtype, list(b.shapes))
            for b in plan.buckets
        ]
        # large sum/mean buckets: all-reduced in buffers of their own (the row does not carry them)
        reduced = [
            _BucketView(b.kind, [index[n] for n in b.names], list(b.names), b.dtype, list(b.shapes))
            for b in plan.reduced
        ]
        for view in reduced:
            view.send = torch.empty(sum(view.numels), dtype=view.dtype, device=device)
        cats = []
        for s in plan.signature:
            if _reductions.is_cat(s.kind):
                # the steady path returns the concatenation itself; other reductions of it are the general engine's
                if s.dtype == UNKNOWN_DTYPE or not (
                    reductions[s.name] is None or _reductions.is_cat(reductions[s.name])
                ):
                    return None
                cats.append(
                    _CatView(index[s.name], s.name, dtype_from_code(s.dtype), torch.Size(s.dims), plan.capacity[s.name])
                )
            elif not _reductions.is_elementwise(s.kind):
                return None
        if 3 + len(cats) > PAYLOAD:  # its header would not fit the call's: the general engine, every time
            return None
        fns = tuple(reductions[n] for n in names)
        path = cls(plan, names, fns, buckets, cats, world, rank, device)
        path.reduced = reduced
        return path

    # ------------------------------------------------------------------------------------------------ views
    def _views(self, capacity: int) -> None:
        """(Re)make the typed views when the shared buffers were replaced (or on first use)."""
        if self.inline:  # the row rides in the call's header exchange: its inline area, made once per size
            row, grid = inline_buffers(self.world, capacity)
            table = grid
        else:
            row, table = buffer_pair(self.device, self.row_bytes, self.world, _SLOT)
        if row is not self._base:
            self._base, self._cut, self._memo = row, ((), [], {}), None
            self.last_heads = self.last_cut = None  # cuts hold views of the old buffers
            if self.inline:
                grid = grid[:, : self.row_bytes]
            else:
                grid = table[: self.world * self.row_bytes].view(self.world, self.row_bytes)
                table = table[: self.world * self.row_bytes]
            self.row, self.table = row[: self.row_bytes], table
            self.head_send = row[: self.head_bytes].view(torch.int64)
            self.head_numpy = _numpy_view(self.head_send)
            pieces: list[_BucketView | _CatView] = [*self.buckets, *self.cats]
            for piece, (offset, cap) in zip(pieces, self.slots):
                send = row[offset : offset + cap].view(piece.dtype)
                recv = grid[:, offset : offset + cap].view(piece.dtype)
                if isinstance(piece, _CatView):
                    piece.offset = offset
                    send = send.view(piece.capacity, *piece.dims)
                    recv = recv.view(self.world, piece.capacity, *piece.dims)
                    piece.last_rows = -1  # its cached slot view belongs to the old buffer
                piece.send, piece.recv = send, recv

    # ------------------------------------------------------------------------------------------------- send
    def pack(self, states: dict[str, Any], reductions: dict[str, Any], capacity: int = 0) -> bool:
        """Write this rank's round A row; ``False`` (nothing written that matters) when the states do not fit.

        ``capacity``: the bytes of the inline area of the call's header exchange; a CPU row no larger is written
        there (the sync is then that one collective). Runs under ``torch.no_grad()`` (the caller's): the
        stack/concatenation write into the row in place.
        """
        if tuple(states) != self.names or tuple(reductions.values()) != self.fns:
            return False
        values = tuple(states.values())
        self.inline = self.device.type == "cpu" and self.row_bytes <= capacity
        self._views(capacity)
        try:
            for bucket in self.buckets:
                tensors = [values[i] for i in bucket.indices]
                if [(t.__class__, t.dtype, t.shape) for t in tensors] != bucket.expected:
                    return False
                if bucket.scalars:
                    torch.stack(tensors, out=bucket.send)
                else:
                    torch.cat([t.reshape(-1) for t in tensors], out=bucket.send)
            for bucket in self.reduced:
                tensors = [values[i] for i in bucket.indices]
                if [(t.__class__, t.dtype, t.shape) for t in tensors] != bucket.expected:
                    return False
                torch.cat([t.reshape(-1) for t in tensors], out=bucket.send)
            rows = self._pack_cats(values) if self.cats else self._no_rows
            if rows is None:
                return False
        except (RuntimeError, TypeError, AttributeError):  # not a tensor, another device...: the general engine
            return False
        if self.head_numpy is not None:
            self.head_numpy[:] = rows
        else:
            self.head_send.copy_(torch.tensor(rows, dtype=torch.int64))
        self.head_ints = rows
        return True

    def _pack_cats(self, values: tuple) -> list[int] | None:
        """Copy every cat state into its slot; the header's ints (hash, -1, rows per cat state), or ``None`` when
        a cat state does not fit the plan.

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
        rows, sources = [self.hash, -1], []
        for cat in self.cats:
            n = _rows_into(values[cat.index], cat, dests, sources)
            if n < 0:
                return None
            rows.append(n)
        if dests:
            _copy_all(dests, sources)
        # remembered only when every state was one tensor: then ``dests`` has one slot per state, in order
        self._memo = (key, dests, rows) if key is not None and len(dests) == len(self.cats) else None
        return rows

    def gather(self, group: Group) -> None:
        """The sync's data collective: every rank's row into the table (nothing when the row rode inline in the
        call's header exchange)."""
        if not self.inline and (self.buckets or self.cats):
            all_gather_flat(self.table, self.row, group)
        for bucket in self.reduced:
            all_reduce_(bucket.send, _reductions.all_reduce_op(bucket.kind), group)

    # ------------------------------------------------------------------------------------------------ receive
    def cut(self, heads: list[list[int]]) -> tuple | None:
        """How to read the table that every rank's ``heads`` (their :attr:`head_ints`, from the call's header
        exchange) describe; ``None`` when a rank did not pack this plan or sent more rows than a capacity (every
        rank sees the same heads, so every rank then takes the general engine's rounds together)."""
        key = tuple(map(tuple, heads))
        if key != self._cut[0]:  # not the headers of the previous sync: check them, cut anew
            if any(h[0] != self.hash for h in key):
                return None
            cut = self._cut_plan(key)
            if cut is None:
                return None
            self._cut = (key, *cut)
            produced = [n for b in self.buckets for n in b.names] + [n for names, _, _ in cut[0] for n in names]
            self.reorder = tuple(produced) != self.names  # results come out bucket by bucket, group by group
        return self._cut

    def unpack(self, cut: tuple) -> tuple[dict[str, Any], dict[str, list[int]]]:
        """Every state's synced value read from the gathered table as ``cut`` (from :meth:`cut`) says, and every
        cat state's rows per rank when a capacity is far too large (else ``{}``: the layout stays)."""
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
            else:
                result.update(zip(names, torch.split_with_sizes(torch.cat(pieces), totals)))
        if self.reorder:
            result = {name: result[name] for name in self.names}
        return result, cut[2]

    def _cut_plan(self, heads: tuple) -> tuple[list, dict[str, list[int]]] | None:
        """How to read the cat states for these headers, and their rows when a capacity should shrink (else
        ``{}``); ``None`` when a rank sent more rows than the capacity (the general engine's round B then)."""
        rows = {cat.name: [h[2 + j] for h in heads] for j, cat in enumerate(self.cats)}
        if any(max(rows[cat.name]) > cat.capacity for cat in self.cats):
            return None
        shrink = any(oversized(cat.capacity, max(rows[cat.name])) for cat in self.cats)
        by_kind: dict[tuple, list[_CatView]] = {}
        for cat in self.cats:
            by_kind.setdefault((cat.dtype, cat.dims), []).append(cat)
        groups: list[tuple[list[str], list[torch.Tensor], list[int] | None]] = []
        for cats in by_kind.values():
            names = [cat.name for cat in cats]
            uniform = self._uniform_views(cats, rows)
            if uniform is not None:
                groups.append((names, uniform, None))
                continue
            # views of every rank's rows: one concatenation gives all of the group's states (rank pieces in
            # state-major order), then a split; this rank's rows come from its own send row (the same bytes, still
            # in this core's cache)
            pieces = [
                cat.send[:n] if r == self.rank else cat.recv[r, :n]
                for cat in cats
                for r, n in enumerate(rows[cat.name])
            ]
            groups.append((names, pieces, [sum(rows[cat.name]) for cat in cats]))
        return groups, rows if shrink else {}

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


def _rows_into(value: Any, cat: _CatView, dests: list, sources: list) -> int:
    """Queue the copy of a cat state (a tensor or a non-empty list of them) into its slot; returns its rows, or -1
    when it does not match the plan (dtype, trailing dims, capacity). A list of several tensors is concatenated
    into the slot at once."""
    if isinstance(value, list):
        if len(value) != 1:
            if not value:
                return -1
            n = 0
            for t in value:
                if (
                    not isinstance(t, torch.Tensor)
                    or t.dtype is not cat.dtype
                    or t.ndim == 0
                    or t.shape[1:] != cat.dims
                ):
                    return -1
                n += t.shape[0]
            if n > cat.capacity:
                return -1
            torch.cat(value, out=cat.send[:n])
            return n
        value = value[0]
    if not isinstance(value, torch.Tensor) or value.dtype is not cat.dtype:
        return -1
    value = as_rows(value)
    n = value.shape[0]
    if n > cat.capacity or value.shape[1:] != cat.dims:
        return -1
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
