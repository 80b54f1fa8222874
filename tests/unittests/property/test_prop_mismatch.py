"""Property 4: cross-rank disagreements raise on *every* rank, and the group keeps working afterwards.

One rank (the "odd" one) deviates on purpose. For the collectives: another ndim, dtype, shape (``all_reduce``),
trailing shape (``all_gather_cat``), op, grad mode, or ``requires_grad`` under ``grad="sync"``; or a local
problem (a bad ``grad``/``op`` value, a non-tensor, an unsupported dtype). For the sync engine, after 0–2 valid
syncs with the same ``SyncPlan`` (so the deviation hits the first-sync path or the cached-plan fast path): a state
of another dtype or shape, 0-d against 1-d, a missing or an extra state, another order, another reduction, or a
rank that fails before syncing (a list state that cannot be concatenated, a dtype that cannot be sent).

Every rank must raise — a ``RuntimeError`` with the same message on every rank for disagreements, the odd rank's
own error (and a ``RuntimeError`` naming it elsewhere) for local problems — and then a valid collective, and a
valid sync with the *same* plan, must give the right answer.

Package modules covered: the agreement checks of ``distributed`` (collectives and the sync engine
``distributed._sync``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests._helpers.checks import Checks, short
from tests._helpers.harness import run_distributed
from tests._helpers.property import apply, batches, budget, case_context, seeded, slow
from tests._helpers.states import StateSpec, SyncCase, reduction_fx, state_value, sync_cases
from tests.unittests.property.test_prop_sync_engine import check_sync
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.distributed._sync import SyncPlan, sync_states

pytestmark = pytest.mark.timeout(240)

# what the odd rank does differently, per target; "local" kinds are problems of the odd rank's own arguments
COLLECTIVE_KINDS = {
    "gather": ("ndim", "dtype", "grad", "sync_requires_grad", "bad_grad", "not_tensor", "bad_dtype"),
    "cat": ("ndim", "dtype", "trailing", "grad", "sync_requires_grad", "bad_grad", "not_tensor", "bad_dtype"),
    "reduce": ("ndim", "dtype", "shape", "op", "grad", "sync_requires_grad", "bad_grad", "bad_op", "bad_dtype"),
}
LOCAL_KINDS = ("bad_grad", "bad_op", "not_tensor", "bad_dtype", "fail_cat")
#: what the other ranks raise: for a rank that failed on its own (a local kind), for a disagreement
PEER_ERRORS = ("PeerFailedError", "RanksDisagreeError")
SYNC_KINDS = ("dtype", "shape", "zero_d", "missing", "extra", "order", "reduction", "fail_cat", "bad_dtype")
_OTHER_DTYPE = {"float32": "float64", "float64": "int64", "int64": "float16", "float16": "bfloat16", "bool": "int64"}


@dataclass(frozen=True)
class CollectiveMismatch:
    target: str  # gather | cat | reduce
    kind: str
    odd: int
    dtype: str
    shape: tuple[int, ...]
    op: str
    grad: str
    seed: int


@st.composite
def collective_mismatches(draw: st.DrawFn, world: int) -> CollectiveMismatch:
    target = draw(st.sampled_from(tuple(COLLECTIVE_KINDS)))
    kind = draw(st.sampled_from(COLLECTIVE_KINDS[target]))
    dtype = draw(
        st.sampled_from(("float32", "float64", "float16") if kind == "sync_requires_grad" else tuple(_OTHER_DTYPE))
    )
    op = draw(st.sampled_from(("max", "min") if dtype == "bool" else ("sum", "max", "min")))
    grad = "sync" if kind == "sync_requires_grad" else draw(st.sampled_from(("none", "local", "sync")))
    # all_gather_cat takes a 0-d tensor as one row: 0-d against (1,) is no disagreement
    ndim = draw(st.integers(2 if kind == "trailing" else 1 if (target, kind) == ("cat", "ndim") else 0, 3))
    shape = tuple(draw(st.integers(0 if kind != "shape" else 1, 3)) for _ in range(ndim))
    return CollectiveMismatch(
        target, kind, draw(st.integers(0, world - 1)), dtype, shape, op, grad, draw(st.integers(0, 10**6))
    )


def _collective_args(case: CollectiveMismatch, rank: int) -> tuple[Any, str, str]:
    """``(tensor, grad, op)`` of ``rank``."""
    x: Any = seeded(case.shape, case.dtype, "contiguous", False, case.seed, rank)
    grad, op = case.grad, case.op
    if case.kind == "sync_requires_grad":
        x.requires_grad_(True)
    if rank != case.odd:
        return x, grad, op
    kind = case.kind
    if kind == "ndim":
        x = x.unsqueeze(0)
    elif kind == "dtype":
        x = x.to(getattr(torch, _OTHER_DTYPE[case.dtype]))
    elif kind in ("shape", "trailing"):  # one more element along the last dimension
        x = torch.zeros(*x.shape[:-1], x.shape[-1] + 1, dtype=x.dtype) if x.ndim else x.reshape(1)
    elif kind == "op":
        op = {"sum": "max", "max": "min", "min": "max"}[op]
    elif kind == "grad":
        grad = {"none": "local", "local": "sync", "sync": "none"}[grad]
    elif kind == "sync_requires_grad":
        x = x.detach()
    elif kind == "bad_grad":
        grad = "bogus"
    elif kind == "bad_op":
        op = "prod"
    elif kind == "not_tensor":
        x = x.tolist()
    elif kind == "bad_dtype":
        x = torch.zeros(x.shape, dtype=torch.uint16)
    return x, grad, op


def _call(case: CollectiveMismatch, rank: int) -> Any:
    x, grad, op = _collective_args(case, rank)
    if case.target == "gather":
        return gather_all_tensors(x, grad=grad)
    if case.target == "cat":
        return all_gather_cat(x, grad=grad)
    return all_reduce(x, op, grad=grad)


def _outcome(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except Exception as err:  # the error is the result here
        return type(err).__name__, str(err)
    return "no error", ""


def _group_still_works(chk: Checks, rank: int, world: int) -> None:
    got = all_gather_cat(torch.tensor([rank]), grad="none")
    chk.same("a valid collective afterwards", got, torch.arange(world), exact=True)
    total = all_reduce(torch.tensor([float(rank)]), "sum", grad="none")
    chk.same("a valid all_reduce afterwards", total, torch.tensor([float(sum(range(world)))]), exact=True)


def collective_body(rank: int, world: int, cases: list[CollectiveMismatch]) -> list:
    results = []
    for i, case in enumerate(cases):
        chk = Checks(f"[W={world} rank {rank}] ")
        chk.case = f"case {i}: {short(case)}"
        outcome = _outcome(lambda case=case: _call(case, rank))
        with case_context(i, case):
            _group_still_works(chk, rank, world)
        results.append((chk.failures, outcome))
    return results


def _assert_every_rank_raised(world: int, cases: list, per_rank: list, kind_of: Any, needle_of: Any) -> None:
    problems = []
    for i, case in enumerate(cases):
        outcomes = [per_rank[r][i][1] for r in range(world)]
        before = len(problems)
        kind, odd = kind_of(case), case.odd
        for rank, (err, message) in enumerate(outcomes):
            if kind in LOCAL_KINDS and rank == odd:
                if err in ("no error", "RuntimeError", *PEER_ERRORS) and kind != "fail_cat":
                    problems.append(f"case {i} rank {rank} (odd): {err} {message[:200]!r}, expected its own error")
                elif err == "no error":
                    problems.append(f"case {i} rank {rank} (odd): no error")
            elif err != (want := PEER_ERRORS[kind not in LOCAL_KINDS]):
                problems.append(f"case {i} rank {rank}: {err} {message[:300]!r}, expected {want}")
            elif kind in LOCAL_KINDS and not (str(odd) in message and "raised" in message):
                problems.append(f"case {i} rank {rank}: message {message[:300]!r} does not name rank {odd}")
            elif (needle := needle_of(case)) and needle not in message:
                problems.append(f"case {i} rank {rank}: message {message[:300]!r} lacks {needle[:60]!r}")
        if kind not in LOCAL_KINDS and len({m for _, m in outcomes}) != 1:
            problems.append(f"case {i}: the ranks' messages differ: {[m[:200] for _, m in outcomes]}")
        if len(problems) > before:
            problems.append(f"    case {i} = {short(case)}")
    assert not problems, f"W={world}:\n" + "\n".join(problems[:30])


# -------------------------------------------------------------------------------------------- sync engine


@dataclass(frozen=True)
class SyncMismatch:
    base: SyncCase  # n_syncs = pre + 1: the last sync is the deviating one, then repeated validly
    kind: str
    odd: int
    state: int


def _detectable(spec: StateSpec, kind: str, sync: int, world: int) -> bool:
    """Whether deviating ``spec`` by ``kind`` is a disagreement the engine can see at ``sync``."""
    fixed = spec.container == "tensor" and not spec.is_cat
    if kind == "dtype":
        return spec.container == "tensor"
    if kind == "shape":
        return spec.container == "tensor"
    if kind == "zero_d":
        return fixed and spec.reduction in ("sum", "mean", "min", "max") and spec.shapes[sync][0] == ()
    if kind == "reduction":
        return spec.container == "tensor" and spec.reduction in ("sum", "mean", "min", "max", "cat")
    return True


@st.composite
def sync_mismatches(draw: st.DrawFn, world: int) -> SyncMismatch:
    base = draw(sync_cases(world, min_states=1, max_states=5))
    pre = draw(st.integers(0, 2))
    # the same data for the `pre` valid syncs' last one and the deviating one: a steady signature on the fast path
    base = replace(base, n_syncs=pre + 1, grad="none")
    base = replace(base, states=tuple(_truncate(s, pre + 1) for s in base.states))
    kind = draw(st.sampled_from(SYNC_KINDS))
    candidates = [i for i, s in enumerate(base.states) if _detectable(s, kind, pre, world)]
    if not candidates:
        kind, candidates = "extra", [0]
    return SyncMismatch(base, kind, draw(st.integers(0, world - 1)), draw(st.sampled_from(candidates)))


def _truncate(spec: StateSpec, n: int) -> StateSpec:
    def pad(seq: tuple) -> tuple:
        return (seq * n)[:n] if seq else seq

    return replace(spec, shapes=pad(spec.shapes), rows=pad(spec.rows))


def _deviate(case: SyncMismatch, states: dict, reductions: dict) -> None:
    """Apply the odd rank's deviation to its ``states``/``reductions`` in place."""
    names = list(states)
    name = names[case.state]
    value = states[name]
    kind = case.kind
    if kind == "dtype":
        dtype = value.dtype
        # a valid dtype for the reduction, only different (an int ``mean`` state is an error of its own)
        other = torch.int64 if dtype.is_floating_point and reductions[name] != "mean" else torch.float32
        if other == dtype:
            other = torch.float64
        states[name] = value.to(other)
    elif kind == "shape":
        if reductions[name] == "cat":
            rows = value.reshape(1) if value.ndim == 0 else value
            states[name] = rows.unsqueeze(-1)  # another trailing shape
        elif reductions[name] in ("sum", "mean", "min", "max"):
            states[name] = value.unsqueeze(-1).expand(*value.shape, 2)
        else:
            states[name] = value.unsqueeze(0)  # gathered states: another number of dimensions
    elif kind == "zero_d":
        states[name] = value.reshape(1)
    elif kind == "missing":
        del states[name], reductions[name]
    elif kind == "extra":
        states["Z_extra"], reductions["Z_extra"] = torch.ones(1), "sum"
    elif kind == "order":
        other = names[(case.state + 1) % len(names)]
        order = [n for n in names if n not in (name, other)] + [other, name] if other != name else names[::-1]
        for n in order:
            states[n] = states.pop(n)
            reductions[n] = reductions.pop(n)
        if list(states) == names:  # a single state has no order to change: add one instead
            states["Z_extra"], reductions["Z_extra"] = torch.ones(1), "sum"
    elif kind == "reduction":
        current = reductions[name]
        reductions[name] = {"sum": "max", "mean": "sum", "min": None, "max": "min", "cat": None}[current]
    elif kind == "fail_cat":
        states[name] = [torch.ones(1, 2), torch.ones(1, 3)]  # torch.cat fails on this rank only
    elif kind == "bad_dtype":
        states[name] = torch.zeros(2, dtype=torch.uint16)


def sync_mismatch_body(rank: int, world: int, cases: list[SyncMismatch]) -> list:
    results = []
    for i, case in enumerate(cases):
        chk = Checks(f"[W={world} rank {rank}] ")
        chk.case = f"case {i}: {short(case)}"
        base = case.base
        plan = SyncPlan()
        last = base.n_syncs - 1
        with case_context(i, case):
            for sync in range(last):
                check_sync(chk, rank, world, base, sync, plan)
        states = {s.name: state_value(s, last, rank, base.seed, base.ties, False)[1] for s in base.states}
        reductions = {s.name: reduction_fx(s.reduction) for s in base.states}
        if rank == case.odd:
            _deviate(case, states, reductions)
        outcome = _outcome(lambda s=states, r=reductions, p=plan: sync_states(s, r, plan=p))
        with case_context(i, case):
            _group_still_works(chk, rank, world)
            check_sync(chk, rank, world, base, last, plan)  # the same plan, valid states: the right answer
        results.append((chk.failures, outcome))
    return results


def _sync_needle(case: SyncMismatch) -> str:
    if case.kind in ("order", "extra") or case.kind in LOCAL_KINDS:
        return ""
    return repr(case.base.states[case.state].name)


# -------------------------------------------------------------------------------------------------- tests


def run_checked(body: Any, world: int, cases: list) -> list:
    """Like ``dispatch``, without comparing results across ranks: the outcomes are compared per kind instead."""
    per_rank = run_distributed(body, world, cases, timeout=120)
    failures = [f for rank_results in per_rank for failures, _ in rank_results for f in failures]
    assert not failures, "\n".join(failures[:12])
    return per_rank


@pytest.mark.parametrize("world", [2, 3])
@budget(6)
@given(data=st.data())
def test_collective_disagreements_raise_everywhere(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(collective_mismatches(world), 15, 30), label="cases")
    per_rank = run_checked(collective_body, world, cases)
    _assert_every_rank_raised(world, cases, per_rank, lambda c: c.kind, lambda c: "")


@pytest.mark.parametrize("world", [2, 3])
@budget(6)
@given(data=st.data())
def test_sync_disagreements_raise_everywhere(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(sync_mismatches(world), 8, 16), label="cases")
    per_rank = run_checked(sync_mismatch_body, world, cases)
    _assert_every_rank_raised(world, cases, per_rank, lambda c: c.kind, _sync_needle)


@apply(slow)
@pytest.mark.parametrize("world", [2, 3])
@budget(40, 200)
@given(data=st.data())
def test_disagreements_soak(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(collective_mismatches(world), 20, 40), label="cases")
    _assert_every_rank_raised(world, cases, run_checked(collective_body, world, cases), lambda c: c.kind, lambda c: "")
    cases = data.draw(batches(sync_mismatches(world), 10, 20), label="sync cases")
    _assert_every_rank_raised(
        world, cases, run_checked(sync_mismatch_body, world, cases), lambda c: c.kind, _sync_needle
    )
