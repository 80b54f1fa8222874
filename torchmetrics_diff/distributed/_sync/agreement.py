"""The checks of a sync and the agreement on a plan: this rank's arguments before any collective, every rank's
metadata (signature and sizes) after it was gathered.

Both raise errors that name the state and, for a disagreement, every rank's view of it. The signature check runs
on data every rank holds (the gathered metadata), so every rank raises the same
:class:`~torchmetrics_diff.exceptions.RanksDisagreeError` (a ``RuntimeError``).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import dtype_from_code
from torchmetrics_diff.distributed._failure import RanksDisagreeError, ranks_text
from torchmetrics_diff.distributed._reductions import CAT, Reduction, State
from torchmetrics_diff.distributed._sync.plan import GATHER, UNKNOWN_DTYPE, StateSignature

GRADS = ("none", "local")  # the grad modes of a sync


def check_arguments(states: dict[str, State], fns: dict[str, Reduction], grad: str) -> None:
    """Raise ``ValueError`` for a bad ``grad``, an unknown reduction or a reduction the state's dtype forbids."""
    if grad not in GRADS:
        raise ValueError(f"sync_states: `grad` must be 'none' or 'local'; got {grad!r}")
    for name, fn in fns.items():
        if not _reductions.valid(fn):
            raise ValueError(
                f"sync_states: reduction of state {name!r} must be one of {_reductions.REDUCTIONS}, "
                f"a callable or None; got {fn!r}"
            )
        value = states.get(name)
        dtype = value.dtype if isinstance(value, torch.Tensor) else None
        conflict = _reductions.dtype_conflict(fn, dtype, order=False)
        if conflict == _reductions.MEAN_NEEDS_FLOAT:
            raise ValueError(f"sync_states: state {name!r} has dist_reduce_fx='mean' but dtype {dtype}; use a float")
        if conflict == _reductions.NO_BOOL_SUM:
            raise ValueError(f"sync_states: state {name!r} is bool with dist_reduce_fx={fn!r}; use 'max' or 'min'")


def check_agreement(
    owner: str, metas: list[list[StateSignature]], world: int, holders: list[list[int]] | None = None
) -> list[StateSignature]:
    """Validate every rank's signature; return the resolved one (unknown cat dtypes filled from peers).

    ``metas`` may hold each distinct signature once, ``holders[i]`` then being the ranks that sent ``metas[i]``
    (in a large world most ranks send the same): the checks then run once per distinct signature, and the
    errors name the ranks of each (``"ranks 0-4094"``)."""
    who = [ranks_text(h) for h in holders] if holders is not None else [f"rank {r}" for r in range(len(metas))]
    names = [[s.name for s in m] for m in metas]
    if any(n != names[0] for n in names):
        for name in sorted(set().union(*names)):
            missing = [r for r in range(len(metas)) if name not in names[r]]
            if missing:
                present = [r for r in range(len(metas)) if r not in missing]
                raise RanksDisagreeError(
                    f"{owner}: cannot sync state {name!r}: it is missing on {_ranks(missing, holders)} "
                    f"but registered on {_ranks(present, holders)}"
                )
        listing = "; ".join(f"{who[r]}: {n}" for r, n in enumerate(names))
        raise RanksDisagreeError(f"{owner}: ranks registered their states in a different order ({listing})")
    resolved = []
    for i, name in enumerate(names[0]):
        column = [m[i] for m in metas]
        # the kind and the reduction are known on every rank; the dtype only where the state is not an empty list
        checks = (
            ("reduction", "kind", str, False),
            ("reduction", "tag", str, False),
            ("dtype", "dtype", lambda c: str(dtype_from_code(c)), True),
        )
        for what, attr, show, needs_dtype in checks:
            known = [(r, getattr(c, attr)) for r, c in enumerate(column) if c.dtype != UNKNOWN_DTYPE or not needs_dtype]
            if any(v != known[0][1] for _, v in known):
                listing = ", ".join(f"{who[r]}: {show(v)}" for r, v in known)
                raise RanksDisagreeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        known_rows = [(r, c) for r, c in enumerate(column) if c.dtype != UNKNOWN_DTYPE]
        kind = column[0].kind
        what = {CAT: "trailing shape", GATHER: "number of dimensions"}.get(kind, "shape")
        if any(c.dims != known_rows[0][1].dims for _, c in known_rows):
            listing = ", ".join(f"{who[r]}: {show_dims(c.dims, kind)}" for r, c in known_rows)
            raise RanksDisagreeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        resolved.append(known_rows[0][1] if known_rows else column[0])
    return resolved


def _ranks(indices: list[int], holders: list[list[int]] | None) -> str:
    """``"rank(s) [1, 2]"`` of the signatures at ``indices`` (of ranks, or of the distinct signatures' holders)."""
    ranks = indices if holders is None else sorted(r for i in indices for r in holders[i])
    return f"rank(s) {ranks}" if len(ranks) <= 8 else ranks_text(ranks)


def show_dims(dims: Any, kind: str) -> str:
    """A state's dims as a message shows them."""
    if kind == GATHER:
        return f"ndim {dims}"
    return str(tuple(dims)) if kind != CAT else f"(*, {', '.join(map(str, dims))})" if dims else "(*,)"


def metadata(signature: list[StateSignature], sizes: list[int]) -> bytes:
    """What a rank sends when the ranks agree on a plan: its signature (JSON, after its length) and its sizes."""
    text = json.dumps(signature).encode()
    return len(text).to_bytes(8, "little") + text + struct.pack(f"<{len(sizes)}q", *sizes)


def agree(owner: str, blobs: Any, lengths: list[int], world: int) -> tuple[list[StateSignature], list[list[int]]]:
    """Every rank's :func:`metadata` (``blobs``: a ``(world, bytes)`` NumPy array of them, padded; ``lengths``:
    their lengths, from the call header) validated: the agreed signature and every rank's sizes. Raises the same
    ``RuntimeError`` on every rank when they disagree.

    Each distinct signature is decoded and checked once; when every rank sent rank 0's signature and as many
    sizes (the common case in a large world), it is read with vectorised comparisons, no Python per rank."""
    n = int.from_bytes(blobs[0, :8].tobytes(), "little")
    longest = max(lengths)
    if (
        min(lengths) == longest
        and 8 + n <= longest <= blobs.shape[1]
        and (blobs[:, : 8 + n] == blobs[0, : 8 + n]).all()
    ):
        count = (longest - 8 - n) // 8
        sizes = blobs[:, 8 + n : longest].copy().view(np.int64).tolist() if count else [[]] * world
        signature = StateSignature.decode(json.loads(blobs[0, 8 : 8 + n].tobytes()))
        return check_agreement(owner, [signature], world, [list(range(world))]), sizes
    distinct: dict[bytes, int] = {}
    holders: list[list[int]] = []
    sizes = []
    for rank, length in enumerate(lengths):
        blob = blobs[rank, :length].tobytes()
        n = int.from_bytes(blob[:8], "little")
        index = distinct.setdefault(blob[8 : 8 + n], len(distinct))
        if index == len(holders):
            holders.append([])
        holders[index].append(rank)
        count = (length - 8 - n) // 8
        sizes.append(list(struct.unpack(f"<{count}q", blob[8 + n : length])) if count else [])
    signatures = [StateSignature.decode(json.loads(text)) for text in distinct]
    return check_agreement(owner, signatures, world, holders), sizes
