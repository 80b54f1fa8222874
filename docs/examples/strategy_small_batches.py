"""CLIPLoss step time of both strategies at small global batches, W=2 on gloo (the latency-bound end).

``benchmarks/bench_losses.py`` times global batches of 256, 1024 and 4096; this script times the small end with
the same harness (``benchmarks/_timing.py``). Run from the repository root::

    .venv/bin/python docs/examples/strategy_small_batches.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

import torch  # noqa: E402
from _timing import Budget, run_spawned, time_dist  # noqa: E402

SIZES, DIM, WORLD = (8, 32, 128, 256), 128, 2


def _worker(rank: int, world: int, sizes: tuple[int, ...], dim: int, budget: Budget) -> dict:
    from torchmetrics_diff.losses import CLIPLoss

    out = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(rank)
        img = torch.randn(n // world, dim, generator=gen, requires_grad=True)
        txt = torch.randn(n // world, dim, generator=gen, requires_grad=True)
        losses = {s: CLIPLoss(strategy=s) for s in ("replicated", "sharded")}
        steps = {s: (lambda loss=loss, img=img, txt=txt: loss(img, txt, 10.0).backward()) for s, loss in losses.items()}
        out.update({(n, s): t for s, t in time_dist(steps, budget).items()})
    return out


def main() -> None:
    print("load average at start: " + " / ".join(f"{v:.1f}" for v in os.getloadavg()))
    times = run_spawned(_worker, WORLD, SIZES, DIM, Budget(repeats=15, block_s=0.1, warmup=5))
    print("| global batch | replicated ms | sharded ms | replicated/sharded |")
    for n in SIZES:
        rep, shard = times[(n, "replicated")], times[(n, "sharded")]
        print(f"| {n} | {rep * 1e3:.3f} | {shard * 1e3:.3f} | {rep / shard:.2f}x |")
    print("load average at the end: " + " / ".join(f"{v:.1f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
