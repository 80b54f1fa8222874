"""Shared pieces of the global-batch loss tests: seeded data, the replicated model, and independent references.

The reference losses are written from the papers' formulas with explicit loops over anchors, pairs or tokens
(torch scalar ops, so autograd gives the single-process gradient). None of them calls ``torchmetrics_diff``: they
are the oracle the package's distributed losses are checked against.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
D_IN, D_EMB, SEQ, N_CLASSES, N_LABELS = 5, 4, 3, 6, 3
TEMPERATURE = 0.5
LAMBDA_OFFDIAG = 0.05
IGNORE = -100

#: loss kinds of the model/data/reference triples below; ``supcon_mv`` is SupCon on (B, V=2, D) features
KINDS = ("clip", "infonce", "supcon", "supcon_mv", "siglip", "barlow", "mean", "tokence")
STRATEGY_KINDS = ("clip", "infonce", "supcon", "supcon_mv", "siglip")
#: names of the parameters used inside the loss itself (not by an encoder)
LOSS_PARAMS = ("log_logit_scale", "logit_bias")


def seed(*parts: object) -> int:
    """A seed equal in every process (``hash`` of a str is salted per process)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed(*parts))


def bounds(sizes: tuple[int, ...] | list[int], rank: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the global batch held by ``rank``."""
    return sum(sizes[:rank]), sum(sizes[: rank + 1])


# --------------------------------------------------------------------------------------------- the model


class Net(nn.Module):
    """The replicated model of one loss kind: one or two ``Linear`` encoders (+ logit scale / bias), float64.

    Its parameters depend only on ``kind`` (seeded), so every process builds the same model.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        with torch.random.fork_rng(devices=[]):  # nn.Linear's default init draws from the global RNG
            self.enc_a = nn.Linear(D_IN, N_CLASSES if kind == "tokence" else D_EMB, dtype=F64)
            if kind in ("clip", "siglip", "infonce", "barlow"):
                self.enc_b = nn.Linear(D_IN, D_EMB, dtype=F64)
        if kind in ("clip", "siglip"):
            self.log_logit_scale = nn.Parameter(torch.tensor(math.log(5.0), dtype=F64))
        if kind == "siglip":
            self.logit_bias = nn.Parameter(torch.tensor(-2.0, dtype=F64))
        g = gen("net", kind)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("enc_"):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=F64) * 0.5)

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        kind = self.kind
        if kind in ("clip", "siglip"):
            img = F.normalize(self.enc_a(inputs[0]), dim=-1)
            txt = F.normalize(self.enc_b(inputs[1]), dim=-1)
            out = (img, txt, self.log_logit_scale.exp())
            return (*out, self.logit_bias) if kind == "siglip" else out
        if kind in ("infonce", "barlow"):
            return self.enc_a(inputs[0]), self.enc_b(inputs[1])
        return (self.enc_a(inputs[0]),)


# ---------------------------------------------------------------------------------------------- the data


def make_batch(kind: str, n: int, *parts: object) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """``(inputs, extra)`` of a global batch of ``n`` rows; every tensor is sliced by rows (dim 0)."""
    g = gen("batch", kind, n, *parts)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=F64)

    if kind in ("clip", "siglip", "infonce", "barlow"):
        xa = randn(n, D_IN)
        return (xa, xa + 0.5 * randn(n, D_IN)), ()  # correlated views: the positives are informative
    if kind in ("supcon", "supcon_mv"):
        x = randn(n, D_IN) if kind == "supcon" else randn(n, 2, D_IN)
        return (x,), (torch.randint(0, N_LABELS, (n,), generator=g),)
    if kind == "mean":
        x, y = randn(n, D_IN), randn(n, D_EMB)
        mask = torch.rand(n, D_EMB, generator=g) < 0.7
        y = torch.where(mask, y, torch.full_like(y, 1e3))  # padding: garbage, finite (it passes through the model)
        weight = 0.5 + 1.5 * torch.rand(n, 1, generator=g, dtype=F64)
        return (x,), (y, weight, mask)
    if kind == "tokence":
        x = randn(n, SEQ, D_IN)
        target = torch.randint(0, N_CLASSES, (n, SEQ), generator=g)
        target = torch.where(torch.rand(n, SEQ, generator=g) < 0.3, torch.full_like(target, IGNORE), target)
        return (x,), (target,)
    raise ValueError(kind)


def slice_rows(tensors: tuple[Tensor, ...], lo: int, hi: int) -> tuple[Tensor, ...]:
    return tuple(t[lo:hi] for t in tensors)


def criterion_call(kind: str, outputs: tuple[Tensor, ...], extra: tuple[Tensor, ...]) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of the loss call for the model's outputs."""
    if kind == "mean":
        y, weight, mask = extra
        return ((outputs[0] - y) ** 2,), {"weight": weight, "mask": mask}
    return (*outputs, *extra), {}


def make_criterion(kind: str, strategy: str | None = None, grad_reduction: str = "mean", **kwargs: Any) -> Any:
    opts: dict[str, Any] = {"grad_reduction": grad_reduction, **kwargs}
    if strategy is not None:
        opts["strategy"] = strategy
    if kind == "clip":
        return CLIPLoss(**opts)
    if kind == "siglip":
        return SigLIPLoss(**opts)
    if kind == "infonce":
        return InfoNCELoss(temperature=TEMPERATURE, **opts)
    if kind in ("supcon", "supcon_mv"):
        return SupConLoss(temperature=TEMPERATURE, **opts)
    if kind == "barlow":
        return BarlowTwinsLoss(lambda_offdiag=LAMBDA_OFFDIAG, **opts)
    if kind == "mean":
        return GlobalMeanLoss(**opts)
    if kind == "tokence":
        return TokenCrossEntropyLoss(ignore_index=IGNORE, **opts)
    raise ValueError(kind)


# -------------------------------------------------------------------------------- independent references


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


def reference(kind: str, outputs: tuple[Tensor, ...], extra: tuple[Tensor, ...]) -> Tensor:
    """The single-process loss of the model's outputs on the whole global batch."""
    if kind == "clip":
        return ref_clip(*outputs)
    if kind == "siglip":
        return ref_siglip(*outputs)
    if kind == "infonce":
        return ref_info_nce(*outputs, TEMPERATURE)
    if kind in ("supcon", "supcon_mv"):
        return ref_supcon(outputs[0], extra[0], TEMPERATURE)
    if kind == "barlow":
        return ref_barlow(*outputs, LAMBDA_OFFDIAG)
    if kind == "mean":
        y, weight, mask = extra
        return ref_weighted_mean((outputs[0] - y) ** 2, weight, mask)
    if kind == "tokence":
        return ref_token_ce(outputs[0], extra[0])
    raise ValueError(kind)


def reference_step(kind: str, n: int, *parts: object) -> tuple[float, dict[str, Tensor]]:
    """Value and parameter gradients of one process running ``Net(kind)`` on the whole global batch."""
    model = Net(kind)
    inputs, extra = make_batch(kind, n, *parts)
    value = reference(kind, model(*inputs), extra)
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad(value, params, allow_unused=True)
    return float(value.detach()), {k: torch.zeros_like(p) if g is None else g for k, p, g in zip(names, params, grads)}


def reference_weight(kind: str, n: int, *parts: object) -> float:
    """The denominator of a normalized loss's global batch: Σ weight over unmasked elements, or valid tokens."""
    _, extra = make_batch(kind, n, *parts)
    if kind == "mean":
        _, weight, mask = extra
        return float((weight.expand(mask.shape) * mask).sum())
    if kind == "tokence":
        return float((extra[0] != IGNORE).sum())
    raise ValueError(kind)


# ------------------------------------------------------------------------------------------- comparisons


def max_err(got: Tensor | float | None, want: Tensor | float) -> float:
    """Max |got - want| measured against 1e-10 × max(1, |want|): ≤ 1 is a pass (NaN / None never pass)."""
    if got is None:
        return math.inf
    got, want = torch.as_tensor(got, dtype=F64), torch.as_tensor(want, dtype=F64)
    if got.shape != want.shape:
        return math.inf
    if got.numel() == 0:
        return 0.0
    scale = max(1.0, float(want.abs().max()))
    err = float((got - want).abs().max())
    return math.inf if math.isnan(err) else err / (1e-10 * scale)
