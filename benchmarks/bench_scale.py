"""Host work per call at the world sizes users run (64 to 4096 ranks), in a simulated world (``_simworld.py``).

One process plays rank 0 of W identical ranks: the collectives copy this rank's data instead of communicating,
so a call's time is the host work of the package at that W (its Python, header exchanges, planning, packing)
plus the copies a collective of that size needs. Each W runs in a fresh simulated world (init/destroy).

Table: microseconds per call at W = 64, 256, 1024, 4096, median over timed blocks after warm-up calls (the steady
state; then the median over passes of the four W), and the growth W=4096 / W=64:

* raw collectives: ``dist.all_reduce`` of 16 float32; an all-gather into one tensor of 2 KiB per rank;
* ``MeanMetric``: ``sync(); unsync()``; ``forward`` with ``dist_sync_on_step=True`` (256 floats);
* a ``MetricCollection`` of 8 ``MeanMetric`` (16 states): ``compute()`` with ``compute_with_cache=False``;
* ``all_gather_cat`` and ``gather_all_tensors`` of 4 x 8 float32 per rank; ``all_reduce`` of 16 float32;
* forward + backward of ``CLIPLoss``, ``SigLIPLoss`` and ``SupConLoss`` (``strategy="sharded"``) on 4 rows of
  width 8 per rank, inputs and logit scale/bias requiring gradient.

Targets (reported, never asserted): at W=4096 at most 2x the host work of W=64 for the MeanMetric sync, the
collection's compute, ``all_gather_cat`` and ``all_reduce``; for the loss steps at most the growth of their data
(the global batch grows 64x from 64 to 4096 ranks), and for ``gather_all_tensors``, whose output is a list of W
tensors, at most the growth of that list.

Run alone: ``python benchmarks/bench_scale.py [--quick]``; with ``--profile CASE`` (e.g. ``"MeanMetric sync"``)
it prints cProfile's top functions of that case at ``--world`` ranks (default 4096) instead.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import math
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _simworld import sim_world  # noqa: E402
from _timing import Budget, Check, fx, ratio, table  # noqa: E402

import torchmetrics_diff as tmd  # noqa: E402
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors  # noqa: E402
from torchmetrics_diff.losses import CLIPLoss, SigLIPLoss, SupConLoss  # noqa: E402

WORLDS = (64, 256, 1024, 4096)
ROWS, WIDTH = 4, 8  # rows x width float32 per rank for the gathers and the losses
MEMBERS = 8
BATCH = 256
GATHER_BYTES = 2048
# seconds of timed blocks one case may take at one W in one pass (its warm-up is capped alike): the slow cases (a
# loss step at 4096 ranks before the package scales) get fewer repeats, never fewer than MIN_REPEATS
CASE_S = {False: 1.0, True: 0.75}
MIN_REPEATS = 3
# sweeps over the four W (each W in a fresh world every time), alternately upwards and downwards: the reported
# time is the median over passes, so that a burst of load from outside while one W ran does not make its number
# (the machines are shared; the W are measured at different times and cannot be paired round by round)
PASSES = {False: 3, True: 1}

# the raw all-gather: the spelling torch_diff's backend picks (torch 2.13 renamed all_gather_into_tensor)
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

RAW_AR, RAW_AG = "dist.all_reduce, 16 float32", "all-gather into tensor, 2 KiB/rank"
RAW_ROWS = "all-gather into a new tensor, 4 x 8 float32/rank"  # all_gather_cat's own data collective
# the floor of any log-depth check: log2 W rounds of one send and one receive of the fingerprint's 88 bytes
RAW_RD = "log2 W send/recv rounds, 88 bytes"
MEAN_SYNC, MEAN_STEP, COLLECTION = "MeanMetric sync", "MeanMetric forward, dist_sync_on_step", "collection compute"
AGC, AR, GAT = "all_gather_cat", "all_reduce", "gather_all_tensors"
CLIP, SIGLIP, SUPCON = "CLIPLoss fwd+bwd", "SigLIPLoss fwd+bwd", "SupConLoss fwd+bwd"
CASES = (RAW_AR, RAW_AG, RAW_ROWS, RAW_RD, MEAN_SYNC, MEAN_STEP, COLLECTION, AGC, AR, GAT, CLIP, SIGLIP, SUPCON)
FLAT_TARGETS = (MEAN_SYNC, COLLECTION, AGC, AR)  # at most 2x from 64 to 4096 ranks
DATA_TARGETS = (CLIP, SIGLIP, SUPCON)  # at most the data's growth


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


def make_cases() -> dict[str, Callable[[], Any]]:
    """One call of every case, built inside a (simulated) process group; checks each result once."""
    world = dist.get_world_size()
    fns: dict[str, Callable[[], Any]] = {}

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
    return fns


# ---------------------------------------------------------------------------------------------------- timing
def _calls_per_block(fn: Callable[[], Any], block_s: float) -> int:
    t0 = time.perf_counter()
    fn()
    per = time.perf_counter() - t0
    return max(1, min(10_000, int(block_s / max(per, 1e-7))))


def time_cases(fns: dict[str, Callable[[], Any]], budget: Budget, case_s: float) -> dict[str, float]:
    """Median seconds per call of each function: ``budget.warmup`` calls first (at most about ``case_s / 2``
    seconds of them, at least 2), then rounds in which each function runs one block of calls, the functions
    taking turns (so load from outside hits them alike); a function stops after ``budget.repeats`` blocks or
    after ``case_s`` seconds of them, whichever comes first, but runs at least :data:`MIN_REPEATS` blocks."""
    calls: dict[str, int] = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        for i in range(budget.warmup):
            fn()
            if i >= 1 and time.perf_counter() - t0 > case_s / 2:
                break
        calls[name] = _calls_per_block(fn, budget.block_s)
    times: dict[str, list[float]] = {name: [] for name in fns}
    spent = dict.fromkeys(fns, 0.0)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # (a collection inside a block would be charged to whichever call it interrupted)
    try:
        for r in range(budget.repeats):
            for name, fn in fns.items():
                if r >= MIN_REPEATS and spent[name] > case_s:
                    continue
                n = calls[name]
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                elapsed = time.perf_counter() - t0
                spent[name] += elapsed
                times[name].append(elapsed / n)
            gc.enable()
            gc.collect()  # (between rounds: the loss steps' graphs leave cycles)
            gc.disable()
    finally:
        if enabled:
            gc.enable()
    return {name: statistics.median(t) for name, t in times.items()}


def measure(world: int, budget: Budget, case_s: float) -> tuple[dict[str, float], int]:
    """Seconds per call of every case at ``world`` ranks, in a fresh simulated world; and how many gloo groups
    the package asked for there (simulated too, see ``_simworld``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sim_world(world) as sim:
            found = time_cases(make_cases(), budget, case_s)
            return found, len(sim.twins)


# ---------------------------------------------------------------------------------------------------- report
def scale_table(results: dict[int, dict[str, float]], twins: dict[int, int], case_s: float, passes: int) -> str:
    first, last = WORLDS[0], WORLDS[-1]
    rows = []
    for case in CASES:
        row: list[Any] = [case] + [f"{results[w][case] * 1e6:.1f}" for w in WORLDS]
        row.append(fx(ratio(results[last][case], results[first][case])))
        rows.append(row)
    host = (
        "the group itself"
        if not any(twins.values())
        else "a simulated gloo twin of the group (the package asked dist.new_group for a gloo group)"
    )
    return table(
        "Host work per call in a simulated world of W identical ranks (medians, us per call)",
        ["call", *(f"W={w}" for w in WORLDS), f"W={last}/W={first}"],
        rows,
        [
            "one process is rank 0 of W; collectives copy its data instead of communicating (benchmarks/_simworld.py),",
            "so a time is the package's host work at that W plus the copies a collective of that size makes;",
            f"per rank: gathers {ROWS}x{WIDTH} float32, all_reduce 16 float32, MeanMetric {BATCH} floats;",
            f"collection: {MEMBERS} MeanMetrics ({2 * MEMBERS} states), compute() with compute_with_cache=False;",
            f'losses: strategy="sharded", {ROWS} rows of width {WIDTH} per rank, inputs requiring grad;',
            "each W in a fresh simulated world; median of timed blocks after warm-up (slow cases get fewer blocks:",
            f"about {case_s:g} s of them per case and W, at least {MIN_REPEATS}); median of {passes} such pass(es)",
            "over the four W, alternately upwards and downwards.",
            f"The package's header exchanges went over {host}.",
        ],
    )


def main(args: Any) -> list[Check]:
    quick = bool(getattr(args, "quick", False))
    budget = Budget.from_args(args)
    case_s, passes = CASE_S[quick], PASSES[quick]
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in WORLDS}
    twins: dict[int, int] = dict.fromkeys(WORLDS, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (as every benchmark: the machines have 2 cores)
    try:
        for p in range(passes):
            took = []
            for world in WORLDS if p % 2 == 0 else WORLDS[::-1]:
                t0 = time.perf_counter()
                found, made = measure(world, budget, case_s)
                runs[world].append(found)
                twins[world] += made
                took.append(f"W={world} {time.perf_counter() - t0:.0f} s")
            print(f"(pass {p + 1}/{passes}: {', '.join(took)})")
    finally:
        torch.set_num_threads(threads)
    results = {w: {case: statistics.median(r[case] for r in runs[w]) for case in CASES} for w in WORLDS}
    print()
    print(scale_table(results, twins, case_s, passes))

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
    return checks


# ---------------------------------------------------------------------------------------------------- profile
def profile(case: str, world: int, calls: int, top: int) -> str:
    """cProfile's top functions (by cumulative time) of ``calls`` steady-state calls of ``case`` at ``world``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sim_world(world):
            fn = make_cases()[case]
            for _ in range(10):
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                fn()
            prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return f"{case} at W={world}, {calls} calls\n{out.getvalue()}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a rough look, not a measurement)")
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
