"""Draw the pictures of the plotting guide (``docs/guide/plotting.rst``) with ``Metric.plot``.

Writes five small PNGs into ``docs/_static/``. Needs matplotlib (the ``plot`` extra). Run from the repository
root::

    .venv/bin/python docs/examples/make_plot_images.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write files only

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torchmetrics_diff import (  # noqa: E402
    ConfusionMatrix,
    MaxMetric,
    MeanAbsoluteError,
    MeanMetric,
    MeanSquaredError,
    MetricCollection,
    SumMetric,
)
from torchmetrics_diff.wrappers import MetricTracker  # noqa: E402

STATIC = ROOT / "docs" / "_static"
SIZE, DPI = (7.5, 5.0), 80  # 600 x 400 pixels


def _save(fig: matplotlib.figure.Figure, name: str) -> None:
    fig.set_size_inches(*SIZE)
    fig.tight_layout()
    fig.savefig(STATIC / name, dpi=DPI)
    print(f"wrote {STATIC / name}")


def main() -> None:
    g = torch.Generator().manual_seed(0)

    # 1. a sequence of values: what forward returned at each of 20 steps of a decaying loss
    loss = MeanMetric()
    per_step = []
    for step in range(20):
        batch = 2.0 * torch.exp(torch.tensor(-step / 6.0)) + 0.1 * torch.rand(8, generator=g)
        per_step.append(loss(batch))
    fig, ax = loss.plot(per_step)
    ax.set_ylabel("loss")
    _save(fig, "plot_sequence.png")

    # 2. a collection, drawn together: one line per member over the steps
    stats = MetricCollection({"sum": SumMetric(), "max": MaxMetric(), "mean": MeanMetric()}, prefix="train/")
    steps = [stats(torch.randn(4, generator=g) + 0.1 * step) for step in range(10)]
    fig, _ = stats.plot(steps, together=True)
    _save(fig, "plot_collection.png")

    # 3. a single value: compute() after the steps above, one marker per member with its number
    fig, _ = stats.plot(together=True)
    _save(fig, "plot_single.png")

    # 4. a single 2-D value: an image with its entries written in (a confusion matrix labels its axes)
    confusion = ConfusionMatrix(task="multiclass", num_classes=3)
    for _ in range(5):
        target = torch.randint(0, 3, (20,), generator=g)
        wrong = torch.rand(20, generator=g) < 0.3
        confusion.update(torch.where(wrong, (target + 1) % 3, target), target)
    fig, _ = confusion.plot()
    _save(fig, "plot_matrix.png")

    # 5. a tracker of a collection: every epoch's value, one line per key
    tracker = MetricTracker(MetricCollection({"mae": MeanAbsoluteError(), "mse": MeanSquaredError()}))
    for epoch in range(5):
        tracker.increment()
        preds = torch.randn(32, generator=g)
        tracker.update(preds, preds + torch.randn(32, generator=g) / (epoch + 1))
    fig, _ = tracker.plot()
    _save(fig, "plot_tracker.png")


if __name__ == "__main__":
    main()
