"""Record the collectives a block of code issues (``torch.distributed``'s functions and the backend's flat ones)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch.distributed as dist

from torchmetrics_diff.distributed import _backend

_DIST_NAMES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
)


@contextmanager
def record_collectives(on_call: Callable[[str], Any] | None = None) -> Iterator[list[str]]:
    """Wrap ``torch.distributed``'s collectives and the backend's captured flat gather; yield the call log.

    ``on_call`` replaces the collective when given (outside a process group, where any call is a failure).
    The originals are restored on exit.
    """
    log: list[str] = []
    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, attr: str, name: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            log.append(name)
            return on_call(name) if on_call is not None else original(*args, **kwargs)

        saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    for name in _DIST_NAMES:
        wrap(dist, name, name)
    wrap(_backend, "_all_gather_flat", "_all_gather_flat")
    wrap(_backend, "_reduce_scatter_flat", "_reduce_scatter_flat")
    try:
        yield log
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
