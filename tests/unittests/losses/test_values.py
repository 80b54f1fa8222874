"""Loss values and input gradients against the independent references, with the edge cases of masking.

Each case is a global batch of leaf tensors split over the ranks (uneven, and with an empty rank at W=3); every
rank calls the loss on its rows with ``grad_reduction="sum"``, so the gradient of a rank's own input rows must be
the matching rows of the single-process gradient of the reference. Temperatures / logit scales are varied, and
the masking edge cases are included: SupCon anchors without positives (a rank where none has one, positives on
another rank), all-unique labels (0 with a zero, finite gradient), token cross-entropy with ignored tokens and a
rank (or every rank) whose tokens are all ignored, and a weighted mean whose mask hides NaN padding.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, NamedTuple

import pytest
import torch
from torch import Tensor

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed
from tests._helpers.references import (
    ref_barlow,
    ref_clip,
    ref_info_nce,
    ref_siglip,
    ref_supcon,
    ref_token_ce,
    ref_weighted_mean,
)
from tests._helpers.seeds import F64, bounds, generator
from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
)

N = 7  # global rows of every case
SIZES = {1: (7,), 2: (2, 5), 3: (2, 0, 5)}
STRATEGIES = ("replicated", "sharded")


class VCase(NamedTuple):
    name: str
    factory: Callable[[], Any]  # the criterion
    tensors: tuple[Tensor, ...]  # the global batch, split by rows
    grad: tuple[bool, ...]  # which tensors are differentiated
    call: Callable[..., Tensor]  # call(criterion, *local tensors) -> loss
    reference: Callable[..., Tensor]  # reference(*global tensors) -> loss


def _randn(*shape: int, key: str) -> Tensor:
    return torch.randn(*shape, generator=generator("values", key), dtype=F64)


def _positional(criterion: Any, *tensors: Tensor, extra: tuple = ()) -> Tensor:
    return criterion(*tensors, *extra)


def _weighted(criterion: Any, values: Tensor, weight: Tensor | None, mask: Tensor | None) -> Tensor:
    return criterion(values, weight=weight, mask=mask)


def _masked_nan(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values, torch.full_like(values, math.nan))


def _cases() -> list[VCase]:
    """Every value case (the same list in every process)."""
    cases: list[VCase] = []
    img, txt = _randn(N, 4, key="img"), _randn(N, 4, key="txt")
    img, txt = img / img.norm(dim=1, keepdim=True), txt / txt.norm(dim=1, keepdim=True)
    z1, z2 = _randn(N, 5, key="z1"), _randn(N, 5, key="z2")
    feats, feats_mv = _randn(N, 4, key="f"), _randn(N, 3, 4, key="fmv")
    labels = {
        # label 0 and 1 have positives across ranks; 8, 2, 9 have none
        "cross-rank positives, some anchors without": torch.tensor([0, 8, 0, 1, 2, 1, 9]),
        # rank 0's two anchors have no positive anywhere; rank 2 has one without (label 2)
        "a rank with no positive": torch.tensor([7, 8, 0, 0, 1, 2, 1]),
        "all unique": torch.arange(N),
    }
    for strategy in STRATEGIES:
        opts = {"strategy": strategy, "grad_reduction": "sum"}
        for scale in (1.0, 50.0):
            cases.append(
                VCase(
                    f"CLIP {strategy} logit_scale={scale}",
                    partial(CLIPLoss, **opts),
                    (img, txt),
                    (True, True),
                    partial(_positional, extra=(scale,)),
                    partial(_ref_with, ref_clip, extra=(scale,)),
                )
            )
        for scale, bias in ((1.0, 0.0), (10.0, -10.0)):
            cases.append(
                VCase(
                    f"SigLIP {strategy} logit_scale={scale} logit_bias={bias}",
                    partial(SigLIPLoss, **opts),
                    (img, txt),
                    (True, True),
                    partial(_positional, extra=(scale, bias)),
                    partial(_ref_with, ref_siglip, extra=(scale, bias)),
                )
            )
        for t in (0.05, 0.3, 2.0):
            cases.append(
                VCase(
                    f"InfoNCE {strategy} temperature={t}",
                    partial(InfoNCELoss, temperature=t, **opts),
                    (z1, z2),
                    (True, True),
                    _positional,
                    partial(_ref_with, ref_info_nce, extra=(t,)),
                )
            )
        for t in (0.05, 2.0):
            for what, lab in labels.items():
                cases.append(
                    VCase(
                        f"SupCon (B,D) {strategy} temperature={t} labels={what}",
                        partial(SupConLoss, temperature=t, **opts),
                        (feats, lab),
                        (True, False),
                        _positional,
                        partial(_ref_with, ref_supcon, extra=(t,)),
                    )
                )
            cases.append(
                VCase(
                    f"SupCon (B,V,D) {strategy} temperature={t} labels={'cross-rank positives, some anchors without'}",
                    partial(SupConLoss, temperature=t, **opts),
                    (feats_mv, labels["cross-rank positives, some anchors without"]),
                    (True, False),
                    _positional,
                    partial(_ref_with, ref_supcon, extra=(t,)),
                )
            )
        for what, f in (("(B,D): no positives, 0", feats), ("(B,V,D): the other views", feats_mv)):
            cases.append(
                VCase(
                    f"SupCon {strategy} labels=None {what}",
                    partial(SupConLoss, temperature=0.2, **opts),
                    (f,),
                    (True,),
                    _positional,
                    partial(_ref_supcon_unlabelled, temperature=0.2),
                )
            )
    for lam, eps in ((0.0, 1e-5), (0.5, 1e-2)):
        cases.append(
            VCase(
                f"BarlowTwins lambda_offdiag={lam} eps={eps}",
                partial(BarlowTwinsLoss, lambda_offdiag=lam, eps=eps, grad_reduction="sum"),
                (z1, z2),
                (True, True),
                _positional,
                partial(_ref_barlow, lambda_offdiag=lam, eps=eps),
            )
        )

    # token cross-entropy: rank 0's two sequences are all padding (at W=2, 3); one case where every token is
    logits = _randn(N, 4, 5, key="logits")
    target = torch.randint(0, 5, (N, 4), generator=generator("values", "target"))
    pad = torch.rand(N, 4, generator=generator("values", "pad")) < 0.3
    pad[:2] = True
    for ignore_index, smoothing in ((-100, 0.0), (-1, 0.1)):
        tgt = torch.where(pad, torch.full_like(target, ignore_index), target)
        cases.append(
            VCase(
                f"TokenCE ignore_index={ignore_index} label_smoothing={smoothing} (first 2 rows all ignored)",
                partial(
                    TokenCrossEntropyLoss, ignore_index=ignore_index, label_smoothing=smoothing, grad_reduction="sum"
                ),
                (logits, tgt),
                (True, False),
                _positional,
                partial(ref_token_ce, ignore_index=ignore_index, smoothing=smoothing),
            )
        )
    cases.append(
        VCase(
            "TokenCE every token ignored: 0",
            partial(TokenCrossEntropyLoss, grad_reduction="sum"),
            (logits, torch.full_like(target, -100)),
            (True, False),
            _positional,
            ref_token_ce,
        )
    )
    # weighted mean: NaN padding hidden by the mask; rank 0's rows entirely masked
    values = _randn(N, 3, key="values")
    weight = 0.5 + torch.rand(N, 1, generator=generator("values", "weight"), dtype=F64)
    mask = torch.rand(N, 3, generator=generator("values", "mask")) < 0.6
    mask[:2] = False
    mask[2, 0] = True
    nan_values = _masked_nan(values, mask)
    for what, tensors in (
        ("weight+mask over NaN padding", (nan_values, weight, mask)),
        ("mask over NaN padding", (nan_values, None, mask)),
        ("weight only", (values, weight, None)),
        ("everything masked: 0", (nan_values, weight, torch.zeros_like(mask))),
    ):
        cases.append(
            VCase(
                f"GlobalMeanLoss {what}",
                partial(GlobalMeanLoss, grad_reduction="sum"),
                tensors,
                (True, False, False),
                _weighted,
                ref_weighted_mean,
            )
        )
    return cases


def _ref_with(fn: Callable[..., Tensor], *tensors: Tensor, extra: tuple = ()) -> Tensor:
    return fn(*tensors, *extra)


def _ref_supcon_unlabelled(features: Tensor, temperature: float) -> Tensor:
    return ref_supcon(features, None, temperature)


def _ref_barlow(za: Tensor, zb: Tensor, lambda_offdiag: float, eps: float) -> Tensor:
    return ref_barlow(za, zb, lambda_offdiag, eps)


def _local(case: VCase, sizes: tuple[int, ...], rank: int) -> list[Tensor | None]:
    lo, hi = bounds(sizes, rank)
    out: list[Tensor | None] = []
    for t, grad in zip(case.tensors, case.grad):
        if t is None:
            out.append(None)
        else:
            piece = t[lo:hi].clone()
            out.append(piece.requires_grad_() if grad else piece)
    return out


def _run_values(rank: int, world_size: int) -> list[dict[str, Any]]:
    """Every case on this rank's rows: value, and the gradient of this rank's differentiable inputs."""
    sizes = SIZES[world_size]
    results = []
    for case in _cases():
        local = _local(case, sizes, rank)
        value = case.call(case.factory(), *local)
        value.backward()
        grads = [t.grad.clone() if t is not None and t.requires_grad and t.grad is not None else None for t in local]
        results.append({"value": value.detach().clone(), "grads": grads})
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_and_input_grads_match_reference(world_size: int) -> None:
    sizes = SIZES[world_size]
    cases = _cases()
    results = run_distributed(_run_values, world_size, timeout=120.0)
    problems = []
    for i, case in enumerate(cases):
        where = f"[{case.name}, W={world_size}, sizes={'/'.join(map(str, sizes))}]"
        full = [t.clone().requires_grad_() if t is not None and g else t for t, g in zip(case.tensors, case.grad)]
        ref = case.reference(*full)
        leaves = [t for t in full if t is not None and t.requires_grad]
        ref_grads = iter(torch.autograd.grad(ref, leaves, allow_unused=True))
        expected_grads = [next(ref_grads) if t is not None and t.requires_grad else None for t in full]
        values = [r[i]["value"] for r in results]
        if not all(torch.equal(v, values[0]) for v in values):
            problems.append(f"{where}: value differs between ranks: {[float(v) for v in values]}")
        for rank, r in enumerate(results):
            got = r[i]
            if max_err(got["value"], ref.detach()) > 1:
                problems.append(f"{where} rank {rank}: value {float(got['value'])!r} != reference {float(ref)!r}")
            lo, hi = bounds(sizes, rank)
            for j, want in enumerate(expected_grads):
                if want is None and not (case.grad[j] and case.tensors[j] is not None):
                    continue
                want = torch.zeros_like(case.tensors[j]) if want is None else want
                g = got["grads"][j]
                if g is not None and not bool(torch.isfinite(g).all()):
                    problems.append(f"{where} rank {rank}: gradient of input {j} is not finite")
                elif max_err(g, want[lo:hi]) > 1:
                    problems.append(f"{where} rank {rank}: gradient of input {j} (rows {lo}:{hi}) != reference")
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


def test_degenerate_cases_are_zero_with_zero_finite_gradient() -> None:
    """The degenerate cases really are 0 with an all-zero, finite gradient (not just equal to the reference)."""
    cases = {c.name: c for c in _cases()}
    names = [n for n in cases if n.endswith(": 0") or "labels=all unique" in n or "(B,D): no positives" in n]
    assert len(names) == 8, names
    for name in names:
        case = cases[name]
        full = [t.clone().requires_grad_() if t is not None and g else t for t, g in zip(case.tensors, case.grad)]
        value = case.call(case.factory(), *full)
        value.backward()
        value = value.detach()
        assert float(value) == 0.0 and not math.isnan(float(value)), f"[{name}] value {float(value)}"
        for t in full:
            if t is not None and t.requires_grad:
                assert t.grad is not None and bool((t.grad == 0).all()), f"[{name}] gradient is not all zero/finite"


def test_nan_padding_gets_zero_gradient() -> None:
    """GlobalMeanLoss: NaN values under the mask neither reach the value nor the gradient (which is w/Σw there)."""
    values = torch.tensor([[1.0, math.nan], [3.0, 5.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, False], [True, True]])
    weight = torch.tensor([[2.0], [1.0]], dtype=F64)
    loss = GlobalMeanLoss()(values, weight=weight, mask=mask)
    loss.backward()
    torch.testing.assert_close(loss.detach(), torch.tensor((2 * 1 + 3 + 5) / 4, dtype=F64), rtol=0, atol=1e-15)
    expected = torch.tensor([[0.5, 0.0], [0.25, 0.25]], dtype=F64)
    torch.testing.assert_close(values.grad, expected, rtol=0, atol=1e-15)
