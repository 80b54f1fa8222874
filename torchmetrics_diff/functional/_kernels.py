"""Fused kernels of the contrastive losses: each logit block computed once, one (n, M) tensor kept for backward.

Every loss here is ``Σ_rows f(L_row)`` over a logit block ``L = (s · A) @ C.T`` of ``n`` anchors against ``M``
candidates. Autograd through ``logsumexp`` / ``gather`` / ``logsigmoid`` keeps several (n, M) tensors per block
(the scaled logits, the softmax or the sigmoid buffer, masks) and builds the gradient from them with more (n, M)
passes. Each :class:`torch.autograd.Function` below instead forms ``∂loss/∂L`` in forward, in place in the one
(n, M) buffer that held the logits, saves that buffer and nothing else of its size, and spends the backward on
two matrix products::

    grad_A = s · G @ C        grad_C = G.T @ (s · A)        grad_s = Σ A ⊙ (G @ C)

The scale multiplies the (n, D) operand, never the (n, M) logits. Softmax and sigmoid statistics are taken in at
least float32; ``G`` is kept in the operands' dtype.

Mixed precision: the public functions cast float32 operands to the autocast dtype when ``torch.autocast`` is on
(as ``torch.mm`` would) and run the kernel with autocast off. With half-precision operands the products
``A @ C.T``, ``G @ C`` and ``G.T @ A`` take half-precision operands and give float32 results (:func:`mm_acc`), and
the scale multiplies the float32 logits rather than ``A`` (:func:`scaled_products`: neither ``s`` nor ``s·A``
is rounded to half precision); the logits, every statistic, ``grad_s`` and the gradients before their final cast
are float32; ``G`` is stored in half precision (the one (n, M) buffer kept for backward). The value is float32;
the gradients reach the inputs in their dtype. float32 and float64 operands run exactly as without autocast.

Kernels:

- :func:`softmax_xent_sum`: cross-entropy rows with class-defined positives (one or several per anchor) and an
  optional excluded candidate per anchor (its own embedding); InfoNCE/NT-Xent, SupCon and each direction of a
  partial CLIP block. The positive term ``Σ_p L_ap / |P_a|`` is computed from per-class sums of the candidates
  (``K × D``), so no (n, M) mask is built.
- :func:`clip_block_sum`: symmetric CLIP from one row block ``img @ txt_all.T``: row log-sum-exps locally, the
  column (text → image) log-sum-exps from the block's partial column statistics, combined with the other rows'
  by the caller's ``combine_columns`` (across ranks: an all-gather of ``M`` numbers per rank, or two all-reduces of
  ``M`` numbers, the maxima then the shifted sums, at many ranks; :func:`~torchmetrics_diff.functional.clip_sum`
  passes it in); both directions' gradients from the one block.
- :func:`sigmoid_sum`: the SigLIP pairwise sigmoid block.

Nothing here communicates: a kernel sees tensors and, for CLIP's columns, a function it is handed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from torchmetrics_diff.functional._checks import (
    acc_dtype,
    as_scale,
    autocast_off,
    compute_dtype,
    mm_acc,
    needs_grad,
    scaled_products,
)

_CHUNK_ROWS = 256  # rows per chunk where a value needs an (n, M) temporary of its own (softplus)
_CHUNK_ELEMENTS = 1 << 18  # a reused scratch buffer of this many elements (1 MiB in float32): stays in cache

#: combines a block's partial column log-sum-exps (M,) with those of the other rows of the batch (M,)
ColumnCombine = Callable[[Tensor], Tensor]


def _row_chunks(block: Tensor) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """``(rows, block[rows], scratch)`` over consecutive row chunks of a 2-d ``block``; one scratch buffer reused."""
    n, m = block.shape
    step = max(1, min(n, _CHUNK_ELEMENTS // max(m, 1)))
    scratch = block.new_empty(step, m)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        yield slice(lo, hi), block[lo:hi], scratch[: hi - lo]


def _row_softmax_(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Row ``(log-sum-exp, sum of exp(logits - max))`` of ``logits`` (n, M), leaving ``exp(logits - max)`` in it.

    Rows that are entirely ``-inf`` get a shift of 0 (their exponentials are 0 and their log-sum-exp is ``-inf``).
    """
    shift = logits.amax(dim=1) if logits.shape[1] else logits.new_zeros(logits.shape[0])
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    sums = logits.sub_(shift[:, None]).exp_().sum(dim=1)
    return shift + sums.log(), sums


def _matmul_grads(
    ctx: Any, grad_out: Tensor, g_mat: Tensor, a: Tensor, c: Tensor, scale: Tensor, half: float = 1.0
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """``(grad_A, grad_C, grad_s)`` of ``Σ G ⊙ L`` with ``L = (s A) @ C.T``, times ``grad_out · half``.

    ``ctx.needs_input_grad[0:3]`` says which of ``A, C, s`` are wanted. The scalar factors multiply the (n, D) and
    (M, D) results, never ``G``.
    """
    want_a, want_c, want_s = ctx.needs_input_grad[:3]
    acc = acc_dtype(g_mat.dtype)  # g_mat's own dtype unless it is half precision
    factor = grad_out.to(acc) * half
    s = scale.to(acc)
    grad_a = grad_c = grad_s = None
    if want_a or want_s:
        h = mm_acc(g_mat, c)  # (n, D)
        if want_s:
            grad_s = ((h * a).sum() * factor).to(scale.dtype)
        if want_a:
            grad_a = h.mul_(s * factor).to(a.dtype)
    if want_c:
        grad_c = mm_acc(g_mat.T, a).mul_(s * factor).to(c.dtype)
    return grad_a, grad_c, grad_s


# ------------------------------------------------------------------------------------------ softmax rows
#: the classes of a softmax cross-entropy: ``(anchor_cls, cand_cls, own, n_classes)`` (see :func:`softmax_xent_sum`)
_Classes = tuple[Tensor, Tensor, Union[Tensor, None], int]


def _xent_forward(
    a: Tensor, c: Tensor, scale: Tensor, classes: _Classes, need_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """Value, valid-anchor count, ``G`` (valid rows' softmax, or None), per-class candidate sums, anchor weights."""
    anchor_cls, cand_cls, own, n_classes = classes
    acc = acc_dtype(a.dtype)
    logits = scaled_products(a, c.T, scale)  # (n, M); the only (n, M) buffer
    if own is not None and logits.numel():
        logits.scatter_(1, own[:, None], -torch.inf)
    # positives: every candidate of the anchor's class but its own; Σ_p L_ap from per-class candidate sums
    c_acc = c.to(acc)
    class_sums = c_acc.new_zeros(n_classes, c.shape[1]).index_add_(0, cand_cls, c_acc)
    # (index_add rather than bincount: it also runs on devices without data, e.g. meta)
    counts = cand_cls.new_zeros(n_classes).index_add_(0, cand_cls, torch.ones_like(cand_cls))[anchor_cls]
    positive_rows = class_sums[anchor_cls]
    if own is not None:
        positive_rows = positive_rows - c_acc[own]
        counts = counts - 1
    valid = counts > 0
    weight = torch.where(valid, 1.0 / counts.clamp_min(1).to(acc), torch.zeros((), dtype=acc, device=a.device))
    if acc == a.dtype:  # mean positive logit of each valid anchor
        positive = (a * scale.to(a.dtype) * positive_rows).sum(dim=1) * weight
    else:  # half precision: in float32, the scale on the sums
        positive = (a.to(acc) * positive_rows).sum(dim=1) * scale.to(acc) * weight
    lse, sums = _row_softmax_(logits)
    per_anchor = torch.where(valid, lse - positive, torch.zeros_like(lse))
    value = per_anchor.sum()
    g_mat = None
    if need_grad:
        inv = torch.where(valid, 1.0 / sums, torch.zeros_like(lse))
        g_mat = logits.mul_(inv[:, None]).to(a.dtype)  # softmax of the valid rows, 0 elsewhere (self: exp(-inf))
    return value, valid.sum().to(acc), g_mat, positive_rows, weight


class _SoftmaxXent(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        c: Tensor,
        scale: Tensor,
        anchor_cls: Tensor,
        cand_cls: Tensor,
        own: Tensor | None,
        n_classes: int,
    ) -> tuple[Tensor, Tensor]:
        classes = (anchor_cls, cand_cls, own, n_classes)
        value, count, g_mat, positive_rows, weight = _xent_forward(a, c, scale, classes, True)
        ctx.save_for_backward(a, c, scale, g_mat, positive_rows, anchor_cls, cand_cls, own, weight)
        ctx.n_classes = n_classes
        ctx.mark_non_differentiable(count)
        return value, count

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, _grad_count: Tensor) -> tuple[Tensor | None, ...]:
        a, c, scale, g_mat, positive_rows, anchor_cls, cand_cls, own, weight = ctx.saved_tensors
        acc = acc_dtype(a.dtype)  # a's own dtype unless it is half precision
        # The positive term -w_a Σ_p L_ap would put -w_a at each positive of G; it goes through class sums instead.
        wa = a.to(acc) * weight.to(acc)[:, None]  # (n, D)
        per_class = wa.new_zeros(ctx.n_classes, a.shape[1]).index_add_(0, anchor_cls, wa)
        pos_for_c = per_class[cand_cls]  # Σ of w_a a_a over the anchors of candidate k's class
        if own is not None:
            pos_for_c = pos_for_c.index_add(0, own, -wa)  # ... but not the anchor whose own embedding k is
        want_a, want_c, want_s = ctx.needs_input_grad[:3]
        factor = grad_out.to(acc)
        s = scale.to(acc)
        grad_a = grad_c = grad_s = None
        if want_a or want_s:
            h = mm_acc(g_mat, c).sub_(positive_rows * weight.to(acc)[:, None])  # ∂loss/∂(s a)
            if want_s:
                grad_s = ((h * a).sum() * factor).to(scale.dtype)
            if want_a:
                grad_a = h.mul_(s * factor).to(a.dtype)
        if want_c:
            grad_c = mm_acc(g_mat.T, a).sub_(pos_for_c).mul_(s * factor).to(c.dtype)
        return grad_a, grad_c, grad_s, None, None, None, None


def softmax_xent_sum(
    anchors: Tensor,
    candidates: Tensor,
    scale: Tensor | float,
    anchor_cls: Tensor,
    cand_cls: Tensor,
    own: Tensor | None = None,
    n_classes: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``Σ_a [lse_{k ≠ own(a)} L_ak - mean_{p ∈ P(a)} L_ap]`` over anchors with a positive, and their number.

    ``L = scale · anchors @ candidates.T``; ``P(a)`` = candidates of the anchor's class except ``own(a)``.

    Args:
        anchors: (n, D).
        candidates: (M, D), same dtype.
        scale: multiplier of the logits (``1 / temperature``), a number or a 0-d tensor (differentiable).
        anchor_cls: class of each anchor (n,), integers in ``[0, n_classes)``.
        cand_cls: class of each candidate (M,).
        own: index of each anchor's own candidate (n,), excluded from its softmax and positives; ``None``: none.
        n_classes: number of classes (default: ``max + 1``).

    Returns:
        ``(loss_sum, count)``, 0-d tensors in at least float32; ``count`` has no gradient. Under
        ``torch.autocast`` float32 operands are cast to the autocast dtype first (see the module docstring).

    Example:
        >>> import torch
        >>> x = torch.eye(2)
        >>> total, count = softmax_xent_sum(x, x, 1.0, torch.tensor([0, 1]), torch.tensor([0, 1]))
        >>> total / count  # cross-entropy of logits [[1, 0], [0, 1]] against the diagonal
        tensor(0.3133)
    """
    if n_classes is None:
        n_classes = int(cand_cls.max()) + 1 if cand_cls.numel() else 0
    dtype = compute_dtype(anchors, candidates)
    with autocast_off(anchors):
        anchors, candidates = anchors.to(dtype), candidates.to(dtype)
        scale_t = as_scale(scale, anchors)
        if needs_grad(anchors, candidates, scale_t):
            return _SoftmaxXent.apply(anchors, candidates, scale_t, anchor_cls, cand_cls, own, n_classes)
        value, count, *_ = _xent_forward(anchors, candidates, scale_t, (anchor_cls, cand_cls, own, n_classes), False)
    return value, count


# ------------------------------------------------------------------------------------------- CLIP, one pass
def _clip_forward(
    img: Tensor,
    txt_all: Tensor,
    scale: Tensor,
    row_start: int,
    combine_columns: ColumnCombine | None,
    need_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """Value ``Σ_own rows (lse_row - L_ii) / 2 + Σ_own columns (lse_col - L_jj) / 2`` and ``2 ∂value/∂L`` (or None).

    The row block's columns are every text of the batch; ``combine_columns`` turns the block's partial column
    log-sum-exps (``-inf`` for a block without rows) into those over every row of the batch.
    """
    n, m = img.shape[0], txt_all.shape[0]
    logits = scaled_products(img, txt_all.T, scale)  # (n, M): every logit of these rows, once
    diag_sum = logits[:, row_start : row_start + n].diagonal().sum()
    row_lse = logits.new_zeros(n)
    col_max = col_part = logits.new_full((m,), -torch.inf)
    if n and m:
        # Row and column statistics through a small reused buffer (a few row chunks of the block), so the block
        # is the only (n, M) tensor: each direction shifted by its own maxima, exact for any logit range.
        col_max = logits.amax(dim=0)
        col_sum = logits.new_zeros(m)
        for rows, block, tmp in _row_chunks(logits):
            row_max = block.amax(dim=1)
            row_lse[rows] = row_max + torch.sub(block, row_max[:, None], out=tmp).exp_().sum(dim=1).log()
            col_sum += torch.sub(block, col_max, out=tmp).exp_().sum(dim=0)
        col_part = col_max + col_sum.log()
    # across ranks every rank knows m (the gathered rows), so all of them combine or none does
    col_lse = combine_columns(col_part.contiguous()) if combine_columns is not None and m else col_part
    value = (row_lse.sum() + col_lse[row_start : row_start + n].sum() - 2 * diag_sum) / 2
    if not need_grad:
        return value, None
    if n and m:
        # 2 ∂value/∂L = softmax over the row + softmax over the column - 2 on the diagonal, in place
        for rows, block, tmp in _row_chunks(logits):
            torch.sub(block, row_lse[rows][:, None], out=tmp).exp_()
            block.sub_(col_lse).exp_().add_(tmp)
        logits[:, row_start : row_start + n].diagonal().sub_(2)
    return value, logits.to(img.dtype)


class _ClipOnePass(torch.autograd.Function):
    """``clip_block_sum``: forward as :func:`_clip_forward`; backward = this block's share of the batch gradient.

    The output is this block's part of the loss sum, but its backward is the gradient of the *whole* sum with
    respect to this block: the column terms of the other rows' texts depend on this block too. The gradients of
    all blocks add up to the batch gradient (across ranks the gathered texts' gradients are summed by the
    gather's backward); this needs every block to back-propagate the same gradient into its output, as every
    use of the batch's loss value does.
    """

    @staticmethod
    def forward(
        ctx: Any,
        img: Tensor,
        txt_all: Tensor,
        scale: Tensor,
        row_start: int,
        combine_columns: ColumnCombine | None,
    ) -> Tensor:
        value, g_mat = _clip_forward(img, txt_all, scale, row_start, combine_columns, True)
        ctx.save_for_backward(img, txt_all, scale, g_mat)
        return value

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        img, txt_all, scale, g_mat = ctx.saved_tensors
        return (*_matmul_grads(ctx, grad_out, g_mat, img, txt_all, scale, half=0.5), None, None)


def clip_block_sum(
    img: Tensor,
    txt_all: Tensor,
    scale: Tensor | float,
    row_start: int = 0,
    combine_columns: ColumnCombine | None = None,
) -> Tensor:
    """The symmetric CLIP loss summed over the rows ``[row_start, row_start + n)`` of a batch, in one pass.

    With ``L = scale · img_all @ txt_all.T`` (N, N), the rows' share is
    ``Σ_i (lse_j L_ij - L_ii) / 2 + Σ_j (lse_i L_ij - L_jj) / 2`` over the image rows ``i`` of ``img`` and
    their own text columns ``j`` (the same indices). Only ``img @ txt_all.T`` (n, N) is computed.

    Args:
        img: image embeddings (n, D), rows ``[row_start, row_start + n)`` of the batch.
        txt_all: every text embedding of the batch (N, D), in row order.
        scale: the logit scale, a number or a 0-d tensor (differentiable).
        row_start: index of the first row of ``img`` in the batch.
        combine_columns: the text-to-image log-sum-exps over every row of the batch from this block's partial
            ones (M,); ``None`` when ``img`` holds every row (``n = N``). Called once, in forward.

    Returns:
        A 0-d tensor in at least float32: the rows' share of the loss sum, whose backward is their share of the
        gradient of the whole sum (see :class:`_ClipOnePass`). Under ``torch.autocast`` float32 operands are
        cast to the autocast dtype first (see the module docstring).

    Example:
        >>> import torch
        >>> clip_block_sum(torch.eye(2), torch.eye(2), 1.0) / 2  # the mean over 2 rows
        tensor(0.3133)
    """
    dtype = compute_dtype(img, txt_all)
    with autocast_off(img):
        img, txt_all = img.to(dtype), txt_all.to(dtype)
        scale_t = as_scale(scale, img)
        if needs_grad(img, txt_all, scale_t):
            return _ClipOnePass.apply(img, txt_all, scale_t, row_start, combine_columns)
        return _clip_forward(img, txt_all, scale_t, row_start, combine_columns, False)[0]


# --------------------------------------------------------------------------------------------------- SigLIP
def _sigmoid_forward(
    img: Tensor, txt_all: Tensor, scale: Tensor, bias: Tensor, row_start: int, need_grad: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Value ``Σ_ij softplus(L_ij) - Σ_i L_ii`` (= ``-Σ log σ(z_ij L_ij)``), ``∂value/∂L = σ(L) - I`` and its sum."""
    acc = acc_dtype(img.dtype)
    n, m = img.shape[0], txt_all.shape[0]
    if acc == img.dtype:
        logits = torch.addmm(bias.to(img.dtype).expand(n, m), img * scale.to(img.dtype), txt_all.T)
    else:  # half-precision operands: float32 logits, the bias added in float32
        logits = scaled_products(img, txt_all.T, scale).add_(bias.to(acc))
    value = -logits[:, row_start : row_start + n].diagonal().sum()
    for lo in range(0, n, _CHUNK_ROWS):
        value = value + F.softplus(logits[lo : lo + _CHUNK_ROWS]).sum()
    if not need_grad:
        return value, None, None
    g_mat = logits.sigmoid_()
    g_mat[:, row_start : row_start + n].diagonal().sub_(1)
    return value, g_mat.to(img.dtype), g_mat.sum()


class _SigmoidRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, img: Tensor, txt_all: Tensor, scale: Tensor, bias: Tensor, row_start: int) -> Tensor:
        value, g_mat, g_sum = _sigmoid_forward(img, txt_all, scale, bias, row_start, True)
        ctx.save_for_backward(img, txt_all, scale, bias, g_mat, g_sum)
        return value

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        img, txt_all, scale, bias, g_mat, g_sum = ctx.saved_tensors
        grad_bias = (g_sum * grad_out).to(bias.dtype) if ctx.needs_input_grad[3] else None
        return (*_matmul_grads(ctx, grad_out, g_mat, img, txt_all, scale), grad_bias, None)


def sigmoid_sum(
    img: Tensor, txt_all: Tensor, scale: Tensor | float, bias: Tensor | float, row_start: int = 0
) -> Tensor:
    """``-Σ_i Σ_j log σ(z_ij (scale · img_i · txt_j + bias))`` over the rows of ``img``, ``z_ij = 1`` iff ``j`` is
    row ``i``'s own text (global index ``row_start + i``), else ``-1``.

    Example:
        >>> import torch
        >>> sigmoid_sum(torch.eye(2), torch.eye(2), 10.0, -5.0) / 2
        tensor(0.0134)
    """
    dtype = compute_dtype(img, txt_all)
    with autocast_off(img):
        img, txt_all = img.to(dtype), txt_all.to(dtype)
        scale_t, bias_t = as_scale(scale, img), as_scale(bias, img)
        if needs_grad(img, txt_all, scale_t, bias_t):
            return _SigmoidRows.apply(img, txt_all, scale_t, bias_t, row_start)
        return _sigmoid_forward(img, txt_all, scale_t, bias_t, row_start, False)[0]
