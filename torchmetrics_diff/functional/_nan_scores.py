"""NaN scores in the ranking metrics (AUROC, average precision, the per-query retrieval metrics): the
``nan_strategy`` argument, its check and its messages, written once.

A NaN score has no rank: sorting puts it wherever the sort's convention does, and the value computed with it
depends on that convention, not on the data. So the default, ``"error"``, refuses it; ``"warn"`` and
``"ignore"`` drop the units whose score is NaN (the caller says which: a sample, a ``(sample, label)`` entry, a
document) and score the rest exactly; ``"disable"`` skips the check, as torchmetrics does. Infinite scores are
ranked (above or below every finite one) and are never treated as NaN.

The callers apply the policy where every rank's rows are together (``compute`` on the synced states), so every
rank reaches the same outcome. Pure: imports only torch and ``_checks``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from torchmetrics_diff.functional._checks import compiling

#: the values of ``nan_strategy``
NAN_STRATEGIES = ("error", "warn", "ignore", "disable")


def check_nan_strategy(value: Any) -> str:
    """``value`` if it is one of ``"error"``, ``"warn"``, ``"ignore"``, ``"disable"``.

    Raises:
        ValueError: naming ``nan_strategy``.

    Example:
        >>> check_nan_strategy("ignore")
        'ignore'
    """
    if not isinstance(value, str) or value not in NAN_STRATEGIES:
        raise ValueError(f"`nan_strategy` must be one of {NAN_STRATEGIES}; got {value!r}")
    return value


def settle_nans(nan: torch.Tensor, strategy: str, owner: str, units: str, stacklevel: int = 3) -> bool:
    """Apply ``strategy`` to the units whose score is NaN (the boolean mask ``nan``, one entry per unit); return
    whether the caller must drop them.

    ``"error"`` raises when ``nan`` has a true entry (eagerly: one host read of ``nan.any()``; under
    ``torch.compile`` a device assertion in the graph, no host read, whose ``RuntimeError`` cannot give the
    count); ``"warn"`` reads the count (one host read; none and no warning under ``torch.compile``) and warns when
    it is not 0; ``"ignore"`` reads nothing. ``"disable"`` never gets here: the caller does not build the mask.

    Args:
        nan: one entry per unit (sample, entry, document), true where its score is NaN.
        strategy: the ``nan_strategy``.
        owner: the metric or function named in the messages (``"MulticlassAUROC"``, ``"binary_auroc"``).
        units: what one entry of ``nan`` is, plural, as the messages name it (``"samples"``, ``"documents"``).
        stacklevel: the warning's, as ``warnings.warn`` takes it (from the caller of this function's caller).

    Raises:
        ValueError: ``strategy="error"`` and a NaN score, eagerly; the message names ``owner``, ``preds``, the
            count and the other strategies.
    """
    if strategy == "error":
        hint = (
            "a NaN score has no rank, so no value is defined with it. Fix the scores, or pass "
            "nan_strategy='ignore' to drop those " + units + " ('warn' drops them with a warning)"
        )
        if compiling():
            message = f"{owner}: `preds` holds NaN scores and nan_strategy='error' (counted only eagerly); {hint}"
            torch._assert_async(nan.logical_not().all(), message)
        elif bool(nan.any()):
            count = int(nan.sum())
            raise ValueError(
                f"{owner}: `preds` holds NaN scores in {count} of {nan.numel()} {units} (nan_strategy='error'); " + hint
            )
        return False
    if strategy == "warn" and not compiling():
        count = int(nan.sum())
        if count:
            warnings.warn(
                f"{owner}: dropped {count} of {nan.numel()} {units} whose score in `preds` is NaN "
                "(nan_strategy='warn'); the value is that of the others",
                UserWarning,
                stacklevel=stacklevel,
            )
    return True
