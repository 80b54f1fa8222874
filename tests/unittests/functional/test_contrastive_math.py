"""Single-process tests of the loss maths in ``functional._contrastive``, ``._normalized`` and ``._barlow_twins``.

Every full-batch loss is compared with an independent reference written with explicit loops over
Python floats (or numpy), in float64. Every block form is checked to reproduce the full loss *and its
gradient* when summed over an uneven partition of the rows (including an empty block): this is the
identity the distributed layer builds on.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchmetrics_diff.functional import (
    BarlowTwinsStats,
    barlow_twins_from_stats,
    barlow_twins_loss,
    barlow_twins_stats,
    clip_block,
    clip_loss,
    info_nce_block,
    info_nce_loss,
    siglip_block,
    siglip_loss,
    supcon_block,
    supcon_loss,
    token_cross_entropy,
    token_cross_entropy_block,
    weighted_mean,
    weighted_mean_block,
)

# Values: loops vs. vectorized float64 agree to rounding. Gradients: the block partition is the same
# arithmetic regrouped, so it agrees to a few ulps of the gradient's magnitude.
VALUE_TOL = {"rtol": 1e-10, "atol": 1e-12}
GRAD_TOL = {"rtol": 1e-10, "atol": 1e-12}
PARTITIONS = [(3, 0, 5), (8,), (0, 1, 1, 6), (5, 3, 0)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int, requires_grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64).requires_grad_(requires_grad)


def _blocks(sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of the given sizes."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def _assert_same_grads(loss_a: torch.Tensor, loss_b: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    grads_a = torch.autograd.grad(loss_a, inputs, allow_unused=True, retain_graph=True)
    grads_b = torch.autograd.grad(loss_b, inputs, allow_unused=True, retain_graph=True)
    for ga, gb in zip(grads_a, grads_b):
        ga = torch.zeros(()) if ga is None else ga
        gb = torch.zeros(()) if gb is None else gb
        torch.testing.assert_close(ga, gb, **GRAD_TOL)


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _dot(u: list[float], v: list[float]) -> float:
    return sum(a * b for a, b in zip(u, v))


def _unit(u: list[float]) -> list[float]:
    norm = math.sqrt(_dot(u, u))
    return [a / max(norm, 1e-12) for a in u]


# --------------------------------------------------------------------------------------------------
# References (loops over Python floats)
# --------------------------------------------------------------------------------------------------


def ref_clip(img: torch.Tensor, txt: torch.Tensor, scale: float) -> float:
    a, b = img.tolist(), txt.tolist()
    n = len(a)
    total = 0.0
    for i in range(n):
        i2t = [scale * _dot(a[i], b[j]) for j in range(n)]
        t2i = [scale * _dot(b[i], a[j]) for j in range(n)]
        total += (_logsumexp(i2t) - i2t[i]) + (_logsumexp(t2i) - t2i[i])
    return total / (2 * n)


def ref_info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> float:
    n = z1.shape[0]
    z = [_unit(u) for u in z1.tolist() + z2.tolist()]
    total = 0.0
    for i in range(2 * n):
        pos = (i + n) % (2 * n)
        others = [_dot(z[i], z[k]) / temperature for k in range(2 * n) if k != i]
        total += _logsumexp(others) - _dot(z[i], z[pos]) / temperature
    return total / (2 * n)


def ref_supcon(features: torch.Tensor, labels: list[int], temperature: float) -> float:
    """Anchors flattened view-major, as the reference implementation does (the loss is order-free)."""
    views = features.unbind(1) if features.ndim == 3 else [features]
    z = [_unit(u) for view in views for u in view.tolist()]
    y = [lab for _ in views for lab in labels]
    total, valid = 0.0, 0
    for i in range(len(z)):
        positives = [p for p in range(len(z)) if p != i and y[p] == y[i]]
        if not positives:
            continue
        denom = _logsumexp([_dot(z[i], z[k]) / temperature for k in range(len(z)) if k != i])
        total -= sum(_dot(z[i], z[p]) / temperature - denom for p in positives) / len(positives)
        valid += 1
    return total / valid if valid else 0.0


def hobbitlong_supcon(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Port of SupConLoss (HobbitLong/SupContrast, contrast_mode='all', base_temperature=temperature)
    on L2-normalized features. It averages over *all* anchors, so it matches ours only when every
    anchor has a positive."""
    features = F.normalize(features, dim=-1)
    batch_size, views = features.shape[:2]
    mask = torch.eq(labels[:, None], labels[None, :]).double()
    contrast_feature = torch.cat(torch.unbind(features, dim=1), dim=0)
    anchor_dot_contrast = contrast_feature @ contrast_feature.T / temperature
    logits_max, _ = torch.max(anchor_dot_contrast, dim=1, keepdim=True)
    logits = anchor_dot_contrast - logits_max.detach()
    mask = mask.repeat(views, views)
    logits_mask = torch.scatter(torch.ones_like(mask), 1, torch.arange(batch_size * views).view(-1, 1), 0)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)
    return -mean_log_prob_pos.view(views, batch_size).mean()


def ref_siglip(img: torch.Tensor, txt: torch.Tensor, scale: float, bias: float) -> float:
    a, b = img.tolist(), txt.tolist()
    n = len(a)
    total = 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            x = z * (scale * _dot(a[i], b[j]) + bias)
            total += math.log1p(math.exp(-x)) if x > 0 else -x + math.log1p(math.exp(x))
    return total / n


def ref_token_ce(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float) -> float:
    rows = logits.reshape(-1, logits.shape[-1]).tolist()
    targets = target.reshape(-1).tolist()
    total, count = 0.0, 0
    for row, t in zip(rows, targets):
        if t == ignore_index:
            continue
        lse = _logsumexp(row)
        nll = lse - row[t]
        uniform = sum(lse - v for v in row) / len(row)
        total += (1 - smoothing) * nll + smoothing * uniform
        count += 1
    return total / count if count else 0.0


def ref_barlow(za: np.ndarray, zb: np.ndarray, lambda_offdiag: float, eps: float) -> float:
    """The original recipe: BatchNorm1d(affine=False) on each view, then bn(za).T @ bn(zb) / N."""
    na = (za - za.mean(0)) / np.sqrt(za.var(0) + eps)
    nb = (zb - zb.mean(0)) / np.sqrt(zb.var(0) + eps)
    c = na.T @ nb / za.shape[0]
    off = c - np.diag(np.diag(c))
    return float(((1 - np.diag(c)) ** 2).sum() + lambda_offdiag * (off**2).sum())


# --------------------------------------------------------------------------------------------------
# CLIP
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("scale", [0.3, 1.0, 14.3])
def test_clip_matches_loop_reference(n: int, scale: float) -> None:
    img, txt = _randn(n, 6, seed=n), _randn(n, 6, seed=100 + n)
    expected = ref_clip(img, txt, scale)
    torch.testing.assert_close(clip_loss(img, txt, scale).item(), expected, **VALUE_TOL)
    torch.testing.assert_close(
        clip_loss(img, txt, torch.tensor(scale, dtype=torch.float64)).item(), expected, **VALUE_TOL
    )


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_clip_blocks_sum_to_full_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    n = sum(sizes)
    img, txt = _randn(n, 5, seed=1), _randn(n, 5, seed=2)
    scale = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    parts = [clip_block(img[s:e], txt[s:e], img, txt, scale, s) for s, e in _blocks(sizes)]
    assert [c.item() for _, c in parts] == list(sizes)
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = clip_loss(img, txt, scale)
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [img, txt, scale])


def test_clip_scale_gradient_matches_finite_difference() -> None:
    img, txt = _randn(4, 3, seed=3), _randn(4, 3, seed=4)
    scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda i, t, s: clip_loss(i, t, s), (img, txt, scale))


# --------------------------------------------------------------------------------------------------
# InfoNCE
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("temperature", [0.05, 0.5, 2.0])
def test_info_nce_matches_loop_reference(n: int, temperature: float) -> None:
    z1, z2 = _randn(n, 4, seed=n), _randn(n, 4, seed=50 + n)
    torch.testing.assert_close(
        info_nce_loss(z1, z2, temperature).item(), ref_info_nce(z1, z2, temperature), **VALUE_TOL
    )


def test_info_nce_single_sample_is_zero_with_zero_gradient() -> None:
    # The two anchors have only each other as candidates: the softmax is certain.
    z1, z2 = _randn(1, 4, seed=0), _randn(1, 4, seed=1)
    loss = info_nce_loss(z1, z2, 0.1)
    assert loss.item() == pytest.approx(0.0, abs=1e-15)
    for grad in torch.autograd.grad(loss, [z1, z2]):
        assert torch.all(grad.abs() < 1e-12)


def test_info_nce_ignores_embedding_norms() -> None:
    z1, z2 = _randn(5, 4, seed=0), _randn(5, 4, seed=1)
    scaled = info_nce_loss(z1 * 7.0, z2 * torch.arange(1, 6, dtype=torch.float64)[:, None], 0.3)
    torch.testing.assert_close(scaled, info_nce_loss(z1, z2, 0.3), **VALUE_TOL)


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_info_nce_blocks_sum_to_full_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    n = sum(sizes)
    z1, z2 = _randn(n, 5, seed=1), _randn(n, 5, seed=2)
    temperature = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    parts = [info_nce_block(z1[s:e], z2[s:e], z1, z2, temperature, s) for s, e in _blocks(sizes)]
    assert [c.item() for _, c in parts] == [2 * size for size in sizes]
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = info_nce_loss(z1, z2, temperature)
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [z1, z2, temperature])


# --------------------------------------------------------------------------------------------------
# SupCon
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [[0, 0, 1, 1, 2], [0, 1, 0, 1, 0, 1, 2, 3], [3, 3], [0, 1, 2, 0], [5, 5, 5, 5, 5]])
@pytest.mark.parametrize("temperature", [0.07, 0.5, 1.0])
def test_supcon_matches_loop_reference(labels: list[int], temperature: float) -> None:
    feats = _randn(len(labels), 4, seed=len(labels))
    got = supcon_loss(feats, torch.tensor(labels), temperature)
    torch.testing.assert_close(got.item(), ref_supcon(feats, labels, temperature), **VALUE_TOL)


@pytest.mark.parametrize("views", [1, 2, 3])
@pytest.mark.parametrize("labels", [[0, 1, 2, 3], [0, 0, 1, 2, 2, 2]])
def test_supcon_multi_view_matches_loop_reference(views: int, labels: list[int]) -> None:
    feats = _randn(len(labels), views, 4, seed=views)
    got = supcon_loss(feats, torch.tensor(labels), 0.2)
    torch.testing.assert_close(got.item(), ref_supcon(feats, labels, 0.2), **VALUE_TOL)


@pytest.mark.parametrize("labels", [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]])
def test_supcon_matches_reference_implementation_when_all_anchors_have_positives(labels: list[int]) -> None:
    # Two views: every anchor has at least its other view as positive, so excluding positive-free
    # anchors changes nothing and the view-major reference must agree with our sample-major layout.
    feats = _randn(len(labels), 2, 8, seed=7)
    expected = hobbitlong_supcon(feats, torch.tensor(labels), 0.1)
    got = supcon_loss(feats, torch.tensor(labels), 0.1)
    torch.testing.assert_close(got, expected, **VALUE_TOL)
    _assert_same_grads(got, expected, [feats])


def test_supcon_without_labels_is_nt_xent() -> None:
    z1, z2 = _randn(6, 4, seed=1), _randn(6, 4, seed=2)
    got = supcon_loss(torch.stack([z1, z2], dim=1), None, 0.3)
    expected = info_nce_loss(z1, z2, 0.3)
    torch.testing.assert_close(got, expected, **VALUE_TOL)
    _assert_same_grads(got, expected, [z1, z2])


@pytest.mark.parametrize("shape", [(4, 3), (1, 3), (1, 1, 3), (0, 3)])
def test_supcon_without_positives_is_zero_with_zero_gradient(shape: tuple[int, ...]) -> None:
    feats = _randn(*shape, seed=0)
    loss = supcon_loss(feats, torch.arange(shape[0]), 0.1)
    (grad,) = torch.autograd.grad(loss, [feats])
    assert loss.item() == 0.0
    assert torch.all(grad == 0)


def test_supcon_anchors_without_positive_do_not_leak_into_the_gradient() -> None:
    # Sample 2 is alone in its class: it is still a negative for the others, but not an anchor.
    feats = _randn(3, 3, seed=0)
    labels = torch.tensor([0, 0, 1])
    loss = supcon_loss(feats, labels, 0.5)
    total, count = supcon_block(feats[2:], feats, labels, 0.5, 2)
    assert count.item() == 0 and total.item() == 0.0
    (grad,) = torch.autograd.grad(total, [feats])
    assert torch.all(grad == 0)
    assert torch.isfinite(torch.autograd.grad(loss, [feats])[0]).all()


@pytest.mark.parametrize("sizes", PARTITIONS)
@pytest.mark.parametrize("views", [1, 2])
def test_supcon_blocks_sum_to_full_loss_and_gradient(sizes: tuple[int, ...], views: int) -> None:
    n = sum(sizes)
    feats = _randn(n, views, 5, seed=3) if views > 1 else _randn(n, 5, seed=3)
    labels = torch.tensor([0, 1, 0, 2, 1, 3, 0, 4][:n])  # 3 and 4 have no positive when views == 1
    temperature = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    parts = [supcon_block(feats[s:e], feats, labels, temperature, s) for s, e in _blocks(sizes)]
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = supcon_loss(feats, labels, temperature)
    valid = sum(1 for lab in labels.tolist() if views > 1 or labels.tolist().count(lab) > 1) * views
    assert sum(c for _, c in parts).item() == valid
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [feats, temperature])


# --------------------------------------------------------------------------------------------------
# SigLIP
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 6])
@pytest.mark.parametrize(("scale", "bias"), [(1.0, 0.0), (10.0, -10.0), (0.5, 3.0)])
def test_siglip_matches_loop_reference(n: int, scale: float, bias: float) -> None:
    img, txt = _randn(n, 4, seed=n), _randn(n, 4, seed=10 + n)
    torch.testing.assert_close(
        siglip_loss(img, txt, scale, bias).item(), ref_siglip(img, txt, scale, bias), **VALUE_TOL
    )


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_siglip_blocks_sum_to_full_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    n = sum(sizes)
    img, txt = _randn(n, 5, seed=1), _randn(n, 5, seed=2)
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-2.0, dtype=torch.float64, requires_grad=True)
    parts = [siglip_block(img[s:e], txt, scale, bias, s) for s, e in _blocks(sizes)]
    assert [c.item() for _, c in parts] == list(sizes)
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = siglip_loss(img, txt, scale, bias)
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [img, txt, scale, bias])


def test_siglip_scale_and_bias_gradients_match_finite_difference() -> None:
    img, txt = _randn(3, 2, seed=5), _randn(3, 2, seed=6)
    scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(siglip_loss, (img, txt, scale, bias))


# --------------------------------------------------------------------------------------------------
# Weighted mean and token cross-entropy
# --------------------------------------------------------------------------------------------------


def test_weighted_mean_with_weights_and_mask() -> None:
    values = _randn(4, 3, seed=0)
    weight = torch.rand(4, 3, generator=_gen(1), dtype=torch.float64)
    mask = torch.rand(4, 3, generator=_gen(2)) > 0.4
    v, w, m = values.tolist(), weight.tolist(), mask.tolist()
    cells = [(i, j) for i in range(4) for j in range(3)]
    expected = sum(v[i][j] * w[i][j] for i, j in cells if m[i][j]) / sum(w[i][j] for i, j in cells if m[i][j])
    torch.testing.assert_close(weighted_mean(values, weight, mask).item(), expected, **VALUE_TOL)
    _, count = weighted_mean_block(values, weight, mask)
    torch.testing.assert_close(count.item(), sum(w[i][j] for i, j in cells if m[i][j]), **VALUE_TOL)
    torch.testing.assert_close(weighted_mean(values).item(), sum(sum(r) for r in v) / 12, **VALUE_TOL)


def test_weighted_mean_broadcasts_weight_to_values() -> None:
    values = _randn(4, 3, seed=0)
    row_weight = torch.tensor([[1.0], [2.0], [0.0], [0.5]], dtype=torch.float64)
    total, count = weighted_mean_block(values, row_weight)
    assert count.item() == pytest.approx(3 * 3.5)
    torch.testing.assert_close(total, (values * row_weight).sum(), **VALUE_TOL)
    total, count = weighted_mean_block(values, 2.0)
    assert count.item() == 24.0


def test_weighted_mean_mask_excludes_non_finite_padding() -> None:
    values = torch.tensor([1.0, float("nan"), 3.0, float("inf")], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, False, True, False])
    loss = weighted_mean(values, mask=mask)
    (grad,) = torch.autograd.grad(loss, [values])
    assert loss.item() == 2.0
    assert grad.tolist() == [0.5, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("how", ["mask", "weight", "empty"])
def test_weighted_mean_without_weight_is_zero_with_zero_gradient(how: str) -> None:
    values = _randn(0 if how == "empty" else 5, seed=0)
    kwargs = {
        "mask": {"mask": torch.zeros(5, dtype=torch.bool)},
        "weight": {"weight": torch.zeros(5, dtype=torch.float64)},
        "empty": {},
    }[how]
    loss = weighted_mean(values, **kwargs)
    (grad,) = torch.autograd.grad(loss, [values])
    assert loss.item() == 0.0 and not torch.isnan(loss)
    assert torch.all(grad == 0)


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_weighted_mean_blocks_sum_to_full_mean_and_gradient(sizes: tuple[int, ...]) -> None:
    n = sum(sizes)
    values = _randn(n, 3, seed=0)
    weight = torch.rand(n, 3, generator=_gen(1), dtype=torch.float64, requires_grad=True)
    parts = [weighted_mean_block(values[s:e], weight[s:e]) for s, e in _blocks(sizes)]
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = weighted_mean(values, weight)
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [values, weight])


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_token_cross_entropy_matches_loop_reference(smoothing: float, ignore_index: int) -> None:
    logits = _randn(3, 5, 7, seed=0)
    target = torch.randint(0, 7, (3, 5), generator=_gen(1))
    target[0, 3:] = ignore_index
    target[2, 1:] = ignore_index
    got = token_cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=smoothing)
    expected = ref_token_ce(logits, target, ignore_index, smoothing)
    torch.testing.assert_close(got.item(), expected, **VALUE_TOL)
    _, count = token_cross_entropy_block(logits, target, ignore_index=ignore_index)
    assert count.item() == (target != ignore_index).sum().item()


def test_token_cross_entropy_agrees_with_torch_mean_reduction() -> None:
    logits = _randn(4, 6, 5, seed=3)
    target = torch.randint(0, 5, (4, 6), generator=_gen(4))
    target[1, 2:] = -100
    expected = F.cross_entropy(logits.reshape(-1, 5), target.reshape(-1), label_smoothing=0.2)
    got = token_cross_entropy(logits, target, label_smoothing=0.2)
    torch.testing.assert_close(got, expected, **VALUE_TOL)
    _assert_same_grads(got, expected, [logits])


@pytest.mark.parametrize("shape", [(2, 3), (0, 3), (3,)])
def test_token_cross_entropy_all_ignored_is_zero_with_zero_gradient(shape: tuple[int, ...]) -> None:
    logits = _randn(*shape, 4, seed=0)
    target = torch.full(shape, -100)
    loss = token_cross_entropy(logits, target)
    (grad,) = torch.autograd.grad(loss, [logits])
    assert loss.item() == 0.0 and not torch.isnan(loss)
    assert torch.all(grad == 0)


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_token_cross_entropy_blocks_sum_to_full_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    # Uneven padding per block: a plain mean of per-block means would be wrong here.
    n = sum(sizes)
    logits = _randn(n, 6, 5, seed=0)
    target = torch.randint(0, 5, (n, 6), generator=_gen(1))
    for row in range(n):
        target[row, (row * 5) % 7 :] = -100
    parts = [token_cross_entropy_block(logits[s:e], target[s:e], label_smoothing=0.1) for s, e in _blocks(sizes)]
    blocked = sum(t for t, _ in parts) / sum(c for _, c in parts)
    full = token_cross_entropy(logits, target, label_smoothing=0.1)
    torch.testing.assert_close(blocked, full, **VALUE_TOL)
    _assert_same_grads(blocked, full, [logits])


# --------------------------------------------------------------------------------------------------
# Barlow Twins
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "d"), [(2, 3), (16, 4), (7, 1)])
@pytest.mark.parametrize(("lambda_offdiag", "eps"), [(5e-3, 1e-5), (0.5, 0.0), (0.0, 1e-2)])
def test_barlow_twins_matches_numpy_reference(n: int, d: int, lambda_offdiag: float, eps: float) -> None:
    za, zb = _randn(n, d, seed=n), _randn(n, d, seed=20 + n)
    za_shifted = za + 3.0  # a non-zero mean exercises the centring
    expected = ref_barlow(za_shifted.detach().numpy(), zb.detach().numpy(), lambda_offdiag, eps)
    got = barlow_twins_loss(za_shifted, zb, lambda_offdiag, eps)
    torch.testing.assert_close(got.item(), expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("sizes", PARTITIONS)
def test_barlow_twins_summed_shard_stats_equal_one_shot_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    n = sum(sizes)
    za, zb = _randn(n, 4, seed=1), _randn(n, 4, seed=2)
    shards = [barlow_twins_stats(za[s:e], zb[s:e]) for s, e in _blocks(sizes)]
    merged = shards[0]
    for shard in shards[1:]:
        merged = merged.merge(shard)
    assert merged.count.item() == n
    summed = BarlowTwinsStats(*(torch.stack(fields).sum(0) for fields in zip(*shards)))  # as all_reduce does
    full = barlow_twins_loss(za, zb)
    for stats in (merged, summed):
        got = barlow_twins_from_stats(stats)
        torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-12)
        _assert_same_grads(got, full, [za, zb])


def test_barlow_twins_gradient_matches_finite_difference() -> None:
    za, zb = _randn(5, 3, seed=1), _randn(5, 3, seed=2)
    torch.autograd.gradcheck(lambda a, b: barlow_twins_loss(a, b, 0.1), (za, zb))


def test_barlow_twins_stats_of_empty_shard_are_zero() -> None:
    stats = barlow_twins_stats(_randn(0, 3, seed=0), _randn(0, 3, seed=1))
    assert stats.count.item() == 0.0
    assert all(torch.all(field == 0) for field in stats)
    assert torch.isfinite(barlow_twins_from_stats(stats))


# --------------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------------


LOSSES_64_AND_32: list[tuple[str, Callable[[torch.dtype], torch.Tensor]]] = [
    ("clip", lambda dt: clip_loss(_randn(6, 4, seed=0).to(dt), _randn(6, 4, seed=1).to(dt), 2.0)),
    ("info_nce", lambda dt: info_nce_loss(_randn(6, 4, seed=0).to(dt), _randn(6, 4, seed=1).to(dt), 0.2)),
    ("supcon", lambda dt: supcon_loss(_randn(6, 2, 4, seed=0).to(dt), torch.tensor([0, 1, 0, 2, 1, 3]), 0.2)),
    ("siglip", lambda dt: siglip_loss(_randn(6, 4, seed=0).to(dt), _randn(6, 4, seed=1).to(dt), 3.0, -1.0)),
    ("barlow", lambda dt: barlow_twins_loss(_randn(6, 4, seed=0).to(dt), _randn(6, 4, seed=1).to(dt))),
    (
        "token_ce",
        lambda dt: token_cross_entropy(_randn(2, 3, 5, seed=0).to(dt), torch.tensor([[1, 2, -100], [0, 4, 3]])),
    ),
    ("weighted_mean", lambda dt: weighted_mean(_randn(6, seed=0).to(dt), _randn(6, seed=1).abs().to(dt))),
]


@pytest.mark.parametrize("fn", [f for _, f in LOSSES_64_AND_32], ids=[name for name, _ in LOSSES_64_AND_32])
def test_float32_agrees_with_float64(fn: Callable[[torch.dtype], torch.Tensor]) -> None:
    lo, hi = fn(torch.float32), fn(torch.float64)
    assert lo.dtype == torch.float32 and hi.dtype == torch.float64
    assert lo.shape == () and hi.shape == ()
    torch.testing.assert_close(lo.double(), hi, rtol=1e-5, atol=1e-5)


def test_half_precision_counts_are_accumulated_in_float32() -> None:
    values = torch.ones(5000, dtype=torch.bfloat16)
    total, count = weighted_mean_block(values)
    assert total.dtype == count.dtype == torch.float32
    assert count.item() == 5000.0 and total.item() == 5000.0


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------


def _t(*shape: int) -> torch.Tensor:
    return torch.zeros(shape)


BAD_INPUTS = [
    pytest.param(
        lambda: clip_loss(_t(4, 8), _t(3, 8), 1.0),
        r"`txt_all` must have the same shape as `img_all` \(4, 8\); got \(3, 8\)",
        id="clip_shape",
    ),
    pytest.param(
        lambda: clip_loss(_t(4), _t(4), 1.0),
        r"`img_all` must be a floating-point tensor of shape \(N, D\); got shape \(4,\)",
        id="clip_ndim",
    ),
    pytest.param(
        lambda: clip_loss(torch.zeros(2, 2, dtype=torch.long), _t(2, 2), 1.0),
        r"`img_all` .* dtype torch.int64",
        id="clip_int",
    ),
    pytest.param(
        lambda: clip_loss(_t(2, 2), _t(2, 2), float("nan")),
        r"`logit_scale` must be a finite number; got nan",
        id="clip_scale_nan",
    ),
    pytest.param(
        lambda: clip_loss(_t(2, 2), _t(2, 2), _t(2)),
        r"`logit_scale` must be a number or a one-element .* got shape \(2,\)",
        id="clip_scale_shape",
    ),
    pytest.param(
        lambda: clip_loss(_t(2, 2), _t(2, 2), "1"),
        r"`logit_scale` must be a number",
        id="clip_scale_str",
    ),
    pytest.param(
        lambda: clip_block(_t(3, 2), _t(3, 2), _t(4, 2), _t(4, 2), 1.0, 2),
        r"`row_start` \+ rows of `img_local` must lie in \[0, 4\] .* got 2 \+ 3 = 5",
        id="clip_block_range",
    ),
    pytest.param(
        lambda: clip_block(_t(1, 2), _t(1, 2), _t(4, 2), _t(4, 2), 1.0, -1),
        r"`row_start` .* got -1 \+ 1 = 0",
        id="clip_block_negative",
    ),
    pytest.param(
        lambda: clip_block(_t(1, 2), _t(1, 2), _t(4, 2), _t(4, 2), 1.0, 1.5),
        r"`row_start` must be an integer; got float",
        id="clip_block_float_start",
    ),
    pytest.param(
        lambda: clip_block(_t(1, 3), _t(1, 3), _t(4, 2), _t(4, 2), 1.0, 0),
        r"`img_local` must have the same trailing shape as `img_all` \(2,\); got \(3,\)",
        id="clip_block_dim",
    ),
    pytest.param(
        lambda: clip_block(_t(1, 2), _t(2, 2), _t(4, 2), _t(4, 2), 1.0, 0),
        r"`txt_local` must have the same shape as `img_local` \(1, 2\); got \(2, 2\)",
        id="clip_block_txt_local",
    ),
    pytest.param(
        lambda: info_nce_loss(_t(2, 2), _t(2, 2), 0.0),
        r"`temperature` must be a finite positive number; got 0.0",
        id="info_nce_zero_t",
    ),
    pytest.param(
        lambda: info_nce_loss(_t(2, 2), _t(2, 2), -1),
        r"`temperature` must be a finite positive number; got -1",
        id="info_nce_neg_t",
    ),
    pytest.param(
        lambda: info_nce_loss(_t(2, 2), _t(2, 2), float("inf")),
        r"`temperature` must be a finite positive number; got inf",
        id="info_nce_inf_t",
    ),
    pytest.param(
        lambda: info_nce_loss(_t(2, 2), _t(2, 3)),
        r"`z2_all` must have the same shape as `z1_all` \(2, 2\); got \(2, 3\)",
        id="info_nce_shape",
    ),
    pytest.param(
        lambda: supcon_loss(_t(3, 2), torch.tensor([0, 1])),
        r"`labels_all` must have shape \(3,\); got \(2,\)",
        id="supcon_labels_shape",
    ),
    pytest.param(
        lambda: supcon_loss(_t(3, 2), torch.zeros(3)),
        r"`labels_all` must be an integer tensor of shape \(3,\); got dtype torch.float32",
        id="supcon_labels_float",
    ),
    pytest.param(
        lambda: supcon_loss(_t(3, 2, 2, 2), torch.zeros(3, dtype=torch.long)),
        r"`features_all` must be a floating-point tensor of shape \(N, D\) or "
        r"\(N, V, D\); got shape \(3, 2, 2, 2\)",
        id="supcon_features_ndim",
    ),
    pytest.param(
        lambda: supcon_block(_t(1, 3, 2), _t(3, 2, 2), None, 0.1, 0),
        r"`features_local` must have the same trailing shape as `features_all` \(2, 2\); got \(3, 2\)",
        id="supcon_local_views",
    ),
    pytest.param(
        lambda: supcon_loss(_t(3, 2), None, 0),
        r"`temperature` must be a finite positive number; got 0",
        id="supcon_temperature",
    ),
    pytest.param(
        lambda: siglip_loss(_t(3, 2), _t(2, 2), 1.0, 0.0),
        r"`txt` must have the same shape as `img` \(3, 2\); got \(2, 2\)",
        id="siglip_shape",
    ),
    pytest.param(
        lambda: siglip_loss(_t(2, 2), _t(2, 2), 1.0, float("inf")),
        r"`logit_bias` must be a finite number; got inf",
        id="siglip_bias",
    ),
    pytest.param(
        lambda: siglip_block(_t(2, 2), _t(2, 2), 1.0, 0.0, 1),
        r"`row_start` \+ rows of `img_local` must lie in \[0, 2\] .* got 1 \+ 2 = 3",
        id="siglip_block_range",
    ),
    pytest.param(
        lambda: weighted_mean(_t(2, 3), _t(3, 3)),
        r"`weight` must broadcast to the shape of `values` \(2, 3\); got \(3, 3\)",
        id="weight_shape",
    ),
    pytest.param(
        lambda: weighted_mean(_t(3), _t(2, 3)),
        r"`weight` must broadcast to the shape of `values` \(3,\); got \(2, 3\)",
        id="weight_expands",
    ),
    pytest.param(
        lambda: weighted_mean(_t(3), mask=torch.ones(3)),
        r"`mask` must be a bool tensor; got dtype torch.float32",
        id="mask_dtype",
    ),
    pytest.param(
        lambda: weighted_mean(_t(3), mask=torch.ones(4, dtype=torch.bool)),
        r"`mask` must broadcast to the shape of `values` \(3,\); got \(4,\)",
        id="mask_shape",
    ),
    pytest.param(
        lambda: weighted_mean([1.0, 2.0]),
        r"`values` must be a tensor; got list",
        id="values_type",
    ),
    pytest.param(
        lambda: token_cross_entropy(_t(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)),
        r"`target` must have the shape of `logits` without its class dimension: `logits` of shape \(2, 3, 4\) read "
        r"as \(B, T, C\) \(class_dim=-1\) needs `target` of shape \(2, 3\); got \(2, 4\)",
        id="ce_target_shape",
    ),
    pytest.param(
        lambda: token_cross_entropy(_t(2, 4), torch.zeros(2)),
        r"`target` must be an integer tensor of shape \(2,\); got dtype torch.float32",
        id="ce_target_float",
    ),
    pytest.param(
        lambda: token_cross_entropy(_t(), torch.zeros((), dtype=torch.long)),
        r"`logits` must be a floating-point tensor of shape \(\.\.\., C\); got shape \(\)",
        id="ce_logits_0d",
    ),
    pytest.param(
        lambda: token_cross_entropy(_t(2, 4), torch.zeros(2, dtype=torch.long), label_smoothing=1.5),
        r"`label_smoothing` must be a number in \[0, 1\]; got 1.5",
        id="ce_smoothing",
    ),
    pytest.param(
        lambda: barlow_twins_loss(_t(4, 3), _t(4, 2)),
        r"`zb` must have the same shape as `za` \(4, 3\); got \(4, 2\)",
        id="barlow_shape",
    ),
    pytest.param(
        lambda: barlow_twins_loss(_t(4, 3), _t(4, 3), eps=-1.0),
        r"`eps` must be a finite non-negative number; got -1.0",
        id="barlow_eps",
    ),
    pytest.param(
        lambda: barlow_twins_loss(_t(4, 3), _t(4, 3), lambda_offdiag=float("nan")),
        r"`lambda_offdiag` must be a finite non-negative number; got nan",
        id="barlow_lambda",
    ),
    pytest.param(
        lambda: barlow_twins_from_stats((_t(3), _t(3), _t(3), _t(3), _t(3, 2), _t())),
        r"`stats.sum_ab` must have shape \(3, 3\); got \(3, 2\)",
        id="barlow_stats",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD_INPUTS)
def test_bad_input_raises_value_error_naming_argument(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
