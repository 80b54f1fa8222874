"""A real ``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` run that logs dict-valued metrics with
``self.log_dict(collection)``.

Usage: ``python run_log_dict.py OUT_DIR`` (Lightning re-launches this script for rank 1). Two epochs of two
training and two validation steps; every step's global batch has 5 rows, split 3 + 2 between the ranks.

* ``training_step`` calls a collection holding a ``ClasswiseWrapper`` (synced on step) and logs it with
  ``self.log_dict(..., on_step=True, on_epoch=True)``, after logging a plain metric with ``self.log`` (so Lightning
  looks the logged metrics up before the views were ever iterated).
* ``validation_step`` updates a collection holding a ``CrossModalMRR``, a ``ClasswiseWrapper`` and an ``Accuracy``
  and logs it with ``self.log_dict(collection)``. A plain tensor logged without ``sync_dist`` is the control that
  Lightning's ``sync_dist`` warning is caught when it is given.
* Both collections' states are persistent, so that the checkpoint ``ModelCheckpoint`` writes at the end of each
  training epoch shows what a checkpoint holds of metric states.

Rank 0's CSVLogger writes the values to ``OUT_DIR``; every rank writes ``rank<r>.json``: the warnings raised during
``fit``, how often the MRR member was computed, and the world size.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests._helpers import lightning_runs as C
from torchmetrics_diff import Accuracy, MeanMetric, MetricCollection
from torchmetrics_diff.retrieval import CrossModalMRR
from torchmetrics_diff.wrappers import ClasswiseWrapper


class CountedMRR(CrossModalMRR):
    """``CrossModalMRR`` that counts its computes (the views of its two keys must compute it once per epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.computes = 0

    def compute(self) -> dict[str, torch.Tensor]:
        self.computes += 1
        return super().compute()


class Steps(Dataset):
    """One item per step: this rank's rows of the step's global batch."""

    def __init__(self, module: Logged, stage: str) -> None:
        self.module, self.stage = module, stage

    def __len__(self) -> int:
        return C.LOG_STEPS

    def __getitem__(self, step: int) -> tuple[torch.Tensor, ...]:
        batch = C.log_dict_batch(self.stage, self.module.current_epoch, step)
        return tuple(t[C.rank_rows(self.module.global_rank)] for t in batch)


def classwise(**kwargs: bool) -> ClasswiseWrapper:
    return ClasswiseWrapper(
        Accuracy(task="multiclass", num_classes=C.CLASSES, average=None, **kwargs), labels=list(C.LABELS)
    )


class Logged(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(C.DIM, 1)
        self.train_loss = MeanMetric()
        self.train_metrics = MetricCollection({"cw": classwise(dist_sync_on_step=True)}, prefix="train/")
        self.val_metrics = MetricCollection(
            {
                "mrr": CountedMRR(),
                "cw": classwise(),
                "acc": Accuracy(task="multiclass", num_classes=C.CLASSES, average="micro"),
            },
            prefix="val/",
        )
        # persistent states: the checkpoints show what they hold of both collections
        self.train_metrics.persistent(True)
        self.val_metrics.persistent(True)
        self.computes: list[int] = []

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        image, _, logits, labels = (t.squeeze(0) for t in batch)
        loss = self.layer(image).pow(2).mean()
        self.train_loss(loss.detach())
        self.log("loss", self.train_loss, on_step=False, on_epoch=True)  # Lightning maps its metrics here
        self.train_metrics(logits, labels)
        self.log_dict(self.train_metrics, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        image, text, logits, labels = (t.squeeze(0) for t in batch)
        self.val_metrics.update(image=image, text=text, preds=logits, target=labels)
        self.log_dict(self.val_metrics)
        self.log("val/control", torch.tensor(1.0))  # a tensor without sync_dist: Lightning warns about it

    def on_validation_epoch_end(self) -> None:
        self.computes.append(self.val_metrics["mrr"].computes)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Steps(self, "train"), batch_size=1)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Steps(self, "val"), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    module = Logged()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=C.EPOCHS,
        logger=CSVLogger(str(out), name="", version=""),
        callbacks=[ModelCheckpoint(dirpath=str(out / "checkpoints"), filename="{epoch}", save_top_k=-1)],
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)
    report = {
        "world": trainer.world_size,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "computes": module.computes,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
