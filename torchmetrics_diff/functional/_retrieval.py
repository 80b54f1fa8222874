"""Cross-modal retrieval over paired embeddings: ranks, recall@k, mean/median rank, mAP@k, MRR and nDCG@k, in chunks.

Row ``i`` of ``image`` and row ``i`` of ``text`` are a pair. Image-to-text (``"i2t"``) retrieval uses each image
as a query against every text (the gallery), text-to-image (``"t2i"``) the reverse. A gallery item is a
*positive* of a query when it is the query's own pair or, with ``labels``, when it has the query's label
(several captions of one image, several images of one class). Scores are dot products, of L2-normalized
embeddings (cosine similarity) by default.

Definitions (per query, then averaged over queries):

- **rank**: 1 + the number of non-positive gallery items scoring at least as high as the best-scoring positive
  (ties count against the query: constant embeddings give the worst rank, never a perfect one);
- **R@k**: 1 if the rank is at most ``k`` (some positive is among the top ``k``), else 0;
- **AP@k** (torchmetrics' ``retrieval_average_precision`` with ``top_k``): over the top ``min(k, G)`` items, the
  mean of precision@i at the positions ``i`` holding a positive, 0 when none of them does. Unlike torchmetrics,
  a positive with a score ``<= 0`` still counts as relevant (cosine scores are often negative; a ranking
  metric must not depend on the scores' sign).
- **reciprocal rank** (averaged: MRR): ``1 / rank``, 0 for a rank beyond ``top_k``;
- **nDCG@k**: ``Σ_{i <= k} rel_i / log2(i + 1)`` over the gallery sorted by score (``rel`` 1 for a positive),
  divided by the same sum for the ideal order; tied scores share their tie group's mean gain (``query_ndcg``).

Queries are scored ``chunk_size`` at a time, so the memory is ``O(chunk_size × G)`` instead of ``O(N × G)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from torchmetrics_diff.functional._checks import check_positive_int, check_values
from torchmetrics_diff.functional._errors import ShapeMismatchError

DIRECTIONS = ("i2t", "t2i")


# ------------------------------------------------------------------------------------------------ arguments
def check_top_k(top_k: Any, name: str = "top_k") -> tuple[int, ...]:
    """``top_k`` as a tuple of positive ints (an int or a non-empty sequence of them)."""
    ks = (top_k,) if isinstance(top_k, int) and not isinstance(top_k, bool) else top_k
    if (
        not isinstance(ks, Sequence)
        or not ks
        or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks)
    ):
        raise ValueError(f"`{name}` must be a positive int or a non-empty sequence of them; got {top_k!r}")
    return tuple(ks)


def check_directions(directions: Any) -> tuple[str, ...]:
    ds = (directions,) if isinstance(directions, str) else directions
    if not isinstance(ds, Sequence) or not ds or any(d not in DIRECTIONS for d in ds):
        raise ValueError(f"`directions` must be a non-empty sequence of {DIRECTIONS}; got {directions!r}")
    return tuple(ds)


def check_pairs(
    image: torch.Tensor, text: torch.Tensor, labels: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validate paired ``(N, D)`` floating embeddings and optional ``(N,)`` integer labels ``>= 0``."""
    for name, x in (("image", image), ("text", text)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"`{name}` must be a tensor; got {type(x).__name__}")
        if x.ndim != 2 or not x.is_floating_point():
            raise ValueError(f"`{name}` must be a floating (N, D) tensor; got shape {tuple(x.shape)} dtype {x.dtype}")
    if image.shape != text.shape:
        raise ShapeMismatchError(
            f"`image` and `text` must be paired rows of one shape (N, D); got {tuple(image.shape)} "
            f"and {tuple(text.shape)}"
        )
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
            raise ValueError(f"`labels` must be an integer tensor of shape (N,); got {labels!r}")
        if labels.shape != image.shape[:1]:
            raise ValueError(f"`labels` must have shape ({image.shape[0]},); got {tuple(labels.shape)}")
        if labels.numel():
            check_values(labels < 0, "`labels` must be >= 0", lambda: f"found {labels[labels < 0][:5].tolist()}")
    return image, text, labels


def check_finite(image: torch.Tensor, text: torch.Tensor) -> None:
    """Raise unless every embedding is finite (checked where the rows are scored: every rank's, in ``compute``).

    Raises:
        ValueError: naming ``image`` or ``text`` and the count of rows with a NaN or an infinity.
    """

    def found() -> str:
        counts = [(n, int((~torch.isfinite(x)).any(-1).sum())) for n, x in (("image", image), ("text", text))]
        return "found NaN or infinite values in " + " and ".join(f"{k} row(s) of `{n}`" for n, k in counts if k)

    bad = (~torch.isfinite(image)).any(-1) | (~torch.isfinite(text)).any(-1)
    check_values(
        bad, "cross-modal retrieval: embeddings must be finite (a NaN or an infinity has no score, so no rank)", found
    )


# ------------------------------------------------------------------------------------------------- scoring
def query_scores(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    labels: torch.Tensor | None = None,
    chunk_size: int = 1024,
    ap_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rank of the best positive of each query (``int64``) and, with ``ap_k``, its AP@``ap_k`` (float64).

    ``queries[i]`` and ``gallery[i]`` are a pair (positives of each other); with ``labels`` (``-1``: no label),
    also every gallery row with the query's label. Queries are scored ``chunk_size`` rows at a time.
    """
    n = queries.shape[0]
    ranks, aps = [], []
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = queries[start:stop] @ gallery.T  # (c, G): the only O(chunk x gallery) tensors live in this loop
        positive = _positives(scores, start, labels)
        best = scores.masked_fill(~positive, float("-inf")).amax(1, keepdim=True)
        ranks.append(1 + ((scores >= best) & ~positive).sum(1))
        if ap_k is not None:
            k = min(ap_k, scores.shape[1])
            top = scores.topk(k, dim=1).indices
            relevant = positive.gather(1, top).to(torch.float64)
            precision_at = relevant.cumsum(1) / torch.arange(1, k + 1, device=scores.device, dtype=torch.float64)
            hits = relevant.sum(1)
            aps.append((precision_at * relevant).sum(1) / hits.clamp(min=1))
    empty_long = torch.zeros(0, dtype=torch.int64, device=queries.device)
    rank = torch.cat(ranks) if ranks else empty_long
    ap = None if ap_k is None else (torch.cat(aps) if aps else empty_long.to(torch.float64))  # on the queries' device
    return rank, ap


def _positives(scores: torch.Tensor, start: int, labels: torch.Tensor | None) -> torch.Tensor:
    """The ``(c, G)`` mask of the positives of the queries ``start .. start + c``: their own pairs and, with
    ``labels``, the gallery rows sharing their label."""
    rows = torch.arange(scores.shape[0], device=scores.device)
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[rows, rows + start] = True
    if labels is not None:
        own = labels[start : start + scores.shape[0], None]
        positive |= (own == labels[None, :]) & (own >= 0)
    return positive


def query_ndcg(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    labels: torch.Tensor | None = None,
    chunk_size: int = 1024,
    top_k: int | None = None,
) -> torch.Tensor:
    """nDCG@``top_k`` of each query (float64, shape ``(N,)``) with binary relevance (its positives, as in
    :func:`query_scores`); ``top_k=None``: the whole gallery.

    Tied scores share the mean gain of their tie group (scikit-learn's ``ndcg_score`` and torchmetrics'
    ``retrieval_normalized_dcg`` do the same): over the top ``k`` positions, ``DCG = Σ_i gain(group of i) /
    log2(i + 1)``, where a group's gain is the fraction of positives among *all* gallery items with its score
    (the group that straddles position ``k`` counts its members beyond ``k`` too). The ideal DCG puts the
    query's ``P`` positives first: ``Σ_{i <= min(k, P)} 1 / log2(i + 1)``. Per chunk this costs a ``topk`` and
    two passes over the ``(chunk, G)`` scores, not a sort of them.
    """
    n, g = queries.shape[0], gallery.shape[0]
    k = g if top_k is None else min(top_k, g)
    out = []
    discount = 1 / torch.log2(torch.arange(2, k + 2, device=queries.device, dtype=torch.float64))
    ideal = discount.cumsum(0)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = queries[start:stop] @ gallery.T  # (c, G)
        positive = _positives(scores, start, labels)
        values, top = scores.topk(k, dim=1)  # descending: tied scores are adjacent
        relevant = positive.gather(1, top).to(torch.float64)
        new_group = torch.ones_like(values, dtype=torch.bool)
        new_group[:, 1:] = values[:, 1:] != values[:, :-1]
        group = new_group.cumsum(1) - 1  # (c, k): the tie group of each top position
        gains = torch.zeros_like(relevant).scatter_add_(1, group, relevant)
        counts = torch.zeros_like(relevant).scatter_add_(1, group, torch.ones_like(relevant))
        # the last group may go on past position k: its count and positives over the whole row
        last = group[:, -1:]
        at_last = scores == values[:, -1:]
        gains.scatter_(1, last, (at_last & positive).sum(1, keepdim=True).to(torch.float64))
        counts.scatter_(1, last, at_last.sum(1, keepdim=True).to(torch.float64))
        mean_gain = (gains / counts.clamp(min=1)).gather(1, group)
        dcg = (mean_gain * discount).sum(1)
        best = ideal[(positive.sum(1).clamp(max=k) - 1).clamp(min=0)]
        out.append(dcg / best)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=queries.device)


def embed(x: torch.Tensor, normalize: bool) -> torch.Tensor:
    """``x`` L2-normalized along its rows (scores become cosine similarities), or as it is."""
    return F.normalize(x, dim=-1) if normalize else x


def score_directions(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None,
    directions: Sequence[str],
    chunk_size: int,
    ap_k: int | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """:func:`query_scores` of each direction: image queries against the text gallery (``"i2t"``), the reverse
    (``"t2i"``); non-finite embeddings raise (:func:`check_finite`)."""
    check_finite(image, text)
    pairs = {"i2t": (image, text), "t2i": (text, image)}
    return {d: query_scores(*pairs[d], labels, chunk_size, ap_k) for d in directions}


def _per_direction(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None,
    directions: Sequence[str],
    normalize: bool,
    chunk_size: int,
    ap_k: int | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    image, text, labels = check_pairs(image, text, labels)
    directions = check_directions(directions)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    image, text = embed(image.detach(), normalize), embed(text.detach(), normalize)
    return score_directions(image, text, labels, directions, chunk_size, ap_k)


def _by_direction(
    values: dict[str, torch.Tensor], name: str, summary: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``{"<direction>_<name>": summary of that direction's values}``, in the default float dtype."""
    dtype = torch.get_default_dtype()
    return {f"{d}_{name}": summary(v).to(dtype) for d, v in values.items()}


def retrieval_ranks(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Per direction, the rank of each query's best positive (1 is best).

    No collective; no gradient. See the module's definitions of rank, R@k and AP@k (:doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t": ranks, "t2i": ranks}`` (the requested directions), each ``int64`` of shape ``(N,)``.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, or a non-positive ``chunk_size``.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_ranks(image, text)
        {'i2t': tensor([2, 3, 1]), 't2i': tensor([1, 3, 1])}
    """
    return {d: r for d, (r, _) in _per_direction(image, text, labels, directions, normalize, chunk_size).items()}


def recall_at_k_from_ranks(ranks: dict[str, torch.Tensor], top_k: Sequence[int]) -> dict[str, torch.Tensor]:
    """``{"<direction>_R@<k>": fraction of queries ranked within k}`` (NaN without queries)."""
    dtype = torch.get_default_dtype()
    return {f"{d}_R@{k}": (r <= k).to(dtype).mean() for d, r in ranks.items() for k in top_k}


def retrieval_recall_at_k(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    top_k: int | Sequence[int] = (1, 5, 10),
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Recall@k per direction and k: the fraction of queries with a positive among the top k.

    No collective; no gradient. See the module's definitions of rank, R@k and AP@k (:doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        top_k: one ``k`` or a sequence of them (default ``(1, 5, 10)``), positive ints.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_R@1": value, "t2i_R@5": value, ...}``, one 0-d tensor in the default dtype per direction and
        ``k``; NaN without queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, or a non-positive ``chunk_size``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_recall_at_k(image, text, top_k=(1, 2), directions=("i2t",))
        {'i2t_R@1': tensor(0.3333), 'i2t_R@2': tensor(0.6667)}
    """
    ks = check_top_k(top_k)
    return recall_at_k_from_ranks(retrieval_ranks(image, text, labels, directions, normalize, chunk_size), ks)


def mean_rank_from_ranks(ranks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<direction>_mean_rank": mean rank}``."""
    return _by_direction(ranks, "mean_rank", lambda r: r.to(torch.float64).mean())


def median_rank_from_ranks(ranks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<direction>_median_rank": median rank}``, the mean of the two middle ranks for an even count (as
    ``numpy.median``; ``torch.median`` would return the lower one)."""

    def median(r: torch.Tensor) -> torch.Tensor:
        r = r.to(torch.float64)
        return torch.quantile(r, 0.5) if r.numel() else r.new_full((), float("nan"))  # NaN on the ranks' device

    return _by_direction(ranks, "median_rank", median)


def retrieval_mean_rank(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Mean rank of the best positive, per direction.

    No collective; no gradient. See the module's definitions of rank, R@k and AP@k (:doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_mean_rank": value, "t2i_mean_rank": value}``, 0-d tensors in the default dtype; NaN without
        queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, or a non-positive ``chunk_size``.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_mean_rank(image, text)
        {'i2t_mean_rank': tensor(2.), 't2i_mean_rank': tensor(1.6667)}
    """
    return mean_rank_from_ranks(retrieval_ranks(image, text, labels, directions, normalize, chunk_size))


def retrieval_median_rank(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Median rank of the best positive, per direction (the mean of the two middle ranks for an even count).

    No collective; no gradient. See the module's definitions of rank, R@k and AP@k (:doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_median_rank": value, "t2i_median_rank": value}``, 0-d tensors in the default dtype; NaN without
        queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, or a non-positive ``chunk_size``.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_median_rank(image, text)
        {'i2t_median_rank': tensor(2.), 't2i_median_rank': tensor(1.)}
    """
    return median_rank_from_ranks(retrieval_ranks(image, text, labels, directions, normalize, chunk_size))


def retrieval_map_at_k(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    top_k: int = 10,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Mean average precision over the top ``top_k`` gallery items, per direction.

    No collective; no gradient. See the module's definitions of rank, R@k and AP@k (:doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        top_k: ``k``, one positive int (default 10).
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_mAP@<k>": value, "t2i_mAP@<k>": value}``, 0-d tensors in the default dtype; NaN without queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, or a non-positive ``chunk_size``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_map_at_k(image, text, labels=torch.tensor([0, 1, 0]), top_k=2)
        {'i2t_mAP@2': tensor(0.5000), 't2i_mAP@2': tensor(0.6667)}
    """
    (k,) = check_top_k(top_k)
    per = _per_direction(image, text, labels, directions, normalize, chunk_size, ap_k=k)
    return map_from_aps({d: ap for d, (_, ap) in per.items()}, k)


def map_from_aps(aps: dict[str, torch.Tensor | None], k: int) -> dict[str, torch.Tensor]:
    """``{"<direction>_mAP@<k>": mean AP}`` (NaN without queries)."""
    return _by_direction({d: ap for d, ap in aps.items() if ap is not None}, f"mAP@{k}", torch.mean)


# --------------------------------------------------------------------------------------------- MRR and nDCG
def check_optional_top_k(top_k: Any) -> int | None:
    """``top_k`` if it is ``None`` (the whole gallery) or a positive int."""
    if top_k is None:
        return None
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"`top_k` must be a positive int or None; got {top_k!r}")
    return top_k


def _at(name: str, top_k: int | None) -> str:
    return name if top_k is None else f"{name}@{top_k}"


def mrr_from_ranks(ranks: dict[str, torch.Tensor], top_k: int | None = None) -> dict[str, torch.Tensor]:
    """``{"<direction>_MRR[@<k>]": mean of 1 / rank}``, a rank beyond ``top_k`` counting 0 (NaN without
    queries)."""

    def mrr(r: torch.Tensor) -> torch.Tensor:
        rr = 1 / r.to(torch.float64)
        return (rr if top_k is None else torch.where(r <= top_k, rr, torch.zeros_like(rr))).mean()

    return _by_direction(ranks, _at("MRR", top_k), mrr)


def ndcg_directions(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None,
    directions: Sequence[str],
    chunk_size: int,
    top_k: int | None,
) -> dict[str, torch.Tensor]:
    """:func:`query_ndcg` of each direction (image queries against the text gallery for ``"i2t"``); non-finite
    embeddings raise (:func:`check_finite`)."""
    check_finite(image, text)
    pairs = {"i2t": (image, text), "t2i": (text, image)}
    return {d: query_ndcg(*pairs[d], labels, chunk_size, top_k) for d in directions}


def ndcg_from_values(values: dict[str, torch.Tensor], top_k: int | None = None) -> dict[str, torch.Tensor]:
    """``{"<direction>_nDCG[@<k>]": mean nDCG}`` (NaN without queries)."""
    return _by_direction(values, _at("nDCG", top_k), torch.mean)


def retrieval_mrr(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    top_k: int | None = None,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Mean reciprocal rank of each query's best positive, per direction: the mean of ``1 / rank`` (0 for a rank
    beyond ``top_k``).

    No collective; no gradient. The rank is the module's (ties count against the query; see
    :doc:`/metrics/retrieval`).

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        top_k: only the top ``k`` gallery items count (a positive int), or ``None`` (default): all of them.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_MRR": value, "t2i_MRR": value}`` (keys ``"i2t_MRR@<k>"`` with ``top_k``), 0-d tensors in the
        default dtype; NaN without queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, a non-positive ``chunk_size``, or a ``top_k`` that is neither ``None`` nor a positive int.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_mrr(image, text)
        {'i2t_MRR': tensor(0.6111), 't2i_MRR': tensor(0.7778)}
    """
    k = check_optional_top_k(top_k)
    return mrr_from_ranks(retrieval_ranks(image, text, labels, directions, normalize, chunk_size), k)


def retrieval_ndcg(
    image: torch.Tensor,
    text: torch.Tensor,
    labels: torch.Tensor | None = None,
    top_k: int | None = None,
    directions: Sequence[str] = DIRECTIONS,
    normalize: bool = True,
    chunk_size: int = 1024,
) -> dict[str, torch.Tensor]:
    """Normalized discounted cumulative gain over the top ``top_k`` gallery items (nDCG@k), per direction, with
    binary relevance (a query's positives) and tied scores sharing their group's mean gain.

    No collective; no gradient. See the definition of nDCG@k in :doc:`/metrics/retrieval`.

    Args:
        image: image embeddings of shape ``(N, D)``, floating; row ``i`` pairs with row ``i`` of ``text``.
        text: text embeddings of shape ``(N, D)`` (the shape of ``image``).
        labels: optional integer labels ``>= 0`` of shape ``(N,)``: gallery items sharing the query's label are
            positives too. Default ``None``: only the query's own pair.
        top_k: the cut-off ``k`` (a positive int), or ``None`` (default): the whole gallery.
        directions: the directions to score, a subset of ``("i2t", "t2i")`` (default both).
        normalize: L2-normalize the rows first, so scores are cosine similarities (default ``True``).
        chunk_size: queries scored at a time; memory is ``O(chunk_size × N)``. Default 1024.

    Returns:
        ``{"i2t_nDCG": value, "t2i_nDCG": value}`` (keys ``"i2t_nDCG@<k>"`` with ``top_k``), 0-d tensors in the
        default dtype; NaN without queries.

    Raises:
        ValueError: embeddings that are not finite floating ``(N, D)`` tensors of one shape, bad ``labels``, an unknown
            direction, a non-positive ``chunk_size``, or a ``top_k`` that is neither ``None`` nor a positive int.

    Example:
        >>> import torch
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> retrieval_ndcg(image, text, labels=torch.tensor([0, 1, 0]), top_k=2)
        {'i2t_nDCG@2': tensor(0.4623), 't2i_nDCG@2': tensor(0.5377)}
    """
    k = check_optional_top_k(top_k)
    image, text, labels = check_pairs(image, text, labels)
    directions = check_directions(directions)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    image, text = embed(image.detach(), normalize), embed(text.detach(), normalize)
    return ndcg_from_values(ndcg_directions(image, text, labels, directions, chunk_size, k), k)
