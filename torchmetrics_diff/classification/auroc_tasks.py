"""The AUROC and average-precision task classes (``BinaryAUROC``, ``MulticlassAveragePrecision``, ...): the
generic :class:`~torchmetrics_diff.AUROC` and :class:`~torchmetrics_diff.AveragePrecision` with their task fixed
and torchmetrics' signature, compiled and documented as the other task classes (``tasks``)."""

from __future__ import annotations

from typing import Any

from torchmetrics_diff.classification.auroc import AUROC, AveragePrecision
from torchmetrics_diff.classification.tasks import _TaskClass


def _check_normalization(normalization: Any) -> None:
    if normalization != "sigmoid":
        raise ValueError(
            f"`normalization` must be 'sigmoid' (logits go through a sigmoid; no other is implemented); got "
            f"{normalization!r}"
        )


class BinaryAUROC(_TaskClass, AUROC): ...


class MulticlassAUROC(_TaskClass, AUROC): ...


class MultilabelAUROC(_TaskClass, AUROC): ...


class BinaryAveragePrecision(_TaskClass, AveragePrecision, check="_check_normalization(normalization)"): ...


class MulticlassAveragePrecision(_TaskClass, AveragePrecision): ...


class MultilabelAveragePrecision(_TaskClass, AveragePrecision): ...


# the legend of a value per class or per label, as torchmetrics names it ("Class 0", "Label 0", ...)
_LEGENDS: dict[type, str] = {
    **dict.fromkeys((MulticlassAUROC, MulticlassAveragePrecision), "Class"),
    **dict.fromkeys((MultilabelAUROC, MultilabelAveragePrecision), "Label"),
}
for _cls, _legend in _LEGENDS.items():
    _cls.plot_legend_name = _legend  # type: ignore[attr-defined]
del _cls, _legend
