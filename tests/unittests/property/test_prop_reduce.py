"""Property 2: ``all_reduce`` equals ``torch.stack(...).sum/mean/amax/amin(0)`` of every rank's tensor.

Random equal shapes (0-d and zero-size included), dtypes, ops, layouts, grad modes and per-rank
``requires_grad`` (``"local"`` allows it to differ between ranks). Values match the reference (floats within
rounding of a different summation order), are bit-identical on every rank, keep dtype and shape; gradients equal
brute-force autograd through ``torch.stack(...).amax(0)`` & co (ties of min/max split evenly, like ``amax``).
The ill-defined combinations (``mean`` of integers or bools, ``sum`` of bools) raise ``ValueError`` on every rank.

Package modules covered: ``distributed.all_reduce`` and its autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests._helpers.checks import Checks, digest, short
from tests._helpers.property import (
    DTYPES,
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
from torchmetrics_diff.distributed import all_reduce

pytestmark = pytest.mark.timeout(240)

OPS = ("sum", "mean", "min", "max")


@dataclass(frozen=True)
class ReduceCase:
    op: str
    dtype: str
    shape: tuple[int, ...]
    grad: str
    requires_grad: tuple[bool, ...]
    layout: str
    ties: bool
    seed: int

    @property
    def invalid(self) -> bool:
        return (self.op == "mean" and not is_float(self.dtype)) or (self.op == "sum" and self.dtype == "bool")


@st.composite
def reduce_cases(draw: st.DrawFn, world: int) -> ReduceCase:
    op = draw(st.sampled_from(OPS))
    dtype = draw(dtype_names)
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    grad = draw(st.sampled_from(("none", "local", "sync")))
    if not is_float(dtype):
        requires_grad = (False,) * world
    elif grad == "sync":
        requires_grad = (draw(st.booleans()),) * world
    else:
        requires_grad = tuple(draw(st.booleans()) for _ in range(world))
    return ReduceCase(
        op, dtype, shape, grad, requires_grad, draw(st.sampled_from(LAYOUTS)), draw(st.booleans()), draw(seeds)
    )


def _reference(op: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(inputs)
    if op == "sum":
        return stacked.sum(0)
    if op == "mean":
        return stacked.mean(0)
    return stacked.amax(0) if op == "max" else stacked.amin(0)


def _loss(case: ReduceCase, rank: int, out: torch.Tensor) -> torch.Tensor:
    return (weights(out.shape, case.seed, rank) * torch.tanh(out.double())).sum()


def _one(chk: Checks, rank: int, world: int, case: ReduceCase) -> str:
    storages = [seeded(case.shape, case.dtype, case.layout, case.ties, case.seed, "x", r) for r in range(world)]
    inputs = [view(s, case.shape, case.layout) for s in storages]
    base = leaf(storages[rank], case.requires_grad[rank])
    x = view(base, case.shape, case.layout)
    before = x.detach().clone()

    if case.invalid:
        try:
            all_reduce(x, case.op, grad=case.grad)
        except ValueError:
            return "ValueError"
        chk.fail("invalid combination", f"op={case.op!r} of {case.dtype} did not raise ValueError")
        return "no error"

    out = all_reduce(x, case.op, grad=case.grad)
    chk.same("values", out, _reference(case.op, inputs).to(DTYPES[case.dtype]))
    chk.same("input unchanged", x, before, exact=True)
    if case.grad == "none":
        chk.true("detached", not out.requires_grad, "grad='none' returned a tensor requiring grad")
    if case.grad != "none" and case.requires_grad[rank]:
        ref_leaves = [leaf(s, True) for s in storages]
        ref_out = _reference(case.op, [view(b, case.shape, case.layout) for b in ref_leaves])
        if case.grad == "local":
            ref_loss = _loss(case, rank, ref_out)
        else:
            ref_loss = sum(_loss(case, r, ref_out) for r in range(world))
        (expected,) = torch.autograd.grad(ref_loss, ref_leaves[rank], allow_unused=True)
        loss = _loss(case, rank, out)
        if loss.requires_grad:
            loss.backward()
        chk.grad("gradient", base, expected if expected is not None else torch.zeros_like(base))
    return digest(out)


def reduce_body(rank: int, world: int, cases: list[ReduceCase]) -> list:
    results = []
    for i, case in enumerate(cases):
        chk = Checks(f"[W={world} rank {rank}] ")
        chk.case = f"case {i}: {short(case)}"
        with case_context(i, case):
            fingerprint = _one(chk, rank, world, case)
        results.append((chk.failures, fingerprint))
    return results


_PINNED = [
    ReduceCase("sum", "bfloat16", (5,), "sync", (True,) * 3, "step", False, 1),  # bfloat16 sums
    ReduceCase("sum", "float16", (3, 2), "local", (True, False, True), "transpose", False, 2),
    ReduceCase("max", "bool", (4,), "local", (False,) * 3, "contiguous", False, 3),  # bool any
    ReduceCase("min", "bool", (), "none", (False,) * 3, "contiguous", False, 4),  # bool all, 0-d
    ReduceCase("max", "float64", (4,), "sync", (True,) * 3, "expand", True, 5),  # ties across ranks
    ReduceCase("min", "float64", (3,), "local", (True, False, True), "contiguous", True, 6),
    ReduceCase("mean", "float32", (0, 3), "sync", (True,) * 3, "contiguous", False, 7),  # zero-size
    ReduceCase("mean", "float64", (1,), "sync", (True,) * 3, "step", False, 8),  # 1-element strided slice
    ReduceCase("mean", "int64", (2,), "none", (False,) * 3, "contiguous", False, 9),  # ValueError everywhere
    ReduceCase("sum", "bool", (2,), "local", (False,) * 3, "contiguous", False, 10),
    ReduceCase("mean", "bool", (), "sync", (False,) * 3, "contiguous", False, 11),
]


def _pinned(world: int) -> list[ReduceCase]:
    return [
        ReduceCase(c.op, c.dtype, c.shape, c.grad, c.requires_grad[:world], c.layout, c.ties, c.seed) for c in _PINNED
    ]


@pytest.mark.parametrize("world", [1, 2, 3])
@budget(10)
@given(data=st.data())
def test_all_reduce_matches_single_process_reference(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(reduce_cases(world), 20, 40), label="cases")
    dispatch(reduce_body, world, cases)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_all_reduce_pinned_examples(world: int) -> None:
    dispatch(reduce_body, world, _pinned(world))


@apply(slow)
@pytest.mark.parametrize("world", [2, 3])
@budget(60, 300)
@given(data=st.data())
def test_all_reduce_soak(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(reduce_cases(world), 30, 60), label="cases")
    dispatch(reduce_body, world, cases, timeout=180)
