"""Property 5: a randomly configured ``Metric`` equals the single-process reference over every rank's data.

``RandomStates`` (module level, so workers can unpickle it) registers the states a case describes — tensor states
with sum/mean/min/max/cat/callable/``None`` reductions and ``cat`` list states, random dtypes and shapes — and
``update`` folds a batch into them (sum-like states add, min/max compare, cat states concatenate, lists append).
``compute`` returns every state.

A case runs rounds of several ``update`` calls followed by ``compute`` (which syncs with the metric's epoch plan,
row counts changing from round to round), then ``reset`` and several ``forward`` calls (the step plan), then a
last ``compute``:

* ``compute`` equals the reference: every rank's accumulated states, reduced across ranks as the engine's
  reference does (world size 1: the local states; no sync happens there);
* ``forward`` with ``dist_sync_on_step=True`` returns the value of the *global* batch on every rank (without it,
  the local batch's value), and its gradient reaching a rank's own float64 inputs is ``W · ∂L_r/∂x_r`` (the
  ``grad_reduction="mean"`` scaling) of brute-force autograd on that reference;
* the accumulators after ``forward`` follow the documented merge (running mean for ``mean`` states, a replay of
  ``update`` when a callable or ``None`` reduction is present).

Package modules covered: ``metric`` (states, ``update``/``compute``, ``merge_state``) over the sync engine
``distributed._sync``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests._helpers.checks import Checks, digest, short
from tests._helpers.property import DTYPES, apply, batches, budget, case_context, dispatch, leaf, seeded, slow, weights
from tests._helpers.states import dtypes_for, reduction_fx, reference
from torchmetrics_diff import Metric

pytestmark = pytest.mark.timeout(240)


@dataclass(frozen=True)
class MetricState:
    name: str
    container: str  # tensor | list
    reduction: str  # sum mean min max cat fn:sum0 fn:first none (lists: cat)
    dtype: str
    shape: tuple[int, ...]  # fixed-shape states; the trailing shape of cat/list states

    @property
    def is_cat(self) -> bool:
        return self.container == "list" or self.reduction == "cat"


@dataclass(frozen=True)
class MetricCase:
    states: tuple[MetricState, ...]
    rounds: tuple[int, ...]  # update() calls before each compute()
    n_forward: int
    rows: tuple[tuple[tuple[int, ...], ...], ...]  # [call][state][rank]: rows of cat/list inputs
    sync_on_step: bool
    requires_grad: bool
    ties: bool
    seed: int


def _default(spec: MetricState) -> Any:
    dtype = DTYPES[spec.dtype]
    if spec.container == "list":
        return []
    if spec.reduction == "cat":
        return torch.zeros((0, *spec.shape), dtype=dtype)
    if spec.reduction in ("min", "max"):
        high = spec.reduction == "min"
        if dtype == torch.bool:
            return torch.full(spec.shape, high)
        if dtype.is_floating_point:
            return torch.full(spec.shape, float("inf") if high else float("-inf"), dtype=dtype)
        info = torch.iinfo(dtype)
        return torch.full(spec.shape, info.max if high else info.min, dtype=dtype)
    return torch.zeros(spec.shape, dtype=dtype)


def fold(spec: MetricState, state: Any, x: torch.Tensor) -> Any:
    """``update`` of one state with one input (also the reference's)."""
    if spec.container == "list":
        return [*state, x]
    if spec.reduction == "cat":
        return torch.cat([state, x])
    if spec.reduction == "min":
        return torch.minimum(state, x)
    if spec.reduction == "max":
        return torch.maximum(state, x)
    return state + x


class RandomStates(Metric):
    """The states of a :class:`MetricCase`; ``update(batch)`` takes a dict ``name -> tensor``."""

    full_state_update = False

    def __init__(self, specs: tuple[MetricState, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.specs = specs
        for spec in specs:
            self.add_state(spec.name, _default(spec), dist_reduce_fx=reduction_fx(spec.reduction))

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        for spec in self.specs:
            setattr(self, spec.name, fold(spec, getattr(self, spec.name), batch[spec.name]))

    def compute(self) -> dict[str, Any]:
        return {spec.name: _as_value(spec, getattr(self, spec.name)) for spec in self.specs}


def _as_value(spec: MetricState, state: Any) -> Any:
    if spec.container == "list":
        return torch.cat(state) if state else None
    return state


# ---------------------------------------------------------------------------------------------- strategies


@st.composite
def metric_states(draw: st.DrawFn, name: str) -> MetricState:
    container = draw(st.sampled_from(("tensor", "tensor", "tensor", "list")))
    if container == "list":
        reduction = "cat"
    else:
        reduction = draw(st.sampled_from(("sum", "mean", "min", "max", "cat", "fn:sum0", "fn:first", "none")))
    dtypes = dtypes_for(container, reduction)
    if reduction in ("fn:sum0", "fn:first", "none"):
        dtypes = tuple(d for d in dtypes if d != "bool")  # `update` adds: bools do not add
    dtype = draw(st.sampled_from(dtypes))
    if container == "list" or reduction == "cat" or reduction in ("fn:sum0", "fn:first", "none"):
        shape = tuple(draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2))))
    else:
        shape = tuple(draw(st.integers(0, 3)) for _ in range(draw(st.integers(0, 2))))
    return MetricState(name, container, reduction, dtype, shape)


@st.composite
def metric_cases(draw: st.DrawFn, world: int) -> MetricCase:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True), min_size=1, max_size=6, unique=True))
    states = [draw(metric_states(f"st_{n}")) for n in names]
    # a non-empty max state in every case (zero-byte rounds are pinned in test_round_b_of_zero_bytes)
    states.append(MetricState("st_zpad", "tensor", "max", "float32", (2,)))
    rounds = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    n_forward = draw(st.integers(0, 3))
    calls = sum(rounds) + n_forward
    row = st.one_of(st.integers(0, 4), st.integers(0, 12))
    rows = tuple(tuple(tuple(draw(row) for _ in range(world)) for _ in states) for _ in range(calls))
    return MetricCase(
        tuple(states),
        rounds,
        n_forward,
        rows,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.integers(0, 2**31 - 1)),
    )


# ------------------------------------------------------------------------------------------------- checking


def _batch(case: MetricCase, call: int, rank: int, requires_grad: bool = False) -> dict[str, torch.Tensor]:
    out = {}
    for k, spec in enumerate(case.states):
        shape = (case.rows[call][k][rank], *spec.shape) if spec.is_cat else spec.shape
        x = seeded(shape, spec.dtype, "contiguous", case.ties, case.seed, "m", call, spec.name, rank)
        out[spec.name] = leaf(x, requires_grad and spec.dtype == "float64")
    return out


def _folded(case: MetricCase, calls: range, rank: int, batches: list | None = None) -> dict[str, Any]:
    """Rank ``rank``'s states after ``update`` with the inputs of ``calls``, from the defaults."""
    states = {s.name: _default(s) for s in case.states}
    for i, call in enumerate(calls):
        batch = batches[i] if batches is not None else _batch(case, call, rank)
        for spec in case.states:
            states[spec.name] = fold(spec, states[spec.name], batch[spec.name])
    return states


def _merged(case: MetricCase, calls: range, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s accumulators after ``forward`` with the inputs of ``calls`` (the documented merge)."""
    if any(s.reduction.startswith("fn:") or s.reduction == "none" for s in case.states):
        return _folded(case, calls, rank)  # replayed update
    acc = {s.name: _default(s) for s in case.states}
    for count, call in enumerate(calls, start=1):
        batch_states = _folded(case, range(call, call + 1), rank)
        for spec in case.states:
            if spec.reduction == "mean" and spec.container == "tensor":
                a, b = acc[spec.name], batch_states[spec.name]
                acc[spec.name] = a + (b - a) / count
            else:
                acc[spec.name] = fold(spec, acc[spec.name], _only_input(spec, batch_states[spec.name]))
    return acc


def _only_input(spec: MetricState, batch_state: Any) -> Any:
    """The input that, folded into the accumulator, merges ``batch_state`` into it."""
    if spec.container == "list":
        (x,) = batch_state
        return x
    return batch_state  # sum: default 0; min/max: the default is neutral; cat: the default has no rows


def _expected(case: MetricCase, world: int, rank: int, per_rank: list[dict[str, Any]], sync: bool) -> dict:
    out = {}
    for spec in case.states:
        if world == 1 or not sync:
            value = _as_value(spec, per_rank[rank][spec.name])
        else:
            value = reference(spec, [states[spec.name] for states in per_rank])
            if spec.container == "list":
                value = value if isinstance(value, torch.Tensor) else None
        out[spec.name] = value
    return out


def _compare(chk: Checks, what: str, got: dict, expected: dict) -> None:
    for name, value in expected.items():
        if value is None:
            chk.true(f"{what} {name}", got.get(name) is None, f"expected None, got {got.get(name)!r}")
        else:
            chk.same(f"{what} {name}", got.get(name), value)


def _loss(case: MetricCase, rank: int, value: dict) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for spec in case.states:
        v = value[spec.name]
        for j, t in enumerate(v if isinstance(v, list) else [v]):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                total = total + (weights(t.shape, case.seed, spec.name, rank, j) * torch.tanh(t.double())).sum()
    return total


def _one(chk: Checks, rank: int, world: int, case: MetricCase) -> list:
    metric = RandomStates(case.states, dist_sync_on_step=case.sync_on_step)
    seen: list = []
    call = 0
    for r, n_updates in enumerate(case.rounds):
        for _ in range(n_updates):
            metric.update(_batch(case, call, rank))
            call += 1
        value = metric.compute()
        per_rank = [_folded(case, range(call), q) for q in range(world)]
        _compare(chk, f"compute() of round {r}", value, _expected(case, world, rank, per_rank, True))
        seen.append(value)

    metric.reset()
    start = call
    for f in range(case.n_forward):
        batch = _batch(case, call, rank, case.requires_grad)
        value = metric(batch)
        per_rank = [_folded(case, range(call, call + 1), q) for q in range(world)]
        _compare(chk, f"forward {f}", value, _expected(case, world, rank, per_rank, case.sync_on_step))
        leaves = [t for t in batch.values() if t.requires_grad]
        if leaves:
            # brute force: every rank's batch as leaves, the sync replaced by the reference
            ref_batches = [_batch(case, call, q, True) for q in range(world)]
            ref_states = [_folded(case, range(call, call + 1), q, [ref_batches[q]]) for q in range(world)]
            ref_value = _expected(case, world, rank, ref_states, case.sync_on_step)
            mine = [t for t in ref_batches[rank].values() if t.requires_grad]
            expected = torch.autograd.grad(_loss(case, rank, ref_value), mine, allow_unused=True)
            loss = _loss(case, rank, value)
            if loss.requires_grad:
                loss.backward()
            scale = world if case.sync_on_step else 1  # grad_reduction="mean" compensates DDP's averaging
            for (name, x), e in zip([(n, t) for n, t in batch.items() if t.requires_grad], expected):
                chk.grad(f"forward {f} gradient of {name}", x, torch.zeros_like(x) if e is None else e * scale)
        if case.sync_on_step:  # the local batch's value differs between ranks otherwise
            seen.append(value)
        call += 1
    if case.n_forward:
        value = metric.compute()
        per_rank = [_merged(case, range(start, call), q) for q in range(world)]
        _compare(chk, "compute() after forward", value, _expected(case, world, rank, per_rank, True))
        seen.append(value)
    return seen


def metric_body(rank: int, world: int, cases: list[MetricCase]) -> list:
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, case in enumerate(cases):
            chk = Checks(f"[W={world} rank {rank}] ")
            chk.case = f"case {i}: {short(case)}"
            with case_context(i, case):
                seen = _one(chk, rank, world, case)
            results.append((chk.failures, digest(seen)))
    return results


# -------------------------------------------------------------------------------------------------- tests

_PINNED = [
    MetricCase(
        (
            MetricState("st_total", "tensor", "sum", "bfloat16", (3,)),
            MetricState("st_avg", "tensor", "mean", "float64", ()),
            MetricState("st_any", "tensor", "max", "bool", (2,)),
            MetricState("st_all", "tensor", "min", "bool", (2,)),
            MetricState("st_rows", "list", "cat", "float64", (2,)),
            MetricState("st_cat", "tensor", "cat", "int64", ()),
            MetricState("st_zpad", "tensor", "max", "float32", (2,)),
        ),
        (2, 1),
        3,
        # rows [call][state][rank]: a rank with no rows; every rank without rows at the last forward
        tuple(tuple((c % 3, 0, 2 + c)[:3] if c < 5 else (0, 0, 0) for _ in range(7)) for c in range(6)),
        True,
        True,
        False,
        21,
    ),
]


def _pinned(world: int) -> list[MetricCase]:
    return [replace(c, rows=tuple(tuple(r[:world] for r in call) for call in c.rows)) for c in _PINNED]


@pytest.mark.parametrize("world", [1, 2, 3])
@budget(6)
@given(data=st.data())
def test_metric_matches_single_process_reference(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(metric_cases(world), 6, 12), label="cases")
    dispatch(metric_body, world, cases)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_metric_pinned_examples(world: int) -> None:
    dispatch(metric_body, world, _pinned(world))


@apply(slow)
@pytest.mark.parametrize("world", [2, 3])
@budget(40, 200)
@given(data=st.data())
def test_metric_soak(world: int, data: st.DataObject) -> None:
    cases = data.draw(batches(metric_cases(world), 10, 20), label="cases")
    dispatch(metric_body, world, cases, timeout=180)
