"""What a reduction means (``distributed/_reductions.py``), checked against independent references, and the sync
engine (``distributed/_sync``) checked against it.

- :func:`merge` and the row reduce (:func:`reduce_rows`, :func:`reduce_ranks`) for every reduction name, against
  NumPy or a plain Python loop; the 0-d-row rule; the dtype rules.
- ``sync_states`` at world sizes 1, 2 and 3 with uneven rows (a rank with none included), on the first sync
  (an agreement) and on the plan's row of the next ones, against :func:`reduce_ranks` of the per-rank values, which
  every rank rebuilds from seeds.
- ``Metric`` asks the same module: ``merge_state``, ``forward``'s fold of a batch into the accumulated states, the
  single-rank sync (no collective: the states are the result) and a custom ``dist_sync_fn`` all give what
  :func:`merge` and :func:`reduce_ranks` give.
- The signature rows the ranks exchange: a :class:`StateSignature` encodes to the same bytes (and hash) as the
  plain lists the engine sent before it was a ``NamedTuple``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from tests._helpers.harness import run_distributed
from tests._helpers.seeds import generator
from torchmetrics_diff import Metric
from torchmetrics_diff.distributed import _reductions as R
from torchmetrics_diff.distributed._sync import SyncPlan, sync_states
from torchmetrics_diff.distributed._sync.plan import StateSignature, entries, signature_hash

pytestmark = pytest.mark.timeout(120)

ELEMENTWISE_NP = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _gen(*parts: object) -> torch.Generator:
    return generator(*parts)


# --------------------------------------------------------------------------------------------- names and rules


def test_names() -> None:
    assert R.REDUCTIONS == ("sum", "mean", "min", "max", "cat")
    assert R.ELEMENTWISE == ("sum", "mean", "min", "max")
    assert [R.is_elementwise(n) for n in R.REDUCTIONS] == [True, True, True, True, False]
    assert [R.is_cat(n) for n in R.REDUCTIONS] == [False, False, False, False, True]
    assert [R.valid(f) for f in ("sum", "cat", None, torch.sum, "prod", 3)] == [True, True, True, True, False, False]
    assert [R.all_reduce_op(n) for n in R.ELEMENTWISE] == ["sum", "sum", "min", "max"]


@pytest.mark.parametrize(
    ("fx", "dtype", "order", "expected"),
    [
        ("mean", torch.int64, True, R.MEAN_NEEDS_FLOAT),
        ("mean", torch.bool, True, R.MEAN_NEEDS_FLOAT),
        ("mean", torch.float16, True, None),
        ("mean", torch.complex64, True, None),
        ("sum", torch.bool, True, R.NO_BOOL_SUM),
        ("sum", torch.int32, True, None),
        ("max", torch.bool, True, None),
        ("min", torch.complex64, True, R.NO_COMPLEX_ORDER),
        ("min", torch.complex64, False, None),
        ("cat", torch.bool, True, None),
        (torch.sum, torch.bool, True, None),
        (None, torch.int64, True, None),
        ("mean", None, True, None),
    ],
)
def test_dtype_conflicts(fx: Any, dtype: Any, order: bool, expected: Any) -> None:
    assert R.dtype_conflict(fx, dtype, order=order) == expected


def test_zero_d_is_one_row() -> None:
    scalar, vector, matrix = torch.tensor(2.0), torch.arange(3.0), torch.ones(2, 3)
    assert R.as_rows(scalar).shape == (1,) and R.as_rows(scalar).item() == 2.0
    assert R.as_rows(vector) is vector and R.as_rows(matrix) is matrix
    assert R.cat_rows([]) is None
    assert R.cat_rows([vector]) is vector
    assert torch.equal(R.cat_rows([scalar, vector, torch.tensor(5.0)]), torch.tensor([2.0, 0.0, 1.0, 2.0, 5.0]))
    assert torch.equal(R.reduce_ranks("cat", [scalar, torch.zeros(0), vector]), torch.tensor([2.0, 0.0, 1.0, 2.0]))


def test_wire_view() -> None:
    flags = torch.tensor([True, False])
    assert R.wire_view(flags).dtype == torch.uint8 and R.wire_view(flags).tolist() == [1, 0]
    floats = torch.ones(2)
    assert R.wire_view(floats) is floats


# --------------------------------------------------------------------------------------------- the row reduce


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (op, dtype)
        for op in ELEMENTWISE_NP
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64)
        if op != "mean" or dtype.is_floating_point  # the checks reject a mean of integers before any reduce
    ],
)
def test_reduce_rows_against_numpy(op: str, dtype: torch.dtype) -> None:
    rows = (torch.randn(3, 4, 2, generator=_gen(op, dtype)) * 10).to(dtype)
    out = R.reduce_rows(op, rows)
    expected = ELEMENTWISE_NP[op](rows.numpy(), axis=0)
    assert out.dtype == dtype, "a reduced value comes back in its own dtype"
    np.testing.assert_allclose(out.numpy(), expected.astype(out.numpy().dtype), rtol=1e-6)


def test_reduce_rows_of_bools_is_any_or_all() -> None:
    rows = torch.tensor([[True, False, False], [True, True, False]])
    assert R.reduce_rows("max", rows).tolist() == [True, True, False]
    assert R.reduce_rows("min", rows).tolist() == [True, False, False]


def test_reduce_ranks_for_every_reduction() -> None:
    values = [torch.randn(2, 3, generator=_gen("ranks", r)) for r in range(3)]
    arrays = [v.numpy() for v in values]
    for op, ref in ELEMENTWISE_NP.items():
        np.testing.assert_allclose(R.reduce_ranks(op, values).numpy(), ref(np.stack(arrays), axis=0), rtol=1e-6)
    np.testing.assert_array_equal(R.reduce_ranks("cat", values).numpy(), np.concatenate(arrays))
    np.testing.assert_array_equal(R.reduce_ranks(None, values).numpy(), np.stack(arrays))
    np.testing.assert_allclose(R.reduce_ranks(lambda s: s.prod(0), values).numpy(), np.prod(np.stack(arrays), 0))
    uneven = [torch.ones(2), torch.ones(3)]
    assert R.reduce_ranks(None, uneven) == uneven, "values of different shapes reach None/callables as a list"
    assert R.reduce_ranks(None, [values[0]]).shape == (1, 2, 3)


# --------------------------------------------------------------------------------------------- merge


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_merge_elementwise_against_numpy(op: str) -> None:
    a, b = torch.randn(5, generator=_gen("a", op)), torch.randn(5, generator=_gen("b", op))
    ref = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    np.testing.assert_allclose(R.merge(op, a, b, 2).numpy(), ref(a.numpy(), b.numpy()), rtol=1e-6)


def test_merge_mean_is_a_running_mean() -> None:
    batches = [torch.randn(4, generator=_gen("mean", i), dtype=torch.float64) for i in range(6)]
    acc = batches[0]
    for count, batch in enumerate(batches[1:], start=2):
        acc = R.merge("mean", acc, batch, count)
    np.testing.assert_allclose(acc.numpy(), np.mean([b.numpy() for b in batches], axis=0), rtol=1e-12)


def test_merge_cat_and_lists() -> None:
    out = R.merge("cat", torch.tensor(1.0), torch.tensor([2.0, 3.0]), 2)
    assert out.tolist() == [1.0, 2.0, 3.0], "a 0-d value is one row"
    acc = [torch.ones(2)]
    same = R.merge("cat", acc, [torch.zeros(1)], 2)
    assert same is acc and [t.tolist() for t in acc] == [[1.0, 1.0], [0.0]], "a list grows in place"
    R.merge("cat", acc, torch.tensor(4.0), 3)
    assert len(acc) == 3 and acc[-1].item() == 4.0


def test_merge_callable_and_none() -> None:
    a, b = torch.tensor([1.0, 5.0]), torch.tensor([3.0, 2.0])
    assert R.merge(lambda s: s.prod(0), a, b, 2).tolist() == [3.0, 10.0]
    with pytest.raises(RuntimeError, match=r"MyMetric: state 'x' with dist_reduce_fx=None cannot be merged"):
        R.merge(None, a, b, 2, owner="MyMetric", name="x")


def test_merge_keeps_the_accumulator_dtype() -> None:
    acc = torch.ones(3, dtype=torch.float32)
    new = torch.full((3,), 0.1, dtype=torch.float64)
    for op in ("sum", "mean", "max", "min", "cat"):
        assert R.merge(op, acc, new, 2).dtype == torch.float32, op
    assert R.merge("sum", torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int64), 2).dtype == torch.int32


# --------------------------------------------------------------------------------------------- the wire rows


def test_signature_rows_encode_as_plain_lists() -> None:
    """The bytes ranks exchange: a ``StateSignature`` is the JSON array the engine always sent (hashes pinned)."""
    cases = {
        -1822956555579709675: ({"total": torch.tensor(3.0), "n": torch.zeros(2, 3, dtype=torch.int64)}, ["sum", "max"]),
        8124427052474250062: (
            {"preds": [torch.ones(4, 2)], "target": [], "x": torch.tensor(1.0, dtype=torch.float64)},
            ["cat", "cat", "mean"],
        ),
        -4618658386257338368: (
            {"g": torch.ones(2, 5), "h": torch.ones(3), "k": torch.tensor(2)},
            [None, torch.sum, "cat"],
        ),
    }
    for pinned, (states, fns) in cases.items():
        signature = [e.signature() for e in entries(states, dict(zip(states, fns)))]
        as_lists = [list(row) for row in signature]
        assert json.dumps(signature) == json.dumps(as_lists)
        assert signature_hash(signature) == signature_hash(as_lists) == pinned
        assert StateSignature.decode(json.loads(json.dumps(signature))) == signature


# --------------------------------------------------------------------------------------------- the engine


def _rank_states(rank: int, world: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's states for the engine test: uneven rows (rank 1 has none), every kind of reduction."""
    g = _gen("engine", rank)
    n = [3, 0, 5][rank]
    states = {
        "f_sum": torch.randn(4, generator=g),
        "f_mean": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "f_max": torch.randn((), generator=g),
        "f_min": torch.randn(3, generator=g),
        "i_sum": torch.randint(-50, 50, (3,), generator=g, dtype=torch.int32),
        "i_max": torch.randint(-50, 50, (2,), generator=g),
        "b_max": torch.rand(4, generator=g) > 0.5,
        "b_min": torch.rand(4, generator=g) > 0.3,
        "rows": torch.randn(n, 2, generator=g),
        "scalar_row": torch.tensor(float(rank)),
        "list_rows": [torch.randn(n, generator=g), torch.tensor(float(rank))],
        "stacked": torch.randn(2, generator=g),
        "custom": torch.randn(3, generator=g),
    }
    fns = {name: name.split("_")[1] if "_" in name and name[0] in "fib" else "cat" for name in states}
    fns.update({"stacked": None, "custom": _prod})
    return states, fns


def _prod(stacked: torch.Tensor) -> torch.Tensor:
    return stacked.prod(0)


def _expected(world: int) -> dict[str, Any]:
    per_rank = [_rank_states(r, world)[0] for r in range(world)]
    fns = _rank_states(0, world)[1]
    out = {}
    for name, fx in fns.items():
        values = [s[name] for s in per_rank]
        if isinstance(values[0], list):
            values = [R.cat_rows(v) for v in values]
        out[name] = R.reduce_ranks(fx, values)
    return out


def _engine_body(rank: int, world: int) -> list[str]:
    failures = []
    expected = _expected(world)
    plan = SyncPlan()
    for sync in range(3):  # the first sync agrees on a plan; the next ones take its row
        states, fns = _rank_states(rank, world)
        got = sync_states(states, fns, plan=plan)
        for name, want in expected.items():
            value = got[name]
            exact = not (want.is_floating_point() or want.is_complex())
            try:
                assert value.dtype == want.dtype, f"dtype {value.dtype} != {want.dtype}"
                torch.testing.assert_close(value, want, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-7)
            except AssertionError as err:
                failures.append(f"[rank {rank}] sync {sync} {name}: {err}")
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_engine_agrees_with_the_row_reduce(world_size: int) -> None:
    failures = [f for per_rank in run_distributed(_engine_body, world_size, timeout=90) for f in per_rank]
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------- Metric asks the same rules


class _EveryReduction(Metric):
    """One tensor state per reduction name and a list state; ``update`` sets each to the batch's values."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for fx in R.REDUCTIONS:
            self.add_state(fx, torch.zeros(3, dtype=torch.float64), dist_reduce_fx=fx)
        self.add_state("rows", [], dist_reduce_fx="cat")

    def update(self, x: torch.Tensor) -> None:
        self.sum = self.sum + x
        self.max = torch.maximum(self.max, x)
        self.min = torch.minimum(self.min, x)
        self.mean = x.clone()
        self.cat = x.clone()
        self.rows.append(x.clone())

    def compute(self) -> torch.Tensor:
        return self.sum


def _states(metric: Metric) -> dict[str, Any]:
    return {n: list(v) if isinstance(v, list) else v.clone() for n, v in metric.metric_state.items()}


def test_metric_merge_state_follows_merge() -> None:
    a, b = _EveryReduction(), _EveryReduction()
    xa, xb = (torch.randn(3, generator=_gen("merge_state", i), dtype=torch.float64) for i in range(2))
    a.update(xa)
    b.update(xb)
    before_a, before_b = _states(a), _states(b)
    a.merge_state(b)
    # merge_state weighs a mean state by update counts: a has 1 update, b has 1, so count = 2 / 1
    for name, fx in a._reductions.items():
        want = R.merge(fx, before_a[name], before_b[name], 2.0)
        got = getattr(a, name)
        if isinstance(want, list):
            assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want)), name
        else:
            assert torch.equal(got, want), name


def test_metric_forward_folds_a_batch_by_merge() -> None:
    metric = _EveryReduction()
    xs = [torch.randn(3, generator=_gen("forward", i), dtype=torch.float64) for i in range(3)]
    metric(xs[0])
    for step, x in enumerate(xs[1:], start=2):
        before = _states(metric)
        metric(x)
        fresh = _EveryReduction()
        fresh.update(x)
        batch = _states(fresh)
        for name, fx in metric._reductions.items():
            want = R.merge(fx, before[name], batch[name], float(step))
            got = getattr(metric, name)
            if isinstance(want, list):
                assert all(torch.equal(g, w) for g, w in zip(got, want)) and len(got) == len(want), name
            else:
                assert torch.equal(got, want), name


def test_single_rank_sync_is_the_states_themselves() -> None:
    """One rank (no process group): ``reduce_ranks`` of one value is that value for every named reduction, and
    syncing changes nothing."""
    metric = _EveryReduction()
    metric.update(torch.randn(3, generator=_gen("single"), dtype=torch.float64))
    before = _states(metric)
    with metric.sync_context():
        for name, fx in metric._reductions.items():
            value = getattr(metric, name)
            if isinstance(value, list):
                assert len(value) == len(before[name]) > 0, (name, len(value), len(before[name]))
                assert all(torch.equal(g, w) for g, w in zip(value, before[name])), name
                continue
            assert torch.equal(value, before[name]), name
            assert torch.equal(R.reduce_ranks(fx, [before[name]]), before[name]), name


def _fake_gather(world: int) -> Any:
    """A ``dist_sync_fn`` that pretends ``world`` ranks: rank r holds the local value times (r + 1)."""

    def gather(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        return [t * (r + 1) for r in range(world)]

    return gather


def test_custom_dist_sync_fn_reduces_like_reduce_ranks() -> None:
    world = 3
    metric = _EveryReduction(dist_sync_fn=_fake_gather(world), distributed_available_fn=lambda: True)
    metric.update(torch.randn(3, generator=_gen("custom"), dtype=torch.float64))
    before = _states(metric)
    # a custom gather runs only where a group of several ranks exists; call the metric's sync path directly
    synced = metric._sync_values(metric.metric_state, grad="none")
    for name, fx in metric._reductions.items():
        local = torch.cat(before[name]) if isinstance(before[name], list) else before[name]
        want = R.reduce_ranks(fx, [local * (r + 1) for r in range(world)])
        got = synced[name][0] if isinstance(synced[name], list) else synced[name]
        assert torch.allclose(got, want, rtol=0, atol=1e-15), name
