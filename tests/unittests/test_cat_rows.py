"""``CatMetric`` keeps rows as torchmetrics' does: concatenation along dim 0, in one process and across ranks.

Expectations come from torchmetrics' ``CatMetric`` on the same values (one process) and from ``torch.cat`` of
every rank's rows in rank order (two processes); mismatched row shapes raise, within a process and on every rank.

Package modules covered: ``aggregation`` (``CatMetric``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torchmetrics

from tests._helpers.harness import run_distributed
from torchmetrics_diff import CatMetric

T = torch.tensor
SEQUENCES: dict[str, list[Any]] = {
    "(2,3) then (1,3)": [torch.arange(6.0).reshape(2, 3), T([[6.0, 7.0, 8.0]])],
    "(2,3,4)": [torch.arange(24.0).reshape(2, 3, 4)],
    "0-d then 0-d": [T(1.0), T(2.0)],
    "1-d then 1-d": [T([1.0, 2.0]), T([3.0, 4.0, 5.0])],
    "0-d then 1-d": [T(1.0), T([2.0, 3.0, 4.0])],
    "numbers": [1.0, 2.5],
    "ints": [T([1, 2])],
    "(0,3) then (1,3)": [torch.zeros(0, 3), T([[1.0, 2.0, 3.0]])],
}


@pytest.mark.parametrize("name", list(SEQUENCES))
@pytest.mark.parametrize("how", ["update", "forward"])
def test_rows_match_torchmetrics(name: str, how: str) -> None:
    ours, theirs = CatMetric(), torchmetrics.CatMetric()
    for value in SEQUENCES[name]:
        ours.update(value) if how == "update" else ours(value)
        theirs.update(value)
    got, expected = ours.compute(), theirs.compute()
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)}, torchmetrics {tuple(expected.shape)}"
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_forward_returns_its_batch_rows() -> None:
    metric = CatMetric()
    batch = torch.arange(6.0).reshape(3, 2)
    torch.testing.assert_close(metric(batch), batch, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("first", "second"),
    [(torch.zeros(2, 3), torch.zeros(1, 4)), (torch.zeros(2, 3), torch.zeros(3)), (torch.zeros(3), torch.zeros(2, 3))],
    ids=["width 3 then 4", "rows then a vector", "a vector then rows"],
)
def test_rows_of_another_shape_raise(first: torch.Tensor, second: torch.Tensor) -> None:
    metric = CatMetric()
    metric.update(first)
    with pytest.raises(ValueError, match=r"`value` must have shape") as info:
        metric.update(second)
    assert str(tuple(first.shape[1:])) in str(info.value) and str(tuple(second.shape[1:])) in str(info.value)
    assert len(metric.value) == 1, "the refused update left a trace"
    torch.testing.assert_close(metric.compute(), first)  # the metric still works

    stepped = CatMetric()  # forward folds batches in afterwards: the mismatch is found when computing
    stepped(first)
    stepped(second)
    with pytest.raises(ValueError, match=r"`value` must have shape"):
        stepped.compute()


def test_nan_drops_whole_rows() -> None:
    metric = CatMetric(nan_strategy="ignore")
    metric.update(T([[1.0, float("nan")], [2.0, 3.0], [4.0, 5.0]]))
    torch.testing.assert_close(metric.compute(), T([[2.0, 3.0], [4.0, 5.0]]), rtol=0, atol=0)
    vector = CatMetric(nan_strategy="ignore")
    vector.update(T([1.0, float("nan"), 2.0]))  # a 1-d value: its elements are its rows
    torch.testing.assert_close(vector.compute(), T([1.0, 2.0]), rtol=0, atol=0)
    replaced = CatMetric(nan_strategy=0.0)
    replaced.update(T([[1.0, float("nan")]]))
    torch.testing.assert_close(replaced.compute(), T([[1.0, 0.0]]), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="NaN"):
            CatMetric().update(T([[float("nan"), 1.0]]))


# ------------------------------------------------------------------------------------------- two processes
def _rows(rank: int, n: int, width: int) -> torch.Tensor:
    return torch.arange(float(n * width)).reshape(n, width) + 100 * rank


def _uneven_on_rank(rank: int, world: int, counts: list[int], width: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for how in ("update", "forward"):
        metric = CatMetric(dist_sync_on_step=how == "forward")
        step = None
        if counts[rank]:
            if how == "update":
                metric.update(_rows(rank, counts[rank], width))
            else:
                step = metric(_rows(rank, counts[rank], width))
        elif how == "forward":
            step = metric(torch.zeros(0, width))
        out[how] = (step, metric.compute())
    return out


@pytest.mark.parametrize("counts", [[1, 3], [2, 0]], ids=["1 and 3 rows", "one rank empty"])
def test_rows_across_two_ranks_in_rank_order(counts: list[int]) -> None:
    width = 3
    expected = torch.cat([_rows(r, n, width) for r, n in enumerate(counts)])
    for rank, result in enumerate(run_distributed(_uneven_on_rank, 2, counts, width, timeout=120.0)):
        for how, (step, epoch) in result.items():
            assert epoch.shape == expected.shape, f"rank {rank} {how}: compute() {tuple(epoch.shape)}"
            torch.testing.assert_close(epoch, expected, rtol=0, atol=0)
            if how == "forward":
                torch.testing.assert_close(step, expected, rtol=0, atol=0)


def _widths_on_rank(rank: int, world: int, how: str) -> str:
    metric = CatMetric(dist_sync_on_step=how == "forward")
    rows = torch.ones(2, 3 + rank)
    try:
        if how == "forward":
            metric(rows)
        else:
            metric.update(rows)
            metric.compute()
    except RuntimeError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("how", ["update", "forward"])
def test_row_widths_that_differ_across_ranks_raise_on_every_rank(how: str) -> None:
    messages = run_distributed(_widths_on_rank, 2, how, timeout=120.0)
    for rank, message in enumerate(messages):
        assert "trailing shape" in message and "(*, 3)" in message and "(*, 4)" in message, f"rank {rank}: {message}"
