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

import torch

from torchmetrics_diff.distributed import _reductions
from torchmetrics_diff.distributed._backend import dtype_from_code
from torchmetrics_diff.distributed._failure import RanksDisagreeError
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


def check_agreement(owner: str, metas: list[list[StateSignature]], world: int) -> list[StateSignature]:
    """Validate every rank's signature; return the resolved one (unknown cat dtypes filled from peers)."""
    names = [[s.name for s in m] for m in metas]
    if any(n != names[0] for n in names):
        for name in sorted(set().union(*names)):
            missing = [r for r in range(world) if name not in names[r]]
            if missing:
                present = [r for r in range(world) if r not in missing]
                raise RanksDisagreeError(
                    f"{owner}: cannot sync state {name!r}: it is missing on rank(s) {missing} "
                    f"but registered on rank(s) {present}"
                )
        listing = "; ".join(f"rank {r}: {n}" for r, n in enumerate(names))
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
                listing = ", ".join(f"rank {r}: {show(v)}" for r, v in known)
                raise RanksDisagreeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        known_rows = [(r, c) for r, c in enumerate(column) if c.dtype != UNKNOWN_DTYPE]
        kind = column[0].kind
        what = {CAT: "trailing shape", GATHER: "number of dimensions"}.get(kind, "shape")
        if any(c.dims != known_rows[0][1].dims for _, c in known_rows):
            listing = ", ".join(f"rank {r}: {show_dims(c.dims, kind)}" for r, c in known_rows)
            raise RanksDisagreeError(f"{owner}: cannot sync state {name!r}: ranks disagree on {what} ({listing})")
        resolved.append(known_rows[0][1] if known_rows else column[0])
    return resolved


def show_dims(dims: Any, kind: str) -> str:
    """A state's dims as a message shows them."""
    if kind == GATHER:
        return f"ndim {dims}"
    return str(tuple(dims)) if kind != CAT else f"(*, {', '.join(map(str, dims))})" if dims else "(*,)"


def metadata(signature: list[StateSignature], sizes: list[int]) -> bytes:
    """What a rank sends when the ranks agree on a plan: its signature (JSON, after its length) and its sizes."""
    text = json.dumps(signature).encode()
    return len(text).to_bytes(8, "little") + text + struct.pack(f"<{len(sizes)}q", *sizes)


def agree(
    owner: str, blobs: list[bytes], lengths: list[int], world: int
) -> tuple[list[StateSignature], list[list[int]]]:
    """Every rank's :func:`metadata` (``lengths``: their lengths, from the call header) validated: the agreed
    signature and every rank's sizes. Raises the same ``RuntimeError`` on every rank when they disagree."""
    signatures, sizes = [], []
    for blob, length in zip(blobs, lengths):
        n = int.from_bytes(blob[:8], "little")
        signatures.append(StateSignature.decode(json.loads(blob[8 : 8 + n])))
        count = (length - 8 - n) // 8
        sizes.append(list(struct.unpack(f"<{count}q", blob[8 + n : length])))
    return check_agreement(owner, signatures, world), sizes
