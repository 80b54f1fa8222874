"""A classification collection with wrappers, tracked over epochs: sync + compute, ours vs torchmetrics, W=2 gloo.

The tracked collection (10 classes, every metric with ``compute_with_cache=False`` so that each call syncs):
micro accuracy, macro F1, per-class accuracy through ``ClasswiseWrapper``, and the bounds of macro F1 through
``MinMaxMetric``, in a ``MetricTracker`` that has run three epochs (each rank updates each epoch once with 512
rows, rank 1: 300).

* ours: ``tracker.compute()`` syncs the latest epoch's four inner metrics in one collective, ``compute_all()``
  the twelve of the three epochs in one as well;
* torchmetrics: each inner metric syncs on its own, each state with its own gathers (compute groups off: with
  them its collection would put the classwise wrapper in a group and report its first value);
* floor: one ``all_reduce`` of the latest epoch's counts (4 × 10 stat scores × 4 metrics, int64).

A second table times ``update`` (one batch, no sync) of the same trackers.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from _timing import Budget, Check, median, ms, paired_ratio, run_spawned, table, time_dist_rounds, torchmetrics_or_none

import torchmetrics_diff as tmd
import torchmetrics_diff.wrappers as tmw

CLASSES = 10
ROWS = (512, 300)
EPOCHS = 3
RUNS = 3  # independent W=2 runs pooled (fresh processes), as bench_classification does


def _ours() -> Any:
    kw = {"task": "multiclass", "num_classes": CLASSES, "compute_with_cache": False}
    members = {
        "acc": tmd.Accuracy(**kw),
        "f1": tmd.F1Score(average="macro", **kw),
        "per_class": tmw.ClasswiseWrapper(tmd.Accuracy(average=None, **kw)),
        "f1_bounds": tmw.MinMaxMetric(tmd.F1Score(average="macro", **kw)),
    }
    return tmw.MetricTracker(tmd.MetricCollection(members), maximize=[True] * len(members))


def _theirs(tm: Any) -> Any:
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
    from torchmetrics.wrappers import ClasswiseWrapper, MetricTracker, MinMaxMetric

    kw = {"num_classes": CLASSES, "compute_with_cache": False}
    members = {
        "acc": MulticlassAccuracy(average="micro", **kw),
        "f1": MulticlassF1Score(average="macro", **kw),
        "per_class": ClasswiseWrapper(MulticlassAccuracy(average=None, **kw)),
        "f1_bounds": MinMaxMetric(MulticlassF1Score(average="macro", **kw)),
    }
    return MetricTracker(tm.MetricCollection(members, compute_groups=False), maximize=[True] * len(members))


def _batch(rank: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * epoch + rank)
    n = ROWS[rank % len(ROWS)]
    return torch.randn(n, CLASSES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal values; the classwise keys differ by the inner class's name (``accuracy_3``, ``multiclassaccuracy_3``)."""
    rename = {k: k.replace("multiclassaccuracy_", "accuracy_") for k in want}
    assert sorted(got) == sorted(rename.values()), (sorted(got), sorted(want))
    for key, value in want.items():
        torch.testing.assert_close(got[rename[key]].to(value.dtype), value, atol=1e-6, rtol=1e-6)


def _worker(rank: int, world: int, budget: Budget) -> dict:
    tm = torchmetrics_or_none()
    trackers: dict[str, Any] = {"ours": _ours()}
    if tm is not None:
        trackers["torchmetrics"] = _theirs(tm)
    for epoch in range(EPOCHS):
        preds, target = _batch(rank, epoch)
        for tracker in trackers.values():
            tracker.increment()
            tracker.update(preds, target)
    if tm is not None:  # same numbers before timing anything
        _same(trackers["ours"].compute(), trackers["torchmetrics"].compute())
        every = trackers["ours"].compute_all(), trackers["torchmetrics"].compute_all()
        _same({k: v[-1] for k, v in every[0].items()}, {k: v[-1] for k, v in every[1].items()})
    counts = torch.zeros(4 * CLASSES * 4, dtype=torch.int64)

    def floor() -> None:
        dist.all_reduce(counts.clone())

    computes: dict[str, Callable[[], Any]] = {name: t.compute for name, t in trackers.items()}
    computes["floor"] = floor
    alls: dict[str, Callable[[], Any]] = {name: t.compute_all for name, t in trackers.items()}
    preds, target = _batch(rank, EPOCHS)
    updates = {name: (lambda t=t: t.update(preds, target)) for name, t in trackers.items()}
    return {
        "compute": time_dist_rounds(computes, budget),
        "compute_all": time_dist_rounds(alls, budget),
        "update": time_dist_rounds(updates, budget),
    }


def _pool(runs: list[dict], part: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for res in runs:
        for name, rounds in res[part].items():
            out.setdefault(name, []).extend(rounds)
    return out


def _fx(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def main(args: Any) -> list[Check]:
    budget = Budget.from_args(args)
    runs = 1 if getattr(args, "quick", False) else RUNS
    results = [run_spawned(_worker, 2, budget) for _ in range(runs)]
    compute, every, update = (_pool(results, part) for part in ("compute", "compute_all", "update"))
    speedup = paired_ratio(compute.get("torchmetrics"), compute.get("ours"))
    speedup_all = paired_ratio(every.get("torchmetrics"), every.get("ours"))
    over_floor = paired_ratio(compute.get("ours"), compute.get("floor"))
    names = ("ours", "torchmetrics", "floor")
    rows = [
        [
            name,
            ms(median(compute[name])) if name in compute else "n/a",
            ms(median(every[name])) if name in every else "n/a",
        ]
        for name in names
    ]
    print(
        table(
            f"MetricTracker of a collection with ClasswiseWrapper and MinMaxMetric ({CLASSES} classes, {EPOCHS} "
            "epochs), W=2: sync + compute, ms",
            ["implementation", "compute() ms", f"compute_all() ms ({EPOCHS} epochs)"],
            rows,
            [
                f"torchmetrics / ours, compute(): {_fx(speedup)}; compute_all(): {_fx(speedup_all)} "
                f"(median of paired rounds, {runs} runs pooled)",
                f"ours / floor (one all_reduce of the latest epoch's counts): {_fx(over_floor)}",
            ],
        )
    )
    print(
        table(
            f"the same trackers, W=2: update() with {ROWS[0]} rows, no sync, ms",
            ["implementation", "ms / call"],
            [[name, ms(median(r))] for name, r in update.items()],
        )
    )
    return [
        Check("W=2, tracked collection with wrappers: compute() torchmetrics/ours", speedup, ">=", 5),
        Check(
            f"W=2, tracked collection with wrappers: compute_all() ({EPOCHS} epochs) torchmetrics/ours",
            speedup_all,
            ">=",
            10,
        ),
    ]
