"""Property 3: the state-sync engine ``sync_states`` equals the single-process reference, sync after sync.

A case is 2–8 states with random names (some long enough that the first sync's metadata outgrows its row),
reductions (sum/mean/min/max/cat, picklable callables, ``None``), tensor and list states (lists empty on some
ranks, or on all), dtypes, shapes, memory layouts and, for ``None``, per-rank shapes. **One** ``SyncPlan`` serves
2–3 consecutive syncs whose row counts (and sometimes fixed shapes) change, so the first-sync path, the cached
plan's one-collective fast path, the growth of ``cat`` capacities and the fallback after a change all run.

Every sync must equal, on every rank and bit-identically across ranks: ``torch.stack(...).sum/mean/amin/amax(0)``
for the reductions, the rank-order concatenation for ``cat`` and list states, ``fn(torch.stack(...))`` for
callables and the stack itself for ``None``. With ``grad="local"`` the gradient reaching a rank's own inputs is
``grad_scale · ∂L_r/∂x_r`` of brute-force autograd on the reference. Inputs are left untouched.

Package modules covered: the sync engine ``distributed._sync`` (plans, rounds, the steady fast path).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests._helpers.checks import Checks, digest, short
from tests._helpers.property import apply, batches, budget, case_context, dispatch, slow, weights
from tests._helpers.states import StateSpec, SyncCase, float_tensors, reduction_fx, reference, state_value, sync_cases
from torchmetrics_diff.distributed._sync import SyncPlan, sync_states

pytestmark = pytest.mark.timeout(240)


def _loss(case: SyncCase, rank: int, result: dict) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for spec in case.states:
        for j, t in enumerate(float_tensors(result[spec.name])):
            total = total + (weights(t.shape, case.seed, spec.name, rank, j) * torch.tanh(t.double())).sum()
    return total


def check_sync(chk: Checks, rank: int, world: int, case: SyncCase, sync: int, plan: SyncPlan) -> dict:
    """One sync of ``case`` with ``plan``: compare values (and gradients); return the result."""
    track = case.grad == "local" and case.requires_grad
    built = {s.name: [state_value(s, sync, r, case.seed, case.ties, False) for r in range(world)] for s in case.states}
    own = {s.name: state_value(s, sync, rank, case.seed, case.ties, track) for s in case.states}
    states = {name: value for name, (_, value) in own.items()}
    before = {name: [t.detach().clone() for t in (v if isinstance(v, list) else [v])] for name, v in states.items()}
    reductions = {s.name: reduction_fx(s.reduction) for s in case.states}

    result = sync_states(states, reductions, plan=plan, grad=case.grad, grad_scale=case.grad_scale)

    tag = f"sync {sync}"
    chk.true(f"{tag} keys", list(result) == [s.name for s in case.states], f"keys {list(result)}")
    for spec in case.states:
        expected = reference(spec, [value for _, value in built[spec.name]])
        chk.same(
            f"{tag} state {spec.name[:20]!r} ({spec.container} {spec.reduction} {spec.dtype})",
            result.get(spec.name),
            expected,
        )
        now = states[spec.name] if isinstance(states[spec.name], list) else [states[spec.name]]
        chk.same(f"{tag} input {spec.name[:20]!r} unchanged", now, before[spec.name], exact=True)
        if case.grad == "none":
            chk.true(
                f"{tag} {spec.name[:20]!r} detached",
                not any(t.requires_grad for t in float_tensors(result[spec.name])),
                "grad='none' returned a tensor requiring grad",
            )

    if track:
        # brute force on one process: every rank's inputs are leaves, the sync replaced by the reference
        ref_leaves = {
            s.name: [state_value(s, sync, r, case.seed, case.ties, True) for r in range(world)] for s in case.states
        }
        ref_result = {s.name: reference(s, [v for _, v in ref_leaves[s.name]]) for s in case.states}
        mine = [
            (s.name, j, lf) for s in case.states for j, lf in enumerate(ref_leaves[s.name][rank][0]) if lf.requires_grad
        ]
        ref_loss = _loss(case, rank, ref_result)
        grads = torch.autograd.grad(ref_loss, [lf for _, _, lf in mine], allow_unused=True) if mine else []
        loss = _loss(case, rank, result)
        if loss.requires_grad:
            loss.backward()
        for (name, j, ref_leaf), expected in zip(mine, grads):
            expected = torch.zeros_like(ref_leaf) if expected is None else expected * case.grad_scale
            chk.grad(f"{tag} gradient of {name[:20]!r} input {j}", own[name][0][j], expected)
    return result


def sync_body(rank: int, world: int, cases: list[SyncCase]) -> list:
    results = []
    for i, case in enumerate(cases):
        chk = Checks(f"[W={world} rank {rank}] ")
        chk.case = f"case {i}: {short(case)}"
        plan = SyncPlan()
        outs = []
        with case_context(i, case):
            for sync in range(case.n_syncs):
                outs.append(check_sync(chk, rank, world, case, sync, plan))
        results.append((chk.failures, digest(outs)))
    return results


# -------------------------------------------------------------------------------------------------- tests


def _spec(
    name: str,
    container: str,
    reduction: str,
    dtype: str,
    *,
    trailing: tuple = (),
    shape: tuple = (),
    rows: tuple = (),
    layout: str = "contiguous",
    n_syncs: int = 3,
) -> StateSpec:
    """A pinned state; ``rows``/``shape`` are per rank (a 3-rank world; truncated for smaller ones), every sync."""
    if container == "list" or reduction == "cat":
        return StateSpec(name, container, reduction, dtype, layout, trailing, (), (tuple(rows),) * n_syncs)
    return StateSpec(name, container, reduction, dtype, layout, (), ((shape,) * 3,) * n_syncs, ())


_PINNED = [
    # a 0- and a 1-element strided slice as states; 0-d sum, bool min/max, bfloat16 sums
    SyncCase(
        (
            _spec("slice1", "tensor", "sum", "float64", shape=(1,), layout="step"),
            _spec("slice0", "tensor", "max", "float32", shape=(0,), layout="step"),
            _spec("cat1", "tensor", "cat", "float64", trailing=(), rows=((1,), (1,), (1,)), layout="step"),
            _spec("scalar", "tensor", "sum", "float64", shape=()),
            _spec("any", "tensor", "max", "bool", shape=(3,)),
            _spec("all", "tensor", "min", "bool", shape=(3,)),
            _spec("bf", "tensor", "sum", "bfloat16", shape=(4,)),
            _spec("bfm", "tensor", "mean", "bfloat16", shape=(2, 2), layout="transpose"),
        ),
        2,
        "local",
        True,
        2.0,
        False,
        11,
    ),
    # an empty cat/list state on every rank; empty on one rank; 0-d list elements
    SyncCase(
        (
            _spec("empty_list", "list", "cat", "float32", trailing=(2,), rows=((), (), ())),
            _spec("empty_cat", "tensor", "cat", "int64", trailing=(3,), rows=((0,), (0,), (0,))),
            _spec("some_empty", "list", "cat", "float64", trailing=(2,), rows=((2, 1), (), (0,))),
            _spec("scalars", "list", "cat", "float16", trailing=(), rows=((-1, -1), (-1,), ())),
            _spec("count", "tensor", "sum", "int64", shape=()),
        ),
        3,
        "local",
        True,
        1.0,
        False,
        12,
    ),
    # ties of min/max (integers as floats), a callable that keeps rank 0, None with per-rank shapes
    SyncCase(
        (
            _spec("mx", "tensor", "max", "float64", shape=(4,)),
            _spec("mn", "tensor", "min", "float64", shape=(2, 2)),
            _spec("first", "tensor", "fn:first", "float64", shape=(3,)),
            StateSpec("ragged", "tensor", "none", "float32", "contiguous", (), (((1, 2), (0, 2), (3, 1)),), ()),
        ),
        1,
        "local",
        True,
        1.0,
        True,
        13,
    ),
]


def _pinned(world: int) -> list[SyncCase]:
    def cut(spec: StateSpec) -> StateSpec:
        return replace(spec, shapes=tuple(s[:world] for s in spec.shapes), rows=tuple(r[:world] for r in spec.rows))

    # grad_scale 1 at world size 1: see test_prop_regressions.py::test_sync_states_grad_scale_ignored_at_world_size_1
    return [
        replace(c, states=tuple(cut(s) for s in c.states), grad_scale=c.grad_scale if world > 1 else 1.0)
        for c in _PINNED
    ]


@pytest.mark.parametrize("world", [1, 2, 3])
@budget(8)
@given(data=st.data())
def test_sync_states_matches_single_process_reference(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(sync_cases(world), 8, 16), label="cases")
    dispatch(sync_body, world, cases)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sync_states_pinned_examples(world: int) -> None:
    dispatch(sync_body, world, _pinned(world))


@apply(slow)
@pytest.mark.parametrize("world", [2, 3])
@budget(60, 300)
@given(data=st.data())
def test_sync_states_soak(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(sync_cases(world), 10, 30), label="cases")
    dispatch(sync_body, world, cases, timeout=180)
