"""Thin, version-aware access to ``torch.distributed``: who am I, how many are we, which collective to call.

Everything that depends on the torch version or the backend is decided here, once, at import time, so the
rest of the package calls one function per operation and never probes ``torch.distributed`` itself.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from torchmetrics_diff.distributed._failure import Board, backend_error
from torchmetrics_diff.distributed._groups import known, state_of
from torchmetrics_diff.distributed._reductions import wire_view

Group = Optional[Any]  # a ``ProcessGroup`` or ``None`` for the default (WORLD) group


def _bind_torch_nn_defaults() -> None:
    """Import ``torch.distributed.nn.functional`` now, while no process group exists.

    That module writes ``group=group.WORLD`` in ten functions' signatures, so the default group it finds at its first
    import stays referenced by their default arguments for the life of the process. torch imports it lazily: the
    first ``DistributedDataParallel`` loads Dynamo, which loads it. Then ``destroy_process_group()`` cannot free the
    group, gloo's worker threads outlive it, and one that drops a finished collective's tensors after the interpreter
    began shutting down aborts a process that had done its work (docs/guide/failure_modes.rst, "Shutting down").
    Imported before ``init_process_group``, the defaults are ``None``. Imported after, it would capture the group
    itself, so it is left alone then.
    """
    if dist.is_available() and not dist.is_initialized():
        import torch.distributed.nn.functional  # noqa: F401


_bind_torch_nn_defaults()

# torch 2.13 renamed the flat-buffer collectives; older releases only have the first spelling.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_REDUCE_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX"}  # (never written; Dynamo cannot read a mappingproxy)

# Switching autograd off and on for one sync. ``torch.no_grad()`` does the same through several Python layers,
# which are slow right after a collective (docs/guide/sync_engine.rst, "Waiting"); the C toggle it
# ends in has been there since torch 1.0, and the public function is the fallback.
grad_enabled = torch.is_grad_enabled
set_grad_enabled = getattr(torch._C, "_set_grad_enabled", None) or torch.set_grad_enabled

# Stable integer codes so dtypes can travel inside an int64 metadata tensor. Append only.
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}  # (never written, as _REDUCE_OPS)


def dtype_code(dtype: torch.dtype) -> int:
    """Return the wire code of ``dtype``; raise ``TypeError`` naming it when it cannot be synced."""
    try:
        return _DTYPE_CODE[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be communicated; supported: {list(_DTYPES)}") from None


def dtype_from_code(code: int) -> torch.dtype:
    """Inverse of :func:`dtype_code`."""
    return _DTYPES[code]


def is_distributed() -> bool:
    """``True`` when ``torch.distributed`` is available and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def _default_group() -> Any:
    """The default process group, or ``None`` when not running distributed (one attribute read)."""
    return dist.GroupMember.WORLD if dist.is_available() else None


def _group_shape(group: Group) -> tuple[int, int]:
    """``(size, rank)`` of ``group`` for this process; ``(1, 0)`` when not distributed; negative when not a
    member.

    Read from the group's state (:mod:`._groups`): a group's size and this process's rank in it never change, and
    every sync asks for both; asking torch.distributed each time is slow right after a collective (its Python is
    then out of the CPU's caches).
    """
    world = _default_group()
    if world is None:
        return 1, 0
    pg = world if group is None else group
    if torch.compiler.is_compiling():  # Dynamo folds these two calls into constants; it cannot trace id()/weakref
        return dist.get_world_size(pg), dist.get_rank(pg)
    state = known(pg)
    if state is not None:
        return state.size, state.rank
    try:
        state = state_of(pg)
    except ValueError:  # not a member: nothing kept
        return dist.get_world_size(pg), dist.get_rank(pg)
    return state.size, state.rank


def group_size(group: Group = None) -> int:
    """Number of ranks in ``group``; 1 when not running distributed.

    Raises:
        ValueError: when this process is not a member of ``group`` (its size is unknown here, and a metric
            that went on with its local value would silently disagree with the group).
    """
    size = _group_shape(group)[0]
    if size < 0:
        group_rank(group)  # raises, naming the group's members
    return size


def default_device(group: Group = None) -> torch.device:
    """Where a collective's buffers must live when no tensor says: the current GPU for NCCL, else the CPU."""
    if is_distributed() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_rank(group: Group = None) -> int:
    """This process's rank *within* ``group``.

    Raises:
        ValueError: when this process is not a member of ``group``.
    """
    rank = _group_shape(group)[1]
    if rank < 0:
        members = dist.get_process_group_ranks(group)
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of `group` (its global ranks are {members}); "
            "call the collective only on ranks that belong to the group"
        )
    return rank


# How long the caller of a collective on CPU tensors polls for its completion, yielding the CPU between polls,
# before it blocks in ``Work.wait()``. A blocked thread is put to sleep and woken when the backend's thread
# finishes; on a busy or virtualised machine that sleep/wake can cost as much as a small collective itself
# (docs/guide/sync_engine.rst, "Waiting"). Polling is bounded, so a rank that waits for a slow peer stops using
# the CPU after this long.
_POLL_S = 0.002
_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))
# After that, a wait reads its group's board (_failure.Board) every _READ_S once it has waited _READ_AFTER_S: a
# peer that saw a rank leave is then heard within about that long, not after the group's timeout.
_READ_AFTER_S, _READ_S = 0.05, 0.1


def board_of(group: Group) -> Board | None:
    """The notice board of ``group`` (its host, once a call exchanged a header on it), else ``None``."""
    state = known(_default_group() if group is None else group)
    return None if state is None else state.host


def _wait(work: Any, tensor: torch.Tensor, board: Board | None = None) -> None:
    """Wait for an asynchronous collective: poll then block on the CPU, just ``wait()`` on accelerators.

    A CUDA work is not polled: ``wait()`` only orders the current stream after it, and polling would make the
    CPU wait for the GPU.
    """
    if work is None:  # a replaced collective (tests) that returned nothing
        return
    if tensor.device.type == "cpu":
        deadline = time.perf_counter() + _POLL_S
        while not work.is_completed() and time.perf_counter() < deadline:
            _yield()
        if board is not None and not work.is_completed():
            _watch(work, board)
    work.wait()


def _watch(work: Any, board: Board) -> None:
    """Wait for ``work`` to end (the backend's timeout ends it too), reading ``board`` every :data:`_READ_S` once it
    has waited :data:`_READ_AFTER_S`; raise the :class:`PeerLeftError` a peer posted there. Only a work with a
    future is watched (gloo's all-reduce and all-gathers; its ``wait`` with a timeout would close the group's
    connections); another is waited for as it is."""
    try:
        future = work.get_future()
    except RuntimeError:  # (gloo's reduce-scatter and point-to-point works have none)
        return
    ended = threading.Event()
    future.add_done_callback(lambda _: ended.set())
    pause = _READ_AFTER_S
    while not ended.wait(pause):
        if board.read() is not None:
            raise board.departed(None, "", notice=True)
        pause = _READ_S


def all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: Group = None) -> None:
    """``out[i * n:(i + 1) * n] = inp`` of rank ``i``, for 1-D ``inp`` of ``n`` elements on every rank."""
    if inp.dtype == torch.bool:  # not every backend reduces or gathers bool; bytes always travel
        out, inp = wire_view(out), wire_view(inp)
    try:
        _wait(_all_gather_flat(out, inp, group=group, async_op=True), inp, board_of(group))
    except RuntimeError as err:
        raise backend_error("all_gather", err, None, board_of(group)) from err


def reduce_scatter_flat(out: torch.Tensor, inp: torch.Tensor, group: Group = None) -> None:
    """``out`` = the ``rank``-th of ``W`` equal chunks of the elementwise sum of every rank's ``inp``."""
    try:
        _wait(_reduce_scatter_flat(out, inp, op=dist.ReduceOp.SUM, group=group, async_op=True), inp, board_of(group))
    except RuntimeError as err:
        raise backend_error("reduce_scatter", err, None, board_of(group)) from err


def all_reduce_(tensor: torch.Tensor, op: str, group: Group = None) -> None:
    """In-place all-reduce of ``tensor`` with ``op`` in ``{"sum", "min", "max"}``."""
    try:
        work = dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]), group=group, async_op=True)
        _wait(work, tensor, board_of(group))
    except RuntimeError as err:
        raise backend_error("all_reduce", err, None, board_of(group)) from err
