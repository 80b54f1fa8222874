"""Bad inputs raise ``ValueError`` naming the argument (and the shapes involved), single process."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

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

F64 = torch.float64


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=F64)


# (id, criterion factory, call(criterion), substrings the message must contain)
CALL_CASES: list[tuple[str, Callable[..., Any], Callable[[Any], Any], list[str]]] = []
for strategy in ("replicated", "sharded"):
    CALL_CASES += [
        (
            f"clip-batch-mismatch-{strategy}",
            lambda s=strategy: CLIPLoss(strategy=s),
            lambda c: c(_t(4, 8), _t(3, 8), 10.0),
            ["text_embeds", "image_embeds", "(4, 8)", "(3, 8)"],
        ),
        (
            f"clip-dim-mismatch-{strategy}",
            lambda s=strategy: CLIPLoss(strategy=s),
            lambda c: c(_t(4, 8), _t(4, 7), 10.0),
            ["text_embeds", "(4, 8)", "(4, 7)"],
        ),
        (
            f"clip-ndim-{strategy}",
            lambda s=strategy: CLIPLoss(strategy=s),
            lambda c: c(_t(4), _t(4), 10.0),
            ["image_embeds", "(B, D)", "(4,)"],
        ),
        (
            f"clip-3d-{strategy}",
            lambda s=strategy: CLIPLoss(strategy=s),
            lambda c: c(_t(2, 4, 8), _t(2, 4, 8), 10.0),
            ["image_embeds", "(2, 4, 8)"],
        ),
        (
            f"clip-logit-scale-shape-{strategy}",
            lambda s=strategy: CLIPLoss(strategy=s),
            lambda c: c(_t(4, 8), _t(4, 8), _t(2)),
            ["logit_scale", "(2,)"],
        ),
        (
            f"infonce-batch-mismatch-{strategy}",
            lambda s=strategy: InfoNCELoss(strategy=s),
            lambda c: c(_t(4, 8), _t(3, 8)),
            ["z2", "z1", "(4, 8)", "(3, 8)"],
        ),
        (
            f"infonce-ndim-{strategy}",
            lambda s=strategy: InfoNCELoss(strategy=s),
            lambda c: c(_t(4, 2, 8), _t(4, 2, 8)),
            ["z1", "(4, 2, 8)"],
        ),
        (
            f"siglip-batch-mismatch-{strategy}",
            lambda s=strategy: SigLIPLoss(strategy=s),
            lambda c: c(_t(4, 8), _t(5, 8), 10.0, -10.0),
            ["text_embeds", "image_embeds", "(4, 8)", "(5, 8)"],
        ),
        (
            f"siglip-ndim-{strategy}",
            lambda s=strategy: SigLIPLoss(strategy=s),
            lambda c: c(_t(8), _t(8), 10.0, -10.0),
            ["image_embeds", "(8,)"],
        ),
        (
            f"siglip-bias-shape-{strategy}",
            lambda s=strategy: SigLIPLoss(strategy=s),
            lambda c: c(_t(4, 8), _t(4, 8), 10.0, _t(1, 2)),
            ["logit_bias", "(1, 2)"],
        ),
        (
            f"supcon-labels-length-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4, 8), torch.tensor([0, 1, 0])),
            ["labels", "(4,)", "(3,)"],
        ),
        (
            f"supcon-labels-2d-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4, 8), torch.zeros(4, 1, dtype=torch.int64)),
            ["labels", "(4,)", "(4, 1)"],
        ),
        (
            f"supcon-labels-float-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4, 8), torch.zeros(4, dtype=F64)),
            ["labels", "float64"],
        ),
        (
            f"supcon-labels-multiview-length-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4, 2, 8), torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])),
            ["labels", "(4,)", "(8,)"],
        ),
        (
            f"supcon-ndim-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4), torch.tensor([0, 1, 0, 1])),
            ["features", "(4,)"],
        ),
        (
            f"supcon-4d-{strategy}",
            lambda s=strategy: SupConLoss(strategy=s),
            lambda c: c(_t(4, 2, 2, 8), torch.tensor([0, 1, 0, 1])),
            ["features", "(4, 2, 2, 8)"],
        ),
    ]
CALL_CASES += [
    ("barlow-batch-mismatch", BarlowTwinsLoss, lambda c: c(_t(4, 3), _t(3, 3)), ["zb", "za", "(4, 3)", "(3, 3)"]),
    ("barlow-ndim", BarlowTwinsLoss, lambda c: c(_t(4), _t(4)), ["za", "(4,)"]),
    (
        "tokence-target-shape",
        TokenCrossEntropyLoss,
        lambda c: c(_t(2, 3, 5), torch.zeros(2, 4, dtype=torch.int64)),
        ["target", "(2, 3)", "(2, 4)"],
    ),
    ("tokence-target-float", TokenCrossEntropyLoss, lambda c: c(_t(2, 3, 5), torch.zeros(2, 3)), ["target"]),
    ("mean-weight-broadcast", GlobalMeanLoss, lambda c: c(_t(4, 3), weight=_t(2)), ["weight", "(4, 3)", "(2,)"]),
    ("mean-mask-dtype", GlobalMeanLoss, lambda c: c(_t(4, 3), mask=torch.ones(4, 3)), ["mask", "bool"]),
    (
        "mean-mask-shape",
        GlobalMeanLoss,
        lambda c: c(_t(4, 3), mask=torch.ones(4, 2, dtype=torch.bool)),
        ["mask", "(4, 3)", "(4, 2)"],
    ),
]


@pytest.mark.parametrize(("factory", "call", "parts"), [c[1:] for c in CALL_CASES], ids=[c[0] for c in CALL_CASES])
def test_bad_inputs_raise_value_error(
    factory: Callable[..., Any], call: Callable[[Any], Any], parts: list[str]
) -> None:
    criterion = factory()
    with pytest.raises(ValueError) as info:
        call(criterion)
    message = str(info.value)
    missing = [p for p in parts if p not in message]
    assert not missing, f"message {message!r} does not mention {missing}"
    assert criterion.update_count == 0, "a rejected call must not count as a step"


BAD_TEMPERATURES = [0, 0.0, -0.1, math.nan, math.inf, -math.inf, True, "0.1", None]


@pytest.mark.parametrize("temperature", BAD_TEMPERATURES, ids=repr)
@pytest.mark.parametrize("cls", [InfoNCELoss, SupConLoss])
def test_bad_temperature_in_constructor(cls: type, temperature: Any) -> None:
    with pytest.raises(ValueError, match="temperature"):
        cls(temperature=temperature)


@pytest.mark.parametrize("cls", [CLIPLoss, InfoNCELoss, SupConLoss, SigLIPLoss, BarlowTwinsLoss])
def test_unknown_strategy(cls: type) -> None:
    with pytest.raises(ValueError, match=r"`strategy`.*'ring'.*'bogus'"):
        cls(strategy="bogus")


@pytest.mark.parametrize(
    "cls", [CLIPLoss, InfoNCELoss, SupConLoss, SigLIPLoss, BarlowTwinsLoss, GlobalMeanLoss, TokenCrossEntropyLoss]
)
def test_unknown_grad_reduction(cls: type) -> None:
    with pytest.raises(ValueError, match=re.escape("`grad_reduction`")):
        cls(grad_reduction="max")


def test_bad_label_smoothing() -> None:
    with pytest.raises(ValueError, match="label_smoothing"):
        TokenCrossEntropyLoss(label_smoothing=1.5)


def test_good_temperature_is_accepted() -> None:
    assert InfoNCELoss(temperature=1).temperature == 1.0
    assert SupConLoss(temperature=0.07).temperature == 0.07
