"""Run a test body with either kind of call header: every rank's header on every call (what groups of up to
``FULL_HEADER_MAX_RANKS`` ranks use), or the fingerprint that stands for it in larger groups. The bound is lowered
inside the body so that the 2 and 3 ranks of the harness take the large groups' path."""

from __future__ import annotations

from typing import Any, Callable

from torchmetrics_diff.distributed import _call

#: the two kinds, as test ids
HEADERS = ["full headers", "fingerprint"]


def in_mode(rank: int, world: int, headers: str, body: Callable[..., Any], *args: Any) -> Any:
    """``body(rank, world, *args)`` with the call headers of ``headers`` (one of :data:`HEADERS`)."""
    saved = _call.FULL_HEADER_MAX_RANKS
    _call.FULL_HEADER_MAX_RANKS = 1 if headers == "fingerprint" else max(saved, world)
    try:
        return body(rank, world, *args)
    finally:
        _call.FULL_HEADER_MAX_RANKS = saved
