"""A loss's ``compute()`` returns the dtype its ``forward`` returns (the epoch mean is accumulated in float64)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
)

LOSSES = [CLIPLoss, SigLIPLoss, InfoNCELoss, SupConLoss, BarlowTwinsLoss, GlobalMeanLoss, TokenCrossEntropyLoss]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _inputs(cls: type, dtype: torch.dtype, seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(6, 4, generator=g).to(dtype) for _ in range(2))
    if cls is CLIPLoss:
        return a, b, torch.tensor(10.0)
    if cls is SigLIPLoss:
        return a, b, torch.tensor(10.0), torch.tensor(-10.0)
    if cls is SupConLoss:
        return a, torch.tensor([0, 1, 0, 1, 2, 2])
    if cls is GlobalMeanLoss:
        return (a.abs(),)
    if cls is TokenCrossEntropyLoss:
        return a, torch.tensor([0, 1, 2, 3, 0, 1])
    return a, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", LOSSES, ids=lambda c: c.__name__)
def test_compute_dtype_is_forward_dtype(cls: type, dtype: torch.dtype) -> None:
    loss = cls()
    values = [loss(*_inputs(cls, dtype, seed)) for seed in range(3)]
    assert len({v.dtype for v in values}) == 1
    epoch = loss.compute()
    assert epoch.dtype == values[0].dtype, f"{cls.__name__}: compute {epoch.dtype}, forward {values[0].dtype}"
    # the epoch value of a step-mean loss is the float64 mean of the step values, rounded once to their dtype
    if cls not in (GlobalMeanLoss, TokenCrossEntropyLoss):
        expected = torch.stack([v.detach().double() for v in values]).mean().to(epoch.dtype)
        torch.testing.assert_close(epoch, expected, rtol=0, atol=0)

    updated = cls()
    updated.update(*_inputs(cls, dtype, 0))
    assert updated.compute().dtype == values[0].dtype, f"{cls.__name__}: update then compute"


def test_compute_dtype_widens_once_a_float64_value_came() -> None:
    loss = CLIPLoss()
    loss(*_inputs(CLIPLoss, torch.float32, 0))
    assert loss.compute().dtype == torch.float32
    loss(*_inputs(CLIPLoss, torch.float64, 1))
    assert loss.compute().dtype == torch.float64
    assert CLIPLoss().set_dtype(torch.float64).compute().dtype == torch.float64
