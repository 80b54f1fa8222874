"""A MetricCollection of six classification metrics: sync + compute, ours vs torchmetrics, W=2 gloo.

The collection: micro and macro accuracy, macro precision, recall and F1, and the confusion matrix of a
10-class task, every member with ``compute_with_cache=False`` so that each ``compute()`` syncs (torchmetrics
would otherwise return its cached value). Each rank updates once with 512 rows (rank 1: 300) before timing.

* ours: the six metrics' ``int64`` count states travel in one collective (the engine's steady state). No
  ``compute_groups``: torchmetrics infers such groups by itself, ours takes them explicitly, but a follower's
  ``compute()`` currently re-syncs the leader's already synced states (found while writing this benchmark);
* torchmetrics: its ``MetricCollection`` (compute groups on, the default) syncs every member separately, each
  state with its own gathers;
* floor: one ``all_reduce`` of the same counts (4 × 10 stat scores × 5 metrics + the 10 × 10 matrix, int64),
  what any implementation must at least pay.

Two more rows time a collection of task classes (``MulticlassAccuracy`` top-1 and top-3, ``MulticlassF1Score``,
``MulticlassSpecificity``, ``MulticlassAUROC``: the exact AUROC's scores are ``cat`` states, so rows travel too)
against torchmetrics' classes of the same names.

A second table times ``update`` (one batch of 512 rows, no sync) for the same collections.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from _timing import Budget, Check, median, ms, paired_ratio, run_spawned, table, time_dist_rounds, torchmetrics_or_none

import torchmetrics_diff as tmd

CLASSES = 10
ROWS = (512, 300)
RUNS = 3  # independent W=2 runs pooled (fresh processes), as bench_sync does for its W=2 tables


def _members(lib: Any) -> dict[str, Any]:
    kw = {"task": "multiclass", "num_classes": CLASSES, "compute_with_cache": False}
    return {
        "acc": lib.Accuracy(**kw),
        "acc_macro": lib.Accuracy(average="macro", **kw),
        "precision": lib.Precision(average="macro", **kw),
        "recall": lib.Recall(average="macro", **kw),
        "f1": lib.F1Score(average="macro", **kw),
        "confmat": lib.ConfusionMatrix(**kw),
    }


def _task_members(lib: Any) -> dict[str, Any]:
    """Task classes with the options the generic six lack: top-k, specificity, the exact multiclass AUROC."""
    cls = lib.classification if hasattr(lib, "classification") else lib
    kw = {"num_classes": CLASSES, "compute_with_cache": False}
    return {
        "top1": cls.MulticlassAccuracy(average="micro", **kw),
        "top3": cls.MulticlassAccuracy(top_k=3, average="micro", **kw),
        "f1": cls.MulticlassF1Score(**kw),
        "specificity": cls.MulticlassSpecificity(**kw),
        "auroc": cls.MulticlassAUROC(**kw),
    }


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    n = ROWS[rank % len(ROWS)]
    return torch.randn(n, CLASSES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _worker(rank: int, world: int, budget: Budget) -> dict:
    tm = torchmetrics_or_none()
    preds, target = _batch(rank)
    ours = tmd.MetricCollection(_members(tmd))
    ours.update(preds, target)
    collections: dict[str, Any] = {"ours": ours}
    if tm is not None:
        theirs = tm.MetricCollection(_members(tm))
        theirs.update(preds, target)
        collections["torchmetrics"] = theirs
        got, want = ours.compute(), theirs.compute()
        for key, value in want.items():  # same numbers before timing anything
            torch.testing.assert_close(got[key].to(value.dtype), value, atol=1e-6, rtol=1e-6)
    tasks = tmd.MetricCollection(_task_members(tmd))
    tasks.update(preds, target)
    collections["ours, task classes"] = tasks
    if tm is not None:
        theirs_tasks = tm.MetricCollection(_task_members(tm))
        theirs_tasks.update(preds, target)
        collections["torchmetrics, task classes"] = theirs_tasks
        got, want = tasks.compute(), theirs_tasks.compute()
        for key, value in want.items():
            torch.testing.assert_close(got[key].to(value.dtype), value, atol=1e-6, rtol=1e-6)
    counts = torch.zeros(4 * CLASSES * 5 + CLASSES * CLASSES, dtype=torch.int64)

    def floor() -> None:
        dist.all_reduce(counts.clone())

    computes: dict[str, Callable[[], Any]] = {name: c.compute for name, c in collections.items()}
    computes["floor"] = floor
    sync_rounds = time_dist_rounds(computes, budget)
    updates = {name: (lambda c=c: c.update(preds, target)) for name, c in collections.items()}
    update_rounds = time_dist_rounds(updates, budget)
    return {"compute": sync_rounds, "update": update_rounds}


def _pool(runs: list[dict], part: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for res in runs:
        for name, rounds in res[part].items():
            out.setdefault(name, []).extend(rounds)
    return out


def main(args: Any) -> list[Check]:
    budget = Budget.from_args(args)
    runs = 1 if getattr(args, "quick", False) else RUNS
    results = [run_spawned(_worker, 2, budget) for _ in range(runs)]
    compute, update = _pool(results, "compute"), _pool(results, "update")
    speedup = paired_ratio(compute.get("torchmetrics"), compute.get("ours"))
    over_floor = paired_ratio(compute.get("ours"), compute.get("floor"))
    rows = [
        [name, ms(median(compute[name])) if name in compute else "n/a"]
        for name in ("ours", "torchmetrics", "floor", "ours, task classes", "torchmetrics, task classes")
    ]
    print(
        table(
            f"6 classification metrics in a MetricCollection ({CLASSES} classes), W=2: compute() incl. sync, ms",
            ["implementation", "ms / call"],
            rows,
            [
                f"torchmetrics / ours (median of paired rounds, {runs} runs pooled): "
                f"{'n/a' if speedup is None else f'{speedup:.1f}x'}",
                f"ours / floor (one all_reduce of the counts): {'n/a' if over_floor is None else f'{over_floor:.2f}x'}",
                "task classes: top-1 and top-3 accuracy, macro F1 and specificity, exact multiclass AUROC (its scores "
                "are cat states: the rows travel too)",
            ],
        )
    )
    print(
        table(
            f"the same collections, W=2: update() with {ROWS[0]} rows, no sync, ms",
            ["implementation", "ms / call"],
            [[name, ms(median(r))] for name, r in update.items()],
        )
    )
    return [Check("W=2, 6 classification metrics: sync+compute torchmetrics/ours", speedup, ">=", 10)]
