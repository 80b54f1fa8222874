"""CLIPLoss strategies: replicated, sharded and ring, step time and peak memory per rank.

Three parts:

1. *Real runs* at W = 2 on gloo: ``CLIPLoss(strategy=s)`` forward + backward per step for the three strategies
   (``tile`` at its default) at global batches from 32 to 4096 rows, and the peak memory per rank of one step
   of each, measured in one further set of processes (the resident set's rise during the step: ``VmHWM`` reset
   through ``/proc/self/clear_refs`` before it, allocations of 64 KiB and more their own mappings so that the
   resident set follows the live tensors). This is the comparison table of ``docs/guide/strategies.rst``.
2. *Simulated large global batch* (N = 8192 rows of D = 256, float32, split over W = 1, 2, 4, 8): one rank's
   forward + backward of the loss, each configuration in a fresh process so its peak RSS is its own. The
   replicated rank runs ``global_clip_loss(..., strategy="replicated")`` on the whole batch, which is what every
   replicated rank computes after its gather; the sharded rank runs ``clip_sum`` on its (B, N) row block,
   B = N / W, against the N texts, the kernel ``global_clip_loss(..., strategy="sharded")`` runs after gathering
   the texts (without the other ranks its column statistics are this rank's own, which changes the value, not
   the work). The collectives are left out: this is the compute and memory a rank spends on the loss itself.
3. *Host round trips* at W = 2 on gloo, beside the step times: per training step of every loss and strategy and
   of a syncing ``MeanMetric``, the calls that would make the host wait for a GPU (``tolist``, ``item``,
   ``__bool__``, ...; ``tests/_helpers/round_trips.py``), on the first call and in the steady state (target 0).
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import torch
import torch.distributed as dist
from _timing import Budget, Check, fx, ms, peak_rise_mib, ratio, run_spawned, table, time_dist

from tests._helpers.round_trips import counting, total

N_BIG, D_BIG = 8192, 256
WORLDS = (1, 2, 4, 8)
STRATEGIES = ("replicated", "sharded", "ring")
COMPARE_SIZES, COMPARE_D, COMPARE_W = (32, 256, 1024, 4096), 128, 2


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _simulated_rank(_rank: int, _world: int, strategy: str, world: int, n: int, d: int, repeats: int) -> dict:
    """One rank's loss step at world size ``world`` (no collectives): seconds and peak RSS above baseline."""
    from torchmetrics_diff.functional import clip_sum, global_clip_loss

    gen = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    rows = n // world
    baseline = _rss_mib()
    times = []
    for _ in range(repeats + 1):  # the first iteration warms up the allocator and threads; not timed
        all_img, all_txt = img.clone().requires_grad_(), txt.clone().requires_grad_()
        start = time.perf_counter()
        if strategy == "replicated":  # the whole problem, as every replicated rank computes it after its gather
            loss = global_clip_loss(all_img, all_txt, 10.0, strategy="replicated")
        else:  # this rank's image rows (its own inputs) against every gathered text, the sharded kernel
            loc_img = all_img[:rows].detach().requires_grad_()
            loss = clip_sum(loc_img, all_txt, 10.0, 0) / n
        loss.backward()
        times.append(time.perf_counter() - start)
        del loss, all_img, all_txt
    times = times[1:]
    return {"seconds": sorted(times)[len(times) // 2], "peak_mib": _peak_mib() - baseline}


def _compare_inputs(rank: int, world: int, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    img = torch.nn.functional.normalize(torch.randn(n // world, d, generator=gen), dim=1).requires_grad_()
    txt = torch.nn.functional.normalize(torch.randn(n // world, d, generator=gen), dim=1).requires_grad_()
    return img, txt


def _compare_time_worker(rank: int, world: int, sizes: tuple[int, ...], d: int, budget: Budget) -> dict:
    """Median seconds of one ``CLIPLoss`` step (forward + backward) per strategy and global batch."""
    from torchmetrics_diff.losses import CLIPLoss

    out = {}
    for n in sizes:
        img, txt = _compare_inputs(rank, world, n, d)
        losses = {s: CLIPLoss(strategy=s) for s in STRATEGIES}
        steps = {s: (lambda loss=loss, img=img, txt=txt: loss(img, txt, 10.0).backward()) for s, loss in losses.items()}
        timed = time_dist(steps, budget)
        out.update({(n, s): t for s, t in timed.items()})
    return out


def _compare_memory_worker(rank: int, world: int, sizes: tuple[int, ...], d: int) -> dict:
    """Peak rise of the resident set during one ``CLIPLoss`` step per strategy and global batch, largest rank."""
    from torchmetrics_diff.losses import CLIPLoss

    losses = {s: CLIPLoss(strategy=s) for s in STRATEGIES}
    for loss in losses.values():  # code pages, thread pools and the gloo pairs are touched outside the measurement
        loss(*_compare_inputs(rank, world, 16 * world, d), 10.0).backward()
    out = {}
    for n in sizes:
        for s, loss in losses.items():
            img, txt = _compare_inputs(rank, world, n, d)
            dist.barrier()
            peak = peak_rise_mib(lambda loss=loss, img=img, txt=txt: loss(img, txt, 10.0).backward())
            peaks: list[Any] = [None] * world
            dist.all_gather_object(peaks, peak)
            out[(n, s)] = max(peaks)
            del img, txt
    return out


def _round_trip_cases(rank: int, rows: int, d: int) -> dict[str, Any]:
    """Name -> ``(criterion, step(criterion))``: one training step (forward + backward) of each loss and strategy,
    and a ``MeanMetric`` forward that syncs (``dist_sync_on_step=True``)."""
    from torchmetrics_diff import MeanMetric
    from torchmetrics_diff.losses import (
        BarlowTwinsLoss,
        CLIPLoss,
        GlobalMeanLoss,
        InfoNCELoss,
        SigLIPLoss,
        SupConLoss,
        TokenCrossEntropyLoss,
    )

    gen = torch.Generator().manual_seed(rank)
    a = torch.nn.functional.normalize(torch.randn(rows, d, generator=gen), dim=1).requires_grad_()
    b = torch.nn.functional.normalize(torch.randn(rows, d, generator=gen), dim=1).requires_grad_()
    labels = torch.randint(0, 8, (rows,), generator=gen)
    scale, bias = torch.tensor(10.0, requires_grad=True), torch.tensor(-5.0, requires_grad=True)
    logits = torch.randn(rows, 16, 32, generator=gen, requires_grad=True)
    target = torch.randint(0, 32, (rows, 16), generator=gen)
    values = torch.randn(rows, 16, generator=gen, requires_grad=True)
    cases: dict[str, Any] = {}
    for s in ("replicated", "sharded", "ring"):
        cases[f"CLIPLoss {s}"] = (CLIPLoss(strategy=s), lambda c: c(a, b, scale).backward())
        cases[f"SigLIPLoss {s}"] = (SigLIPLoss(strategy=s), lambda c: c(a, b, scale, bias).backward())
        cases[f"InfoNCELoss {s}"] = (InfoNCELoss(strategy=s), lambda c: c(a, b).backward())
        cases[f"SupConLoss {s}"] = (SupConLoss(strategy=s), lambda c: c(a, labels).backward())
    cases["BarlowTwinsLoss"] = (BarlowTwinsLoss(), lambda c: c(a, b).backward())
    cases["GlobalMeanLoss"] = (GlobalMeanLoss(), lambda c: c(values, mask=values > 0).backward())
    cases["TokenCrossEntropyLoss"] = (TokenCrossEntropyLoss(), lambda c: c(logits, target).backward())
    mean = MeanMetric(dist_sync_on_step=True)
    cases["MeanMetric sync step"] = (mean, lambda c: c(values, weight=values > 0).backward())
    return cases


def _round_trip_worker(rank: int, world: int, rows: int, d: int, budget: Budget) -> dict:
    """Per case: host round trips of the first step and per steady step, and the median step time."""
    cases = _round_trip_cases(rank, rows, d)
    out = {}
    for name, (criterion, step) in cases.items():
        with counting() as first:
            step(criterion)
        step(criterion)  # warm-up
        steady_steps = 3
        with counting() as steady:
            for _ in range(steady_steps):
                step(criterion)
        seconds = time_dist({name: lambda step=step, criterion=criterion: step(criterion)}, budget)[name]
        out[name] = (total(first), total(steady) / steady_steps, seconds)
    return out


def _compare(budget: Budget) -> list[Check]:
    """Part 1: the three strategies side by side, real W = 2 steps (time) and one step each (memory)."""
    sizes = COMPARE_SIZES
    times = run_spawned(_compare_time_worker, COMPARE_W, sizes, COMPARE_D, budget)
    # every allocation of 64 KiB or more its own mapping, handed back when freed: the resident set follows the
    # live tensors (the spawned ranks inherit the variable; the timing runs above use glibc's defaults)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        peaks = run_spawned(_compare_memory_worker, COMPARE_W, sizes, COMPARE_D)
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    rows = [
        [n]
        + [ms(times[(n, s)]) for s in STRATEGIES]
        + [fx(ratio(times[(n, "replicated")], times[(n, "sharded")]))]
        + [f"{peaks[(n, s)]:.1f}" for s in STRATEGIES]
        for n in sizes
    ]
    print(
        table(
            f"CLIPLoss(strategy=...) forward + backward per step, W={COMPARE_W} on gloo (D={COMPARE_D}, float32, "
            "tile=64 for ring)",
            ["global batch"]
            + [f"{s} ms" for s in STRATEGIES]
            + ["replicated/sharded"]
            + [f"{s} MiB" for s in STRATEGIES],
            rows,
            [
                "ms: rank 0's median step time, the strategies' blocks interleaved round by round",
                "MiB: peak rise of a rank's resident set during one step (the largest rank), in further processes",
            ],
        )
    )
    big = sizes[-1]
    return [
        Check(
            f"CLIPLoss N={big} W={COMPARE_W}: sharded peak / replicated peak",
            ratio(peaks[(big, "sharded")], peaks[(big, "replicated")]),
            "<=",
            1.0,
        ),
        Check(
            f"CLIPLoss N={big} W={COMPARE_W}: ring peak / sharded peak",
            ratio(peaks[(big, "ring")], peaks[(big, "sharded")]),
            "<=",
            1.0,
        ),
    ]


def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    budget = Budget(repeats=5, block_s=0.2, warmup=2) if not quick else Budget(repeats=3, block_s=0.05, warmup=1)
    checks = _compare(budget)
    n, d = (2048, 128) if quick else (N_BIG, D_BIG)
    repeats = 1 if quick else 3
    logits_mib = n * n * 4 / 2**20
    gathered_mib = 2 * n * d * 4 / 2**20  # the gathered image and text embeddings (and as much for their grads)
    # Large tensors are mmapped and handed back to the OS when freed, so the peak counts live tensors, not the
    # memory malloc keeps after the warm-up iteration (bench_anchors measures the same way).
    saved = {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    os.environ.update({k: "65536" for k in saved})
    try:
        sim = {"replicated": run_spawned(_simulated_rank, 1, "replicated", 1, n, d, repeats)}
        for w in WORLDS:
            sim[w] = run_spawned(_simulated_rank, 1, "sharded", w, n, d, repeats)
        # what a sharded rank holds whatever W: one row against N (the embeddings, their gradient, the runtime's)
        fixed = run_spawned(_simulated_rank, 1, "sharded", n, n, d, repeats)["peak_mib"]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rep = sim["replicated"]
    rows = []
    for w in WORLDS:
        shard = sim[w]
        bound = 1.1 * (max(rep["peak_mib"] - fixed, 0.0) / w + fixed)
        rows.append(
            [
                w,
                n // w,
                ms(rep["seconds"]),
                ms(shard["seconds"]),
                fx(ratio(rep["seconds"], shard["seconds"])),
                f"{rep['peak_mib']:.0f}",
                f"{shard['peak_mib']:.0f}",
                f"{fixed:.0f}",
                f"{bound:.0f}",
            ]
        )
        checks.append(
            Check(
                f"CLIPLoss N={n} W={w}: sharded peak / 1.1 x (fixed + (replicated - fixed) / W)",
                shard["peak_mib"] / bound,
                "<=",
                1.0,
            )
        )
    print(
        table(
            f"CLIPLoss per rank, simulated global batch {n} x {d} float32 (forward + backward of the loss)",
            [
                "W",
                "rows/rank",
                "replicated ms",
                "sharded ms",
                "speed-up",
                "replicated MiB",
                "sharded MiB",
                "fixed MiB",
                "bound MiB",
            ],
            rows,
            [
                f"full N x N logits: {logits_mib:.0f} MiB; gathered embeddings: {gathered_mib:.0f} MiB",
                "fixed = peak of a sharded rank with one row (the N gathered rows, their gradient and what any step",
                "allocates); bound = 1.1 x (fixed + (replicated - fixed) / W): the rest of the replicated peak shrinks",
                "as 1/W (the one-pass kernels keep one logit block, so the fixed part weighs more than it did)",
                "peak = max RSS of a fresh process above its RSS after building the inputs (malloc's mmap threshold "
                "fixed at 64 KiB, so freed tensors leave the resident set)",
            ],
        )
    )

    rows_per_rank = 256 if not quick else 64
    trips = run_spawned(_round_trip_worker, 2, rows_per_rank, 128, budget)
    print(
        table(
            f"Host round trips per training step, W=2 on gloo ({rows_per_rank} rows per rank, D=128, float32)",
            ["step", "ms/step", "round trips, first call", "round trips/step, steady"],
            [[name, ms(sec), first, f"{steady:g}"] for name, (first, steady, sec) in trips.items()],
            [
                "round trips: calls that wait for the device on a GPU (tolist, item, __bool__, cpu, numpy, int/float, "
                "data-shaped ops), counted on rank 0",
                "every call's sizes travel as host values in its header exchange (a CPU tensor over a CPU-capable "
                "group), so no shape needs to be cached: docs/guide/sync_engine.rst, 'Host round trips'",
            ],
        )
    )
    checks += [Check(f"{name}: host round trips per steady step, W=2", v[1], "<=", 0.0) for name, v in trips.items()]
    return checks
