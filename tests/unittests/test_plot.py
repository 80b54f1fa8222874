"""``Metric.plot``'s axes: whole-number step ticks for a sequence of values, labelled axes for a confusion matrix.

Drawn with matplotlib's Agg backend (no display); the tick positions are read after the canvas is drawn, as the
viewer sees them.
"""

from __future__ import annotations

import pytest
import torch

from torchmetrics_diff import ConfusionMatrix, MeanMetric

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _visible_ticks(ax, axis: str) -> list[float]:
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    lo, hi = min(lo, hi), max(lo, hi)
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    return [float(t) for t in ticks if lo <= t <= hi]


@pytest.mark.parametrize("steps", [2, 3, 5, 7])
def test_sequence_plot_has_whole_number_step_ticks(steps: int) -> None:
    metric = MeanMetric()
    values = [metric(torch.tensor([float(i), 1.0])) for i in range(steps)]
    _fig, ax = metric.plot(values)
    ticks = _visible_ticks(ax, "x")
    assert ticks, "no tick on the step axis"
    assert all(t == round(t) for t in ticks), f"fractional step ticks: {ticks}"
    assert ax.get_xlabel() == "step"


def test_matplotlib_default_ticks_are_fractional_here() -> None:
    """The case above is not vacuous: matplotlib's default locator puts ticks at halves over 3 steps."""
    _fig, ax = plt.subplots()
    ax.plot(range(3), [1.0, 2.0, 3.0])
    assert any(t != round(t) for t in _visible_ticks(ax, "x"))


def test_confusion_matrix_plot_labels_its_axes() -> None:
    metric = ConfusionMatrix(task="multiclass", num_classes=3)
    preds, target = torch.tensor([0, 2, 1, 2, 2]), torch.tensor([0, 1, 1, 2, 0])
    metric.update(preds, target)
    _fig, ax = metric.plot()
    assert ax.get_xlabel() == "predicted"
    assert ax.get_ylabel() == "target"
    # rows are the targets, columns the predictions, counted by hand from the five pairs above
    (image,) = ax.images
    assert image.get_array().tolist() == [[1, 0, 1], [0, 1, 1], [0, 0, 1]]
    assert _visible_ticks(ax, "x") == [0.0, 1.0, 2.0]
    assert _visible_ticks(ax, "y") == [0.0, 1.0, 2.0]


def test_confusion_matrix_plot_into_given_axes() -> None:
    _fig, given = plt.subplots()
    metric = ConfusionMatrix(task="binary")
    metric.update(torch.tensor([1, 0, 1]), torch.tensor([1, 1, 0]))
    fig, ax = metric.plot(ax=given)
    assert ax is given and fig is given.figure
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted", "target")
