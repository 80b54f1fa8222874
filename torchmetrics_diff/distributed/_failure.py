"""Failing on every rank: the one protocol by which a rank that cannot go on stops its peers instead of hanging them.

The vocabulary (:ref:`architecture-failures`):

- A rank *fails together* when it finds a problem (a bad input, an error in ``update``) while its peers are
  about to enter a call that communicates: it enters that call's header exchange (``_call``, the first
  collective of every call) anyway, with its status set to failed, then raises its own error. Every peer reads
  the headers, sees the marker and raises a ``RuntimeError`` naming the failed rank(s) (:func:`peers_failed`).
  No rank is left waiting. :func:`fail_together` (the collectives of ``_collectives``) and :func:`fail_sync` (the
  sync engine) are the two entry points. (A plan's key is never :data:`FAILED`, so a key in a sync's header can
  never be read as the marker.)
- A :class:`CollectiveError` is the collective itself failing (a timeout, a backend error), not a check of ours;
  a peer whose process exited or lost its connection is a :class:`PeerLeftError`, named from the backend's
  connection error by :func:`backend_error`. The sync engine re-raises either as the same class, naming the owner
  and the states (:func:`collective_failed`).
- A disagreement between ranks (names, dtypes, shapes, calls) is found from data every rank holds, so every rank
  raises the same :class:`RanksDisagreeError` without any marker.

The exception classes are defined here, the bottom of the package, so that every layer can raise them; the
package exports them from :mod:`torchmetrics_diff.exceptions` (their ``__module__``). All of them are
``RuntimeError`` subclasses: ``except RuntimeError`` keeps catching what it caught before.

Knows integers and messages, nothing of tensors or groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, NoReturn, Protocol

#: the first int64 of a rank's header when it raised before the collective. Never a valid first value: the sync
#: engine's signature hashes avoid it and the collectives' first field is an ``ndim`` (never negative).
FAILED = -1


_PUBLIC = "torchmetrics_diff.exceptions"  # where users import the classes from (and how they print and pickle)


class DistributedError(RuntimeError):
    """A call that communicates failed because of the other ranks or the connection to them.

    The base of :class:`CollectiveError` (and :class:`PeerLeftError`), :class:`PeerFailedError` and
    :class:`RanksDisagreeError`. Raised on every rank of the call alike, except where the backend itself fails (a
    timeout, a peer that left), which each rank sees on its own.
    """

    __module__ = _PUBLIC


class CollectiveError(DistributedError):
    """A collective itself failed: a timeout, a backend error (not a check of the package).

    A peer that left (its process exited or its connection broke) is the subclass :class:`PeerLeftError`.
    """

    __module__ = _PUBLIC


class PeerLeftError(CollectiveError):
    """A peer left during a call: its process exited or lost its connection, and the backend said so.

    Attributes:
        call: the call that was running (``"CLIPLoss.forward: gather_all_tensors"``, ``"SumMetric.sync"``), or
            ``""`` when not known.
        rank: the peer's rank in the call's group when the backend's error tells it, else ``None`` (the message
            then says "a peer").
        detail: the backend's own text, which ends the message.
    """

    __module__ = _PUBLIC

    def __init__(self, message: str, *, call: str = "", rank: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.call, self.rank, self.detail = call, rank, detail


class PeerFailedError(DistributedError):
    """A peer raised an error of its own before the call communicated (a bad input, an exception in ``update``)
    and joined the call only to say so: this rank raises this error, the peer its own.

    Attributes:
        ranks: the peers that failed (rank numbers, or labels such as ``"rank 1 (global 3)"``).
    """

    __module__ = _PUBLIC

    def __init__(self, message: str, *, ranks: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


class RanksDisagreeError(DistributedError):
    """The ranks disagree on what the call needs alike (states, dtypes, shapes, widths, grad modes) or are in
    different calls. Found from the metadata every rank holds, so every rank raises the same error; the ranks
    are still in step afterwards."""

    __module__ = _PUBLIC


class Board(Protocol):
    """Where the ranks of one group post that a peer left, and read it while they wait (the group's store; the
    group's host, ``_hosts.Host``, implements it).

    The first rank whose connection to a peer breaks posts it; every rank that waits longer than a moment in a call
    on that group reads the board and raises the same :class:`PeerLeftError`, naming the rank that left, instead
    of waiting for the backend's timeout on a peer that is itself stuck. ``call`` is the call running on the group
    (``"CLIPLoss.forward: gather_all_tensors"``), set by each call's header exchange (its first collective), so that
    a backend error in the call's later collectives is named by it.
    """

    call: str

    def read(self) -> tuple[int | None, str, str] | None: ...

    def departed(self, peer: int | None, detail: str, *, notice: bool = False) -> PeerLeftError: ...


# what gloo (and the TCP stack under it) says when the process at the other end of a connection went away
_LEFT = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Connection refused",
    "Socket closed",
    "connection closed",
    "Connection reset",
)


def is_departure(err: BaseException | str) -> bool:
    """Whether the backend's error says that the process at the other end of a connection went away."""
    text = str(err)
    return any(marker in text for marker in _LEFT)


def backend_error(op: str, err: BaseException, peer: int | None = None, board: Board | None = None) -> CollectiveError:
    """The error to raise for the backend's ``err`` in collective ``op`` (``"all_gather"``) on a group whose
    board (:class:`Board`; ``None``: none yet) names the running call.

    A connection error (the peer's process exited, or its connection broke) is a :class:`PeerLeftError` naming
    the call and, when known, the peer (``peer``: a point-to-point exchange's partner), posted on the board so
    that every peer hears of it; any other error (a timeout, say) a :class:`CollectiveError`
    ``"{op} failed: {err}"``.
    """
    if isinstance(err, CollectiveError):  # raised by a wait that read the group's board: already told
        return err
    text = str(err)
    if not is_departure(text):
        return CollectiveError(f"{op} failed: {text}")
    if board is not None:  # this rank saw it: every peer hears of it from the board, and it is named there
        return board.departed(peer, text.strip())
    call, detail = op, text.strip()
    return PeerLeftError(_left(call, peer, detail), call=call, rank=peer, detail=detail)


def departure(gone: tuple[int | None, str, str], call: str, *, seen: bool) -> PeerLeftError:
    """The error of a rank whose group lost a peer: ``gone`` is ``(rank, call, detail)`` as posted by the rank
    that saw the connection break (this rank itself when ``seen``); the error names this rank's own ``call``."""
    rank, during, detail = gone
    call = call or during
    if not seen:
        detail = f"posted by a peer that saw it during {during!r}: {detail}"
    return PeerLeftError(_left(call, rank, detail), call=call, rank=rank, detail=detail)


def _left(call: str, rank: int | None, detail: str, doing: str = "") -> str:
    """``"rank 2 left during 'SumMetric.sync' (doing): its process exited or lost its connection (gloo: ...)"``."""
    who = "a peer" if rank is None else f"rank {rank}"
    doing = f" ({doing})" if doing else ""
    return f"{who} left during {call!r}{doing}: its process exited or lost its connection (gloo: {detail})"


def failed_ranks(firsts: Sequence[int]) -> list[int]:
    """The ranks whose header's first int64 (``firsts[r]`` for rank ``r``) is the failure marker."""
    return [r for r, first in enumerate(firsts) if first == FAILED]


_LISTED = 8  # at most this many ranks are listed one by one in a message; more are written as runs


def ranks_text(ranks: Sequence[int], names: Sequence[str] | None = None) -> str:
    """``"rank 3"``, ``"ranks 0-4094"``, ``"ranks 0-3, 7, 9-12, 15 and 5 more runs (40 ranks)"``: a few dozen
    characters however many ranks (sorted ascending). A single rank is named by ``names[rank]`` when given
    (``"rank 1 (global 3)"``)."""
    if len(ranks) == 1:
        return names[ranks[0]] if names else f"rank {ranks[0]}"
    runs: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    more = f" and {len(runs) - 4} more runs ({len(ranks)} ranks)" if len(runs) > 5 else ""
    return "ranks " + ", ".join(runs[:4] if more else runs) + more


def peers_failed(who: str, ranks: Sequence[Any], *, sync: bool) -> PeerFailedError:
    """The error a rank raises when peers joined its collective with the failure marker.

    Args:
        who: the function or metric that was running the collective.
        ranks: the failed ranks (numbers, or labels such as ``"rank 1 (global 3)"``).
        sync: a sync of the engine (``True``) or one collective of ``_collectives`` (``False``): the two wordings
            users and tests know.
    """
    if sync:
        shown = str(list(ranks)) if len(ranks) <= _LISTED else ranks_text(list(ranks))
        return PeerFailedError(
            f"{who}: rank(s) {shown} raised an error before syncing (see their message); not syncing", ranks=ranks
        )
    shown = (
        ", ".join(ranks) if len(ranks) <= _LISTED else f"{', '.join(ranks[:_LISTED])} and {len(ranks) - _LISTED} more"
    )
    return PeerFailedError(f"{who}: {shown} raised an error before this collective; see its message", ranks=ranks)


def collective_failed(err: CollectiveError, owner: str, names: Any, world: int) -> CollectiveError:
    """A collective that failed while syncing states, as an error of the same class (a :class:`PeerLeftError`
    keeps its call, rank and detail) naming the metric and the states synced."""
    if isinstance(err, PeerLeftError):  # the departure first, the backend's text last
        doing = f"syncing states {list(names)} over {world} ranks"
        return PeerLeftError(
            _left(err.call, err.rank, err.detail, doing), call=err.call, rank=err.rank, detail=err.detail
        )
    return type(err)(f"{owner}: a collective failed while syncing states {list(names)} over {world} ranks: {err}")


def fail_on_every_rank(problem: BaseException, world: int, join: Callable[[], object]) -> NoReturn:
    """Raise ``problem`` after ``join()`` took part in the peers' collective with the failure marker.

    At world size 1 there are no peers: it just raises.
    """
    if world > 1:
        join()
    raise problem
