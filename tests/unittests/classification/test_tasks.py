"""The task classes (``BinaryAccuracy``, ``MulticlassAUROC``, ...) and the classification options added with them
(multiclass and multilabel AUROC, average precision, specificity, stat scores, ``top_k``,
``multidim_average="samplewise"``) on the global batch: values equal torchmetrics' classes of the same name and
arguments on the concatenation of every rank's rows (W = 1, 2, 3, uneven batches, a rank with zero rows, two
updates per rank, and a synced ``forward``); a ``MetricCollection`` of them syncs in one collective in the steady
state; bad arguments raise naming the argument.

Every case of a world size runs in one spawned run (a loop inside the worker); the pytest process rebuilds the
global data from the same seeds and computes torchmetrics' values (importing torchmetrics costs a worker seconds).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import pytest
import torch

import torchmetrics_diff.classification as tmdc
from tests._helpers.checks import assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import bounds, seed
from torchmetrics_diff import MetricCollection

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [9, 0, 14], "uneven": [7, 2, 12]}
C, L, X = 4, 3, 3  # classes, labels, the extra dimension of the samplewise inputs


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed(*parts))


def _logits(x: torch.Tensor) -> torch.Tensor:
    """Scores none of which lies in [0, 1]: both libraries take a batch for logits when some value lies outside
    [0, 1], per batch, so every batch must be logits for the ranks' batches to agree with the one global batch."""
    return torch.where((x >= 0) & (x <= 1), x + 1.5, x)


def _data(kind: str, n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (preds, target) of one kind, from seeds every process knows."""
    g = _gen(kind, n, tag)
    if kind == "binary, ignore -1":
        target = torch.randint(0, 2, (n,), generator=g)
        target[torch.rand(n, generator=g) < 0.2] = -1
        return torch.rand(n, generator=g), target
    if kind == "binary (N, X) ties":
        return torch.randint(0, 5, (n, X), generator=g) / 4.0, torch.randint(0, 2, (n, X), generator=g)
    if kind == "multiclass logits":
        return _logits(torch.randn(n, C, generator=g)), torch.randint(0, C, (n,), generator=g)
    if kind == "multiclass logits, ignore -1, class 3 absent":
        target = torch.randint(0, C - 1, (n,), generator=g)
        target[torch.rand(n, generator=g) < 0.2] = -1
        return _logits(torch.randn(n, C, generator=g)), target
    if kind == "multiclass (N, C, X) logits":
        return _logits(torch.randn(n, C, X, generator=g)), torch.randint(0, C, (n, X), generator=g)
    if kind == "multiclass (N, X) labels":
        return torch.randint(0, C, (n, X), generator=g), torch.randint(0, C, (n, X), generator=g)
    if kind == "multilabel, label 2 never positive":
        target = torch.randint(0, 2, (n, L), generator=g)
        target[:, L - 1] = 0
        return torch.rand(n, L, generator=g), target
    if kind == "multilabel (N, L, X) ties, ignore -1":
        target = torch.randint(0, 2, (n, L, X), generator=g)
        target[torch.rand(n, L, X, generator=g) < 0.2] = -1
        return torch.randint(0, 5, (n, L, X), generator=g) / 4.0, target
    raise KeyError(kind)


class Case(NamedTuple):
    kind: str
    name: str  # the class's name, in both libraries (``torchmetrics_diff.classification``, ``torchmetrics``)
    kwargs: dict[str, Any]


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}

    def add(kind: str, name: str, **kw: Any) -> None:
        cases[f"{name}({', '.join(f'{k}={v!r}' for k, v in kw.items())}) on {kind}"] = Case(kind, name, kw)

    stat = ("Accuracy", "Precision", "Recall", "F1Score", "Specificity", "StatScores")
    for metric in (*stat, "ConfusionMatrix", "AUROC", "AveragePrecision"):
        add("binary, ignore -1", f"Binary{metric}", ignore_index=-1)
        add("multiclass logits", f"Multiclass{metric}", num_classes=C)
        add("multilabel, label 2 never positive", f"Multilabel{metric}", num_labels=L)
    for metric in stat:  # top-k, the other averages, samplewise
        add("multiclass logits", f"Multiclass{metric}", num_classes=C, top_k=2)
        add("multiclass logits, ignore -1, class 3 absent", f"Multiclass{metric}", num_classes=C, ignore_index=-1)
        add("multiclass (N, C, X) logits", f"Multiclass{metric}", num_classes=C, top_k=3, average="weighted")
        add(
            "multiclass (N, C, X) logits",
            f"Multiclass{metric}",
            num_classes=C,
            top_k=2,
            average="none",
            multidim_average="samplewise",
        )
        add("multiclass (N, X) labels", f"Multiclass{metric}", num_classes=C, average="micro")
        add("multiclass (N, X) labels", f"Multiclass{metric}", num_classes=C, multidim_average="samplewise")
        add("binary (N, X) ties", f"Binary{metric}", threshold=0.6, multidim_average="samplewise")
        add(
            "multilabel (N, L, X) ties, ignore -1",
            f"Multilabel{metric}",
            num_labels=L,
            average="weighted",
            multidim_average="samplewise",
            ignore_index=-1,
        )
        add("multilabel, label 2 never positive", f"Multilabel{metric}", num_labels=L, average="micro")
    for metric in ("AUROC", "AveragePrecision"):
        for average in ("macro", "weighted", "none"):
            add(
                "multiclass logits, ignore -1, class 3 absent",
                f"Multiclass{metric}",
                num_classes=C,
                ignore_index=-1,
                average=average,
            )
        for average in ("micro", "macro", "weighted", "none"):
            add(
                "multilabel (N, L, X) ties, ignore -1",
                f"Multilabel{metric}",
                num_labels=L,
                ignore_index=-1,
                average=average,
            )
        add("multiclass (N, C, X) logits", f"Multiclass{metric}", num_classes=C, average="none")
        add("binary (N, X) ties", f"Binary{metric}")
    add("multiclass logits", "MulticlassConfusionMatrix", num_classes=C, normalize="true")
    add("multilabel (N, L, X) ties, ignore -1", "MultilabelConfusionMatrix", num_labels=L, ignore_index=-1)
    add("multiclass (N, C, X) logits", "MulticlassPrecision", num_classes=C, zero_division=1, average="none")
    # the generic classes with the new options
    add("multiclass logits", "Specificity", task="multiclass", num_classes=C, average="macro", top_k=2)
    add("binary (N, X) ties", "Specificity", task="binary", multidim_average="samplewise")
    add("multilabel, label 2 never positive", "AveragePrecision", task="multilabel", num_labels=L, average="micro")
    add("multiclass logits", "AUROC", task="multiclass", num_classes=C, average="weighted")
    add("multiclass logits", "StatScores", task="multiclass", num_classes=C)
    add("multiclass (N, C, X) logits", "Accuracy", task="multiclass", num_classes=C, top_k=2)
    return cases


CASES = _cases()


def _members(keys: list[str], **kw: Any) -> MetricCollection:
    """The metrics of the cases ``keys`` in one collection, members ``m0``, ``m1``, ..."""
    return MetricCollection(
        {f"m{i}": getattr(tmdc, CASES[k].name)(**CASES[k].kwargs, **kw) for i, k in enumerate(keys)}
    )


def _values_body(rank: int, world: int) -> dict:
    """Per (layout, case): ``compute`` after two updates, and a ``forward`` with ``dist_sync_on_step``. The cases of
    one kind of data share a ``MetricCollection`` (one sync for all of them: the run stays short)."""
    values = {}
    by_kind: dict[str, list[str]] = {}
    for key, case in CASES.items():
        by_kind.setdefault(case.kind, []).append(key)
    for layout, all_sizes in list(LAYOUTS.items())[: 1 if world == 1 else None]:  # one rank: one layout
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        mid = (lo + hi) // 2
        for kind, keys in by_kind.items():
            preds, target = _data(kind, sum(sizes), layout)

            metrics = _members(keys)
            metrics.update(preds[lo:mid], target[lo:mid])
            metrics.update(preds[mid:hi], target[mid:hi])
            computed = metrics.compute()
            stepped = _members(keys, dist_sync_on_step=True)(preds[lo:hi], target[lo:hi])
            for i, key in enumerate(keys):
                values[(layout, key)] = (computed[f"m{i}"], stepped[f"m{i}"])
    return values


def _compare(what: str, actual: torch.Tensor, expected: torch.Tensor, failures: list[str]) -> None:
    try:
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, torchmetrics {expected.dtype}"
        torch.testing.assert_close(actual.double(), expected.double(), atol=1e-6, rtol=1e-6, equal_nan=True)
    except AssertionError as err:
        failures.append(f"{what}: {err}")


@pytest.mark.filterwarnings("ignore::UserWarning")  # both libraries' warnings for undefined classes
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_task_classes_equal_torchmetrics_on_the_global_batch(world_size: int) -> None:
    """Every task class (9 metrics x 3 tasks) and the new options (``top_k``, samplewise, the averages of the
    multiclass and multilabel AUROC and average precision, ignore_index, ties, classes without positives): the
    value after two updates per rank and a synced ``forward`` equal torchmetrics' class of the same name and
    arguments on every rank's rows, in value, shape and dtype."""
    import torchmetrics.classification as tmc

    results = run_distributed(_values_body, world_size, timeout=200)
    failures: list[str] = []
    for layout, all_sizes in list(LAYOUTS.items())[: 1 if world_size == 1 else None]:
        n = sum(all_sizes[:world_size])
        for key, case in CASES.items():
            expected = getattr(tmc, case.name)(**case.kwargs)(*_data(case.kind, n, layout))
            for rank, res in enumerate(results):
                computed, stepped = res[(layout, key)]
                _compare(f"W={world_size} [{layout}] {key} compute (rank {rank})", computed, expected, failures)
                _compare(f"W={world_size} [{layout}] {key} forward (rank {rank})", stepped, expected, failures)
    assert_no_failures(failures)


# --------------------------------------------------------------------------------------------- collectives
def _collection(cats: bool, **kw: Any) -> MetricCollection:
    members: dict[str, Any] = {
        "acc": tmdc.MulticlassAccuracy(C, average="micro", **kw),
        "acc_top2": tmdc.MulticlassAccuracy(C, top_k=2, **kw),
        "precision": tmdc.MulticlassPrecision(C, **kw),
        "recall": tmdc.MulticlassRecall(C, average="weighted", **kw),
        "f1": tmdc.MulticlassF1Score(C, **kw),
        "specificity": tmdc.MulticlassSpecificity(C, **kw),
        "stat_scores": tmdc.MulticlassStatScores(C, average="none", **kw),
        "confmat": tmdc.MulticlassConfusionMatrix(C, **kw),
        "spec_generic": tmdc.Specificity(task="multiclass", num_classes=C, top_k=2, **kw),
    }
    if cats:  # cat states: AUROC, average precision and samplewise counts
        members["auroc"] = tmdc.MulticlassAUROC(C, **kw)
        members["ap"] = tmdc.MulticlassAveragePrecision(C, average="weighted", **kw)
        members["acc_samplewise"] = tmdc.MulticlassAccuracy(C, multidim_average="samplewise", **kw)
    return MetricCollection(members)


def _count_body(rank: int, world: int) -> dict:
    sizes = [9, 0, 14][:world]
    lo, hi = bounds(sizes, rank)
    calls: dict[str, list[str]] = {}

    def measure(case: str, fn: Callable[[], Any]) -> Any:
        with record_collectives() as log:
            out = fn()
        calls[case] = list(log)
        return out

    preds, target = _data("multiclass (N, C, X) logits", sum(sizes), "collectives")
    p, t = preds[lo:hi], target[lo:hi]
    counts = _collection(cats=False, compute_with_cache=False)
    counts.update(p, t)
    measure("sum states compute, first sync", counts.compute)
    counts.update(p, t)
    measure("sum states compute", counts.compute)
    counts.update(p, t)
    measure("sum states compute again", counts.compute)
    counts = _collection(cats=False, dist_sync_on_step=True)
    measure("sum states forward, first step", lambda: counts(p, t))
    measure("sum states forward, step 2", lambda: counts(p, t))
    out = measure("sum states forward, step 3", lambda: counts(p, t))

    cats = _collection(cats=True, dist_sync_on_step=True)
    measure("with cat states forward, first step", lambda: cats(p, t))
    measure("with cat states forward, step 2", lambda: cats(p, t))
    measure("with cat states forward, step 3", lambda: cats(p, t))

    # ranks that disagree on the number of classes: every rank raises, none hangs
    errors: dict[str, str | None] = {}
    wrong = C + rank  # rank r counts C + r classes
    scores = torch.softmax(torch.randn(hi - lo, wrong, generator=_gen("mismatch", rank)), 1)
    labels = torch.zeros(hi - lo, dtype=torch.int64)
    for name, metric in (
        ("MulticlassAccuracy", tmdc.MulticlassAccuracy(wrong)),
        ("MulticlassAUROC", tmdc.MulticlassAUROC(wrong)),
    ):
        metric.update(scores, labels)
        try:
            metric.compute()
            errors[name] = None
        except RuntimeError as err:
            errors[name] = str(err)
    return {"calls": calls, "acc": out["acc"], "errors": errors}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_collection_of_task_classes_syncs_in_one_collective(world_size: int) -> None:
    """Nine task and generic classes with ``int64`` sum states (top-k included) in one ``MetricCollection``: one
    collective per ``compute`` and per synced ``forward`` in the steady state (the call's header exchange, which
    carries the packed counts), at most three more on the first sync, none at W=1. With AUROC, average precision
    and samplewise counts added (``cat`` states), the first steady ``forward`` is the header and one data gather of
    every member's rows (its header asks the group's inline area to grow), the next ones one collective again.
    Ranks that disagree on ``num_classes`` raise on every rank."""
    results = run_distributed(_count_body, world_size, timeout=120)
    problems = []
    for rank, res in enumerate(results):
        for case, log in res["calls"].items():
            steady = 2 if "cat states forward, step 2" in case else 1  # rows over the area's first size: + a gather
            allowed = 0 if world_size == 1 else (4 if "first" in case else steady)
            exact = "first" not in case
            if (len(log) != allowed if exact else len(log) > allowed) or (world_size > 1 and not log):
                problems.append(f"rank {rank} {case}: {len(log)} collectives {log} (allowed {allowed})")
    assert not problems, "\n".join(problems)
    preds, target = _data("multiclass (N, C, X) logits", sum([9, 0, 14][:world_size]), "collectives")
    expected = (preds.argmax(1) == target).double().mean()  # micro accuracy, written out
    for res in results:
        torch.testing.assert_close(res["acc"].double(), expected)
    for rank, res in enumerate(results):  # disagreeing ranks: an error on every rank (none with one rank)
        for name, error in res["errors"].items():
            if world_size == 1:
                assert error is None, f"rank {rank} {name}: {error}"
            else:
                assert error is not None, f"rank {rank} {name}: no error although ranks disagree on num_classes"
                named = all(f"rank {r}: (" in error for r in range(world_size))  # each rank's shape
                assert "ranks disagree on" in error and named, f"rank {rank} {name}: {error}"


# --------------------------------------------------------------------------------------------- bad input
BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: tmdc.MulticlassAccuracy(3, top_k=4), "`top_k` must be at most num_classes=3; got 4"),
    (lambda: tmdc.MulticlassAccuracy(3, top_k=0), "`top_k` must be a positive int; got 0"),
    (lambda: tmdc.Accuracy(task="binary", top_k=2), "`top_k` above 1 needs task='multiclass'"),
    (lambda: tmdc.BinaryRecall(multidim_average="sample"), "`multidim_average` must be one of"),
    (lambda: tmdc.MulticlassF1Score(), "`num_classes` must be a positive int"),
    (lambda: tmdc.BinaryAUROC(max_fpr=0.5), "`max_fpr` must be None"),
    (lambda: tmdc.MulticlassAUROC(3, thresholds=100), "`thresholds` must be None"),
    (lambda: tmdc.MulticlassAUROC(3, average="micro"), "`average` must be one of"),
    (lambda: tmdc.MultilabelAveragePrecision(), "`num_labels` must be a positive int"),
    (lambda: tmdc.BinaryAveragePrecision(normalization=None), "`normalization` must be 'sigmoid'"),
    (lambda: tmdc.AveragePrecision(task="multi"), "`task` must be one of"),
    (lambda: tmdc.MultilabelSpecificity(2, threshold=2.0), r"`threshold` must be a float in \[0, 1\]; got 2.0"),
    (
        lambda: tmdc.BinaryAccuracy(multidim_average="samplewise").update(torch.rand(4), torch.ones(4).long()),
        r"`preds` must have shape \(N, ...\) with 2 dims or more.*got \(4,\)",
    ),
    (
        lambda: tmdc.MulticlassAccuracy(3, top_k=2).update(torch.tensor([0, 1]), torch.tensor([0, 1])),
        r"`top_k`=2 needs `preds` scores of shape \(N, num_classes=3, ...\); got labels of shape \(2,\)",
    ),
    (
        lambda: tmdc.MulticlassAUROC(3).update(torch.rand(4, 2), torch.tensor([0, 1, 1, 2])),
        r"`preds` must have shape \(N, num_classes=3, ...\).*got \(4, 2\)",
    ),
    (
        lambda: tmdc.MulticlassAveragePrecision(3).update(torch.rand(2, 3), torch.tensor([0, 3])),
        r"`target` values must lie in \[0, 2\]; found \[3\]",
    ),
    (
        lambda: tmdc.MultilabelAUROC(2).update(torch.tensor([[0, 1]]), torch.tensor([[0, 1]])),
        "`preds` must be floating scores",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_task_classes_are_the_generic_classes_with_their_task() -> None:
    """``isinstance`` against the generic class holds, and the task class keeps torchmetrics' defaults."""
    metric = tmdc.MulticlassF1Score(5)
    assert isinstance(metric, tmdc.F1Score)
    assert (metric.task, metric.average, metric.num_classes) == ("multiclass", "macro", 5)
    assert isinstance(tmdc.BinaryAUROC(), tmdc.AUROC)
    assert tmdc.MultilabelAveragePrecision(2).average == "macro"


# ------------------------------------------------------------------------------------------------ functional
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_functional_task_forms_equal_torchmetrics() -> None:
    """Every ``binary_*``, ``multiclass_*`` and ``multilabel_*`` function and the generic ``specificity``,
    ``average_precision`` and ``auroc`` equal torchmetrics' function of the same name and arguments (value, shape
    and dtype) on ignore_index, extra dimensions, top-k and samplewise inputs."""
    import torchmetrics.functional as tmf
    import torchmetrics.functional.classification as tmfc

    import torchmetrics_diff.functional as ours

    n = 11
    inputs = {
        "binary": (*_data("binary (N, X) ties", n, "fn"), {}),
        "multiclass": (*_data("multiclass (N, C, X) logits", n, "fn"), {"num_classes": C}),
        "multilabel": (*_data("multilabel (N, L, X) ties, ignore -1", n, "fn"), {"num_labels": L}),
    }
    inputs["binary"][1][0, 0] = -1
    inputs["multiclass"][1][1, 1] = -1
    failures: list[str] = []
    for task, (preds, target, size) in inputs.items():
        options: list[dict[str, Any]] = [{}, {"multidim_average": "samplewise"}]
        if task != "binary":
            options += [{"average": "micro"}, {"average": "weighted"}, {"average": "none"}]
        if task == "multiclass":
            options += [{"top_k": 2, "average": "none"}, {"top_k": 3, "multidim_average": "samplewise"}]
        for metric in ("accuracy", "precision", "recall", "f1_score", "specificity", "stat_scores"):
            name = f"{task}_{metric}"
            for kw in options:
                args = {**size, **kw, "ignore_index": -1}
                expected = getattr(tmfc, name)(preds, target, **args)
                _compare(f"{name}({kw})", getattr(ours, name)(preds, target, **args), expected, failures)
        for normalize in (None, "true"):
            name = f"{task}_confusion_matrix"
            expected = getattr(tmfc, name)(preds, target, **size, normalize=normalize, ignore_index=-1)
            actual = getattr(ours, name)(preds, target, **size, normalize=normalize, ignore_index=-1)
            _compare(f"{name}(normalize={normalize})", actual, expected, failures)
        averages = ("macro", "weighted", "none", *(("micro",) if task == "multilabel" else ()))
        for metric in ("auroc", "average_precision"):
            for average in averages if task != "binary" else ("macro",):
                kw = (
                    {**size, "ignore_index": -1}
                    if task == "binary"
                    else {**size, "average": average, "ignore_index": -1}
                )
                name = f"{task}_{metric}"
                _compare(
                    f"{name}({kw})",
                    getattr(ours, name)(preds, target, **kw),
                    getattr(tmfc, name)(preds, target, **kw),
                    failures,
                )
                generic = {**kw, "task": task}
                _compare(
                    f"{metric}({generic})",
                    getattr(ours, metric)(preds, target, **generic),
                    getattr(tmf, metric)(preds, target, **generic),
                    failures,
                )
        generic = {**size, "task": task, "average": "macro", "top_k": 1, "ignore_index": -1}
        _compare(
            f"specificity({generic})",
            ours.specificity(preds, target, **generic),
            tmf.specificity(preds, target, **generic),
            failures,
        )
    assert_no_failures(failures)
