"""Soak: 10,000 steps of a loss metric's forward and of a CatMetric's update-only epochs.

Prints the resident memory and the number of live tensors at steps 1,000 and 10,000 (and in between). Flat
figures mean no step keeps anything alive: no autograd graph in the states, no growing cache. A shorter run of
the same loops is asserted in ``tests/unittests/test_soak.py``.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any, Callable

import torch
from _timing import Check, run_spawned, table

STEPS = 10_000
EVERY = 1_000


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _live_tensors() -> int:
    with warnings.catch_warnings():  # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def _loss_step_factory(world: int) -> tuple[Any, Callable[[int], None]]:
    from torchmetrics_diff.losses import CLIPLoss

    model = torch.nn.Linear(16, 8)
    loss = CLIPLoss()
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(32, 16, generator=gen)

    def step(i: int) -> None:
        img = model(data)
        value = loss(img, img.flip(0), torch.tensor(5.0))
        value.backward()
        model.zero_grad(set_to_none=True)

    return loss, step


def _cat_step_factory(world: int) -> tuple[Any, Callable[[int], None]]:
    from torchmetrics_diff import CatMetric

    metric = CatMetric()
    x = torch.randn(64)

    def step(i: int) -> None:
        metric.update(x)
        if (i + 1) % EVERY == 0:  # an epoch: compute, then reset
            metric.compute()
            metric.reset()

    return metric, step


def soak(rank: int, world: int, kind: str, steps: int, every: int) -> list[tuple[int, float, int, bool]]:
    """Run ``steps`` steps; every ``every`` steps record (step, RSS MiB, live tensors, any state with grad_fn)."""
    torch.manual_seed(0)
    metric, step = {"loss": _loss_step_factory, "cat": _cat_step_factory}[kind](world)
    records = []
    for i in range(steps):
        step(i)
        if (i + 1) % every == 0:
            gc.collect()
            states = [v for s in metric.metric_state.values() for v in (s if isinstance(s, list) else [s])]
            records.append((i + 1, _rss_mib(), _live_tensors(), any(t.grad_fn is not None for t in states)))
    return records


def main(args: Any) -> list[Check]:
    steps = 2_000 if getattr(args, "quick", False) else STEPS
    checks = []
    for kind, title in (("loss", "CLIPLoss.forward + backward, W=2"), ("cat", "CatMetric.update, reset every 1,000")):
        records = run_spawned(soak, 2 if kind == "loss" else 1, kind, steps, EVERY)
        rows = [[s, f"{rss:.1f}", live, "yes" if graph else "no"] for s, rss, live, graph in records]
        print(table(f"Soak: {title}", ["step", "RSS MiB", "live tensors", "graph in states"], rows))
        first, last = records[0], records[-1]
        checks.append(Check(f"soak {kind}: RSS at step {last[0]} / step {first[0]}", last[1] / first[1], "<=", 1.05))
        checks.append(
            Check(f"soak {kind}: live tensors at step {last[0]} - step {first[0]}", last[2] - first[2], "<=", 0, "")
        )
    return checks
