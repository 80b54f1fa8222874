"""``strategy="auto"`` against the fastest fixed strategy, per loss family, rows per rank and width (W = 2).

Real gloo processes (two ranks, one thread each), float32, unit-norm rows, every rank the same number of rows.
Families: ``CLIPLoss``, ``SigLIPLoss`` and ``SupConLoss`` (one view, ``(B, D)`` features, labels of 16 classes);
rows per rank 64 / 256 / 1024 / 4096 and widths 64 / 128 / 256 / 512. In each cell the forward + backward step of
``"replicated"``, ``"auto"``, ``"sharded"`` and ``"ring"`` (default tile) run in interleaved blocks, round by
round, the order rotating from one round to the next (a load spike hits them alike); a cell prints rank 0's median
per strategy, the fastest fixed strategy, ``"auto"``'s pick (``last_strategy``) and the median over rounds of
``"auto"``'s time over the fastest fixed strategy's in the same round. The big cells take fewer rounds (a 4096-row
step takes seconds): the grid takes 6 to 8 minutes on 2 cores, ``--quick`` under one.

Checks: ``"auto"`` within :data:`AUTO_CELL` of the fastest fixed strategy in every cell, and the median of those
ratios over the cells within :data:`AUTO_MEDIAN`. This is the grid behind ``"auto"``'s rule in
``docs/guide/strategies.rst`` (``auto_strategy`` and its ``AUTO_*`` constants in
``torchmetrics_diff/_global/strategy.py``). ``--quick`` (``run_all.py --quick``) runs a few cells of it, a rough
look. ``--rows``, ``--widths``, ``--families``, ``--strategies`` and ``--world`` time other cells (the finer grids the
constants were fitted on); ``--json`` keeps every round. Timings mean something only on a quiet machine: the load
average is printed before and after, and ``--wait-load 1.5`` first waits (up to 20 minutes) for the 1-minute load
average to fall below 1.5.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from _timing import Check, fx, median, ms, paired_ratio, run_spawned, table

FAMILIES = ("CLIPLoss", "SigLIPLoss", "SupConLoss")
ROWS = (64, 256, 1024, 4096)
WIDTHS = (64, 128, 256, 512)
#: ``--quick``: per family, the cells around the crossovers (rows per rank, width)
QUICK_CELLS = ((256, 64), (256, 512), (1024, 64), (4096, 64))
FIXED = ("replicated", "sharded", "ring")
#: the order of the blocks in the first round (each round starts one further on)
ORDER = ("replicated", "auto", "sharded", "ring")
WORLD = 2
CLASSES = 16  # SupCon's labels
#: auto's step over the fastest fixed strategy's: at most this in every cell, and at most AUTO_MEDIAN in the median
AUTO_CELL = 1.15
AUTO_MEDIAN = 1.05


def _rounds(rows: int, quick: bool) -> tuple[int, int, float]:
    """(warm-up calls, rounds, seconds per block) of a cell: fewer rounds where a step takes seconds, many where
    it takes milliseconds (their rounds move by tens of percent on a shared 2-core machine)."""
    if rows >= 4096:
        return 1, (2 if quick else 3), 0.0
    if rows >= 1024:
        return 2, (4 if quick else 7), 0.0
    return 3, (11 if quick else 25), 0.05


def _load() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _cell(
    family: str, rank: int, rows: int, width: int, order: tuple[str, ...]
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """One forward + backward step of ``family`` per strategy of ``order``, on this rank's rows; and the losses."""
    from torchmetrics_diff import losses

    gen = torch.Generator().manual_seed(1000 + 7 * rank + rows + width)

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, generator=gen), dim=-1).requires_grad_()

    cls = getattr(losses, family)
    steps: dict[str, Callable[[], Any]] = {}
    losses_by_strategy = {s: cls(strategy=s) for s in order}
    for s, loss in losses_by_strategy.items():
        if family == "CLIPLoss":
            a, b = unit(rows, width), unit(rows, width)
            steps[s] = lambda loss=loss, a=a, b=b: loss(a, b, 10.0).backward()
        elif family == "SigLIPLoss":
            a, b = unit(rows, width), unit(rows, width)
            steps[s] = lambda loss=loss, a=a, b=b: loss(a, b, 10.0, -10.0).backward()
        else:
            f, y = unit(rows, width), torch.randint(0, CLASSES, (rows,), generator=gen)
            steps[s] = lambda loss=loss, f=f, y=y: loss(f, y).backward()
    return steps, losses_by_strategy


def _time_cell(steps: dict[str, Callable[[], Any]], warmup: int, rounds: int, block_s: float) -> dict[str, list]:
    """Per-call seconds of every strategy in every round; every rank runs the same calls, a barrier before each
    block, none inside one; the calls per block are rank 0's choice, broadcast."""
    took = {}
    for name, fn in steps.items():
        for _ in range(warmup):
            t0 = time.perf_counter()
            fn()
            took[name] = time.perf_counter() - t0
    counts = torch.tensor([max(1, min(1000, int(block_s / max(took[n], 1e-6)))) for n in steps])
    together = dist.is_available() and dist.is_initialized()
    if together:
        dist.broadcast(counts, 0)
    calls = dict(zip(steps, counts.tolist()))
    out: dict[str, list] = {name: [] for name in steps}
    names = list(steps)
    gc.collect()
    gc.disable()
    try:
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # (each round starts one further on)
                if together:
                    dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls[name]):
                    steps[name]()
                out[name].append((time.perf_counter() - t0) / calls[name])
    finally:
        gc.enable()
    return out


def _worker(rank: int, world: int, cells: list[tuple[str, int, int]], quick: bool, order: tuple[str, ...]) -> dict:
    torch.set_num_threads(1)
    res: dict[str, Any] = {}
    for family, rows, width in cells:
        steps, losses = _cell(family, rank, rows, width, order)
        times = _time_cell(steps, *_rounds(rows, quick))
        auto = losses.get("auto")
        res[f"{family}|{rows}|{width}"] = {"times": times, "picked": None if auto is None else auto.last_strategy}
        del steps, losses
        gc.collect()
    return res


def grid(
    quick: bool, families: tuple[str, ...] = FAMILIES, rows: Any = None, widths: Any = None
) -> list[tuple[str, int, int]]:
    """The cells ``(family, rows per rank, width)`` to time: the grid, ``--quick``'s cells, or the ones asked."""
    if quick and not rows and not widths:
        return [(f, r, w) for f in families for r, w in QUICK_CELLS]
    return [(f, r, w) for f in families for r in rows or ROWS for w in widths or WIDTHS]


def _wait_for_load(limit: float, patience_s: float = 1200.0, poll_s: float = 30.0) -> None:
    """Wait until the 1-minute load average is below ``limit`` (at most ``patience_s``)."""
    start = time.perf_counter()
    while os.getloadavg()[0] >= limit and time.perf_counter() - start < patience_s:
        time.sleep(poll_s)
    print(f"waited {time.perf_counter() - start:.0f} s for a 1-minute load average below {limit:g}")


def main(args: Any) -> list[Check]:
    quick = bool(getattr(args, "quick", False))
    cells = grid(
        quick,
        tuple(getattr(args, "families", None) or FAMILIES),
        getattr(args, "rows", None),
        getattr(args, "widths", None),
    )
    wanted = getattr(args, "strategies", None) or ORDER
    order = tuple(s for s in ORDER if s in wanted)
    fixed = tuple(s for s in FIXED if s in order)
    auto = "auto" in order
    if getattr(args, "wait_load", None):
        _wait_for_load(args.wait_load)
    print(f"load average before: {_load()}")
    t0 = time.perf_counter()
    world = int(getattr(args, "world", None) or WORLD)
    res = run_spawned(_worker, world, cells, quick, order, timeout=1800.0)
    print(f"load average after: {_load()} ({time.perf_counter() - t0:.0f} s)\n")
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(res, f)
    checks, ratios, hits = [], [], 0
    for family in dict.fromkeys(c[0] for c in cells):
        lines = []
        for _, rows, width in (c for c in cells if c[0] == family):
            cell = res[f"{family}|{rows}|{width}"]
            times = cell["times"]
            medians = {s: median(times[s]) for s in fixed}
            best = min(medians, key=medians.__getitem__)
            line = [rows, width, *(ms(medians[s]) for s in fixed), best]
            if auto:
                got = paired_ratio(times["auto"], times[best])
                ratios.append(got)
                line += [ms(median(times["auto"])), cell["picked"] or "?", fx(got)]
                hits += cell["picked"] == best
                name = f"auto W={world} {family}, {rows} rows/rank, width {width}: auto / fastest"
                checks.append(Check(name, got, "<=", AUTO_CELL))
            lines.append(line)
        headers = ["rows/rank", "width", *(f"{s} ms" for s in fixed), "fastest"]
        if auto:
            headers += ["auto ms", "auto picked", "auto/fastest"]
        print(
            table(
                f"{family} forward + backward per step by strategy, W={world} on gloo (float32)",
                headers,
                lines,
                [
                    "ms: rank 0's median step time over interleaved rounds; ring at its default tile",
                    "auto/fastest: the median over rounds of auto's time over the fastest fixed strategy's",
                ],
            )
        )
    if auto:
        known = [r for r in ratios if r is not None]
        overall = statistics.median(known) if known else None
        print(
            f"auto/fastest over the {len(known)} cells: median {fx(overall)}, worst {fx(max(known, default=None))}; "
            f"auto picked the fastest fixed strategy in {hits} of {len(ratios)}\n"
        )
        checks.append(
            Check(f"auto W={world} over {len(known)} cells: median auto / fastest", overall, "<=", AUTO_MEDIAN)
        )
    return checks


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cells, fewer rounds")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, help="only these loss families")
    parser.add_argument("--rows", nargs="+", type=int, help="rows per rank (default: the grid's)")
    parser.add_argument("--widths", nargs="+", type=int, help="widths (default: the grid's)")
    parser.add_argument("--strategies", nargs="+", choices=ORDER, help="only these strategies (a fit, no checks)")
    parser.add_argument("--world", type=int, help=f"ranks (default {WORLD}: the grid's)")
    parser.add_argument("--wait-load", type=float, help="first wait for a 1-minute load average below this")
    parser.add_argument("--json", help="also write the per-round times and picks to this file")
    for check in main(parser.parse_args()):
        print(check.line())
