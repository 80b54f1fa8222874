"""Classification metrics on the global batch: values equal torchmetrics on the concatenation of every rank's rows
(W = 1, 2, 3, uneven batches, a rank with zero rows; binary, multiclass, multilabel; micro/macro/weighted/none;
ignore_index; zero-division cases), and a ``MetricCollection`` of the stat-score metrics syncs in one collective.

Workers compute our values; the pytest process rebuilds the global data from the same seeds and computes
torchmetrics' (importing torchmetrics costs each worker seconds).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import pytest
import torch

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import bounds, seed
from torchmetrics_diff import AUROC, Accuracy, ConfusionMatrix, F1Score, Metric, MetricCollection, Precision, Recall

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [9, 0, 14], "uneven": [7, 2, 12]}
C, L = 4, 3  # classes (class 3 is never a target nor a prediction), labels (label 2 never positive)


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed(*parts))


def _logits(x: torch.Tensor) -> torch.Tensor:
    """Scores none of which lies in [0, 1]: like torchmetrics, a batch is taken for logits (and goes through a
    sigmoid) only when some value lies outside [0, 1], so a small batch of in-range logits would be read as
    probabilities by both libraries, per batch, and differ from the one global batch of the reference."""
    return torch.where((x >= 0) & (x <= 1), x + 1.5, x)


def _data(kind: str, n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (preds, target) of one kind, from seeds every process knows."""
    g = _gen(kind, n, tag)
    if kind == "binary probs":
        return torch.rand(n, generator=g), torch.randint(0, 2, (n,), generator=g)
    if kind == "binary logits, ignore -1":
        target = torch.randint(0, 2, (n,), generator=g)
        target[torch.rand(n, generator=g) < 0.2] = -1
        return _logits(3 * torch.randn(n, generator=g)), target
    if kind == "binary, no positive prediction":  # precision's 0/0
        return 0.1 * torch.rand(n, generator=g), torch.randint(0, 2, (n,), generator=g)
    if kind == "binary ties":
        return torch.randint(0, 4, (n,), generator=g) / 4.0, torch.randint(0, 2, (n,), generator=g)
    if kind == "multiclass scores":
        scores = torch.randn(n, C, generator=g)
        scores[:, C - 1] = -1e9  # never predicted
        return scores, torch.randint(0, C - 1, (n,), generator=g)
    if kind == "multiclass labels, ignore 1":
        return torch.randint(0, C, (n,), generator=g), torch.randint(0, C, (n,), generator=g)
    if kind == "multiclass (N, C, 2) scores":
        return torch.randn(n, C, 2, generator=g), torch.randint(0, C, (n, 2), generator=g)
    if kind == "multilabel":
        target = torch.randint(0, 2, (n, L), generator=g)
        target[:, L - 1] = 0
        preds = torch.rand(n, L, generator=g)
        preds[:, L - 1] = 0.2  # label 2: never positive, never predicted (0/0 everywhere)
        return preds, target
    if kind == "multilabel, ignore -1":
        target = torch.randint(0, 2, (n, L), generator=g)
        target[torch.rand(n, L, generator=g) < 0.2] = -1
        return _logits(torch.randn(n, L, generator=g)), target
    raise KeyError(kind)


class Case(NamedTuple):
    kind: str
    build: Callable[[], Metric]
    reference: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]  # (torchmetrics.functional, preds, target)


def _stat_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    scores = {"Accuracy": Accuracy, "Precision": Precision, "Recall": Recall, "F1Score": F1Score}
    fn_names = {"Accuracy": "accuracy", "Precision": "precision", "Recall": "recall", "F1Score": "f1_score"}

    def add(name: str, kind: str, cls: type, ref_name: str, **kw: Any) -> None:
        cases[name] = Case(kind, lambda: cls(**kw), lambda tmf, p, t: getattr(tmf, ref_name)(p, t, **kw))

    for metric, cls in scores.items():
        ref = fn_names[metric]
        add(f"{metric} binary", "binary probs", cls, ref, task="binary", threshold=0.4)
        add(f"{metric} binary logits ignore", "binary logits, ignore -1", cls, ref, task="binary", ignore_index=-1)
        for avg in ("micro", "macro", "weighted", "none"):
            add(
                f"{metric} multiclass {avg}",
                "multiclass scores",
                cls,
                ref,
                task="multiclass",
                num_classes=C,
                average=avg,
            )
            add(f"{metric} multilabel {avg}", "multilabel", cls, ref, task="multilabel", num_labels=L, average=avg)
        add(
            f"{metric} multiclass labels macro ignore",
            "multiclass labels, ignore 1",
            cls,
            ref,
            task="multiclass",
            num_classes=C,
            average="macro",
            ignore_index=1,
        )
        add(f"{metric} multiclass extra dim", "multiclass (N, C, 2) scores", cls, ref, task="multiclass", num_classes=C)
        add(
            f"{metric} multilabel ignore",
            "multilabel, ignore -1",
            cls,
            ref,
            task="multilabel",
            num_labels=L,
            average="macro",
            ignore_index=-1,
        )
    for zd in (0, 1):
        add(
            f"Precision 0/0 zero_division={zd}",
            "binary, no positive prediction",
            Precision,
            "precision",
            task="binary",
            zero_division=zd,
        )
        add(
            f"Recall multilabel none 0/0 zero_division={zd}",
            "multilabel",
            Recall,
            "recall",
            task="multilabel",
            num_labels=L,
            average="none",
            zero_division=zd,
        )
        add(
            f"F1 multilabel macro 0/0 zero_division={zd}",
            "multilabel",
            F1Score,
            "f1_score",
            task="multilabel",
            num_labels=L,
            average="macro",
            zero_division=zd,
        )
    for normalize in (None, "true", "pred", "all"):
        add(
            f"ConfusionMatrix multiclass {normalize}",
            "multiclass scores",
            ConfusionMatrix,
            "confusion_matrix",
            task="multiclass",
            num_classes=C,
            normalize=normalize,
        )
    add(
        "ConfusionMatrix binary",
        "binary logits, ignore -1",
        ConfusionMatrix,
        "confusion_matrix",
        task="binary",
        ignore_index=-1,
    )
    add(
        "ConfusionMatrix multilabel", "multilabel", ConfusionMatrix, "confusion_matrix", task="multilabel", num_labels=L
    )
    add("AUROC", "binary probs", AUROC, "auroc", task="binary")
    add("AUROC logits ignore", "binary logits, ignore -1", AUROC, "auroc", task="binary", ignore_index=-1)
    add("AUROC ties", "binary ties", AUROC, "auroc", task="binary")
    return cases


CASES = _stat_cases()


def _values_body(rank: int, world: int) -> dict:
    """Per (layout, case): ``compute`` after two updates, and a ``forward`` with ``dist_sync_on_step``."""
    values = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        mid = (lo + hi) // 2
        for name, case in CASES.items():
            preds, target = _data(case.kind, sum(sizes), layout)
            metric = case.build()
            metric.update(preds[lo:mid], target[lo:mid])
            metric.update(preds[mid:hi], target[mid:hi])
            stepper = case.build()
            stepper.dist_sync_on_step = True
            values[(layout, name)] = (metric.compute(), stepper(preds[lo:hi], target[lo:hi]))
    return values


@pytest.mark.filterwarnings("ignore::UserWarning")  # torchmetrics' and our 0/0 and NaN-normalization warnings
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_torchmetrics_on_the_global_batch(world_size: int) -> None:
    """Accuracy, Precision, Recall, F1 (binary, multiclass, multilabel; micro/macro/weighted/none; ignore_index;
    zero_division 0 and 1), ConfusionMatrix (normalizations) and exact AUROC (ties, logits): ``compute`` after
    two updates and a synced ``forward`` equal torchmetrics' functions on every rank's rows."""
    import torchmetrics.functional as tmf

    results = run_distributed(_values_body, world_size, timeout=180)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for name, case in CASES.items():
            expected = case.reference(tmf, *_data(case.kind, n, layout))
            for rank, res in enumerate(results):
                computed, stepped = res[(layout, name)]
                checks.close(f"[{layout}] {name} compute (rank {rank})", computed, expected, atol=1e-6, rtol=1e-6)
                checks.close(f"[{layout}] {name} forward (rank {rank})", stepped, expected, atol=1e-6, rtol=1e-6)
    assert_no_failures(checks.failures)


# --------------------------------------------------------------------------------------------- collectives
def _collection(**kw: Any) -> MetricCollection:
    return MetricCollection(
        {
            "acc": Accuracy(task="multiclass", num_classes=C, **kw),
            "acc_macro": Accuracy(task="multiclass", num_classes=C, average="macro", **kw),
            "precision": Precision(task="multiclass", num_classes=C, average="macro", **kw),
            "recall": Recall(task="multiclass", num_classes=C, average="macro", **kw),
            "f1": F1Score(task="multiclass", num_classes=C, average="macro", **kw),
            "confmat": ConfusionMatrix(task="multiclass", num_classes=C, **kw),
        }
    )


def _count_body(rank: int, world: int) -> dict:
    sizes = [9, 0, 14][:world]
    lo, hi = bounds(sizes, rank)
    preds, target = _data("multiclass scores", sum(sizes), "collectives")
    calls: dict[str, list[str]] = {}
    coll = _collection(dist_sync_on_step=True)
    coll.update(preds[lo:hi], target[lo:hi])
    for case in ("compute, first sync", "compute", "compute again"):
        with record_collectives() as log:
            out = coll.compute()
        calls[case] = list(log)
    for case in ("forward, first step", "forward, step 2"):
        with record_collectives() as log:
            coll(preds[lo:hi], target[lo:hi])
        calls[case] = list(log)
    with_auroc = MetricCollection(
        {
            "acc": Accuracy(task="binary"),
            "f1": F1Score(task="binary"),
            "auroc": AUROC(),
            "cm": ConfusionMatrix("binary"),
        }
    )
    binary = (preds[:, 0] > 0).long()
    with_auroc.update(torch.sigmoid(preds[lo:hi, 1]), binary[lo:hi])
    for case in ("with AUROC (cat states), first sync", "with AUROC (cat states)"):
        with record_collectives() as log:
            with_auroc.compute()
        calls[case] = list(log)
    return {"calls": calls, "acc": out["acc"]}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_collection_of_stat_score_metrics_syncs_in_one_data_collective(world_size: int) -> None:
    """Six stat-score metrics (int64 ``sum`` states) in a ``MetricCollection``: the call's header exchange and one
    data collective per ``compute`` and per synced ``forward`` once the plan is agreed (at most one more on the first
    sync), none at W=1; with AUROC's ``cat`` states added, still one data collective in the steady state."""
    results = run_distributed(_count_body, world_size, timeout=120)
    problems = []
    for rank, res in enumerate(results):
        for case, log in res["calls"].items():
            allowed = 0 if world_size == 1 else (3 if "first" in case else 2)
            if len(log) > allowed or (world_size > 1 and not log):
                problems.append(f"rank {rank} {case}: {len(log)} collectives {log} (allowed {allowed})")
    assert not problems, "\n".join(problems)
    preds, target = _data("multiclass scores", sum([9, 0, 14][:world_size]), "collectives")
    expected = (preds.argmax(1) == target).double().mean()  # micro accuracy, written out
    for res in results:
        torch.testing.assert_close(res["acc"].double(), expected)


# --------------------------------------------------------------------------------------------- bad input
BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: Accuracy(task="binaryy"), "`task` must be one of"),
    (lambda: Accuracy(task="multiclass"), "`num_classes` must be a positive int"),
    (lambda: Accuracy(task="multilabel", num_labels=0), "`num_labels` must be a positive int; got 0"),
    (lambda: Precision(task="binary", threshold=1.5), r"`threshold` must be a float in \[0, 1\]; got 1.5"),
    (lambda: Recall(task="multiclass", num_classes=3, average="samples"), "`average` must be one of"),
    (lambda: F1Score(task="binary", zero_division=0.5), "`zero_division` must be 0 or 1; got 0.5"),
    (lambda: Accuracy(task="multiclass", num_classes=3, top_k=4), "`top_k` must be at most num_classes=3; got 4"),
    (lambda: ConfusionMatrix(task="binary", normalize="rows"), "`normalize` must be one of"),
    (lambda: AUROC(task="multiclass"), "`num_classes` must be a positive int for task='multiclass'; got None"),
    (
        lambda: Accuracy(task="binary").update(torch.rand(4), torch.tensor([0, 1, 2, 1])),
        r"`target` values must lie in \[0, 1\]; found \[2\]",
    ),
    (
        lambda: Accuracy(task="binary").update(torch.rand(4), torch.tensor([0, 1, 1])),
        r"same shape; got preds \(4,\) and target \(3,\)",
    ),
    (
        lambda: Accuracy(task="multiclass", num_classes=3).update(torch.rand(4, 5), torch.tensor([0, 1, 1, 2])),
        r"num_classes=3.*got \(4, 5\)",
    ),
    (
        lambda: Accuracy(task="multiclass", num_classes=3).update(torch.tensor([0, 1, 3]), torch.tensor([0, 1, 1])),
        r"`preds` values must lie in \[0, 2\]; found \[3\]",
    ),
    (
        lambda: Accuracy(task="multiclass", num_classes=3).update(torch.rand(3, 3), torch.tensor([0.0, 1.0, 1.0])),
        "`target` must hold integer labels; got dtype torch.float32",
    ),
    (
        lambda: F1Score(task="multilabel", num_labels=3).update(torch.rand(4, 2), torch.ones(4, 2, dtype=torch.long)),
        r"num_labels=3.*got \(4, 2\)",
    ),
    (
        lambda: AUROC().update(torch.tensor([0, 1]), torch.tensor([0, 1])),
        "`preds` must be floating scores",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
