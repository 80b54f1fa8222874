"""Token-level cross-entropy normalized by the global number of valid tokens, under DDP.

Run with:  torchrun --nproc-per-node=2 docs/examples/ddp_token_loss.py
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmetrics_diff import MeanMetric

dist.init_process_group("gloo")  # "nccl" on GPUs
rank = dist.get_rank()
torch.manual_seed(0)  # the same initial weights on every rank
model = DDP(nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# The loss: mean over every valid token of every rank, with the one-big-device gradient.
loss_fn = MeanMetric(dist_sync_on_step=True)

for epoch in range(2):
    for step in range(10):
        g = torch.Generator().manual_seed(1000 * epoch + 10 * step + rank)
        tokens = torch.randint(0, 100, (4, 16), generator=g)
        mask = torch.rand(4, 16, generator=g) > 0.3 * (rank + 1)  # ranks hold different numbers of tokens

        logits = model(tokens[:, :-1])
        per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = loss_fn(per_token, weight=mask[:, 1:])  # identical on every rank

        optimizer.zero_grad()
        loss.backward()  # DDP averages; the metric already scaled the local gradient by the world size
        optimizer.step()

    epoch_loss = loss_fn.compute()  # every token of the epoch, all ranks: a detached tensor
    if rank == 0:
        print(f"epoch {epoch}: loss {epoch_loss.item():.4f}")
    loss_fn.reset()

del model  # a DDP module holds its process group: free it before destroy_process_group()
dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
dist.destroy_process_group()
