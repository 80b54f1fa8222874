"""torchmetrics' per-query retrieval functions (``retrieval_average_precision`` and the others): each scores the
documents of one query, with torchmetrics' names and arguments, through the segment maths of
``_retrieval_queries``. Pure: imports only torch and that module.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_diff.functional._retrieval_queries import (
    Queries,
    auroc,
    average_precision,
    check_bool,
    check_max_fpr,
    check_optional_positive_int,
    check_single_query,
    fall_out,
    group_queries,
    hit_rate,
    normalized_dcg,
    precision,
    precision_recall_curve,
    r_precision,
    recall,
    reciprocal_rank,
)


# -------------------------------------------------------------------------------------- functional forms
def _one(preds: Tensor, target: Tensor) -> Queries:
    return group_queries(preds, target, torch.zeros(preds.shape, dtype=torch.int64, device=preds.device))


def retrieval_average_precision(
    preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error"
) -> Tensor:
    """Average precision of one query's documents (torchmetrics' function of the same name).

    The mean of ``precision@i`` over the positions ``i <= top_k`` of the documents sorted by score that hold a
    relevant document; as torchmetrics, a relevant document scored ``<= 0`` counts as not retrieved.

    Args:
        preds: the documents' scores, floating.
        target: their relevance (``0``/``1``, bool or integer or floating), of the shape of ``preds``.
        top_k: only the ``top_k`` best-scored documents count (a positive int), or None (default): all.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor in the dtype of ``preds`` (at least float32); 0 without a relevant document.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; ``preds`` and ``target`` of different
            shapes, empty, of the wrong dtypes, a non-binary ``target``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_average_precision(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, True]))
        tensor(0.8333)
        >>> preds, target = torch.tensor([0.2, float("nan"), 0.5]), torch.tensor([True, True, False])
        >>> retrieval_average_precision(preds, target, nan_strategy="ignore")  # the NaN-scored document dropped
        tensor(0.5000)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_average_precision")
    return average_precision(_one(preds, target), top_k)[0]


def retrieval_reciprocal_rank(
    preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error"
) -> Tensor:
    """Reciprocal rank of one query's documents (torchmetrics' function of the same name): ``1 / rank`` of the
    first relevant document in score order within ``top_k``; as torchmetrics, a relevant document scored
    ``<= 0`` counts as not retrieved.

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        top_k: only the ``top_k`` best-scored documents count (a positive int), or None (default): all.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 without a relevant document (within ``top_k``).

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_reciprocal_rank(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([False, True, False]))
        tensor(0.5000)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_reciprocal_rank")
    return reciprocal_rank(_one(preds, target), top_k)[0]


def retrieval_precision(
    preds: Tensor, target: Tensor, top_k: int | None = None, adaptive_k: bool = False, *, nan_strategy: str = "error"
) -> Tensor:
    """Precision@k of one query's documents (torchmetrics' function of the same name): the relevant documents
    among the ``top_k`` best-scored ones (a relevant document scored ``<= 0`` not counted, as torchmetrics),
    divided by ``top_k``.

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        top_k: the cut-off (a positive int), or None (default): all the documents.
        adaptive_k: divide by the number of documents instead when ``top_k`` exceeds it. Default False.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 without a relevant document.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, a bad ``top_k`` or ``adaptive_k``.

    Example:
        >>> import torch
        >>> retrieval_precision(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, True]), top_k=2)
        tensor(0.5000)
    """
    adaptive_k = check_bool("adaptive_k", adaptive_k)
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_precision")
    return precision(_one(preds, target), top_k, adaptive_k)[0]


def retrieval_recall(preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error") -> Tensor:
    """Recall@k of one query's documents (torchmetrics' function of the same name): the relevant documents
    among the ``top_k`` best-scored ones (a relevant document scored ``<= 0`` not counted, as torchmetrics),
    divided by all the relevant documents.

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        top_k: the cut-off (a positive int), or None (default): all the documents.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 without a relevant document.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_recall(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, True]), top_k=2)
        tensor(0.5000)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_recall")
    return recall(_one(preds, target), top_k)[0]


def retrieval_fall_out(
    preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error"
) -> Tensor:
    """Fall-out@k of one query's documents (torchmetrics' function of the same name): the non-relevant documents
    among the ``top_k`` best-scored ones, divided by all the non-relevant documents (lower is better).

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        top_k: the cut-off (a positive int), or None (default): all the documents.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 without a non-relevant document.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_fall_out(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, True]), top_k=2)
        tensor(1.)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_fall_out")
    return fall_out(_one(preds, target), top_k)[0]


def retrieval_hit_rate(
    preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error"
) -> Tensor:
    """Hit rate@k of one query's documents (torchmetrics' function of the same name): 1 when a relevant document
    is among the ``top_k`` best-scored ones, else 0.

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        top_k: the cut-off (a positive int), or None (default): all the documents.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor, 0 or 1.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_hit_rate(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, False]), top_k=2)
        tensor(0.)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_hit_rate")
    return hit_rate(_one(preds, target), top_k)[0]


def retrieval_r_precision(preds: Tensor, target: Tensor, *, nan_strategy: str = "error") -> Tensor:
    """R-precision of one query's documents (torchmetrics' function of the same name): the precision among the
    ``R`` best-scored documents, ``R`` the number of relevant ones.

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 without a relevant document.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, or a non-binary
            ``target``.

    Example:
        >>> import torch
        >>> retrieval_r_precision(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([True, False, True]))
        tensor(0.5000)
    """
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_r_precision")
    return r_precision(_one(preds, target))[0]


def retrieval_normalized_dcg(
    preds: Tensor, target: Tensor, top_k: int | None = None, *, nan_strategy: str = "error"
) -> Tensor:
    """Normalized DCG@k of one query's documents with graded relevance (torchmetrics' function of the same name):
    tied scores share the mean gain of their run, as torchmetrics and scikit-learn's ``ndcg_score``.

    Args:
        preds: the documents' scores, floating.
        target: their relevance (gains: bool, integer or floating, any sign), of the shape of ``preds``.
        top_k: the cut-off (a positive int), or None (default): all the documents.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 where the ideal DCG is 0.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, or a bad ``top_k``.

    Example:
        >>> import torch
        >>> retrieval_normalized_dcg(torch.tensor([0.1, 0.2, 0.3, 4.0, 70.0]), torch.tensor([10, 0, 0, 1, 5]))
        tensor(0.6957)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    preds, target = check_single_query(preds, target, False, nan_strategy, "retrieval_normalized_dcg")
    return normalized_dcg(_one(preds, target), top_k)[0]


def retrieval_auroc(
    preds: Tensor,
    target: Tensor,
    top_k: int | None = None,
    max_fpr: float | None = None,
    *,
    nan_strategy: str = "error",
) -> Tensor:
    """AUROC of one query's ``top_k`` best-scored documents (torchmetrics' function of the same name).

    Args:
        preds: the documents' scores, floating (ranked as given; torchmetrics passes scores outside ``[0, 1]``
            through a sigmoid first, which only changes the result where float rounding makes two scores equal).
        target: their binary relevance, of the shape of ``preds``.
        top_k: only the ``top_k`` best-scored documents count (a positive int), or None (default): all.
        max_fpr: a float in ``(0, 1]``: the standardized partial AUC up to that false-positive rate (McClish's
            correction), or None (default): the whole area.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        A 0-d tensor; 0 when the documents counted lack a relevant or a non-relevant one.

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, a bad ``top_k`` or ``max_fpr``.

    Example:
        >>> import torch
        >>> retrieval_auroc(torch.tensor([0.2, 0.3, 0.5, 0.1]), torch.tensor([True, False, True, False]))
        tensor(0.7500)
    """
    top_k = check_optional_positive_int("top_k", top_k)
    max_fpr = check_max_fpr(max_fpr)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_auroc")
    return auroc(_one(preds, target), top_k, max_fpr)[0]


def retrieval_precision_recall_curve(
    preds: Tensor, target: Tensor, max_k: int | None = None, adaptive_k: bool = False, *, nan_strategy: str = "error"
) -> tuple[Tensor, Tensor, Tensor]:
    """Precision@k and recall@k of one query's documents for ``k = 1 .. max_k`` (torchmetrics' function of the
    same name).

    Args:
        preds: the documents' scores, floating.
        target: their binary relevance, of the shape of ``preds``.
        max_k: the largest ``k`` (a positive int), or None (default): the number of documents.
        adaptive_k: divide precision@k by the number of documents instead of ``k`` where ``k`` exceeds it.
            Default False.
        nan_strategy: what a NaN score does: ``"error"`` (default) raises a ``ValueError`` with the count,
            ``"warn"`` drops its document with a warning giving the count, ``"ignore"`` drops it silently,
            ``"disable"`` skips the check (torchmetrics' behaviour). Infinite scores are ranked. Keyword only.

    Returns:
        ``(precision, recall, top_k)``, each of length ``max_k``: ``top_k`` holds the ``k`` each precision was
        divided by (``1 .. max_k``, capped at the number of documents with ``adaptive_k``).

    Raises:
        ValueError: a NaN score (``nan_strategy="error"``) or only NaN scores; bad shapes or dtypes, a non-binary
            ``target``, a bad ``max_k`` or ``adaptive_k``.

    Example:
        >>> import torch
        >>> p, r, k = retrieval_precision_recall_curve(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([1, 0, 1]))
        >>> p, r, k
        (tensor([1.0000, 0.5000, 0.6667]), tensor([0.5000, 0.5000, 1.0000]), tensor([1, 2, 3]))
    """
    adaptive_k = check_bool("adaptive_k", adaptive_k)
    max_k = check_optional_positive_int("max_k", max_k)
    preds, target = check_single_query(preds, target, True, nan_strategy, "retrieval_precision_recall_curve")
    n = preds.numel()
    max_k = n if max_k is None else max_k
    prec, rec = precision_recall_curve(_one(preds, target), max_k, adaptive_k)
    top_k = torch.arange(1, max_k + 1, device=preds.device)
    if adaptive_k:
        top_k = top_k.clamp(max=n)
    return prec[0], rec[0], top_k
