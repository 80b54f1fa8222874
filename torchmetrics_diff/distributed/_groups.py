"""What the package keeps per process group, in one registry keyed weakly by the group and released with it.

Every piece of mutable state of :mod:`torchmetrics_diff.distributed` that outlives a call lives in the group's
:class:`GroupState`: its size and this process's rank, the call counts that headers carry, the header exchange's
buffers and inline area, the host its headers travel over, the tables the ranks agreed on and what callers derived
from them, and the state syncs' buffers. The host also names the call running on the group (a backend error in
it is named by it) and is the group's notice board, which a wait reads (``_failure.Board``).

Nothing else is kept in module attributes besides constants, caches keyed by immutable inputs, this registry
(with the process's default checks, :class:`_Registry`), the ``ContextVar`` that names the entry point a call runs
for (``_call._ENTRY``) and one instrumentation counter (``_compile.HOST_ROUND_TRIPS``).

A state is made at the group's first use and dropped when the group object is freed (``destroy_process_group``,
a destroyed ``new_group``): its buffers, tables and host (with a gloo twin's connections) go with it. A group
object that cannot be weakly referenced is held for the process's lifetime. Knows groups and tensors; nothing of
metrics, headers or calls.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

#: the values of ``set_checks``: what the package checks before each call's data moves
CHECKS = ("full", "steady", "off")
#: the inline area's size on a group where no call wanted a larger one (see ``_call.inline_capacity``)
INLINE_BYTES = 1536
#: int64 in a call's fingerprint: (sequence, count, name (2), agreed table), their negatives, and "changed"
FINGERPRINT_INTS = 11


def _checks_from_environment() -> str:
    mode = os.environ.get("TORCHMETRICS_DIFF_CHECKS", "steady").strip().lower()
    if mode not in CHECKS:
        raise ValueError(f"TORCHMETRICS_DIFF_CHECKS must be one of {CHECKS}; got {mode!r}")
    return mode


class GroupState:
    """Everything the package keeps for one process group (see the module docstring). Plain typed fields; the
    policies that read and write them (counts, inline area, checks) are in ``_call``."""

    __slots__ = (
        "agreed",
        "auto",
        "buffers",
        "checks",
        "epoch",
        "fingerprint",
        "host",
        "inline",
        "metas",
        "names",
        "rank",
        "recent",
        "ref",
        "rows",
        "seq",
        "size",
        "view",
    )

    def __init__(self, ref: Callable[[], Any], size: int, rank: int) -> None:
        self.ref = ref  # the group (a weak reference when it allows one)
        self.size, self.rank = size, rank
        self.seq = 0  # calls on the group so far
        self.names: dict[str, int] = {}  # calls of each name so far (in the current error epoch)
        self.epoch = 0  # header exchanges on the group that raised: objects' counts of their calls restart with it
        self.inline = INLINE_BYTES  # the inline area's bytes (full headers only)
        self.recent: list[int] = []  # the largest inline row wanted by each of the last exchanges
        self.host: Any = None  # the ``_hosts.Host`` headers travel over: made at the first exchange
        self.checks: str | None = None  # this group's checks mode; None: the process's default
        self.agreed: dict[str, dict[tuple[int, ...], Any]] = {}  # agreed tables (``_call._Agreed``): name, payload
        self.metas: dict[str, Any] = {}  # a public collective's checked metadata (``_collectives._Meta``) by name
        self.auto: dict[str, Any] = {}  # what ``strategy="auto"`` learned of a global loss's batches, by loss
        # the header exchange's buffers by inline size: (send, receive, their NumPy views, the inline views)
        self.buffers: dict[int, tuple[Any, ...]] = {}
        self.rows: dict[tuple[torch.device, str], tuple[torch.Tensor, torch.Tensor]] = {}  # syncs' (send, table)
        self.fingerprint = torch.zeros(FINGERPRINT_INTS, dtype=torch.int64)  # what ``_call`` max-reduces
        self.view = self.fingerprint.numpy()


class _Registry:
    """The process's group states, by id of the group object (a weak reference in each state tells a live group
    from a new one at a reused id), and the checks mode of groups without one of their own."""

    __slots__ = ("checks", "states")

    def __init__(self) -> None:
        self.states: dict[int, GroupState] = {}
        self.checks = _checks_from_environment()


REGISTRY = _Registry()


def state_of(pg: Any) -> GroupState:
    """The state of group object ``pg`` (not ``None``), made at its first use. Raises ``ValueError`` when this
    process is not a member (nothing is kept then)."""
    states = REGISTRY.states
    state = states.get(id(pg))
    if state is not None and state.ref() is pg:
        return state
    size, rank = dist.get_world_size(pg), dist.get_rank(pg)
    if size <= 0 or rank < 0:
        raise ValueError("not a member of the group")
    try:
        ref: Callable[[], Any] = weakref.ref(pg)
    except TypeError:  # a group object without weak references: held for the process's lifetime
        ref = (lambda obj: lambda: obj)(pg)
        state = states[id(pg)] = GroupState(ref, size, rank)
    else:
        state = states[id(pg)] = GroupState(ref, size, rank)
        weakref.finalize(pg, _forget, id(pg), state)  # (the state holds the group weakly: no cycle)
    return state


def known(pg: Any) -> GroupState | None:
    """The state of ``pg`` if it has one (nothing is made)."""
    state = REGISTRY.states.get(id(pg))
    return state if state is not None and state.ref() is pg else None


def _forget(key: int, state: GroupState) -> None:
    """Drop ``state`` (at ``key``) once its group ended, unless a newer group's state took the key."""
    if REGISTRY.states.get(key) is state:
        del REGISTRY.states[key]
