"""Cross-modal retrieval metrics whose gallery is every rank's rows.

Each rank appends its paired image/text embeddings (and labels) to ``cat`` list states; ``compute`` gathers
every rank's rows in one collective (the sync engine) and scores every query against the whole global
gallery, ``chunk_size`` queries at a time. The definitions (rank, R@k, AP@k, positives) are those of
:mod:`torchmetrics_diff.functional._retrieval`; results are dicts keyed by direction and cut-off.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.functional._checks import check_positive_int
from torchmetrics_diff.functional._retrieval import (
    DIRECTIONS,
    check_directions,
    check_optional_top_k,
    check_pairs,
    check_top_k,
    embed,
    map_from_aps,
    mean_rank_from_ranks,
    median_rank_from_ranks,
    mrr_from_ranks,
    ndcg_directions,
    ndcg_from_values,
    recall_at_k_from_ranks,
    score_directions,
)
from torchmetrics_diff.metric import Metric, dim_zero_cat

_ARGS = """
        directions: which of ``"i2t"`` (image queries, text gallery) and ``"t2i"`` to score. Default both,
            ``("i2t", "t2i")``.
        normalize: L2-normalize the embeddings first (scores are cosine similarities); ``False`` uses raw dot
            products. Default ``True``.
        chunk_size: queries scored at a time; the peak memory of ``compute`` is about
            ``chunk_size × N`` scores (``N`` the global number of pairs). Default 1024.
        kwargs: the :class:`~torchmetrics_diff.Metric` keyword arguments (``compute_on_cpu=True`` keeps the
            stored embeddings off the accelerator)."""


class _CrossModalRetrieval(Metric):
    """Stores paired embeddings (and labels, ``-1`` where none were given) as ``cat`` states."""

    is_differentiable = False
    full_state_update = False
    image: list[torch.Tensor]
    text: list[torch.Tensor]
    labels: list[torch.Tensor]

    def __init__(
        self,
        directions: Sequence[str] = DIRECTIONS,
        normalize: bool = True,
        chunk_size: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.directions = check_directions(directions)
        if not isinstance(normalize, bool):
            raise ValueError(f"`normalize` must be a bool; got {normalize!r}")
        self.normalize = normalize
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.add_state("image", [], dist_reduce_fx="cat")
        self.add_state("text", [], dist_reduce_fx="cat")
        self.add_state("labels", [], dist_reduce_fx="cat")

    def update(self, image: torch.Tensor, text: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Append a batch of pairs.

        Args:
            image: image embeddings ``(B, D)``, floating.
            text: text embeddings ``(B, D)``; row i pairs with image row i.
            labels: integer labels ``(B,)``, ``>= 0``: rows sharing a label are positives of each other.
                Default ``None``: only a row's own pair is.

        Raises:
            ValueError: embeddings that are not floating ``(B, D)`` tensors of one shape, or bad ``labels``.
        """
        image, text, labels = check_pairs(image, text, labels)
        # appended even when empty: a rank whose list states hold (empty) tensors agrees with the others on their
        # dtype and shape, so its syncs stay on the engine's one-collective path
        image, text = embed(image, self.normalize), embed(text, self.normalize)  # once here, not at every compute
        self.image.append(image.to(self.dtype))
        self.text.append(text.to(self.dtype))
        missing = torch.full((image.shape[0],), -1, dtype=torch.int64, device=image.device)
        self.labels.append(missing if labels is None else labels.to(torch.int64))

    def _rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Every pair seen (every rank's, once synced): image and text embeddings, and the labels (``None`` when
        no row has one)."""
        if not self.image or not sum(x.shape[0] for x in self.image):
            empty = torch.zeros(0, 1, dtype=self.dtype, device=self.device)
            return empty, empty, None
        image, text, labels = dim_zero_cat(self.image), dim_zero_cat(self.text), dim_zero_cat(self.labels)
        # without any label only a row's own pair is a positive: the same ranks with or without the labels;
        # skipping them saves a comparison per score, but asking needs the host (not under torch.compile)
        return image, text, None if not compiling() and not bool((labels >= 0).any()) else labels

    def _scored(self, ap_k: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        return score_directions(*self._rows(), self.directions, self.chunk_size, ap_k)

    def _ranks(self) -> dict[str, torch.Tensor]:
        return {d: ranks for d, (ranks, _) in self._scored().items()}

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The value from each direction's per-query numbers (ranks, APs or nDCGs)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `_summary`")

    def result_keys(self) -> list[str]:
        """The keys of the value (directions, then cut-offs), known before any update: a
        :class:`~torchmetrics_diff.MetricCollection` holding the metric then gives each key a tensor-valued view
        in ``items()``, which Lightning's ``self.log_dict(collection)`` logs.

        Example:
            >>> from torchmetrics_diff.retrieval import CrossModalRecallAtK
            >>> CrossModalRecallAtK(top_k=(1, 5), directions=("t2i",)).result_keys()
            ['t2i_R@1', 't2i_R@5']
        """
        # the keys are those of the value of no query: named by the same functions as every value
        return list(self._summary({d: torch.zeros(0, dtype=torch.float64) for d in self.directions}))


class CrossModalRecallAtK(_CrossModalRetrieval):
    __doc__ = (
        """Recall@k of cross-modal retrieval over the global gallery: the fraction of queries with a positive
    among the ``k`` best-scoring gallery items, for each direction and each ``k``.

    The result is a dict ``{"i2t_R@1": ..., "i2t_R@5": ..., "t2i_R@1": ...}`` (directions, then ``k``, in the
    order given); NaN before any pair.

    Args:
        top_k: the cut-offs ``k`` (an int or a sequence of ints). Default ``(1, 5, 10)``."""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalRecallAtK
        >>> metric = CrossModalRecallAtK(top_k=(1, 2))
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> metric.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.9, 1.0]]))
        >>> metric.compute()
        {'i2t_R@1': tensor(0.3333), 'i2t_R@2': tensor(0.6667), 't2i_R@1': tensor(0.6667), 't2i_R@2': tensor(0.6667)}
    """
    )

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, top_k: int | Sequence[int] = (1, 5, 10), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.top_k = check_top_k(top_k)

    def compute(self) -> dict[str, torch.Tensor]:
        """Recall@k per direction and ``k``."""
        return self._summary(self._ranks())

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return recall_at_k_from_ranks(per_direction, self.top_k)


class CrossModalMeanRank(_CrossModalRetrieval):
    __doc__ = (
        """Mean rank of each query's best positive over the global gallery (1 is perfect), per direction:
    ``{"i2t_mean_rank": ..., "t2i_mean_rank": ...}``.

    Args:"""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalMeanRank
        >>> metric = CrossModalMeanRank()
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> metric.compute()
        {'i2t_mean_rank': tensor(2.), 't2i_mean_rank': tensor(1.5000)}
    """
    )

    higher_is_better = False

    def compute(self) -> dict[str, torch.Tensor]:
        """Mean rank per direction."""
        return self._summary(self._ranks())

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return mean_rank_from_ranks(per_direction)


class CrossModalMedianRank(_CrossModalRetrieval):
    __doc__ = (
        """Median rank of each query's best positive over the global gallery, per direction (the mean of the two
    middle ranks for an even count, as ``numpy.median``): ``{"i2t_median_rank": ..., "t2i_median_rank": ...}``.

    Args:"""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalMedianRank
        >>> metric = CrossModalMedianRank()
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> metric.compute()
        {'i2t_median_rank': tensor(2.), 't2i_median_rank': tensor(1.5000)}
    """
    )

    higher_is_better = False

    def compute(self) -> dict[str, torch.Tensor]:
        """Median rank per direction."""
        return self._summary(self._ranks())

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return median_rank_from_ranks(per_direction)


class CrossModalMAPAtK(_CrossModalRetrieval):
    __doc__ = (
        """Mean average precision over the top ``k`` of the global gallery, per direction, with optional
    multi-positive labels: ``{"i2t_mAP@10": ..., "t2i_mAP@10": ...}``. AP@k is torchmetrics'
    ``retrieval_average_precision(top_k=k)`` of one query: the mean of precision@i over the positions ``i <= k``
    holding a positive (0 when none does); unlike torchmetrics, positives scoring ``<= 0`` still count.

    Args:
        top_k: the cut-off ``k``. Default 10."""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalMAPAtK
        >>> metric = CrossModalMAPAtK(top_k=2)
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> metric.update(image, text, labels=torch.tensor([0, 1, 0]))
        >>> metric.compute()
        {'i2t_mAP@2': tensor(0.5000), 't2i_mAP@2': tensor(0.6667)}
    """
    )

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, top_k: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        (self.top_k,) = check_top_k(top_k)

    def compute(self) -> dict[str, torch.Tensor]:
        """mAP@k per direction."""
        return self._summary({d: ap for d, (_, ap) in self._scored(self.top_k).items()})

    def _summary(self, per_direction: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        return map_from_aps(dict(per_direction), self.top_k)


class CrossModalMRR(_CrossModalRetrieval):
    __doc__ = (
        """Mean reciprocal rank over the global gallery, per direction: the mean over queries of ``1 / rank`` of
    the query's best positive (0 when that rank is beyond ``top_k``): ``{"i2t_MRR": ..., "t2i_MRR": ...}``
    (``"i2t_MRR@<k>"`` with ``top_k``); NaN before any pair. Ties count against the query, as for the rank.

    Args:
        top_k: only the top ``k`` gallery items count (a positive int), or ``None`` (default): all of them."""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalMRR
        >>> metric = CrossModalMRR()
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> metric.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.9, 1.0]]))
        >>> metric.compute()
        {'i2t_MRR': tensor(0.6111), 't2i_MRR': tensor(0.7778)}
    """
    )

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, top_k: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.top_k = check_optional_top_k(top_k)

    def compute(self) -> dict[str, torch.Tensor]:
        """MRR per direction."""
        return self._summary(self._ranks())

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return mrr_from_ranks(per_direction, self.top_k)


class CrossModalNormalizedDCG(_CrossModalRetrieval):
    __doc__ = (
        """Normalized discounted cumulative gain over the top ``k`` of the global gallery (nDCG@k), per direction,
    with binary relevance (a query's positives: its own pair and, with labels, the rows sharing its label):
    ``{"i2t_nDCG@10": ..., "t2i_nDCG@10": ...}`` (``"i2t_nDCG"`` without ``top_k``); NaN before any pair.

    ``DCG@k = Σ_{i <= k} rel_i / log2(i + 1)`` over the gallery sorted by score, divided by the DCG of the ideal
    order (the query's positives first). Tied scores share the mean gain of their tie group, as torchmetrics'
    ``retrieval_normalized_dcg`` and scikit-learn's ``ndcg_score`` do.

    Args:
        top_k: the cut-off ``k`` (a positive int), or ``None`` (default, as torchmetrics): the whole gallery."""
        + _ARGS
        + """

    Example:
        >>> import torch
        >>> from torchmetrics_diff.retrieval import CrossModalNormalizedDCG
        >>> metric = CrossModalNormalizedDCG(top_k=2)
        >>> image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> text = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.9, 1.0]])
        >>> metric.update(image, text, labels=torch.tensor([0, 1, 0]))
        >>> metric.compute()
        {'i2t_nDCG@2': tensor(0.4623), 't2i_nDCG@2': tensor(0.5377)}
    """
    )

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, top_k: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.top_k = check_optional_top_k(top_k)

    def compute(self) -> dict[str, torch.Tensor]:
        """nDCG@k per direction."""
        return self._summary(ndcg_directions(*self._rows(), self.directions, self.chunk_size, self.top_k))

    def _summary(self, per_direction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return ndcg_from_values(per_direction, self.top_k)


# ------------------------------------------------------------------------------------- deprecated old names
def _deprecated(new: type[_CrossModalRetrieval], old: str) -> type[_CrossModalRetrieval]:
    """A subclass of ``new`` under its old name that warns (``FutureWarning``) when constructed."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            f"`{old}` is deprecated and will be removed in the next release: use `{new.__name__}` (the same "
            f"cross-modal metric; `Retrieval*` names are torchmetrics' per-query retrieval metrics now)",
            FutureWarning,
            stacklevel=2,
        )
        new.__init__(self, *args, **kwargs)

    doc = f"Deprecated alias of :class:`{new.__name__}` (warns ``FutureWarning``); removed in the next release."
    return type(old, (new,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


RetrievalRecallAtK = _deprecated(CrossModalRecallAtK, "RetrievalRecallAtK")
RetrievalMeanRank = _deprecated(CrossModalMeanRank, "RetrievalMeanRank")
RetrievalMedianRank = _deprecated(CrossModalMedianRank, "RetrievalMedianRank")
RetrievalMAPAtK = _deprecated(CrossModalMAPAtK, "RetrievalMAPAtK")
