"""``torch.compile`` support: what Dynamo traces, and the few places where the package steps out of the graph.

Three tools, used by the collectives, the sync engine, the metric lifecycle and the losses
(docs/guide/compile.rst has the whole picture):

- :func:`compiling`: ``True`` while Dynamo traces (a constant in the traced code, so a branch on it costs
  nothing in the graph) and ``False`` in eager mode (one cheap call).
- :func:`outside_graph`: the wrapped function runs eagerly, as one graph break, when a compiled region calls it,
  and is an ordinary call in eager mode. For the collectives that need a host round trip: the metadata
  exchange of a gather of uneven shapes (peers' sizes become this rank's shapes) and the sync engine (whose
  plans, bytes and validation are Python). Nothing the wrapped function does becomes a guard of the caller.
- :func:`sum_across_ranks`: a sum all-reduce through ``torch.distributed._functional_collectives`` when
  compiling (traced into the graph: no break), through the eager backend otherwise. Its backward all-reduces
  the gradient (the ``grad="sync"`` adjoint), in both modes.
"""

from __future__ import annotations

import collections
import functools
import types
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from torchmetrics_diff.distributed._autograd import AllReduce
from torchmetrics_diff.distributed._backend import Group

F = TypeVar("F", bound=Callable[..., Any])

compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)


def outside_graph(fn: F) -> F:
    """``fn`` itself in eager mode; called from a compiled region, ``fn`` runs eagerly behind one graph break.

    The disabled version of ``fn`` (``torch.compiler.disable``) is made on each compiled call: at import it
    would import Dynamo with the package (seconds). And ``torch.compiler.disable`` alone would cost its frame
    switch on every eager call; the :func:`compiling` branch keeps the eager path a plain call.

    Example:
        >>> import torch
        >>> @outside_graph
        ... def host_side(x):
        ...     return x.tolist()  # would be a graph break anyway
        >>> host_side(torch.tensor([1, 2]))
        [1, 2]
    """

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return torch.compiler.disable(_host, recursive=True)(fn, args, kwargs)
        return fn(*args, **kwargs)

    # Dynamo caches the frames it compiles (the one resuming here after the break, too) per code object and counts
    # its recompile limit per code object: every wrapper gets a code object of its own, so that a compiled step
    # calling many of them does not pile their frames onto one
    code = wrapper.__code__.replace(co_name=f"outside_graph_{fn.__name__}")
    own = types.FunctionType(code, wrapper.__globals__, code.co_name, wrapper.__defaults__, wrapper.__closure__)
    return functools.wraps(fn)(own)  # type: ignore[return-value]


#: how many times each :func:`outside_graph` function ran from compiled code, by name: the host round trips of
#: compiled steps (the tests compare them with the documented break points)
HOST_ROUND_TRIPS: collections.Counter = collections.Counter()


def _host(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    HOST_ROUND_TRIPS[fn.__qualname__] += 1
    return fn(*args, **kwargs)


def _funcol_group(group: Group) -> Any:
    """The group as functional collectives take it (they have no ``None`` for the default group)."""
    return dist.group.WORLD if group is None else group


def sum_across_ranks(tensor: torch.Tensor, group: Group, world: int) -> torch.Tensor:
    """The elementwise sum of ``tensor`` over the ranks of ``group``; a new tensor, the input is unchanged.

    Every rank must pass the same shape and dtype: no metadata round checks them, so callers use it only for
    tensors whose shape and dtype are fixed by construction (two float64 totals, say). The gradient of every
    rank is summed and delivered to every rank (``grad="sync"``); detach the input when no gradient is wanted.

    Under ``torch.compile`` this is ``torch.distributed._functional_collectives.all_reduce``, traced into the
    graph; in eager mode the package's own all-reduce with the same backward.

    Example:
        >>> import torch
        >>> sum_across_ranks(torch.tensor([1.0, 2.0]), None, 1)  # one process: the input
        tensor([1., 2.])
    """
    if world == 1:
        return tensor
    if compiling():
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_reduce(tensor, "sum", _funcol_group(group))
    if tensor.requires_grad and torch.is_grad_enabled():
        return AllReduce.apply(tensor, "sum", group, world, "sync", False)
    return AllReduce.apply(tensor.detach(), "sum", group, world, "none", False)
