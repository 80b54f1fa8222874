"""Counting host round trips: the calls that make the host wait until the device has caught up.

:func:`counting` replaces, for the duration of a ``with`` block, the ``Tensor`` methods that read a value back to
the host (``tolist``, ``item``, ``__bool__``, ``cpu``, ``numpy``, ``__int__``, ``__float__``, ``__index__``) and
the operations whose output shape depends on the data (``torch.unique``, ``torch.bincount``, ``nonzero``,
``masked_select``, indexing with a bool mask) by wrappers that count their calls. On the CPU those calls cost
nothing, but on a GPU each one drains the launch queue: counting them on the CPU tells what a GPU step would pay.

It does not see host-to-device copies of host data (``torch.tensor(..., device=...)``, ``.to(device)`` of a CPU
tensor), which synchronize on a GPU too; on the CPU they are no-ops. Used by the tests and by the benchmarks.

One read is not counted: the call header's (``distributed._call._host_rows``), which reads a CPU tensor built from
host values and gathered over a CPU-capable group, so on a GPU it waits for no device either. The counter checks
that claim every time instead of trusting it: the header must be read through a NumPy view (which only host memory
has), and inside it any read of a tensor that is not on the CPU fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from torchmetrics_diff.distributed import _call

#: ``Tensor`` methods that read device data back to the host
READS = ("tolist", "item", "__bool__", "cpu", "numpy", "__int__", "__float__", "__index__")
#: operations with a data-dependent output shape (the host learns the shape from the device)
DATA_SHAPED = ("unique", "bincount", "nonzero", "masked_select")


def _is_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class _MaskIndexing(TorchFunctionMode):
    """Counts ``tensor[bool mask]`` (``"__getitem__"``) in a :func:`counting` block."""

    def __init__(self, counts: Counter, in_header: list[bool]) -> None:
        super().__init__()
        self.counts, self.in_header = counts, in_header

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.Tensor.__getitem__ and len(args) > 1:
            if self.in_header[0]:
                if isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
                    raise AssertionError(f"the call header read a {args[0].device} tensor: a device round trip")
            elif _is_mask(args[1]):
                self.counts["__getitem__"] += 1
            return func(*args, **(kwargs or {}))
        self.in_header.append(True)  # (a patched method reached again through the mode: counted once, outside)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.in_header.pop()


@contextmanager
def counting() -> Iterator[Counter]:
    """Count the host round trips of the block, by name (``Counter``; ``sum(counts.values())`` is the total).

    Example:
        >>> with counting() as counts:
        ...     _ = torch.ones(2).sum().item()
        >>> dict(counts)
        {'item': 1}
    """
    counts: Counter = Counter()
    undo: list[Callable[[], None]] = []
    in_header = [False]  # inside the call header's read of its own CPU table

    def patch(owner: Any, name: str, count_if: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name)
        own = name in vars(owner)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(in_header) > 1:  # dispatched again by the indexing mode: the outer call counted
                return original(*args, **kwargs)
            if in_header[0]:
                if args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
                    raise AssertionError(f"the call header read a {args[0].device} tensor: a device round trip")
            elif count_if is None or count_if(*args, **kwargs):
                counts[name] += 1
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)
        undo.append((lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name)))

    try:
        for name in READS:
            patch(torch.Tensor, name)
        for name in DATA_SHAPED:
            patch(torch, name)
            if hasattr(torch.Tensor, name):
                patch(torch.Tensor, name)
        # indexing through a mode, not a patched ``Tensor.__getitem__``: a class attribute of that name, once set,
        # leaves the type a sequence after it is removed (``torch.tensor([0-d tensors])`` then fails in the process)
        mode = _MaskIndexing(counts, in_header)
        mode.__enter__()
        undo.append(lambda: mode.__exit__(None, None, None))
        header_read = _call._host_rows

        def header(*args: Any, **kwargs: Any) -> Any:
            if not isinstance(args[0], np.ndarray):  # a NumPy view: host memory, nothing to wait for
                raise AssertionError(f"the call header read a {type(args[0]).__name__}, not a NumPy view of host")
            in_header[0] = True
            try:
                return header_read(*args, **kwargs)
            finally:
                in_header[0] = False

        _call._host_rows = header
        undo.append(lambda: setattr(_call, "_host_rows", header_read))
        yield counts
    finally:
        for restore in reversed(undo):
            restore()


def total(counts: Counter) -> int:
    """The number of host round trips counted."""
    return sum(counts.values())
