"""The wrappers of one inner metric (``ClasswiseWrapper``, ``Running``): what they take from it, written once."""

from __future__ import annotations

from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers._base import WrapperMetric


class _InnerWrapper(WrapperMetric):
    """A wrapper of one inner metric (:meth:`_inner`): its ``higher_is_better`` and ``is_differentiable`` are that
    metric's, and so are the keyword arguments a collection passes on."""

    def _inner(self) -> Metric:
        raise NotImplementedError(f"{type(self).__name__} must implement `_inner`")

    @property
    def higher_is_better(self) -> bool | None:  # type: ignore[override]
        """The inner metric's ``higher_is_better``."""
        return self._inner().higher_is_better

    @property
    def is_differentiable(self) -> bool | None:  # type: ignore[override]
        """The inner metric's ``is_differentiable``."""
        return self._inner().is_differentiable

    def _kwargs_target(self) -> Metric:
        return self._inner()
