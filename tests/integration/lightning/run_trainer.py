"""A real ``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` run that logs our metric objects.

Usage: ``python run_trainer.py OUT_DIR`` (Lightning re-launches this script for rank 1). Logs, per step and per
epoch, a ``CLIPLoss`` object, a ``MeanMetric`` and a ``MetricCollection`` (``self.log`` / ``self.log_dict``);
rank 0's CSVLogger writes them to ``OUT_DIR``, plus ``final.json`` with the trained weights' norm and how often
each metric was reset.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests._helpers import lightning_runs as C
from torchmetrics_diff import MaxMetric, MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.losses import CLIPLoss
from torchmetrics_diff.wrappers import RunningMean


class Steps(Dataset):
    """One item per step: this rank's rows of the step's global batch (the epoch is set by the module)."""

    def __init__(self, module: TwoTower) -> None:
        self.module = module

    def __len__(self) -> int:
        return C.STEPS

    def __getitem__(self, step: int) -> tuple[torch.Tensor, ...]:
        img, txt, values = C.global_batch(self.module.current_epoch, step)
        rows = C.rank_rows(self.module.global_rank)
        return img[rows], txt[rows], values[rows]


class TwoTower(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.img, self.txt = C.towers()
        self.loss_fn = CLIPLoss()
        self.mean = MeanMetric(dist_sync_on_step=True)
        self.stats = MetricCollection(
            {"sum": SumMetric(dist_sync_on_step=True), "max": MaxMetric(dist_sync_on_step=True)}, prefix="train/"
        )
        self.running = RunningMean(window=C.STEPS, dist_sync_on_step=True)  # a wrapper, logged like a metric
        self.resets = 0

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        img, txt, values = (t.squeeze(0) for t in batch)
        loss = self.loss_fn(F.normalize(self.img(img), dim=1), F.normalize(self.txt(txt), dim=1), C.LOGIT_SCALE)
        self.log("clip", self.loss_fn, on_step=True, on_epoch=True)
        self.mean(values)
        self.log("mean", self.mean, on_step=True, on_epoch=True)
        self.stats(values)
        self.log_dict(self.stats, on_step=True, on_epoch=True)
        self.running(values)
        self.log("running", self.running, on_step=True, on_epoch=True)
        return loss

    def on_train_epoch_start(self) -> None:
        # the previous epoch's states must be gone: Lightning resets logged metrics at epoch end
        if self.current_epoch > 0 and self.mean.update_count == 0 and self.loss_fn.update_count == 0:
            self.resets += 1

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Steps(self), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=C.LR)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    module = TwoTower()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=C.EPOCHS,
        logger=CSVLogger(str(out), name="", version=""),
        log_every_n_steps=1,
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
    )
    trainer.fit(module)
    if trainer.global_rank == 0:
        norm = C.weight_norm(module.img, module.txt)
        final = {"final_weight_norm": norm, "resets": module.resets, "world": trainer.world_size}
        (out / "final.json").write_text(json.dumps(final))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
