"""The global-batch contrastive losses: each ``global_*`` function checks its inputs and runs its strategy's
implementation.

Every contrastive loss has a table from strategy to implementation (:func:`~.strategy.strategy_table`):
``"replicated"`` and ``"sharded"`` run its block form of ``functional._contrastive`` through
:func:`~.strategy.rows_loss`, ``"ring"`` its kernel of :mod:`.ring_losses`. Sharded CLIP has its own: it computes
each global logit once (:func:`clip_sum`: only the texts are gathered, the text-to-image statistics come from
every rank's partial column log-sum-exps). ``"auto"`` is resolved to one of them first
(:func:`~.strategy.resolve`), and :func:`~.strategy.run` calls the implementation with the pick in the call's
name. Barlow Twins (:mod:`.barlow_twins`) all-reduces its sufficient statistics, and the normalized losses
(:mod:`.normalized`) their sums and counts, whatever the strategy.

All views of a sample travel in one collective (packed side by side), so every rank issues the same
collectives in the same order in forward and backward.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from torchmetrics_diff._global.ring_losses import (
    ring_clip_loss,
    ring_info_nce_loss,
    ring_siglip_loss,
    ring_supcon_loss,
)
from torchmetrics_diff._global.strategy import (
    Options,
    check_options,
    checked_together,
    note_rows,
    resolve,
    row_start_of,
    rows_loss,
    run,
    same_width,
    sharded_value,
    strategy_table,
)
from torchmetrics_diff.distributed import all_gather_cat, gather_all_tensors
from torchmetrics_diff.distributed._backend import Group, all_gather_flat, all_reduce_, group_size
from torchmetrics_diff.distributed._call import call_name, exchange
from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._failure import RanksDisagreeError
from torchmetrics_diff.functional._checks import (
    Scalar,
    as_count,
    as_scale,
    check_float_tensor,
    check_labels,
    check_scalar,
    check_views,
)
from torchmetrics_diff.functional._contrastive import info_nce_block, siglip_block, supcon_block
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.functional._kernels import clip_block_sum

# ------------------------------------------------------------------------------------------- CLIP, one pass
#: the arguments and the value every global contrastive loss shares, and the embeddings of CLIP and SigLIP
_DOCS = {
    "options": """strategy: ``"auto"`` (default: picks one of the others from the global batch and the width, the same
    on every rank), ``"replicated"``, ``"sharded"`` or ``"ring"`` (:doc:`/guide/strategies`,
    :doc:`/guide/ring`).
group: the process group (default ``None``: the default group). Without an initialised process group,
    or with one rank, the loss of the local rows and no collective.
grad_reduction: how the trainer combines gradients across ranks: ``"mean"`` (default: DDP, FSDP) or
    ``"sum"``.
tile: with ``"ring"`` (chosen, or picked by ``"auto"``), candidate columns per logit tile, a positive int
    (default ``None``: 64); the other strategies ignore it.""",
    "returns": """Returns:
    The 0-d loss of every rank's rows, identical on every rank, differentiable with respect to the local
    inputs (and the tensor scalars): float64 for float64 inputs, else float32.""",
}
_EMBEDS = """image_embeds: this rank's image embeddings ``(B, D)``, floating, used as given (normalize them in the
    model).
text_embeds: this rank's text embeddings ``(B, D)``, of the shape, dtype and device of
    ``image_embeds``; row i pairs with image row i."""


def clip_sum(
    img: Tensor,
    txt_all: Tensor,
    scale: Tensor | float,
    row_start: int = 0,
    *,
    sharded: bool = False,
    group: Group = None,
) -> Tensor:
    """The symmetric CLIP loss summed over the rows ``[row_start, row_start + n)`` of the global batch, one pass.

    With ``L = scale · img_all @ txt_all.T`` (N, N), the rows' share is
    ``Σ_i (lse_j L_ij - L_ii) / 2 + Σ_j (lse_i L_ij - L_jj) / 2`` over this rank's image rows ``i`` and its own
    text columns ``j`` (the same indices). Only ``img @ txt_all.T`` (n, N) is computed; the text-to-image
    log-sum-exps of the own columns come from every rank's partial column statistics.

    Args:
        img: this rank's image embeddings (n, D), global rows ``[row_start, row_start + n)``.
        txt_all: every rank's text embeddings (N, D), in rank order (this rank's own rows included).
        scale: the logit scale, a number or a 0-d tensor (differentiable).
        row_start: global index of this rank's first row. Default ``0``.
        sharded: ``False``: ``img`` holds every row (``row_start = 0``, ``n = N``), no communication, the result
            is the full-batch sum with its exact gradient. ``True``: the other rows are on the other ranks of
            ``group``, which call this function alike. Default ``False``.
        group: the process group with ``sharded=True`` (``None``: the default group).

    Returns:
        A 0-d tensor in at least float32: this rank's share of the loss sum. Its backward is this rank's share of
        the gradient of the *global* sum (the column terms of other ranks' texts depend on this block too), so
        the ranks' gradients add up to the global one; this assumes every rank back-propagates the same
        gradient into its share, as any use of the global value does. With ``sharded=True`` call it on every
        rank of ``group`` in the same order (in forward it combines the ``N`` column statistics across the ranks:
        one all-gather of ``N`` numbers per rank at up to 4 ranks or a small ``W × N`` table, else two
        all-reduces of ``N`` numbers; the backward communicates nothing).

    The inputs are not validated (this is the kernel :func:`global_clip_loss` runs after its checks): mismatched
    shapes fail inside torch.

    Example:
        >>> import torch
        >>> clip_sum(torch.eye(2), torch.eye(2), 1.0) / 2  # the mean over 2 rows
        tensor(0.3133)
    """
    world = group_size(group) if sharded else 1
    if world > 1:  # the column statistics' collectives run eagerly: one graph break under torch.compile
        return _clip_across_ranks(img, txt_all, as_scale(scale, img), row_start, group, world)
    return clip_block_sum(img, txt_all, scale, row_start)


def _clip_here(img: Tensor, txt_all: Tensor, scale_t: Tensor, row_start: int, group: Group, world: int) -> Tensor:
    """This rank's share of the sharded CLIP sum, the column statistics combined across the ``world`` ranks."""
    combine = functools.partial(_column_lse_of_every_rank, group=group, world=world)
    return clip_block_sum(img, txt_all, scale_t, row_start, combine)


_clip_across_ranks = outside_graph(_clip_here)


def _column_lse_of_every_rank(part: Tensor, group: Group, world: int) -> Tensor:
    """The column log-sum-exps over every rank's rows from each rank's partial ones (``-inf``: a rank without rows).

    One all-gather of the ``W × M`` table, or two all-reduces of ``M`` numbers, as :func:`_columns_by_gather`
    decides (every rank decides alike: ``W``, ``M`` and the dtype are the same on every rank).
    """
    m = part.shape[0]
    if _columns_by_gather(world, m, part.element_size()):
        table = part.new_empty(world * m)
        all_gather_flat(table, part, group)
        return torch.logsumexp(table.view(world, m), dim=0)
    return _column_lse_by_reductions(part, group)


#: the column statistics travel in one all-gather while ``W`` is at most this ...
_GATHER_MAX_WORLD = 4
#: ... or while the gathered ``W × M`` table is at most this many bytes; else in two all-reduces of ``M`` numbers
_GATHER_MAX_BYTES = 64 * 1024


def _columns_by_gather(world: int, m: int, itemsize: int) -> bool:
    """Whether the ``M`` column statistics of ``world`` ranks travel in one all-gather (else in two all-reduces).

    Alpha-beta model: a collective costs a latency ``α`` plus ``β`` per byte a rank sends or receives. The
    all-gather is one collective (one ``α``), but every rank receives the whole ``W × M`` table, ``(W - 1) M``
    numbers it did not have, and reduces ``W M`` of them. The reductions (the columns' maxima over the ranks,
    then the sums of ``exp(partial - max)``) are two all-reduces of ``M`` numbers, two ``α``; a ring all-reduce
    sends and receives about ``2 (W - 1) / W · M`` numbers per rank, so the two about ``4 M`` whatever ``W``.

    - ``W ≤ 4`` (:data:`_GATHER_MAX_WORLD`): ``(W - 1) M ≤ 4 (W - 1) / W · M``, the gather moves no more bytes
      than the reductions and is one collective: the gather.
    - A table of at most 64 KiB (:data:`_GATHER_MAX_BYTES`): its extra bytes take a few microseconds at
      10 GB/s, less than the latency of the second collective: the gather.
    - Otherwise the reductions, whose bytes per rank do not grow with ``W`` (the gather's grow as ``W M``:
      16 MiB per rank and call at ``W = 1024`` with 4 float32 rows per rank).

    Args:
        world: the number of ranks ``W``.
        m: the number of columns ``M`` (the global batch's rows).
        itemsize: the bytes of one statistic.

    Example:
        >>> _columns_by_gather(8, 256, 4), _columns_by_gather(1024, 4096, 4), _columns_by_gather(2, 10**6, 8)
        (True, False, True)
    """
    return world <= _GATHER_MAX_WORLD or world * m * itemsize <= _GATHER_MAX_BYTES


def _column_lse_by_reductions(part: Tensor, group: Group) -> Tensor:
    """``log Σ_ranks exp(part)`` per column from two all-reduces of ``M`` numbers: the maxima, then the sums.

    A column that is ``-inf`` on every rank is shifted by 0 (its exponentials are 0): its log-sum-exp is ``-inf``,
    as ``torch.logsumexp`` gives, not NaN.
    """
    shift = part.clone()
    all_reduce_(shift, "max", group)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    sums = torch.sub(part, shift).exp_()
    all_reduce_(sums, "sum", group)
    return sums.log_().add_(shift)


# ---------------------------------------------------------------------------------- implementations, by strategy
def _clip_rows(img: Tensor, txt: Tensor, scale: Scalar, options: Options) -> Tensor:
    # replicated (or one process): every row at once, each logit once for both directions
    block = lambda loc, every, start: (clip_block_sum(every[0], every[1], scale), as_count(len(every[0]), every[0]))  # noqa: E731
    return rows_loss([img, txt], block, options)


def _clip_sharded(img: Tensor, txt: Tensor, scale: Scalar, options: Options) -> Tensor:
    world = group_size(options.group)
    if world == 1:
        return _clip_rows(img, txt, scale, options)
    dtype = torch.promote_types(img.dtype, txt.dtype)
    pieces = same_width(gather_all_tensors(txt.to(dtype), options.group, grad="sync"))
    note_rows(options, [p.shape[0] for p in pieces])
    row_start = row_start_of(pieces, options.group)
    loss_sum = clip_sum(img.to(dtype), torch.cat(pieces), scale, row_start, sharded=True, group=options.group)
    return sharded_value(loss_sum, as_count(img.shape[0], loss_sum), world, options.group, options.grad_reduction)


def _info_nce_rows(z1: Tensor, z2: Tensor, temperature: Scalar, options: Options) -> Tensor:
    return rows_loss(
        [z1, z2],
        lambda loc, every, start: info_nce_block(loc[0], loc[1], every[0], every[1], temperature, start),
        options,
    )


def _supcon_rows(features: Tensor, labels: Tensor | None, temperature: Scalar, options: Options) -> Tensor:
    labels_all = labels  # one process: the local labels (None: every sample its own class)
    if group_size(options.group) > 1:
        labels_all = _global_labels(features, labels, options.group)
    return rows_loss(
        [features], lambda loc, every, start: supcon_block(loc[0], every[0], labels_all, temperature, start), options
    )


@outside_graph  # the row counts of the peers and the labels-given check are host decisions: one graph break
def _global_labels(features: Tensor, labels: Tensor | None, group: Group) -> Tensor:
    """Every rank's labels, concatenated (``None`` on every rank: ``arange``, every sample its own class)."""
    # whether each rank passed labels, and its rows: host values in the call's header, read without the device
    mine = [int(labels is not None), features.shape[0]]
    peers = exchange("global_supcon_loss: labels", mine, group)
    given, rows = zip(*peers)  # (transposed in C: no Python code per rank)
    if len(set(given)) > 1:  # every rank holds the same values: every rank raises alike
        listing = ", ".join(f"rank {r}: {'given' if g else 'None'}" for r, g in enumerate(given))
        who = call_name("global_supcon_loss")
        raise RanksDisagreeError(f"{who}: `labels` must be given on every rank or on none ({listing})")
    if labels is not None:
        return all_gather_cat(labels.reshape(-1).to(torch.int64), group, grad="none")
    return torch.arange(sum(rows), device=features.device)


def _siglip_rows(img: Tensor, txt: Tensor, scale: Scalar, bias: Scalar, options: Options) -> Tensor:
    # image rows score against every text; the images themselves are not needed globally
    block = lambda loc, every, start: siglip_block(loc[0], every[1], scale, bias, start)  # noqa: E731
    return rows_loss([img, txt], block, options, candidates=[1])


_CLIP = strategy_table(rows=_clip_rows, sharded=_clip_sharded, ring=ring_clip_loss)
_INFO_NCE = strategy_table(rows=_info_nce_rows, ring=ring_info_nce_loss)
_SUPCON = strategy_table(rows=_supcon_rows, ring=ring_supcon_loss)
_SIGLIP = strategy_table(rows=_siglip_rows, ring=ring_siglip_loss)


def _batch(embeddings: Tensor) -> tuple[int, int, int]:
    """``(rows, width, bytes per element)`` of a rank's embeddings, what ``"auto"`` decides from."""
    return embeddings.shape[0], embeddings.shape[-1], embeddings.element_size()


# ------------------------------------------------------------------------------------------ contrastive losses
@shared_docs(**_DOCS, embeds=_EMBEDS)
def global_clip_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Scalar,
    *,
    strategy: str = "auto",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Symmetric CLIP loss of the global batch (every rank's rows), from this rank's rows.

    ``"sharded"`` computes each global logit once: this rank's row block ``scale · img_local @ txt_all.T``
    (only the text embeddings are gathered), the image-to-text log-sum-exps of its rows locally, the
    text-to-image log-sum-exps of its own texts from every rank's partial column statistics (one all-gather of
    N numbers per rank; beyond 4 ranks, once the W × N table outgrows 64 KiB, two all-reduces of N numbers
    instead), and both directions' gradients from the one block (:func:`clip_sum`). ``"replicated"``
    computes the whole (N, N) block on every rank, by the same one-pass kernel.

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included).

    Args:
        {embeds}
        logit_scale: the multiplier of the similarities (e.g. ``model.logit_scale.exp()``): a number, or a
            floating tensor of one element (0-d or shape ``(1,)``), which gets its gradient.
        {options}

    {returns}

    Raises:
        ValueError: embeddings that are not floating ``(B, D)`` tensors of one shape, a bad
            ``logit_scale``, an unknown ``strategy`` or ``grad_reduction``, or (``"ring"``, ``"auto"``) a bad ``tile``;
            under a process group, on every rank.

    Example:
        >>> import torch
        >>> global_clip_loss(torch.eye(2), torch.eye(2), 1.0)
        tensor(0.3133)
    """
    with checked_together(group, image_embeds):
        check_views("image_embeds", image_embeds, "text_embeds", text_embeds)
        scale = check_scalar("logit_scale", logit_scale)
        options = check_options(strategy, group, grad_reduction, tile)
    options = resolve(options, *_batch(image_embeds), key="global_clip_loss", family="clip")
    return run(_CLIP, options, image_embeds, text_embeds, scale)


@shared_docs(**_DOCS)
def global_info_nce_loss(
    z1: Tensor,
    z2: Tensor,
    temperature: Scalar = 0.1,
    *,
    strategy: str = "auto",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """NT-Xent (SimCLR) loss of the global batch: 2N anchors, each against all other 2N - 1 embeddings.

    The anchors of ``z1`` have their positive in ``z2`` and the reverse; similarities are cosine similarities
    divided by ``temperature``. It issues collectives: every rank of ``group`` must call it, with its own rows
    (counts may differ between ranks, zero included).

    Args:
        z1: this rank's embeddings of the first view ``(B, D)``, floating (L2-normalized inside).
        z2: the second view ``(B, D)``, of the shape, dtype and device of ``z1``; row i is the same sample.
        temperature: the divisor of the similarities, positive: a number or a one-element floating tensor
            (default 0.1).
        {options}

    {returns}

    Raises:
        ValueError: views that are not floating ``(B, D)`` tensors of one shape, a non-positive
            ``temperature``, an unknown ``strategy`` or ``grad_reduction``, or (``"ring"``, ``"auto"``) a bad ``tile``;
            under a process group, on every rank.

    Example:
        >>> import torch
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> global_info_nce_loss(z, z, temperature=0.5)
        tensor(0.2395)
    """
    with checked_together(group, z1):
        check_views("z1", z1, "z2", z2)
        temperature = check_scalar("temperature", temperature, positive=True)
        options = check_options(strategy, group, grad_reduction, tile)
    options = resolve(options, *_batch(z1), views=2, key="global_info_nce_loss", family="info_nce")
    return run(_INFO_NCE, options, z1, z2, temperature)


@shared_docs(**_DOCS)
def global_supcon_loss(
    features: Tensor,
    labels: Tensor | None = None,
    temperature: Scalar = 0.1,
    *,
    strategy: str = "auto",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Supervised contrastive loss of the global batch; labels are gathered too (without gradient).

    It issues collectives: every rank of ``group`` must call it, with its own rows (counts may differ between
    ranks, zero included).

    Args:
        features: this rank's features, floating, ``(B, D)`` or ``(B, V, D)`` with ``V`` views per sample
            (L2-normalized inside).
        labels: this rank's integer labels ``(B,)``; ``None`` (default): every sample its own class (the
            views of a sample are its positives). ``None`` on every rank or on none.
        temperature: the divisor of the cosine similarities, positive: a number or a one-element floating
            tensor (default 0.1).
        {options}

    {returns}

    Raises:
        ValueError: ``features`` that is not a floating ``(B, D)`` or ``(B, V, D)`` tensor, ``labels``
            that are not integers of shape ``(B,)``, a non-positive ``temperature``, an unknown ``strategy`` or
            ``grad_reduction``, or (``"ring"``, ``"auto"``) a bad ``tile``; under a process group, on every rank.
        RuntimeError: ``labels`` given on some ranks and ``None`` on others (raised on every rank).

    Example:
        >>> import torch
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> global_supcon_loss(feats, torch.tensor([0, 0, 1]), temperature=1.0)
        tensor(0.4846)
    """
    with checked_together(group, features):
        check_float_tensor("features", features, (2, 3), "(B, D) or (B, V, D)")
        temperature = check_scalar("temperature", temperature, positive=True)
        if labels is not None:
            check_labels("labels", labels, features.shape[0])
        options = check_options(strategy, group, grad_reduction, tile)
    views = features.shape[1] if features.ndim == 3 else 1
    options = resolve(options, *_batch(features), views=views, key="global_supcon_loss", family="supcon")
    return run(_SUPCON, options, features, labels, temperature)


@shared_docs(**_DOCS, embeds=_EMBEDS)
def global_siglip_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Scalar,
    logit_bias: Scalar,
    *,
    strategy: str = "auto",
    group: Group = None,
    grad_reduction: str = "mean",
    tile: int | None = None,
) -> Tensor:
    """Pairwise sigmoid (SigLIP) loss of the global batch, normalized by the global row count.

    Every image-text pair of the global batch is a binary classification (positive on the diagonal) of the
    logit ``logit_scale · ⟨img, txt⟩ + logit_bias``; the summed log-sigmoid losses are divided by the global
    number of rows. It issues collectives: every rank of ``group`` must call it, with its own rows (counts may
    differ between ranks, zero included).

    Args:
        {embeds}
        logit_scale: the multiplier of the similarities (e.g. ``model.logit_scale.exp()``): a number or a
            one-element floating tensor, which gets its gradient.
        logit_bias: the bias added to every logit: a number or a one-element floating tensor.
        {options}

    {returns}

    Raises:
        ValueError: embeddings that are not floating ``(B, D)`` tensors of one shape, a bad
            ``logit_scale`` or ``logit_bias``, an unknown ``strategy`` or ``grad_reduction``, or (``"ring"``,
            ``"auto"``) a bad ``tile``; under a process group, on every rank.

    Example:
        >>> import torch
        >>> global_siglip_loss(torch.eye(2), torch.eye(2), 10.0, -5.0)
        tensor(0.0134)
    """
    with checked_together(group, image_embeds):
        check_views("image_embeds", image_embeds, "text_embeds", text_embeds)
        scale = check_scalar("logit_scale", logit_scale)
        bias = check_scalar("logit_bias", logit_bias)
        options = check_options(strategy, group, grad_reduction, tile)
    options = resolve(options, *_batch(image_embeds), key="global_siglip_loss", family="siglip")
    return run(_SIGLIP, options, image_embeds, text_embeds, scale, bias)
