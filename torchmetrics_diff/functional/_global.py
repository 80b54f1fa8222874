"""Global-batch losses across ranks: the maths of ``_contrastive`` run on every rank's rows (DESIGN §1, §5).

Each ``global_*`` function takes the *local* rows and returns, on every rank, the loss of the concatenated
global batch. Its gradient, after a trainer averages gradients over the ``W`` ranks (``grad_reduction="mean"``:
DDP, FSDP, DeepSpeed) or sums them (``"sum"``), equals that of one process on the global batch.

Three strategies (the third, ``"ring"``, lives in :mod:`._ring`):

- ``"replicated"``: gather every rank's rows (``grad="local"``), every rank computes the whole (N, N) loss;
  the local slot's gradient is scaled by ``W`` under averaging. No communication in backward.
- ``"sharded"``: gather the candidates with ``grad="sync"``, each rank scores only its own rows against all
  of them (B × N instead of N × N), normalized by the global count; one scalar all-reduce gives the value.
  The backward reduce-scatters the candidates' gradients to their owners. ``W`` times less compute and
  memory per rank for the loss. Sharded CLIP gathers only the texts and computes each global logit once
  (``_fused.clip_sum``: the text-to-image statistics come from every rank's partial column log-sum-exps).

All views of a sample travel in one collective (packed side by side), so every rank issues the same
collectives in the same order in forward and backward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Callable

import torch
from torch import Tensor

from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import Group, group_rank, group_size
from torchmetrics_diff.distributed._collectives import fail_together
from torchmetrics_diff.distributed._compile import outside_graph, sum_across_ranks
from torchmetrics_diff.functional._contrastive import (
    Scalar,
    _check_float_tensor,
    _check_labels,
    _check_same_shape,
    _check_scalar,
    _count,
    _safe_divide,
    barlow_twins_from_stats,
    barlow_twins_loss,  # noqa: F401 (doctest)
    barlow_twins_stats,
    info_nce_block,
    siglip_block,
    supcon_block,
    token_cross_entropy_block,
    weighted_mean_block,
)
from torchmetrics_diff.functional._fused import clip_sum

STRATEGIES = ("replicated", "sharded", "ring")
GRAD_REDUCTIONS = ("mean", "sum")

# block(local_views, all_views, row_start) -> (loss_sum, count) of the anchors in the local rows
Block = Callable[[Sequence[Tensor], Sequence[Tensor], int], "tuple[Tensor, Tensor]"]


@contextmanager
def checked_together(group: Group, like: object = None) -> Iterator[None]:
    """Validate inputs so that a bad input on one rank raises on every rank instead of hanging the others.

    The block must run just before this module's first collective: a rank whose checks raise takes part in that
    collective's metadata exchange with a failure marker (see :func:`fail_together`), on the device of ``like``
    (the input the peers communicate from; the backend's default device when it is not a tensor).
    """
    try:
        yield
    except Exception as err:
        if group_size(group) == 1:
            raise
        fail_together(err, group, device=like.device if isinstance(like, Tensor) else None)


def _check_views(first_name: str, first: Tensor, second_name: str, second: Tensor) -> None:
    """Two views of the same local samples: floating (B, D) tensors of one shape."""
    _check_float_tensor(first_name, first, 2, "(B, D)")
    _check_same_shape(second_name, second, first_name, first)


def _check_options(strategy: str, grad_reduction: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {STRATEGIES}; got {strategy!r}")
    if grad_reduction not in GRAD_REDUCTIONS:
        raise ValueError(f"`grad_reduction` must be one of {GRAD_REDUCTIONS}; got {grad_reduction!r}")


def _pack(views: Sequence[Tensor]) -> tuple[Tensor, list[tuple[int, ...]]]:
    """Rows of every view side by side, (n, Σ width), so one collective moves them all."""
    dtype = views[0].dtype
    for v in views[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    flat = [v.to(dtype).reshape(v.shape[0], int(torch.Size(v.shape[1:]).numel())) for v in views]
    return torch.cat(flat, dim=1), [tuple(v.shape[1:]) for v in views]


def _same_width(pieces: list[Tensor]) -> list[Tensor]:
    """Every rank's rows must have the same trailing shape (the same embedding width); raise on every rank."""
    widths = [tuple(p.shape[1:]) for p in pieces]
    if any(w != widths[0] for w in widths):
        listing = ", ".join(f"rank {r}: {w}" for r, w in enumerate(widths))
        raise RuntimeError(
            f"global loss: ranks disagree on the width of their embeddings, packed side by side ({listing})"
        )
    return pieces


def _unpack(packed: Tensor, trailing: list[tuple[int, ...]]) -> list[Tensor]:
    widths = [int(torch.Size(t).numel()) for t in trailing]
    return [p.reshape(packed.shape[0], *t) for p, t in zip(packed.split(widths, dim=1), trailing)]


def global_rows_loss(
    views: Sequence[Tensor],
    block: Block,
    *,
    strategy: str = "sharded",
    group: Group = None,
    grad_reduction: str = "mean",
    candidates: Sequence[int] | None = None,
) -> Tensor:
    """The global-batch mean loss of a row-decomposable loss, given each rank's rows.

    The building block of every contrastive loss here; use it for your own.

    Args:
        views: tensors with the same number of rows (the local samples), e.g. ``(img, txt)``.
        block: ``block(local_views, all_views, row_start) -> (loss_sum, count)``: the loss summed over the
            anchors of rows ``[row_start, row_start + n)`` against all ``N`` global rows.
        strategy: ``"replicated"`` or ``"sharded"`` (see :doc:`/guide/strategies`).
        group: the process group (``None``: default).
        grad_reduction: ``"mean"`` when the trainer averages gradients over ranks (DDP), ``"sum"`` otherwise.
        candidates: with ``"sharded"``, the indices of the views whose global rows ``block`` reads (the others are
            not gathered and arrive as ``None``); default all.

    Returns:
        The global loss ``Σ loss_sum / Σ count`` (``0`` when the global count is 0), identical on every rank.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.functional import clip_block
        >>> img, txt = torch.eye(3), torch.eye(3)
        >>> block = lambda local, every, start: clip_block(*local, *every, 1.0, start)
        >>> global_rows_loss([img, txt], block)  # one process: the plain loss
        tensor(0.5514)
    """
    with checked_together(group, views[0] if len(views) else None):
        _check_options(strategy, grad_reduction)
        if strategy == "ring":
            raise ValueError("`strategy` 'ring' needs a ring kernel (CLIP, InfoNCE, SupCon, SigLIP); not for a block")
    world = group_size(group)
    if world == 1:
        loss_sum, count = block(views, views, 0)
        return _safe_divide(loss_sum, count)
    rank = group_rank(group)
    if strategy == "replicated":
        packed, trailing = _pack(views)
        # Every rank computes the whole loss, so a parameter used in it directly (a logit scale) already has
        # its full gradient on every rank, and the local slot has 1/W of its share after averaging. Scale the
        # slot by W, and under summed gradients scale the whole loss's gradient by 1/W.
        every = torch.cat(_same_width(gather_all_tensors(scale_grad(packed, world), group, grad="local")))
        all_views = _unpack(every, trailing)
        loss_sum, count = block(all_views, all_views, 0)
        loss = _safe_divide(loss_sum, count)
        return loss if grad_reduction == "mean" else scale_grad(loss, 1 / world)
    needed = range(len(views)) if candidates is None else candidates
    packed, trailing = _pack([views[i] for i in needed])
    pieces = _same_width(gather_all_tensors(packed, group, grad="sync"))
    row_start = sum(p.shape[0] for p in pieces[:rank])
    all_views: list[Tensor | None] = [None] * len(views)
    for i, gathered in zip(needed, _unpack(torch.cat(pieces), trailing)):
        all_views[i] = gathered
    loss_sum, count = block(views, all_views, row_start)
    return _sharded_value(loss_sum, count, world, group, grad_reduction)


def _sharded_value(loss_sum: Tensor, count: Tensor, world: int, group: Group, grad_reduction: str) -> Tensor:
    """The global value ``Σ loss_sum / Σ count`` whose gradient is this rank's ``loss_sum`` gradient, scaled.

    The gather before it validated dtypes across ranks, so the value's sums need no metadata round of their own
    (a functional-collective all-reduce under ``torch.compile``; see ``_global_totals``).
    """
    totals = _global_totals(loss_sum, count, group, world)
    global_count = totals[1].clamp_min(1)
    share = loss_sum * (world if grad_reduction == "mean" else 1) / global_count
    return totals[0] / global_count + (share - share.detach())


def global_clip_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Scalar,
    *,
    strategy: str = "sharded",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Symmetric CLIP loss of the global batch (every rank's rows), from this rank's rows.

    ``"sharded"`` computes each global logit once: this rank's row block ``scale · img_local @ txt_all.T``
    (only the text embeddings are gathered), the image-to-text log-sum-exps of its rows locally, the
    text-to-image log-sum-exps of its own texts from every rank's partial column statistics (one all-gather of
    N numbers per rank), and both directions' gradients from the one block (:func:`clip_sum`). ``"replicated"``
    computes the whole (N, N) block on every rank, by the same one-pass kernel.

    Args:
        image_embeds: local image embeddings (B, D), used as given (normalize in the model).
        text_embeds: local text embeddings (B, D); row i pairs with image row i.
        logit_scale: the multiplier of the similarities (e.g. ``model.logit_scale.exp()``).
        strategy: ``"replicated"``, ``"sharded"`` or ``"ring"`` (:doc:`/guide/ring`).
        group: the process group.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``.
        tile: with ``"ring"``, candidate columns per logit tile (default 64).

    Example:
        >>> import torch
        >>> global_clip_loss(torch.eye(2), torch.eye(2), 1.0)
        tensor(0.3133)
    """
    with checked_together(group, image_embeds):
        _check_views("image_embeds", image_embeds, "text_embeds", text_embeds)
        scale = _check_scalar("logit_scale", logit_scale)
        _check_options(strategy, grad_reduction)
    if strategy == "ring":
        from torchmetrics_diff.functional._ring import ring_clip_loss

        return outside_graph(ring_clip_loss)(
            image_embeds, text_embeds, scale, group=group, grad_reduction=grad_reduction, tile=tile
        )
    world = group_size(group)
    if strategy == "replicated" or world == 1:
        return global_rows_loss(
            [image_embeds, text_embeds],
            lambda loc, every, start: (clip_sum(every[0], every[1], scale), _count(every[0].shape[0], every[0])),
            strategy=strategy,
            group=group,
            grad_reduction=grad_reduction,
        )
    dtype = torch.promote_types(image_embeds.dtype, text_embeds.dtype)
    pieces = _same_width(gather_all_tensors(text_embeds.to(dtype), group, grad="sync"))
    rank = group_rank(group)
    row_start = sum(p.shape[0] for p in pieces[:rank])
    loss_sum = clip_sum(image_embeds.to(dtype), torch.cat(pieces), scale, row_start, sharded=True, group=group)
    return _sharded_value(loss_sum, _count(image_embeds.shape[0], loss_sum), world, group, grad_reduction)


def global_info_nce_loss(
    z1: Tensor,
    z2: Tensor,
    temperature: Scalar = 0.1,
    *,
    strategy: str = "sharded",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """NT-Xent (SimCLR) loss of the global batch: 2N anchors, each against all other 2N - 1 embeddings.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> global_info_nce_loss(z, z, temperature=0.5)
        tensor(0.2395)
    """
    with checked_together(group, z1):
        _check_views("z1", z1, "z2", z2)
        _check_scalar("temperature", temperature, positive=True)
    if strategy == "ring":
        from torchmetrics_diff.functional._ring import ring_info_nce_loss

        return outside_graph(ring_info_nce_loss)(
            z1, z2, temperature, group=group, grad_reduction=grad_reduction, tile=tile
        )
    return global_rows_loss(
        [z1, z2],
        lambda loc, every, start: info_nce_block(*loc, *every, temperature, start),
        strategy=strategy,
        group=group,
        grad_reduction=grad_reduction,
    )


def global_supcon_loss(
    features: Tensor,
    labels: Tensor | None = None,
    temperature: Scalar = 0.1,
    *,
    strategy: str = "sharded",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Supervised contrastive loss of the global batch; labels are gathered too (without gradient).

    Args:
        features: local features (B, D) or (B, V, D) with V views per sample.
        labels: local integer labels (B,); ``None``: every sample its own class.
        temperature: the divisor of the cosine similarities.
        strategy: ``"replicated"``, ``"sharded"`` or ``"ring"`` (:doc:`/guide/ring`).
        group: the process group.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``.
        tile: with ``"ring"``, candidate columns per logit tile (default 64).

    Example:
        >>> import torch
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> global_supcon_loss(feats, torch.tensor([0, 0, 1]), temperature=1.0)
        tensor(0.4846)
    """
    with checked_together(group, features):
        _check_float_tensor("features", features, (2, 3), "(B, D) or (B, V, D)")
        _check_scalar("temperature", temperature, positive=True)
        if labels is not None:
            _check_labels("labels", labels, features.shape[0])
    if strategy == "ring":
        from torchmetrics_diff.functional._ring import ring_supcon_loss

        return outside_graph(ring_supcon_loss)(
            features, labels, temperature, group=group, grad_reduction=grad_reduction, tile=tile
        )
    labels_all = labels  # one process: the local labels (None: every sample its own class)
    if group_size(group) > 1:
        labels_all = _global_labels(features, labels, group)
    return global_rows_loss(
        [features],
        lambda loc, every, start: supcon_block(loc[0], every[0], labels_all, temperature, start),
        strategy=strategy,
        group=group,
        grad_reduction=grad_reduction,
    )


@outside_graph  # the row counts of the peers and the labels-given check are host decisions: one graph break
def _global_labels(features: Tensor, labels: Tensor | None, group: Group) -> Tensor:
    """Every rank's labels, concatenated (``None`` on every rank: ``arange``, every sample its own class)."""
    # (label, given) per row in one collective: every rank learns whether all of them passed labels
    given = labels is not None
    rows = torch.zeros(features.shape[0], 2, dtype=torch.int64, device=features.device)
    if given:
        rows[:, 0] = labels.reshape(-1)
    rows[:, 1] = int(given)
    every = all_gather_cat(rows, group, grad="none")
    flags = every[:, 1]
    if flags.numel() and bool((flags != flags[0]).any()):
        raise RuntimeError("global_supcon_loss: `labels` must be given on every rank or on none")
    return every[:, 0] if flags.numel() and bool(flags[0]) else torch.arange(every.shape[0], device=features.device)


def global_siglip_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Scalar,
    logit_bias: Scalar,
    *,
    strategy: str = "sharded",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Pairwise sigmoid (SigLIP) loss of the global batch, normalized by the global row count.

    Example:
        >>> import torch
        >>> global_siglip_loss(torch.eye(2), torch.eye(2), 10.0, -5.0)
        tensor(0.0134)
    """
    with checked_together(group, image_embeds):
        _check_views("image_embeds", image_embeds, "text_embeds", text_embeds)
        _check_scalar("logit_scale", logit_scale)
        _check_scalar("logit_bias", logit_bias)
    if strategy == "ring":
        from torchmetrics_diff.functional._ring import ring_siglip_loss

        return outside_graph(ring_siglip_loss)(
            image_embeds, text_embeds, logit_scale, logit_bias, group=group, grad_reduction=grad_reduction, tile=tile
        )
    return global_rows_loss(
        [image_embeds, text_embeds],
        lambda loc, every, start: siglip_block(loc[0], every[1], logit_scale, logit_bias, start),
        strategy=strategy,
        group=group,
        grad_reduction=grad_reduction,
        candidates=[1],  # image rows score against every text; the images themselves are not needed globally
    )


def global_barlow_twins_loss(
    za: Tensor,
    zb: Tensor,
    lambda_offdiag: float = 5e-3,
    eps: float = 1e-5,
    *,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """Barlow Twins loss of the global batch from all-reduced sufficient statistics.

    One differentiable all-reduce of ``D² + 4D + 1`` numbers, whatever the batch size: the exact global
    cross-correlation (not per-rank batch normalization).

    Example:
        >>> import torch
        >>> gen = torch.Generator().manual_seed(0)
        >>> za, zb = torch.randn(8, 3, generator=gen), torch.randn(8, 3, generator=gen)
        >>> torch.allclose(global_barlow_twins_loss(za, zb), barlow_twins_loss(za, zb))
        True
    """
    with checked_together(group, za):
        _check_options("sharded", grad_reduction)
        stats = barlow_twins_stats(za, zb)
    world = group_size(group)
    if world > 1:
        shapes = [s.shape for s in stats]
        flat = torch.cat([s.reshape(-1) for s in stats])
        flat = all_reduce(scale_grad(flat, world if grad_reduction == "mean" else 1), "sum", group, grad="local")
        stats = type(stats)(*(p.reshape(s) for p, s in zip(flat.split([s.numel() for s in shapes]), shapes)))
    return barlow_twins_from_stats(stats, lambda_offdiag, eps)


def _global_totals(loss_sum: Tensor, count: Tensor, group: Group, world: int) -> Tensor:
    """``[Σ_ranks loss_sum, Σ_ranks count]``, detached, in ``loss_sum``'s dtype: one all-reduce.

    For a call whose earlier collective already ran the metadata round (and with it the failure protocol of
    :func:`checked_together`). Always two float64 numbers on every rank, so no rank can send another shape or
    dtype, and under ``torch.compile`` it is a functional collective inside the graph: no graph break. Over two
    ranks the float64 sum rounded back equals the sum in ``loss_sum``'s dtype (one correctly rounded addition).
    """
    totals = torch.stack([loss_sum.detach().to(torch.float64), count.detach().to(torch.float64)])
    return sum_across_ranks(totals, group, world).to(loss_sum.dtype)


def _global_normalized(
    loss_sum: Tensor, count: Tensor, total: Tensor | float | None, group: Group, grad_reduction: str
) -> Tensor:
    """``Σ_ranks loss_sum / denominator`` where the denominator is ``total`` or ``Σ_ranks count``."""
    _check_options("sharded", grad_reduction)
    world = group_size(group)
    if world == 1:
        denominator = count if total is None else torch.as_tensor(total, dtype=loss_sum.dtype, device=loss_sum.device)
        return _safe_divide(loss_sum, denominator)
    # The checked all_reduce, not _global_totals: this is the call's first collective, whose metadata round is how
    # a rank that failed its input checks (checked_together) makes the others raise; one graph break when compiled.
    totals = all_reduce(torch.stack([loss_sum.detach(), count.detach().to(loss_sum.dtype)]), "sum", group, grad="none")
    denominator = totals[1] if total is None else torch.as_tensor(total, dtype=loss_sum.dtype, device=loss_sum.device)
    denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    share = loss_sum * (world if grad_reduction == "mean" else 1) / denominator
    return totals[0] / denominator + (share - share.detach())


def global_weighted_mean(
    values: Tensor,
    weight: Tensor | float | None = None,
    mask: Tensor | None = None,
    *,
    total: Tensor | float | None = None,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """``Σ w·v / Σ w`` over every rank's elements: a per-element loss normalized by the global weight.

    Args:
        values: per-element losses, any shape.
        weight: weights broadcastable to ``values`` (``None``: 1).
        mask: bool mask broadcastable to ``values``; masked elements are excluded (NaN there is harmless).
        total: the global denominator when it is known in advance (gradient accumulation: the weight of
            every micro-batch of the optimizer step on every rank); the value is then this call's global
            weighted sum over ``total``, and the values of the step's calls add up to the step's loss.
        group: the process group.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``.

    Example:
        >>> import torch
        >>> global_weighted_mean(torch.tensor([1.0, 2.0, 9.0]), mask=torch.tensor([True, True, False]))
        tensor(1.5000)
    """
    with checked_together(group, values):
        loss_sum, count = weighted_mean_block(values, weight, mask)
    return _global_normalized(loss_sum, count, total, group, grad_reduction)


def global_token_cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    *,
    total: Tensor | float | None = None,
    group: Group = None,
    grad_reduction: str = "mean",
) -> Tensor:
    """Token-level cross-entropy divided by the number of valid tokens of every rank (or by ``total``).

    Args:
        logits: (..., C), the class dimension last.
        target: (...) class indices; ``ignore_index`` marks padding.
        ignore_index: target value to skip.
        label_smoothing: as in :func:`torch.nn.functional.cross_entropy`.
        total: the global number of valid tokens of the whole optimizer step, when accumulating gradients.
        group: the process group.
        grad_reduction: ``"mean"`` (DDP) or ``"sum"``.

    Example:
        >>> import torch
        >>> logits = torch.zeros(1, 3, 4)
        >>> global_token_cross_entropy(logits, torch.tensor([[0, 1, -100]]))  # log(4)
        tensor(1.3863)
    """
    with checked_together(group, logits):
        loss_sum, count = token_cross_entropy_block(logits, target, ignore_index, label_smoothing)
    return _global_normalized(loss_sum, count, total, group, grad_reduction)
