"""Host work per call at the world sizes users run (64 to 4096 ranks), in a simulated world (``_simworld.py``).

One process plays rank 0 of W identical ranks: the collectives copy this rank's data instead of communicating,
so a call's time is the host work of the package at that W (its Python, header exchanges, planning, packing)
plus the copies a collective of that size needs.

How it measures (so that two runs on a shared, loaded 2-core machine agree): the CPU time of this process
(``time.process_time()``, one torch thread, the garbage collector paused while blocks run), not wall clock, so
time spent waiting for a core another process holds is not counted. The four W are interleaved: the simulator
holds one default group at a time, so a *round* makes one fresh simulated world per W in turn (upwards in odd
rounds, downwards in even ones) and, in each, warms every case up (at least 2 calls: the first sync agrees on
its plan) and times up to :data:`BLOCKS` blocks of calls per case, the cases taking turns. Each block follows one
untimed call of its case (:data:`LEAD_IN`): the first call of a case after other cases is not a steady one (a
call whose header table differs from the last call of its kind rebuilds it, up to ~10 ms at 4096 ranks; a block
of few calls would time that). The number reported for a (case, W) is the *fastest* block of all rounds, in CPU
microseconds per call: load from outside only ever adds time, so the minimum over blocks spread across the
whole run is the number that repeats (``--quick``: 10 rounds, about 1.5 minutes; else 24, about 5). Calls per
block are fixed in the first round (about ``block_s`` of CPU time each); a slow case gets fewer blocks per round
(about :data:`CASE_S` seconds of timed blocks per case and W in all), never fewer than one per round. A fixed
pure-Python loop is timed alike and printed under the table: a gauge of how fast the machine ran.

Table: CPU microseconds per call at W = 64, 256, 1024, 4096, and the growth W=4096 / W=64:

* raw collectives: ``dist.all_reduce`` of 16 float32; an all-gather into one tensor of 2 KiB per rank;
* ``MeanMetric``: ``sync(); unsync()``; ``forward`` with ``dist_sync_on_step=True`` (256 floats);
* a ``MetricCollection`` of 8 ``MeanMetric`` (16 states): ``compute()`` with ``compute_with_cache=False``;
* ``all_gather_cat`` and ``gather_all_tensors`` of 4 x 8 float32 per rank; ``all_reduce`` of 16 float32;
* forward + backward of ``CLIPLoss``, ``SigLIPLoss`` and ``SupConLoss`` (``strategy="sharded"``) on 4 rows of
  width 8 per rank, inputs and logit scale/bias requiring gradient;
* two calls that are not the steady one, whose sync cannot reuse an agreed plan:

  - *first call*: a brand-new ``MeanMetric`` per call, ``update(torch.tensor(1.0)); compute()``: it pays the
    first sync's plan agreement. The metrics of a block are constructed before its timer starts (not timed);
  - *shape change*: one ``CatMetric(compute_with_cache=False)`` whose update alternates 4 and 3 float32 rows at
    every call, ``reset(); update(rows); compute()`` (the reset, timed, keeps the state at one update's rows):
    every call's metadata differs from the previous call's.

Targets (reported, never asserted): at W=4096 at most 2x the host work of W=64 for the MeanMetric sync, the
collection's compute, ``all_gather_cat`` and ``all_reduce``; for the loss steps at most the growth of their data
(the global batch grows 64x from 64 to 4096 ranks), and for ``gather_all_tensors``, whose output is a list of W
tensors, at most the growth of that list; at most 8x for the first call and the shape change.

A third table is counted, not timed: *a failure's propagation*, the notice hops (``distributed/_hosts.py``) after
the partners of a rank that left see it until every surviving rank knows, on the partner graph of the package's
header exchanges at each W (target: at most ``log2 W``).

Run alone: ``python benchmarks/bench_scale.py [--quick]``; with ``--profile CASE`` (e.g. ``"MeanMetric sync"``)
it prints cProfile's top functions of that case at ``--world`` ranks (default 4096) instead.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import math
import pstats
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _simworld import sim_world  # noqa: E402
from _timing import Budget, Check, _gc_paused, fx, ratio, table  # noqa: E402

import torchmetrics_diff as tmd  # noqa: E402
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors  # noqa: E402
from torchmetrics_diff.losses import CLIPLoss, SigLIPLoss, SupConLoss  # noqa: E402

WORLDS = (64, 256, 1024, 4096)
ROWS, WIDTH = 4, 8  # rows x width float32 per rank for the gathers and the losses
MEMBERS = 8
BATCH = 256
GATHER_BYTES = 2048
# rounds over the four W (a fresh simulated world per W and round); the reported time is the fastest block of all
ROUNDS = {False: 24, True: 10}
# timed blocks per case in one round (fewer for a slow case, see CASE_S), the cases taking turns
BLOCKS = 3
# CPU seconds of timed blocks one case may take at one W over all rounds: a slow case (a loss step or a first
# call at 4096 ranks) gets fewer blocks per round, never fewer than one
CASE_S = {False: 2.0, True: 0.75}
# CPU seconds of warm-up one case may take at one W in one round (at least 2 calls, at most budget.warmup)
WARM_S = {False: 0.1, True: 0.05}
MAX_CALLS = 10_000  # calls per block
# untimed calls of a case right before each of its blocks: the cases take turns, and the first call of a case
# after another case's is not a steady call (all_gather_cat's and gather_all_tensors' header tables differ from
# the last call's, and at 4096 ranks rebuilding them costs up to ~10 ms: a block of one call would time that)
LEAD_IN = 1

# the raw all-gather: the spelling torch_diff's backend picks (torch 2.13 renamed all_gather_into_tensor)
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

RAW_AR, RAW_AG = "dist.all_reduce, 16 float32", "all-gather into tensor, 2 KiB/rank"
RAW_ROWS = "all-gather into a new tensor, 4 x 8 float32/rank"  # all_gather_cat's own data collective
# the floor of any log-depth check: log2 W rounds of one send and one receive of the fingerprint's 88 bytes
RAW_RD = "log2 W send/recv rounds, 88 bytes"
MEAN_SYNC, MEAN_STEP, COLLECTION = "MeanMetric sync", "MeanMetric forward, dist_sync_on_step", "collection compute"
AGC, AR, GAT = "all_gather_cat", "all_reduce", "gather_all_tensors"
CLIP, SIGLIP, SUPCON = "CLIPLoss fwd+bwd", "SigLIPLoss fwd+bwd", "SupConLoss fwd+bwd"
FIRST = "first call: new MeanMetric, update + compute"
SHAPE = "shape change: CatMetric rows 4/3, update + compute"
CASES = (
    RAW_AR,
    RAW_AG,
    RAW_ROWS,
    RAW_RD,
    MEAN_SYNC,
    MEAN_STEP,
    COLLECTION,
    AGC,
    AR,
    GAT,
    CLIP,
    SIGLIP,
    SUPCON,
    FIRST,
    SHAPE,
)
FLAT_TARGETS = (MEAN_SYNC, COLLECTION, AGC, AR)  # at most 2x from 64 to 4096 ranks
DATA_TARGETS = (CLIP, SIGLIP, SUPCON)  # at most the data's growth
GROWTH_TARGETS = {FIRST: 8, SHAPE: 8}  # the calls that are not the steady one: at most 8x
# not a case: timed alongside them in every round, printed under the table (see _reference)
REFERENCE_LOOP = 10_000
REFERENCE = f"reference: pure-Python loop of {REFERENCE_LOOP} additions"


@dataclass(frozen=True)
class Fresh:
    """A case whose every call needs an object of its own: ``make()`` before the timer starts (not timed), then
    ``call(obj)`` timed."""

    make: Callable[[], Any]
    call: Callable[[Any], Any]


Case = Union[Callable[[], Any], Fresh]


# ------------------------------------------------------------------------------------------------- the cases
def _unit_rows(*shape: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape), dim=-1)


def _pairwise_rounds(world: int) -> Callable[[], None]:
    """Plain torch: ``log2 W`` rounds in which this rank sends 11 int64 to a partner and receives theirs (rank 0
    of a power-of-two world), what a recursive-doubling exchange costs before any work of its own."""
    pg = dist.group.WORLD
    buf, other = torch.zeros(11, dtype=torch.int64), torch.zeros(11, dtype=torch.int64)
    peers = [1 << k for k in range(world.bit_length() - 1)]

    def run() -> None:
        for peer in peers:
            sent = pg.send([buf], peer, 0)
            pg.recv([other], peer, 0).wait()
            sent.wait()

    return run


def make_cases() -> dict[str, Case]:
    """One call of every case, built inside a (simulated) process group; checks each result once."""
    world = dist.get_world_size()
    fns: dict[str, Case] = {}

    buf = torch.zeros(16)
    fns[RAW_AR] = lambda: dist.all_reduce(buf)
    send = torch.zeros(GATHER_BYTES // 4)
    recv = torch.empty(world * send.numel())
    fns[RAW_AG] = lambda: _all_gather_flat(recv, send)
    row_send = torch.zeros(ROWS * WIDTH)
    # into a new tensor each call, as all_gather_cat returns one (at W=4096 the allocation is part of the data's cost)
    fns[RAW_ROWS] = lambda: _all_gather_flat(torch.empty(world * row_send.numel()), row_send)
    fns[RAW_RD] = _pairwise_rounds(world)

    x = torch.randn(BATCH)
    mean = tmd.MeanMetric()
    mean.update(x)

    def mean_sync() -> None:
        mean.sync()
        mean.unsync()

    fns[MEAN_SYNC] = mean_sync
    step = tmd.MeanMetric(dist_sync_on_step=True)
    fns[MEAN_STEP] = lambda: step(x)
    members = {f"m{i}": tmd.MeanMetric(compute_with_cache=False) for i in range(MEMBERS)}
    collection = tmd.MetricCollection(members)
    collection.update(x)
    fns[COLLECTION] = collection.compute

    rows = torch.randn(ROWS, WIDTH)
    vec = torch.randn(16)
    fns[AGC] = lambda: all_gather_cat(rows)
    fns[AR] = lambda: all_reduce(vec)
    fns[GAT] = lambda: gather_all_tensors(rows)

    image = _unit_rows(ROWS, WIDTH).requires_grad_()
    text = _unit_rows(ROWS, WIDTH).requires_grad_()
    log_scale = torch.tensor(math.log(10.0), requires_grad=True)  # CLIP's parameter: the scale is its exp()
    bias = torch.tensor(-10.0, requires_grad=True)
    feats = _unit_rows(ROWS, WIDTH).requires_grad_()
    labels = torch.arange(ROWS) % 2
    # sharded by name: the default ("auto") picks replicated for the smaller global batches here, whose N x N
    # logits on every rank are the term this benchmark watches for
    clip, siglip, supcon = (cls(strategy="sharded") for cls in (CLIPLoss, SigLIPLoss, SupConLoss))
    fns[CLIP] = lambda: torch.autograd.grad(clip(image, text, log_scale.exp()), (image, text, log_scale))
    fns[SIGLIP] = lambda: torch.autograd.grad(
        siglip(image, text, log_scale.exp(), bias), (image, text, log_scale, bias)
    )
    fns[SUPCON] = lambda: torch.autograd.grad(supcon(feats, labels), (feats,))

    # not the steady call: a brand-new metric's first sync, and a sync whose metadata changes at every call
    one = torch.tensor(1.0)

    def first_call(metric: tmd.MeanMetric) -> torch.Tensor:
        metric.update(one)
        return metric.compute()

    fns[FIRST] = Fresh(tmd.MeanMetric, first_call)
    cat = tmd.CatMetric(compute_with_cache=False)
    flips = (torch.ones(4), torch.ones(3))  # rows of float32 values, 4 then 3, alternately
    turn = itertools.count()

    def shape_change() -> torch.Tensor:
        cat.reset()  # (the state holds one update's rows: the gathered data stays W x 4 floats at most)
        cat.update(flips[next(turn) % 2])
        return cat.compute()

    fns[SHAPE] = shape_change

    # identical ranks: every result is this rank's data, W times
    assert dist.get_backend() == "simworld"
    assert torch.equal(all_gather_cat(rows), rows.repeat(world, 1)), "all_gather_cat"
    assert all(torch.equal(t, rows) for t in gather_all_tensors(rows)), "gather_all_tensors"
    assert torch.allclose(all_reduce(vec), world * vec), "all_reduce"
    probe = tmd.MeanMetric()
    probe.update(x)
    assert torch.allclose(probe.compute(), x.mean()), "MeanMetric"
    assert torch.allclose(step(x), x.mean()), "MeanMetric forward"
    assert all(torch.allclose(v, x.mean()) for v in collection.compute().values()), "MetricCollection"
    assert torch.equal(first_call(tmd.MeanMetric()), one), "first call"
    assert all(torch.equal(shape_change(), torch.ones(world * n)) for n in (4, 3, 4)), "shape change"
    return fns


# ---------------------------------------------------------------------------------------------------- timing
def _run(case: Case, calls: int) -> float:
    """CPU seconds of ``calls`` calls of ``case`` in a row (a :class:`Fresh` case's objects made before)."""
    if isinstance(case, Fresh):
        objs = [case.make() for _ in range(calls)]
        t0 = time.process_time()
        for obj in objs:
            case.call(obj)
        return time.process_time() - t0
    t0 = time.process_time()
    for _ in range(calls):
        case()
    return time.process_time() - t0


def _warm_up(case: Case, calls: int, cap_s: float) -> float:
    """``calls`` warm-up calls (at least 2; fewer once they took ``cap_s`` CPU seconds); the CPU seconds of the
    fastest call after the first (an estimate of a steady call)."""
    spent, fastest = _run(case, 1), math.inf
    for _ in range(1, max(2, calls)):
        took = _run(case, 1)
        spent += took
        fastest = min(fastest, took)
        if spent > cap_s:
            break
    return fastest


def _reference() -> int:
    """A fixed piece of pure-Python work, timed like the cases: how fast this machine ran Python during the run
    (two runs' tables differ by about as much as their references do when the host itself was slower)."""
    total = 0
    for i in range(REFERENCE_LOOP):
        total += i
    return total


@dataclass(frozen=True)
class Plan:
    """How one case is timed at one W in every round: ``blocks`` blocks of ``calls`` calls."""

    calls: int
    blocks: int


def _plan(per_call: float, block_s: float, rounds: int, case_s: float) -> Plan:
    per_call = max(per_call, 1e-7)
    calls = max(1, min(MAX_CALLS, int(block_s / per_call)))
    return Plan(calls, max(1, min(BLOCKS, int(case_s / (rounds * calls * per_call)))))


@dataclass
class Round:
    """What one round measured at one W: per case, the CPU seconds per call of each block."""

    world: int
    index: int
    blocks: dict[str, list[float]]
    twins: int


def measure_round(
    world: int, index: int, budget: Budget, plans: dict[str, Plan] | None, rounds: int, case_s: float, warm_s: float
) -> tuple[Round, dict[str, Plan]]:
    """One round at ``world`` ranks, in a fresh simulated world: every case warmed up, then up to
    :data:`BLOCKS` sweeps in which each case runs one block (those that still have blocks this round), the
    garbage collector paused during a sweep. ``plans`` (calls per block, blocks per round) are made from the
    warm-up when ``None`` (the first round) and returned, so that later rounds time the same blocks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sim_world(world) as sim:
            cases = {**make_cases(), REFERENCE: _reference}
            per_call = {name: _warm_up(case, budget.warmup, warm_s) for name, case in cases.items()}
            if plans is None:
                plans = {name: _plan(per_call[name], budget.block_s, rounds, case_s) for name in cases}
            found: dict[str, list[float]] = {name: [] for name in cases}
            for sweep in range(max(p.blocks for p in plans.values())):
                with _gc_paused():  # (a collection inside a block would be charged to the call it interrupted)
                    for name, case in cases.items():
                        plan = plans[name]
                        if sweep < plan.blocks:
                            _run(case, LEAD_IN)  # (untimed: the call after another case's re-agrees its table)
                            found[name].append(_run(case, plan.calls) / plan.calls)
            return Round(world, index, found, len(sim.twins)), plans


def collect(rounds: int, budget: Budget, case_s: float, warm_s: float, log: bool = True) -> list[Round]:
    """``rounds`` rounds over the four W, upwards in odd rounds and downwards in even ones, one torch thread."""
    done: list[Round] = []
    plans: dict[int, dict[str, Plan]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (as every benchmark: the machines have 2 cores)
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        for r in range(rounds):
            for world in WORLDS if r % 2 == 0 else WORLDS[::-1]:
                found, plans[world] = measure_round(world, r, budget, plans.get(world), rounds, case_s, warm_s)
                done.append(found)
    finally:
        torch.set_num_threads(threads)
    if log:
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(f"({rounds} rounds over W={', '.join(map(str, WORLDS))}: {wall:.0f} s, of which {cpu:.0f} s CPU)")
    return done


def fastest(done: list[Round]) -> dict[int, dict[str, float]]:
    """Per W and case, the fastest block of all rounds (CPU seconds per call)."""
    out: dict[int, dict[str, float]] = {w: {} for w in WORLDS}
    for found in done:
        row = out[found.world]
        for case, blocks in found.blocks.items():
            row[case] = min(row.get(case, math.inf), *blocks)
    return out


# ---------------------------------------------------------------------------------------------------- report
def scale_table(results: dict[int, dict[str, float]], twins: int, case_s: float, rounds: int, block_s: float) -> str:
    first, last = WORLDS[0], WORLDS[-1]
    rows = []
    for case in CASES:
        row: list[Any] = [case] + [f"{results[w][case] * 1e6:.1f}" for w in WORLDS]
        row.append(fx(ratio(results[last][case], results[first][case])))
        rows.append(row)
    host = (
        "the group itself"
        if not twins
        else "a simulated gloo twin of the group (the package asked dist.new_group for a gloo group)"
    )
    return table(
        f"Host work per call in a simulated world of W identical ranks (fastest of {rounds} rounds, CPU us per call)",
        ["call", *(f"W={w}" for w in WORLDS), f"W={last}/W={first}"],
        rows,
        [
            "one process is rank 0 of W; collectives copy its data instead of communicating (benchmarks/_simworld.py),",
            "so a time is the package's host work at that W plus the copies a collective of that size makes;",
            f"per rank: gathers {ROWS}x{WIDTH} float32, all_reduce 16 float32, MeanMetric {BATCH} floats;",
            f"collection: {MEMBERS} MeanMetrics ({2 * MEMBERS} states), compute() with compute_with_cache=False;",
            f'losses: strategy="sharded", {ROWS} rows of width {WIDTH} per rank, inputs requiring grad;',
            "first call: a new MeanMetric per call (constructed untimed); shape change: one CatMetric,",
            "reset() + update(4 or 3 rows, alternately) + compute() per call;",
            "CPU time of this process (time.process_time, one torch thread, GC paused in a block), the four W",
            f"interleaved: {rounds} rounds, each a fresh simulated world per W (upwards, then downwards): warm-up,",
            f"then up to {BLOCKS} blocks of about {block_s * 1e3:g} ms per case, each after one untimed call (slow",
            f"cases fewer: about {case_s:g} s of blocks per case and W in all, at least one per round); the fastest",
            f"block; {REFERENCE}, timed alike (a gauge of the machine's speed",
            f"during the run): {min(results[w][REFERENCE] for w in WORLDS) * 1e6:.1f} us.",
            f"The package's header exchanges went over {host}.",
        ],
    )


def main(args: Any) -> list[Check]:
    quick = bool(getattr(args, "quick", False))
    budget = Budget.from_args(args)
    rounds, case_s = ROUNDS[quick], CASE_S[quick]
    done = collect(rounds, budget, case_s, WARM_S[quick])
    results = fastest(done)
    print()
    print(scale_table(results, sum(r.twins for r in done), case_s, rounds, budget.block_s))

    first, last = WORLDS[0], WORLDS[-1]
    growth = last / first
    checks = [
        Check(f"{case}: host work W={last} / W={first}", ratio(results[last][case], results[first][case]), "<=", 2)
        for case in FLAT_TARGETS
    ]
    # the package's own part of a call: beyond its data's raw collective and the log2 W rounds of its check
    own = {w: results[w][AGC] - results[w][RAW_ROWS] - results[w][RAW_RD] for w in (first, last)}
    checks.append(
        Check(
            f"{AGC}: host work beyond its raw all-gather and log2 W raw send/recv rounds W={last} / W={first}",
            ratio(own[last], own[first]),
            "<=",
            2,
        )
    )
    checks += [
        Check(
            f"{case} (sharded): host work W={last} / W={first} (data grows {growth:g}x)",
            ratio(results[last][case], results[first][case]),
            "<=",
            growth,
        )
        for case in DATA_TARGETS
    ]
    # a list of W tensors by its contract: its output grows with W (see its docstring); nothing grows faster
    checks.append(
        Check(
            f"{GAT}: host work W={last} / W={first} (its output: W tensors, {growth:g}x)",
            ratio(results[last][GAT], results[first][GAT]),
            "<=",
            growth,
        )
    )
    checks += [
        Check(f"{case}: host work W={last} / W={first}", ratio(results[last][case], results[first][case]), "<=", limit)
        for case, limit in GROWTH_TARGETS.items()
    ]
    print()
    hops = {w: propagation_hops(w) for w in WORLDS}
    print(propagation_table(hops))
    checks += [
        Check(f"a failure's propagation at W={w}: notice hops until every survivor knows", hops[w], "<=", math.log2(w))
        for w in WORLDS
    ]
    return checks


# ---------------------------------------------------------------------------------- a failure's propagation
def propagation_hops(world: int, victims: int = 64) -> int:
    """The most notice hops until every surviving rank knows that a rank left, over ``victims`` ranks spread over
    the world (the first rank, the last, and evenly between).

    A rank that left is seen at once by its partners in the header exchanges (``Host.partners()``: the ranks it
    swaps with in the log-depth all-gather and fingerprint); each rank that knows sends its own partners a notice
    (``distributed._hosts``), one hop. This counts hops of that graph without the rank that left (a breadth-first
    search from its partners), the worst case for ranks that all wait in an exchange: a rank busy elsewhere hears
    at its next call, and a rank in one of gloo's own collectives reads the group's store within 0.1 s instead.
    """
    from torchmetrics_diff.distributed._hosts import Host

    partners = [Host(lambda: None, r, world, twin=False).partners() for r in range(world)]
    worst = 0
    for gone in sorted({0, world - 1, *range(0, world, max(1, world // victims))}):
        known = {r for r in partners[gone] if r != gone}
        frontier, hops = set(known), 0
        while len(known) < world - 1:
            frontier = {p for r in frontier for p in partners[r] if p != gone and p not in known}
            if not frontier:
                raise RuntimeError(f"W={world}: the partner graph without rank {gone} is not connected")
            known |= frontier
            hops += 1
        worst = max(worst, hops)
    return worst


def propagation_table(hops: dict[int, int]) -> str:
    rows = [["notice hops after its partners, until every survivor knows", *(str(hops[w]) for w in WORLDS)]]
    rows.append(["log2 W", *(f"{math.log2(w):g}" for w in WORLDS)])
    return table(
        "A failure's propagation: the partners of the rank that left see it; each tells its own partners",
        ["", *(f"W={w}" for w in WORLDS)],
        rows,
        ["one hop: a notice of 16 bytes to a partner blocked in a header exchange (distributed/_hosts.py)"],
    )


# ---------------------------------------------------------------------------------------------------- profile
def profile(case: str, world: int, calls: int, top: int) -> str:
    """cProfile's top functions (by cumulative time) of ``calls`` calls of ``case`` at ``world``, after warm-up
    calls (steady state; a new metric per call for the first call, made outside the profile)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sim_world(world):
            fn = make_cases()[case]
            for _ in range(10):
                _run(fn, 1)
            objs = [fn.make() for _ in range(calls)] if isinstance(fn, Fresh) else None
            prof = cProfile.Profile()
            prof.enable()
            if objs is not None:
                for obj in objs:
                    fn.call(obj)
            else:
                for _ in range(calls):
                    fn()
            prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return f"{case} at W={world}, {calls} calls\n{out.getvalue()}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a rough look, not a measurement)")
    parser.add_argument("--profile", metavar="CASE", choices=CASES, help="profile one case instead")
    parser.add_argument("--world", type=int, default=WORLDS[-1], help="W of --profile (default %(default)s)")
    parser.add_argument("--calls", type=int, default=200, help="calls of --profile (default %(default)s)")
    parser.add_argument("--top", type=int, default=40, help="functions --profile lists (default %(default)s)")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    if cli.profile:
        print(profile(cli.profile, cli.world, cli.calls, cli.top))
    else:
        for check in main(cli):
            print(check.line())
