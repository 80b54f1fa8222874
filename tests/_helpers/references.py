"""Reference losses written from the papers' formulas, the oracle the package's distributed losses are checked against.

Explicit loops over anchors, pairs or tokens (torch scalar ops, so autograd gives the single-process gradient).
None of them calls ``torchmetrics_diff``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests._helpers.seeds import F64

IGNORE = -100


def _log_sum_exp(xs: list[Tensor]) -> Tensor:
    """``log Σ exp(x)`` of a list of scalars, shifted by their (detached) max."""
    shift = max(float(x.detach()) for x in xs)
    return shift + torch.log(sum(torch.exp(x - shift) for x in xs))


def _unit(rows: Tensor) -> Tensor:
    return rows / torch.sqrt((rows * rows).sum(dim=-1, keepdim=True))


def _zero_like_graph(*tensors: Tensor) -> Tensor:
    """A 0 that still depends on ``tensors`` (zero gradient)."""
    return sum((t.sum() * 0.0 for t in tensors), torch.zeros((), dtype=F64))


def ref_clip(img: Tensor, txt: Tensor, scale: Tensor | float) -> Tensor:
    """CLIP (Radford et al. 2021): mean over i of ½[CE(image i → texts, i) + CE(text i → images, i)]."""
    n = img.shape[0]
    if n == 0:
        return _zero_like_graph(img, txt, torch.as_tensor(scale))
    terms = []
    for i in range(n):
        i2t = [scale * torch.dot(img[i], txt[j]) for j in range(n)]
        t2i = [scale * torch.dot(txt[i], img[j]) for j in range(n)]
        terms.append(((_log_sum_exp(i2t) - i2t[i]) + (_log_sum_exp(t2i) - t2i[i])) / 2)
    return torch.stack(terms).mean()


def ref_info_nce(z1: Tensor, z2: Tensor, temperature: float) -> Tensor:
    """NT-Xent (SimCLR, Chen et al. 2020): 2N anchors, positive = the other view, denominator = all k ≠ a."""
    n = z1.shape[0]
    if n == 0:
        return _zero_like_graph(z1, z2)
    z = torch.cat([_unit(z1), _unit(z2)])
    terms = []
    for a in range(2 * n):
        positive = (a + n) % (2 * n)
        sims = {k: torch.dot(z[a], z[k]) / temperature for k in range(2 * n) if k != a}
        terms.append(_log_sum_exp(list(sims.values())) - sims[positive])
    return torch.stack(terms).mean()


def ref_supcon(features: Tensor, labels: Tensor | None, temperature: float) -> Tensor:
    """SupCon L_out (Khosla et al. 2020) over anchors that have a positive; 0 if none has.

    Anchors are ordered view-major, as in the authors' reference code (``torch.cat(torch.unbind(f, 1))``).
    """
    if features.ndim == 2:
        features = features[:, None, :]
    n, views, _ = features.shape
    z = _unit(torch.cat(torch.unbind(features, dim=1)))
    sample_labels = list(range(n)) if labels is None else [int(v) for v in labels]
    anchor_labels = sample_labels * views
    terms = []
    for a in range(n * views):
        others = [k for k in range(n * views) if k != a]
        positives = [k for k in others if anchor_labels[k] == anchor_labels[a]]
        if not positives:
            continue
        sims = {k: torch.dot(z[a], z[k]) / temperature for k in others}
        log_denominator = _log_sum_exp(list(sims.values()))
        terms.append(-sum(sims[p] - log_denominator for p in positives) / len(positives))
    if not terms:
        return _zero_like_graph(features)
    return torch.stack(terms).mean()


def ref_siglip(img: Tensor, txt: Tensor, scale: Tensor | float, bias: Tensor | float) -> Tensor:
    """SigLIP (Zhai et al. 2023): -(1/N) Σ_ij log σ(z_ij (t x_i·y_j + b)), z_ii = 1, z_ij = -1."""
    n = img.shape[0]
    if n == 0:
        return _zero_like_graph(img, txt, torch.as_tensor(scale), torch.as_tensor(bias))
    total = torch.zeros((), dtype=F64)
    for i in range(n):
        for j in range(n):
            sign = 1.0 if i == j else -1.0
            x = sign * (scale * torch.dot(img[i], txt[j]) + bias)
            total = total + torch.log1p(torch.exp(-x))  # -log σ(x)
    return total / n


def ref_barlow(za: Tensor, zb: Tensor, lambda_offdiag: float, eps: float = 1e-5) -> Tensor:
    """Barlow Twins (Zbontar et al. 2021): batch-standardize (population variance + eps), C = z_aᵀ z_b / N."""
    n, d = za.shape
    za = (za - za.mean(dim=0)) / torch.sqrt(((za - za.mean(dim=0)) ** 2).mean(dim=0) + eps)
    zb = (zb - zb.mean(dim=0)) / torch.sqrt(((zb - zb.mean(dim=0)) ** 2).mean(dim=0) + eps)
    total = torch.zeros((), dtype=F64)
    for i in range(d):
        for j in range(d):
            c_ij = (za[:, i] * zb[:, j]).sum() / n
            total = total + ((1 - c_ij) ** 2 if i == j else lambda_offdiag * c_ij**2)
    return total


def ref_vicreg(
    za: Tensor, zb: Tensor, sim: float = 25.0, std: float = 25.0, cov: float = 1.0, eps: float = 1e-4
) -> Tensor:
    """VICReg (Bardes et al. 2022, Algorithm 1): MSE between the views; per view the mean over features of
    relu(1 - sqrt(unbiased variance + eps)); per view the squared off-diagonal covariances (divisor N - 1) summed and
    divided by D, by a double loop."""
    n, d = za.shape
    total = sim * ((za - zb) ** 2).mean()
    for z in (za, zb):
        centered = z - z.mean(dim=0)
        total = total + std * torch.relu(1 - torch.sqrt(centered.pow(2).sum(dim=0) / (n - 1) + eps)).mean()
        off = torch.zeros((), dtype=z.dtype)
        for i in range(d):
            for j in range(d):
                if i != j:
                    off = off + ((centered[:, i] * centered[:, j]).sum() / (n - 1)) ** 2
        total = total + cov * off / d
    return total


def ref_weighted_mean(values: Tensor, weight: Tensor | None, mask: Tensor | None) -> Tensor:
    """Σ w v / Σ w over the unmasked elements (0 when there are none)."""
    weight = torch.ones_like(values) if weight is None else torch.as_tensor(weight, dtype=values.dtype)
    weight = weight.expand(values.shape)
    keep = torch.ones(values.shape, dtype=torch.bool) if mask is None else mask.expand(values.shape)
    if not bool(keep.any()):
        return _zero_like_graph(values[keep])
    return (values[keep] * weight[keep]).sum() / weight[keep].sum()


def ref_token_ce(logits: Tensor, target: Tensor, ignore_index: int = IGNORE, smoothing: float = 0.0) -> Tensor:
    """Mean over non-ignored tokens of (1-ε)(-log p_y) + ε·mean_c(-log p_c) (0 when every token is ignored)."""
    rows, labels = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    terms = []
    for row, label in zip(rows, labels):
        if int(label) == ignore_index:
            continue
        lse = _log_sum_exp(list(row))
        nll = lse - row[int(label)]
        uniform = sum(lse - row[c] for c in range(row.shape[0])) / row.shape[0]
        terms.append((1 - smoothing) * nll + smoothing * uniform)
    if not terms:
        return _zero_like_graph(logits)
    return torch.stack(terms).mean()
