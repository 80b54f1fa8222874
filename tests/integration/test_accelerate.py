"""HuggingFace Accelerate, for real: ``Accelerator(cpu=True)`` on gloo ranks as torchrun starts them.

Each rank is a harness worker whose default process group exists; the environment torchrun would set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``...) makes ``Accelerator`` take it as ``MULTI_CPU`` (it joins the existing group).
Evaluation with the default ``even_batches=True`` on a dataset that does not divide: through
:func:`~torchmetrics_diff.integrations.accelerate.drop_padding` every metric and loss equals one process on the
whole dataset (float64 formulas written here), and without it, or fed ``gather_for_metrics`` output, it does not.
Training: ``accelerator.prepare(model, optimizer)`` with ``CLIPLoss`` gives the gradient of the global batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests._helpers.harness import run_distributed
from torchmetrics_diff import Accuracy, MeanSquaredError, SumMetric
from torchmetrics_diff.integrations.accelerate import drop_padding, real_rows
from torchmetrics_diff.losses import CLIPLoss

pytest.importorskip("accelerate", reason="the Accelerate tests need the `accelerate` extra")

DIM, CLASSES, SCALE = 4, 3, 5.0
TIMEOUT = 60.0


@contextmanager
def _accelerator(rank: int, world: int, **config: Any) -> Iterator[Any]:
    """An ``Accelerator(cpu=True)`` over the worker's process group, as under ``torchrun``; forgotten afterwards
    (Accelerate keeps process-wide singletons, and the harness workers live on)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration

    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",  # read but unused: the group exists
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
        assert accelerator.num_processes == world and accelerator.process_index == rank
        yield accelerator
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _dataset(rows: int) -> tuple[torch.Tensor, ...]:
    """Per row: class logits, a label, a prediction and a target, an image and a text embedding (float64)."""
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, CLASSES, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (rows,), generator=g)
    preds = torch.randn(rows, generator=g, dtype=torch.float64)
    targets = preds + torch.randn(rows, generator=g, dtype=torch.float64)
    img = F.normalize(torch.randn(rows, DIM, generator=g, dtype=torch.float64), dim=1)
    txt = F.normalize(img + torch.randn(rows, DIM, generator=g, dtype=torch.float64), dim=1)
    return logits, labels, preds, targets, img, txt


def _clip(img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
    """CLIP from its definition: the mean of both cross-entropies over the (N, N) logits."""
    logits = SCALE * img @ txt.T
    target = torch.arange(len(logits))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def _reference(rows: int, global_batch: int) -> dict[str, float]:
    """One process on the whole dataset; CLIP is the mean over the global batches (rows in loader order)."""
    logits, labels, preds, targets, img, txt = _dataset(rows)
    clips = [_clip(img[i : i + global_batch], txt[i : i + global_batch]) for i in range(0, rows, global_batch)]
    return {
        "mse": ((preds - targets) ** 2).mean().item(),
        "accuracy": (logits.argmax(1) == labels).double().mean().item(),
        "clip": torch.stack(clips).mean().item(),
        "rows": float(rows),
    }


def _metrics() -> dict[str, Any]:
    return {
        "mse": MeanSquaredError().set_dtype(torch.float64),
        "accuracy": Accuracy(task="multiclass", num_classes=CLASSES),
        "clip": CLIPLoss(),
        "rows": SumMetric().set_dtype(torch.float64),
    }


def _feed(metrics: dict[str, Any], batch: list[torch.Tensor]) -> None:
    logits, labels, preds, targets, img, txt = batch
    metrics["mse"].update(preds, targets)
    metrics["accuracy"].update(logits, labels)
    metrics["clip"].update(img, txt, SCALE)
    metrics["rows"].update(torch.tensor(float(len(preds)), dtype=torch.float64))


def _evaluate(rank: int, world: int, rows: int, batch_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Three evaluations of one prepared loader: through ``drop_padding``, as given, and ``gather_for_metrics``."""
    with _accelerator(rank, world, **config) as accelerator:
        loader = accelerator.prepare(DataLoader(TensorDataset(*_dataset(rows)), batch_size=batch_size))
        exact, padded, gathered = _metrics(), _metrics(), _metrics()
        kept = []
        for batch in loader:
            kept.append(real_rows(accelerator, batch))
            _feed(exact, drop_padding(accelerator, batch))
            _feed(padded, batch)
            if config.get("even_batches", True):  # Accelerate's gather needs equal batches
                _feed(gathered, accelerator.gather_for_metrics(batch))
        fed = {"exact": exact, "padded": padded, "gathered": gathered}
        if not gathered["rows"].update_count:
            del fed["gathered"]
        values = {name: {k: m.compute().item() for k, m in ms.items()} for name, ms in fed.items()}
        return {**values, "kept": kept, "batches": len(loader)}


# (processes, rows, batch size, DataLoaderConfiguration): rows never divide the global batch
CASES = {
    # the last round: rank 0 a full batch of 8, rank 1 two real rows and six repeated
    "two_ranks": (2, 42, 8, {}),
    # the last round: rank 0 four real rows, rank 1 one, rank 2 a batch of repeats only (an empty update)
    "three_ranks_one_all_padding": (3, 17, 4, {}),
    # one batch of 8 split in 4 + 4: the last, 42 % 8 = 2 real rows, all on rank 0
    "split_batches": (2, 42, 8, {"split_batches": True}),
    # process 0 loads the global batches and sends each rank its slice: the last, 9 rows, padded to 5 + 5
    "dispatch_batches": (2, 41, 8, {"dispatch_batches": True}),
    # nothing repeated: rank 1's last batch is short, and drop_padding leaves it whole
    "uneven_batches": (2, 42, 8, {"even_batches": False}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_even_batches_evaluation_equals_one_process_on_the_whole_dataset(case: str) -> None:
    world, rows, batch_size, config = CASES[case]
    global_batch = batch_size if config.get("split_batches") else batch_size * world
    results = run_distributed(_evaluate, world, rows, batch_size, config, timeout=TIMEOUT)
    expected = _reference(rows, global_batch)
    for rank, result in enumerate(results):
        for key, want in expected.items():
            # Accuracy returns float32 (a ratio of exact counts); the others accumulate in float64
            rel = 1e-7 if key == "accuracy" else 1e-12
            assert result["exact"][key] == pytest.approx(want, rel=rel, abs=1e-12), (rank, key)
        # only the last batch holds padding
        assert all(k == global_batch // world for k in result["kept"][:-1]), result
    assert sum(r["kept"][-1] for r in results) == rows - (results[0]["batches"] - 1) * global_batch
    # the padded batches, fed as they come, count the repeated rows: a different value
    padded = results[0]["padded"]
    if config.get("even_batches", True):
        assert padded["rows"] > rows
        assert padded["clip"] != pytest.approx(expected["clip"], rel=1e-6)
    else:
        assert padded == results[0]["exact"]


def test_gather_for_metrics_output_is_counted_once_per_process() -> None:
    """What the guide warns of: every rank feeds the same gathered rows, so each counts ``W`` times. Ratios of
    per-row means survive by accident; counts and sums do not, and a contrastive loss sees each pair ``W`` times
    among its candidates."""
    world, rows, batch_size, config = CASES["two_ranks"]
    results = run_distributed(_evaluate, world, rows, batch_size, config, timeout=TIMEOUT)
    expected, gathered = _reference(rows, batch_size * world), results[0]["gathered"]
    assert gathered["rows"] == world * rows
    assert gathered["mse"] == pytest.approx(expected["mse"], rel=1e-12)
    assert gathered["clip"] > expected["clip"] + 0.1


class _Stream(torch.utils.data.IterableDataset):
    """An iterable dataset without ``__len__``: Accelerate cannot know how many rows it repeats at the end."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(float(self.rows)))


def _stream(rank: int, world: int, rows: int, batch_size: int) -> list[str]:
    with _accelerator(rank, world, dispatch_batches=False) as accelerator:
        loader = accelerator.prepare(DataLoader(_Stream(rows), batch_size=batch_size))
        seen = []
        for batch in loader:
            try:
                seen.append(str(len(drop_padding(accelerator, batch))))
            except ValueError as err:
                seen.append(str(err))
        return seen


def test_unknown_dataset_length_raises_on_every_rank() -> None:
    """11 rows streamed in batches of 4 on two ranks: the last round repeats rows that nobody can identify."""
    results = run_distributed(_stream, 2, 11, 4, timeout=TIMEOUT)
    for seen in results:
        assert seen[:-1] == ["4"] and "does not know the length of the dataset" in seen[-1], seen


def _train_step(rank: int, world: int, rows: int, batch_size: int) -> list[torch.Tensor]:
    """One step of ``accelerator.prepare(model, optimizer)`` with ``CLIPLoss`` on this rank's batch; the gradients
    DDP left (averaged over the ranks)."""
    with _accelerator(rank, world) as accelerator:
        model = _Towers()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        loader = accelerator.prepare(DataLoader(TensorDataset(*_dataset(rows)[4:]), batch_size=batch_size))
        loss_fn = CLIPLoss()
        ((img, txt),) = list(loader)
        loss = loss_fn(*model(img, txt), SCALE)
        accelerator.backward(loss)
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        return [loss.detach(), *grads]


class _Towers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.img = torch.nn.Parameter(torch.randn(DIM, DIM, generator=g, dtype=torch.float64))
        self.txt = torch.nn.Parameter(torch.randn(DIM, DIM, generator=g, dtype=torch.float64))

    def forward(self, img: torch.Tensor, txt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(img @ self.img, dim=1), F.normalize(txt @ self.txt, dim=1)


@pytest.mark.timeout(120)
def test_prepared_training_step_gradient_is_the_global_batch_gradient() -> None:
    """Two ranks of 8 rows: the loss is CLIP of the 16 rows, and the gradient DDP averages is the one-process
    gradient of that loss."""
    world, batch_size = 2, 8
    results = run_distributed(_train_step, world, world * batch_size, batch_size, timeout=TIMEOUT)
    model = _Towers()
    img, txt = _dataset(world * batch_size)[4:]
    loss = _clip(*model(img, txt))
    loss.backward()
    for rank, (value, *grads) in enumerate(results):
        assert value.item() == pytest.approx(loss.item(), rel=1e-12), rank
        for got, param in zip(grads, model.parameters()):
            torch.testing.assert_close(got, param.grad, rtol=1e-12, atol=1e-14)
