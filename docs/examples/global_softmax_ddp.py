"""A custom metric used as a loss: a softmax over the *global* batch, with exact gradients under DDP.

Run with:  torchrun --standalone --nproc-per-node=3 docs/examples/global_softmax_ddp.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmetrics_diff import Metric


class GlobalSoftmaxNLL(Metric):
    """``-mean(log softmax(scores))`` over the positives, the softmax taken over every sample seen."""

    is_differentiable = True
    higher_is_better = False
    full_state_update = False
    # the states, declared for type checkers (``add_state`` registers them when the metric is built)
    scores: list[torch.Tensor]
    positive: list[torch.Tensor]
    n_positive: torch.Tensor

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("scores", [], dist_reduce_fx="cat")  # one score per sample, every rank's rows
        self.add_state("positive", [], dist_reduce_fx="cat")  # 1.0 for the samples to pull up
        self.add_state("n_positive", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, positive: torch.Tensor) -> None:
        self.scores.append(scores)
        self.positive.append(positive.to(scores.dtype))
        self.n_positive = self.n_positive + positive.sum()

    def compute(self) -> torch.Tensor:
        log_p = torch.log_softmax(torch.cat(self.scores), dim=0)
        return -(log_p * torch.cat(self.positive)).sum() / self.n_positive


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch: uneven sizes, and rank 1 holds no rows at all."""
    rows = [5, 0, 3, 4][rank % 4]
    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, 8, generator=g, dtype=torch.float64), torch.rand(rows, generator=g) > 0.5


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = nn.Linear(8, 1).double()
model = DDP(net)
loss_fn = GlobalSoftmaxNLL(dist_sync_on_step=True)

features, positive = batch(rank)
loss = loss_fn(model(features).squeeze(-1), positive)  # the loss of the global batch, on every rank
loss.backward()  # DDP averages the gradients of the ranks

# The contract: the same gradient as one process on the concatenated batch.
reference = nn.Linear(8, 1).double()
reference.load_state_dict(net.state_dict())
all_features, all_positive = (torch.cat(t) for t in zip(*(batch(r) for r in range(world))))
GlobalSoftmaxNLL()(reference(all_features).squeeze(-1), all_positive).backward()
torch.testing.assert_close(net.weight.grad, reference.weight.grad)
torch.testing.assert_close(net.bias.grad, reference.bias.grad)

epoch_value = loss_fn.compute()  # the accumulated, detached states, synced across ranks
if rank == 0:
    print(f"step loss {loss.item():.6f}, epoch value {epoch_value.item():.6f}: gradients match")
del model  # a DDP module holds its process group: free it before destroy_process_group()
dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
dist.destroy_process_group()
