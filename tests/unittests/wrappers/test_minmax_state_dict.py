"""``MinMaxMetric`` saves its bounds (``min_val``, ``max_val``) in ``state_dict`` and loads them back.

torchmetrics 1.9 keeps the bounds as plain attributes, lost with a checkpoint; its main branch saves them. A state
dict saved without them (by an older version of this package) still loads, ``strict`` or not.
"""

from __future__ import annotations

import io

import pytest
import torch

from torchmetrics_diff import MeanSquaredError, MetricCollection
from torchmetrics_diff.wrappers import MinMaxMetric

_BATCHES = [
    (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.5, 2.0, 2.0])),
    (torch.tensor([0.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 3.0])),
    (torch.tensor([1.0, 2.0, 3.5]), torch.tensor([1.0, 2.0, 3.0])),
]


# a loaded metric's update count is 0 (it is not in state_dict, as in torchmetrics): compute() warns
_LOADED = pytest.mark.filterwarnings("ignore:.*compute\\(\\) was called before update")


def _trained(persistent: bool) -> MinMaxMetric:
    metric = MinMaxMetric(MeanSquaredError())
    metric.persistent(persistent)
    for preds, target in _BATCHES:
        metric(preds, target)  # each batch's value moves the bounds
    return metric


def _reload(state: dict) -> dict:
    """Through torch.save / torch.load (weights only), as a checkpoint goes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_holds_the_bounds() -> None:
    metric = _trained(persistent=False)
    state = metric.state_dict()
    assert set(state) == {"min_val", "max_val"}  # the inner metric's states are not persistent by default
    assert state["min_val"].item() == pytest.approx(1 / 12)
    assert state["max_val"].item() == pytest.approx(2 / 3)


@_LOADED
def test_round_trip_restores_compute() -> None:
    """Saved after some updates, loaded into a new wrapper: the same ``compute()``, bounds included."""
    metric = _trained(persistent=True)
    fresh = MinMaxMetric(MeanSquaredError())
    fresh.persistent(True)
    fresh.load_state_dict(_reload(metric.state_dict()))
    expected, got = metric.compute(), fresh.compute()
    assert got.keys() == expected.keys() == {"raw", "max", "min"}
    for key in expected:
        assert got[key].item() == pytest.approx(expected[key].item()), key
    # and they keep moving from there
    for m in (metric, fresh):
        m(torch.tensor([0.0]), torch.tensor([3.0]))
    assert fresh.compute()["max"].item() == pytest.approx(metric.compute()["max"].item()) == 9.0


def test_round_trip_without_persistent_states_restores_the_bounds() -> None:
    metric = _trained(persistent=False)
    fresh = MinMaxMetric(MeanSquaredError())
    fresh.load_state_dict(_reload(metric.state_dict()))
    assert fresh.min_val.item() == pytest.approx(metric.min_val.item())
    assert fresh.max_val.item() == pytest.approx(metric.max_val.item())


def test_bounds_travel_inside_a_collection() -> None:
    coll = MetricCollection({"mm": MinMaxMetric(MeanSquaredError())})
    for preds, target in _BATCHES:
        coll(preds, target)
    state = coll.state_dict()
    assert {"mm.min_val", "mm.max_val"} <= set(state)
    fresh = MetricCollection({"mm": MinMaxMetric(MeanSquaredError())})
    fresh.load_state_dict(state)
    assert fresh["mm"].max_val.item() == pytest.approx(2 / 3)


@_LOADED
@pytest.mark.parametrize("strict", [True, False])
def test_old_state_dict_without_bounds_still_loads(strict: bool) -> None:
    """No ``min_val``/``max_val`` in it: loads (no missing key, even ``strict``); the bounds keep the new wrapper's
    ``inf`` and ``-inf`` and restart from the next value."""
    metric = _trained(persistent=True)
    old = {k: v for k, v in metric.state_dict().items() if k not in ("min_val", "max_val")}
    fresh = MinMaxMetric(MeanSquaredError())
    fresh.persistent(True)
    result = fresh.load_state_dict(old, strict=strict)
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    assert fresh.min_val.item() == float("inf") and fresh.max_val.item() == float("-inf")
    value = fresh.compute()  # the inner states did load: the bounds restart from this value
    assert value["raw"].item() == pytest.approx(metric.compute()["raw"].item())
    assert value["min"].item() == value["max"].item() == pytest.approx(value["raw"].item())


def test_a_bad_bound_in_the_state_dict_is_an_error() -> None:
    state = _trained(persistent=False).state_dict()
    state["max_val"] = torch.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="max_val: expected a one-element tensor"):
        MinMaxMetric(MeanSquaredError()).load_state_dict(state)


def test_reset_still_resets_the_bounds() -> None:
    metric = _trained(persistent=False)
    metric.reset()
    assert metric.state_dict()["min_val"].item() == float("inf")
