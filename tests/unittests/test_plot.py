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
    assert ax.get_xlabel() == "Step"


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


# ---------------------------------------------------------------------------------------------------------------
# Parity with torchmetrics' pictures: the same inputs drawn by our metric and by torchmetrics' twin give the same
# data — the lines' points and labels, the dashed bound lines, the "Optimal value" text, the axis ranges, labels,
# ticks and legend texts. (Not the colours or marker sizes' styling: torchmetrics draws under matplotlib's default
# style, ours under the user's.)

tm = pytest.importorskip("torchmetrics")


def _num(x) -> list[float]:
    if isinstance(x, torch.Tensor):
        x = x.detach().double().flatten().tolist()
    elif isinstance(x, (int, float)):
        x = [x]
    return [float(v) for v in torch.as_tensor(list(x), dtype=torch.float64).flatten()]


def _picture(ax) -> dict:
    """What an axes shows, as comparable data."""
    legend = ax.get_legend()
    visible_x = ax.get_xaxis().get_visible()
    return {
        "lines": [
            (
                _num(line.get_xdata()),
                _num(line.get_ydata()),
                None if line.get_label().startswith("_") else line.get_label(),
            )
            for line in ax.get_lines()
        ],
        "hlines": sorted(
            (float(seg[0][1]), float(seg[0][0]), float(seg[1][0]))
            for coll in ax.collections
            for seg in coll.get_segments()
        ),
        "texts": [(t.get_text(), _num(t.get_position())) for t in ax.texts],
        "ylim": _num(ax.get_ylim()),
        "xlim": _num(ax.get_xlim()),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "x_visible": visible_x,
        "xticks": _num(ax.get_xticks()) if visible_x else None,
        "legend": None if legend is None else [t.get_text() for t in legend.get_texts()],
    }


def _same_picture(ours, theirs, *, but: tuple[str, ...] = ()) -> None:
    """The same picture, except for the items named in ``but``."""
    (_, ours_ax), (_, theirs_ax) = ours, theirs
    mine, other = _picture(ours_ax), _picture(theirs_ax)
    assert _close({k: v for k, v in mine.items() if k not in but}, {k: v for k, v in other.items() if k not in but})


def _close(a, b) -> bool:
    """Equal, numbers within 1e-4 (the two packages' float32 sums may differ in the last bits: R2Score gives
    -6.49999 here and -6.50003 there). Fails with both pictures shown."""

    def walk(x, y) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(walk(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(walk(u, v) for u, v in zip(x, y))
        if isinstance(x, float) and isinstance(y, float):
            return x == pytest.approx(y, abs=1e-4)
        return x == y

    assert walk(a, b), f"ours:   {a}\ntheirs: {b}"
    return True


def _epochs(tracker, batches) -> None:
    for preds, target in batches:
        tracker.increment()
        tracker.update(preds, target)


_REG_BATCHES = [
    (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.5, 2.0, 2.0])),
    (torch.tensor([0.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 3.0])),
    (torch.tensor([1.0, 2.0, 3.5]), torch.tensor([1.0, 2.0, 3.0])),
    (torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 3.0])),
]


@pytest.mark.parametrize("epochs", [3, 4])
def test_tracker_plot_draws_every_epoch_like_torchmetrics(epochs: int) -> None:
    from torchmetrics_diff import MeanSquaredError
    from torchmetrics_diff.wrappers import MetricTracker

    ours, theirs = MetricTracker(MeanSquaredError()), tm.wrappers.MetricTracker(tm.MeanSquaredError())
    for tracker in (ours, theirs):
        _epochs(tracker, _REG_BATCHES[:epochs])
    picture = _picture(ours.plot()[1])
    assert [ys for _xs, ys, _label in picture["lines"]] == [_num(v) for v in ours.compute_all()]  # one per epoch
    _same_picture(ours.plot(), theirs.plot())


@pytest.mark.parametrize("epochs", [1, 3])
def test_tracker_of_a_collection_plot_draws_every_epoch_per_key_like_torchmetrics(epochs: int) -> None:
    from torchmetrics_diff import MeanAbsoluteError, MeanSquaredError, MetricCollection
    from torchmetrics_diff.wrappers import MetricTracker

    ours = MetricTracker(MetricCollection({"mae": MeanAbsoluteError(), "mse": MeanSquaredError()}))
    theirs = tm.wrappers.MetricTracker(
        tm.MetricCollection({"mae": tm.MeanAbsoluteError(), "mse": tm.MeanSquaredError()})
    )
    for tracker in (ours, theirs):
        _epochs(tracker, _REG_BATCHES[:epochs])
    picture = _picture(ours.plot()[1])
    assert picture["legend"] == ["mae", "mse"]
    if epochs > 1:
        assert [ys for _xs, ys, _label in picture["lines"]] == [_num(v) for v in ours.compute_all().values()]
    _same_picture(ours.plot(), theirs.plot())


@pytest.mark.parametrize(
    ("ours_cls", "theirs_cls", "args"),
    [
        ("MeanSquaredError", "MeanSquaredError", {}),  # lower bound 0, lower is better: the optimal value at 0
        ("PearsonCorrCoef", "PearsonCorrCoef", {}),  # bounds -1 and 1, higher is better
        ("R2Score", "R2Score", {}),  # an upper bound only
        ("ExplainedVariance", "ExplainedVariance", {}),
    ],
)
@pytest.mark.parametrize("steps", [1, 3])
def test_scalar_regression_plot_bounds_and_optimal_value_like_torchmetrics(ours_cls, theirs_cls, args, steps) -> None:
    import torchmetrics_diff

    ours, theirs = getattr(torchmetrics_diff, ours_cls)(**args), getattr(tm, theirs_cls)(**args)
    ours_vals, theirs_vals = [], []
    for preds, target in _REG_BATCHES[:steps]:
        ours_vals.append(ours(preds, target))
        theirs_vals.append(theirs(preds, target))
    _same_picture(ours.plot(), theirs.plot())  # a single value: compute()
    _same_picture(ours.plot(ours_vals), theirs.plot(theirs_vals))  # a sequence of values


def test_scalar_plot_shows_bounds_and_optimal_value() -> None:
    from torchmetrics_diff import Accuracy

    metric = Accuracy(task="binary")
    metric.update(torch.tensor([1, 0, 1, 1]), torch.tensor([1, 1, 1, 0]))
    picture = _picture(metric.plot()[1])
    assert [y for y, _x0, _x1 in picture["hlines"]] == [0.0, 1.0]
    assert picture["ylim"] == [-0.1, 1.1]
    assert picture["texts"][0][0] == "Optimal \n value" and picture["texts"][0][1][1] == 1.0
    assert picture["ylabel"] == "BinaryAccuracy"


_CLS = {
    "binary": (torch.tensor([0.9, 0.2, 0.7, 0.4, 0.6]), torch.tensor([1, 0, 0, 1, 1]), {}),
    "multiclass": (torch.tensor([0, 2, 1, 2, 2, 1]), torch.tensor([0, 1, 1, 2, 0, 1]), {"num_classes": 3}),
    "multilabel": (
        torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0]]),
        torch.tensor([[1, 0, 0], [0, 1, 1], [1, 1, 0]]),
        {"num_labels": 3},
    ),
}


@pytest.mark.parametrize("name", ["Accuracy", "F1Score", "Precision", "Recall", "Specificity"])
@pytest.mark.parametrize("task", ["binary", "multiclass", "multilabel"])
@pytest.mark.parametrize("average", ["macro", None])
def test_classification_plot_single_and_multi_value_like_torchmetrics(name, task, average) -> None:
    import torchmetrics_diff

    preds, target, kwargs = _CLS[task]
    if task != "binary":
        kwargs = {**kwargs, "average": average}
    elif average is None:
        pytest.skip("binary has no average")
    ours, theirs = getattr(torchmetrics_diff, name)(task=task, **kwargs), getattr(tm, name)(task=task, **kwargs)
    ours_vals = [ours(preds[: 3 + i], target[: 3 + i]) for i in range(3)]
    theirs_vals = [theirs(preds[: 3 + i], target[: 3 + i]) for i in range(3)]
    # torchmetrics' specificity sets no higher_is_better; ours is True, so ours marks the optimal value at 1 (and
    # widens the x-range for it): the rest of the picture is the same
    but = ("texts", "xlim") if name == "Specificity" else ()
    _same_picture(ours.plot(), theirs.plot(), but=but)  # a scalar or one value per class / label ("Class i")
    _same_picture(ours.plot(ours_vals), theirs.plot(theirs_vals), but=but)
    if but:
        assert _picture(ours.plot()[1])["texts"][0][0] == "Optimal \n value"


def test_collection_plot_like_torchmetrics() -> None:
    from torchmetrics_diff import MeanAbsoluteError, MeanSquaredError, MetricCollection

    ours = MetricCollection({"mae": MeanAbsoluteError(), "mse": MeanSquaredError()})
    theirs = tm.MetricCollection({"mae": tm.MeanAbsoluteError(), "mse": tm.MeanSquaredError()})
    ours_vals = [ours(p, t) for p, t in _REG_BATCHES]
    theirs_vals = [theirs(p, t) for p, t in _REG_BATCHES]
    # the y label drawn together: see the xfail test below
    _same_picture(ours.plot(together=True), theirs.plot(together=True), but=("ylabel",))
    _same_picture(ours.plot(ours_vals, together=True), theirs.plot(theirs_vals, together=True), but=("ylabel",))
    for mine, other in zip(ours.plot(), theirs.plot()):
        _same_picture(mine, other)
    for mine, other in zip(ours.plot(ours_vals), theirs.plot(theirs_vals)):
        _same_picture(mine, other)


@pytest.mark.xfail(
    strict=True,
    reason="MetricCollection.plot(together=True) labels the y axis 'MetricCollection', torchmetrics leaves it empty; "
    "the fix (name=None in collections.py) waits for the refactoring of that module",
)
def test_collection_plot_together_has_no_y_label_like_torchmetrics() -> None:
    from torchmetrics_diff import MeanAbsoluteError, MeanSquaredError, MetricCollection

    ours = MetricCollection({"mae": MeanAbsoluteError(), "mse": MeanSquaredError()})
    ours.update(*_REG_BATCHES[0])
    assert ours.plot(together=True)[1].get_ylabel() == ""


def _wrapped_pairs():
    from torchmetrics_diff import MeanSquaredError
    from torchmetrics_diff.classification import MulticlassAccuracy
    from torchmetrics_diff.wrappers import ClasswiseWrapper, MinMaxMetric, Running

    # (the task class on both sides: ClasswiseWrapper's keys start with the inner class's name, which is
    # `accuracy_` for our `Accuracy(task=...)` and `multiclassaccuracy_` for torchmetrics')
    return {
        "minmax": (MinMaxMetric(MeanSquaredError()), tm.wrappers.MinMaxMetric(tm.MeanSquaredError()), "reg"),
        "running": (Running(MeanSquaredError(), window=2), tm.wrappers.Running(tm.MeanSquaredError(), window=2), "reg"),
        "classwise": (
            ClasswiseWrapper(MulticlassAccuracy(num_classes=3, average=None), labels=["a", "b", "c"]),
            tm.wrappers.ClasswiseWrapper(
                tm.classification.MulticlassAccuracy(num_classes=3, average=None), labels=["a", "b", "c"]
            ),
            "multiclass",
        ),
    }


@pytest.mark.parametrize("which", ["minmax", "running", "classwise"])
def test_wrapper_plot_like_torchmetrics(which: str) -> None:
    ours, theirs, data = _wrapped_pairs()[which]
    batches = _REG_BATCHES if data == "reg" else [(_CLS[data][0][: 3 + i], _CLS[data][1][: 3 + i]) for i in range(3)]
    ours_vals = [ours(p, t) for p, t in batches]  # a sequence: each batch's value
    theirs_vals = [theirs(p, t) for p, t in batches]
    _same_picture(ours.plot(ours_vals), theirs.plot(theirs_vals))
    # a single value: compute() after update() (torchmetrics' MinMaxMetric.forward leaves compute() at the last
    # batch's value, ours at every batch's: a difference of values, not of pictures)
    ours, theirs, _ = _wrapped_pairs()[which]
    for metric in (ours, theirs):
        for p, t in batches:
            metric.update(p, t)
    _same_picture(ours.plot(), theirs.plot())


def test_multitask_plot_one_figure_per_task_like_torchmetrics() -> None:
    from torchmetrics_diff import Accuracy, MeanSquaredError
    from torchmetrics_diff.wrappers import MultitaskWrapper

    ours = MultitaskWrapper({"cls": Accuracy(task="binary"), "reg": MeanSquaredError()})
    theirs = tm.wrappers.MultitaskWrapper({"cls": tm.Accuracy(task="binary"), "reg": tm.MeanSquaredError()})
    preds = {"cls": torch.tensor([1, 0, 1]), "reg": torch.tensor([1.0, 2.0])}
    target = {"cls": torch.tensor([1, 1, 1]), "reg": torch.tensor([1.0, 4.0])}
    ours_vals = [ours(preds, target) for _ in range(3)]
    theirs_vals = [theirs(preds, target) for _ in range(3)]
    for val_ours, val_theirs in ((None, None), (ours_vals, theirs_vals)):
        mine, other = ours.plot(val_ours), theirs.plot(val_theirs)
        assert len(mine) == len(other) == 2
        for a, b in zip(mine, other):
            _same_picture(a, b)


@pytest.mark.parametrize(
    ("val", "match"),
    [
        ([], "at least one value"),
        ([{"a": torch.tensor(1.0)}, torch.tensor(2.0)], "dicts only or tensors"),
        ([torch.tensor(1.0), torch.tensor([1.0, 2.0])], "same keys and shapes"),
        ([{"a": torch.tensor(1.0)}, {"b": torch.tensor(1.0)}], "same keys and shapes"),
    ],
)
def test_a_sequence_that_cannot_be_drawn_is_a_value_error(val, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MeanMetric().plot(val)
