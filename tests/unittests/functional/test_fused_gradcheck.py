"""The hand-written backward passes of the fused kernels against finite differences (``torch.autograd.gradcheck``).

The full-batch and block losses run on the fused kernels, whose backward is written by hand (the positives of
InfoNCE/SupCon go through class sums, CLIP forms both directions from one block). ``gradcheck`` compares it with
central finite differences of the forward in float64 — for the embeddings *and* the scalar parameters (logit
scale, bias, temperature as tensors), including SupCon anchors without positives and a partial CLIP block.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from torchmetrics_diff.functional import (
    clip_block,
    clip_loss,
    info_nce_block,
    info_nce_loss,
    siglip_block,
    siglip_loss,
    supcon_loss,
)

F64 = torch.float64


def _leaf(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).requires_grad_()


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F64, requires_grad=True)


CASES: list[tuple[str, Callable[[], tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]]]] = [
    ("clip_loss", lambda: (clip_loss, (_leaf(5, 3, seed=1), _leaf(5, 3, seed=2), _scalar(2.5)))),
    (
        "clip_block (rows 1..3 of 5)",
        lambda: (
            lambda i, t, s: clip_block(i[1:4], t[1:4], i, t, s, 1)[0],
            (_leaf(5, 3, seed=3), _leaf(5, 3, seed=4), _scalar(1.5)),
        ),
    ),
    (
        "siglip_loss",
        lambda: (siglip_loss, (_leaf(4, 3, seed=5), _leaf(4, 3, seed=6), _scalar(3.0), _scalar(-1.0))),
    ),
    (
        "siglip_block (rows 2..3 of 4)",
        lambda: (
            lambda i, t, s, b: siglip_block(i[2:], t, s, b, 2)[0],
            (_leaf(4, 3, seed=7), _leaf(4, 3, seed=8), _scalar(2.0), _scalar(0.5)),
        ),
    ),
    ("info_nce_loss", lambda: (info_nce_loss, (_leaf(4, 3, seed=9), _leaf(4, 3, seed=10), _scalar(0.7)))),
    (
        "info_nce_block (rows 1..2 of 4)",
        lambda: (
            lambda a, b, t: info_nce_block(a[1:3], b[1:3], a, b, t, 1)[0],
            (_leaf(4, 3, seed=11), _leaf(4, 3, seed=12), _scalar(0.5)),
        ),
    ),
    (
        "supcon_loss, some anchors without positives",
        lambda: (
            lambda f, t: supcon_loss(f, torch.tensor([0, 0, 1, 2, 2, 2]), t),
            (_leaf(6, 3, seed=13), _scalar(0.8)),
        ),
    ),
    (
        "supcon_loss, 2 views",
        lambda: (
            lambda f, t: supcon_loss(f, torch.tensor([0, 1, 0, 3]), t),
            (_leaf(4, 2, 3, seed=14), _scalar(0.6)),
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[name for name, _ in CASES])
def test_fused_backward_matches_finite_differences(case: tuple[str, Callable[[], tuple]]) -> None:
    fn, inputs = case[1]()
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
