"""torchmetrics metrics adapted with ``Synced``: a collection of ten synced by our engine vs torchmetrics' own.

The ten image and audio metrics of ``tests._helpers.adapter_cases.image_collection_members`` (SSIM twice, PSNR,
UQI, SAM, SCC, RMSE-SW, SI-SDR, SNR, SI-SNR: 21 sum and mean states), each rank updated once with its own
three-channel 16 x 16 images (rank r: 2 + r of them), every metric built with ``compute_with_cache=False`` so
that each ``compute()`` syncs:

* ours: ``torchmetrics_diff.MetricCollection`` of ``Synced`` metrics: ``compute()`` syncs all 21 states in one
  collective, then runs torchmetrics' own ``compute`` maths on them;
* torchmetrics: ``torchmetrics.MetricCollection`` of the same ten metrics (``compute_groups=False``: they are ten
  different metrics), each state synced by torchmetrics' own gathers;
* floor: one ``all_reduce`` of 21 floats.

At W=2 and W=3 (gloo, 127.0.0.1, spawned processes).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from _timing import Budget, Check, median, ms, paired_ratio, run_spawned, table, time_dist_rounds, torchmetrics_or_none

import torchmetrics_diff as tmd
from tests._helpers.adapter_cases import color_images, image_collection_members

RUNS = 3  # independent W=2 runs pooled (fresh processes), as bench_wrappers does


def _worker(rank: int, world: int, budget: Budget) -> dict:
    from torchmetrics_diff.wrappers import Synced

    warnings.filterwarnings("ignore", category=UserWarning)
    tm = torchmetrics_or_none()
    ours = tmd.MetricCollection({k: Synced(m, compute_with_cache=False) for k, m in image_collection_members().items()})
    preds, target = color_images(2 + rank, f"bench rank {rank}")
    ours.update(preds, target)
    computes: dict[str, Any] = {"ours": ours.compute}
    states = sum(len(m._defaults) for m in ours.values())
    if tm is not None:
        members = image_collection_members()
        for m in members.values():
            m.compute_with_cache = False
        theirs = tm.MetricCollection(members, compute_groups=False)
        theirs.update(preds, target)
        got, want = ours.compute(), theirs.compute()
        assert set(got) == set(want), (sorted(got), sorted(want))
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=key)
        computes["torchmetrics"] = theirs.compute
    floor = torch.zeros(states)
    computes["floor"] = lambda: dist.all_reduce(floor.clone())
    return {"rounds": time_dist_rounds(computes, budget), "states": states}


def _pool(runs: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for res in runs:
        for name, rounds in res["rounds"].items():
            out.setdefault(name, []).extend(rounds)
    return out


def _fx(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def main(args: Any) -> list[Check]:
    budget = Budget.from_args(args)
    checks = []
    for world in (2, 3):
        runs = 1 if getattr(args, "quick", False) or world == 3 else RUNS
        results = [run_spawned(_worker, world, budget) for _ in range(runs)]
        pooled = _pool(results)
        speedup = paired_ratio(pooled.get("torchmetrics"), pooled.get("ours"))
        over_floor = paired_ratio(pooled.get("ours"), pooled.get("floor"))
        print(
            table(
                f"MetricCollection of 10 adapted torchmetrics metrics ({results[0]['states']} states), W={world}: "
                "compute() with sync, ms",
                ["implementation", "compute() ms"],
                [[name, ms(median(rounds))] for name, rounds in pooled.items()],
                [
                    f"torchmetrics / ours: {_fx(speedup)}; ours / floor (one all_reduce of "
                    f"{results[0]['states']} floats): {_fx(over_floor)} (median of paired rounds, {runs} run(s))",
                ],
            )
        )
        checks.append(
            Check(f"W={world}, collection of 10 adapted metrics: compute() torchmetrics/ours", speedup, ">=", 10)
        )
    return checks
