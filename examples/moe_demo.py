"""Train a toy Mixture-of-Experts layer under DDP with per-rank and with global load balancing; compare the loads.

Run on the CPU (gloo) with::

    torchrun --standalone --nproc-per-node=2 examples/moe_demo.py [--steps 150]

The two ranks see different data, as the ranks of a real run see different documents: rank 0 draws its tokens
from two clusters, rank 1 from two others, and each cluster wants its own linear map. A top-1 router sends each
token to one of four experts; the loss is the regression error plus ``0.1 ·`` the load-balancing loss.

- **per rank**: ``LoadBalancingLoss(dist_sync_on_step=False)``, the usual per-micro-batch auxiliary loss: every
  rank's own tokens must be spread over the four experts.
- **global**: ``LoadBalancingLoss()``: the load of every rank's tokens together must be balanced, so an expert may
  serve only the clusters of one rank.

The same model, data and seed train once with each; the script prints each rank's expert load (the fraction of
its tokens routed to each expert), the global load, and the regression error. Per-rank balancing keeps each
rank's load near 1/4 per expert and the experts shared between the domains; global balancing lets each rank's
tokens go to the experts of its own clusters while the global load stays balanced.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmetrics_diff.distributed import all_gather_cat
from torchmetrics_diff.functional import expert_load, load_balancing_stats
from torchmetrics_diff.losses import LoadBalancingLoss

DIM, EXPERTS, TOKENS, AUX = 8, 4, 256, 1.0


class ToyMoE(nn.Module):
    """A top-1 MoE layer: a softmax router and linear experts (computed densely: it is a toy)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = self.router(x).softmax(dim=-1)  # (T, E)
        index = probs.argmax(dim=-1, keepdim=True)  # (T, 1)
        gate = torch.zeros_like(probs).scatter(1, index, probs.gather(1, index))  # the chosen expert's probability
        out = sum(gate[:, i : i + 1] * expert(x) for i, expert in enumerate(self.experts))
        return out, probs, index


def make_task(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight clusters (their centres and their target maps), the same on every rank: clusters 0-3 belong to the
    first domain, 4-7 to the second, and the clusters of a domain share its linear map (up to a small change)."""
    g = torch.Generator().manual_seed(seed)
    centres = 1.5 * torch.randn(8, DIM, generator=g)
    domains = torch.randn(2, DIM, DIM, generator=g) / DIM**0.5
    maps = domains.repeat_interleave(4, dim=0) + 0.05 * torch.randn(8, DIM, DIM, generator=g)
    return centres, maps


def batch(rank: int, step: int, centres: torch.Tensor, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens: the four clusters of its own domain only (the ranks' data differ)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    cluster = 4 * rank + torch.randint(0, 4, (TOKENS,), generator=g)
    x = centres[cluster] + torch.randn(TOKENS, DIM, generator=g)
    y = torch.einsum("tij,tj->ti", maps[cluster], x)
    return x, y


def train(balancing: str, steps: int, rank: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = DDP(ToyMoE())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    aux = LoadBalancingLoss(EXPERTS, top_k=1, dist_sync_on_step=balancing == "global")
    centres, maps = make_task(7)
    for step in range(steps):
        x, y = batch(rank, step, centres, maps)
        out, probs, index = model(x)
        loss = nn.functional.mse_loss(out, y) + AUX * aux(probs, index)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # the load on fresh tokens, per rank and over both ranks
        x, y = batch(rank, steps, centres, maps)
        out, probs, index = model(x)
        stats = load_balancing_stats(probs, index, EXPERTS)
        local = expert_load(stats.counts, stats.tokens, 1)
        error = nn.functional.mse_loss(out, y).reshape(1)
        every = all_gather_cat(torch.cat([local, error]).unsqueeze(0), grad="none")
    return {
        "per_rank": every[:, :EXPERTS],
        "global": every[:, :EXPERTS].mean(dim=0),
        "mse": every[:, EXPERTS].mean(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("run with torchrun --nproc-per-node=2 (the two ranks hold different clusters)")
    results = {mode: train(mode, args.steps, rank) for mode in ("per rank", "global")}
    if rank == 0:
        for mode, res in results.items():
            print(f"{mode} balancing: regression error {float(res['mse']):.3f}")
            for r, row in enumerate(res["per_rank"]):
                print(f"  rank {r} expert load: " + " ".join(f"{v:.2f}" for v in row.tolist()))
            print("  global expert load: " + " ".join(f"{v:.2f}" for v in res["global"].tolist()))
        spread = {m: float((res["per_rank"] - 1 / EXPERTS).abs().sum(dim=1).mean()) for m, res in results.items()}
        print(
            "mean distance of a rank's load from uniform (sum |f_i - 1/4|): "
            + ", ".join(f"{m} {v:.2f}" for m, v in spread.items())
        )
    dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
