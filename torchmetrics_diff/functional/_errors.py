"""The exception of a shape mismatch between inputs that must agree (``preds`` and ``target``, two views).

Pure: it imports nothing (of the package or otherwise), so that every functional module can raise it. Its public
home is :mod:`torchmetrics_diff.exceptions`.
"""

from __future__ import annotations

__all__ = ["ShapeMismatchError"]


class ShapeMismatchError(ValueError, RuntimeError):
    """Two inputs that must have the same shape (``preds`` and ``target``, ``p`` and ``q``, two views of a batch)
    do not; the message names both arguments and both shapes.

    Both a ``ValueError`` (this package's error for a bad input, as the docstrings say) and a ``RuntimeError``
    (what torchmetrics raises for mismatched ``preds`` and ``target``: ``except RuntimeError`` written for
    torchmetrics catches it too).

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MeanSquaredError
        >>> try:
        ...     MeanSquaredError().update(torch.zeros(4), torch.zeros(5))
        ... except RuntimeError as err:
        ...     print(type(err).__name__, isinstance(err, ValueError), err)
        ShapeMismatchError True `preds` and `target` must have the same shape; got preds (4,) and target (5,)
    """

    __module__ = "torchmetrics_diff.exceptions"  # its public home (pickles and reprs name it there)
