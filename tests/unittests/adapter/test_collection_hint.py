"""A torchmetrics metric put into this package's ``MetricCollection`` or a wrapper is refused with the way in:
``Synced``.

Package modules covered: ``collections``, ``wrappers``.
"""

from __future__ import annotations

import pytest
import torch
import torchmetrics

from torchmetrics_diff import MeanMetric, MetricCollection
from torchmetrics_diff.wrappers import (
    BootStrapper,
    ClasswiseWrapper,
    MetricTracker,
    MinMaxMetric,
    MultitaskWrapper,
    Running,
    Synced,
)


def test_a_torchmetrics_member_is_refused_naming_synced() -> None:
    with pytest.raises(ValueError, match=r"got MeanMetric \(a torchmetrics metric: wrap it as `Synced\(metric\)`"):
        MetricCollection([torchmetrics.MeanMetric()])
    collection = MetricCollection([MeanMetric()])
    with pytest.raises(ValueError, match=r"for 'tm' \(a torchmetrics metric: wrap it as `Synced\(metric\)`"):
        collection["tm"] = torchmetrics.SumMetric()


def test_the_hint_is_only_for_torchmetrics_metrics() -> None:
    with pytest.raises(ValueError, match=r"got Linear$"):
        MetricCollection([torch.nn.Linear(2, 2)])


def test_the_hinted_wrapping_joins() -> None:
    collection = MetricCollection({"tm": Synced(torchmetrics.MeanMetric()), "ours": MeanMetric()})
    collection.update(torch.tensor([1.0, 3.0]))
    values = collection.compute()
    assert float(values["tm"]) == float(values["ours"]) == 2.0


@pytest.mark.parametrize(
    "wrap",
    [
        BootStrapper,
        ClasswiseWrapper,
        lambda m: MetricTracker(m, maximize=True),
        MinMaxMetric,
        Running,
        lambda m: MultitaskWrapper({"task": m}),
    ],
    ids=["BootStrapper", "ClasswiseWrapper", "MetricTracker", "MinMaxMetric", "Running", "MultitaskWrapper"],
)
def test_a_wrapper_refuses_a_torchmetrics_metric_naming_synced(wrap: object) -> None:
    with pytest.raises((TypeError, ValueError), match=r"got MeanMetric \(a torchmetrics metric: wrap it as `Synced"):
        wrap(torchmetrics.MeanMetric())  # type: ignore[operator]
    wrap(Synced(torchmetrics.MeanMetric()))  # type: ignore[operator]  # (the hinted wrapping is accepted)
