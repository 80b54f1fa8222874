"""MoE router losses: step time of the global-batch losses against the per-rank computation they replace.

At W = 2 on gloo, per step (forward and backward of the auxiliary loss alone, from router logits that require
gradient; the softmax and top-k are inside the step), for ``L`` MoE layers of ``T`` tokens per rank and ``E``
experts, top-2:

- **per rank**: the usual hand-rolled Switch loss of this rank's tokens (``E · Σ f_i · P_i`` per layer, averaged
  over the layers), no communication: what DDP code computes today;
- **LoadBalancingLoss**: ``f`` and ``P`` over both ranks' tokens, every layer in one call (the call header and
  one all-reduce, whatever ``L``);
- **global, one all-reduce per layer**: the same global loss hand-rolled with a ``torch.distributed.all_reduce``
  of each layer's statistics, what a per-layer implementation pays;
- **RouterZLoss** against the per-rank z-loss.

The lines report the ratio of each global loss's step time to the per-rank computation's, measured in
alternating blocks on the same processes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from _timing import Budget, Check, fx, ms, paired_ratio, run_spawned, table, time_dist_rounds

E, TOP_K = 64, 2
SHAPES = ((1, 4096), (8, 1024))  # (layers, tokens per rank)


def _per_rank(logits: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's loss of this rank's tokens only, per layer, averaged over the layers."""
    probs = logits.softmax(-1)
    index = probs.detach().topk(TOP_K, dim=-1).indices
    counts = torch.zeros(logits.shape[0], E).scatter_add_(1, index.flatten(1), torch.ones(index.flatten(1).shape))
    f = counts / (TOP_K * logits.shape[1])
    return (E * (f * probs.mean(dim=1)).sum(-1)).mean()


def _per_layer_global(logits: torch.Tensor) -> torch.Tensor:
    """The global loss hand-rolled with one all-reduce of each layer's statistics (the gradient through the local
    probability sums, scaled by W for DDP's averaging)."""
    world = dist.get_world_size()
    total = torch.zeros(())
    for layer in range(logits.shape[0]):
        probs = logits[layer].softmax(-1)
        index = probs.detach().topk(TOP_K, dim=-1).indices
        stats = torch.cat([torch.zeros(E).scatter_add_(0, index.flatten(), torch.ones(index.numel())), probs.sum(0)])
        stats = torch.cat([stats.detach(), torch.tensor([float(probs.shape[0])])])
        dist.all_reduce(stats)
        f = stats[:E] / (TOP_K * stats[-1])
        local = E * (f * probs.sum(0)).sum() / stats[-1]
        total = total + (E * (f * stats[E : 2 * E]).sum() / stats[-1]).detach() + world * (local - local.detach())
    return total / logits.shape[0]


def _z_per_rank(logits: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits, dim=-1).square().mean()


def _run(rank: int, world: int, budget: Budget) -> dict[str, Any]:
    from torchmetrics_diff.losses import LoadBalancingLoss, RouterZLoss

    out: dict[str, Any] = {}
    for layers, tokens in SHAPES:
        g = torch.Generator().manual_seed(rank)
        logits = torch.randn(layers, tokens, E, generator=g).requires_grad_()
        lb = LoadBalancingLoss(E, TOP_K, validate_args=False)
        z = RouterZLoss()

        def step(loss: Any, logits: torch.Tensor = logits) -> None:
            loss(logits).backward()
            logits.grad = None

        def global_lb(x: torch.Tensor, lb: Any = lb) -> torch.Tensor:
            probs = x.softmax(-1)
            return lb(probs, probs.detach().topk(TOP_K, dim=-1).indices)

        fns = {
            "per rank": lambda: step(_per_rank),
            "LoadBalancingLoss": lambda: step(global_lb),
            "global, one all-reduce per layer": lambda: step(_per_layer_global),
            "z per rank": lambda: step(_z_per_rank),
            "RouterZLoss": lambda z=z: step(z),
        }
        out[layers, tokens] = time_dist_rounds(fns, budget)
    return out


def main(args: Any) -> list[Check]:
    quick = getattr(args, "quick", False)
    budget = Budget(repeats=3, block_s=0.05, warmup=2) if quick else Budget(repeats=9, block_s=0.2, warmup=5)
    rounds = run_spawned(_run, 2, budget)
    rows, checks = [], []
    for (layers, tokens), times in rounds.items():
        base, z_base = times["per rank"], times["z per rank"]
        med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        lb_ratio = paired_ratio(times["LoadBalancingLoss"], base)
        naive_ratio = paired_ratio(times["global, one all-reduce per layer"], base)
        z_ratio = paired_ratio(times["RouterZLoss"], z_base)
        rows.append(
            [
                f"{layers} x {tokens} x {E}",
                ms(med["per rank"]),
                ms(med["LoadBalancingLoss"]),
                fx(lb_ratio),
                ms(med["global, one all-reduce per layer"]),
                fx(naive_ratio),
                ms(med["z per rank"]),
                ms(med["RouterZLoss"]),
                fx(z_ratio),
            ]
        )
        checks.append(
            Check(f"LoadBalancingLoss L={layers} T={tokens} E={E} W=2: step time / per-rank", lb_ratio, "<=", 3.0)
        )
        checks.append(Check(f"RouterZLoss L={layers} T={tokens} E={E} W=2: step time / per-rank", z_ratio, "<=", 4.0))
    print(
        table(
            "MoE router losses at W = 2 (gloo, CPU), forward + backward per step, top-2",
            [
                "layers x tokens/rank x experts",
                "per rank",
                "LoadBalancingLoss",
                "ratio",
                "all-reduce per layer",
                "ratio",
                "z per rank",
                "RouterZLoss",
                "ratio",
            ],
            rows,
            notes=["ratio: paired per-round ratio of the global loss's step time to the per-rank computation's"],
        )
    )
    return checks
