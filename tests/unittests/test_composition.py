"""``torchmetrics_diff.composition``: the operators on metrics that build a ``CompositionalMetric``, its forward,
update and reset, and its rollback when a member raises (one process)."""

from __future__ import annotations

import operator
from typing import Any, Callable

import pytest
import torch

from tests._helpers.metrics import VectorSum
from tests._helpers.outcomes import differences, snapshot
from torchmetrics_diff import CompositionalMetric, MeanMetric, SumMetric


def _sum_of(values: list[float]) -> SumMetric:
    m = SumMetric()
    m.update(torch.tensor(values))
    return m


def test_unary_operators() -> None:
    m = _sum_of([1.0, -4.0])  # -3
    assert +m is m, "+metric is the metric itself"
    for op, expected in ((lambda a: -a, 3.0), (abs, 3.0)):
        comp = op(m)
        assert isinstance(comp, CompositionalMetric)
        assert comp.compute().item() == expected
    flag = SumMetric()
    flag.update(torch.tensor([1.0]))
    assert (~(flag > 0)).compute().item() is False


def test_binary_operators_with_scalars_and_tensors_on_both_sides() -> None:
    m = _sum_of([1.0, 2.0])  # 3
    t = torch.tensor([2.0, 6.0])
    v = 3.0
    cases: dict[str, tuple[Callable[[], Any], Any]] = {
        "m + 2": (lambda: m + 2, v + 2),
        "2 + m": (lambda: 2 + m, 2 + v),
        "2 - m": (lambda: 2 - m, 2 - v),
        "m - t": (lambda: m - t, v - t),
        "t - m": (lambda: t - m, t - v),
        "m * t": (lambda: m * t, v * t),
        "t * m": (lambda: t * m, t * v),
        "m / t": (lambda: m / t, v / t),
        "6 / m": (lambda: 6 / m, 6 / v),
        "m // 2": (lambda: m // 2, v // 2),
        "7 // m": (lambda: 7 // m, 7 // v),
        "m % 2": (lambda: m % 2, v % 2),
        "m ** 2": (lambda: m**2, v**2),
        "2 ** m": (lambda: 2**m, 2**v),
        "m + m": (lambda: m + m, v + v),
        "m * (m - 1)": (lambda: m * (m - 1), v * (v - 1)),
    }
    for case, (build, expected) in cases.items():
        comp = build()
        assert isinstance(comp, CompositionalMetric), f"{case}: {type(comp).__name__}"
        torch.testing.assert_close(comp.compute(), torch.as_tensor(expected, dtype=torch.float32), msg=case)


def test_matmul_with_vector_state() -> None:
    m = VectorSum()
    m.update(torch.tensor([1.0, 2.0, 3.0]))
    w = torch.tensor([1.0, 0.5, -1.0])
    assert (m @ w).compute().item() == 1.0 + 1.0 - 3.0
    assert (w @ m).compute().item() == 1.0 + 1.0 - 3.0
    other = VectorSum()
    other.update(torch.tensor([2.0, 0.0, 1.0]))
    assert (m @ other).compute().item() == 2.0 + 0.0 + 3.0


def test_comparisons_return_bool_tensors() -> None:
    m = _sum_of([1.0, 2.0])  # 3
    t = torch.tensor([1.0, 3.0, 5.0])
    cases = {
        "m == 3": (m == 3, torch.tensor(True)),
        "m != 3": (m != 3, torch.tensor(False)),
        "m < t": (m < t, torch.tensor([False, False, True])),
        "m <= t": (m <= t, torch.tensor([False, True, True])),
        "m > 2.5": (m > 2.5, torch.tensor(True)),
        "m >= t": (m >= t, torch.tensor([True, True, False])),
        "t > m": (t > m, torch.tensor([False, False, True])),
        "2 < m (reflected)": (operator.lt(2, m), torch.tensor(True)),
    }
    for case, (comp, expected) in cases.items():
        assert isinstance(comp, CompositionalMetric), f"{case}: {type(comp).__name__}"
        out = comp.compute()
        assert out.dtype == torch.bool and torch.equal(out, expected), f"{case}: {out}"
    assert m in {m}, "metrics stay hashable"


def test_composition_forward_update_reset() -> None:
    a, b = SumMetric(), MeanMetric()
    comp = 2 - a * b
    x = torch.tensor([1.0, 3.0])
    assert comp(x).item() == 2 - 4.0 * 2.0, "forward composes the batch values"
    comp.update(torch.tensor([5.0]))
    assert comp.compute().item() == 2 - 9.0 * 3.0
    assert comp.update_count == 2
    comp.reset()
    assert a.update_count == 0 and b.update_count == 0
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (a * b)(x).backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.5 + 3.0 / 2, 1.5 + 3.0 / 2]))


@pytest.mark.filterwarnings("ignore:SumMetric. NaN")
@pytest.mark.parametrize("how", ["update", "forward"])
def test_composition_that_raises_in_one_member_leaves_every_member_untouched(how: str) -> None:
    total, mean = SumMetric(), MeanMetric(nan_strategy="error")
    composed = total + mean
    composed.update(torch.tensor([1.0, 2.0]))
    before = {"total": snapshot(total), "mean": snapshot(mean)}
    call = composed.update if how == "update" else composed
    with pytest.raises(RuntimeError, match="NaN"):
        call(torch.tensor([4.0, float("nan")]))
    problems = [f"total: {d}" for d in differences(before["total"], total)]
    problems += [f"mean: {d}" for d in differences(before["mean"], mean)]
    assert not problems, problems
