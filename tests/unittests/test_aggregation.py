"""``torchmetrics_diff.aggregation``: Sum/Mean/Cat/Min/Max against numpy, their ``nan_strategy``, MeanMetric's
weights, Min/Max gradients from the ±inf defaults (one process). The operators on metrics are in
``test_composition.py``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from tests._helpers.seeds import F64, rand
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric

AGGREGATORS = {
    "sum": (SumMetric, np.sum),
    "mean": (MeanMetric, np.mean),
    "cat": (CatMetric, lambda a: a),
    "min": (MinMetric, np.min),
    "max": (MaxMetric, np.max),
}


def _batches(tag: str) -> list[torch.Tensor]:
    """Batches of different shapes (2-D, 1-D, 0-d, a Python float), float32."""
    return [
        rand((3, 4), tag, 0, dtype=torch.float32),
        rand((5,), tag, 1, dtype=torch.float32),
        rand((), tag, 2, dtype=torch.float32),
        float(rand((), tag, 3)),
    ]


def _flat(batches: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(b, dtype=np.float64).reshape(-1) for b in batches])


@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_aggregator_matches_numpy(name: str) -> None:
    cls, ref = AGGREGATORS[name]
    batches = _batches(name)
    if name == "cat":  # CatMetric keeps rows: 12 rows of shape (), like the other batches (test_cat_rows.py)
        batches[0] = batches[0].reshape(-1)
    metric = cls()
    for b in batches[:2]:
        metric.update(b)
    batch_value = metric(batches[2])
    np.testing.assert_allclose(batch_value.numpy(), ref(_flat(batches[2:3])), rtol=1e-6, err_msg=f"{name} forward")
    metric.update(batches[3])
    np.testing.assert_allclose(metric.compute().numpy(), ref(_flat(batches)), rtol=1e-6, err_msg=f"{name} compute")
    assert metric.compute().dtype == torch.float32


# --------------------------------------------------------------------------------------------- nan_strategy

NAN_DATA = [1.0, float("nan"), 4.0, -2.0]
CLEAN = [1.0, 4.0, -2.0]
REPLACED = [1.0, 0.5, 4.0, -2.0]


@pytest.mark.parametrize("name", list(AGGREGATORS))
@pytest.mark.parametrize("strategy", ["error", "warn", "ignore", "disable", 0.5])
def test_nan_strategy(name: str, strategy: Any) -> None:
    cls, ref = AGGREGATORS[name]
    metric = cls(nan_strategy=strategy)
    data = torch.tensor(NAN_DATA)
    case = f"{name} nan_strategy={strategy!r}"
    if strategy == "error":
        with pytest.raises(RuntimeError, match="NaN"):
            metric.update(data)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.update(data)
        value = metric.compute().numpy()  # "warn" reports the NaNs here (CatMetric: in update)
    nan_warnings = [w for w in caught if "NaN" in str(w.message)]
    assert bool(nan_warnings) == (strategy == "warn"), f"{case}: warnings {[str(w.message) for w in caught]}"
    if strategy == "disable":
        expected = np.asarray(NAN_DATA) if name == "cat" else np.asarray(np.nan)
        np.testing.assert_array_equal(np.isnan(value), np.isnan(expected), err_msg=case)
        return
    expected = ref(np.asarray(REPLACED if isinstance(strategy, float) else CLEAN))
    np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=case)


def test_bad_nan_strategy() -> None:
    with pytest.raises(ValueError, match="nan_strategy"):
        SumMetric(nan_strategy="drop")


def test_mean_nan_drops_its_weight() -> None:
    m = MeanMetric(nan_strategy="ignore")
    m.update(torch.tensor([1.0, float("nan"), 3.0]), weight=torch.tensor([1.0, 5.0, 2.0]))
    assert m.compute().item() == pytest.approx((1 * 1 + 3 * 2) / 3)


# ------------------------------------------------------------------------------------------ MeanMetric weight


def test_mean_weight_broadcasting_and_mask() -> None:
    value = rand((2, 3), "weights", dtype=torch.float32)
    v = value.numpy().astype(np.float64)
    row_w = torch.tensor([1.0, 2.0, 0.5])
    cases: dict[str, tuple[Any, np.ndarray]] = {
        "scalar weight": (2.0, np.full((2, 3), 2.0)),
        "0-d tensor weight": (torch.tensor(3.0), np.full((2, 3), 3.0)),
        "row weight broadcast over rows": (row_w, np.broadcast_to(row_w.numpy(), (2, 3))),
        "column weight (2, 1)": (torch.tensor([[1.0], [4.0]]), np.array([[1.0] * 3, [4.0] * 3])),
        "bool mask": (
            torch.tensor([[True, False, True], [False, True, True]]),
            np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]),
        ),
    }
    for case, (weight, w) in cases.items():
        m = MeanMetric()
        m.update(value, weight=weight)
        np.testing.assert_allclose(m.compute().numpy(), (v * w).sum() / w.sum(), rtol=1e-6, err_msg=case)
    m = MeanMetric()
    m.update(value, weight=torch.zeros(2, 3))
    assert torch.isnan(m.compute()), "all-zero weights give NaN (0/0)"


@pytest.mark.parametrize("bad", [torch.ones(4), torch.ones(3, 2), torch.ones(2, 2, 3)])
def test_mean_bad_weight_shape_raises(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="`weight`"):
        MeanMetric().update(torch.ones(2, 3), weight=bad)


def test_mean_float64_loss_keeps_float64_in_forward() -> None:
    x = torch.tensor([1.0, 2.0, 4.0], dtype=F64, requires_grad=True)
    out = MeanMetric()(x, weight=torch.tensor([True, True, False]))
    assert out.dtype == F64 and out.item() == 1.5
    out.backward()
    assert x.grad.tolist() == [0.5, 0.5, 0.0]


# ------------------------------------------------------------------------------- min/max gradients, ±inf


@pytest.mark.parametrize("cls", [MinMetric, MaxMetric])
def test_min_max_gradient_from_infinite_default_has_no_nan(cls: type) -> None:
    x = torch.tensor([0.3, -1.2, 2.5, 0.0], dtype=F64, requires_grad=True)
    value = cls()(x)
    value.backward()
    pick = int(torch.argmax(x) if cls is MaxMetric else torch.argmin(x))
    expected = torch.zeros(4, dtype=F64)
    expected[pick] = 1.0
    assert torch.isfinite(x.grad).all(), f"{cls.__name__}: gradient {x.grad}"
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)
    assert value.item() == x[pick].item()


@pytest.mark.parametrize("cls", [SumMetric, MeanMetric, MinMetric, MaxMetric])
def test_nan_warn_is_reported_at_compute_or_reset(cls: type) -> None:
    """``nan_strategy="warn"`` counts NaNs on the device (no host read per update, none in ``forward``) and warns
    once, with the count, at the next ``compute()`` or ``reset()``; the values are those of the NaNs dropped."""
    metric = cls()
    nan = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch_value = metric(torch.tensor([1.0, nan, 3.0]))
        metric.update(torch.tensor([nan, 5.0]))
        assert not caught, [str(w.message) for w in caught]
        value = metric.compute()
        assert len(caught) == 1 and "2 NaN" in str(caught[0].message), [str(w.message) for w in caught]
        metric.compute()  # nothing new since
        assert len(caught) == 1
        metric.update(torch.tensor([nan]))
        metric.reset()
        assert len(caught) == 2 and "1 NaN" in str(caught[1].message), [str(w.message) for w in caught]
    expected_batch = {SumMetric: 4.0, MeanMetric: 2.0, MinMetric: 1.0, MaxMetric: 3.0}[cls]
    expected = {SumMetric: 9.0, MeanMetric: 3.0, MinMetric: 1.0, MaxMetric: 5.0}[cls]
    assert batch_value.item() == expected_batch and value.item() == expected


@pytest.mark.parametrize("cls", [SumMetric, MeanMetric])
def test_nan_warn_count_is_exact_over_many_steps_and_large_batches(cls: type) -> None:
    """``"warn"`` counts exactly, on the device: over hundreds of ``forward``/``update`` steps, and in a float64
    metric fed a batch of more than 2**24 values (more than a float32 count holds exactly); a mean's weight is the
    number of values kept. The expected count is the NaNs put in, counted here."""
    rows = torch.arange(1000, dtype=torch.float32)
    rows[::7] = float("nan")
    per_batch = int(torch.isnan(rows).sum())  # 143
    metric = cls()
    steps = 700
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            metric(rows) if step % 2 else metric.update(rows)
        value = metric.compute()
    assert [str(w.message).split(" NaN")[0] for w in caught] == [f"{cls.__name__}: {per_batch * steps}"]
    clean = rows[~torch.isnan(rows)].double()
    expected = clean.mean() if cls is MeanMetric else clean.sum() * steps
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=0)  # (float32 states, 700 adds)
    if cls is MeanMetric:
        assert metric.weight.item() == (1000 - per_batch) * steps  # exact in float32: 598,500 < 2**24

    metric = cls().set_dtype(torch.float64)
    big = torch.ones(2**24 + 3)
    big[:5] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.update(big)
        metric(rows)
        metric.compute()
    assert [str(w.message).split(" NaN")[0] for w in caught] == [f"{cls.__name__}: {5 + per_batch}"]
    if cls is MeanMetric:
        assert metric.weight.dtype == torch.float64 and metric.weight.item() == 2**24 + 3 - 5 + 1000 - per_batch
