"""Property 1: ``gather_all_tensors`` and ``all_gather_cat`` equal the single-process reference.

For random per-rank shapes (same ndim; any dimension may differ for the gather, only the first for the
concatenation; zero-size ranks; 0-d tensors), dtypes, memory layouts and grad modes, the gathered values are
bit-for-bit every rank's tensor in rank order, and the gradients equal brute-force autograd on one process:
each rank's loss is a random-weighted ``tanh`` sum of everything gathered, with rank-specific weights;
``grad="local"`` gives ``∂L_r/∂x_r``, ``grad="sync"`` gives ``Σ_r' ∂L_r'/∂x_r``.

Package modules covered: the collectives of ``distributed`` (``gather_all_tensors``, ``all_gather_cat``) and their
autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from tests._helpers.checks import Checks, short
from tests._helpers.property import (
    LAYOUTS,
    apply,
    batches,
    budget,
    case_context,
    dispatch,
    dtype_names,
    is_float,
    leaf,
    seeded,
    seeds,
    slow,
    view,
    weights,
)
from torchmetrics_diff.distributed import all_gather_cat, gather_all_tensors

pytestmark = pytest.mark.timeout(240)


@dataclass(frozen=True)
class GatherCase:
    fn: str  # "gather" | "cat"
    dtype: str
    shapes: tuple[tuple[int, ...], ...]  # per rank
    grad: str  # "none" | "local" | "sync"
    requires_grad: tuple[bool, ...]  # per rank (equal on every rank for "sync")
    layout: str
    ties: bool
    seed: int


@st.composite
def gather_cases(draw: st.DrawFn, world: int) -> GatherCase:
    fn = draw(st.sampled_from(("gather", "cat")))
    ndim = draw(st.integers(0, 3))
    dim = st.integers(0, 3)
    if ndim == 0:
        shapes = ((),) * world
    elif fn == "gather":
        shapes = tuple(tuple(draw(dim) for _ in range(ndim)) for _ in range(world))
    else:
        trailing = tuple(draw(dim) for _ in range(ndim - 1))
        shapes = tuple((draw(st.integers(0, 5)), *trailing) for _ in range(world))
    dtype = draw(dtype_names)
    grad = draw(st.sampled_from(("none", "local", "sync")))
    if not is_float(dtype):
        requires_grad = (False,) * world
    elif grad == "sync":
        requires_grad = (draw(st.booleans()),) * world
    else:
        requires_grad = tuple(draw(st.booleans()) for _ in range(world))
    return GatherCase(
        fn, dtype, shapes, grad, requires_grad, draw(st.sampled_from(LAYOUTS)), draw(st.booleans()), draw(seeds)
    )


def _storage(case: GatherCase, rank: int) -> torch.Tensor:
    return seeded(case.shapes[rank], case.dtype, case.layout, case.ties, case.seed, "x", rank)


def _reference(case: GatherCase, inputs: list[torch.Tensor]) -> list[torch.Tensor] | torch.Tensor:
    if case.fn == "gather":
        return list(inputs)
    return torch.cat([t.reshape(1) if t.ndim == 0 else t for t in inputs])


def _loss(case: GatherCase, rank: int, out: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s loss: weights depend on the rank and the slot."""
    pieces = out if isinstance(out, list) else [out]
    total = torch.zeros((), dtype=torch.float64)
    for i, piece in enumerate(pieces):
        total = total + (weights(piece.shape, case.seed, rank, i) * torch.tanh(piece.double())).sum()
    return total


def _one(chk: Checks, rank: int, world: int, case: GatherCase) -> None:
    storages = [_storage(case, r) for r in range(world)]
    inputs = [view(s, case.shapes[r], case.layout) for r, s in enumerate(storages)]
    base = leaf(storages[rank], case.requires_grad[rank])
    x = view(base, case.shapes[rank], case.layout)
    fn = gather_all_tensors if case.fn == "gather" else all_gather_cat
    out = fn(x, grad=case.grad)

    expected = _reference(case, inputs)
    chk.same("values", out, expected, exact=True)
    if case.grad == "none":
        outs = out if isinstance(out, list) else [out]
        chk.true("detached", not any(t.requires_grad for t in outs), "grad='none' returned a tensor requiring grad")
    if case.grad == "none" or not case.requires_grad[rank]:
        return

    # brute force: every rank's storage a leaf, the collective replaced by the reference
    ref_leaves = [leaf(s, True) for s in storages]
    ref_out = _reference(case, [view(b, case.shapes[r], case.layout) for r, b in enumerate(ref_leaves)])
    if case.grad == "local":
        ref_loss = _loss(case, rank, ref_out)
    else:
        ref_loss = sum(_loss(case, r, ref_out) for r in range(world))
    (expected_grad,) = torch.autograd.grad(ref_loss, ref_leaves[rank], allow_unused=True)
    if expected_grad is None:
        expected_grad = torch.zeros_like(ref_leaves[rank])

    loss = _loss(case, rank, out)
    if loss.requires_grad:  # with "sync", every rank requires grad here, so every rank runs the backward
        loss.backward()
    chk.grad("gradient", base, expected_grad)


def gather_body(rank: int, world: int, cases: list[GatherCase]) -> list:
    results = []
    for i, case in enumerate(cases):
        chk = Checks(f"[W={world} rank {rank}] ")
        chk.case = f"case {i}: {short(case)}"
        with case_context(i, case):
            _one(chk, rank, world, case)
        results.append((chk.failures, ""))
    return results


# -------------------------------------------------------------------------------------------------- tests

# Pinned: the tricky corners, run on every world size whatever Hypothesis draws.
_PINNED = [
    # 1-element strided slices (stride 2) of every rank, with gradients
    GatherCase("gather", "float64", ((1,),) * 3, "sync", (True,) * 3, "step", False, 1),
    GatherCase("cat", "float64", ((1, 2),) * 3, "local", (True, False, True), "step", False, 2),
    # 0-d everywhere; zero rows on one rank; empty on every rank
    GatherCase("cat", "float32", ((),) * 3, "sync", (True,) * 3, "contiguous", False, 3),
    GatherCase("cat", "bfloat16", ((0, 3), (2, 3), (0, 3)), "sync", (True,) * 3, "expand", False, 4),
    GatherCase("gather", "bool", ((0, 0), (0, 0), (0, 0)), "local", (False,) * 3, "transpose", False, 5),
    GatherCase("gather", "float16", ((2, 0, 1), (1, 3, 2), (3, 1, 0)), "sync", (True,) * 3, "transpose", True, 6),
    GatherCase("gather", "int64", ((3,), (0,), (1,)), "sync", (False,) * 3, "offset", False, 7),
]


def _pinned(world: int) -> list[GatherCase]:
    return [
        GatherCase(c.fn, c.dtype, c.shapes[:world], c.grad, c.requires_grad[:world], c.layout, c.ties, c.seed)
        for c in _PINNED
    ]


@pytest.mark.parametrize("world", [1, 2, 3])
@budget(6)
@given(data=st.data())
def test_gathers_match_single_process_reference(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(gather_cases(world), 20, 40), label="cases")
    dispatch(gather_body, world, cases)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_gathers_pinned_examples(world: int) -> None:
    dispatch(gather_body, world, _pinned(world))


@apply(slow)
@pytest.mark.parametrize("world", [2, 3])
@budget(60, 300)
@given(data=st.data())
def test_gathers_soak(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(gather_cases(world), 30, 60), label="cases")
    dispatch(gather_body, world, cases, timeout=180)


@budget(20)
@given(case=gather_cases(1))
@example(case=GatherCase("gather", "float32", ((2,),), "none", (True,), "contiguous", False, 0))
def test_gathers_without_process_group(case: GatherCase) -> None:
    """Not initialised at all (the pytest process): the same answers as a world of one."""
    chk = Checks("[W=1 rank 0] ")
    chk.case = repr(case)
    _one(chk, 0, 1, case)
    assert not chk.failures, "\n".join(chk.failures)
