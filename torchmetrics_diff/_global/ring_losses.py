"""The ``"ring"`` strategy of the contrastive losses: per-rank memory independent of the global batch.

Each rank keeps its own rows as anchors and streams every rank's candidate block past them around the ring
(:func:`~torchmetrics_diff.distributed._ring.circulate`): the block of step ``k + 1`` travels to this rank
while it scores the block of step ``k``. Logits exist one tile of at most ``tile`` candidate columns at a time;
the softmax losses keep an online log-sum-exp per anchor row, and the forward saves only per-row statistics
(``(n,)`` numbers) besides the inputs. The backward streams the blocks again, recomputes every tile from the
saved statistics, and sends the gradient of each block on with the block, so that it arrives home, complete,
after ``W`` steps. A rank holds its own rows, at most two foreign blocks, three block-sized gradient buffers and
a few ``(B, tile)`` tiles: ``O(B·D + B·tile)`` whatever the number of ranks.

Kernels (each a :class:`torch.autograd.Function` over ``L = (s·A) @ C.T``, gradients ``s·G @ C``, ``G.T @ (s·A)``
and ``Σ A ⊙ (G @ C)`` for the anchors, the candidates and the scale, as in ``functional._kernels``, but over tiles
of streamed blocks where those score one block held whole):

- :class:`_RingXent`: ``Σ_a [lse_{k ≠ a} L_ak - mean_{p ∈ P(a)} L_ap]`` over anchors with a positive; the
  candidates are the anchors of every rank (InfoNCE: both views, classes = samples; SupCon: classes = labels).
  Candidate classes are known on every rank (a label per row, gathered once), so only embeddings travel.
- :class:`_RingClip`: ``Σ row lse + Σ column lse`` of the own texts. The text blocks travel; the column
  (text → image) log-sum-exp of a block is accumulated by every rank it passes and arrives home with it.
  Each logit is computed once in forward and once in backward, where the column statistics travel with the
  block together with the owner's output gradient.
- :class:`_RingSigmoid`: ``Σ softplus(L + b)`` (SigLIP's negatives; the diagonal is taken locally).

The terms that only involve a rank's own rows (CLIP's and SigLIP's diagonal, InfoNCE's positive when it is the
other local view) are plain autograd outside the kernels.

Mixed precision as in ``functional._kernels``: under ``torch.autocast`` float32 inputs are cast to the autocast
dtype (the blocks travel in it), the kernels run with autocast off, every tile's logits and statistics are float32
(``functional._checks.mm_acc``), the gradient buffers that travel are float32, and the gradients reach the inputs
in their dtype.

The ``ring_*`` functions are the ring implementations of the ``global_*`` losses (:mod:`.contrastive`), which
check the inputs and options (:func:`~.strategy.check_options`) before the first collective; called directly, they
take checked inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchmetrics_diff._global.strategy import Options, note_rows, sharded_value
from torchmetrics_diff.distributed import all_gather_cat
from torchmetrics_diff.distributed._backend import Group, dtype_code, dtype_from_code
from torchmetrics_diff.distributed._call import call_name, exchange
from torchmetrics_diff.distributed._failure import RanksDisagreeError
from torchmetrics_diff.distributed._ring import Ring, circulate
from torchmetrics_diff.functional._checks import (
    HALF,
    Scalar,
    acc_dtype,
    as_count,
    as_scale,
    autocast_off,
    compute_dtype,
    mm_acc,
    needs_grad,
    reciprocal,
)
from torchmetrics_diff.functional._contrastive import class_ids, unit_rows


# ------------------------------------------------------------------------------------------------- the plan
class _Plan(NamedTuple):
    """What every rank knows about every rank's candidate block (exchanged once, before the ring)."""

    ring: Ring
    rows: list[int]  # candidate rows of each rank's block
    starts: list[int]  # global index of each block's first candidate
    width: int
    dtype: torch.dtype
    device: torch.device
    tile: int

    def empty_block(self, owner: int) -> list[Tensor]:
        return [torch.empty(self.rows[owner], self.width, dtype=self.dtype, device=self.device)]

    def empty_grad(self, owner: int) -> Tensor:
        return torch.empty(self.rows[owner], self.width, dtype=acc_dtype(self.dtype), device=self.device)

    def tiles(self, owner: int) -> Iterator[tuple[int, int]]:
        """``(lo, hi)``: the candidate rows of each tile of ``owner``'s block."""
        rows = self.rows[owner]
        return ((lo, min(lo + self.tile, rows)) for lo in range(0, rows, self.tile))


def _plan(group: Group, block: Tensor, tile: int, wants_grad: bool, extra: Sequence[tuple[str, int]] = ()) -> _Plan:
    """Exchange every rank's block shape, dtype, whether it needs gradient and ``extra`` ``(name, value)`` pairs.

    The exchange is the call's header exchange (``distributed._call``), the strategy's first collective: a rank whose
    input checks failed joins it with a failure marker (``checked_together``), so every rank raises, and ranks in
    different calls raise too. Disagreements raise the same error on every rank.
    """
    ring = Ring(group)
    mine = [block.shape[0], block.shape[1], dtype_code(block.dtype), int(wants_grad), *(v for _, v in extra)]
    # host values in the call's header: the exchange never waits for the device
    peers = [mine] if ring.size == 1 else exchange("ring plan", mine, group)
    names = ["embedding width", "dtype", "whether the inputs require gradient", *(n for n, _ in extra)]
    fields = list(zip(*peers))  # every rank's value of each field (transposed in C: no Python code per rank)
    for name, values in zip(names, fields[1:]):
        if len(set(values)) > 1:
            shown = [dtype_from_code(v) for v in values] if name == "dtype" else values
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(shown))
            raise RanksDisagreeError(f"{call_name('ring strategy')}: ranks disagree on {name} ({listing})")
    rows = list(fields[0])
    starts = list(itertools.accumulate(rows[:-1], initial=0))  # O(W), where sum(rows[:r]) per rank was O(W²)
    return _Plan(ring, rows, starts, block.shape[1], block.dtype, block.device, tile)


def _logits(a: Tensor, chunk: Tensor, scale: Tensor) -> Tensor:
    """``(s·A) @ C.T`` of a tile, in the accumulation dtype; the scale multiplies the (tile, D) chunk, not A."""
    if acc_dtype(a.dtype) == a.dtype:
        return a @ (chunk * scale.to(chunk.dtype)).T
    return mm_acc(a, chunk.T).mul_(scale.to(acc_dtype(a.dtype)))  # half precision: the scale on the products


def _lse(logits: Tensor, dim: int, out: Tensor | None = None) -> Tensor:
    """``log Σ exp`` of ``logits`` along ``dim`` with one temporary of its size (``out`` when given)."""
    if logits.shape[dim] == 0:
        shape = list(logits.shape)
        del shape[dim]
        return logits.new_full(shape, -torch.inf)
    shift = logits.amax(dim=dim, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, 0.0)  # a row of -inf only: exp(-inf) = 0, lse -inf
    return torch.sub(logits, shift, out=out).exp_().sum(dim=dim).log_().add_(shift.squeeze(dim))


def _tile_grads(h: Tensor, part: Tensor, g_mat: Tensor, a: Tensor, chunk: Tensor) -> None:
    """``h += G @ C`` and ``part = Gᵀ @ A`` (the block's gradient before the scale) of one tile."""
    if h.dtype == g_mat.dtype:
        h.addmm_(g_mat, chunk)
    else:
        h.add_(mm_acc(g_mat, chunk))
    part.copy_(mm_acc(g_mat.T, a))


def _g_unit(g: Tensor, dtype: torch.dtype) -> Tensor | None:
    """With half-precision operands, a power of two near ``|g|``, the output gradient the backward folds into G.

    G is divided by it before its rounding to half precision and the products are multiplied by it after (both
    exact), so that a small output gradient (``1/N`` of a mean) cannot push G's entries below half precision's
    range (float16's smallest normal number is 6e-5). ``None`` for float32 and float64 operands.
    """
    if dtype not in HALF:
        return None
    return torch.exp2(torch.round(torch.log2(g.abs().clamp_min(torch.finfo(g.dtype).tiny))))


def _grads(
    want_s: bool, a: Tensor, scale: Tensor, h: Tensor, home: Tensor, same: bool
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """``(grad_A, grad_C, grad_s)`` from ``h = Σ G @ C`` and the candidates' gradient ``home``; with ``same``
    the anchors are the candidates and both paths go to ``A``."""
    s = scale.to(h.dtype)
    grad_s = torch.dot(h.reshape(-1), a.to(h.dtype).reshape(-1)).to(scale.dtype) if want_s else None
    grad_a = h.mul_(s)
    if same:
        grad_a = grad_a.add_(home)
        return grad_a.to(a.dtype), None, grad_s
    return grad_a.to(a.dtype), home.to(a.dtype), grad_s


def _ring_grads(
    a: Tensor,
    scale: Tensor,
    g: Tensor,
    plan: _Plan,
    own: list[Tensor],
    empty_block: Callable[[int], list[Tensor]],
    tile_g: Callable[[int, int, int, list[Tensor]], Tensor],
    want_s: bool,
    same: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The ring pass of a backward: ``own`` (the candidates first) travels around the ranks; each tile's ``G``,
    ``tile_g(owner, lo, hi, block)`` in the dtype of ``g``, goes into ``h = Σ G @ C`` and into the gradient of
    the block, which travels home; then :func:`_grads`. A half-precision ``G`` is divided by :func:`_g_unit`
    before its rounding, and the products multiplied by it after."""
    acc = g.dtype
    h = torch.zeros(a.shape, dtype=acc, device=a.device)
    unit = _g_unit(g, a.dtype)
    factor = scale.to(acc) if unit is None else scale.to(acc) * unit

    def visit(owner: int, block: list[Tensor]) -> Tensor:
        cand = block[0]
        part = torch.empty(cand.shape, dtype=acc, device=cand.device)
        for lo, hi in plan.tiles(owner):
            g_mat = tile_g(owner, lo, hi, block)
            if unit is not None:
                g_mat.div_(unit)
            _tile_grads(h, part[lo:hi], g_mat.to(a.dtype), a, cand[lo:hi])
        return part.mul_(factor)

    home = circulate(plan.ring, own, empty_block, visit, plan.empty_grad)
    if unit is not None:
        h.mul_(unit)
    return _grads(want_s, a, scale, h, home, same)


# ----------------------------------------------------------------------------------- softmax rows (InfoNCE, SupCon)
def _xent_tile(
    a: Tensor, chunk: Tensor, scale: Tensor, own_block: bool, lo: int, a_cls: Tensor, c_cls: Tensor
) -> tuple[Tensor, Tensor]:
    """Logits of a tile with each anchor's own column at ``-inf``, and the positives mask (own excluded)."""
    logits = _logits(a, chunk, scale)
    same = a_cls[:, None] == c_cls[None, :]
    if own_block:  # anchor a is candidate a of its own block
        hi = lo + chunk.shape[0]
        logits[lo:hi].diagonal().fill_(-torch.inf)
        same[lo:hi].diagonal().fill_(False)
    return logits, same


def _stream_xent(z: Tensor, scale: Tensor, plan: _Plan, cls_all: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    acc = acc_dtype(z.dtype)
    rank = plan.ring.rank
    a_cls = cls_all[plan.starts[rank] : plan.starts[rank] + z.shape[0]]
    lse = torch.full((z.shape[0],), -torch.inf, dtype=acc, device=z.device)
    positive = torch.zeros(z.shape[0], dtype=acc, device=z.device)

    def visit(owner: int, block: list[Tensor]) -> None:
        for lo, hi in plan.tiles(owner):
            c_cls = cls_all[plan.starts[owner] + lo : plan.starts[owner] + hi]
            logits, same = _xent_tile(z, block[0][lo:hi], scale, owner == rank, lo, a_cls, c_cls)
            positive.add_(torch.where(same, logits, 0.0).sum(dim=1))
            torch.logaddexp(lse, _lse(logits, 1), out=lse)

    circulate(plan.ring, [z.detach()], plan.empty_block, visit)
    valid = weight > 0
    value = torch.where(valid, lse - positive * weight, torch.zeros_like(lse)).sum()
    return value, lse


class _RingXent(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, scale: Tensor, plan: _Plan, cls_all: Tensor, weight: Tensor) -> Tensor:
        value, lse = _stream_xent(z, scale, plan, cls_all, weight)
        ctx.save_for_backward(z, scale, lse, cls_all, weight)
        ctx.plan = plan
        return value

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        z, scale, lse, cls_all, weight = ctx.saved_tensors
        plan: _Plan = ctx.plan
        rank = plan.ring.rank
        valid = weight > 0
        g = grad_out.to(lse.dtype)
        row_coef = torch.where(valid, g, 0.0)[:, None]
        lse_safe = torch.where(valid, lse, torch.inf)[:, None]  # invalid rows: exp(L - inf) = 0
        pos_coef = (g * weight)[:, None]
        a_cls = cls_all[plan.starts[rank] : plan.starts[rank] + z.shape[0]]

        def tile_g(owner: int, lo: int, hi: int, block: list[Tensor]) -> Tensor:
            c_cls = cls_all[plan.starts[owner] + lo : plan.starts[owner] + hi]
            logits, same = _xent_tile(z, block[0][lo:hi], scale, owner == rank, lo, a_cls, c_cls)
            return logits.sub_(lse_safe).exp_().mul_(row_coef).sub_(same * pos_coef)

        want_s = ctx.needs_input_grad[1]
        grad_z, _, grad_s = _ring_grads(z, scale, g, plan, [z.detach()], plan.empty_block, tile_g, want_s, same=True)
        return grad_z, grad_s, None, None, None


def _xent_sum(z: Tensor, scale: Tensor, plan: _Plan, cls_all: Tensor, weight: Tensor) -> Tensor:
    if needs_grad(z, scale):
        return _RingXent.apply(z, scale, plan, cls_all, weight)
    return _stream_xent(z, scale, plan, cls_all, weight)[0]


# --------------------------------------------------------------------------------------------------- CLIP
def _stream_clip(img: Tensor, txt: Tensor, scale: Tensor, plan: _Plan) -> tuple[Tensor, Tensor, Tensor]:
    """``Σ row lse + Σ own column lse``, the row and the (complete) own column log-sum-exps."""
    acc = acc_dtype(img.dtype)
    row_lse = torch.full((img.shape[0],), -torch.inf, dtype=acc, device=img.device)

    def visit(owner: int, block: list[Tensor]) -> Tensor:
        col = torch.empty(plan.rows[owner], dtype=acc, device=img.device)
        for lo, hi in plan.tiles(owner):
            logits = _logits(img, block[0][lo:hi], scale)
            buffer = torch.empty_like(logits)  # the tile's one temporary, for both directions
            torch.logaddexp(row_lse, _lse(logits, 1, buffer), out=row_lse)
            col[lo:hi] = _lse(logits, 0, buffer)
        return col

    col_lse = circulate(
        plan.ring,
        [txt.detach()],
        plan.empty_block,
        visit,
        lambda owner: torch.empty(plan.rows[owner], dtype=acc, device=img.device),
        lambda incoming, part: torch.logaddexp(incoming, part, out=incoming),
    )
    return row_lse.sum() + col_lse.sum(), row_lse, col_lse


class _RingClip(torch.autograd.Function):
    """``Σ row lse + Σ own column lse``; with ``fold_diagonal`` its backward also carries the gradient of
    ``-2 Σ_i L_ii`` (the caller's diagonal term, then detached) inside ``G`` (see :func:`ring_clip_loss`)."""

    @staticmethod
    def forward(ctx: Any, img: Tensor, txt: Tensor, scale: Tensor, plan: _Plan, fold_diagonal: bool) -> Tensor:
        value, row_lse, col_lse = _stream_clip(img, txt, scale, plan)
        ctx.save_for_backward(img, txt, scale, row_lse, col_lse)
        ctx.plan, ctx.fold_diagonal = plan, fold_diagonal
        return value

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        img, txt, scale, row_lse, col_lse = ctx.saved_tensors
        plan: _Plan = ctx.plan
        fold, rank = ctx.fold_diagonal, plan.ring.rank
        acc = row_lse.dtype
        g = grad_out.to(acc)
        row_lse = row_lse[:, None]

        def tile_g(owner: int, lo: int, hi: int, block: list[Tensor]) -> Tensor:
            cand, info = block  # info: the owner's column log-sum-exps, then its output gradient
            logits = _logits(img, cand[lo:hi], scale)
            by_row = torch.sub(logits, row_lse).exp_().mul_(g)
            g_mat = logits.sub_(info[lo:hi][None, :]).exp_().mul_(info[-1]).add_(by_row)
            del by_row
            if fold and owner == rank:  # the diagonal term's -2g, before G is rounded to half precision
                g_mat[lo:hi].diagonal().sub_(2 * g)
            return g_mat

        def empty_block(owner: int) -> list[Tensor]:
            return [*plan.empty_block(owner), torch.empty(plan.rows[owner] + 1, dtype=acc, device=img.device)]

        own = [txt.detach(), torch.cat([col_lse, g.reshape(1)])]
        want_s = ctx.needs_input_grad[2]
        grad_img, grad_txt, grad_s = _ring_grads(img, scale, g, plan, own, empty_block, tile_g, want_s, same=False)
        return grad_img, grad_txt, grad_s, None, None


# -------------------------------------------------------------------------------------------------- SigLIP
def _stream_sigmoid(img: Tensor, txt: Tensor, scale: Tensor, bias: Tensor, plan: _Plan) -> Tensor:
    acc = acc_dtype(img.dtype)
    b = bias.to(acc)
    total = torch.zeros((), dtype=acc, device=img.device)

    def visit(owner: int, block: list[Tensor]) -> None:
        for lo, hi in plan.tiles(owner):
            total.add_(F.softplus(_logits(img, block[0][lo:hi], scale).add_(b)).sum())

    circulate(plan.ring, [txt.detach()], plan.empty_block, visit)
    return total


class _RingSigmoid(torch.autograd.Function):
    """``Σ softplus(L + b)``; with ``fold_diagonal`` its backward also carries the gradient of ``-Σ_i (L_ii + b)``
    (the caller's diagonal term, then detached) inside ``G`` (see :func:`ring_siglip_loss`)."""

    @staticmethod
    def forward(
        ctx: Any, img: Tensor, txt: Tensor, scale: Tensor, bias: Tensor, plan: _Plan, fold_diagonal: bool
    ) -> Tensor:
        ctx.save_for_backward(img, txt, scale, bias)
        ctx.plan, ctx.fold_diagonal = plan, fold_diagonal
        return _stream_sigmoid(img, txt, scale, bias, plan)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        img, txt, scale, bias = ctx.saved_tensors
        plan: _Plan = ctx.plan
        fold, rank = ctx.fold_diagonal, plan.ring.rank
        acc = acc_dtype(img.dtype)
        g, b = grad_out.to(acc), bias.to(acc)
        grad_b = torch.zeros((), dtype=acc, device=img.device)

        def tile_g(owner: int, lo: int, hi: int, block: list[Tensor]) -> Tensor:
            g_acc = _logits(img, block[0][lo:hi], scale).add_(b).sigmoid_().mul_(g)
            if fold and owner == rank:  # the diagonal term's -g, before G is rounded to half precision
                g_acc[lo:hi].diagonal().sub_(g)
            grad_b.add_(g_acc.sum())
            return g_acc

        own, want_s = [txt.detach()], ctx.needs_input_grad[2]
        grad_img, grad_txt, grad_s = _ring_grads(img, scale, g, plan, own, plan.empty_block, tile_g, want_s, same=False)
        grad_bias = grad_b.to(bias.dtype) if ctx.needs_input_grad[3] else None
        return grad_img, grad_txt, grad_s, grad_bias, None, None


# ------------------------------------------------------------------------------------------- the losses
def ring_clip_loss(image_embeds: Tensor, text_embeds: Tensor, logit_scale: Scalar, options: Options) -> Tensor:
    """Symmetric CLIP loss of the global batch with the ring strategy: the text blocks travel, images stay.

    Args:
        image_embeds: this rank's image embeddings (B, D), used as given.
        text_embeds: this rank's text embeddings (B, D); row i pairs with image row i.
        logit_scale: the multiplier of the similarities, a number or a 0-d tensor (differentiable).
        options: the checked options (:func:`~.strategy.check_options`): group, grad_reduction, tile.

    Example:
        >>> import torch
        >>> from torchmetrics_diff._global.strategy import check_options
        >>> ring_clip_loss(torch.eye(2), torch.eye(2), 1.0, check_options("ring", None, "mean", 1))
        tensor(0.3133)
    """
    dtype = compute_dtype(image_embeds, text_embeds)
    with autocast_off(image_embeds):
        img, txt = image_embeds.to(dtype), text_embeds.to(dtype)
        scale_t = as_scale(logit_scale, img)
        wants = needs_grad(img, txt, scale_t)
        plan = _plan(options.group, txt, options.tile, wants)
        note_rows(options, plan.rows)
        # half precision: the diagonal's gradient goes inside G, whose diagonal entries are then small (rounding
        # p + q - 2 rather than p + q to half precision); float32 and float64 keep it outside, in autograd
        fold = wants and dtype in HALF
        both = _RingClip.apply(img, txt, scale_t, plan, fold) if wants else _stream_clip(img, txt, scale_t, plan)[0]
        acc = both.dtype
        diag = (img.to(acc) * txt.to(acc)).sum() * scale_t.to(acc)  # in float32 at least: a sum over the rows
        diag = diag.detach() if fold else diag
    return _value(both / 2 - diag, as_count(img.shape[0], both), plan, options)


def ring_siglip_loss(
    image_embeds: Tensor, text_embeds: Tensor, logit_scale: Scalar, logit_bias: Scalar, options: Options
) -> Tensor:
    """SigLIP loss of the global batch with the ring strategy: the text blocks travel, images stay.

    Example:
        >>> import torch
        >>> from torchmetrics_diff._global.strategy import check_options
        >>> ring_siglip_loss(torch.eye(2), torch.eye(2), 10.0, -5.0, check_options("ring", None, "mean", 1))
        tensor(0.0134)
    """
    dtype = compute_dtype(image_embeds, text_embeds)
    with autocast_off(image_embeds):
        img, txt = image_embeds.to(dtype), text_embeds.to(dtype)
        scale_t, bias_t = as_scale(logit_scale, img), as_scale(logit_bias, img)
        wants = needs_grad(img, txt, scale_t, bias_t)
        plan = _plan(options.group, txt, options.tile, wants)
        note_rows(options, plan.rows)
        fold = wants and dtype in HALF  # the diagonal's gradient inside G, as in ring_clip_loss
        if wants:
            negatives = _RingSigmoid.apply(img, txt, scale_t, bias_t, plan, fold)
        else:
            negatives = _stream_sigmoid(img, txt, scale_t, bias_t, plan)
        acc = negatives.dtype
        diag = (img.to(acc) * txt.to(acc)).sum() * scale_t.to(acc) + img.shape[0] * bias_t.to(acc)
        diag = diag.detach() if fold else diag
    return _value(negatives - diag, as_count(img.shape[0], negatives), plan, options)


def ring_info_nce_loss(z1: Tensor, z2: Tensor, temperature: Scalar, options: Options) -> Tensor:
    """NT-Xent loss of the global batch with the ring strategy: both views of a rank's rows travel together.

    Example:
        >>> import torch
        >>> from torchmetrics_diff._global.strategy import check_options
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> ring_info_nce_loss(z, z, 0.5, check_options("ring", None, "mean", 1))
        tensor(0.2395)
    """
    n = z1.shape[0]
    dtype = compute_dtype(z1, z2)  # (asked before autocast is turned off)
    with autocast_off(z1):
        z = unit_rows(torch.cat([z1, z2.to(z1.dtype)])).to(dtype)  # this rank's 2n candidates: view 1, then view 2
        scale_t = as_scale(reciprocal(temperature), z)
        plan = _plan(options.group, z, options.tile, needs_grad(z, scale_t))
        note_rows(options, plan.rows, views=2)  # (both views of a sample travel in its rank's block)
        # class of a candidate = its global sample index; the other view is an anchor's only positive
        cls_all = _sample_of_candidates(plan.rows, z.device)
        weight = torch.ones(2 * n, dtype=acc_dtype(z.dtype), device=z.device)
        total = _xent_sum(z, scale_t, plan, cls_all, weight)
    return _value(total, as_count(2 * n, total), plan, options)


def _sample_of_candidates(rows: list[int], device: torch.device) -> Tensor:
    """The global sample index of every candidate, in ring order, from each rank's candidate rows ``2 n_r``: rank
    ``r``'s block holds its ``n_r`` samples twice (view 1, then view 2). A few tensor operations, whatever ``W``.

    Example:
        >>> _sample_of_candidates([4, 0, 2], torch.device("cpu"))
        tensor([0, 1, 0, 1, 2, 2])
    """
    per_rank = torch.tensor(rows, device=device)  # 2 n_r: one conversion of W numbers
    first = (per_rank.cumsum(0) - per_rank) // 2  # each rank's first sample
    owner = torch.repeat_interleave(per_rank, output_size=sum(rows))  # each candidate's rank
    start, half = first[owner], per_rank[owner] // 2
    local = torch.arange(len(owner), device=device) - 2 * start  # its index in its rank's block
    return start + torch.where(local < half, local, local - half)


def ring_supcon_loss(features: Tensor, labels: Tensor | None, temperature: Scalar, options: Options) -> Tensor:
    """Supervised contrastive loss of the global batch with the ring strategy; labels are gathered once.

    Example:
        >>> import torch
        >>> from torchmetrics_diff._global.strategy import check_options
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> ring_supcon_loss(feats, torch.tensor([0, 0, 1]), 1.0, check_options("ring", None, "mean", 2))
        tensor(0.4846)
    """
    n, views = features.shape[0], features.shape[1] if features.ndim == 3 else 1
    dtype = compute_dtype(features)  # (asked before autocast is turned off)
    with autocast_off(features):
        z = unit_rows(features.reshape(n * views, features.shape[-1])).to(dtype)  # sample-major views
        return _ring_supcon(z, n, views, labels, temperature, options)


def _ring_supcon(z: Tensor, n: int, views: int, labels: Tensor | None, temperature: Scalar, options: Options) -> Tensor:
    scale_t = as_scale(reciprocal(temperature), z)
    extra = [("views per sample", views), ("whether labels are given", int(labels is not None))]
    plan = _plan(options.group, z, options.tile, needs_grad(z, scale_t), extra)
    note_rows(options, plan.rows, views=views)
    if labels is None:
        labels_all = torch.arange(sum(plan.rows) // views, device=z.device)
    elif plan.ring.size == 1:
        labels_all = labels.reshape(-1)
    else:
        labels_all = all_gather_cat(labels.reshape(-1).to(torch.int64), options.group, grad="none")
    ids, n_classes = class_ids(labels_all)
    cls_all = ids.repeat_interleave(views)
    own = cls_all[plan.starts[plan.ring.rank] : plan.starts[plan.ring.rank] + n * views]
    # (index_add rather than bincount: bincount reads the largest id back to the host)
    positives = cls_all.new_zeros(n_classes).index_add_(0, cls_all, torch.ones_like(cls_all))[own] - 1
    weight = torch.where(positives > 0, 1.0 / positives.clamp_min(1).to(acc_dtype(z.dtype)), 0.0)
    total = _xent_sum(z, scale_t, plan, cls_all, weight)
    return _value(total, as_count((positives > 0).sum(), total), plan, options)


def _value(loss_sum: Tensor, count: Tensor, plan: _Plan, options: Options) -> Tensor:
    return sharded_value(loss_sum, count, plan.ring.size, options.group, options.grad_reduction)
