"""NaN scores in AUROC and average precision: ``nan_strategy``, for the classes and the functions of every task.

A NaN score has no rank. ``"error"`` (the default) raises a ``ValueError`` naming the metric, ``preds``, the count
and the way out; ``"warn"`` warns once, with the count, and drops what holds the NaN (a binary sample, a
multiclass sample with any NaN class score, a multilabel ``(sample, label)`` entry); ``"ignore"`` drops it
silently; ``"disable"`` checks nothing. The value after dropping must equal torchmetrics' value on the data with
those samples (entries) removed: the independent reference. Infinite scores are ranked, never dropped. At W=2
with the NaNs on rank 1 only, every rank raises (``"error"``) or gets the NaN-free global value (``"ignore"``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import torchmetrics_diff.functional as F
from tests._helpers.harness import run_distributed
from torchmetrics_diff import AUROC, AveragePrecision
from torchmetrics_diff import classification as C

tm = pytest.importorskip("torchmetrics.functional.classification")

pytestmark = pytest.mark.timeout(240)

N, CLASSES, LABELS = 60, 4, 3
NAN_ROWS = (30, 41, 55)  # every NaN sits at or after row 25: rank 0's rows in the distributed case are NaN-free
TASKS = ("binary", "multiclass", "multilabel")
CURVES = ("auroc", "average_precision")
AVERAGES = {"binary": [None], "multiclass": ["macro", "weighted", "none"], "multilabel": ["macro", "micro", "none"]}
CASES = [(task, curve, avg) for task in TASKS for curve in CURVES for avg in AVERAGES[task]]


def _ids(case: tuple) -> str:
    return "-".join(str(x) for x in case)


def _data(task: str, logits: bool = False, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Scores with NaNs in rows ``NAN_ROWS`` (two in one multiclass/multilabel row), targets, and the number of
    units that hold a NaN (samples; multilabel: entries)."""
    g = torch.Generator().manual_seed(seed)
    if task == "binary":
        preds, target = torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g)
        preds[list(NAN_ROWS)] = float("nan")
        count = len(NAN_ROWS)
    else:
        width = CLASSES if task == "multiclass" else LABELS
        preds = torch.rand(N, width, generator=g)
        if task == "multiclass":
            target = torch.randint(0, CLASSES, (N,), generator=g)
        else:
            target = torch.randint(0, 2, (N, LABELS), generator=g)
        where = [(NAN_ROWS[0], 1), (NAN_ROWS[1], 0), (NAN_ROWS[1], 2), (NAN_ROWS[2], 2)]
        for r, c in where:
            preds[r, c] = float("nan")
        count = len(NAN_ROWS) if task == "multiclass" else len(where)
    if logits:
        preds = (preds - 0.5) * 8  # outside [0, 1]: a sigmoid (softmax) first, as torchmetrics
    return preds, target, count


def _size(task: str) -> dict[str, Any]:
    return {"binary": {}, "multiclass": {"num_classes": CLASSES}, "multilabel": {"num_labels": LABELS}}[task]


def _reference(curve: str, task: str, average: str | None, preds: torch.Tensor, target: torch.Tensor) -> Any:
    """torchmetrics on the NaN-free data: binary and multiclass samples removed, multilabel entries ignored."""
    fn = getattr(tm, f"{task}_{curve}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if task == "binary":
            keep = ~torch.isnan(preds)
            return fn(preds[keep], target[keep])
        if task == "multiclass":
            keep = ~torch.isnan(preds).any(1)
            return fn(preds[keep], target[keep], CLASSES, average=average)
        nan = torch.isnan(preds)
        # an ignored entry: its score is irrelevant (0.5 keeps probabilities probabilities), its target -1
        return fn(preds.nan_to_num(0.5), torch.where(nan, -1, target), LABELS, average=average, ignore_index=-1)


def _class(task: str, curve: str, average: str | None, generic: bool, **kwargs: Any) -> Any:
    opts = {**_size(task), **({} if average is None else {"average": average}), **kwargs}
    if generic:
        return (AUROC if curve == "auroc" else AveragePrecision)(task=task, **opts)
    name = task.capitalize() + ("AUROC" if curve == "auroc" else "AveragePrecision")
    return getattr(C, name)(**opts)


def _class_value(task: str, curve: str, average: str | None, preds: torch.Tensor, target: torch.Tensor, **kw: Any):
    metric = _class(task, curve, average, generic=False, **kw)
    metric.update(preds[:25], target[:25])
    metric.update(preds[25:], target[25:])
    return metric.compute()


def _function_value(task: str, curve: str, average: str | None, preds: torch.Tensor, target: torch.Tensor, **kw: Any):
    opts = {**_size(task), **({} if average is None else {"average": average}), **kw}
    return getattr(F, f"{task}_{curve}")(preds, target, **opts)


def _nan_warnings(caught: list) -> list[str]:
    return [str(w.message) for w in caught if "NaN" in str(w.message)]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want.double(), atol=1e-6, rtol=0, equal_nan=True)


# ------------------------------------------------------------------------------------------------ "error"
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_error_is_the_default_and_names_metric_argument_count_and_way_out(case: tuple) -> None:
    task, curve, average = case
    preds, target, count = _data(task)
    units = "(sample, label) entries" if task == "multilabel" else "samples"
    total = preds.numel() if task != "multiclass" else N
    name = task.capitalize() + ("AUROC" if curve == "auroc" else "AveragePrecision")
    with pytest.raises(ValueError, match=rf"^{name}: `preds` holds NaN scores in {count} of {total} ") as err:
        _class_value(task, curve, average, preds, target)
    assert units in str(err.value) and "nan_strategy='ignore'" in str(err.value)
    with pytest.raises(ValueError, match=rf"^{task}_{curve}: `preds` holds NaN scores in {count} of {total} "):
        _function_value(task, curve, average, preds, target)
    generic = "auroc" if curve == "auroc" else "average_precision"
    with pytest.raises(ValueError, match=rf"^{generic}: .*nan_strategy='ignore'"):
        getattr(F, generic)(preds, target, task=task, **_size(task))


def test_error_comes_from_compute_and_leaves_the_states_usable() -> None:
    """``update`` takes the NaN rows; ``compute`` raises, every time, until ``reset``."""
    preds, target, _ = _data("binary")
    metric = C.BinaryAUROC()
    metric.update(preds, target)  # no error here: the check runs where every rank's rows are together
    for _ in range(2):
        with pytest.raises(ValueError, match="BinaryAUROC"):
            metric.compute()
    metric.reset()
    keep = ~torch.isnan(preds)
    metric.update(preds[keep], target[keep])
    _close(metric.compute(), tm.binary_auroc(preds[keep], target[keep]))


# ------------------------------------------------------------------------------------ "warn" and "ignore"
@pytest.mark.parametrize("logits", [False, True], ids=["probabilities", "logits"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_warn_warns_once_with_the_count_and_equals_torchmetrics_without_the_nans(case: tuple, logits: bool) -> None:
    task, curve, average = case
    preds, target, count = _data(task, logits)
    want = _reference(curve, task, average, preds, target)
    for value_of in (_class_value, _function_value):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = value_of(task, curve, average, preds, target, nan_strategy="warn")
        messages = _nan_warnings(caught)
        assert len(messages) == 1, messages
        assert f"dropped {count} of " in messages[0] and "nan_strategy='warn'" in messages[0], messages[0]
        _close(got, want)


@pytest.mark.parametrize("logits", [False, True], ids=["probabilities", "logits"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_ignore_is_silent_and_equals_torchmetrics_without_the_nans(case: tuple, logits: bool) -> None:
    task, curve, average = case
    preds, target, _ = _data(task, logits)
    want = _reference(curve, task, average, preds, target)
    for value_of in (_class_value, _function_value):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = value_of(task, curve, average, preds, target, nan_strategy="ignore")
        assert not _nan_warnings(caught)
        _close(got, want)


def test_generic_classes_take_the_policy_too() -> None:
    preds, target, _ = _data("multiclass")
    want = _reference("auroc", "multiclass", "macro", preds, target)
    metric = _class("multiclass", "auroc", "macro", generic=True, nan_strategy="ignore")
    metric.update(preds, target)
    _close(metric.compute(), want)
    with pytest.raises(ValueError, match=r"^AveragePrecision: `preds` holds NaN scores in 3 of 60 samples"):
        metric = _class("multiclass", "average_precision", "macro", generic=True)
        metric.update(preds, target)
        metric.compute()


def test_forward_drops_without_warning_and_compute_reports_every_batch() -> None:
    """``forward``'s batch value drops the NaNs silently under ``"warn"``; ``compute`` warns once, with the count
    of every batch."""
    preds, target, _ = _data("binary")
    metric = C.BinaryAveragePrecision(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = metric(preds[25:], target[25:])
        metric(preds[:25], target[:25])
        assert not _nan_warnings(caught)
        value = metric.compute()
    messages = _nan_warnings(caught)
    assert len(messages) == 1 and "dropped 3 of 60 samples" in messages[0], messages
    keep = ~torch.isnan(preds)
    _close(value, tm.binary_average_precision(preds[keep], target[keep]))
    tail, tail_keep = slice(25, None), keep[25:]
    _close(batch, tm.binary_average_precision(preds[tail][tail_keep], target[tail][tail_keep]))


def test_forward_with_error_raises_and_keeps_the_accumulated_states() -> None:
    preds, target, _ = _data("binary")
    metric = C.BinaryAUROC()
    metric(preds[:25], target[:25])
    with pytest.raises(ValueError, match="BinaryAUROC: `preds` holds NaN scores in 3 of 35 samples"):
        metric(preds[25:], target[25:])
    _close(metric.compute(), tm.binary_auroc(preds[:25], target[:25]))  # the failed batch was not kept


def test_disable_checks_nothing() -> None:
    preds, target, _ = _data("multiclass")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = F.multiclass_auroc(preds, target, CLASSES, nan_strategy="disable")
    assert not _nan_warnings(caught) and value.shape == ()


def test_every_sample_nan_is_a_metric_without_samples() -> None:
    """All dropped: the value of no samples (torchmetrics' 0 with its warning for AUROC)."""
    preds, target = torch.full((4,), float("nan")), torch.tensor([0, 1, 0, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = F.binary_auroc(preds, target, nan_strategy="ignore")
    assert value == 0 and any("undefined" in str(w.message) for w in caught)


@pytest.mark.parametrize("bad", ["raise", None, 0.0, "Error"])
def test_unknown_strategy_is_refused_naming_the_argument(bad: Any) -> None:
    with pytest.raises(ValueError, match="`nan_strategy` must be one of"):
        C.BinaryAUROC(nan_strategy=bad)
    with pytest.raises(ValueError, match="`nan_strategy` must be one of"):
        F.multiclass_average_precision(torch.rand(3, 2), torch.tensor([0, 1, 1]), 2, nan_strategy=bad)


# ------------------------------------------------------------------------------------------ infinite scores
@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_infinite_logits_are_ranked_not_dropped(task: str, curve: str) -> None:
    """±inf logits go through the sigmoid to 1 and 0: ranked, never counted as NaN (no error by default)."""
    preds, target, _ = _data(task, logits=True)
    preds = torch.nan_to_num(preds, nan=0.0)
    flat = preds.view(-1)
    flat[[3, 11]], flat[[7, 20]] = float("inf"), float("-inf")
    got = _function_value(task, curve, "macro" if task == "multilabel" else None, preds, target)
    want = _reference(curve, task, "macro" if task == "multilabel" else None, preds, target)
    _close(got, want)


@pytest.mark.parametrize("curve", CURVES)
def test_infinite_multiclass_logits_take_the_softmax_limit(curve: str) -> None:
    """A row whose largest logit is +inf has the softmax's limit (the mass shared by its +inf entries; torch's
    softmax gives NaN there); -inf logits are 0 probability; nothing is dropped, nothing raises."""
    preds, target, _ = _data("multiclass", logits=True)
    preds = torch.nan_to_num(preds, nan=0.0)
    preds[3, 1] = float("inf")
    preds[5, [0, 2]] = float("inf")
    preds[7, 3] = float("-inf")
    probs = torch.softmax(preds.clamp(-1e3, 1e3), 1)  # the limit, computed independently
    probs[3], probs[5] = torch.tensor([0.0, 1.0, 0.0, 0.0]), torch.tensor([0.5, 0.0, 0.5, 0.0])
    for average in ("macro", "none"):
        got = _function_value("multiclass", curve, average, preds, target)
        _close(got, getattr(tm, f"multiclass_{curve}")(probs, target, CLASSES, average=average))


# ---------------------------------------------------------------------------------------- torch.compile
def test_compiled_forward_raises_by_device_assertion_and_ignore_drops_in_one_graph() -> None:
    preds, target, _ = _data("binary")
    torch._dynamo.reset()
    metric = C.BinaryAUROC()
    with pytest.raises(RuntimeError, match="BinaryAUROC: `preds` holds NaN scores"):
        torch.compile(lambda *a: metric(*a), backend="eager", fullgraph=True)(preds, target)
    metric = C.BinaryAUROC(nan_strategy="ignore")
    value = torch.compile(lambda *a: metric(*a), backend="eager", fullgraph=True)(preds, target)
    torch._dynamo.reset()
    keep = ~torch.isnan(preds)
    _close(value, tm.binary_auroc(preds[keep], target[keep]))


# ------------------------------------------------------------------------------------------- distributed
def _distributed_body(rank: int, world: int, strategy: str) -> dict[str, Any]:
    """Rank 0 holds rows ``[0, 25)`` (no NaN), rank 1 rows ``[25, 60)`` (every NaN)."""
    rows = slice(0, 25) if rank == 0 else slice(25, N)
    out: dict[str, Any] = {}
    for task, curve, average in [("multiclass", "auroc", "macro"), ("multilabel", "average_precision", "macro")]:
        preds, target, _ = _data(task)
        metric = _class(task, curve, average, generic=False, nan_strategy=strategy)
        metric.update(preds[rows], target[rows])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out[task] = ("value", metric.compute())
            except ValueError as err:
                out[task] = ("raised", str(err))
        out[task + " warnings"] = _nan_warnings(caught)
    preds, target, _ = _data("binary")
    metric = C.BinaryAUROC(nan_strategy=strategy, dist_sync_on_step=True)  # forward's value: the global batch
    try:
        out["forward"] = ("value", metric(preds[rows], target[rows]))
    except ValueError as err:
        out["forward"] = ("raised", str(err))
    return out


@pytest.mark.parametrize("strategy", ["error", "warn", "ignore"])
def test_nans_on_one_rank_give_the_same_outcome_on_every_rank(strategy: str) -> None:
    results = run_distributed(_distributed_body, 2, strategy, timeout=180)
    for task, curve, name in [("multiclass", "auroc", "MulticlassAUROC"), ("multilabel", "average_precision", None)]:
        preds, target, count = _data(task)
        name = name or "MultilabelAveragePrecision"
        want = _reference(curve, task, "macro", preds, target)
        for rank, res in enumerate(results):
            kind, value = res[task]
            if strategy == "error":
                assert kind == "raised" and value.startswith(f"{name}: `preds` holds NaN scores in {count} of "), (
                    rank,
                    value,
                )
                continue
            assert kind == "value", (rank, value)
            _close(value, want)
            warned = res[task + " warnings"]
            assert len(warned) == (strategy == "warn"), (rank, warned)
            assert strategy == "ignore" or f"dropped {count} of " in warned[0]
    preds, target, count = _data("binary")
    keep = ~torch.isnan(preds)
    for rank, res in enumerate(results):
        kind, value = res["forward"]
        if strategy == "error":
            assert kind == "raised" and value.startswith(f"BinaryAUROC: `preds` holds NaN scores in {count} of 60 "), (
                rank,
                value,
            )
        else:
            assert kind == "value", (rank, value)
            _close(value, tm.binary_auroc(preds[keep], target[keep]))
