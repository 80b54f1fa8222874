"""Record the collectives a block of code issues: ``torch.distributed``'s functions (collectives and
point-to-point), the backend's captured flat ones, and the functional collectives.

One log entry per call the package makes: a wrapped function that another wrapped function calls
(``batch_isend_irecv`` posting its ``isend``/``irecv``, ``all_gather_object`` calling ``all_gather``) is not
logged again, so a ring exchange is one ``"batch_isend_irecv"`` entry however many tensors it posts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from torchmetrics_diff.distributed import _backend, _hosts

_DIST_NAMES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    # point-to-point: the ring's exchanges are batch_isend_irecv
    "batch_isend_irecv",
    "isend",
    "irecv",
    "send",
    "recv",
    "send_object_list",
    "recv_object_list",
)
# torch.distributed._functional_collectives (traced under torch.compile, callable eagerly)
_FUNCOL_NAMES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
)


def _tensor_bytes(args: tuple, kwargs: dict) -> list[int]:
    """The bytes of every tensor among a call's arguments (a list of tensors counts each), in argument order."""
    found = []
    for arg in (*args, *kwargs.values()):
        for item in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(item, torch.Tensor):
                found.append(item.numel() * item.element_size())
    return found


@contextmanager
def record_collectives(
    on_call: Callable[[str], Any] | None = None, sizes: list[tuple[str, list[int]]] | None = None
) -> Iterator[list[str]]:
    """Wrap the collectives and point-to-point operations; yield the call log (one name per outermost call).

    ``torch.distributed``'s functions are replaced both where the package looks them up (``torch.distributed``)
    and inside ``distributed_c10d``, whose own checks compare against its globals (``P2POp`` accepts only its
    ``isend``/``irecv``). ``on_call`` replaces the collective when given (outside a process group, where any
    call is a failure). With ``sizes``, each logged call also appends ``(name, bytes of each tensor argument)``
    to it (an all-gather's output and input, an all-reduce's one tensor). The originals are restored on exit.
    """
    log: list[str] = []
    saved: list[tuple[Any, str, Any]] = []
    wrappers: dict[tuple[int, str], Any] = {}  # (id(original), name) -> its wrapper, shared by the modules holding it
    depth = [0]

    def wrap(owner: Any, attr: str, name: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        wrapper = wrappers.get((id(original), name))
        if wrapper is None:

            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if depth[0]:  # called by another wrapped function: part of that call
                    return original(*args, **kwargs)
                log.append(name)
                if sizes is not None:
                    sizes.append((name, _tensor_bytes(args, kwargs)))
                if on_call is not None:
                    return on_call(name)
                depth[0] += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    depth[0] -= 1

            wrappers[(id(original), name)] = wrapper
        saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    for name in _DIST_NAMES:
        wrap(dist, name, name)
        wrap(distributed_c10d, name, name)
    wrap(_backend, "_all_gather_flat", "_all_gather_flat")
    wrap(_backend, "_reduce_scatter_flat", "_reduce_scatter_flat")
    wrap(_hosts, "all_gather", "_all_gather_flat")  # a call header's full exchange (over the group or its twin)
    wrap(_hosts, "max_reduce", "host_max_reduce")
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:  # pragma: no cover - every supported torch has it
        funcol = None
    if funcol is not None:
        for name in _FUNCOL_NAMES:
            wrap(funcol, name, f"funcol.{name}")
    try:
        yield log
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
