"""Self-supervised regularizers at W = 2 on gloo: VICReg's step time, and DINO's center update.

VICReg, per training step of the loss (forward + backward on leaf embeddings of ``B`` rows per rank, float32):

* ``global``: :class:`~torchmetrics_diff.losses.VICRegLoss`, the statistics of every rank's rows from one
  all-reduce of ``D² + 3D + 2`` numbers (after the call header);
* ``per-rank``: the hand-rolled loss of the paper's Algorithm 1 on this rank's rows only, no communication (what
  most code computes; a different objective, see ``docs/losses/vicreg.rst``);
* ``gathered``: the reference implementation's way to the global objective: every rank all-gathers both views
  (an autograd function whose backward all-reduces the gathered gradients) and computes the whole loss.

The ratio lines compare ``global`` with the per-rank computation (the price of the global objective) and with
the gathered one (the same objective). DINO: :meth:`~torchmetrics_diff.losses.DINOCenter.update` against the
reference code's ``update_center`` (a bare ``all_reduce`` of the sums, divided by ``rows × world``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _timing import Budget, Check, fx, ms, paired_ratio, run_spawned, table, time_dist_rounds

WORLD = 2
#: (rows per rank, D)
CONFIGS = ((64, 128), (256, 256), (256, 1024))
QUICK_CONFIGS = ((64, 128), (256, 256))
DINO_DIMS = (4096, 65536)


def _per_rank_vicreg(za: torch.Tensor, zb: torch.Tensor) -> torch.Tensor:
    """The paper's Algorithm 1 on the rows given (the usual hand-rolled loss)."""
    n, d = za.shape
    sim = F.mse_loss(za, zb)
    std_a, std_b = torch.sqrt(za.var(dim=0) + 1e-4), torch.sqrt(zb.var(dim=0) + 1e-4)
    std = torch.mean(F.relu(1 - std_a)) + torch.mean(F.relu(1 - std_b))
    za, zb = za - za.mean(dim=0), zb - zb.mean(dim=0)
    cov_a, cov_b = za.T @ za / (n - 1), zb.T @ zb / (n - 1)
    off = ~torch.eye(d, dtype=torch.bool)
    cov = cov_a[off].pow(2).sum() / d + cov_b[off].pow(2).sum() / d
    return 25.0 * sim + 25.0 * std + cov


class _FullGather(torch.autograd.Function):
    """The reference implementation's gather: every rank's rows; backward all-reduces and keeps its own slot."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack(grads)
        dist.all_reduce(stacked)
        return stacked[dist.get_rank()]


def _gathered_vicreg(za: torch.Tensor, zb: torch.Tensor) -> torch.Tensor:
    both = torch.cat(_FullGather.apply(torch.cat([za, zb], dim=1)), dim=0)  # one gather for the two views
    return _per_rank_vicreg(*both.split(za.shape[1], dim=1))


def _vicreg_worker(rank: int, world: int, configs: tuple, budget: Budget) -> dict:
    from torchmetrics_diff.losses import VICRegLoss

    torch.set_num_threads(1)
    out = {}
    for rows, d in configs:
        gen = torch.Generator().manual_seed(rank)
        za = torch.randn(rows, d, generator=gen).requires_grad_()
        zb = (za.detach() + 0.1 * torch.randn(rows, d, generator=gen)).requires_grad_()
        loss = VICRegLoss()
        steps = {
            "global": lambda loss=loss, za=za, zb=zb: loss(za, zb).backward(),
            "per-rank": lambda za=za, zb=zb: _per_rank_vicreg(za, zb).backward(),
            "gathered": lambda za=za, zb=zb: _gathered_vicreg(za, zb).backward(),
        }
        out[(rows, d)] = time_dist_rounds(steps, budget)
    return out


def _dino_worker(rank: int, world: int, dims: tuple, rows: int, budget: Budget) -> dict:
    from torchmetrics_diff.losses import DINOCenter

    torch.set_num_threads(1)
    out = {}
    for d in dims:
        teacher = torch.randn(rows, d, generator=torch.Generator().manual_seed(rank))
        center = DINOCenter(d)
        reference = torch.zeros(1, d)

        def update_center(teacher: torch.Tensor = teacher) -> None:  # DINOLoss.update_center
            nonlocal reference
            batch_center = torch.sum(teacher, dim=0, keepdim=True)
            dist.all_reduce(batch_center)
            batch_center = batch_center / (len(teacher) * dist.get_world_size())
            reference = reference * 0.9 + batch_center * 0.1

        out[d] = time_dist_rounds(
            {"DINOCenter": lambda c=center, t=teacher: c.update(t), "reference": update_center}, budget
        )
    return out


def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    budget = Budget(repeats=5, block_s=0.05, warmup=2) if quick else Budget(repeats=9, block_s=0.2, warmup=3)
    configs = QUICK_CONFIGS if quick else CONFIGS
    vicreg = run_spawned(_vicreg_worker, WORLD, configs, budget)
    checks, rows = [], []
    for (b, d), t in vicreg.items():
        med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
        vs_local, vs_gather = paired_ratio(t["global"], t["per-rank"]), paired_ratio(t["global"], t["gathered"])
        rows.append([b, d, ms(med["per-rank"]), ms(med["global"]), ms(med["gathered"]), fx(vs_local), fx(vs_gather)])
        checks.append(Check(f"VICRegLoss B={b}/rank D={d} W={WORLD}: global / per-rank step time", vs_local, "<=", 3.0))
        checks.append(
            Check(f"VICRegLoss B={b}/rank D={d} W={WORLD}: global / gathered step time", vs_gather, "<=", 1.5)
        )
    print(
        table(
            f"VICReg step (forward + backward of the loss), W = {WORLD} gloo, float32",
            ["rows/rank", "D", "per-rank ms", "global ms", "gathered ms", "global/per-rank", "global/gathered"],
            rows,
            notes=[
                "per-rank: the loss of this rank's rows, no communication (another objective);",
                "global: VICRegLoss, one all-reduce of D² + 3D + 2 numbers; gathered: all-gather of both views.",
            ],
        )
    )
    dino = run_spawned(_dino_worker, WORLD, DINO_DIMS[:1] if quick else DINO_DIMS, 64, budget)
    rows = []
    for d, t in dino.items():
        med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
        r = paired_ratio(t["DINOCenter"], t["reference"])
        rows.append([d, ms(med["reference"]), ms(med["DINOCenter"]), fx(r)])
        checks.append(Check(f"DINOCenter.update D={d} W={WORLD}: / the reference's bare all-reduce", r, "<=", 2.0))
    print(
        table(
            f"DINO center update, 64 rows per rank, W = {WORLD} gloo",
            ["D", "reference ms", "DINOCenter ms", "ratio"],
            rows,
            notes=["reference: all_reduce of the sums / (rows x world); DINOCenter: the call header + sums and count"],
        )
    )
    return checks
