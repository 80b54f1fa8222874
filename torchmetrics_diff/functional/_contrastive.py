"""Contrastive and normalized losses as pure functions of tensors.

Every loss comes in two forms:

- a *block* form ``*_block(...) -> (loss_sum, count)`` that sums the loss over a contiguous block of
  anchor rows ``[row_start, row_start + n_rows)`` of the global problem, scored against *all* global
  candidates. The local rows are passed separately from the global tensors so that gradients reach
  them through their own path; the global tensors contain the local rows too.
- a *full-batch* form, the block over all rows divided by the count: the single-device loss.

Summing the block sums of a partition of the rows and dividing by the summed counts gives the
full-batch value and, by linearity, the full-batch gradient. This is what the distributed layer relies
on: it gathers the global candidates and calls the block form with its own rows. Nothing here talks to
``torch.distributed``.

Sums and counts are accumulated in at least float32 (half-precision counts are not exact beyond 2048).
A full-batch loss whose count is zero is ``0`` with a zero gradient, never ``NaN``.
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from torchmetrics_diff.functional._fused import clip_sum, sigmoid_sum, softmax_xent_sum

__all__ = [
    "BarlowTwinsStats",
    "barlow_twins_from_stats",
    "barlow_twins_loss",
    "barlow_twins_stats",
    "clip_block",
    "clip_loss",
    "info_nce_block",
    "info_nce_loss",
    "siglip_block",
    "siglip_loss",
    "supcon_block",
    "supcon_loss",
    "token_cross_entropy",
    "token_cross_entropy_block",
    "weighted_mean",
    "weighted_mean_block",
]

Scalar = Union[Tensor, float]

# --------------------------------------------------------------------------------------------------
# Validation and small helpers
# --------------------------------------------------------------------------------------------------


def _shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_float_tensor(name: str, x: object, ndim: int | tuple[int, ...] | None, layout: str) -> None:
    """Raise unless ``x`` is a floating tensor of ``ndim`` dims (one of a tuple; ``None``: at least 1)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a tensor of shape {layout}; got {type(x).__name__}")
    dims_ok = x.ndim >= 1 if ndim is None else x.ndim in ((ndim,) if isinstance(ndim, int) else ndim)
    if not dims_ok or not x.is_floating_point():
        raise ValueError(
            f"`{name}` must be a floating-point tensor of shape {layout}; got shape {_shape(x)} and dtype {x.dtype}"
        )


def _check_same_shape(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"`{name}` must have the same shape as `{ref_name}` {_shape(ref)}; got {_shape(x)}")


def _check_trailing(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Raise unless ``x`` and ``ref`` agree in every dimension but the first (the rows)."""
    if x.shape[1:] != ref.shape[1:]:
        raise ValueError(
            f"`{name}` must have the same trailing shape as `{ref_name}` {_shape(ref)[1:]}; got {_shape(x)[1:]}"
        )


def _check_row_block(row_start: int, n_rows: int, local_name: str, total: int, all_name: str) -> int:
    """Validate that rows ``[row_start, row_start + n_rows)`` lie inside ``[0, total)``."""
    try:
        row_start = operator.index(row_start)
    except TypeError:
        raise ValueError(f"`row_start` must be an integer; got {type(row_start).__name__}") from None
    if row_start < 0 or row_start + n_rows > total:
        raise ValueError(
            f"`row_start` + rows of `{local_name}` must lie in [0, {total}] (rows of `{all_name}`); "
            f"got {row_start} + {n_rows} = {row_start + n_rows}"
        )
    return row_start


def _check_scalar(name: str, value: object, positive: bool = False) -> Scalar:
    """A real number (finite, and positive if asked) or a one-element floating tensor (returned as 0-d).

    Tensor values are not inspected: that would force a device synchronization on every call.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise ValueError(
                f"`{name}` must be a number or a one-element floating-point tensor; "
                f"got shape {_shape(value)} and dtype {value.dtype}"
            )
        return value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number or a one-element floating-point tensor; got {value!r}")
    if not math.isfinite(value) or (positive and not value > 0):
        kind = "finite positive number" if positive else "finite number"
        raise ValueError(f"`{name}` must be a {kind}; got {value!r}")
    return float(value)


def _check_labels(name: str, labels: Tensor, n: int) -> None:
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex():
        got = f"dtype {labels.dtype}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"`{name}` must be an integer tensor of shape ({n},); got {got}")
    if labels.shape != (n,):
        raise ValueError(f"`{name}` must have shape ({n},); got {_shape(labels)}")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums and counts are accumulated in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


def _count(n: int | Tensor, like: Tensor) -> Tensor:
    """A 0-d float count on ``like``'s device, in the accumulation dtype."""
    dtype = _acc_dtype(like.dtype)
    if isinstance(n, Tensor):
        return n.to(dtype=dtype).reshape(())
    return torch.tensor(float(n), dtype=dtype, device=like.device)


def _safe_divide(total: Tensor, count: Tensor) -> Tensor:
    """``total / count``, and ``0`` with zero gradient where ``count == 0``."""
    nonzero = count != 0
    return torch.where(nonzero, total / torch.where(nonzero, count, torch.ones_like(count)), 0.0)


# --------------------------------------------------------------------------------------------------
# CLIP
# --------------------------------------------------------------------------------------------------


def clip_block(
    img_local: Tensor,
    txt_local: Tensor,
    img_all: Tensor,
    txt_all: Tensor,
    logit_scale: Scalar,
    row_start: int,
) -> tuple[Tensor, Tensor]:
    """Sum of the symmetric CLIP loss over a block of rows.

    With ``logits = logit_scale * img_all @ txt_all.T`` (N, N), the block ``[s, s + n)`` contributes
    ``sum_{i in block} (CE(logits[i], i) + CE(logits.T[i], i)) / 2``: the image-to-text and the
    text-to-image cross-entropies of its rows, each against all N candidates.

    A part of the rows costs two (n, N) logit blocks, one per direction (each kept for backward as its
    softmax). The whole batch (``n == N``) is scored by the one-pass kernel :func:`clip_sum`, one (N, N) block
    for both directions, with the gradient going to ``img_local`` and ``txt_local`` (the same rows). Across
    ranks, :func:`global_clip_loss` computes each logit once.

    Args:
        img_local: image embeddings of the block, rows ``[row_start, row_start + n)`` of ``img_all``, (n, D).
        txt_local: text embeddings of the block, (n, D).
        img_all: all image embeddings, (N, D); used as given (normalize beforehand if wanted).
        txt_all: all text embeddings, (N, D).
        logit_scale: the multiplier of the similarities (not its logarithm), a number or 0-d tensor.
        row_start: global index of the block's first row.

    Returns:
        ``(loss_sum, count)``: 0-d tensors, ``count == n``.

    Raises:
        ValueError: on shapes that do not match, a bad ``logit_scale`` or a block outside ``[0, N)``.

    Example:
        >>> import torch
        >>> img, txt = torch.eye(3), torch.eye(3)
        >>> total, count = clip_block(img[1:], txt[1:], img, txt, 1.0, row_start=1)
        >>> total, count
        (tensor(1.1029), tensor(2.))
        >>> total / count == clip_loss(img, txt, 1.0)
        tensor(True)
    """
    _check_float_tensor("img_all", img_all, 2, "(N, D)")
    _check_same_shape("txt_all", txt_all, "img_all", img_all)
    _check_float_tensor("img_local", img_local, 2, "(n, D)")
    _check_trailing("img_local", img_local, "img_all", img_all)
    _check_same_shape("txt_local", txt_local, "img_local", img_local)
    scale = _check_scalar("logit_scale", logit_scale)
    n = img_local.shape[0]
    row_start = _check_row_block(row_start, n, "img_local", img_all.shape[0], "img_all")

    big_n = img_all.shape[0]
    if n == big_n:  # the whole batch: one (N, N) block gives both directions
        return clip_sum(img_local, txt_local, scale), _count(n, img_local)
    # a partial block: its image rows against every text, its text rows against every image
    own = torch.arange(row_start, row_start + n, device=img_local.device)
    every = torch.arange(big_n, device=img_local.device)
    i2t, _ = softmax_xent_sum(img_local, txt_all, scale, own, every, None, big_n)
    t2i, _ = softmax_xent_sum(txt_local, img_all, scale, own, every, None, big_n)
    return (i2t + t2i) / 2, _count(n, img_local)


def clip_loss(img: Tensor, txt: Tensor, logit_scale: Scalar) -> Tensor:
    """Symmetric CLIP loss (Radford et al., 2021) of a full batch.

    ``(CE(logits, arange(N)) + CE(logits.T, arange(N))) / 2`` with ``logits = logit_scale * img @ txt.T``.

    Args:
        img: image embeddings (N, D), used as given.
        txt: text embeddings (N, D), used as given.
        logit_scale: the multiplier of the similarities (not its logarithm), a number or 0-d tensor.

    Returns:
        The loss, a 0-d tensor (``0`` for an empty batch).

    Example:
        >>> import torch
        >>> clip_loss(torch.eye(2), torch.eye(2), logit_scale=1.0)
        tensor(0.3133)
    """
    total, count = clip_block(img, txt, img, txt, logit_scale, 0)
    return _safe_divide(total, count)


# --------------------------------------------------------------------------------------------------
# InfoNCE / NT-Xent
# --------------------------------------------------------------------------------------------------


def info_nce_block(
    z1_local: Tensor,
    z2_local: Tensor,
    z1_all: Tensor,
    z2_all: Tensor,
    temperature: Scalar,
    row_start: int,
) -> tuple[Tensor, Tensor]:
    """Sum of the NT-Xent loss over the anchors of a block of rows, in both views.

    The candidates are the 2N L2-normalized embeddings ``[z1_all; z2_all]``: view 1 of sample i has
    global index i, view 2 has index N + i. The anchors of the block are its rows in both views (2n
    anchors); anchor i's positive is the other view of sample i, its own similarity is excluded.

    Args:
        z1_local: first view of the block, rows ``[row_start, row_start + n)`` of ``z1_all``, (n, D).
        z2_local: second view of the block, (n, D).
        z1_all: first view of all samples, (N, D).
        z2_all: second view of all samples, (N, D).
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor.
        row_start: global index of the block's first sample.

    Returns:
        ``(loss_sum, count)``: 0-d tensors, ``count == 2 * n``.

    Raises:
        ValueError: on shapes that do not match, a bad ``temperature`` or a block outside ``[0, N)``.

    Example:
        >>> import torch
        >>> z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> z2 = torch.tensor([[1.0, 0.1], [0.1, 1.0]])
        >>> total, count = info_nce_block(z1[:1], z2[:1], z1, z2, 0.5, row_start=0)
        >>> count
        tensor(2.)
        >>> rest, _ = info_nce_block(z1[1:], z2[1:], z1, z2, 0.5, row_start=1)
        >>> torch.allclose((total + rest) / 4, info_nce_loss(z1, z2, 0.5))
        True
    """
    _check_float_tensor("z1_all", z1_all, 2, "(N, D)")
    _check_same_shape("z2_all", z2_all, "z1_all", z1_all)
    _check_float_tensor("z1_local", z1_local, 2, "(n, D)")
    _check_trailing("z1_local", z1_local, "z1_all", z1_all)
    _check_same_shape("z2_local", z2_local, "z1_local", z1_local)
    temperature = _check_scalar("temperature", temperature, positive=True)
    n, big_n = z1_local.shape[0], z1_all.shape[0]
    row_start = _check_row_block(row_start, n, "z1_local", big_n, "z1_all")

    anchors = F.normalize(torch.cat([z1_local, z2_local]), dim=1)
    candidates = F.normalize(torch.cat([z1_all, z2_all]), dim=1)
    # anchor a of sample i: its own embedding is excluded, the other view of sample i (same class) is the positive
    rows = torch.arange(row_start, row_start + n, device=anchors.device)
    samples = torch.arange(big_n, device=anchors.device)
    total, _ = softmax_xent_sum(
        anchors,
        candidates,
        _reciprocal(temperature),
        torch.cat([rows, rows]),
        torch.cat([samples, samples]),
        torch.cat([rows, rows + big_n]),
        big_n,
    )
    return total, _count(2 * n, anchors)


def _reciprocal(temperature: Scalar) -> Scalar:
    """``1 / temperature``: the fused kernels multiply the (n, D) anchors by a scale."""
    return 1.0 / temperature if isinstance(temperature, float) else temperature.reciprocal()


def info_nce_loss(z1: Tensor, z2: Tensor, temperature: Scalar = 0.1) -> Tensor:
    """NT-Xent loss of SimCLR (Chen et al., 2020) for two views of a full batch.

    Each of the 2N L2-normalized embeddings is an anchor whose positive is the other view of its
    sample and whose negatives are the other 2N - 2 embeddings; the loss is the mean cross-entropy.

    Args:
        z1: first view (N, D).
        z2: second view (N, D).
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor.

    Returns:
        The loss, a 0-d tensor (``0`` for an empty batch).

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> info_nce_loss(z, z, temperature=1.0)
        tensor(0.5514)
    """
    total, count = info_nce_block(z1, z2, z1, z2, temperature, 0)
    return _safe_divide(total, count)


# --------------------------------------------------------------------------------------------------
# SupCon
# --------------------------------------------------------------------------------------------------


def supcon_block(
    features_local: Tensor,
    features_all: Tensor,
    labels_all: Tensor | None,
    temperature: Scalar,
    row_start: int,
) -> tuple[Tensor, Tensor]:
    """Sum of the supervised contrastive loss over the anchors of a block of samples.

    Features of shape (N, V, D) hold V views per sample and are flattened sample-major: the anchor of
    view v of sample i has index ``i * V + v`` (the loss does not depend on the order). Anchor a's
    loss is ``-1/|P(a)| sum_{p in P(a)} log(exp(s_ap / t) / sum_{k != a} exp(s_ak / t))`` over the
    cosine similarities ``s``, with ``P(a)`` the other anchors of its label. Anchors without a
    positive are left out of both the sum and the count.

    Args:
        features_local: features of the block, samples ``[row_start, row_start + n)``, (n, D) or (n, V, D).
        features_all: features of all samples, (N, D) or (N, V, D).
        labels_all: integer labels of all samples (N,); ``None`` makes each sample its own class (the
            unsupervised SimCLR loss when V >= 2).
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor.
        row_start: global index of the block's first sample.

    Returns:
        ``(loss_sum, count)``: 0-d tensors, ``count`` is the number of the block's anchors with a positive.

    Raises:
        ValueError: on shapes that do not match, a bad ``temperature`` or a block outside ``[0, N)``.

    Example:
        >>> import torch
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> labels = torch.tensor([0, 0, 1])
        >>> supcon_block(feats[:2], feats, labels, 1.0, row_start=0)
        (tensor(0.9692), tensor(2.))
        >>> supcon_block(feats[2:], feats, labels, 1.0, row_start=2)  # label 1 has no positive
        (tensor(0.), tensor(0.))
    """
    _check_float_tensor("features_all", features_all, (2, 3), "(N, D) or (N, V, D)")
    _check_float_tensor("features_local", features_local, features_all.ndim, "like `features_all`")
    _check_trailing("features_local", features_local, "features_all", features_all)
    temperature = _check_scalar("temperature", temperature, positive=True)
    n, big_n = features_local.shape[0], features_all.shape[0]
    if labels_all is None:
        labels_all = torch.arange(big_n, device=features_all.device)
    _check_labels("labels_all", labels_all, big_n)
    row_start = _check_row_block(row_start, n, "features_local", big_n, "features_all")

    views = features_all.shape[1] if features_all.ndim == 3 else 1
    dim = features_all.shape[-1]
    anchors = F.normalize(features_local.reshape(n * views, dim), dim=1)
    candidates = F.normalize(features_all.reshape(big_n * views, dim), dim=1)
    label_ids, n_classes = _class_ids(labels_all)
    cand_cls = label_ids.repeat_interleave(views)
    own = torch.arange(row_start * views, (row_start + n) * views, device=anchors.device)
    scale = _reciprocal(temperature)
    total, count = softmax_xent_sum(anchors, candidates, scale, cand_cls[own], cand_cls, own, n_classes)
    return total, _count(count, anchors)


def _class_ids(labels: Tensor) -> tuple[Tensor, int]:
    """Labels as dense ids ``0 .. K-1`` and ``K``.

    Eagerly ``torch.unique``; under ``torch.compile`` (where the number of classes would be a data-dependent shape
    and a graph break) ids from a sort, with ``K`` the static bound ``len(labels)`` (unused ids cost empty rows).

    Example:
        >>> import torch
        >>> _class_ids(torch.tensor([7, 3, 7]))
        (tensor([1, 0, 1]), 2)
    """
    if not torch.compiler.is_compiling():
        classes, ids = torch.unique(labels, return_inverse=True)
        return ids, classes.numel()
    n = labels.numel()
    ordered, order = torch.sort(labels)
    new_class = torch.zeros(n, dtype=torch.int64, device=labels.device)
    new_class[1:] = (ordered[1:] != ordered[:-1]).to(torch.int64)
    ids = torch.empty_like(new_class).scatter_(0, order, new_class.cumsum(0))
    return ids, max(n, 1)


def supcon_loss(features: Tensor, labels: Tensor | None = None, temperature: Scalar = 0.1) -> Tensor:
    """Supervised contrastive loss (Khosla et al., 2020, L_out) of a full batch.

    The SupConLoss of the reference implementation with ``contrast_mode='all'`` and
    ``base_temperature == temperature``, on L2-normalized features, averaged over the anchors that have
    at least one positive (``0`` with a zero gradient when none has). The reference divides by all
    anchors instead (positive-free ones adding 0); both agree when every anchor has a positive, e.g.
    with two or more views.

    Args:
        features: (N, D), or (N, V, D) for V views per sample.
        labels: integer labels (N,); ``None`` makes each sample its own class.
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor.

    Returns:
        The loss, a 0-d tensor.

    Example:
        >>> import torch
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> supcon_loss(feats, torch.tensor([0, 0, 1]), temperature=1.0)
        tensor(0.4846)
        >>> supcon_loss(feats, torch.tensor([0, 1, 2]), temperature=1.0)  # no positives at all
        tensor(0.)
    """
    total, count = supcon_block(features, features, labels, temperature, 0)
    return _safe_divide(total, count)


# --------------------------------------------------------------------------------------------------
# SigLIP
# --------------------------------------------------------------------------------------------------


def siglip_block(
    img_local: Tensor,
    txt_all: Tensor,
    logit_scale: Scalar,
    logit_bias: Scalar,
    row_start: int,
) -> tuple[Tensor, Tensor]:
    """Sum of the SigLIP loss over a block of image rows.

    With ``logits = logit_scale * img @ txt.T + logit_bias`` and ``z_ij = 1`` if ``i == j`` else ``-1``,
    the block ``[s, s + n)`` contributes ``-sum_{i in block} sum_j log sigmoid(z_ij * logits_ij)``.

    Args:
        img_local: image embeddings of the block, rows ``[row_start, row_start + n)``, (n, D).
        txt_all: all text embeddings, (N, D), used as given.
        logit_scale: the multiplier ``t`` of the similarities (not its logarithm).
        logit_bias: the bias ``b`` added to the logits.
        row_start: global index of the block's first row.

    Returns:
        ``(loss_sum, count)``: 0-d tensors, ``count == n``.

    Raises:
        ValueError: on shapes that do not match, bad scalars or a block outside ``[0, N)``.

    Example:
        >>> import torch
        >>> img, txt = torch.eye(2), torch.eye(2)
        >>> siglip_block(img[:1], txt, 1.0, 0.0, row_start=0)
        (tensor(1.0064), tensor(1.))
    """
    _check_float_tensor("txt_all", txt_all, 2, "(N, D)")
    _check_float_tensor("img_local", img_local, 2, "(n, D)")
    _check_trailing("img_local", img_local, "txt_all", txt_all)
    scale = _check_scalar("logit_scale", logit_scale)
    bias = _check_scalar("logit_bias", logit_bias)
    n = img_local.shape[0]
    row_start = _check_row_block(row_start, n, "img_local", txt_all.shape[0], "txt_all")

    return sigmoid_sum(img_local, txt_all, scale, bias, row_start), _count(n, img_local)


def siglip_loss(img: Tensor, txt: Tensor, logit_scale: Scalar, logit_bias: Scalar) -> Tensor:
    """Sigmoid loss of SigLIP (Zhai et al., 2023) of a full batch, normalized by the batch size N.

    Args:
        img: image embeddings (N, D), used as given.
        txt: text embeddings (N, D), used as given.
        logit_scale: the multiplier ``t`` of the similarities (not its logarithm).
        logit_bias: the bias ``b`` added to the logits.

    Returns:
        ``-sum_ij log sigmoid(z_ij * (t * img_i . txt_j + b)) / N``, a 0-d tensor (``0`` when empty).

    Example:
        >>> import torch
        >>> siglip_loss(torch.eye(2), torch.eye(2), logit_scale=10.0, logit_bias=-5.0)
        tensor(0.0134)
    """
    _check_float_tensor("img", img, 2, "(N, D)")
    _check_same_shape("txt", txt, "img", img)
    total, count = siglip_block(img, txt, logit_scale, logit_bias, 0)
    return _safe_divide(total, count)


# --------------------------------------------------------------------------------------------------
# Weighted / masked means
# --------------------------------------------------------------------------------------------------


def weighted_mean_block(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Weighted sum of ``values`` and the sum of the weights.

    Args:
        values: any shape; non-floating values are cast to the default float dtype.
        weight: broadcastable to ``values``' shape; ``None`` means 1.
        mask: bool, broadcastable to ``values``' shape; masked-out elements count as weight 0 and are
            excluded with ``torch.where``, so non-finite values there (padding) do not leak in.

    Returns:
        ``(sum(values * weight), sum(weight))``: 0-d tensors; ``weight`` is expanded to ``values``'
        shape before it is summed.

    Raises:
        ValueError: if ``weight`` or ``mask`` does not broadcast to ``values``' shape, or ``mask`` is not
            bool.

    Example:
        >>> import torch
        >>> values = torch.tensor([1.0, 2.0, float("nan")])
        >>> weighted_mean_block(values, mask=torch.tensor([True, True, False]))
        (tensor(3.), tensor(2.))
        >>> weighted_mean_block(torch.tensor([1.0, 2.0]), weight=torch.tensor([3.0, 1.0]))
        (tensor(5.), tensor(4.))
    """
    if not isinstance(values, Tensor):
        raise ValueError(f"`values` must be a tensor; got {type(values).__name__}")
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    acc = _acc_dtype(values.dtype)
    if weight is None:
        weight = torch.ones((), dtype=values.dtype, device=values.device)
    elif not isinstance(weight, Tensor):
        weight = torch.tensor(float(weight), dtype=values.dtype, device=values.device)
    _check_broadcast("weight", weight, values)
    weighted = values * weight
    weight = weight.expand(values.shape)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"`mask` must be a bool tensor; got {got}")
        _check_broadcast("mask", mask, values)
        weighted = torch.where(mask, weighted, torch.zeros_like(weighted))
        weight = torch.where(mask, weight, torch.zeros_like(weight))
    return weighted.to(acc).sum(), weight.to(acc).sum()


def weighted_mean(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Weighted mean ``sum(values * weight) / sum(weight)``; ``0`` with zero gradient if no weight.

    Args:
        values: any shape.
        weight: broadcastable to ``values``' shape; ``None`` means 1.
        mask: bool, broadcastable to ``values``' shape; equivalent to a 0/1 weight.

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> weighted_mean(torch.tensor([1.0, 2.0, 6.0]), mask=torch.tensor([True, True, False]))
        tensor(1.5000)
    """
    return _safe_divide(*weighted_mean_block(values, weight, mask))


def _check_broadcast(name: str, x: Tensor, values: Tensor) -> None:
    try:
        shape = torch.broadcast_shapes(x.shape, values.shape)
    except RuntimeError:
        shape = None
    if shape != values.shape:
        raise ValueError(f"`{name}` must broadcast to the shape of `values` {_shape(values)}; got {_shape(x)}")


def token_cross_entropy_block(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Sum of per-token cross-entropies over non-ignored tokens, and their number.

    Args:
        logits: unnormalized scores (..., C), the class dimension last.
        target: class indices (...), the shape of ``logits`` without its last dimension.
        ignore_index: target value of tokens to skip (padding).
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`.

    Returns:
        ``(loss_sum, count)``: 0-d tensors; ``count`` is the number of tokens whose target is not
        ``ignore_index``.

    Raises:
        ValueError: on mismatched shapes, a non-integer target or ``label_smoothing`` outside ``[0, 1]``.

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 4)  # (batch, sequence, classes): uniform predictions
        >>> target = torch.tensor([[1, 2, -100], [3, -100, -100]])
        >>> total, count = token_cross_entropy_block(logits, target)
        >>> count, torch.allclose(total, 3 * torch.log(torch.tensor(4.0)))
        (tensor(3.), True)
    """
    _check_float_tensor("logits", logits, None, "(..., C)")
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex():
        got = f"dtype {target.dtype}" if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"`target` must be an integer tensor of shape {_shape(logits)[:-1]}; got {got}")
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"`target` must have the shape of `logits` without its last dimension {_shape(logits)[:-1]}; "
            f"got {_shape(target)}"
        )
    if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"`label_smoothing` must be a number in [0, 1]; got {label_smoothing!r}")

    flat_target = target.reshape(-1).long()
    per_token = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        flat_target,
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=label_smoothing,
    )
    acc = _acc_dtype(logits.dtype)
    return per_token.to(acc).sum(), _count((flat_target != ignore_index).sum(), logits)


def token_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Mean cross-entropy over the non-ignored tokens; ``0`` with zero gradient if all are ignored.

    Args:
        logits: unnormalized scores (..., C), the class dimension last.
        target: class indices (...).
        ignore_index: target value of tokens to skip (padding).
        label_smoothing: in ``[0, 1]``, as in :func:`torch.nn.functional.cross_entropy`.

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> token_cross_entropy(torch.zeros(1, 2, 2), torch.tensor([[0, -100]]))
        tensor(0.6931)
    """
    return _safe_divide(*token_cross_entropy_block(logits, target, ignore_index, label_smoothing))


# --------------------------------------------------------------------------------------------------
# Barlow Twins
# --------------------------------------------------------------------------------------------------


class BarlowTwinsStats(NamedTuple):
    """Additive sufficient statistics of Barlow Twins' cross-correlation over a set of rows.

    Every field is a sum over rows, so the statistics of a union of shards are the field-wise sums
    (:meth:`merge`, or one ``all_reduce(sum)`` per field).
    """

    sum_a: Tensor  #: ``sum_k za[k]``, (D,)
    sum_sq_a: Tensor  #: ``sum_k za[k] ** 2``, (D,)
    sum_b: Tensor  #: ``sum_k zb[k]``, (D,)
    sum_sq_b: Tensor  #: ``sum_k zb[k] ** 2``, (D,)
    sum_ab: Tensor  #: ``sum_k outer(za[k], zb[k])``, (D, D)
    count: Tensor  #: number of rows, 0-d float

    def merge(self, other: BarlowTwinsStats) -> BarlowTwinsStats:
        """The statistics of the union of both row sets."""
        return BarlowTwinsStats(*(mine + theirs for mine, theirs in zip(self, other)))


def barlow_twins_stats(za: Tensor, zb: Tensor) -> BarlowTwinsStats:
    """Differentiable sufficient statistics of a shard of embeddings for :func:`barlow_twins_from_stats`.

    Args:
        za: embeddings of the first view (n, D); n may be 0.
        zb: embeddings of the second view (n, D).

    Returns:
        :class:`BarlowTwinsStats` of the rows, in the accumulation dtype (at least float32).

    Raises:
        ValueError: if ``za`` is not a floating (n, D) tensor or ``zb`` has another shape.

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(10, 4, generator=gen), torch.randn(10, 4, generator=gen)
        >>> merged = barlow_twins_stats(za[:3], zb[:3]).merge(barlow_twins_stats(za[3:], zb[3:]))
        >>> torch.allclose(barlow_twins_from_stats(merged), barlow_twins_loss(za, zb), atol=1e-5)
        True
    """
    _check_float_tensor("za", za, 2, "(n, D)")
    _check_same_shape("zb", zb, "za", za)
    acc = _acc_dtype(za.dtype)
    za, zb = za.to(acc), zb.to(acc)
    return BarlowTwinsStats(
        sum_a=za.sum(dim=0),
        sum_sq_a=(za * za).sum(dim=0),
        sum_b=zb.sum(dim=0),
        sum_sq_b=(zb * zb).sum(dim=0),
        sum_ab=za.T @ zb,
        count=_count(za.shape[0], za),
    )


def barlow_twins_from_stats(
    stats: BarlowTwinsStats | tuple[Tensor, ...],
    lambda_offdiag: float = 5e-3,
    eps: float = 1e-5,
) -> Tensor:
    """Barlow Twins loss (Zbontar et al., 2021) from (summed) sufficient statistics.

    ``C_ij = (E[za_i zb_j] - mu_a_i mu_b_j) / (sigma_a_i sigma_b_j)`` with the population variance plus
    ``eps`` (``sigma = sqrt(var + eps)``, as a BatchNorm without affine in training mode), and
    ``loss = sum_i (1 - C_ii) ** 2 + lambda_offdiag * sum_{i != j} C_ij ** 2``.

    The variance comes from raw moments (``E[x^2] - E[x]^2``, clamped at 0), which is what makes the
    statistics additive; in float32 it loses precision when ``|mean|`` dwarfs the standard deviation.
    With ``count == 0`` every moment is taken as 0 (loss ``D``), never ``NaN``.

    Args:
        stats: :class:`BarlowTwinsStats` or a tuple of its six fields in order.
        lambda_offdiag: weight of the off-diagonal (redundancy reduction) term.
        eps: added to each variance, as BatchNorm's ``eps``.

    Returns:
        The loss, a 0-d tensor.

    Raises:
        ValueError: on stats of inconsistent shapes or a negative / non-finite ``eps`` or ``lambda_offdiag``.

    Example:
        >>> import torch
        >>> za = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> barlow_twins_from_stats(barlow_twins_stats(za, -za), eps=0.0)  # C = -I
        tensor(8.)
    """
    sum_a, sum_sq_a, sum_b, sum_sq_b, sum_ab, count = stats
    dim = sum_a.shape[0] if isinstance(sum_a, Tensor) and sum_a.ndim == 1 else None
    for name, field, shape in [
        ("stats.sum_a", sum_a, (dim,)),
        ("stats.sum_sq_a", sum_sq_a, (dim,)),
        ("stats.sum_b", sum_b, (dim,)),
        ("stats.sum_sq_b", sum_sq_b, (dim,)),
        ("stats.sum_ab", sum_ab, (dim, dim)),
        ("stats.count", count, ()),
    ]:
        if dim is None or not isinstance(field, Tensor) or field.shape != shape:
            got = _shape(field) if isinstance(field, Tensor) else type(field).__name__
            raise ValueError(f"`{name}` must have shape {shape if dim is not None else '(D,)'}; got {got}")
    for name, value in [("lambda_offdiag", lambda_offdiag), ("eps", eps)]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"`{name}` must be a finite non-negative number; got {value!r}")

    n = count.clamp(min=1)
    mean_a, mean_b = sum_a / n, sum_b / n
    var_a = (sum_sq_a / n - mean_a * mean_a).clamp(min=0)
    var_b = (sum_sq_b / n - mean_b * mean_b).clamp(min=0)
    cov = sum_ab / n - mean_a[:, None] * mean_b[None, :]
    corr = cov / torch.sqrt((var_a + eps)[:, None] * (var_b + eps)[None, :])
    on_diag = (1 - torch.diagonal(corr)).pow(2).sum()
    eye = torch.eye(corr.shape[0], dtype=torch.bool, device=corr.device)
    off_diag = corr.masked_fill(eye, 0.0).pow(2).sum()
    return on_diag + lambda_offdiag * off_diag


def barlow_twins_loss(za: Tensor, zb: Tensor, lambda_offdiag: float = 5e-3, eps: float = 1e-5) -> Tensor:
    """Barlow Twins loss of a full batch.

    Args:
        za: embeddings of the first view (N, D).
        zb: embeddings of the second view (N, D).
        lambda_offdiag: weight of the off-diagonal term.
        eps: added to each variance, as BatchNorm's ``eps``.

    Returns:
        The loss, a 0-d tensor.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])
        >>> barlow_twins_loss(z, z, eps=0.0)  # the two features are fully correlated
        tensor(0.0100)
    """
    return barlow_twins_from_stats(barlow_twins_stats(za, zb), lambda_offdiag, eps)
