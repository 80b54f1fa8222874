"""Metric hot paths at W = 1 on the current tree beside a baseline revision, with plain torch as the reference.

Usage (the baseline is a git revision, read from the environment; default ``d2c2c41``)::

    python benchmarks/run_all.py --only forward [--quick]
    BENCH_BASELINE=<rev> python benchmarks/run_all.py --only forward

Cases, on ``x = torch.randn(64)`` with no process group: ``MeanMetric`` and ``CatMetric`` called on ``x``
(``metric(x)``, i.e. ``forward`` through ``nn.Module.__call__``), each one's ``update(x)`` followed by
``compute()`` as one call, plain torch ``acc += x.sum(); n += x.numel()``, and plain torch's forward (the same
with tensor accumulators, returning ``x.mean()``: bench_sync's reference, against which ``MeanMetric.forward``
must cost at most 2.5x in the fastest blocks, the figure of a quiet machine).

How: the baseline revision is checked out with ``git worktree add --detach`` into a temporary folder (removed
at the end). Every round starts one fresh ``python -c`` subprocess per tree, with ``PYTHONPATH`` and the working
folder set to that tree (the subprocess asserts that ``torchmetrics_diff`` comes from it), one torch thread, and
the two trees' subprocesses in alternating order. A subprocess warms every case up, then times blocks of
``CALLS`` calls of each case (cases interleaved, ``time.perf_counter`` per block, garbage collector off during a
block). Every metric is reset, untimed, before each of its blocks; ``CatMetric`` ``update`` + ``compute`` also
every ``CAT_SEGMENT`` calls inside its block (the block is then timed in segments, resets excluded), because
``compute`` concatenates the whole list and would otherwise time a ``torch.cat`` of up to ``CALLS`` batches.
The table shows each tree's fastest block over all rounds (the least disturbed by the other work on the shared
machine); the ``current`` tree is the working tree, uncommitted changes included.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from _baseline import DEFAULT_BASELINE, REPO, assert_imported_from, baseline_worktree, package_dirty, run_in_tree
from _baseline import git as _git
from _timing import Check, fx, ratio, table, us

CALLS = 2000  # calls per timed block
WARMUP = 200  # untimed calls of each case before its first block
CAT_SEGMENT = 10  # CatMetric update+compute: untimed reset every this many calls (its list holds <= 10 batches)
PLAIN = "plain torch"
PLAIN_FORWARD = "plain torch forward"  # the same, returning the batch mean: what MeanMetric.forward does by hand
CASES = (
    "MeanMetric.forward",
    "CatMetric.forward",
    "MeanMetric update+compute",
    "CatMetric update+compute",
    PLAIN,
    PLAIN_FORWARD,
)
FORWARD_OVER_PLAIN = 2.5  # MeanMetric.forward / plain torch forward, fastest blocks (a quiet machine's figure)
TARGETS = {  # current / baseline, fastest blocks
    "MeanMetric.forward": 0.6,
    "CatMetric.forward": 1.05,
    "MeanMetric update+compute": 1.05,
    "CatMetric update+compute": 1.05,
}

# Runs in a fresh interpreter: ``python -c WORKER '{"tree": ..., "calls": ..., "warmup": ..., "blocks": ...,
# "cat_segment": ...}'``;
# prints one JSON line: the package file and, per case, the seconds per call of each block.
WORKER = r"""
import gc, json, sys, time
from pathlib import Path

cfg = json.loads(sys.argv[1])
import torch

torch.set_num_threads(1)
import torchmetrics_diff
from torchmetrics_diff import CatMetric, MeanMetric

tree = Path(cfg["tree"]).resolve()
origin = Path(torchmetrics_diff.__file__).resolve()
assert tree in origin.parents, f"torchmetrics_diff imported from {origin}, not from {tree}"

x = torch.randn(64, generator=torch.Generator().manual_seed(0))
mean_fwd, cat_fwd, mean_upd, cat_upd = MeanMetric(), CatMetric(), MeanMetric(), CatMetric()
acc = torch.zeros(())
n = 0


def plain():
    global acc, n
    acc += x.sum()
    n += x.numel()


total, count = torch.zeros(()), torch.zeros(())


def plain_forward():  # (bench_sync's plain forward: tensor accumulators, as a metric's states are)
    total.add_(x.sum())
    count.add_(x.numel())
    return x.mean()


def plain_reset():
    global acc, n
    acc = torch.zeros(())
    n = 0


def mean_update_compute():
    mean_upd.update(x)
    return mean_upd.compute()


def cat_update_compute():
    cat_upd.update(x)
    return cat_upd.compute()


calls = cfg["calls"]
cases = {  # name: (one call, untimed reset, calls between resets)
    "MeanMetric.forward": (lambda: mean_fwd(x), mean_fwd.reset, calls),
    "CatMetric.forward": (lambda: cat_fwd(x), cat_fwd.reset, calls),
    "MeanMetric update+compute": (mean_update_compute, mean_upd.reset, calls),
    "CatMetric update+compute": (cat_update_compute, cat_upd.reset, cfg["cat_segment"]),
    "plain torch": (plain, plain_reset, calls),
    "plain torch forward": (plain_forward, plain_reset, calls),
}
assert torch.allclose(mean_fwd(x), x.mean()) and torch.equal(cat_fwd(x), x)  # the paths compute what they should
for fn, reset, every in cases.values():
    for i in range(cfg["warmup"]):
        if i % every == 0:
            reset()
        fn()
times = {name: [] for name in cases}
for _ in range(cfg["blocks"]):
    for name, (fn, reset, every) in cases.items():
        segments = max(1, calls // every)
        elapsed = 0.0
        gc.collect()
        gc.disable()
        for _ in range(segments):
            reset()
            t0 = time.perf_counter()
            for _ in range(every):
                fn()
            elapsed += time.perf_counter() - t0
        gc.enable()
        times[name].append(elapsed / (segments * every))
print(json.dumps({"file": str(origin), "times": times}))
"""


def _run_tree(tree: Path, calls: int, blocks: int) -> dict[str, Any]:
    """One fresh subprocess timing every case on ``tree``; its JSON result."""
    cfg = json.dumps(
        {"tree": str(tree), "calls": calls, "warmup": WARMUP, "blocks": blocks, "cat_segment": CAT_SEGMENT}
    )
    proc = run_in_tree(tree, ["-c", WORKER, cfg])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert_imported_from(tree, result["file"])
    return result


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    try:
        load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        load = "n/a"
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, load average {load}"


def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    rounds, blocks = (5, 2) if quick else (9, 3)
    rev = os.environ.get("BENCH_BASELINE", DEFAULT_BASELINE)
    base_hash = _git("rev-parse", "--short", f"{rev}^{{commit}}")
    head_hash = _git("rev-parse", "--short", "HEAD")
    dirty = package_dirty()
    best: dict[str, dict[str, float]] = {"baseline": {}, "current": {}}
    files: dict[str, str] = {}
    with baseline_worktree(base_hash, prefix="bench_forward_") as (_, base_tree):
        trees = {"baseline": base_tree, "current": REPO}
        for i in range(rounds):
            order = ("baseline", "current") if i % 2 == 0 else ("current", "baseline")
            for side in order:
                result = _run_tree(trees[side], CALLS, blocks)
                files[side] = result["file"]
                for name, times in result["times"].items():
                    best[side][name] = min(best[side].get(name, float("inf")), *times)

    base, cur = best["baseline"], best["current"]
    rows = [
        [
            name,
            us(base[name]),
            us(cur[name]),
            fx(ratio(cur[name], base[name])),
            fx(ratio(base[name], base[PLAIN])),
            fx(ratio(cur[name], cur[PLAIN])),
        ]
        for name in CASES
    ]
    current = f"{head_hash} (HEAD{' + uncommitted changes to torchmetrics_diff/' if dirty else ''})"
    notes = [
        f"machine: {_machine()}",
        f"baseline {base_hash} (BENCH_BASELINE={rev}), current {current}",
        f"imported from: baseline {files['baseline']}, current {files['current']}",
        f"{rounds} rounds, each one fresh subprocess per tree (alternating order, torch.set_num_threads(1)); "
        f"per subprocess {WARMUP} warm-up calls per case, then {blocks} blocks of {CALLS} calls per case, "
        "cases interleaved, GC off in a block",
        f"shown: each tree's fastest block of {rounds * blocks} (µs per call); every metric is reset, untimed, "
        f"before each block, CatMetric update+compute also every {CAT_SEGMENT} calls (its list holds <= "
        f"{CAT_SEGMENT} batches; CatMetric.forward's <= {CALLS})",
        "x = torch.randn(64), no process group (W = 1); forward is metric(x); plain torch: acc += x.sum(); "
        "n += x.numel(); plain torch forward: total.add_(x.sum()); count.add_(x.numel()); return x.mean() (tensor "
        "accumulators, as in bench_sync)",
        "MeanMetric.forward / plain torch forward: "
        f"baseline {fx(ratio(base['MeanMetric.forward'], base[PLAIN_FORWARD]))}, "
        f"current {fx(ratio(cur['MeanMetric.forward'], cur[PLAIN_FORWARD]))}",
    ]
    headers = ["case", "baseline µs", "current µs", "current / baseline", "baseline / torch", "current / torch"]
    print(table("Metric hot paths: current vs baseline, W = 1", headers, rows, notes))
    checks = [
        Check(f"{name}: current / baseline", ratio(cur[name], base[name]), "<=", t) for name, t in TARGETS.items()
    ]
    forward = ratio(cur["MeanMetric.forward"], cur[PLAIN_FORWARD])
    return [*checks, Check("MeanMetric.forward: current / plain torch forward", forward, "<=", FORWARD_OVER_PLAIN)]
