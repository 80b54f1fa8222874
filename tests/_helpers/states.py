"""Random sets of metric states for the sync-engine and ``Metric`` properties (3, 4 and 5).

A :class:`StateSpec` describes one state for every sync and every rank: its container (tensor or list), its
reduction, dtype, memory layout, and per (sync, rank) its shape (fixed-shape states) or its row counts (``cat``
tensor states: one chunk; list states: one chunk per element, zero chunks for an empty list; ``-1`` is a 0-d
element, allowed when the trailing shape is ``()``). Every rank rebuilds every rank's tensors from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from hypothesis import strategies as st

from tests._helpers.property import DTYPES, FLOATS, LAYOUTS, leaf, seeded, view


def sum0(x: torch.Tensor) -> torch.Tensor:
    """A picklable callable reduction: the sum over the stacked (or concatenated) dim 0."""
    return x.sum(0)


def first(x: torch.Tensor) -> torch.Tensor:
    """A callable reduction that only rank 0's value survives (catches a wrong rank order)."""
    return x[0]


CALLABLES: dict[str, Callable] = {"fn:sum0": sum0, "fn:first": first}
STRING_REDUCTIONS = ("sum", "mean", "min", "max", "cat")
TENSOR_REDUCTIONS = (*STRING_REDUCTIONS, "fn:sum0", "fn:first", "none")
LIST_REDUCTIONS = ("cat", "fn:sum0", "none")


def reduction_fx(reduction: str) -> Any:
    """The ``dist_reduce_fx`` / engine reduction named by ``reduction``."""
    if reduction == "none":
        return None
    return CALLABLES.get(reduction, reduction)


def dtypes_for(container: str, reduction: str) -> tuple[str, ...]:
    """The dtypes for which the reduction has a single-process reference."""
    if container == "tensor" and reduction == "sum":
        return (*FLOATS, "int64")  # a sum of bools has no obvious single-process meaning
    if container == "tensor" and reduction == "mean":
        return FLOATS
    return tuple(DTYPES)


@dataclass(frozen=True)
class StateSpec:
    name: str
    container: str  # "tensor" | "list"
    reduction: str  # see TENSOR_REDUCTIONS / LIST_REDUCTIONS
    dtype: str
    layout: str
    trailing: tuple[int, ...]  # cat tensor and list states
    shapes: tuple[tuple[tuple[int, ...], ...], ...]  # [sync][rank]: fixed-shape tensor states
    rows: tuple[tuple[tuple[int, ...], ...], ...]  # [sync][rank]: chunk row counts (cat tensor: exactly one)

    @property
    def is_cat(self) -> bool:
        return self.container == "list" or self.reduction == "cat"


# ---------------------------------------------------------------------------------------------- strategies

_short_names = st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True)
# now and then a long name, so the first sync's metadata outgrows its 4 KiB row
_long_names = st.builds(lambda head, n: head + "x" * n, _short_names, st.integers(300, 700))
names = st.one_of(_short_names, _short_names, _short_names, _short_names, _long_names)
_dim = st.integers(0, 3)


@st.composite
def _shape(draw: st.DrawFn, ndim: int, big: bool = False, nonzero: bool = False) -> tuple[int, ...]:
    if big:
        return (5000,)  # 40 kB of float64: W ≥ 2 copies pass the 64 KiB rule, the sum/mean bucket is all-reduced
    return tuple(draw(st.integers(1, 3) if nonzero else _dim) for _ in range(ndim))


@st.composite
def state_specs(
    draw: st.DrawFn, world: int, n_syncs: int, name: str, stable: bool = False, max_rows: int = 6
) -> StateSpec:
    """One state; ``stable`` keeps its signature from sync to sync (no shape change, no empty list), so the
    cached plan's fast path runs; otherwise shapes may change and lists may be empty on some ranks."""
    container = draw(st.sampled_from(("tensor", "tensor", "tensor", "list")))
    reduction = draw(st.sampled_from(TENSOR_REDUCTIONS if container == "tensor" else LIST_REDUCTIONS))
    dtype = draw(st.sampled_from(dtypes_for(container, reduction)))
    layout = draw(st.sampled_from(LAYOUTS))
    shapes: list = []
    rows: list = []
    trailing: tuple[int, ...] = ()
    if container == "list" or reduction == "cat":
        # a 0 in the trailing shape is allowed (regression: test_cat_state_with_a_zero_trailing_dim)
        trailing = tuple(draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2))))
        zero_d = st.just(-1) if not trailing else st.nothing()
        # rows change from sync to sync; sometimes a lot (the plan's capacity must grow)
        # rarely very many rows, then few: the plan's capacity must shrink again (the "4x too large" rule)
        many = st.integers(0, 9).flatmap(lambda k: st.integers(70, 100) if k == 0 else st.integers(0, max_rows))
        count = st.one_of(st.integers(0, max_rows), st.integers(0, 3 * max_rows), many, zero_d)
        for _ in range(n_syncs):
            if container == "list":
                chunks = st.lists(count, min_size=1 if stable else 0, max_size=3)
                rows.append(tuple(tuple(draw(chunks)) for _ in range(world)))
            else:
                rows.append(tuple((draw(count),) for _ in range(world)))
    else:
        big = reduction in ("sum", "mean") and dtype == "float64" and draw(st.integers(0, 9)) == 0
        # zero-size gathered states are allowed (regression: test_round_b_of_zero_bytes)
        ndim = draw(st.integers(0, 3))
        shape = draw(_shape(ndim, big))
        ragged = reduction == "none" and draw(st.booleans())
        for _ in range(n_syncs):
            if not (big or stable) and draw(st.integers(0, 3)) == 0:  # the shape changes (on every rank) between syncs
                shape = draw(_shape(draw(st.integers(0, 3)), False))
            if ragged:  # `None` reductions allow per-rank shapes (same ndim): the result is then a list
                shapes.append(tuple(draw(_shape(len(shape), False)) for _ in range(world)))
            else:
                shapes.append((shape,) * world)
    return StateSpec(name, container, reduction, dtype, layout, trailing, tuple(shapes), tuple(rows))


@dataclass(frozen=True)
class SyncCase:
    states: tuple[StateSpec, ...]
    n_syncs: int
    grad: str  # "none" | "local"
    requires_grad: bool  # floating states' inputs require grad (with grad="local")
    grad_scale: float
    ties: bool
    seed: int


@st.composite
def sync_cases(draw: st.DrawFn, world: int, min_states: int = 2, max_states: int = 8) -> SyncCase:
    n_syncs = draw(st.integers(1, 3))
    state_names = draw(st.lists(names, min_size=min_states, max_size=max_states, unique=True))
    stable = draw(st.booleans())
    states = tuple(draw(state_specs(world, n_syncs, name, stable)) for name in state_names)
    # a non-empty max state in every case (zero-byte rounds are pinned in test_round_b_of_zero_bytes)
    states = (*states, _spec_nonzero(world, n_syncs))
    grad = draw(st.sampled_from(("none", "local")))
    scale = draw(st.sampled_from((1.0, 2.0, 0.5)))  # also at world size 1 (regression: grad_scale ignored there)
    return SyncCase(
        states, n_syncs, grad, draw(st.booleans()), scale, draw(st.booleans()), draw(st.integers(0, 2**31 - 1))
    )


def _spec_nonzero(world: int, n_syncs: int) -> StateSpec:
    return StateSpec("Z_pad", "tensor", "max", "float32", "contiguous", (), (((2,),) * world,) * n_syncs, ())


# ------------------------------------------------------------------------------------------------- building


def chunk_shape(spec: StateSpec, rows: int) -> tuple[int, ...]:
    return () if rows == -1 else (rows, *spec.trailing)


def state_value(
    spec: StateSpec, sync: int, rank: int, seed: int, ties: bool, requires_grad: bool
) -> tuple[list[torch.Tensor], Any]:
    """``(leaves, value)`` of one state on one rank at one sync; ``value`` is a view of the leaves."""
    rg = requires_grad and spec.dtype in FLOATS
    parts = (seed, spec.name, sync, rank)
    if spec.container == "list":
        leaves, value = [], []
        for j, rows in enumerate(spec.rows[sync][rank]):
            shape = chunk_shape(spec, rows)
            base = leaf(seeded(shape, spec.dtype, spec.layout, ties, *parts, j), rg)
            leaves.append(base)
            value.append(view(base, shape, spec.layout))
        return leaves, value
    shape = chunk_shape(spec, spec.rows[sync][rank][0]) if spec.is_cat else spec.shapes[sync][rank]
    base = leaf(seeded(shape, spec.dtype, spec.layout, ties, *parts), rg)
    return [base], view(base, shape, spec.layout)


def rows_of(value: Any) -> torch.Tensor | None:
    """A list state (or ``cat`` tensor state) as rows; ``None`` for an empty list."""
    if isinstance(value, list):
        if not value:
            return None
        return torch.cat([v.reshape(1) if v.ndim == 0 else v for v in value])
    return value.reshape(1) if value.ndim == 0 else value


def reference(spec: StateSpec, per_rank: list[Any]) -> Any:
    """The single-process value of a synced state from every rank's value (rank order)."""
    fn = reduction_fx(spec.reduction)
    if spec.is_cat:
        pieces = [p for p in (rows_of(v) for v in per_rank) if p is not None]
        if not pieces:
            return []  # empty on every rank
        value = torch.cat(pieces)
        return fn(value) if callable(fn) else value
    if spec.reduction == "none" and any(v.shape != per_rank[0].shape for v in per_rank):
        return list(per_rank)
    stacked = torch.stack(per_rank)
    if spec.reduction == "sum":
        return stacked.sum(0)
    if spec.reduction == "mean":
        return stacked.mean(0)
    if spec.reduction == "min":
        return stacked.amin(0)
    if spec.reduction == "max":
        return stacked.amax(0)
    return stacked if fn is None else fn(stacked)


def float_tensors(value: Any) -> list[torch.Tensor]:
    """The floating tensors of a synced value (a tensor, a list of tensors, or ``[]``)."""
    items = value if isinstance(value, list) else [value]
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]


def with_state(case: SyncCase, index: int, spec: StateSpec) -> SyncCase:
    states = list(case.states)
    states[index] = spec
    return replace(case, states=tuple(states))
