"""The state-sync engine: ours vs torchmetrics vs the raw collective that bounds it (the floor).

Tables:

Tables 1 and 2 run at W=2, 3 and 4 (at W=4 two processes share each core of a 2-core machine: the figures are
noisier, the torchmetrics ratio is checked there too).

1. K scalar ``sum`` states: ``metric.sync(); metric.unsync()`` vs one ``all_reduce`` of K floats.
2. K ``cat`` list states of uneven rows (rank r: 100 + 37 r rows of width 8): the same call vs one
   all-gather of the padded bytes (max rows x K x 8 float32 per rank).
3. A MetricCollection of 8 MeanMetrics (``compute_with_cache=False``): ``compute()`` (syncs) vs one
   ``all_reduce`` of the 16 floats.
4. Per-call overhead of ``MeanMetric.update``/``forward`` (256 floats) vs plain torch; also
   ``dist_sync_on_step=True`` at W=2 vs plain torch plus one ``all_reduce`` of (sum, count).
5. ``CatMetric.forward`` (64 floats) after L previous forward steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from _timing import (
    Budget,
    Check,
    fx,
    median,
    ms,
    paired_ratio,
    ratio,
    run_spawned,
    table,
    time_dist_rounds,
    time_local,
    time_round_robin,
    torchmetrics_or_none,
    us,
)

import torchmetrics_diff as tmd

SCALAR_K = (1, 4, 16, 64)
CAT_K = (1, 4, 16)
WIDTH = 8
MEMBERS = 8
BATCH = 256
CAT_BATCH = 64
STEPS = (0, 1000, 5000)
W2_RUNS = 5  # independent runs pooled for the W=2 tables (see main; pyperf pools 20 by default)

# the floor's gather: the same pick as torch_diff's backend (torch 2.13 renamed all_gather_into_tensor)
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _rows(rank: int) -> int:
    return 100 + 37 * rank


# ------------------------------------------------------------------------------------------------ metrics
def _sums(base: type, k: int) -> Any:
    """A metric of ``base`` (ours or torchmetrics' Metric) with ``k`` scalar ``sum`` states."""

    class Sums(base):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            for i in range(k):
                self.add_state(f"s{i}", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, x: torch.Tensor) -> None:
            for i in range(k):
                setattr(self, f"s{i}", getattr(self, f"s{i}") + x)

        def compute(self) -> torch.Tensor:
            return torch.stack([getattr(self, f"s{i}") for i in range(k)])

    return Sums()


def _cats(base: type, k: int) -> Any:
    """A metric of ``base`` with ``k`` ``cat`` list states."""

    class Cats(base):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            for i in range(k):
                self.add_state(f"c{i}", [], dist_reduce_fx="cat")

        def update(self, x: torch.Tensor) -> None:
            for i in range(k):
                getattr(self, f"c{i}").append(x)

        def compute(self) -> torch.Tensor:
            return torch.stack([torch.cat(getattr(self, f"c{i}")) for i in range(k)])

    return Cats()


def _sync_unsync(metric: Any) -> Callable[[], None]:
    def call() -> None:
        metric.sync()
        metric.unsync()

    return call


def _synced(metric: Any, name: str) -> torch.Tensor:
    metric.sync()
    value = getattr(metric, name)
    metric.unsync()
    return torch.cat(value) if isinstance(value, list) else value


# ---------------------------------------------------------------------------------------- distributed part
def _dist_worker(rank: int, world: int, budget: Budget, parts: tuple[str, ...]) -> dict:
    """Every case of ``parts`` on this rank; returns {(table, case..., impl): seconds or None}."""
    tm = torchmetrics_or_none()
    out: dict = {}

    def timed(case: tuple, fns: dict[str, Callable[[], Any] | None]) -> None:
        found = time_dist_rounds({impl: fn for impl, fn in fns.items() if fn is not None}, budget)
        for impl in fns:
            rounds = found.get(impl)
            out[(*case, impl)] = None if rounds is None else median(rounds)
            out[(*case, impl, "rounds")] = rounds

    if "scalar" in parts:
        x = torch.tensor(float(rank + 1))
        expected = torch.full((), world * (world + 1) / 2)
        for k in SCALAR_K:
            ours = _sums(tmd.Metric, k)
            ours.update(x)
            assert torch.equal(_synced(ours, f"s{k - 1}"), expected), "ours: wrong sum"
            theirs = None
            if tm is not None:
                theirs = _sums(tm.Metric, k)
                theirs.update(x)
                assert torch.equal(_synced(theirs, f"s{k - 1}"), expected), "torchmetrics: wrong sum"
            buf, recv = torch.zeros(k), torch.empty(world * k)
            fns = {
                "ours": _sync_unsync(ours),
                "tm": None if theirs is None else _sync_unsync(theirs),
                "floor": lambda buf=buf: dist.all_reduce(buf),
                "gather": lambda buf=buf, recv=recv: _all_gather_flat(recv, buf),
            }
            timed(("scalar", k), fns)

    if "cat" in parts:
        data = torch.randn(_rows(rank), WIDTH)
        max_rows = max(_rows(r) for r in range(world))
        total_rows = sum(_rows(r) for r in range(world))
        for k in CAT_K:
            ours = _cats(tmd.Metric, k)
            ours.update(data)
            assert _synced(ours, f"c{k - 1}").shape == (total_rows, WIDTH), "ours: wrong cat"
            theirs = None
            if tm is not None:
                theirs = _cats(tm.Metric, k)
                theirs.update(data)
                assert torch.equal(_synced(theirs, f"c{k - 1}"), _synced(ours, f"c{k - 1}")), "torchmetrics differs"
            send = torch.zeros(max_rows * k * WIDTH)
            recv = torch.empty(world * send.numel())
            fns = {
                "ours": _sync_unsync(ours),
                "tm": None if theirs is None else _sync_unsync(theirs),
                "floor": lambda s=send, r=recv: _all_gather_flat(r, s),
            }
            timed(("cat", k), fns)

    if "collection" in parts:
        x = torch.randn(BATCH)
        ours = tmd.MetricCollection({f"m{i}": tmd.MeanMetric(compute_with_cache=False) for i in range(MEMBERS)})
        ours.update(x)
        theirs = None
        if tm is not None:
            theirs = tm.MetricCollection(
                {f"m{i}": tm.MeanMetric(compute_with_cache=False) for i in range(MEMBERS)}, compute_groups=False
            )
            theirs.update(x)
            a, b = ours.compute(), theirs.compute()
            assert all(torch.allclose(a[n], b[n]) for n in a), "torchmetrics differs"
        buf = torch.zeros(2 * MEMBERS)
        fns = {
            "ours": ours.compute,
            "tm": None if theirs is None else theirs.compute,
            "floor": lambda: dist.all_reduce(buf),
        }
        timed(("collection",), fns)

    if "step" in parts:
        x = torch.randn(BATCH)
        ours = tmd.MeanMetric(dist_sync_on_step=True)
        theirs = None
        if tm is not None:
            theirs = tm.MeanMetric(dist_sync_on_step=True)
            assert torch.allclose(ours(x), theirs(x)), "torchmetrics differs"
        s, n = torch.zeros(()), torch.zeros(())

        def plain() -> torch.Tensor:
            s.add_(x.sum())
            n.add_(x.numel())
            both = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
            dist.all_reduce(both)
            return both[0] / both[1]

        timed(("step",), {"ours": lambda: ours(x), "tm": None if theirs is None else lambda: theirs(x), "plain": plain})
    return out


# ----------------------------------------------------------------------------------------- one process part
def _plain_update(x: torch.Tensor) -> Callable[[], None]:
    s, n = torch.zeros(()), torch.zeros(())

    def call() -> None:
        s.add_(x.sum())  # s += x.sum()
        n.add_(x.numel())  # n += x.numel()

    return call


def _plain_forward(x: torch.Tensor) -> Callable[[], torch.Tensor]:
    s, n = torch.zeros(()), torch.zeros(())

    def call() -> torch.Tensor:
        s.add_(x.sum())
        n.add_(x.numel())
        return x.mean()

    return call


def _local_worker(rank: int, world: int, budget: Budget, rounds: dict[str, int]) -> dict:
    """Tables 4 (single-process rows) and 5, in one process without a process group."""
    tm = torchmetrics_or_none()
    out: dict = {}
    x = torch.randn(BATCH)
    for call in ("update", "forward"):
        fns: dict[str, Callable[[], Any]] = {"plain": _plain_update(x) if call == "update" else _plain_forward(x)}
        for nan in ("warn", "disable"):
            for impl, mod in (("ours", tmd), ("tm", tm)):
                if mod is not None:
                    metric = mod.MeanMetric(nan_strategy=nan)
                    fns[f"{impl}/{nan}"] = (
                        (lambda m=metric: m.update(x)) if call == "update" else (lambda m=metric: m(x))
                    )
        found = time_local(fns, budget)
        out[("call", call, "plain")] = found["plain"]
        for nan in ("warn", "disable"):
            for impl in ("ours", "tm"):
                out[("call", call, impl, nan)] = found.get(f"{impl}/{nan}")

    # CatMetric.forward after L steps; the three L take turns call by call (time_round_robin)
    y = torch.randn(CAT_BATCH)
    for impl, mod in (("ours", tmd), ("tm", tm)):
        if mod is None:
            continue
        warm = mod.CatMetric()
        for _ in range(100):
            warm(y)
        metrics = {steps: mod.CatMetric() for steps in STEPS}
        for steps, metric in metrics.items():
            # torchmetrics' forward costs O(L) (it clones every element of the list): filling its lists with
            # forward would take minutes, so it gets the same lists from update(); ours is filled by forward
            fill = metric.update if impl == "tm" else metric
            for _ in range(steps):
                fill(y)
        found = time_round_robin(
            {steps: (lambda m=metric: m(y)) for steps, metric in metrics.items()},
            rounds[impl],
            before={0: metrics[0].reset},  # L = 0 exactly: the first forward after a reset
        )
        out.update({("cat_forward", steps, impl): t for steps, t in found.items()})
    return out


# -------------------------------------------------------------------------------------------------- report
_RATIO_NOTE = (
    "ms: median over rounds; ratios: median over rounds of the round's ratio (the blocks of one round run back "
    f"to back, so each ratio compares them under the same load). At W=2 (without --quick) the rounds of {W2_RUNS} "
    "independent runs are pooled."
)


def _paired(res: dict, case: tuple, a: str, b: str) -> float | None:
    """Median over rounds of ``a``'s time / ``b``'s time for ``case`` (see ``_timing.paired_ratio``)."""
    return paired_ratio(res.get((*case, a, "rounds")), res.get((*case, b, "rounds")))


def _scalar_table(res: dict, world: int) -> str:
    rows = []
    for k in SCALAR_K:
        o, t, f, g = (res[("scalar", k, w)] for w in ("ours", "tm", "floor", "gather"))
        case = ("scalar", k)
        rows.append(
            [
                k,
                ms(o),
                ms(t),
                ms(f),
                ms(g),
                fx(_paired(res, case, "ours", "floor")),
                fx(_paired(res, case, "ours", "gather")),
                fx(_paired(res, case, "tm", "ours")),
            ]
        )
    return table(
        f"1. Sync of K scalar `sum` states, W={world} (medians, ms per sync)",
        ["K", "ours ms", "torchmetrics ms", "floor ms", "gather ms", "ours/floor", "ours/gather", "torchmetrics/ours"],
        rows,
        [
            "ours and torchmetrics: `metric.sync(); metric.unsync()` on a metric with K states;",
            "floor: one `dist.all_reduce` of a K-element float32 tensor (the target's floor);",
            f"gather: one `{_all_gather_flat.__name__}` of the same K floats per rank, the collective ours runs",
            "(on gloo it is often faster than an all_reduce of a few floats, so ours can beat the floor).",
            _RATIO_NOTE,
        ],
    )


def _cat_table(res: dict, world: int, runs: list[dict] | None = None) -> str:
    """The cat-state table; with ``runs`` (the runs pooled into ``res``), a note of each run's own ratio at the
    largest K, which shows how far independent runs scatter around the pooled value."""
    rows_per_rank = ", ".join(str(_rows(r)) for r in range(world))
    rows = []
    for k in CAT_K:
        o, t, f = (res[("cat", k, w)] for w in ("ours", "tm", "floor"))
        case = ("cat", k)
        rows.append(
            [k, ms(o), ms(t), ms(f), fx(_paired(res, case, "ours", "floor")), fx(_paired(res, case, "tm", "ours"))]
        )
    return table(
        f"2. Sync of K `cat` list states, uneven rows ({rows_per_rank}) x {WIDTH} float32, W={world}",
        ["K", "ours ms", "torchmetrics ms", "floor ms", "ours/floor", "torchmetrics/ours"],
        rows,
        [
            "ours and torchmetrics: `metric.sync(); metric.unsync()` (each list holds one tensor);",
            f"floor: one `{_all_gather_flat.__name__}` of max rows x K x {WIDTH} float32 per rank.",
            _RATIO_NOTE,
            *_spread(runs, ("cat", CAT_K[-1])),
        ],
    )


def _spread(runs: list[dict] | None, case: tuple) -> list[str]:
    """A note line: ours/floor of ``case`` in each run alone (nothing for a single run)."""
    if not runs or len(runs) < 2:
        return []
    each = ", ".join(fx(_paired(run, case, "ours", "floor")) for run in runs)
    return [f"ours/floor at K={case[-1]} in each of the {len(runs)} runs alone: {each}"]


def _collection_table(res: dict, world: int) -> str:
    o, t, f = (res[("collection", w)] for w in ("ours", "tm", "floor"))
    return table(
        f"3. MetricCollection of {MEMBERS} MeanMetrics: compute() with sync, W={world}",
        ["", "ours ms", "torchmetrics ms", "floor ms", "ours/floor", "torchmetrics/ours"],
        [
            [
                "compute()",
                ms(o),
                ms(t),
                ms(f),
                fx(_paired(res, ("collection",), "ours", "floor")),
                fx(_paired(res, ("collection",), "tm", "ours")),
            ]
        ],
        [
            "members built with compute_with_cache=False (so every compute syncs); torchmetrics with",
            f"compute_groups=False (8 distinct metrics); floor: one all_reduce of {2 * MEMBERS} floats.",
            _RATIO_NOTE,
        ],
    )


def _call_table(local: dict, step: dict | None, world: int) -> str:
    rows = []
    for call in ("update", "forward"):
        plain = local[("call", call, "plain")]
        for nan in ("warn", "disable"):
            o, t = local[("call", call, "ours", nan)], local[("call", call, "tm", nan)]
            label = f"{call}(x), nan_strategy={nan!r}"
            rows.append([label, us(plain), us(o), us(t), fx(ratio(o, plain)), fx(ratio(t, plain))])
    if step is not None:
        p, o, t = step[("step", "plain")], step[("step", "ours")], step[("step", "tm")]
        rows.append(
            [f"forward(x), dist_sync_on_step, W={world}", us(p), us(o), us(t), fx(ratio(o, p)), fx(ratio(t, p))]
        )
    return table(
        f"4. MeanMetric per-call overhead, x = {BATCH} float32 (medians, us per call)",
        ["call", "plain us", "ours us", "torchmetrics us", "ours/plain", "torchmetrics/plain"],
        rows,
        [
            "plain update: `s += x.sum(); n += x.numel()`; plain forward: the same, returning `x.mean()`;",
            "plain dist_sync_on_step: the same plus one all_reduce of (x.sum(), x.numel()), returning their ratio.",
            "Single process rows: W=1, no process group. nan_strategy='warn' is both libraries' default.",
        ],
    )


def _cat_forward_table(local: dict, rounds: dict[str, int]) -> str:
    rows = []
    for steps in STEPS:
        rows.append([steps, us(local.get(("cat_forward", steps, "ours"))), us(local.get(("cat_forward", steps, "tm")))])
    first, last = STEPS[0], STEPS[-1]
    rows.append(
        [
            f"after-{last}/after-{first}",
            fx(ratio(local.get(("cat_forward", last, "ours")), local.get(("cat_forward", first, "ours")))),
            fx(ratio(local.get(("cat_forward", last, "tm")), local.get(("cat_forward", first, "tm")))),
        ]
    )
    return table(
        f"5. CatMetric.forward(x), x = {CAT_BATCH} float32, after L previous forward steps (us per call)",
        ["L", "ours us", "torchmetrics us"],
        rows,
        [
            f"one process; median of single calls, the three L taking turns ({rounds['ours']} rounds for ours,",
            f"{rounds['tm']} for torchmetrics); each call adds a row, so L grows by at most that many; L = 0 is",
            "the first forward after reset(). torchmetrics' lists are filled by update() (its forward is O(L)).",
        ],
    )


def _pooled(results: list[dict]) -> dict:
    """The per-round times of several runs of :func:`_dist_worker` pooled (a round keeps its own pairing), and
    medians recomputed over the pool."""
    out: dict = {}
    for key in results[0]:
        if key[-1] == "rounds":
            rounds = [t for res in results for t in (res[key] or [])] or None
            out[key] = rounds
            out[key[:-1]] = None if rounds is None else median(rounds)
    return out


def main(args: Any) -> list[Check]:
    budget = Budget.from_args(args)
    rounds = {"ours": 100, "tm": 8} if getattr(args, "quick", False) else {"ours": 400, "tm": 25}
    # The W=2 tables hold the acceptance targets. Like pyperf, they pool rounds from several independent runs
    # (fresh processes and process groups): on a shared machine a whole run can land on a slow placement or
    # memory layout, which more rounds within one run do not average out.
    runs = 1 if getattr(args, "quick", False) else W2_RUNS
    checks_w: list[Check] = []
    runs2 = [run_spawned(_dist_worker, 2, budget, ("scalar", "cat", "collection", "step")) for _ in range(runs)]
    res2 = _pooled(runs2)
    print(_scalar_table(res2, 2))
    print(_cat_table(res2, 2, runs2))
    print(_collection_table(res2, 2))
    for world in (3, 4):  # a world that is not a power of two, and one with two ranks per core here
        more = run_spawned(_dist_worker, world, budget, ("scalar", "cat"))
        print(_scalar_table(more, world))
        print(_cat_table(more, world))
        checks_w.append(
            Check(
                f"W={world}, 16 scalar sum states: sync torchmetrics/ours",
                _paired(more, ("scalar", 16), "tm", "ours"),
                ">=",
                20,
            )
        )
    local = run_spawned(_local_worker, 1, budget, rounds)
    print(_call_table(local, res2, 2))
    print(_cat_forward_table(local, rounds))

    k = 16
    fwd = ratio(local[("call", "forward", "ours", "warn")], local[("call", "forward", "plain")])
    after_0, after_l = local[("cat_forward", STEPS[0], "ours")], local[("cat_forward", STEPS[-1], "ours")]
    return [
        Check(f"W=2, {k} scalar sum states: sync ours/floor", _paired(res2, ("scalar", k), "ours", "floor"), "<=", 1.5),
        Check(
            f"W=2, {k} scalar sum states: sync torchmetrics/ours", _paired(res2, ("scalar", k), "tm", "ours"), ">=", 20
        ),
        Check(f"W=2, {k} cat states: sync ours/floor", _paired(res2, ("cat", k), "ours", "floor"), "<=", 1.3),
        Check("MeanMetric.forward (256 floats, W=1): ours/plain torch", fwd, "<=", 4),
        Check(f"CatMetric.forward after {STEPS[-1]} steps / after {STEPS[0]}", ratio(after_l, after_0), "<=", 1.2),
        *checks_w,
    ]
