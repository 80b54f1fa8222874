"""A simulated large world: a ``torch.distributed`` backend of W identical ranks inside one process.

This process is rank 0 (by default) of a group of ``W`` ranks that all hold the same data and make the same
calls, so every collective's result follows from this rank's input alone and nothing travels:

* all-gather (``all_gather``, ``all_gather_into_tensor``/``all_gather_single``, their coalesced forms): the input
  in every slot;
* all-reduce: ``SUM`` multiplies by ``W`` (``bool``: unchanged), ``AVG``/``MIN``/``MAX``/``BAND``/``BOR`` leave
  the tensor as it is, ``PRODUCT`` raises it to the power ``W``, ``BXOR`` zeroes it when ``W`` is even;
* reduce-scatter: this rank's chunk of the input, reduced with itself ``W`` times (``SUM``: ``W`` times it);
* broadcast, barrier: nothing to do; gather/scatter/reduce: as the all-gather, a chunk copy, an all-reduce;
* all-to-all: every rank sends this rank the chunk this rank sends to its own position, so every output chunk is
  the input's chunk at this rank's index;
* send/recv (and ``isend``/``irecv``, ``batch_isend_irecv``): what a peer sends this rank equals what this rank
  sends its peer, so a receive takes the oldest not-yet-received tensor this rank sent with the same tag (from
  any peer). A receive posted before its send completes when the send is posted; waiting on it before then
  raises (a real world would hang).

Every operation runs at once and returns a completed :class:`torch.distributed.Work`. Tensors of any dtype work
(the data is copied, never reduced across dtypes). The backend declares the CPU only.

The point is to run a package's whole host path (its Python, header exchanges, planning, packing) at the world
sizes users run, 64 to 4096 ranks, and time it, with no network: the times are host work per call, not
communication.

Usage::

    with sim_world(4096) as world:  # init_process_group("simworld", rank=0, world_size=4096, store=HashStore())
        ...                         # any torch.distributed code; world.group is the default group
    # destroyed on exit

Inside :func:`sim_world`, ``torch.distributed.new_group(..., backend="gloo")`` makes a simulated group instead
(gloo cannot connect to 4095 peers that do not exist; it would wait for them until its timeout). A library that
sends its small CPU exchanges over a gloo twin of a group whose backend it does not recognise by name therefore
gets a simulated twin; :attr:`SimWorld.twins` counts them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

NAME = "simworld"
ReduceOp = dist.ReduceOp
_RED = ReduceOp.RedOpType


# --------------------------------------------------------------------------------------------------- works
class SimWork(dist.Work):
    """A completed operation (or a receive that waits for its send): ``is_completed()``/``wait()`` are ``True``.

    ``result()`` and ``get_future()`` give the operation's output tensors, as torch's backends do.
    """

    def __init__(self, result: list[torch.Tensor] | None = None, source: int = -1) -> None:
        super().__init__()
        self._result = result if result is not None else []
        self._source = source
        self._done = True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def exception(self) -> Any:
        return None

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            raise RuntimeError(
                "simworld: waiting on a receive whose tensor was never sent; in a world of identical ranks a peer "
                "sends this rank what this rank sends its own peer (a real world would hang here)"
            )
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def source_rank(self) -> int:
        return self._source

    def _source_rank(self) -> int:
        return self._source


# ------------------------------------------------------------------------------------------------- reduce
def _reduce_same(tensor: torch.Tensor, op: Any, world: int) -> None:
    """``tensor`` <- the reduction with ``op`` of ``world`` copies of it, in place."""
    kind = op.op if isinstance(op, ReduceOp) else op
    t = tensor.detach()
    if kind == _RED.SUM:
        if t.dtype != torch.bool:  # (a sum of bools is their OR)
            t.mul_(world)
    elif kind == _RED.PRODUCT:
        if t.dtype != torch.bool:
            t.pow_(world)
    elif kind == _RED.BXOR:
        if world % 2 == 0:
            t.zero_()
    elif kind in (_RED.AVG, _RED.MIN, _RED.MAX, _RED.BAND, _RED.BOR):
        pass
    else:
        raise NotImplementedError(f"simworld: reduce op {kind} is not simulated")


# dtypes NumPy holds: their broadcast copy runs through NumPy, several times faster than torch's on one thread
_NUMPY = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
}


def _fill(out: torch.Tensor, inp: torch.Tensor, world: int) -> None:
    """``out`` (``world`` slots of ``inp``'s elements, flat or stacked) <- ``inp`` in every slot."""
    out = out.detach()
    src = inp.detach().reshape(1, -1)
    if not out.is_contiguous():
        out.copy_(src.expand(world, -1).reshape(out.shape))
    elif out.dtype in _NUMPY and src.dtype == out.dtype and out.device.type == "cpu" and not src.is_conj():
        out.view(world, -1).numpy()[:] = src.resolve_neg().numpy()
    else:
        out.view(world, -1).copy_(src)


def _chunk(inp: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """This rank's chunk of ``inp`` (``world`` equal chunks along its flat elements)."""
    return inp.detach().reshape(world, -1)[rank]


# --------------------------------------------------------------------------------------------------- group
class SimGroup(dist.ProcessGroup):
    """A process group of ``world_size`` identical ranks, this process being ``rank`` of them."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self._rank = rank
        self._world = world_size
        self._sent: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._waiting: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def size(self) -> int:
        return self._world

    def rank(self) -> int:
        return self._rank

    def getBackendName(self) -> str:  # (torch's spelling)
        return NAME

    def __repr__(self) -> str:
        return f"SimGroup(rank={self._rank}, world_size={self._world})"

    # -------------------------------------------------------------------------------------- all-reduce
    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        for t in tensors:
            _reduce_same(t, op, self._world)
        return SimWork(list(tensors))

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        if opts is None or opts.rootRank == self._rank:
            return self.allreduce(tensors, opts)
        return SimWork(list(tensors))

    # -------------------------------------------------------------------------------------- all-gather
    def allgather(
        self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        for slots, inp in zip(outputs, inputs):
            src = inp.detach()
            for slot in slots:
                slot.detach().copy_(src)
        return SimWork([t for slots in outputs for t in slots])

    def allgather_coalesced(
        self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> SimWork:
        _fill(output, inp, self._world)
        return SimWork([output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        for out, inp in zip(outputs, inputs):
            _fill(out, inp, self._world)
        return SimWork(list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        if opts is None or opts.rootRank == self._rank:
            return self.allgather(outputs, inputs, opts)
        return SimWork()

    # ---------------------------------------------------------------------------------- reduce-scatter
    def reduce_scatter(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        for out, chunks in zip(outputs, inputs):
            out.detach().copy_(chunks[self._rank].detach())
            _reduce_same(out, op, self._world)
        return SimWork(list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> SimWork:
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        output.detach().view(-1).copy_(_chunk(inp, self._world, self._rank))
        _reduce_same(output, op, self._world)
        return SimWork([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None
    ) -> SimWork:
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)
        return SimWork(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------------------------ broadcast, scatter
    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        return SimWork(list(tensors))

    def scatter(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]], opts: Any = None
    ) -> SimWork:
        for out, chunks in zip(outputs, inputs):  # (the root's list; every rank's is the same)
            if chunks:
                out.detach().copy_(chunks[self._rank].detach())
        return SimWork(list(outputs))

    def barrier(self, opts: Any = None) -> SimWork:
        return SimWork()

    # --------------------------------------------------------------------------------------- all-to-all
    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None) -> SimWork:
        mine = inputs[self._rank].detach()
        for out in outputs:
            out.detach().copy_(mine)
        return SimWork(list(outputs))

    def alltoall_base(
        self,
        output: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> SimWork:
        world = self._world
        in_sizes = list(input_split_sizes) or [inp.shape[0] // world] * world
        out_sizes = list(output_split_sizes) or [output.shape[0] // world] * world
        start = sum(in_sizes[: self._rank])
        mine = inp.detach()[start : start + in_sizes[self._rank]]
        for piece, n in zip(output.detach().split(out_sizes), out_sizes):
            if n != mine.shape[0]:
                raise RuntimeError(
                    f"simworld: all_to_all_single receives {n} rows from a peer that sends "
                    f"{mine.shape[0]} (identical ranks send every rank the same split)"
                )
            piece.copy_(mine)
        return SimWork([output])

    all_to_all_single = alltoall_base

    # -------------------------------------------------------------------------------------- point to point
    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        with self._lock:
            sent, waiting = self._sent[tag], self._waiting[tag]
            for t in tensors:
                data = t.detach().clone()
                if waiting:  # a receive posted before this send
                    work, slot = waiting.popleft()
                    _deliver(slot, data)
                    work._done = True
                else:
                    sent.append(data)
        return SimWork(list(tensors))

    def _receive(self, tensors: Sequence[torch.Tensor], tag: int, source: int) -> SimWork:
        with self._lock:
            sent = self._sent[tag]
            if len(tensors) == 1 and not sent:  # wait for this rank's next send with the tag
                work = SimWork(list(tensors), source)
                work._done = False
                self._waiting[tag].append((work, tensors[0]))
                return work
            for t in tensors:
                if not sent:
                    raise RuntimeError(f"simworld: receive (tag {tag}) with no tensor sent to match it")
                _deliver(t, sent.popleft())
        return SimWork(list(tensors), source)

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        return self._receive(tensors, tag, src)

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> SimWork:
        return self._receive(tensors, tag, (self._rank - 1) % self._world)

    def pending(self) -> int:
        """Tensors sent and not yet received plus receives not yet matched (0 after balanced traffic)."""
        return sum(len(q) for q in self._sent.values()) + sum(len(q) for q in self._waiting.values())


def _deliver(slot: torch.Tensor, data: torch.Tensor) -> None:
    if slot.shape != data.shape or slot.dtype != data.dtype:
        raise RuntimeError(
            f"simworld: a receive of {tuple(slot.shape)} {slot.dtype} matched a send of {tuple(data.shape)} "
            f"{data.dtype} (identical ranks: a rank receives what it sends)"
        )
    slot.detach().copy_(data)


# --------------------------------------------------------------------------------------------- registration
def _create(common_opts: Any, backend_opts: Any = None) -> SimGroup:
    return SimGroup(common_opts.group_rank, common_opts.group_size)


def register() -> None:
    """Register the ``"simworld"`` backend (CPU only) with torch.distributed; a second call does nothing."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def unregister() -> None:
    """Undo :func:`register`: torch's backend tables as they were before it."""
    backend = dist.Backend
    backend._plugins.pop(NAME.upper(), None)
    backend.backend_capability.pop(NAME, None)
    backend.backend_type_map.pop(NAME, None)
    if NAME in backend.backend_list:
        backend.backend_list.remove(NAME)
    for device, name in list(backend.default_device_backend_map.items()):
        if name == NAME:
            del backend.default_device_backend_map[device]
    if getattr(backend, NAME.upper(), None) == NAME:
        delattr(backend, NAME.upper())


@dataclass
class SimWorld:
    """What :func:`sim_world` made: the default group, and how many gloo groups it simulated (see the module)."""

    world_size: int
    rank: int
    group: Any = None
    twins: list[Any] = field(default_factory=list)


@contextmanager
def _gloo_groups_simulated(world: SimWorld) -> Iterator[None]:
    original: Callable[..., Any] = dist.new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[2] if len(args) > 2 else None)
        if backend is not None and "gloo" in str(backend):
            if len(args) > 2:
                args = (*args[:2], NAME, *args[3:])
            else:
                kwargs["backend"] = NAME
            group = original(*args, **kwargs)
            world.twins.append(group)
            return group
        return original(*args, **kwargs)

    dist.new_group = new_group
    try:
        yield
    finally:
        dist.new_group = original


@contextmanager
def sim_world(world_size: int, rank: int = 0) -> Iterator[SimWorld]:
    """A default process group of ``world_size`` identical ranks, this process being ``rank``; destroyed on exit.

    Raises:
        RuntimeError: a process group is already initialised.
    """
    if dist.is_initialized():
        raise RuntimeError("sim_world: a process group is already initialised in this process")
    register()
    world = SimWorld(world_size, rank)
    dist.init_process_group(NAME, rank=rank, world_size=world_size, store=dist.HashStore())
    try:
        world.group = dist.group.WORLD
        with _gloo_groups_simulated(world):
            yield world
    finally:
        dist.destroy_process_group()
