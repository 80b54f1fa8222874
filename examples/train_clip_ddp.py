"""Train a small two-tower model with ``CLIPLoss`` under DDP, on CPU/gloo, on synthetic paired data.

Run with ``make demo`` or::

    torchrun --standalone --nproc-per-node=2 examples/train_clip_ddp.py [--strategy sharded] [--uneven]

Before training it measures the largest difference between the DDP gradient (every rank on its own rows,
``CLIPLoss`` over the global batch, DDP averaging) and the gradient of one process on the concatenated batch, in
float64, and exits non-zero unless that difference is at float rounding level. Then it trains for a few epochs
and prints, per epoch, the global training loss (the metric's epoch value) and the image→text retrieval accuracy
over the validation set of every rank (embeddings gathered with ``CatMetric``).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmetrics_diff import CatMetric
from torchmetrics_diff.functional import clip_loss
from torchmetrics_diff.losses import CLIPLoss

LATENT, IMAGE_DIM, TEXT_DIM, EMBED = 8, 32, 24, 16


class TwoTower(nn.Module):
    """Image and text encoders to a shared, L2-normalized space, and a learnable temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(IMAGE_DIM, 64), nn.GELU(), nn.Linear(64, EMBED))
        self.text = nn.Sequential(nn.Linear(TEXT_DIM, 64), nn.GELU(), nn.Linear(64, EMBED))
        self.log_logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images: torch.Tensor, texts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        img = nn.functional.normalize(self.image(images), dim=-1)
        txt = nn.functional.normalize(self.text(texts), dim=-1)
        return img, txt, self.log_logit_scale.exp()


def synthetic_pairs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and texts that are two noisy views of one latent code per sample (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    mix_image = torch.randn(LATENT, IMAGE_DIM, generator=torch.Generator().manual_seed(1))
    mix_text = torch.randn(LATENT, TEXT_DIM, generator=torch.Generator().manual_seed(2))
    z = torch.randn(n, LATENT, generator=gen)
    images = z @ mix_image + 1.0 * torch.randn(n, IMAGE_DIM, generator=gen)
    texts = z @ mix_text + 1.0 * torch.randn(n, TEXT_DIM, generator=gen)
    return images, texts


def rank_slices(global_batch: int, world: int, uneven: bool) -> list[slice]:
    """Each rank's rows of a global batch; with ``uneven`` the ranks hold different counts (e.g. 3/5 split)."""
    if uneven:
        weights = [3 + 2 * r for r in range(world)]  # 3:5 for two ranks
        sizes = [global_batch * w // sum(weights) for w in weights]
        sizes[-1] += global_batch - sum(sizes)
    else:
        sizes = [global_batch // world + (r < global_batch % world) for r in range(world)]
    starts = [sum(sizes[:r]) for r in range(world)]
    return [slice(s, s + n) for s, n in zip(starts, sizes)]


def check_gradients(model: nn.Module, images: torch.Tensor, texts: torch.Tensor, mine: slice, strategy: str) -> float:
    """Max |DDP gradient - single-process gradient| over all parameters, float64, on one global batch."""
    ddp = DDP(copy.deepcopy(model).double())
    single = copy.deepcopy(model).double()
    criterion = CLIPLoss(strategy=strategy)
    img, txt, scale = ddp(images[mine].double(), texts[mine].double())
    criterion(img, txt, scale).backward()
    img, txt, scale = single(images.double(), texts.double())
    clip_loss(img, txt, scale).backward()
    diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(ddp.module.parameters(), single.parameters()))
    worst = torch.tensor(diff, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def retrieval_accuracy(model: nn.Module, images: torch.Tensor, texts: torch.Tensor) -> float:
    """Top-1 image→text retrieval over the validation rows of every rank (gathered by CatMetric)."""
    gathered_img, gathered_txt = CatMetric(), CatMetric()
    with torch.no_grad():
        img, txt, _ = model(images, texts)
    gathered_img.update(img.reshape(-1))  # CatMetric keeps 1-D values; rank order is kept, so rows survive
    gathered_txt.update(txt.reshape(-1))
    all_img = gathered_img.compute().view(-1, EMBED)
    all_txt = gathered_txt.compute().view(-1, EMBED)
    hits = (all_img @ all_txt.T).argmax(dim=1) == torch.arange(all_img.shape[0])
    return hits.double().mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["sharded", "replicated"], default="sharded")
    parser.add_argument("--uneven", action="store_true", help="ranks hold different numbers of rows (3:5)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=2048)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    torch.manual_seed(0)  # the same initial model on every rank
    model = TwoTower()

    train_images, train_texts = synthetic_pairs(args.train_size, seed=10)
    val_images, val_texts = synthetic_pairs(1024, seed=11)
    mine = rank_slices(args.global_batch, world, args.uneven)[rank]
    say(
        f"{world} ranks, strategy={args.strategy}, global batch {args.global_batch}, "
        f"rows per rank {[s.stop - s.start for s in rank_slices(args.global_batch, world, args.uneven)]}"
    )

    diff = check_gradients(
        model, train_images[: args.global_batch], train_texts[: args.global_batch], mine, args.strategy
    )
    say(f"gradient check (float64): max |DDP grad - single-process grad| = {diff:.3e}")
    if diff > 1e-10:
        say("FAILED: the DDP gradient differs from the single-process gradient beyond float rounding")
        dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
        dist.destroy_process_group()
        return 1

    ddp = DDP(model)
    criterion = CLIPLoss(strategy=args.strategy)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    val_slice = rank_slices(val_images.shape[0], world, args.uneven)[rank]
    steps = args.train_size // args.global_batch
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(args.train_size, generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            rows = order[step * args.global_batch : (step + 1) * args.global_batch][mine]
            img, txt, scale = ddp(train_images[rows], train_texts[rows])
            loss = criterion(img, txt, scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if rank == 0 and (step + 1) % max(1, steps // 4) == 0:
                print(f"  epoch {epoch} step {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
        epoch_loss = criterion.compute().item()
        criterion.reset()
        accuracy = retrieval_accuracy(model, val_images[val_slice], val_texts[val_slice])
        say(
            f"epoch {epoch}: train loss {epoch_loss:.4f}  val retrieval@1 {accuracy:.3f}  "
            f"logit scale {model.log_logit_scale.exp().item():.2f}  ({time.perf_counter() - start:.1f}s)"
        )
    del ddp  # a DDP module holds its process group: free it before destroy_process_group()
    dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
