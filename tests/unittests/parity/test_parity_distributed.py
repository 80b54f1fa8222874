"""The parity gaps that only show with peers: W = 2 and 3 gloo ranks, uneven and empty rows.

- ``forward``/``update`` while synced raise ``TorchMetricsUserError`` (the batch would be lost at ``unsync``);
- ``distributed_available_fn`` decides whether a sync happens, on step and on compute;
- a callable reduction of a list state (``dist_reduce_fx=torch.cat``) gets every rank's rows, one tensor per
  rank, in rank order — through the engine and through a custom ``dist_sync_fn`` — also inside a collection;
- a one-rank dtype/device mix among a loss's inputs raises on every rank (no hang);
- a shape-(1,) ``logit_scale`` gets the gradient of the 0-d one, and Lightning's ``_forward_cache`` holds the
  global value.

Expected values are written from the global data with plain torch (``torch.cat`` of the rows in rank order,
cross-entropy of the full logits).

Package modules covered: ``metric``, ``losses`` and the sync engine ``distributed._sync`` at W = 2 and 3.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests._helpers.harness import run_distributed
from tests._helpers.seeds import bounds, rand
from torchmetrics_diff import Metric, MetricCollection, SumMetric
from torchmetrics_diff.distributed import gather_all_tensors
from torchmetrics_diff.losses import CLIPLoss
from torchmetrics_diff.metric import TorchMetricsUserError

pytestmark = pytest.mark.timeout(120)
F64 = torch.float64


class Gathered(Metric):
    """A list state reduced by ``torch.cat`` (a callable) and a sum state."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("rows", [], dist_reduce_fx=torch.cat)
        self.add_state("count", torch.tensor(0.0, dtype=F64), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self.rows.append(x)
        self.count = self.count + x.shape[0]

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat(self.rows) if self.rows else torch.zeros(0, 2, dtype=F64)), self.count


def _rows(sizes: list[int], rank: int) -> torch.Tensor:
    lo, hi = bounds(sizes, rank)
    return rand((sum(sizes), 2), "gathered", *sizes)[lo:hi]


def _body(rank: int, world: int, sizes: list[int]) -> list[str]:
    problems: list[str] = []
    everything = rand((sum(sizes), 2), "gathered", *sizes)
    mine = _rows(sizes, rank)

    # 1. forward / update while synced
    m = SumMetric()
    m.update(torch.tensor(float(rank + 1)))
    m.sync()
    for name, call in (("forward", lambda: m(torch.tensor(1.0))), ("update", lambda: m.update(torch.tensor(1.0)))):
        try:
            call()
            problems.append(f"{name} while synced did not raise")
        except TorchMetricsUserError as err:
            if "unsync()" not in str(err):
                problems.append(f"{name} while synced: unclear message {err}")
    if m.sum_value.item() != sum(range(1, world + 1)):
        problems.append("the synced value changed")
    m.unsync()
    if m.sum_value.item() != rank + 1:
        problems.append(f"unsync restored {m.sum_value.item()} instead of {rank + 1}")

    # 2. distributed_available_fn
    local_only = SumMetric(distributed_available_fn=lambda: False, dist_sync_on_step=True)
    if local_only(torch.tensor(float(rank + 1))).item() != rank + 1 or local_only.compute().item() != rank + 1:
        problems.append("distributed_available_fn=False still synced")
    synced = SumMetric(distributed_available_fn=lambda: True, dist_sync_on_step=True)
    if synced(torch.tensor(float(rank + 1))).item() != sum(range(1, world + 1)):
        problems.append("distributed_available_fn=True did not sync on step")

    # 3. callable reduction of a list state: the engine, a custom dist_sync_fn, a collection
    for label, make in (
        ("engine", lambda: Gathered()),
        (
            "dist_sync_fn",
            lambda: Gathered(dist_sync_fn=lambda t, group=None: gather_all_tensors(t, group, grad="none")),
        ),
    ):
        g = make()
        if mine.shape[0] or label == "dist_sync_fn":  # a custom gather cannot know an empty list's row shape
            g.update(mine[:1])
            g.update(mine[1:])
        rows, count = g.compute()
        if not torch.equal(rows, everything) or count.item() != sum(sizes):
            problems.append(f"{label}: callable list reduction gave {rows.tolist()} (count {count.item()})")
    coll = MetricCollection({"g": Gathered(), "s": SumMetric()})
    coll.update(mine) if mine.shape[0] else coll["s"].update(torch.tensor(0.0))
    out = coll.compute()
    if not torch.equal(out["g"][0], everything):
        problems.append("collection: callable list reduction wrong")
    step = Gathered(dist_sync_on_step=True)
    rows, _ = step(mine)
    if not torch.equal(rows, everything):
        problems.append("forward with dist_sync_on_step: callable list reduction wrong")

    # 4. a dtype mix on the last rank raises on every rank
    odd = rank == world - 1
    img = F.normalize(rand((3, 4), "img", rank), dim=1).float()
    txt = img.to(torch.bfloat16) if odd else img
    try:
        CLIPLoss()(img, txt, 2.0)
        problems.append("a dtype mix on the last rank did not raise here")
    except ValueError as err:
        if not odd or "`text_embeds`" not in str(err):
            problems.append(f"unexpected ValueError here: {err}")
    except RuntimeError as err:
        if odd or f"rank {world - 1}" not in str(err):
            problems.append(f"the peers' error does not name rank {world - 1}: {err}")
    # the ranks are still in step afterwards
    if SumMetric(dist_sync_on_step=True)(torch.tensor(1.0)).item() != world:
        problems.append("ranks out of step after the failed call")
    return problems


@pytest.mark.parametrize(("world", "sizes"), [(2, [3, 2]), (3, [2, 0, 3])], ids=["W2 3/2", "W3 empty rank"])
def test_parity_with_peers(world: int, sizes: list[int]) -> None:
    results = run_distributed(_body, world, sizes, timeout=90)
    problems = [f"rank {r}: {p}" for r, found in enumerate(results) for p in found]
    assert not problems, "\n".join(problems)


def _scale_body(rank: int, world: int, sizes: list[int]) -> dict[str, Any]:
    """A shape-(1,) and a 0-d logit_scale under W ranks; returns the grads (summed over ranks by the test)."""
    n = sum(sizes)
    lo, hi = bounds(sizes, rank)
    img_all = F.normalize(rand((n, 4), "scale-img"), dim=1)
    txt_all = F.normalize(rand((n, 4), "scale-txt"), dim=1)
    out: dict[str, Any] = {}
    for label, shape in (("flat", (1,)), ("scalar", ())):
        scale = torch.full(shape, 2.5, dtype=F64, requires_grad=True)
        img = img_all[lo:hi].clone().requires_grad_(True)
        loss_fn = CLIPLoss(grad_reduction="sum")
        loss = loss_fn(img, txt_all[lo:hi], scale)
        loss.backward()
        out[label] = {"loss": loss.item(), "scale_grad": scale.grad.clone(), "cache": loss_fn._forward_cache.item()}
    return out


def test_logit_scale_of_shape_one_under_ranks() -> None:
    """Summed over ranks (``grad_reduction="sum"``) the scale gradient is the one-process one, shape (1,)."""
    sizes = [3, 2]
    results = run_distributed(_scale_body, 2, sizes, timeout=60)
    n = sum(sizes)
    img = F.normalize(rand((n, 4), "scale-img"), dim=1)
    txt = F.normalize(rand((n, 4), "scale-txt"), dim=1)
    scale = torch.tensor(2.5, dtype=F64, requires_grad=True)
    logits = scale * img @ txt.T
    target = torch.arange(n)
    ref = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    ref.backward()
    flat_grad = sum(r["flat"]["scale_grad"] for r in results)
    assert flat_grad.shape == (1,)
    assert abs(flat_grad.item() - scale.grad.item()) < 1e-12
    for r in results:
        for label in ("flat", "scalar"):
            assert abs(r[label]["loss"] - ref.item()) < 1e-12
            assert r[label]["cache"] == r[label]["loss"]  # Lightning's step value: the global loss
