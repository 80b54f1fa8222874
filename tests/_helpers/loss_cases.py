"""The loss kinds of the global-batch loss tests: the replicated model, seeded data, the criterion and its call,
and the single-process step on the whole global batch (the oracle, from :mod:`tests._helpers.references`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tests._helpers.references import (
    IGNORE,
    ref_barlow,
    ref_clip,
    ref_info_nce,
    ref_siglip,
    ref_supcon,
    ref_token_ce,
    ref_vicreg,
    ref_weighted_mean,
)
from tests._helpers.seeds import F64, generator
from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    LoadBalancingLoss,
    RouterZLoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
    VICRegLoss,
)

D_IN, D_EMB, SEQ, N_CLASSES, N_LABELS = 5, 4, 3, 6, 3
TEMPERATURE = 0.5
LAMBDA_OFFDIAG = 0.05

#: loss kinds of the model/data/reference triples below; ``supcon_mv`` is SupCon on (B, V=2, D) features
KINDS = ("clip", "infonce", "supcon", "supcon_mv", "siglip", "barlow", "mean", "tokence")
STRATEGY_KINDS = ("clip", "infonce", "supcon", "supcon_mv", "siglip")
#: the Mixture-of-Experts router losses (N_CLASSES experts, top-2, a padding mask); not in KINDS: their own tests
#: are tests/unittests/losses/test_moe.py, these serve the device checks
MOE_KINDS = ("moe_balance", "moe_z")
#: VICReg (two views, as Barlow Twins); not in KINDS either: its own tests are tests/unittests/losses/test_vicreg.py
SSL_KINDS = ("vicreg",)
#: names of the parameters used inside the loss itself (not by an encoder)
LOSS_PARAMS = ("log_logit_scale", "logit_bias")
#: how the sharded CLIP combines its column statistics across ranks (``_global.contrastive._columns_by_gather``)
COLUMN_BRANCHES = ("gather", "reductions")


# --------------------------------------------------------------------------------------------- the model


class Net(nn.Module):
    """The replicated model of one loss kind: one or two ``Linear`` encoders (+ logit scale / bias), float64.

    Its parameters depend only on ``kind`` (seeded), so every process builds the same model.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        with torch.random.fork_rng(devices=[]):  # nn.Linear's default init draws from the global RNG
            self.enc_a = nn.Linear(D_IN, N_CLASSES if kind in ("tokence", *MOE_KINDS) else D_EMB, dtype=F64)
            if kind in ("clip", "siglip", "infonce", "barlow", "vicreg"):
                self.enc_b = nn.Linear(D_IN, D_EMB, dtype=F64)
        if kind in ("clip", "siglip"):
            self.log_logit_scale = nn.Parameter(torch.tensor(math.log(5.0), dtype=F64))
        if kind == "siglip":
            self.logit_bias = nn.Parameter(torch.tensor(-2.0, dtype=F64))
        g = generator("net", kind)
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
        if kind in ("infonce", "barlow", "vicreg"):
            return self.enc_a(inputs[0]), self.enc_b(inputs[1])
        return (self.enc_a(inputs[0]),)


# ---------------------------------------------------------------------------------------------- the data


def make_batch(kind: str, n: int, *parts: object) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """``(inputs, extra)`` of a global batch of ``n`` rows; every tensor is sliced by rows (dim 0)."""
    g = generator("batch", kind, n, *parts)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=F64)

    if kind in ("clip", "siglip", "infonce", "barlow", "vicreg"):
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
    if kind in MOE_KINDS:
        return (randn(n, D_IN),), (torch.rand(n, generator=g) < 0.8,)
    raise ValueError(kind)


def slice_rows(tensors: tuple[Tensor, ...], lo: int, hi: int) -> tuple[Tensor, ...]:
    return tuple(t[lo:hi] for t in tensors)


def criterion_call(kind: str, outputs: tuple[Tensor, ...], extra: tuple[Tensor, ...]) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of the loss call for the model's outputs."""
    if kind == "mean":
        y, weight, mask = extra
        return ((outputs[0] - y) ** 2,), {"weight": weight, "mask": mask}
    if kind == "moe_balance":
        probs = outputs[0].softmax(-1)
        return (probs, probs.detach().topk(2, dim=-1).indices), {"mask": extra[0]}
    if kind == "moe_z":
        return (outputs[0],), {"mask": extra[0]}
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
    if kind == "moe_balance":
        return LoadBalancingLoss(N_CLASSES, top_k=2, **opts)
    if kind == "moe_z":
        return RouterZLoss(**opts)
    if kind == "vicreg":
        return VICRegLoss(**opts)
    raise ValueError(kind)


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
    if kind == "vicreg":
        return ref_vicreg(*outputs)
    if kind == "mean":
        y, weight, mask = extra
        return ref_weighted_mean((outputs[0] - y) ** 2, weight, mask)
    if kind == "tokence":
        return ref_token_ce(outputs[0], extra[0])
    if kind in MOE_KINDS:  # Switch eq. 4-6 with top-2 (f detached) / ST-MoE's mean logsumexp², over kept tokens
        logits, keep = outputs[0][extra[0]], extra[0]
        if kind == "moe_z":
            return torch.logsumexp(logits, dim=-1).square().sum() / keep.sum()
        probs = logits.softmax(-1)
        chosen = F.one_hot(probs.detach().topk(2, dim=-1).indices, N_CLASSES).sum(dim=1).to(F64)
        return N_CLASSES * (chosen.mean(dim=0) / 2 * probs.mean(dim=0)).sum()
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


# ------------------------------------------------------------------------------- the sharded CLIP's columns


@contextmanager
def column_branch(branch: str) -> Iterator[list[bool]]:
    """Run the sharded CLIP's column statistics through ``branch`` of the rule, whatever ``W`` and ``N``.

    ``"gather"``: one all-gather of the ``W × N`` table; ``"reductions"``: two all-reduces of ``N`` numbers. The
    rule's limits are patched in this process (call it on every rank alike) and restored on exit. Yields the
    rule's decisions made inside (``True``: gather), so that a test can check which branch ran.
    """
    from torchmetrics_diff._global import contrastive

    if branch not in COLUMN_BRANCHES:
        raise ValueError(branch)
    rule = contrastive._columns_by_gather
    decisions: list[bool] = []

    def recorded(world: int, m: int, itemsize: int) -> bool:
        decisions.append(rule(world, m, itemsize))
        return decisions[-1]

    limits = {"_GATHER_MAX_WORLD": 1 << 30} if branch == "gather" else {"_GATHER_MAX_WORLD": 0, "_GATHER_MAX_BYTES": 0}
    with ExitStack() as stack:
        for name, value in limits.items():
            stack.enter_context(mock.patch.object(contrastive, name, value))
        stack.enter_context(mock.patch.object(contrastive, "_columns_by_gather", recorded))
        yield decisions
