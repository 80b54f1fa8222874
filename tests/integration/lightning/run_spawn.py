"""A real ``lightning.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2)`` validation that logs our metrics.

Usage: ``python run_spawn.py OUT_DIR``. Lightning pickles the module into two spawned processes, where no metric's
``__init__`` runs and this script imports nothing from ``torchmetrics_diff.integrations``; the metrics must still
be loggable there. ``validation_step`` logs an ``Accuracy`` with ``self.log`` and a ``MetricCollection`` with
``self.log_dict``, on epoch; the main process writes what ``trainer.validate`` returned to ``OUT_DIR/logged.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests._helpers import lightning_runs as C
from torchmetrics_diff import Accuracy, MeanAbsoluteError, MeanSquaredError, MetricCollection


class Validated(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(C.DIM, C.CLASSES, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.net.weight.copy_(C.val_weight())
        self.acc = Accuracy(task="multiclass", num_classes=C.CLASSES)
        self.errors = MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}, prefix="val/")

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        x, labels, targets = batch
        logits = self.net(x)
        self.acc(logits, labels)
        self.log("val/acc", self.acc, on_step=False, on_epoch=True)
        self.errors(logits[:, 0], targets)
        self.log_dict(self.errors, on_step=False, on_epoch=True)


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    x, labels, targets = C.val_data()
    loader = DataLoader(TensorDataset(x, labels, targets), batch_size=C.VAL_BATCH)
    trainer = L.Trainer(
        strategy="ddp_spawn",
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (results,) = trainer.validate(Validated(), dataloaders=loader, verbose=False)
    logged = {k: float(v) for k, v in results.items()}
    (out / "logged.json").write_text(json.dumps({"logged": logged, "world": trainer.world_size}))


if __name__ == "__main__":
    main()
