"""Mismatched input shapes raise ``ShapeMismatchError``: a ``ValueError`` (ours) and a ``RuntimeError`` (what
torchmetrics raises), so ``except RuntimeError`` written for torchmetrics catches ours too.

Each case: the metric (or loss, or function) given inputs whose shapes disagree; the error is caught by both
``except`` clauses, and its message names the arguments and both shapes. Where torchmetrics has the metric, its
error for the same inputs is a ``RuntimeError`` or a ``ValueError`` that ours is as well.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torchmetrics_diff as tmd
from torchmetrics_diff.functional._errors import ShapeMismatchError

torchmetrics = pytest.importorskip("torchmetrics")

P4, T5 = torch.rand(4), torch.rand(5)
P43, T42 = torch.rand(4, 3), torch.rand(4, 2)
_PAIR = ("`preds`", "`target`", "(4,)", "(5,)")

# name: (our metric, torchmetrics' metric or None, preds, target, what the message names)
CASES = {
    "MeanSquaredError": (tmd.MeanSquaredError, torchmetrics.MeanSquaredError, P4, T5, _PAIR),
    "MeanAbsoluteError": (tmd.MeanAbsoluteError, torchmetrics.MeanAbsoluteError, P4, T5, _PAIR),
    "MeanAbsolutePercentageError": (
        tmd.MeanAbsolutePercentageError,
        torchmetrics.MeanAbsolutePercentageError,
        P4,
        T5,
        _PAIR,
    ),
    "SymmetricMeanAbsolutePercentageError": (
        tmd.SymmetricMeanAbsolutePercentageError,
        torchmetrics.SymmetricMeanAbsolutePercentageError,
        P4,
        T5,
        _PAIR,
    ),
    "ExplainedVariance": (tmd.ExplainedVariance, torchmetrics.ExplainedVariance, P4, T5, _PAIR),
    "R2Score": (tmd.R2Score, torchmetrics.R2Score, P4, T5, _PAIR),
    "PearsonCorrCoef": (tmd.PearsonCorrCoef, torchmetrics.PearsonCorrCoef, P4, T5, _PAIR),
    "SpearmanCorrCoef": (tmd.SpearmanCorrCoef, torchmetrics.SpearmanCorrCoef, P4, T5, _PAIR),
    "CosineSimilarity": (
        tmd.CosineSimilarity,
        torchmetrics.CosineSimilarity,
        P43,
        T42,
        ("`preds`", "`target`", "(4, 3)", "(4, 2)"),
    ),
    "KLDivergence": (
        tmd.KLDivergence,
        torchmetrics.KLDivergence,
        P43.softmax(-1),
        T42.softmax(-1),
        ("`p`", "`q`", "(4, 3)", "(4, 2)"),
    ),
    "Accuracy-binary": (
        lambda: tmd.Accuracy(task="binary"),
        lambda: torchmetrics.Accuracy(task="binary"),
        P4,
        torch.randint(2, (5,)),
        _PAIR,
    ),
    "F1Score-multilabel": (
        lambda: tmd.F1Score(task="multilabel", num_labels=3),
        lambda: torchmetrics.F1Score(task="multilabel", num_labels=3),
        torch.rand(4, 3),
        torch.randint(2, (5, 3)),
        ("`preds`", "`target`", "(4, 3)", "(5, 3)"),
    ),
    "Accuracy-multiclass-labels": (
        lambda: tmd.Accuracy(task="multiclass", num_classes=3),
        lambda: torchmetrics.Accuracy(task="multiclass", num_classes=3),
        torch.randint(3, (4,)),
        torch.randint(3, (5,)),
        _PAIR,
    ),
    "ConfusionMatrix-binary": (
        lambda: tmd.ConfusionMatrix(task="binary"),
        lambda: torchmetrics.ConfusionMatrix(task="binary"),
        P4,
        torch.randint(2, (5,)),
        _PAIR,
    ),
    "AUROC-multilabel": (
        lambda: tmd.AUROC(task="multilabel", num_labels=3),
        lambda: torchmetrics.AUROC(task="multilabel", num_labels=3),
        torch.rand(4, 3),
        torch.randint(2, (5, 3)),
        ("`preds`", "`target`", "(4, 3)", "(5, 3)"),
    ),
    "AUROC-multiclass": (
        lambda: tmd.AUROC(task="multiclass", num_classes=3),
        lambda: torchmetrics.AUROC(task="multiclass", num_classes=3),
        torch.rand(4, 3),
        torch.randint(3, (5,)),
        ("`preds`", "`target`", "(4, 3)", "(5,)"),
    ),
    "AveragePrecision-binary": (
        lambda: tmd.AveragePrecision(task="binary"),
        None,
        P4,
        torch.randint(2, (5,)),
        _PAIR,
    ),
}


def _raised(make, preds, target) -> BaseException | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            make().update(preds, target)
        except Exception as err:  # the type is what is checked
            return err
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_shape_mismatch_is_caught_as_runtime_error_and_as_value_error(name: str) -> None:
    ours, _theirs, preds, target, named = CASES[name]
    with pytest.raises(RuntimeError) as as_runtime:
        ours().update(preds, target)
    with pytest.raises(ValueError) as as_value:
        ours().update(preds, target)
    for info in (as_runtime, as_value):
        assert type(info.value) is ShapeMismatchError
        message = str(info.value)
        for part in named:
            assert part in message, (part, message)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[1] is not None])
def test_caught_wherever_torchmetrics_error_is(name: str) -> None:
    """torchmetrics' error for the same inputs is a RuntimeError or a ValueError; ours is an instance of its type."""
    ours, theirs, preds, target, _named = CASES[name]
    mine, other = _raised(ours, preds, target), _raised(theirs, preds, target)
    assert mine is not None and other is not None
    for kind in (RuntimeError, ValueError):
        if isinstance(other, kind):
            assert isinstance(mine, kind), f"torchmetrics raises {type(other).__name__}, ours {type(mine).__name__}"


def test_functional_forms_raise_it_too() -> None:
    from torchmetrics_diff.functional import mean_squared_error

    with pytest.raises(RuntimeError, match=r"got preds \(4,\) and target \(5,\)"):
        mean_squared_error(P4, T5)


def test_a_loss_with_mismatched_views_raises_it() -> None:
    from torchmetrics_diff.losses import InfoNCELoss

    with pytest.raises(RuntimeError) as info:
        InfoNCELoss()(torch.randn(4, 8), torch.randn(4, 6))
    assert isinstance(info.value, ValueError) and "(4, 8)" in str(info.value) and "(4, 6)" in str(info.value)


def test_the_class_is_both_kinds() -> None:
    assert issubclass(ShapeMismatchError, ValueError) and issubclass(ShapeMismatchError, RuntimeError)
    assert ShapeMismatchError.__module__ == "torchmetrics_diff.functional._errors"
