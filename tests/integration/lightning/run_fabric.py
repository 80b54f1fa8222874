"""A Lightning Fabric run (``strategy="ddp"``, 2 CPU processes) with our loss, a MeanMetric and a collection.

Usage: ``python run_fabric.py OUT_DIR`` (Fabric re-launches this script for rank 1). Per step it logs the values
that the loss, the metric and the collection return; per epoch their ``compute()`` through
:func:`torchmetrics_diff.integrations.lightning.log_epoch`, which resets them. Rank 0's CSVLogger writes
``OUT_DIR/metrics.csv``; ``final.json`` holds the trained weights' norm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests._helpers import lightning_runs as C
from torchmetrics_diff import MaxMetric, MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.integrations.lightning import log_epoch
from torchmetrics_diff.losses import CLIPLoss


class TwoTower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.img, self.txt = C.towers()

    def forward(self, img: torch.Tensor, txt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(self.img(img), dim=1), F.normalize(self.txt(txt), dim=1)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=CSVLogger(str(out), name="", version=""))
    fabric.launch()
    model = TwoTower()
    optimizer = torch.optim.SGD(model.parameters(), lr=C.LR)
    model, optimizer = fabric.setup(model, optimizer)
    loss_fn = CLIPLoss().to(fabric.device)
    mean = MeanMetric(dist_sync_on_step=True).to(fabric.device)
    stats = MetricCollection(
        {"sum": SumMetric(dist_sync_on_step=True), "max": MaxMetric(dist_sync_on_step=True)}, prefix="train/"
    ).to(fabric.device)
    rows = C.rank_rows(fabric.global_rank)
    step = 0
    for epoch in range(C.EPOCHS):
        for batch in range(C.STEPS):
            img, txt, values = (t[rows] for t in C.global_batch(epoch, batch))
            loss = loss_fn(*model(img, txt), C.LOGIT_SCALE)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            logged = {"clip_step": loss.detach(), "mean_step": mean(values)}
            logged.update({f"{k}_step": v for k, v in stats(values).items()})
            fabric.log_dict(logged, step=step)
            step += 1
        log_epoch(fabric, loss_fn, name="clip_epoch", step=step - 1)
        log_epoch(fabric, mean, name="mean_epoch", step=step - 1)
        log_epoch(fabric, stats.clone(postfix="_epoch"), step=step - 1)
        stats.reset()
    if fabric.global_rank == 0:
        norm = C.weight_norm(model.img, model.txt)
        (out / "final.json").write_text(json.dumps({"final_weight_norm": norm, "world": fabric.world_size}))
    for logger in fabric.loggers:
        logger.finalize("success")
    fabric.barrier()
    torch.distributed.destroy_process_group()  # (a gloo group left to the interpreter's exit can abort it)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
