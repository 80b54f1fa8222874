"""The wrappers in one process: argument errors that name the argument, the expected and the actual;
``MetricTracker.compute_all`` reusing a finished epoch's value only while it is still that epoch's value;
``state_dict`` round trips; the all-or-nothing ``update``.

Package modules covered: ``wrappers`` (every wrapper, ``_base``'s update and state handling).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests._helpers.seeds import F64, rand
from torchmetrics_diff import Accuracy, MeanMetric, MeanSquaredError, SumMetric
from torchmetrics_diff.wrappers import (
    BootStrapper,
    ClasswiseWrapper,
    MetricTracker,
    MinMaxMetric,
    MultitaskWrapper,
    Running,
)


def _mse() -> MeanSquaredError:
    return MeanSquaredError().set_dtype(F64)


class _FullState(SumMetric):
    full_state_update = True


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda: MinMaxMetric(torch.nn.Linear(1, 1)), ValueError, ["base_metric", "Linear"]),
        (lambda: Running(_mse(), window=0), ValueError, ["window", "0"]),
        (lambda: Running(_FullState(), window=2), ValueError, ["full_state_update", "_FullState", "True"]),
        (lambda: BootStrapper(_mse(), num_bootstraps=0), ValueError, ["num_bootstraps", "0"]),
        (lambda: BootStrapper(_mse(), sampling_strategy="x"), ValueError, ["sampling_strategy", "poisson", "'x'"]),
        (lambda: BootStrapper(_mse(), generator="seed"), ValueError, ["generator", "'seed'"]),
        (lambda: ClasswiseWrapper(_mse(), labels="abc"), ValueError, ["labels", "'abc'"]),
        (lambda: ClasswiseWrapper(_mse(), prefix=1), ValueError, ["prefix", "int"]),
        (lambda: MultitaskWrapper([_mse()]), TypeError, ["task_metrics", "list"]),
        (lambda: MultitaskWrapper({"a": 1}), TypeError, ["task_metrics['a']", "int"]),
        (lambda: MetricTracker(1), TypeError, ["metric", "int"]),
        (lambda: MetricTracker(_mse(), maximize=[True]), ValueError, ["maximize", "single bool"]),
        (lambda: MetricTracker(MeanMetric()), AttributeError, ["higher_is_better", "maximize"]),
        (lambda: MetricTracker(_mse()).update(torch.ones(1), torch.ones(1)), ValueError, ["update", "increment"]),
        (
            lambda: MultitaskWrapper({"a": _mse()}).update({"b": torch.ones(1)}, {"a": torch.ones(1)}),
            ValueError,
            ["task_preds", "['a']", "['b']"],
        ),
        (
            lambda: MinMaxMetric(MeanSquaredError(num_outputs=2))(torch.ones(2, 2), torch.zeros(2, 2)),
            RuntimeError,
            ["scalar", "(2,)"],
        ),
    ],
)
def test_errors_name_the_argument(build: Callable[[], Any], error: type, words: list[str]) -> None:
    with pytest.raises(error) as info:
        build()
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, f"{str(info.value)!r} lacks {missing}"


def test_compute_all_reuses_an_epoch_only_while_it_is_unchanged() -> None:
    """Three epochs, then more rows for epoch 1 and a reset of the latest: compute_all equals each epoch's MSE
    written out (float64) every time."""
    tracker = MetricTracker(_mse())
    data = {e: (rand((5,), "tracker", e), rand((5,), "tracker target", e)) for e in range(4)}
    rows: dict[int, list[int]] = {}
    for epoch in range(3):
        tracker.increment()
        tracker.update(*data[epoch])
        rows[epoch] = [epoch]
        tracker.compute_all()

    def expected() -> torch.Tensor:
        return torch.stack([torch.cat([(data[d][0] - data[d][1]) ** 2 for d in rows[e]]).mean() for e in range(3)])

    torch.testing.assert_close(tracker.compute_all(), expected(), rtol=1e-12, atol=1e-12)
    tracker[2].update(*data[3])  # an earlier epoch changes: its kept value no longer holds
    rows[1] = [1, 3]
    torch.testing.assert_close(tracker.compute_all(), expected(), rtol=1e-12, atol=1e-12)
    tracker.reset()  # the latest epoch starts over
    tracker.update(*data[0])
    rows[2] = [0]
    torch.testing.assert_close(tracker.compute_all(), expected(), rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:.*called before update")  # (the update count is not part of a state_dict)
def test_state_dict_round_trip() -> None:
    """With persistent states, a fresh wrapper loaded from the state_dict computes the same value."""
    preds, target = torch.tensor([0, 1, 2, 2, 1]), torch.tensor([0, 1, 1, 2, 2])

    def make() -> Any:
        return ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None))

    first, second = make(), make()
    first.persistent(True)
    second.persistent(True)
    first.update(preds, target)
    second.load_state_dict(first.state_dict())
    assert sorted(first.state_dict()) == sorted(f"metric.{k}" for k in first.metric.state_dict())
    torch.testing.assert_close(second.compute(), first.compute())


def test_a_failing_update_changes_no_copy() -> None:
    """A batch whose arguments disagree in rows is refused, naming the sizes, and leaves every copy and the count
    as they were; so does a batch one copy's update refuses."""
    boot = BootStrapper(_mse(), num_bootstraps=3, generator=0)
    boot.update(torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64))
    before = [m.metric_state for m in boot.metrics]
    with pytest.raises(ValueError, match=r"same number of rows; got \[4, 3\]"):
        boot.update(torch.ones(4, dtype=F64), torch.zeros(3, dtype=F64))
    after = [m.metric_state for m in boot.metrics]
    assert boot.update_count == 1
    for b, a in zip(before, after):
        for name in b:
            torch.testing.assert_close(a[name], b[name])
    with pytest.raises((RuntimeError, ValueError)):  # the copies' own check: 2-D targets against 1-D predictions
        boot.update(torch.ones(4, dtype=F64), torch.zeros(4, 2, dtype=F64))
    assert boot.update_count == 1
    for b, m in zip(before, boot.metrics):
        for name in b:
            torch.testing.assert_close(m.metric_state[name], b[name])
