"""Failing on every rank: the one protocol by which a rank that cannot go on stops its peers instead of hanging them.

The vocabulary (:ref:`architecture-failures`):

- A rank *fails together* when it finds a problem (a bad input, an error in ``update``) while its peers are
  about to enter a call that communicates: it enters that call's header exchange (``_call``, the first
  collective of every call) anyway, with its status set to failed, then raises its own error. Every peer reads
  the headers, sees the marker and raises a ``RuntimeError`` naming the failed rank(s) (:func:`peers_failed`).
  No rank is left waiting. :func:`fail_together` (the collectives of ``_collectives``) and :func:`fail_sync` (the
  sync engine) are the two entry points. (A plan's key is never :data:`FAILED`, so a key in a sync's header can
  never be read as the marker.)
- A :class:`CollectiveError` is the collective itself failing (a timeout, a dead peer, a backend error), not a
  check of ours; the sync engine re-raises it as a ``RuntimeError`` naming the owner and the states
  (:func:`collective_failed`).
- A disagreement between ranks (names, dtypes, shapes) is found from data every rank holds, so every rank raises
  the same ``RuntimeError`` without any marker.

Knows integers and messages, nothing of tensors or groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, NoReturn

#: the first int64 of a rank's header when it raised before the collective. Never a valid first value: the sync
#: engine's signature hashes avoid it and the collectives' first field is an ``ndim`` (never negative).
FAILED = -1


class CollectiveError(RuntimeError):
    """A collective itself failed: a timeout, a peer that died, a backend error (not a check of ours)."""


def failed_ranks(firsts: Sequence[int]) -> list[int]:
    """The ranks whose header's first int64 (``firsts[r]`` for rank ``r``) is the failure marker."""
    return [r for r, first in enumerate(firsts) if first == FAILED]


def peers_failed(who: str, ranks: Sequence[Any], *, sync: bool) -> RuntimeError:
    """The error a rank raises when peers joined its collective with the failure marker.

    Args:
        who: the function or metric that was running the collective.
        ranks: the failed ranks (numbers, or labels such as ``"rank 1 (global 3)"``).
        sync: a sync of the engine (``True``) or one collective of ``_collectives`` (``False``): the two wordings
            users and tests know.
    """
    if sync:
        return RuntimeError(
            f"{who}: rank(s) {list(ranks)} raised an error before syncing (see their message); not syncing"
        )
    return RuntimeError(f"{who}: {', '.join(ranks)} raised an error before this collective; see its message")


def collective_failed(err: CollectiveError, owner: str, names: Any, world: int) -> RuntimeError:
    """A collective that failed while syncing states, as an error naming the metric and the states synced."""
    return RuntimeError(f"{owner}: a collective failed while syncing states {list(names)} over {world} ranks: {err}")


def fail_on_every_rank(problem: BaseException, world: int, join: Callable[[], object]) -> NoReturn:
    """Raise ``problem`` after ``join()`` took part in the peers' collective with the failure marker.

    At world size 1 there are no peers: it just raises.
    """
    if world > 1:
        join()
    raise problem
