"""Gradient accumulation of the token loss in a flat loop, where ranks run different numbers of micro-batches.

Run on the CPU (gloo) with::

    torchrun --standalone --nproc-per-node=3 examples/flat_accumulation.py

Each rank's optimizer step holds ``SEQUENCES`` sequences of random lengths, packed into micro-batches of at most
``TOKEN_BUDGET`` tokens (padding included), so the ranks run different numbers of micro-batches per step and no
rank knows another's targets. The loss of a step is the cross-entropy summed over the valid tokens of every
micro-batch of every rank, divided by their count. The script trains a few steps twice from the same weights:

- **flat**: ``TokenCrossEntropyLoss.flat_accumulation``: each call returns its micro-batch's unnormalized sum,
  ``finish_step()`` normalizes the gradients once, at the end of the step;
- **up front**: ``TokenCrossEntropyLoss.accumulate`` with the targets of the step's micro-batches, which needs
  every rank to make the same number of calls: the short ranks pad with empty micro-batches.

At every step, on every rank, both gradients are checked against one process computing the step's loss on the
micro-batches of every rank at once (``F.cross_entropy(..., reduction="sum")`` divided by the token count), and
the two runs' weights must stay equal.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmetrics_diff.losses import TokenCrossEntropyLoss

VOCAB, DIM, STEPS, SEQUENCES, TOKEN_BUDGET, PAD = 50, 16, 3, 6, 24, -100


def step_sequences(step: int, rank: int) -> list[Tensor]:
    """The token sequences of ``rank`` for optimizer step ``step`` (any process can rebuild any rank's)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    longest = 6 + 6 * ((rank + step) % 3)  # some ranks hold longer documents: more micro-batches
    lengths = torch.randint(2, longest, (SEQUENCES,), generator=g)
    return [torch.randint(0, VOCAB, (int(n),), generator=g) for n in lengths]


def micro_batches(sequences: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Pack sequences in order into padded ``(inputs, labels)`` micro-batches of at most ``TOKEN_BUDGET`` tokens."""
    packed: list[list[Tensor]] = [[]]
    for seq in sequences:
        rows = [*packed[-1], seq]
        if packed[-1] and len(rows) * max(len(s) for s in rows) > TOKEN_BUDGET:
            packed.append([seq])
        else:
            packed[-1] = rows
    batches = []
    for rows in packed:
        width = max(len(s) for s in rows) - 1
        inputs = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), PAD)
        for i, seq in enumerate(rows):
            inputs[i, : len(seq) - 1], labels[i, : len(seq) - 1] = seq[:-1], seq[1:]  # next-token prediction
        batches.append((inputs, labels))
    return batches


def flat_stream(rank: int) -> Iterator[tuple[Tensor, Tensor, bool]]:
    """What a flat loader yields: micro-batches one after the other, with a flag on each step's last one."""
    for step in range(STEPS):
        batches = micro_batches(step_sequences(step, rank))
        for i, (inputs, labels) in enumerate(batches):
            yield inputs, labels, i == len(batches) - 1


def reference_grads(model: nn.Module, step: int, world: int) -> tuple[float, list[Tensor]]:
    """One process, every micro-batch of every rank at once: the step's loss and its gradients."""
    logits, labels = [], []
    for rank in range(world):
        for inputs, target in micro_batches(step_sequences(step, rank)):
            logits.append(model(inputs).reshape(-1, VOCAB))
            labels.append(target.reshape(-1))
    target = torch.cat(labels)
    loss = F.cross_entropy(torch.cat(logits), target, ignore_index=PAD, reduction="sum") / (target != PAD).sum()
    return float(loss.detach()), list(torch.autograd.grad(loss, list(model.parameters())))


def check(model: nn.Module, step: int, world: int, loss: float) -> None:
    want_loss, want = reference_grads(copy.deepcopy(model), step, world)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0.0)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)


def train_flat(model: nn.Module, rank: int, world: int) -> None:
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = TokenCrossEntropyLoss(ignore_index=PAD)
    step = 0
    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for inputs, labels, last in flat_stream(rank):
            with contextlib.nullcontext() if last else ddp.no_sync():  # DDP all-reduces in the last backward
                loss_fn(ddp(inputs), labels).backward()  # this micro-batch's unnormalized sum
            if last:
                micro = acc.micro_batches
                acc.finish_step()  # one all-reduce; now the gradients are those of the step's global mean
                check(model, step, world, float(acc.loss))
                nn.utils.clip_grad_norm_(model.parameters(), 10.0)  # (clipping comes after finish_step)
                counts = [torch.zeros((), dtype=torch.long) for _ in range(world)]
                dist.all_gather(counts, torch.tensor(micro))
                if rank == 0:
                    print(
                        f"flat     step {step}: loss {float(acc.loss):.6f} over {int(acc.weight)} tokens, "
                        f"micro-batches per rank {[int(c) for c in counts]}: gradients match one process"
                    )
                optimizer.step()
                optimizer.zero_grad()
                step += 1


def train_up_front(model: nn.Module, rank: int, world: int) -> None:
    ddp = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = TokenCrossEntropyLoss(ignore_index=PAD)
    for step in range(STEPS):
        batches = micro_batches(step_sequences(step, rank))
        most = torch.tensor(len(batches))
        dist.all_reduce(most, dist.ReduceOp.MAX)  # every rank must call the loss as often: pad with empty ones
        batches += [(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long))] * (
            int(most) - len(batches)
        )
        step_loss = 0.0
        with loss_fn.accumulate([labels for _, labels in batches]):  # the step's token count, before any forward
            for i, (inputs, labels) in enumerate(batches):
                with contextlib.nullcontext() if i == len(batches) - 1 else ddp.no_sync():
                    share = loss_fn(ddp(inputs), labels)  # this micro-batch's share of the step's loss
                    share.backward()
                step_loss += float(share.detach())
        check(model, step, world, step_loss)
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        if rank == 0:
            print(f"up front step {step}: loss {step_loss:.6f}: gradients match one process")
        optimizer.step()
        optimizer.zero_grad()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Tanh(), nn.Linear(DIM, VOCAB)).double()
    twin = copy.deepcopy(model)
    train_flat(model, rank, world)
    train_up_front(twin, rank, world)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if rank == 0:
        print("flat and up-front accumulation trained the same weights")
    dist.barrier()  # every rank done communicating before any tears down (docs: failure modes, shutting down)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
