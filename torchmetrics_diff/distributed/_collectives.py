"""Public collectives with autograd: ``gather_all_tensors``, ``all_gather_cat``, ``all_reduce``.

Each call issues the same collectives on every rank whatever the local data: the call's header exchange
(:mod:`._call`: which call this is, and the ndim, dtype, shape, op, grad mode and whether the input requires grad),
validated identically on every rank so a disagreement raises the same ``RuntimeError`` everywhere instead of
hanging, then one data collective. The header holds host values and never waits for a GPU. An ``all_reduce`` of
a CPU tensor that fits the header's inline area rides in it: every rank reduces the gathered rows itself, in rank
order (the same bits everywhere), and the call is that one collective.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._autograd import AllGatherFlat, AllReduce, ReduceRows
from torchmetrics_diff.distributed._backend import (
    Group,
    all_gather_flat,
    dtype_code,
    dtype_from_code,
    group_rank,
    group_size,
)
from torchmetrics_diff.distributed._call import call_name, exchange, group_state, inline_buffers, inline_capacity
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._failure import RanksDisagreeError, fail_on_every_rank

GRAD_MODES = ("none", "local", "sync")  #: the accepted values of the collectives' ``grad`` argument
REDUCE_OPS = _reductions.ELEMENTWISE  #: the accepted values of :func:`all_reduce`'s ``op``
_MAX_NDIM = 16
_FIXED = 5  # ndim, dtype, requires_grad, op, grad mode; then the shape


class _Peer(NamedTuple):
    """What one rank declared in the metadata exchange."""

    ndim: int
    dtype: torch.dtype
    requires_grad: bool
    op: int
    mode: int
    shape: tuple[int, ...]


_NO_OP = object()  # the `op` of a gather (``None`` is a user's bad op for all_reduce)


def _local_problem(fn: str, tensor: object, grad: str, op: object) -> Exception | None:
    """What is wrong with this rank's arguments, found *before* any collective but raised after the exchange.

    Raising at once would leave the other ranks waiting in the collective; carrying the problem in the header
    lets every rank raise together.
    """
    if not isinstance(tensor, torch.Tensor):
        return TypeError(f"{fn}: `tensor` must be a torch.Tensor; got {type(tensor).__name__}")
    if grad not in GRAD_MODES:
        return ValueError(f"{fn}: `grad` must be one of {GRAD_MODES}; got {grad!r}")
    if op is not _NO_OP and op not in REDUCE_OPS:
        return ValueError(f"{fn}: `op` must be one of {REDUCE_OPS}; got {op!r}")
    try:
        dtype_code(tensor.dtype)
    except TypeError as err:
        return TypeError(f"{fn}: {err}")
    if tensor.ndim > _MAX_NDIM:
        return ValueError(f"{fn}: tensors of more than {_MAX_NDIM} dimensions are not supported; got {tensor.ndim}")
    return None


def _wants_grad(tensor: torch.Tensor, grad: str) -> bool:
    return grad != "none" and torch.is_grad_enabled() and tensor.requires_grad


def _rank_labels(group: Group, world: int) -> list[str]:
    """``rank i`` for the default group; ``rank i (global g)`` inside a subgroup."""
    if group is None or group is dist.group.WORLD:
        return [f"rank {r}" for r in range(world)]
    return [f"rank {r} (global {g})" for r, g in enumerate(dist.get_process_group_ranks(group))]


def _exchange_metadata(
    fn: str,
    tensor: torch.Tensor | None,
    group: Group,
    world: int,
    grad: str,
    op: object = _NO_OP,
    problem: Exception | None = None,
    inline: tuple[torch.Tensor, int] | None = None,
    want: int = 0,
) -> _Meta:
    """Every rank's metadata, through the call's header exchange (:func:`._call.exchange`); validated identically
    everywhere.

    The header is the call's first collective and the same size for every call, so ranks in different calls
    raise instead of meeting collectives of different sizes. It is built from host values and travels over a
    CPU-capable group: nothing waits for the GPU. A rank with a local ``problem`` joins with a failure marker and
    raises its own error after the exchange; the others raise a ``RuntimeError`` naming it. Disagreements raise
    the same ``RuntimeError`` on every rank.

    ``inline``: this rank's tensor and the group's inline area (:func:`._call.inline_capacity`), which the tensor's
    bytes fit: they are written into the exchange's inline area, and every rank's are then in the table of
    :func:`._call.inline_buffers` of that size. ``want``: the bytes of a CPU tensor that could ride inline but
    does not fit the area yet; the header says so, and the group's area grows to fit it for the next calls.
    """
    payload: list[int] = []
    if problem is None:
        tensor = cast(torch.Tensor, tensor)  # (only a rank with a problem may have no tensor)
        payload = [
            tensor.ndim,
            dtype_code(tensor.dtype),
            int(_wants_grad(tensor, grad)),
            REDUCE_OPS.index(op) if op in REDUCE_OPS else -1,
            GRAD_MODES.index(grad),
            *tensor.shape,
        ]
    if inline is not None:
        data, capacity = inline
        want = data.numel() * data.element_size()
        send, _ = inline_buffers(group, capacity)
        send[:want].view(data.dtype).view(data.shape).copy_(data)  # (any strides; the area is 8-byte aligned)
    labels = functools.partial(_rank_labels, group, world)
    rows = exchange(fn, payload, group, failed=problem is not None, labels=labels, want=want)
    if problem is not None:
        raise problem
    cache = group_state(group).metas
    known = cache.get(fn)
    if known is not None and known.rows is rows:  # the table of an earlier call that every rank agreed on again
        return cast(_Meta, known)
    peers = [
        _Peer(row[0], dtype_from_code(row[1]), bool(row[2]), row[3], row[4], tuple(row[_FIXED : _FIXED + row[0]]))
        for row in rows
    ]
    check = functools.partial(_check_agree, fn, peers, labels)
    check("ndim", lambda p: p.ndim)
    check("dtype", lambda p: p.dtype)
    check("grad", lambda p: GRAD_MODES[p.mode])
    check("op", lambda p: REDUCE_OPS[p.op] if p.op >= 0 else None)
    if grad == "sync":
        # A rank whose input needs no gradient would skip the backward collective and hang the others.
        check("requires_grad (grad='sync' runs a collective in backward)", lambda p: p.requires_grad)
    if fn == "all_gather_cat":
        check("trailing dimensions", lambda p: p.shape[1:])
    elif fn == "all_reduce":
        check("shape", lambda p: p.shape)
    meta = cache[fn] = _Meta(rows, peers)
    return meta


class _Meta:
    """What a header exchange told about every rank, and what the data collective derives from it (computed once
    per table: a steady call gets the same table back, so nothing here is recomputed per rank)."""

    __slots__ = ("_index", "numels", "peers", "rows", "rows_total", "shape0", "uniform", "wants", "width")

    def __init__(self, rows: list[list[int]], peers: list[_Peer]) -> None:
        self.rows, self.peers = rows, peers
        self.numels = [int(torch.Size(p.shape).numel()) for p in peers]
        self.width = max(self.numels)
        self.uniform = all(p.shape == peers[0].shape for p in peers)  # every rank's shape the same
        self.shape0 = peers[0].shape
        self.wants = any(p.requires_grad for p in peers)
        self.rows_total = sum(p.shape[0] if p.shape else 1 for p in peers)  # (all_gather_cat's: rows of every rank)
        self._index: torch.Tensor | None = None

    def index(self, device: torch.device) -> torch.Tensor:
        """The positions of every rank's elements in the padded ``(W * width)`` table, in rank order."""
        if self._index is None or self._index.device != device:
            counts = torch.tensor(self.numels, device=device)
            shift = torch.arange(len(self.numels), device=device) * self.width - (counts.cumsum(0) - counts)
            self._index = torch.repeat_interleave(shift, counts) + torch.arange(sum(self.numels), device=device)
        return self._index


def _row_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` would take in the call header's inline area: those of a CPU tensor of a real,
    non-boolean dtype; 0 for any other (it never rides inline)."""
    if tensor.device.type != "cpu" or tensor.dtype == torch.bool or tensor.is_complex():
        return 0
    return tensor.numel() * tensor.element_size()


def _inline_bytes(tensor: torch.Tensor, group: Group) -> tuple[torch.Tensor, int] | None:
    """``tensor`` (detached) and the group's inline area when it rides in the call's header exchange: a CPU tensor
    of a real, non-boolean dtype whose bytes fit; else ``None`` (the data then moves in a collective of its own)."""
    size = _row_bytes(tensor)
    capacity = inline_capacity(group)
    if size == 0 or size > capacity:
        return None
    return tensor.detach(), capacity


def _check_agree(
    fn: str, peers: list[_Peer], labels: Callable[[], list[str]], what: str, key: Callable[[_Peer], Any]
) -> None:
    values = [key(p) for p in peers]
    if any(v != values[0] for v in values):
        names = labels()
        listing = ", ".join(f"{names[r]}: {v}" for r, v in enumerate(values))
        # named by the entry point too (``"CLIPLoss.forward: gather_all_tensors"``): whose inputs disagree
        raise RanksDisagreeError(f"{call_name(fn)}: ranks disagree on {what} ({listing})")


def fail_together(error: Exception, group: Group = None, device: torch.device | None = None) -> None:
    """Raise ``error`` here, and a ``RuntimeError`` on every other rank waiting in a collective of this module.

    Call it on a rank that found a problem (bad input, say) where the other ranks are about to call
    :func:`gather_all_tensors`, :func:`all_gather_cat` or :func:`all_reduce`: it takes part in their metadata
    exchange with a failure marker, so no rank is left waiting. Without a process group it just raises.
    ``device``: where the peers' buffers live (default: the backend's, the current GPU for NCCL).
    """
    world = group_size(group)

    def join() -> None:
        exchange("fail_together", [], group, failed=True)

    fail_on_every_rank(error, world, join)


def _gather_table(tensor: torch.Tensor, meta: _Meta, group: Group, rank: int, grad: str) -> torch.Tensor:
    """Every rank's ``tensor`` (any shapes), flattened and padded to the widest: ``(W, width)``."""
    world, width = len(meta.peers), meta.width
    flat = tensor.reshape(-1)
    if width > flat.numel():
        flat = (
            F.pad(flat, (0, width - flat.numel()))
            if flat.is_floating_point() or flat.is_complex()
            else (torch.cat([flat, flat.new_zeros(width - flat.numel())]))
        )
    if _wants_grad(tensor, grad):
        table = AllGatherFlat.apply(flat, group, rank, world, grad)
    else:
        table = flat.detach().new_empty(world * width)
        all_gather_flat(table, flat.detach().contiguous(), group)
        table = table.view(world, width)
    return table


def _gather_slots(tensor: torch.Tensor, meta: _Meta, group: Group, rank: int, grad: str) -> list[torch.Tensor]:
    """Gather ``tensor`` from every rank (any shapes) into a list of per-rank tensors."""
    table = _gather_table(tensor, meta, group, rank, grad)
    if meta.uniform:  # one view and one C-level split, whatever the world size
        return list(table.view(len(meta.peers), *meta.shape0).unbind(0))
    return [table[i, :n].view(p.shape) for i, (n, p) in enumerate(zip(meta.numels, meta.peers))]


def _passthrough(tensor: torch.Tensor, grad: str) -> torch.Tensor:
    return tensor.detach() if grad == "none" else tensor


def gather_all_tensors(tensor: torch.Tensor, group: Group = None, *, grad: str = "local") -> list[torch.Tensor]:
    """Gather ``tensor`` from every rank of ``group``; shapes may differ in every dimension.

    Args:
        tensor: the local tensor. Every rank must pass the same ``ndim`` and dtype; sizes may differ,
            including zero-size and 0-d tensors.
        group: the process group (default ``None``: the default group). Element ``i`` of the result is the
            tensor of group rank ``i``.
        grad: one of :data:`GRAD_MODES`: ``"none"`` detaches the result; ``"local"`` (default) lets a rank's
            own slot carry gradient to its own input, with no communication in backward; ``"sync"`` sums every
            rank's gradient for each slot and delivers it to the slot's owner (every rank must then run the
            backward).

    Returns:
        A list with one tensor per rank of ``group``, each of its rank's shape and of the common dtype. Without an
        initialised process group or with one rank, the one-element list ``[tensor]`` (detached when ``grad="none"``);
        no collective is called. Making ``W`` tensors costs host time in proportion to ``W`` (about 3 ms at 4096
        ranks): at scale :func:`all_gather_cat`, which returns one tensor, is the cheaper call.

    Raises:
        TypeError: ``tensor`` is not a tensor or has an unsupported dtype.
        ValueError: bad ``grad``, or this process is not a member of ``group``.
        RuntimeError: on every rank, when ranks disagree on ndim, dtype or grad mode, or when
            ``grad="sync"`` and only some ranks' inputs require gradient.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.distributed import gather_all_tensors
        >>> gather_all_tensors(torch.tensor([1.0, 2.0]))  # not distributed: the local tensor
        [tensor([1., 2.])]
    """
    world, rank = group_size(group), group_rank(group)
    problem = _local_problem("gather_all_tensors", tensor, grad, _NO_OP)
    if world == 1:
        if problem is not None:
            raise problem
        return [_passthrough(tensor, grad)]
    return _gather_across(tensor, group, world, rank, grad, problem)


@outside_graph  # peers' sizes become this rank's shapes: host code, so one graph break when compiled
def _gather_across(
    tensor: torch.Tensor, group: Group, world: int, rank: int, grad: str, problem: Exception | None
) -> list[torch.Tensor]:
    meta = _exchange_metadata("gather_all_tensors", tensor, group, world, grad, problem=problem)
    return _gather_slots(tensor, meta, group, rank, grad)


def all_gather_cat(tensor: torch.Tensor, group: Group = None, *, grad: str = "local") -> torch.Tensor:
    """Gather ``tensor`` from every rank and concatenate along dim 0, in rank order.

    Ranks may hold different numbers of rows (zero included); the trailing dimensions must agree. A 0-d
    tensor counts as one row.

    Args:
        tensor: the local rows ``(n_r, *trailing)``, of any dtype the backend sends; ``n_r`` may differ between
            ranks.
        group: the process group (default ``None``: the default group).
        grad: ``"none"``, ``"local"`` (default) or ``"sync"``, as in :func:`gather_all_tensors`.

    Returns:
        The concatenation of every rank's rows, ``(Σ n_r, *trailing)`` in the input's dtype; the local tensor
        (as rows: a 0-d tensor becomes shape ``(1,)``) when not distributed, without a collective.

    Raises:
        TypeError: ``tensor`` is not a tensor or has an unsupported dtype.
        ValueError: bad ``grad``, or this process is not a member of ``group``.
        RuntimeError: on every rank, when ranks disagree on ndim, dtype, trailing dimensions or grad mode.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.distributed import all_gather_cat
        >>> all_gather_cat(torch.ones(2, 3)).shape
        torch.Size([2, 3])
    """
    world, rank = group_size(group), group_rank(group)
    problem = _local_problem("all_gather_cat", tensor, grad, _NO_OP)
    if problem is None:
        tensor = _reductions.as_rows(tensor)
    if world == 1:
        if problem is not None:
            raise problem
        return _passthrough(tensor, grad)
    return _cat_across(tensor, group, world, rank, grad, problem)


@outside_graph  # as _gather_across
def _cat_across(
    tensor: torch.Tensor, group: Group, world: int, rank: int, grad: str, problem: Exception | None
) -> torch.Tensor:
    meta = _exchange_metadata("all_gather_cat", tensor, group, world, grad, problem=problem)
    table = _gather_table(tensor, meta, group, rank, grad)
    rows, trailing = meta.rows_total, meta.shape0[1:]
    if meta.uniform:  # every rank's rows are the table's rows: a view, whatever the world size
        return table.view(rows, *trailing)
    return table.reshape(-1).index_select(0, meta.index(table.device)).view(rows, *trailing)


def _check_op_dtype(op: str, dtype: torch.dtype) -> None:
    conflict = _reductions.dtype_conflict(op, dtype)
    if conflict == _reductions.NO_COMPLEX_ORDER:
        raise ValueError(f"all_reduce: op={op!r} is not defined for complex `tensor` (dtype {dtype})")
    if conflict == _reductions.MEAN_NEEDS_FLOAT:
        raise ValueError(f"all_reduce: op='mean' needs a floating-point `tensor`; got dtype {dtype}")
    if conflict == _reductions.NO_BOOL_SUM:
        raise ValueError(f"all_reduce: op={op!r} is not defined for bool `tensor`; use 'max' (any) or 'min' (all)")


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Group = None, *, grad: str = "local") -> torch.Tensor:
    """Reduce ``tensor`` elementwise across the ranks of ``group``; the input is not modified.

    Args:
        tensor: the local tensor; the same shape and dtype on every rank.
        op: one of :data:`REDUCE_OPS`: ``"sum"`` (default), ``"mean"``, ``"min"`` or ``"max"``. For
            ``min``/``max`` the gradient goes only to the rank(s) holding the extremum, split evenly between
            ties.
        group: the process group (default ``None``: the default group).
        grad: ``"none"``, ``"local"`` (default: a rank's gradient is ``∂L_r/∂x_r`` of its own loss) or
            ``"sync"`` (every rank's gradient is summed: ``Σ_r' ∂L_r'/∂x_r``).

    Returns:
        The reduced tensor, of the input's shape and dtype, identical on every rank; the input itself (detached
        when ``grad="none"``) without an initialised process group or with one rank, no collective.

    Raises:
        ValueError: unknown ``op``/``grad``; ``"mean"`` of a non-floating tensor; ``"sum"`` of bools.
        RuntimeError: on every rank, when ranks disagree on shape, dtype, op or grad mode.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.distributed import all_reduce
        >>> all_reduce(torch.tensor([1.0, 5.0]), op="max")
        tensor([1., 5.])
    """
    world = group_size(group)
    group_rank(group)
    problem = _local_problem("all_reduce", tensor, grad, op)
    if world == 1:
        if problem is not None:
            raise problem
        _check_op_dtype(op, tensor.dtype)
        return _passthrough(tensor, grad)
    return _reduce_across(tensor, op, group, world, grad, problem)


@outside_graph  # the header exchange (every rank raises alike on a mismatch) is host code: one graph break
def _reduce_across(
    tensor: torch.Tensor, op: str, group: Group, world: int, grad: str, problem: Exception | None
) -> torch.Tensor:
    inline = _inline_bytes(tensor, group) if problem is None else None
    want = _row_bytes(tensor) if problem is None else 0  # (a larger CPU tensor grows the area for the next calls)
    meta = _exchange_metadata(
        "all_reduce", tensor, group, world, grad, op=op, problem=problem, inline=inline, want=want
    )
    _check_op_dtype(op, tensor.dtype)  # dtypes agree by now: every rank raises alike
    wants = meta.wants  # min/max tie counting is a collective: decide globally
    if inline is not None:  # every rank's tensor came with the header: each rank reduces the rows itself
        _, table = inline_buffers(group, inline[1])
        rows = table[:, : tensor.numel() * tensor.element_size()].view(tensor.dtype).view(world, *tensor.shape)
        track = wants and grad != "none" and _wants_grad(tensor, grad)
        return ReduceRows.apply(tensor if track else tensor.detach(), rows, op, group, world, grad)
    if wants and grad != "none" and (tensor.is_floating_point() or tensor.is_complex()):
        return AllReduce.apply(tensor if _wants_grad(tensor, grad) else tensor.detach(), op, group, world, grad, True)
    with torch.no_grad():
        source = _reductions.wire_view(tensor)
        return AllReduce.apply(source.detach(), op, group, world, grad, False).view(tensor.dtype)
