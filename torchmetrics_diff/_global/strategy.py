"""How a loss runs on the global batch: the strategies, their options, and the parts every strategy shares.

Each ``global_*`` loss takes the *local* rows and returns, on every rank, the loss of the concatenated global
batch. Its gradient, after a trainer averages gradients over the ``W`` ranks (``grad_reduction="mean"``: DDP,
FSDP, DeepSpeed) or sums them (``"sum"``), equals that of one process on the global batch
(:ref:`architecture-gradient-contract`). Three strategies (:ref:`architecture-strategies`):

- ``"replicated"``: gather every rank's rows (``grad="local"``), every rank computes the whole (N, N) loss;
  the local slot's gradient is scaled by ``W`` under averaging. No communication in backward.
- ``"sharded"``: gather the candidates with ``grad="sync"``, each rank scores only its own rows against all
  of them (B × N instead of N × N), normalized by the global count; one scalar all-reduce gives the value.
  The backward reduce-scatters the candidates' gradients to their owners: ``W`` times less compute and
  memory per rank for the loss.
- ``"ring"``: the candidate blocks travel around the ranks and the logits exist one tile at a time
  (:mod:`.ring_losses`): per-rank memory independent of the number of ranks.

``"auto"`` (the default) picks one of the three per call from the global batch and the width
(:func:`auto_strategy`, :func:`resolve`), identically on every rank.

This module holds what they share: the table of strategies, the checks of the options
(:func:`check_options`, used by the functions and by the loss classes), ``"auto"``'s choice,
:func:`checked_together` (a bad input on one rank raises on every rank), the packing of several views into one
collective, the replicated and sharded runs of a row-decomposable loss (:func:`global_rows_loss`) and the global
value whose gradient is this rank's share (:func:`sharded_value`, :func:`global_normalized`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, NamedTuple, cast

import torch
from torch import Tensor

from torchmetrics_diff.distributed import all_reduce, gather_all_tensors, get_checks
from torchmetrics_diff.distributed._autograd import scale_grad
from torchmetrics_diff.distributed._backend import Group, group_rank, group_size
from torchmetrics_diff.distributed._call import entry_name, exchange, group_state, leave, within_entry
from torchmetrics_diff.distributed._collectives import fail_together
from torchmetrics_diff.distributed._compile import compiling, outside_graph, sum_across_ranks
from torchmetrics_diff.distributed._failure import RanksDisagreeError
from torchmetrics_diff.functional._checks import check_choice, safe_divide

#: the accepted values of ``strategy``: ``"auto"`` (the default) picks one of the others per call
STRATEGIES = ("auto", "replicated", "sharded", "ring")
FIXED_STRATEGIES = STRATEGIES[1:]
GRAD_REDUCTIONS = ("mean", "sum")

#: candidate columns per logit tile of the ring strategy: small, so that the tiles (two per step in backward)
#: stay below the ring's fixed B x D buffers (the measured trade-off is in docs/guide/ring.rst)
DEFAULT_TILE = 64

# block(local_views, all_views, row_start) -> (loss_sum, count) of the anchors in the local rows
Block = Callable[[Sequence[Tensor], Sequence[Tensor], int], "tuple[Tensor, Tensor]"]


# --------------------------------------------------------------------------------------------------- options
class Options(NamedTuple):
    """The checked options of one global loss call (see :func:`check_options`)."""

    strategy: str  # ``"auto"`` until :func:`resolve` picks one of FIXED_STRATEGIES
    group: Group
    grad_reduction: str
    tile: int  # candidate columns per logit tile; used by ``"ring"`` only
    auto: AutoChoice | None = None  # with ``"auto"``: what it remembers between calls (see :class:`AutoChoice`)


def check_strategy(strategy: object) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`, else a ``ValueError`` naming it.

    An :class:`AutoChoice` (a loss's memory of its ``"auto"`` choices, passed by the loss classes) is ``"auto"``.
    """
    if isinstance(strategy, AutoChoice):
        return "auto"
    return check_choice("strategy", strategy, STRATEGIES)


def check_grad_reduction(grad_reduction: object) -> str:
    """``grad_reduction`` if it is one of :data:`GRAD_REDUCTIONS`, else a ``ValueError`` naming it."""
    return check_choice("grad_reduction", grad_reduction, GRAD_REDUCTIONS)


def check_tile(tile: object) -> int:
    """``tile`` as an ``int`` ≥ 1, or a ``ValueError`` naming it (``None``: :data:`DEFAULT_TILE`).

    Example:
        >>> check_tile(None), check_tile(8)
        (64, 8)
    """
    if tile is None:
        return DEFAULT_TILE
    try:
        value = operator.index(tile)  # type: ignore[arg-type]
    except TypeError:
        value = None
    if value is None or isinstance(tile, bool) or value < 1:
        raise ValueError(f"`tile` must be a positive integer (candidate columns per logit tile); got {tile!r}")
    return value


def check_options(strategy: object, group: Group, grad_reduction: object, tile: object) -> Options:
    """The options of a global loss call, checked; ``tile`` is read (and checked) by ``"ring"`` and ``"auto"``.

    Example:
        >>> check_options("ring", None, "mean", None)
        Options(strategy='ring', group=None, grad_reduction='mean', tile=64, auto=None)
    """
    memory = strategy if isinstance(strategy, AutoChoice) else None
    name = check_strategy(strategy)
    grad_reduction = check_grad_reduction(grad_reduction)
    checked_tile = check_tile(tile) if name in ("ring", "auto") else DEFAULT_TILE
    return Options(name, group, grad_reduction, checked_tile, memory)


def strategy_table(
    rows: Callable[..., Tensor], ring: Callable[..., Tensor], sharded: Callable[..., Tensor] | None = None
) -> dict[str, Callable[..., Tensor]]:
    """strategy -> implementation of one loss, each called as ``impl(*checked_inputs, options)``.

    ``rows`` serves both gathering strategies (it runs :func:`rows_loss`) unless ``sharded`` has its own; the ring
    kernel runs eagerly behind one graph break under ``torch.compile`` (its schedule is host-side).
    """
    return {"replicated": rows, "sharded": rows if sharded is None else sharded, "ring": outside_graph(ring)}


# ------------------------------------------------------------------------------------------------------ auto
#: ``"auto"``'s crossover from ``"replicated"`` to ``"sharded"``, fitted to the grid of ``benchmarks/bench_auto.py``
#: (W = 2 and 3 gloo ranks on a 2-core CPU; CLIP, SigLIP and SupCon; 96 to 512 rows per rank, widths 64 to 512; the
#: grid is in docs/guide/strategies.rst). Sharding takes ``(N - B_max) · N`` logits off the slowest rank (N
#: candidates, B_max the largest rank's anchors), each worth ``D + AUTO_LOGIT_COST`` multiply-adds (the similarity,
#: then the elementwise passes: exp, log-sum-exp, the gradient), and costs more collectives (one more in forward,
#: the reduce-scatter in backward), whose time grows with the peers waited for: it pays once the work it saves
#: reaches :func:`sharded_cost` multiply-adds, ``AUTO_SHARDED_MIN_WORK · (W - 1)`` in the fitted range. The three
#: families cross over at the same work (within the grid's noise), so the constants are shared.
AUTO_LOGIT_COST = 64
AUTO_SHARDED_MIN_WORK = 40_000_000
#: Beyond the three ranks of the fit, each further rank adds one hop to the sharded strategy's ring collectives
#: (gloo's all-reduce and all-gather take ``W - 1`` hops), worth this many multiply-adds: about 20 us of a TCP hop
#: (docs/guide/scaling.rst's 10-30 us) at the 25 multiply-adds per ns measured here, 1/80 of a fitted peer (whose
#: cost at W <= 3 is mostly the collectives' fixed overhead). Without it the fitted per-peer cost, extrapolated,
#: kept ``"replicated"`` (``N x N`` logits on every rank) up to 4096 rows at W = 1024.
AUTO_HOP_WORK = 500_000
#: ``"auto"`` picks ``"ring"`` for its speed where it would run the one logit block of ``"sharded"`` (or, with one
#: rank, the plain loss) and ``D + AUTO_RING_ROW_COST / B_max <= AUTO_RING_SAVING[family]``: the ring pays, per
#: logit, one more matrix product (its backward recomputes the logits: ``D`` multiply-adds) and overheads spread
#: over the ``B_max`` anchor rows of a tile (``AUTO_RING_ROW_COST / B_max``), and saves what the one-block strategy
#: spends on passes over a ``B_max × N`` block that is far out of cache, where the ring's ``B_max × tile`` tiles
#: stay in it. Fitted to ``benchmarks/bench_auto.py`` (W = 1 and 2, default tile, 1024 to 8192 rows per rank,
#: widths 32 to 512): CLIP and SigLIP cross over alike (the ring is faster up to width 52 at 2048 rows per rank, 96
#: at 4096 and 118 at 8192, never at 1024 or below); SupCon's ring took 1.3-1.7x its sharded step everywhere, and
#: InfoNCE runs SupCon's kernels: neither is listed, so the ring is theirs only for memory, as for a loss of unknown
#: family (``None``).
AUTO_RING_ROW_COST = 180_000
AUTO_RING_SAVING = {"clip": 140, "siglip": 140}
#: ``"auto"`` picks ``"ring"`` when the picked strategy's logits and their gradient (8 bytes per logit at float32 and
#: below, 16 at float64) would take more than this many bytes on the slowest rank: ``N × N`` replicated,
#: ``B_max × N`` sharded. Read at every choice: a program may set it (on every rank alike) before its calls.
AUTO_MEMORY_BYTES = 1 << 30


def sharded_cost(world: int) -> int:
    """What the sharded strategy's extra collectives cost at ``world`` ranks, in multiply-adds of saved work:
    :data:`AUTO_SHARDED_MIN_WORK` per peer up to three ranks (the fitted range), then :data:`AUTO_HOP_WORK` per
    further rank.

    Example:
        >>> sharded_cost(2), sharded_cost(3), sharded_cost(1024)
        (40000000, 80000000, 590500000)
    """
    return AUTO_SHARDED_MIN_WORK * (min(world, 3) - 1) + AUTO_HOP_WORK * max(world - 3, 0)


def ring_is_faster(largest: int, width: int, family: str | None) -> bool:
    """Whether the ring's tiles beat one ``largest × N`` logit block of ``family`` at ``width`` (the rule of
    :data:`AUTO_RING_SAVING`; ``largest``: the anchors of the largest rank).

    Example:
        >>> ring_is_faster(4096, 64, "clip"), ring_is_faster(4096, 128, "clip"), ring_is_faster(1024, 64, "clip")
        (True, False, False)
        >>> ring_is_faster(8192, 64, "supcon"), ring_is_faster(8192, 64, None)
        (False, False)
    """
    saving = AUTO_RING_SAVING.get(family) if family is not None else None
    return saving is not None and largest > 0 and width + AUTO_RING_ROW_COST / largest <= saving


def auto_strategy(
    total: int, largest: int, width: int, world: int, itemsize: int = 4, views: int = 1, family: str | None = None
) -> str:
    """The strategy ``"auto"`` picks for a global batch (the rule of :doc:`/guide/strategies`).

    ``"sharded"`` when the work it takes off the slowest rank reaches :data:`AUTO_SHARDED_MIN_WORK` per peer (or
    when the replicated ``N × N`` logits would not fit :data:`AUTO_MEMORY_BYTES`), else ``"replicated"``; then
    ``"ring"`` instead of the one logit block of ``"sharded"`` where its tiles are faster for ``family``
    (:func:`ring_is_faster`) or the block would not fit either. With one rank ``"replicated"`` (all three compute
    the plain loss, one block) unless the ring is faster or the ``N × N`` logits would not fit.

    Args:
        total: rows of every rank (samples), ``N / views``.
        largest: rows of the largest rank.
        width: the embedding width ``D``.
        world: the number of ranks ``W``.
        itemsize: bytes per element of the embeddings.
        views: anchors per sample (InfoNCE: 2; SupCon: its views).
        family: the loss: ``"clip"``, ``"siglip"``, ``"supcon"`` or ``"info_nce"``, as its ``global_*`` function
            passes it; ``None`` (the default): unknown, the ring only for memory.

    Example:
        >>> auto_strategy(64, 32, 512, 2), auto_strategy(2048, 1024, 512, 2), auto_strategy(2**16, 2**15, 64, 2)
        ('replicated', 'sharded', 'ring')
        >>> auto_strategy(8192, 4096, 64, 2, family="clip"), auto_strategy(8192, 4096, 64, 2, family="supcon")
        ('ring', 'sharded')
    """
    n, b = views * total, views * largest  # candidates, and the anchors of the largest rank
    per_logit = 2 * max(itemsize, 4)  # a logit and its gradient, in the accumulation dtype (float32 at least)
    saved = (n - b) * n * (width + AUTO_LOGIT_COST)
    pick = "sharded" if world > 1 and saved >= sharded_cost(world) else "replicated"
    if pick == "replicated" and n * n * per_logit > AUTO_MEMORY_BYTES:
        pick = "sharded" if world > 1 else "ring"
    if (pick == "sharded" or world == 1) and ring_is_faster(b, width, family):
        pick = "ring"
    if pick == "sharded" and b * n * per_logit > AUTO_MEMORY_BYTES:
        pick = "ring"
    return pick


class AutoChoice:
    """What ``strategy="auto"`` knows of the global batch: the same on every rank, by construction.

    The global rows (``total``, ``largest``), the width and the element size of the last call, as its collectives
    showed them to every rank (the first call exchanges them in the call's header, once); and the strategy picked
    (``last``). A call decides from the previous call's global batch, so the choice costs no collective in the
    steady state; a batch that changes size changes the choice from the next call on. A loss class holds one
    (``last_strategy``); a ``global_*`` function called with ``"auto"`` keeps one per function and process group.
    Under ``torch.compile`` it keeps the first call's global batch (a changing choice would recompile).

    A plain object with plain attributes: ``torch.compile`` reads them as constants.
    """

    def __init__(self) -> None:
        self.total = -1  # rows of every rank; -1 before the first call
        self.largest = 0
        self.width = 0
        self.itemsize = 0
        self.last: str | None = None  # the strategy picked for the last call
        self.call = (0, 0)  # this call's width and element size, noted with its rows once the ranks agreed on them

    def note(self, rows: Sequence[int]) -> None:
        """The rows of every rank at this call (after its checks passed on every rank), for the next call."""
        if not compiling():
            self.total, self.largest = sum(rows), max(rows, default=0)
            self.width, self.itemsize = self.call


def note_rows(options: Options, rows: Sequence[int], views: int = 1) -> None:
    """With ``"auto"``, note every rank's rows (``views`` candidate rows per sample) for the next call's choice."""
    if options.auto is not None:
        options.auto.note([r // views for r in rows])


def resolve(
    options: Options, rows: int, width: int, itemsize: int, views: int = 1, key: str = "", family: str | None = None
) -> Options:
    """``options`` with ``"auto"`` replaced by its pick for this call (explicit strategies unchanged).

    The pick follows from values every rank agrees on (:class:`AutoChoice`): the previous call's global batch, or
    at the first call every rank's ``(rows, width, itemsize)`` from one header exchange (with the checks
    ``"off"``, :func:`~torchmetrics_diff.distributed.set_checks`, which exchange no headers: ``"sharded"`` at the
    first call). Call it after the call's input checks (:func:`checked_together`), before its first collective.

    Args:
        options: the checked options; ``options.auto`` is the loss's memory, ``None`` for a function's call.
        rows: this rank's samples; ``width``, ``itemsize``: its embeddings' width and bytes per element.
        views: anchors per sample (see :func:`auto_strategy`).
        key: the function's name: a function's calls remember their batch per name and process group.
        family: the loss (see :func:`auto_strategy`); ``None``: unknown, the ring only for memory.
    """
    if options.strategy != "auto":
        return options
    world = group_size(options.group)
    memory = options.auto
    if world == 1:
        pick = auto_strategy(rows, rows, width, 1, itemsize, views, family)
    else:
        if memory is None:
            memory = group_state(options.group).auto.setdefault(key, AutoChoice())
        if memory.total < 0 and get_checks(options.group) == "off":
            # no header exchange to carry the rows (and a fixed-metadata mode): a fixed first pick, then the batch
            # its gather shows to every rank
            pick = "sharded"
        else:
            if memory.total < 0:
                _agree(memory, [rows, width, itemsize], options.group)
            pick = auto_strategy(memory.total, memory.largest, memory.width, world, memory.itemsize, views, family)
    if memory is not None:
        memory.last, memory.call = pick, (width, itemsize)
    return options._replace(strategy=pick, auto=memory)


@outside_graph  # host values of every rank: one graph break, at the first call only
def _agree(memory: AutoChoice, mine: list[int], group: Group) -> None:
    """The first call's global batch, from every rank's ``[rows, width, itemsize]`` (one header exchange)."""
    rows, widths, sizes = zip(*exchange("auto strategy", mine, group))
    memory.total, memory.largest, memory.width, memory.itemsize = sum(rows), max(rows), max(widths), max(sizes)


def run(table: dict[str, Callable[..., Tensor]], options: Options, *inputs: Any) -> Tensor:
    """``table[strategy](*inputs, options)``, with the strategy in the name of the call's collectives.

    Inside a loss's call (``"CLIPLoss.forward"``) the header every rank exchanges names the strategy too
    (``"CLIPLoss.forward: sharded: gather_all_tensors"``), so ranks that picked different strategies raise the
    error of ranks in different calls on every rank, naming them, before any data moves.
    """
    token = within_entry(options.strategy)
    if token is None:  # outside an entry point, or compiled (which names none)
        return table[options.strategy](*inputs, options)
    try:
        return table[options.strategy](*inputs, options)
    finally:
        leave(token)


@contextmanager
def checked_together(group: Group, like: object = None) -> Iterator[None]:
    """Validate inputs so that a bad input on one rank raises on every rank instead of hanging the others.

    The block must run just before the call's first collective: a rank whose checks raise takes part in that
    collective's metadata exchange with a failure marker (see :func:`fail_together`), on the device of ``like``
    (the input the peers communicate from; the backend's default device when it is not a tensor).
    """
    try:
        yield
    except Exception as err:
        if group_size(group) == 1:
            raise
        fail_together(err, group, device=like.device if isinstance(like, Tensor) else None)


# ------------------------------------------------------------------------------------------- views, packed
def pack(views: Sequence[Tensor]) -> tuple[Tensor, list[tuple[int, ...]]]:
    """Rows of every view side by side, (n, Σ width), so one collective moves them all; and their shapes."""
    dtype = views[0].dtype
    for v in views[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    flat = [v.to(dtype).reshape(v.shape[0], int(torch.Size(v.shape[1:]).numel())) for v in views]
    return torch.cat(flat, dim=1), [tuple(v.shape[1:]) for v in views]


def unpack(packed: Tensor, trailing: list[tuple[int, ...]]) -> list[Tensor]:
    """The views of :func:`pack`'s rows (any number of rows), given their trailing shapes."""
    widths = [int(torch.Size(t).numel()) for t in trailing]
    return [p.reshape(packed.shape[0], *t) for p, t in zip(packed.split(widths, dim=1), trailing)]


def same_width(pieces: list[Tensor]) -> list[Tensor]:
    """Every rank's rows must have the same trailing shape (the same embedding width); raise on every rank."""
    widths = [tuple(p.shape[1:]) for p in pieces]
    if any(w != widths[0] for w in widths):
        listing = ", ".join(f"rank {r}: {w}" for r, w in enumerate(widths))
        who = entry_name() or "global loss"  # the loss's call (``"CLIPLoss.forward"``) when a loss runs it
        raise RanksDisagreeError(
            f"{who}: ranks disagree on the width of their embeddings, packed side by side ({listing})"
        )
    return pieces


def row_start_of(pieces: list[Tensor], group: Group) -> int:
    """The global index of this rank's first row, from every rank's gathered rows."""
    return sum(p.shape[0] for p in pieces[: group_rank(group)])


# ------------------------------------------------------------------------------------- row-decomposable losses
def global_rows_loss(
    views: Sequence[Tensor],
    block: Block,
    *,
    strategy: str = "auto",
    group: Group = None,
    grad_reduction: str = "mean",
    candidates: Sequence[int] | None = None,
) -> Tensor:
    """The global-batch mean loss of a row-decomposable loss, given each rank's rows.

    The building block of every contrastive loss here; use it for your own.

    Args:
        views: this rank's tensors ``(n, ...)`` with the same number of rows ``n`` (the local samples), e.g.
            ``(img, txt)``; ``n`` may differ between ranks, zero included. They travel in one collective.
        block: ``block(local_views, all_views, row_start) -> (loss_sum, count)``: the loss summed over the
            anchors of rows ``[row_start, row_start + n)`` against all ``N`` global rows, and their count, two
            0-d tensors; ``local_views`` are this rank's tensors (with their graph), ``all_views`` every rank's
            rows ``(N, ...)`` in rank order.
        strategy: ``"auto"`` (default: ``"replicated"`` or ``"sharded"``, picked from the global batch and the
            width of the views, the same on every rank), ``"sharded"`` or ``"replicated"`` (see
            :doc:`/guide/strategies`); ``"ring"`` needs a ring kernel and is refused here.
        group: the process group (default ``None``: the default group).
        grad_reduction: ``"mean"`` (default) when the trainer averages gradients over ranks (DDP), ``"sum"``
            otherwise.
        candidates: with ``"sharded"``, the indices of the views whose global rows ``block`` reads (the others
            are not gathered and arrive as ``None``); default ``None``: all.

    Returns:
        The 0-d global loss ``Σ loss_sum / Σ count`` (``0`` when the global count is 0), identical on every
        rank, in the dtype of ``block``'s sums.

    Raises:
        ValueError: an unknown ``strategy`` or ``grad_reduction``, or ``"ring"``; under a process group, on
            every rank.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.functional import clip_block
        >>> img, txt = torch.eye(3), torch.eye(3)
        >>> block = lambda local, every, start: clip_block(*local, *every, 1.0, start)
        >>> global_rows_loss([img, txt], block)  # one process: the plain loss
        tensor(0.5514)
    """
    with checked_together(group, views[0] if len(views) else None):
        options = check_options(strategy, group, grad_reduction, None)
        if strategy == "ring":
            raise ValueError("`strategy` 'ring' needs a ring kernel (CLIP, InfoNCE, SupCon, SigLIP); not for a block")
    if options.strategy == "auto":
        like = views[0]
        width = sum(int(torch.Size(v.shape[1:]).numel()) for v in views)
        options = resolve(options, like.shape[0], width, like.element_size(), key="global_rows_loss")
        if options.strategy == "ring":  # (over the memory budget: the smaller of the two)
            options = options._replace(strategy="sharded")
            if options.auto is not None:
                options.auto.last = "sharded"
    return run(_ROWS_BY_STRATEGY, options, views, block, candidates)


def rows_loss(
    views: Sequence[Tensor], block: Block, options: Options, candidates: Sequence[int] | None = None
) -> Tensor:
    """:func:`global_rows_loss` with checked options (``"replicated"`` or ``"sharded"``)."""
    world = group_size(options.group)
    if world == 1:
        return safe_divide(*block(views, views, 0))
    return _ROWS[options.strategy](views, block, options, world, candidates)


def _replicated_rows(
    views: Sequence[Tensor], block: Block, options: Options, world: int, candidates: Sequence[int] | None
) -> Tensor:
    packed, trailing = pack(views)
    # Every rank computes the whole loss, so a parameter used in it directly (a logit scale) already has its
    # full gradient on every rank, and the local slot has 1/W of its share after averaging. Scale the slot by W,
    # and under summed gradients scale the whole loss's gradient by 1/W.
    pieces = same_width(gather_all_tensors(scale_grad(packed, world), options.group, grad="local"))
    note_rows(options, [p.shape[0] for p in pieces])
    every = torch.cat(pieces)
    all_views = unpack(every, trailing)
    loss = safe_divide(*block(all_views, all_views, 0))
    return loss if options.grad_reduction == "mean" else scale_grad(loss, 1 / world)


def _sharded_rows(
    views: Sequence[Tensor], block: Block, options: Options, world: int, candidates: Sequence[int] | None
) -> Tensor:
    needed = range(len(views)) if candidates is None else candidates
    packed, trailing = pack([views[i] for i in needed])
    pieces = same_width(gather_all_tensors(packed, options.group, grad="sync"))
    note_rows(options, [p.shape[0] for p in pieces])
    all_views: list[Tensor | None] = [None] * len(views)
    for i, gathered in zip(needed, unpack(torch.cat(pieces), trailing)):
        all_views[i] = gathered
    # (the block reads only the entries of the candidates, all of them filled)
    loss_sum, count = block(views, cast("list[Tensor]", all_views), row_start_of(pieces, options.group))
    return sharded_value(loss_sum, count, world, options.group, options.grad_reduction)


_ROWS = {"replicated": _replicated_rows, "sharded": _sharded_rows}


def _rows_last(views: Sequence[Tensor], block: Block, candidates: Sequence[int] | None, options: Options) -> Tensor:
    return rows_loss(views, block, options, candidates)  # (the options last, as :func:`run` passes them)


_ROWS_BY_STRATEGY = dict.fromkeys(_ROWS, _rows_last)


# -------------------------------------------------------------------------------------------- global values
def grad_factor(world: int, grad_reduction: str) -> int:
    """What a rank's own share of the gradient is multiplied by so that the trainer's reduction gives the sum."""
    return world if grad_reduction == "mean" else 1


def _value_with_own_gradient(
    global_sum: Tensor, denominator: Tensor, loss_sum: Tensor, world: int, grad_reduction: str
) -> Tensor:
    """The value ``global_sum / denominator`` whose gradient is that of this rank's ``loss_sum / denominator``
    (times ``W`` under averaging): the other ranks' terms are constants here and reach their inputs there."""
    share = loss_sum * grad_factor(world, grad_reduction) / denominator
    return global_sum / denominator + (share - share.detach())


def sharded_value(loss_sum: Tensor, count: Tensor, world: int, group: Group, grad_reduction: str) -> Tensor:
    """The global value ``Σ loss_sum / Σ count`` whose gradient is this rank's ``loss_sum`` gradient, scaled.

    One process (``world == 1``): ``loss_sum / count``. Otherwise a collective earlier in the call validated
    dtypes across ranks (and ran the failure protocol of :func:`checked_together`), so the value's sums need no
    metadata round of their own (a functional-collective all-reduce under ``torch.compile``; see
    :func:`_global_totals`).
    """
    if world == 1:
        return safe_divide(loss_sum, count)
    totals = _global_totals(loss_sum, count, group, world)
    return _value_with_own_gradient(totals[0], totals[1].clamp_min(1), loss_sum, world, grad_reduction)


def _global_totals(loss_sum: Tensor, count: Tensor, group: Group, world: int) -> Tensor:
    """``[Σ_ranks loss_sum, Σ_ranks count]``, detached, in ``loss_sum``'s dtype: one all-reduce.

    For a call whose earlier collective already ran the metadata round (and with it the failure protocol of
    :func:`checked_together`). Always two float64 numbers on every rank, so no rank can send another shape or
    dtype, and under ``torch.compile`` it is a functional collective inside the graph: no graph break. Over two
    ranks the float64 sum rounded back equals the sum in ``loss_sum``'s dtype (one correctly rounded addition).
    """
    totals = torch.stack([loss_sum.detach().to(torch.float64), count.detach().to(torch.float64)])
    return sum_across_ranks(totals, group, world).to(loss_sum.dtype)


def global_normalized(
    loss_sum: Tensor, count: Tensor, total: Tensor | float | None, group: Group, grad_reduction: str
) -> Tensor:
    """``Σ_ranks loss_sum / denominator`` where the denominator is ``total`` or ``Σ_ranks count``.

    The value of the normalized losses (weighted mean, token cross-entropy); with ``total`` given (gradient
    accumulation) the denominator is known in advance. A denominator of 0 gives 0.
    """
    check_grad_reduction(grad_reduction)
    world = group_size(group)
    if world == 1:
        denominator = count if total is None else torch.as_tensor(total, dtype=loss_sum.dtype, device=loss_sum.device)
        return safe_divide(loss_sum, denominator)
    # The checked all_reduce, not _global_totals: this is the call's first collective, whose metadata round is how
    # a rank that failed its input checks (checked_together) makes the others raise; one graph break when compiled.
    totals = all_reduce(torch.stack([loss_sum.detach(), count.detach().to(loss_sum.dtype)]), "sum", group, grad="none")
    denominator = totals[1] if total is None else torch.as_tensor(total, dtype=loss_sum.dtype, device=loss_sum.device)
    denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return _value_with_own_gradient(totals[0], denominator, loss_sum, world, grad_reduction)
