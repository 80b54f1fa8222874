"""CLIP, InfoNCE (NT-Xent), SupCon and SigLIP as pure functions: each family's block and whole-batch forms.

Every loss comes in two forms, side by side:

- a *block* form ``*_block(...) -> (loss_sum, count)`` that sums the loss over a contiguous block of
  anchor rows ``[row_start, row_start + n_rows)`` of the global problem, scored against *all* global
  candidates. The local rows are passed separately from the global tensors so that gradients reach
  them through their own path; the global tensors contain the local rows too.
- a *full-batch* form, the block over all rows divided by the count: the single-device loss.

Summing the block sums of a partition of the rows and dividing by the summed counts gives the
full-batch value and, by linearity, the full-batch gradient. This is what the strategies rely on
(``torchmetrics_diff._global``: ``strategy``, ``contrastive``): they gather the global candidates and call the
block form with their own rows. Nothing here talks to ``torch.distributed``; the logit blocks are scored by the
fused kernels of :mod:`._kernels`.

Sums and counts are accumulated in at least float32; a full-batch loss whose count is zero is ``0`` with a
zero gradient, never ``NaN``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from torchmetrics_diff.functional._checks import (
    Scalar,
    acc_dtype,
    as_count,
    check_float_tensor,
    check_labels,
    check_row_block,
    check_same_shape,
    check_scalar,
    check_trailing,
    reciprocal,
    safe_divide,
)
from torchmetrics_diff.functional._kernels import clip_block_sum, sigmoid_sum, softmax_xent_sum


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
    check_float_tensor("img_all", img_all, 2, "(N, D)")
    check_same_shape("txt_all", txt_all, "img_all", img_all)
    check_float_tensor("img_local", img_local, 2, "(n, D)")
    check_trailing("img_local", img_local, "img_all", img_all)
    check_same_shape("txt_local", txt_local, "img_local", img_local)
    scale = check_scalar("logit_scale", logit_scale)
    n = img_local.shape[0]
    row_start = check_row_block(row_start, n, "img_local", img_all.shape[0], "img_all")

    big_n = img_all.shape[0]
    if n == big_n:  # the whole batch: one (N, N) block gives both directions
        return clip_block_sum(img_local, txt_local, scale), as_count(n, img_local)
    # a partial block: its image rows against every text, its text rows against every image
    own = torch.arange(row_start, row_start + n, device=img_local.device)
    every = torch.arange(big_n, device=img_local.device)
    i2t, _ = softmax_xent_sum(img_local, txt_all, scale, own, every, None, big_n)
    t2i, _ = softmax_xent_sum(txt_local, img_all, scale, own, every, None, big_n)
    return (i2t + t2i) / 2, as_count(n, img_local)


def clip_loss(img: Tensor, txt: Tensor, logit_scale: Scalar) -> Tensor:
    """Symmetric CLIP loss (Radford et al., 2021) of a full batch.

    ``(CE(logits, arange(N)) + CE(logits.T, arange(N))) / 2`` with ``logits = logit_scale * img @ txt.T``.

    Args:
        img: image embeddings (N, D), used as given.
        txt: text embeddings (N, D), used as given.
        logit_scale: the multiplier of the similarities (not its logarithm), a number or 0-d tensor.

    Returns:
        The loss, a 0-d tensor (float64 for float64 inputs, else float32; ``0`` for an empty batch).

    Raises:
        ValueError: embeddings that are not floating ``(N, D)`` tensors of one shape, or a bad ``logit_scale``.

    Example:
        >>> import torch
        >>> clip_loss(torch.eye(2), torch.eye(2), logit_scale=1.0)
        tensor(0.3133)
    """
    return safe_divide(*clip_block(img, txt, img, txt, logit_scale, 0))


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
    check_float_tensor("z1_all", z1_all, 2, "(N, D)")
    check_same_shape("z2_all", z2_all, "z1_all", z1_all)
    check_float_tensor("z1_local", z1_local, 2, "(n, D)")
    check_trailing("z1_local", z1_local, "z1_all", z1_all)
    check_same_shape("z2_local", z2_local, "z1_local", z1_local)
    temperature = check_scalar("temperature", temperature, positive=True)
    n, big_n = z1_local.shape[0], z1_all.shape[0]
    row_start = check_row_block(row_start, n, "z1_local", big_n, "z1_all")

    anchors = unit_rows(torch.cat([z1_local, z2_local]))
    candidates = unit_rows(torch.cat([z1_all, z2_all]))
    # anchor a of sample i: its own embedding is excluded, the other view of sample i (same class) is the positive
    rows = torch.arange(row_start, row_start + n, device=anchors.device)
    samples = torch.arange(big_n, device=anchors.device)
    total, _ = softmax_xent_sum(
        anchors,
        candidates,
        reciprocal(temperature),
        torch.cat([rows, rows]),
        torch.cat([samples, samples]),
        torch.cat([rows, rows + big_n]),
        big_n,
    )
    return total, as_count(2 * n, anchors)


def info_nce_loss(z1: Tensor, z2: Tensor, temperature: Scalar = 0.1) -> Tensor:
    """NT-Xent loss of SimCLR (Chen et al., 2020) for two views of a full batch.

    Each of the 2N L2-normalized embeddings is an anchor whose positive is the other view of its
    sample and whose negatives are the other 2N - 2 embeddings; the loss is the mean cross-entropy.

    Args:
        z1: first view (N, D).
        z2: second view (N, D).
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor. Default ``0.1``.

    Returns:
        The loss, a 0-d tensor (float64 for float64 inputs, else float32; ``0`` for an empty batch).

    Raises:
        ValueError: views that are not floating ``(N, D)`` tensors of one shape, or a non-positive ``temperature``.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> info_nce_loss(z, z, temperature=1.0)
        tensor(0.5514)
    """
    return safe_divide(*info_nce_block(z1, z2, z1, z2, temperature, 0))


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
    check_float_tensor("features_all", features_all, (2, 3), "(N, D) or (N, V, D)")
    check_float_tensor("features_local", features_local, features_all.ndim, "like `features_all`")
    check_trailing("features_local", features_local, "features_all", features_all)
    temperature = check_scalar("temperature", temperature, positive=True)
    n, big_n = features_local.shape[0], features_all.shape[0]
    if labels_all is None:
        labels_all = torch.arange(big_n, device=features_all.device)
    check_labels("labels_all", labels_all, big_n)
    row_start = check_row_block(row_start, n, "features_local", big_n, "features_all")

    views = features_all.shape[1] if features_all.ndim == 3 else 1
    dim = features_all.shape[-1]
    anchors = unit_rows(features_local.reshape(n * views, dim))
    candidates = unit_rows(features_all.reshape(big_n * views, dim))
    label_ids, n_classes = class_ids(labels_all)
    cand_cls = label_ids.repeat_interleave(views)
    own = torch.arange(row_start * views, (row_start + n) * views, device=anchors.device)
    scale = reciprocal(temperature)
    total, count = softmax_xent_sum(anchors, candidates, scale, cand_cls[own], cand_cls, own, n_classes)
    return total, as_count(count, anchors)


def unit_rows(x: Tensor) -> Tensor:
    """The rows of ``x`` L2-normalized, computed in at least float32 and rounded once to ``x``'s dtype.

    Example:
        >>> import torch
        >>> unit_rows(torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16))
        tensor([[0.6016, 0.8008]], dtype=torch.bfloat16)
    """
    return F.normalize(x.to(acc_dtype(x.dtype)), dim=1).to(x.dtype)


def class_ids(labels: Tensor) -> tuple[Tensor, int]:
    """Labels as dense ids ``0 .. k-1`` (in the order of the labels' values) and a bound ``K >= k`` on their number.

    Ids from a sort, with ``K`` the static bound ``len(labels)`` (unused ids cost empty rows of the class sums):
    no data-dependent shape, so nothing is read back from the device (``torch.unique`` would read the number of
    classes) and no graph break under ``torch.compile``.

    Example:
        >>> import torch
        >>> class_ids(torch.tensor([7, 3, 7]))
        (tensor([1, 0, 1]), 3)
    """
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
        labels: integer labels (N,); ``None`` makes each sample its own class. Default ``None``.
        temperature: the divisor of the cosine similarities, a positive number or 0-d tensor. Default ``0.1``.

    Returns:
        The loss, a 0-d tensor (float64 for float64 inputs, else float32; ``0`` when no anchor has a positive).

    Raises:
        ValueError: ``features`` that is not a floating ``(N, D)`` or ``(N, V, D)`` tensor, ``labels`` that are not
            integers of shape ``(N,)``, or a non-positive ``temperature``.

    Example:
        >>> import torch
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> supcon_loss(feats, torch.tensor([0, 0, 1]), temperature=1.0)
        tensor(0.4846)
        >>> supcon_loss(feats, torch.tensor([0, 1, 2]), temperature=1.0)  # no positives at all
        tensor(0.)
    """
    return safe_divide(*supcon_block(features, features, labels, temperature, 0))


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
    check_float_tensor("txt_all", txt_all, 2, "(N, D)")
    check_float_tensor("img_local", img_local, 2, "(n, D)")
    check_trailing("img_local", img_local, "txt_all", txt_all)
    scale = check_scalar("logit_scale", logit_scale)
    bias = check_scalar("logit_bias", logit_bias)
    n = img_local.shape[0]
    row_start = check_row_block(row_start, n, "img_local", txt_all.shape[0], "txt_all")

    return sigmoid_sum(img_local, txt_all, scale, bias, row_start), as_count(n, img_local)


def siglip_loss(img: Tensor, txt: Tensor, logit_scale: Scalar, logit_bias: Scalar) -> Tensor:
    """Sigmoid loss of SigLIP (Zhai et al., 2023) of a full batch, normalized by the batch size N.

    Args:
        img: image embeddings (N, D), used as given.
        txt: text embeddings (N, D), used as given.
        logit_scale: the multiplier ``t`` of the similarities (not its logarithm).
        logit_bias: the bias ``b`` added to the logits.

    Returns:
        ``-sum_ij log sigmoid(z_ij * (t * img_i . txt_j + b)) / N``, a 0-d tensor (float64 for float64 inputs,
        else float32; ``0`` when empty).

    Raises:
        ValueError: embeddings that are not floating ``(N, D)`` tensors of one shape, or a bad ``logit_scale`` or
            ``logit_bias``.

    Example:
        >>> import torch
        >>> siglip_loss(torch.eye(2), torch.eye(2), logit_scale=10.0, logit_bias=-5.0)
        tensor(0.0134)
    """
    check_float_tensor("img", img, 2, "(N, D)")
    check_same_shape("txt", txt, "img", img)
    return safe_divide(*siglip_block(img, txt, logit_scale, logit_bias, 0))
