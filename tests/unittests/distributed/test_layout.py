"""The sync engine's one path (``distributed/_sync/layout.py``): a sync that matches the agreed plan runs through the
views of its layout, prepared once, and must give exactly the reference values, grow the plan when a rank outgrows
its room (every rank alike, one collective more), and agree on a new plan whenever a rank's states stop matching it
(one rank matching, another not).

Every expected value is rebuilt inside the rank's body from seeds known to every rank: the reductions with
``torch.stack(...).sum/mean/amax/amin(0)`` and ``cat`` states with ``torch.cat`` of every rank's rows in rank order.
Whether each sync packed its states into the plan's row is read off by wrapping ``Layout.pack``; collectives
are counted by wrapping the backend's gather (``record_collectives``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests._helpers.checks import Checks
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import seed
from torchmetrics_diff.distributed._sync import SyncPlan, fail_sync, sync_states
from torchmetrics_diff.distributed._sync import layout as _layout

pytestmark = pytest.mark.timeout(120)

F32, F64 = torch.float32, torch.float64

# name -> (reduction, dtype, shape): tensor states; name -> ("list" | "cat", dtype, trailing dims): rows states
SPECS: dict[str, tuple[str, torch.dtype, tuple]] = {
    "a": ("sum", F64, ()),
    "b": ("sum", F32, (3,)),
    "c": ("mean", F64, (2, 2)),
    "d": ("max", torch.int64, (4,)),
    "e": ("min", F32, ()),
    "f": ("max", torch.bool, (3,)),
    "rows": ("list", F64, (2,)),
    "ids": ("list", torch.int64, ()),
    "t": ("cat", F32, (3,)),
    # u1, u2 and t: one dtype and trailing dims, slots side by side, the same rows: read as one strided group
    "u1": ("list", F32, (3,)),
    "u2": ("cat", F32, (3,)),
    # w and rows: one dtype and trailing dims, but w has a row more on odd ranks (see _value): read piece by piece
    "w": ("cat", F64, (2,)),
}


def _tensor(shape: tuple, dtype: torch.dtype, *parts: object) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed(*parts))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g, dtype=dtype)


def _value(name: str, rank: int, sync: int, rows: int, pieces: int = 1) -> Any:
    """Rank ``rank``'s value of state ``name`` at sync ``sync`` (``rows`` rows for row states, one more for ``w`` on
    odd ranks)."""
    kind, dtype, shape = SPECS[name]
    rows += rank % 2 if name == "w" else 0
    if kind == "list":
        cuts = [rows * i // pieces for i in range(pieces + 1)]
        return [
            _tensor((hi - lo, *shape), dtype, name, rank, sync, i) for i, (lo, hi) in enumerate(zip(cuts, cuts[1:]))
        ]
    if kind == "cat":
        return _tensor((rows, *shape), dtype, name, rank, sync)
    return _tensor(shape, dtype, name, rank, sync)


def _reference(name: str, values: list[Any]) -> torch.Tensor:
    """What the sync must give for ``values`` (one per rank, in rank order), by plain torch."""
    kind, dtype, _ = SPECS[name]
    if kind in ("list", "cat"):
        return torch.cat([torch.cat(v) if isinstance(v, list) else v for v in values])
    stacked = torch.stack(values)
    if dtype == torch.bool:
        return stacked.any(0) if kind == "max" else stacked.all(0)
    return getattr(stacked, {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}[kind])(0)


REDUCTIONS = {name: "cat" if kind == "list" else kind for name, (kind, _, _) in SPECS.items()}


@contextmanager
def _packs() -> Iterator[list[bool]]:
    """Log of ``Layout.pack`` results outside an agreement (True: this rank's states matched the plan and were
    packed into its row; a sync that grows the plan packs twice)."""
    log: list[bool] = []
    original = _layout.Layout.pack

    def pack(self: Any, *args: Any, agreed: bool = False) -> Any:
        head = original(self, *args, agreed=agreed)
        if not agreed:
            log.append(head is not None)
        return head

    _layout.Layout.pack = pack
    try:
        yield log
    finally:
        _layout.Layout.pack = original


def _check_sync(chk: Checks, tag: str, world: int, sync: int, rows: list[int], plan: SyncPlan, pieces: int = 1):
    """One sync of every state of SPECS (rank r has ``rows[r]`` rows); compare with the reference."""
    rank = torch.distributed.get_rank()
    states = {name: _value(name, rank, sync, rows[rank], pieces) for name in SPECS}
    with _packs() as packs, record_collectives() as calls:
        out = sync_states(states, REDUCTIONS, plan=plan)
    for name in SPECS:
        expected = _reference(name, [_value(name, r, sync, rows[r], pieces) for r in range(world)])
        got = out.get(name)
        ok = isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.shape == expected.shape
        chk.true(f"{tag} {name}", ok and torch.equal(got, expected), f"got {got!r}, expected {expected!r}")
    chk.true(f"{tag} keys in order", list(out) == list(SPECS), f"{list(out)}")
    return packs, calls


# ----------------------------------------------------------------------- syncs equal the reference
def _sequence_body(rank: int, world: int) -> dict:
    chk = Checks(f"W={world} rank {rank} ")
    plan = SyncPlan()
    base = [5 + 2 * r for r in range(world)]
    seen = {}
    # sync 0: first sync (agreement); 1-2: steady; 3: the last rank outgrows its capacity (every rank grows the plan
    # and sends again); 4: steady with fewer rows;
    # 5: list states split in 3 pieces (concatenated into the slot); 6: steady with one piece again
    steps = [
        (base, 1),
        (base, 1),
        ([b - 1 for b in base], 1),
        ([*base[:-1], base[-1] * 3], 1),
        ([1] * world, 1),
        (base, 3),
        (base, 1),
    ]
    inline = {}  # whether the layout a sync packed carried its row inline in the header exchange
    for sync, (rows, pieces) in enumerate(steps):
        layout = plan.layout
        packs, calls = _check_sync(chk, f"sync {sync}", world, sync, rows, plan, pieces)
        inline[sync] = layout is not None and layout.inline  # (decided when it packed, by the group's inline area)
        seen[sync] = (packs, calls.count("_all_gather_flat"), len(calls))
    return {"failures": chk.failures, "seen": seen, "capacity": dict(plan.capacity), "inline": inline}


@pytest.mark.parametrize("world_size", [2, 3])
def test_steady_syncs_equal_the_reference_and_take_one_collective(world_size: int) -> None:
    results = run_distributed(_sequence_body, world_size, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)
    last = world_size - 1
    for rank, res in enumerate(results):
        seen = res["seen"]
        # every sync starts with the call's header exchange (one fixed-size gather); a steady row of CPU data that
        # fits its inline area rides in it (one collective in all), a larger one follows it (two)
        inline = res["inline"]
        assert inline[1], f"rank {rank}: the first plan's rows fit the header exchange's inline area"
        assert seen[0] == ([], 3, 3), f"rank {rank}: the first sync is the header, the metadata, the row: {seen[0]}"
        for sync in (1, 2, 4, 5, 6):
            n = 1 if inline[sync] else 2
            assert seen[sync] == ([True], n, n), f"rank {rank} sync {sync}: {n} gather(s) expected: {seen[sync]}"
        # sync 3: the last rank's rows do not fit; its header says how many, so every rank grows the plan alike,
        # packs again and sends the row in a collective of its own (sync 4 then fits everywhere)
        assert seen[3] == ([True, True], 2, 2), f"rank {rank} sync 3 (rank {last} outgrew its room): {seen[3]}"
        # (sync 5: pieces concatenated into the slot; rank capacities grew at sync 3, so everything fits)


# ------------------------------------------------------------------- a rank that no longer matches, a failed rank
def _mismatch_body(rank: int, world: int) -> dict:
    chk = Checks(f"W={world} rank {rank} ")
    plan = SyncPlan()
    rows = [4] * world
    for sync in range(2):
        _check_sync(chk, f"warm-up {sync}", world, sync, rows, plan)
    messages = {}
    # the last rank's `a` turns float32: it cannot pack the plan's row, and every rank learns it from the header
    states = {name: _value(name, rank, 9, rows[rank]) for name in SPECS}
    if rank == world - 1:
        states["a"] = states["a"].float()
    with _packs() as packs:
        try:
            sync_states(states, REDUCTIONS, plan=plan)
            messages["dtype"] = None
        except RuntimeError as err:
            messages["dtype"] = str(err)
    messages["dtype packs"] = packs
    # the plan survives: the next matching sync is right (the plan's row again)
    for sync in (10, 11):
        _check_sync(chk, f"after the mismatch {sync}", world, sync, rows, plan)
    # a rank that failed before syncing joins the header exchange with its failure marker
    states = {name: _value(name, rank, 12, rows[rank]) for name in SPECS}
    try:
        if rank == 1:
            fail_sync(ValueError("update blew up on this rank"), plan=plan)
        sync_states(states, REDUCTIONS, plan=plan)
        messages["failed rank"] = None
    except (RuntimeError, ValueError) as err:
        messages["failed rank"] = f"{type(err).__name__}: {err}"
    return {"failures": chk.failures, "messages": messages}


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_leaving_the_plan_raises_or_resyncs_on_every_rank(world_size: int) -> None:
    results = run_distributed(_mismatch_body, world_size, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)
    for rank, res in enumerate(results):
        msg = res["messages"]
        assert msg["dtype"] is not None, f"rank {rank}: a dtype disagreement did not raise"
        assert "'a'" in msg["dtype"] and "dtype" in msg["dtype"], f"rank {rank}: {msg['dtype']}"
        assert "float32" in msg["dtype"] and "float64" in msg["dtype"], f"rank {rank}: {msg['dtype']}"
        assert msg["dtype packs"] == [rank != world_size - 1], f"rank {rank}: {msg['dtype packs']}"
        failed = msg["failed rank"]
        if rank == 1:
            assert failed == "ValueError: update blew up on this rank", f"rank 1: {failed}"
        else:
            assert failed is not None and failed.startswith("PeerFailedError") and "rank(s) [1]" in failed, failed


# --------------------------------------------------------------------- capacities shrink, buffers grow elsewhere
def _capacity_body(rank: int, world: int) -> dict:
    chk = Checks(f"W={world} rank {rank} ")
    plan, other = SyncPlan(), SyncPlan()
    capacities = []
    for sync, rows in enumerate([[300] * world, [300] * world, [3] * world, [3] * world, [3] * world]):
        with _packs() as packs:
            _check_sync(chk, f"sync {sync}", world, sync, rows, plan)
        capacities.append((packs, dict(plan.capacity)))
    # another plan with a much larger row grows the shared buffers: the layout must re-make its views
    big = {"x": torch.full((5000,), float(rank)), "y": [torch.ones(2000 + rank, 4)]}
    out = sync_states(big, {"x": "sum", "y": "cat"}, plan=other)
    chk.true("big sum", torch.equal(out["x"], torch.full((5000,), float(sum(range(world))))), "wrong big sum")
    chk.true("big cat", out["y"].shape == (sum(2000 + r for r in range(world)), 4), f"{out['y'].shape}")
    with _packs() as packs:
        _check_sync(chk, "after the buffers grew", world, 7, [3] * world, plan)
    capacities.append((packs, dict(plan.capacity)))
    return {"failures": chk.failures, "capacities": capacities}


def test_capacities_shrink_and_views_follow_the_buffers() -> None:
    results = run_distributed(_capacity_body, 2, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)
    row_states = [name for name, (kind, _, _) in SPECS.items() if kind in ("list", "cat")]

    def most(n: int) -> dict[str, int]:  # the most rows of each state over the two ranks (w: one more on rank 1)
        return {name: n + (name == "w") for name in row_states}

    for rank, res in enumerate(results):
        caps = res["capacities"]

        assert caps[1] == ([True], most(300)), f"rank {rank}: the plan's row at capacity 300: {caps[1]}"
        # 300 rows of room for 3: the sync reads the headers and shrinks the plan's capacities to 3
        assert caps[2] == ([True], most(3)), f"rank {rank}: {caps[2]}"
        # the resized plan's layout is rebuilt locally (the plan is the same on every rank): no agreement
        assert caps[3] == ([True], most(3)), f"rank {rank}: {caps[3]}"
        assert caps[4] == ([True], most(3)), f"rank {rank}: {caps[4]}"
        assert caps[5][0] == [True], f"rank {rank}: the plan's row again after the buffers grew: {caps[5]}"


# ------------------------------------------------------------------------ one plan, groups of different sizes
def _groups_body(rank: int, world: int) -> dict:
    chk = Checks(f"W={world} rank {rank} ")
    pair = torch.distributed.new_group([0, 1])
    plan = SyncPlan()
    reductions = {"s": "sum", "rows": "cat"}

    def states(sync: int) -> dict:
        return {"s": _tensor((3,), F64, "s", rank, sync), "rows": [_tensor((2 + rank, 4), F32, "r", rank, sync)]}

    def expected(sync: int, ranks: list[int]) -> dict:
        s = torch.stack([_tensor((3,), F64, "s", r, sync) for r in ranks]).sum(0)
        return {"s": s, "rows": torch.cat([_tensor((2 + r, 4), F32, "r", r, sync) for r in ranks])}

    for sync in range(3):  # the whole world: the agreement, then the plan's row
        out = sync_states(states(sync), reductions, plan=plan)
        chk.close(f"world sync {sync}", out, expected(sync, list(range(world))), atol=0, rtol=0)
    if rank < 2:  # the same plan over a group of two: its layout is for three ranks, so it is rebuilt for two
        for sync in range(3, 6):
            out = sync_states(states(sync), reductions, pair, plan=plan)
            chk.close(f"pair sync {sync}", out, expected(sync, [0, 1]), atol=0, rtol=0)
    torch.distributed.barrier()
    return {"failures": chk.failures}


def test_a_plan_used_over_a_smaller_group_gives_that_groups_values() -> None:
    results = run_distributed(_groups_body, 3, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------- one plan, same group size, another rank in the group
def _ranks_body(rank: int, world: int) -> dict:
    """Global rank 1 builds its plan's layout as rank 1 of the pair [0, 1], then syncs over the pair [1, 2], where it
    is rank 0; global rank 2 built its layout as rank 1 of [0, 2] and is rank 1 of [1, 2] again."""
    chk = Checks(f"W={world} rank {rank} ")
    pairs = {"a": [0, 1], "c": [0, 2], "b": [1, 2]}
    groups = {name: torch.distributed.new_group(ranks) for name, ranks in pairs.items()}  # every rank calls new_group
    plans = {name: SyncPlan() for name in pairs}
    reductions = {"s": "sum", "rows": "cat"}

    def value(g: int, ranks: list[int], sync: int) -> dict:
        # rows follow the rank in the group, so every plan sees the same rows and agrees on the same capacity
        rows = _tensor((2 + ranks.index(g), 4), F32, "r", g, sync)
        return {"s": _tensor((3,), F64, "s", g, sync), "rows": [rows]}

    def sync_over(name: str, plan: SyncPlan, syncs: range) -> None:
        ranks = pairs[name]
        for sync in syncs:
            with _packs() as packs:
                out = sync_states(value(rank, ranks, sync), reductions, groups[name], plan=plan)
            every = [value(g, ranks, sync) for g in ranks]
            want = {"s": torch.stack([v["s"] for v in every]).sum(0), "rows": torch.cat([v["rows"][0] for v in every])}
            chk.close(f"{name} sync {sync}", out, want, atol=0, rtol=0)
            log.append((name, sync, packs, plan.layout.rank))

    log: list = []
    if rank in (0, 1):  # phase 1: rank 1 builds its plan's layout as rank 1 of [0, 1]
        sync_over("a", plans["a"] if rank == 0 else plans["b"], range(3))
    torch.distributed.barrier()
    if rank in (0, 2):  # phase 2: rank 2 builds its plan's layout as rank 1 of [0, 2]
        sync_over("c", plans["c"] if rank == 0 else plans["b"], range(3, 6))
    torch.distributed.barrier()
    if rank in (1, 2):  # phase 3: one pair of plans with the same history; rank 1 is now rank 0 of the pair
        sync_over("b", plans["b"], range(6, 9))
    torch.distributed.barrier()
    return {"failures": chk.failures, "log": log}


def test_a_layout_is_used_only_at_the_rank_it_was_built_for() -> None:
    results = run_distributed(_ranks_body, 3, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)
    phase3 = {
        rank: [(packs, at) for name, _, packs, at in res["log"] if name == "b"] for rank, res in enumerate(results)
    }
    # rank 2 keeps its rank (1) and its layout; rank 1 must not use the layout it built as rank 1 (its own rows would
    # be read from rank 1's place): it builds one as rank 0 from the same plan, without an agreement (the values are
    # checked in the body)
    assert phase3[2] == [([True], 1)] * 3, f"rank 2: its layout over [1, 2] expected: {phase3[2]}"
    assert phase3[1] == [([True], 0)] * 3, f"rank 1: a layout built as rank 0 expected: {phase3[1]}"
    first = [at for name, _, _, at in results[1]["log"] if name == "a"]
    assert first == [1] * 3, f"rank 1 built its first layout as rank 1 of [0, 1]: {first}"


# ---------------------------------------------------------------------------------- copies carry no agreed plan
def _copies_body(rank: int, world: int) -> dict:
    import copy
    import pickle

    from torchmetrics_diff import CatMetric, MeanMetric, MetricCollection

    chk = Checks(f"W={world} rank {rank} ")
    x = _tensor((3 + rank,), F64, "x", rank)
    every = torch.cat([_tensor((3 + r,), F64, "x", r) for r in range(world)])
    metric = MeanMetric().set_dtype(F64)
    coll = MetricCollection({"mean": MeanMetric().set_dtype(F64), "cat": CatMetric().set_dtype(F64)})
    for _ in range(3):  # agree on plans and build their layouts
        metric.update(x)
        coll.update(x)
        metric.compute()
        coll.compute()
    copies = {
        "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
        "deepcopy": copy.deepcopy,
        "clone": lambda obj: obj.clone(),
    }
    for how, make in copies.items():
        m, c = make(metric), make(coll)
        plans = list(m._sync_plans.values()) + list(c._sync_plans.values())
        chk.true(f"{how}: fresh plans", all(p.signature_hash == 0 and p.layout is None for p in plans), f"{plans}")
        m.update(x)
        c.update(x)
        chk.close(f"{how}: metric", m.compute(), every.mean(), atol=1e-12, rtol=0)
        out = c.compute()
        chk.close(f"{how}: collection mean", out["mean"], every.mean(), atol=1e-12, rtol=0)
        rows = torch.cat([_tensor((3 + r,), F64, "x", r).repeat(4) for r in range(world)])  # rank by rank
        chk.close(f"{how}: collection cat", out["cat"], rows, atol=0, rtol=0)
    chk.close("original still syncs", metric.compute(), every.mean(), atol=1e-12, rtol=0)
    return {"failures": chk.failures}


def test_copies_of_synced_metrics_start_without_a_plan() -> None:
    results = run_distributed(_copies_body, 2, timeout=90)
    failures = [f for res in results for f in res["failures"]]
    assert not failures, "\n".join(failures)


def _reduced_body(rank: int, world: int) -> list[Any]:
    """A collection of 8 MeanMetrics whose sum states are all-reduced (as in a large group, where gathering W copies
    would move more), with fingerprint headers (as in a group of more than FULL_HEADER_MAX_RANKS ranks)."""
    from torchmetrics_diff import MeanMetric, MetricCollection
    from torchmetrics_diff.distributed import _call
    from torchmetrics_diff.distributed._sync import plan as plan_module

    saved = plan_module._GATHER_REDUCE_MAX_BYTES, _call.FULL_HEADER_MAX_RANKS
    plan_module._GATHER_REDUCE_MAX_BYTES, _call.FULL_HEADER_MAX_RANKS = 8, 1
    try:
        coll = MetricCollection({f"m{i}": MeanMetric(compute_with_cache=False) for i in range(8)})
        out = []
        for step in range(4):
            coll.update(torch.tensor([float(rank + step + i) for i in range(3)]))
            with record_collectives() as log:
                values = coll.compute()
            out.append(({k: v.item() for k, v in values.items()}, log))
        return out
    finally:
        plan_module._GATHER_REDUCE_MAX_BYTES, _call.FULL_HEADER_MAX_RANKS = saved


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduced_buckets_take_the_plans_row(world_size: int) -> None:
    results = run_distributed(_reduced_body, world_size, timeout=90)
    for rank, out in enumerate(results):
        for step, (values, log) in enumerate(out):
            seen = [float(r + s + i) for r in range(world_size) for s in range(step + 1) for i in range(3)]
            expected = sum(seen) / len(seen)
            assert all(v == pytest.approx(expected, rel=1e-6) for v in values.values()), (rank, step, values)
            if step >= 2:  # steady: the fingerprint and one all-reduce (no row: it would carry only its header)
                assert log == ["host_max_reduce", "all_reduce"], (rank, step, log)
