"""Mixed precision: each loss's error against a float64 reference under ``torch.autocast``, beside open_clip's.

One process (W = 1), CPU autocast with ``bfloat16`` and ``float16``. The embeddings (unit rows for CLIP and
SigLIP, D = 256, each text a noisy copy of its image, all of them sharing a direction, as trained embeddings do)
are the leaves of the graph, given in the autocast dtype (as a model under autocast outputs them) and, for the
pairs with open_clip, also in float32 (cast by the products as ``torch.mm`` casts them). Every loss runs forward
under autocast and backward after it, as in a training step. The float64 reference is written here from the
formulas (``F.cross_entropy``, ``F.logsigmoid``, a standardized cross-correlation), on the same input values.
Reported per loss, dtype and input form:

- value: ``|loss - loss64|`` (the losses are O(1));
- gradient: ``‖g - g64‖ / ‖g64‖`` over the gradients of every input embedding.

Pairs with open_clip (``ClipLoss()``, ``SigLipLoss()``, loaded from its ``loss.py`` as in ``bench_anchors``) run
on the same inputs under the same autocast; the checks ask ours ≤ open_clip's, value and gradient, per loss and
dtype, with inputs in the autocast dtype. With float32 inputs both sides round the same operands to the
autocast dtype first; that shared rounding is most of either side's value error, so those rows are reported,
not checked. CLIP and SigLIP at N = 4096 rows (``logit_scale`` 100; SigLIP's scale 10 and bias -10, its
initialization), InfoNCE at N = 2048 samples (4096 embeddings, temperature 0.1), SupCon at N = 4096 (100
classes, temperature 0.1) and Barlow Twins at N = 4096.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from _timing import Check, open_clip_loss, run_spawned, table

D = 256
N = 4096
QUICK_N = 1024
DTYPES = ("bfloat16", "float16")
CLIP_SCALE, SIGLIP_SCALE, SIGLIP_BIAS = 100.0, 10.0, -10.0
TEMPERATURE, CLASSES, LAMBDA = 0.1, 100, 5e-3
F64 = torch.float64


# ---------------------------------------------------------------------------------------- float64 references
def _ref_clip(img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
    logits = CLIP_SCALE * img @ txt.T
    labels = torch.arange(img.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _ref_siglip(img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
    logits = SIGLIP_SCALE * img @ txt.T + SIGLIP_BIAS
    signs = 2 * torch.eye(img.shape[0], dtype=logits.dtype) - 1
    return -F.logsigmoid(signs * logits).sum() / img.shape[0]


def _ref_info_nce(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = (z @ z.T / TEMPERATURE).fill_diagonal_(-torch.inf)
    return F.cross_entropy(logits, (torch.arange(2 * n) + n) % (2 * n))


def _ref_supcon(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    z = F.normalize(features, dim=1)
    logits = (z @ z.T / TEMPERATURE).fill_diagonal_(-torch.inf)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positive = (labels[:, None] == labels[None, :]).fill_diagonal_(False)
    count = positive.sum(1)
    per_anchor = -torch.where(positive, log_prob, 0.0).sum(1) / count.clamp_min(1)
    return per_anchor[count > 0].mean()


def _ref_barlow(za: torch.Tensor, zb: torch.Tensor) -> torch.Tensor:
    def standardize(z: torch.Tensor) -> torch.Tensor:
        centred = z - z.mean(0)
        return centred / torch.sqrt((centred**2).mean(0) + 1e-5)

    corr = standardize(za).T @ standardize(zb) / za.shape[0]
    off = corr - torch.diag(torch.diagonal(corr))
    return ((1 - torch.diagonal(corr)) ** 2).sum() + LAMBDA * (off**2).sum()


# ---------------------------------------------------------------------------------------------- the cases
def _inputs(kind: str, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(float32 embeddings, other inputs)`` of one case."""
    g = torch.Generator().manual_seed(7)
    # like trained embeddings: a shared direction (mean cosine ~0.05 between any two rows, ~0.27 within a pair),
    # so that the logits reach ~30 at logit_scale 100 and the losses are O(1)
    common = F.normalize(torch.randn(D, generator=g), dim=0)
    x = 0.5 * common + torch.randn(n, D, generator=g) / D**0.5
    y = x + 4 * torch.randn(n, D, generator=g) / D**0.5
    if kind in ("clip", "siglip"):
        return [F.normalize(x, dim=1), F.normalize(y, dim=1)], []
    if kind == "infonce":
        return [x[: n // 2], y[: n // 2]], []
    if kind == "supcon":
        return [x], [torch.randint(0, CLASSES, (n,), generator=g)]
    return [x, y], []  # barlow


def _losses(kind: str) -> dict[str, Callable[..., torch.Tensor]]:
    """``{side: loss(*embeddings, *others)}``: ours (and our ring) and, for CLIP and SigLIP, open_clip's."""
    from torchmetrics_diff.functional import (
        barlow_twins_loss,
        global_clip_loss,
        global_info_nce_loss,
        global_siglip_loss,
        global_supcon_loss,
    )

    if kind == "clip":
        oc = open_clip_loss().ClipLoss()
        scale = torch.tensor(CLIP_SCALE)
        return {
            "ours": lambda i, t: global_clip_loss(i, t, scale),
            "ours, ring": lambda i, t: global_clip_loss(i, t, scale, strategy="ring"),
            "open_clip": lambda i, t: oc(i, t, scale),
        }
    if kind == "siglip":
        oc = open_clip_loss().SigLipLoss()
        scale, bias = torch.tensor(SIGLIP_SCALE), torch.tensor(SIGLIP_BIAS)
        return {
            "ours": lambda i, t: global_siglip_loss(i, t, scale, bias),
            "ours, ring": lambda i, t: global_siglip_loss(i, t, scale, bias, strategy="ring"),
            "open_clip": lambda i, t: oc(i, t, scale, bias),
        }
    if kind == "infonce":
        return {"ours": lambda a, b: global_info_nce_loss(a, b, TEMPERATURE)}
    if kind == "supcon":
        return {"ours": lambda f, labels: global_supcon_loss(f, labels, TEMPERATURE)}
    return {"ours": lambda a, b: barlow_twins_loss(a, b, LAMBDA)}


REFERENCES = {"clip": _ref_clip, "siglip": _ref_siglip, "infonce": _ref_info_nce, "supcon": _ref_supcon}
REFERENCES["barlow"] = _ref_barlow
KINDS = ("clip", "siglip", "infonce", "supcon", "barlow")


def _errors(
    loss: Callable[..., torch.Tensor],
    xs: list[torch.Tensor],
    others: list[torch.Tensor],
    dtype: torch.dtype,
    ref_value: torch.Tensor,
    ref_grads: list[torch.Tensor],
) -> tuple[float, float, str]:
    """``(value error, gradient error, the value's dtype)`` of one loss under autocast, on leaves ``xs``."""
    with torch.autocast("cpu", dtype=dtype):
        value = loss(*xs, *others)
    value.backward()
    grad = torch.cat([x.grad.to(F64).reshape(-1) for x in xs])
    want = torch.cat([g.reshape(-1) for g in ref_grads])
    return (
        abs(float(value.detach().to(F64)) - float(ref_value)),
        float((grad - want).norm() / want.norm()),
        str(value.dtype).removeprefix("torch."),
    )


def _measure(rank: int, world: int, n: int) -> list[dict[str, Any]]:
    import os
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(os.cpu_count() or 1)  # an error measurement, not a timing: every core
    rows = []
    for kind in KINDS:
        floats, others = _inputs(kind, n)
        for name in DTYPES:
            dtype = getattr(torch, name)
            # the embeddings in the autocast dtype (as a model under autocast gives them), and, for the pairs with
            # open_clip, in float32 (cast to the autocast dtype by the products, as torch.mm casts them)
            for form in ("half", "float32") if kind in ("clip", "siglip") else ("half",):
                given = [x.to(dtype if form == "half" else torch.float32) for x in floats]
                exact = [x.to(F64).requires_grad_() for x in given]
                ref = REFERENCES[kind](*exact, *others)
                ref_grads = list(torch.autograd.grad(ref, exact))
                for side, loss in _losses(kind).items():
                    if form == "float32" and side == "ours, ring":
                        continue
                    xs = [x.clone().requires_grad_() for x in given]
                    value_err, grad_err, out_dtype = _errors(loss, xs, others, dtype, ref.detach(), ref_grads)
                    rows.append(
                        {
                            "kind": kind,
                            "side": side,
                            "dtype": name,
                            "form": form,
                            "value": value_err,
                            "grad": grad_err,
                            "out": out_dtype,
                        }
                    )
    return rows


# ------------------------------------------------------------------------------------------------ report
LABELS = {"clip": "CLIP", "siglip": "SigLIP", "infonce": "InfoNCE", "supcon": "SupCon", "barlow": "Barlow Twins"}


def main(args: Any) -> list[Check]:
    n = QUICK_N if getattr(args, "quick", False) else N
    try:
        open_clip_loss()
    except Exception as err:
        print(f"open_clip's loss module not importable ({type(err).__name__}: {err}); install the bench extra\n")
        return [
            Check(f"precision {LABELS[k]} {d}: ours <= open_clip", None, "<=", 1.0)
            for k in ("clip", "siglip")
            for d in DTYPES
        ]
    t0 = time.perf_counter()
    rows = run_spawned(_measure, 1, n, timeout=900.0)
    lines = []
    for r in rows:
        inputs = r["dtype"] if r["form"] == "half" else "float32"
        lines.append(
            [
                f"{LABELS[r['kind']]} ({r['side']})",
                r["dtype"],
                inputs,
                r["out"],
                f"{r['value']:.1e}",
                f"{r['grad']:.1e}",
            ]
        )
    print(
        table(
            f"Error against float64 under CPU autocast, N={n}, D={D} (W=1)",
            ["loss", "autocast", "inputs", "value dtype", "|value - value64|", "‖grad - grad64‖ / ‖grad64‖"],
            lines,
            [
                "embeddings under torch.autocast('cpu', dtype), backward after it; the float64 reference on the same "
                "input values. float32 inputs: both sides round the same operands (s·img and txt) to the autocast "
                "dtype, and that shared rounding is most of either value error",
                f"CLIP logit_scale {CLIP_SCALE:g}; SigLIP scale {SIGLIP_SCALE:g}, bias {SIGLIP_BIAS:g}; InfoNCE N/2 "
                f"samples x 2 views, SupCon {CLASSES} classes, temperature {TEMPERATURE:g}; Barlow Twins "
                f"lambda {LAMBDA:g}",
                f"({time.perf_counter() - t0:.0f} s)",
            ],
        )
    )
    by = {(r["kind"], r["side"], r["dtype"]): r for r in rows if r["form"] == "half"}
    checks = []
    for kind in ("clip", "siglip"):
        for name in DTYPES:
            theirs = by[(kind, "open_clip", name)]
            for side in ("ours", "ours, ring"):
                ours = by[(kind, side, name)]
                for what in ("value", "grad"):
                    label = "value" if what == "value" else "gradient"
                    checks.append(
                        Check(
                            f"precision {LABELS[kind]} ({side}) {name} inputs: {label} error ours / open_clip's",
                            ours[what] / theirs[what] if theirs[what] else None,
                            "<=",
                            1.0,
                        )
                    )
    return checks
