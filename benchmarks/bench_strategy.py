"""The strategy grid: ``CLIPLoss`` forward + backward per step for each strategy, over rows per rank x width x W.

Real gloo processes at W = 2 and 3, float32, rows per rank 8 / 32 / 128 / 256 / 512 and widths 64 / 512 (the
ranks hold the same number of rows). Each cell: rank 0's median step time of ``"replicated"``, ``"sharded"`` and
``"ring"`` (default tile), their blocks interleaved round by round so that a load spike hits them alike, and
the fastest of the three; then ``strategy="auto"`` (the default): its time, the strategy it picked
(``CLIPLoss.last_strategy``) and its time over the fastest fixed one, with the check that ``auto`` is never slower
than the best fixed strategy by more than the benchmark's noise (``AUTO_SLACK``).

It checks ``"auto"`` on small global batches, where the extra collectives of the sharded strategy cost more than
the rows it saves, at W = 2 and 3. The rule's constants (``AUTO_*`` in ``torchmetrics_diff/_global/strategy.py``)
are fitted to ``benchmarks/bench_auto.py``'s grids (three loss families, up to 8192 rows per rank, the ring's
speed included); both are in ``docs/guide/strategies.rst``.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from _timing import Budget, Check, fx, median, ms, paired_ratio, run_spawned, table, time_dist_rounds

FIXED = ("replicated", "sharded", "ring")
ROWS = (8, 32, 128, 256, 512)
WIDTHS = (64, 512)
WORLDS = (2, 3)
#: how much slower than the best fixed strategy auto may be in one cell (timing noise on a shared 2-core machine)
AUTO_SLACK = 1.25


def _auto_available() -> bool:
    from torchmetrics_diff.losses import CLIPLoss

    try:
        CLIPLoss(strategy="auto")
    except ValueError:
        return False
    return True


def _inputs(rank: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)
    img = torch.nn.functional.normalize(torch.randn(rows, width, generator=gen), dim=1).requires_grad_()
    txt = torch.nn.functional.normalize(torch.randn(rows, width, generator=gen), dim=1).requires_grad_()
    return img, txt


def _worker(rank: int, world: int, budget: Budget, strategies: tuple[str, ...]) -> dict:
    """Seconds per step of every strategy in every cell (rank 0's, per round), and ``auto``'s pick per cell."""
    from torchmetrics_diff.losses import CLIPLoss

    torch.set_num_threads(1)
    out: dict[Any, Any] = {}
    for width in WIDTHS:
        for rows in ROWS:
            img, txt = _inputs(rank, rows, width)
            losses = {s: CLIPLoss(strategy=s) for s in strategies}
            steps = {s: (lambda loss=loss, i=img, t=txt: loss(i, t, 10.0).backward()) for s, loss in losses.items()}
            timed = time_dist_rounds(steps, budget)
            out.update({(rows, width, s): t for s, t in timed.items()})
            if "auto" in losses:
                out[(rows, width, "picked")] = getattr(losses["auto"], "last_strategy", None)
    return out


def main(args: Any) -> list[Check]:
    budget = Budget.from_args(args)
    auto = _auto_available()
    # (timed in this order, round by round: auto between the two it picks from, away from the ring's heavy blocks)
    strategies = ("replicated", "auto", "sharded", "ring") if auto else FIXED
    checks = []
    for world in WORLDS:
        res = run_spawned(_worker, world, budget, strategies)
        lines = []
        for width in WIDTHS:
            for rows in ROWS:
                fixed = {s: median(res[(rows, width, s)]) for s in FIXED}
                best = min(fixed, key=fixed.__getitem__)
                line = [rows, rows * world, width, *(ms(fixed[s]) for s in FIXED), best]
                if auto:
                    # the median of the per-round ratios: the blocks of a round ran back to back, under one load
                    got = paired_ratio(res[(rows, width, "auto")], res[(rows, width, best)])
                    picked = res.get((rows, width, "picked")) or "?"
                    line += [ms(median(res[(rows, width, "auto")])), picked, fx(got)]
                    checks.append(
                        Check(
                            f"strategy grid W={world}, {rows} rows/rank, width {width}: auto / best fixed",
                            got,
                            "<=",
                            AUTO_SLACK,
                        )
                    )
                lines.append(line)
        headers = ["rows/rank", "global batch", "width", *(f"{s} ms" for s in FIXED), "fastest"]
        if auto:
            headers += ["auto ms", "auto picked", "auto/fastest"]
        print(
            table(
                f"CLIPLoss forward + backward per step by strategy, W={world} on gloo (float32)",
                headers,
                lines,
                [
                    "ms: rank 0's median step time over interleaved blocks; every rank holds the same number of "
                    "rows; ring at its default tile",
                    "auto/fastest: the median over rounds of auto's time over the fastest fixed strategy's in the "
                    "same round",
                ],
            )
        )
        shares = [median(res[(r, w, "sharded")]) / median(res[(r, w, "replicated")]) for r in ROWS for w in WIDTHS]
        print(f"(W={world}: sharded/replicated median over the grid {statistics.median(shares):.2f}x)\n")
    return checks


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a rough look, not a measurement)")
    for check in main(parser.parse_args()):
        print(check.line())
