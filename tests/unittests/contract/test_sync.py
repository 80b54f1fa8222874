"""How ``Metric`` and ``MetricCollection`` sync: the number of collectives, mismatches that raise
the same ``RuntimeError`` on every rank instead of hanging, and ``cat`` list states that are empty on some ranks.

Collectives are counted by wrapping ``torch.distributed``'s functions and the backend's captured flat gather
inside the rank's body (restored afterwards). Expected values are sums and concatenations of every rank's data,
rebuilt from seeds known to all ranks.

Package modules covered: ``metric`` and ``collections`` (when and how they sync), the sync engine
``distributed._sync`` and the flat collectives of ``distributed._backend``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.metrics import BigSum, ManySums, Rows
from tests._helpers.seeds import F64, rand
from torchmetrics_diff import CatMetric, MeanMetric, Metric, MetricCollection, SumMetric

pytestmark = pytest.mark.timeout(120)

GATHER = "_all_gather_flat"


# ---------------------------------------------------------------------------------------- counting collectives


def _local(tag: str, rank: int, shape: tuple) -> torch.Tensor:
    return rand(shape, tag, rank)


def _global_sum(tag: str, world: int, shape: tuple) -> torch.Tensor:
    return sum(_local(tag, r, shape) for r in range(world))


def _count_body(rank: int, world: int) -> dict:
    """Per case: the collectives this rank issued, and value failures."""
    checks = Checks(f"W={world} rank {rank} ")
    calls: dict[str, list[str]] = {}

    def measure(case: str, fn: Callable[[], Any]) -> Any:
        with record_collectives() as log:
            result = fn()
        calls[case] = list(log)
        return result

    # 16 scalar sum states
    many = ManySums(16, dist_sync_on_step=True)
    x = _local("many", rank, (16,))
    many.update(x)
    measure("ManySums(16 sums) compute, first sync", many.compute)
    many.update(x)
    value = measure("ManySums(16 sums) compute", many.compute)
    checks.close("ManySums compute", value, 2 * _global_sum("many", world, (16,)))
    for step in ("first step", "step 2", "step 3"):
        xg = x.clone().requires_grad_(True)
        value = measure(f"ManySums(16 sums) forward, {step}", lambda xg=xg: many(xg))
        checks.close(f"ManySums forward {step}", value.detach(), _global_sum("many", world, (16,)))

    # a collection of 8 MeanMetrics (16 sum states), one rank's batch empty on the last step
    coll = MetricCollection({f"mean{i}": MeanMetric(dist_sync_on_step=True).set_dtype(F64) for i in range(8)})
    v = _local("coll", rank, (5,))
    coll.update(v)
    measure("8 MeanMetrics compute, first sync", coll.compute)
    coll.update(v)
    out = measure("8 MeanMetrics compute", coll.compute)
    mean_all = _global_sum("coll", world, (5,)).sum() / (5 * world)
    for key, val in out.items():
        checks.close(f"collection compute {key}", val, mean_all)
    for step in ("first step", "step 2", "step 3 (rank 1 empty)"):
        batch = v[:0] if "empty" in step and rank == 1 else v
        out = measure(f"8 MeanMetrics forward, {step}", lambda b=batch: coll(b.clone().requires_grad_(True)))
        skipped = "empty" in step and world > 1  # rank 1's values are not in this batch
        dropped = _local("coll", 1, (5,)).sum() if skipped else 0.0
        expected = (_global_sum("coll", world, (5,)).sum() - dropped) / (5 * world - (5 if skipped else 0))
        for key, val in out.items():
            checks.close(f"collection forward {step} {key}", val.detach(), expected)

    # cat states: a collection of a 2-D float64 cat list + int64 sum (Rows), a CatMetric and a MeanMetric
    cats = MetricCollection(
        {
            "rows": Rows(3, dist_sync_on_step=True),
            "cat": CatMetric(dist_sync_on_step=True).set_dtype(F64),
            "mean": MeanMetric(dist_sync_on_step=True).set_dtype(F64),
        }
    )
    sizes = [2, 3, 1][:world]
    r = _local("rows", rank, (sizes[rank], 3))
    cats.update(r)
    measure("cat states compute, first sync", cats.compute)
    cats.update(r)
    out = measure("cat states compute", cats.compute)
    every = [_local("rows", q, (sizes[q], 3)) for q in range(world)]
    checks.close("cat compute rows", out["rows"], torch.cat([t for q in every for t in (q, q)]))
    checks.close("cat compute cat", out["cat"], torch.cat([t for q in every for t in (q, q)]))  # rows kept
    for step in ("first step", "step 2"):
        out = measure(f"cat states forward, {step}", lambda: cats(r.clone().requires_grad_(True)))
        checks.close(f"cat forward {step} rows", out["rows"].detach(), torch.cat(every))

    # a large sum state: all-reduced (one bucket) instead of gathered
    big = BigSum(20_000)
    b = _local("big", rank, (20_000,))
    big.update(b)
    measure("BigSum compute, first sync", big.compute)
    big.update(b)
    out = measure("BigSum compute", big.compute)
    total = _global_sum("big", world, (20_000,))
    checks.close("BigSum big", out["big"], 2 * total)
    checks.close("BigSum small", out["small"], 2 * total.sum())
    peak = torch.stack([_local("big", q, (20_000,)).max() for q in range(world)]).max()
    checks.close("BigSum peak", out["peak"], peak)
    return {"calls": calls, "failures": checks.failures}


# case -> collectives allowed after the first sync: (gathers, all_reduces). Every sync starts with the call's
# header exchange (one fixed-size gather of host values); a row of CPU states that fits its inline area rides in
# it, so the whole sync is that one gather (a larger row follows it: one more).
STEADY = {
    "ManySums(16 sums) compute": (1, 0),
    "ManySums(16 sums) forward, step 2": (1, 0),
    "ManySums(16 sums) forward, step 3": (1, 0),
    "8 MeanMetrics compute": (1, 0),
    "8 MeanMetrics forward, step 2": (1, 0),
    "8 MeanMetrics forward, step 3 (rank 1 empty)": (1, 0),
    # outgrown rows: the header (with the row inline when it fits the inline area) + the row again, grown
    "cat states compute": {(2, 0), (3, 0)},
    "cat states forward, step 2": (1, 0),  # the rows fit the capacity agreed at step 1
    "BigSum compute": (1, 1),  # 1 + one (sum, float64) bucket
}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_collective_count_per_sync(world_size: int) -> None:
    """Steady state: one collective per sync without cat states (16 sum states; a collection of 8 MeanMetrics; the
    row rides in the call's header exchange), two or three with these cat states (the row, inline in the header when
    it fits, and the row again when rows outgrew their room), 1 + one all_reduce for a large sum bucket;
    the first sync costs at most two more; never a barrier; nothing at all with one rank. Values are checked along
    the way."""
    results = run_distributed(_count_body, world_size, timeout=60)
    problems = [f for res in results for f in res["failures"]]
    for rank, res in enumerate(results):
        for case, log in res["calls"].items():
            where = f"rank {rank} {case}: {log}"
            if any("barrier" in name for name in log):
                problems.append(f"{where}: barrier called")
            if world_size == 1:
                if log:
                    problems.append(f"{where}: collectives with world size 1")
                continue
            if log != results[0]["calls"][case]:
                problems.append(f"{where}: differs from rank 0's {results[0]['calls'][case]}")
            if case in STEADY:
                allowed = STEADY[case] if isinstance(STEADY[case], set) else {STEADY[case]}
                counted = (log.count(GATHER), log.count("all_reduce"))
                if counted not in allowed or len(log) != sum(counted):
                    problems.append(f"{where}: expected (gathers, all_reduces) in {sorted(allowed)}")
            else:  # the first sync: the header, the agreement's metadata, the row, then the all_reduces
                steady = STEADY.get(case.replace(", first sync", "").replace("first step", "step 2"), (2, 1))
                steady = max(steady) if isinstance(steady, set) else steady
                if not 0 < len(log) <= 3 + steady[1]:
                    problems.append(f"{where}: first sync expected at most {3 + steady[1]} collectives")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------- mismatches


class Configurable(Metric):
    """States given at construction; ``update(**values)`` sets tensor states and appends to list states."""

    full_state_update = False

    def __init__(self, states: dict[str, tuple[Any, str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, (default, fx) in states.items():
            self.add_state(name, default, dist_reduce_fx=fx)

    def update(self, **values: torch.Tensor) -> None:
        for name, value in values.items():
            state = getattr(self, name)
            if isinstance(state, list):
                state.append(value)
            else:
                setattr(self, name, state + value)

    def compute(self) -> dict[str, Any]:
        return {n: torch.cat(list(v)) if isinstance(v, list) else v for n, v in self.metric_state.items()}


def _mismatch_body(rank: int, world: int) -> dict:
    """case -> (state the error must name, error message or None); the last rank is the odd one out."""
    odd = rank == world - 1
    results: dict[str, tuple[str, str | None]] = {}

    def attempt(case: str, state: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            results[case] = (state, None)
        except RuntimeError as err:
            results[case] = (state, str(err))

    def fresh(states: dict, **values: torch.Tensor) -> Configurable:
        m = Configurable(states)
        m.update(**values)
        return m

    zero = torch.tensor(0.0, dtype=F64)
    # first sync (no agreed plan yet)
    states = {"total": (zero, "sum")} if odd else {"total": (zero, "sum"), "extra": (zero, "sum")}
    attempt("state registered on some ranks only", "extra", fresh(states, total=zero + 1).compute)
    dtype = torch.float32 if odd else F64
    one = torch.tensor(1.0, dtype=dtype)
    attempt("dtype differs", "total", fresh({"total": (torch.tensor(0.0, dtype=dtype), "sum")}, total=one).compute)
    width = 4 if odd else 3
    attempt(
        "cat trailing shape differs",
        "rows",
        fresh({"rows": ([], "cat")}, rows=torch.ones(2, width, dtype=F64)).compute,
    )
    attempt(
        "0-d vs 1-d sum state",
        "total",
        fresh({"total": (torch.zeros(1, dtype=F64) if odd else zero, "sum")}, total=zero + 1).compute,
    )
    # after a successful sync (an agreed plan exists), one rank changes
    m = fresh({"total": (zero, "sum"), "peak": (zero, "max")}, total=zero + 1, peak=zero + 1)
    m.compute()
    if odd:
        m.set_dtype(torch.float32)
    m.update(total=torch.tensor(1.0, dtype=m.total.dtype))  # every rank updates, so none answers from its cache
    attempt("dtype differs after a successful sync", "total", m.compute)
    m = fresh({"rows": ([], "cat")}, rows=torch.ones(2, 3, dtype=F64))
    m.compute()
    m.reset()  # each rank's own rows stay consistent; only the ranks disagree
    m.update(rows=torch.ones(1, width, dtype=F64))
    attempt("cat trailing shape differs after a successful sync", "rows", m.compute)
    # the forward path (dist_sync_on_step): the error is raised there and the batch is rolled back
    rows = Rows(3, dist_sync_on_step=True)
    rows.update(torch.ones(1, 3, dtype=F64))
    attempt("forward: cat trailing shape differs", "rows", lambda: rows(torch.ones(2, width, dtype=F64)))
    rolled_back = rows.update_count == 1 and [t.shape for t in rows.rows] == [torch.Size([1, 3])]
    # update raising on one rank inside a syncing forward: the others must not wait for it
    mean = MeanMetric(dist_sync_on_step=True)
    weight = torch.ones(4) if odd else torch.ones(3)  # bad shape on the odd rank only
    try:
        mean(torch.ones(3), weight=weight)
        update_error = None
    except Exception as err:
        update_error = f"{type(err).__name__}: {err}"
    # the ranks are still in step: a correct sync afterwards works
    total = SumMetric().set_dtype(F64)
    total.update(torch.tensor(float(rank + 1), dtype=F64))
    after = total.compute().item()
    return {"results": results, "rolled_back": rolled_back, "update_error": update_error, "after": after}


@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatch_raises_on_every_rank_naming_the_state(world_size: int) -> None:
    """A state missing on one rank, a different dtype, a different cat trailing shape, 0-d vs 1-d: the same
    RuntimeError on every rank, naming the state (on the first sync, after a successful one, and in forward);
    no hang, a forward rolls its batch back, ``update`` raising on one rank in a syncing forward makes every rank
    raise, and a later sync still works."""
    out = run_distributed(_mismatch_body, world_size, timeout=30)
    problems = []
    for case, (state, _) in out[0]["results"].items():
        messages = [res["results"][case][1] for res in out]
        for rank, msg in enumerate(messages):
            if msg is None:
                problems.append(f"{case}: rank {rank} did not raise RuntimeError")
            elif repr(state) not in msg and state not in msg:
                problems.append(f"{case}: rank {rank}'s message does not name state {state!r}: {msg}")
        if all(m is not None for m in messages) and len(set(messages)) != 1:
            problems.append(f"{case}: ranks raised different messages: {messages}")
    for rank, res in enumerate(out):
        if not res["rolled_back"]:
            problems.append(f"rank {rank}: a failed forward did not restore the accumulated states / update_count")
        error = res["update_error"]
        if error is None or (rank == world_size - 1 and not error.startswith("ValueError")):
            problems.append(f"rank {rank}: update raising on rank {world_size - 1} in forward gave {error!r}")
        elif rank != world_size - 1 and str(world_size - 1) not in error:
            problems.append(f"rank {rank}: the error does not name the failing rank {world_size - 1}: {error}")
        if res["after"] != world_size * (world_size + 1) / 2:
            problems.append(f"rank {rank}: sync after the errors gave {res['after']}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------- empty cat list on a rank


def _empty_list_body(rank: int, world: int) -> list[str]:
    checks = Checks(f"W={world} rank {rank} ")
    sizes = [0, 2, 3][:world]  # rank 0 never holds rows in phase 1

    def rows_of(r: int, tag: str) -> torch.Tensor:
        return rand(([0, 2, 3][r] if tag != "rank 0 too" else 2, 3), "empty list", tag, r)

    m = Rows(3)
    m.update(rows_of(rank, "phase 1"))  # rank 0: zero rows, nothing appended: the list stays []
    checks.true("phase 1", (m.rows == []) == (rank == 0), f"local list {m.rows}")
    got = m.compute()
    expected = torch.cat([rows_of(r, "phase 1") for r in range(world)])
    checks.close("rank 0 empty: compute", got, expected)
    checks.true("rank 0 empty: dtype/shape", got.dtype == F64 and got.shape[1:] == (3,), f"{got.dtype} {got.shape}")
    with m.sync_context():
        checks.close("rank 0 empty: synced count", m.count, torch.tensor(sum(sizes)))
    m.update(rows_of(rank, "rank 0 too"))
    got = m.compute()
    expected = torch.cat([t for r in range(world) for t in (rows_of(r, "phase 1"), rows_of(r, "rank 0 too"))])
    checks.close("every rank has rows after a plan with an empty rank: compute", got, expected)
    m.reset()
    m.update(rows_of(rank, "phase 4"))
    checks.close("rank 0 empty again: compute", m.compute(), torch.cat([rows_of(r, "phase 4") for r in range(world)]))
    # forward with dist_sync_on_step: the global rows on every rank, gradient to the local rows only
    f = Rows(3, dist_sync_on_step=True)
    local = rows_of(rank, "forward").clone().requires_grad_(True)
    value = f(local)
    checks.close("forward: global rows", value.detach(), torch.cat([rows_of(r, "forward") for r in range(world)]))
    if local.numel():
        (value**2).sum().backward()
        expected = 2 * world * local.detach()  # d(Σ value²)/d local rows, times W under grad_reduction="mean"
        checks.close("forward: local gradient", local.grad, expected)
    return checks.failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_empty_cat_list_on_one_rank(world_size: int) -> None:
    """A rank whose cat list state is empty takes the dtype and trailing shape from the others; the concatenation
    is right, also when the ranks' emptiness changes between syncs."""
    results = run_distributed(_empty_list_body, world_size, timeout=30)
    assert_no_failures([f for per_rank in results for f in per_rank])


def _all_empty_body(rank: int, world: int) -> list[str]:
    checks = Checks(f"W={world} rank {rank} ")
    cases: dict[str, Callable[[], None]] = {}

    def rows_sync() -> None:
        m = Rows(3)
        m.update(torch.zeros(0, 3, dtype=F64))
        with m.sync_context():
            checks.true("Rows sync_context", list(m.rows) == [], f"synced list state {m.rows}")
            checks.close("Rows sync_context count", m.count, torch.tensor(0))
        checks.close("Rows compute", m.compute(), torch.zeros(0, 3, dtype=F64))

    def cat_compute() -> None:
        m = CatMetric().set_dtype(F64)
        m.update(torch.zeros(0, dtype=F64))
        checks.close("CatMetric compute", m.compute(), torch.zeros(0, dtype=F64))

    def cat_forward() -> None:
        m = CatMetric(dist_sync_on_step=True).set_dtype(F64)
        checks.close("CatMetric forward", m(torch.zeros(0, dtype=F64)), torch.zeros(0, dtype=F64))

    def after_rows() -> None:  # a cat state that held rows at the previous sync and is now empty everywhere
        m = Rows(3)
        m.update(torch.ones(1, 3, dtype=F64))
        m.compute()
        m.reset()
        m.update(torch.zeros(0, 3, dtype=F64))
        checks.close("Rows compute", m.compute(), torch.zeros(0, 3, dtype=F64))

    cases = {
        "Rows sync_context / compute": rows_sync,
        "CatMetric compute": cat_compute,
        "CatMetric forward": cat_forward,
        "Rows empty everywhere after a sync with rows": after_rows,
    }
    for name, fn in cases.items():
        try:
            fn()
        except Exception as err:  # every rank raises alike here, so the ranks stay in step
            checks.fail(name, f"raised {type(err).__name__}: {err}")
    return checks.failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_cat_state_empty_on_every_rank(world_size: int) -> None:
    """A cat list state empty on every rank syncs to an empty list (documented in ``sync_states``): sync,
    compute and forward work and give zero rows."""
    results = run_distributed(_all_empty_body, world_size, timeout=30)
    assert_no_failures([f for per_rank in results for f in per_rank])


# ------------------------------------------------- a local failure must not hang the peers (kills the W=2 pool)


def _inconsistent_rows_body(rank: int, world: int) -> str | None:
    """The last rank appended rows of two widths (variable-length data seen by one rank only)."""
    m = Rows(3)
    m.update(torch.ones(2, 3, dtype=F64))
    if rank == world - 1:
        m.update(torch.ones(1, 4, dtype=F64))
    try:
        m.compute()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


@pytest.mark.parametrize("world_size", [2])
def test_rank_with_inconsistent_cat_rows_fails_every_rank_without_hanging(world_size: int) -> None:
    """A cat state whose rows disagree *within* one rank cannot be concatenated there; the other ranks must raise
    too instead of waiting for that rank in the sync's collective (a sync never hangs)."""
    errors = run_distributed(_inconsistent_rows_body, world_size, timeout=10)
    assert all(e is not None for e in errors), f"some ranks did not raise: {errors}"
