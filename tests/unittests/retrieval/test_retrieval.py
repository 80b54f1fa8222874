"""Cross-modal retrieval over the global gallery: recall@k, mean/median rank and mAP@k equal a brute-force
reference (python loops over the full score matrix, written here; AP per query from torchmetrics'
``retrieval_average_precision``; means and medians from numpy) on every rank's rows, at W = 1, 2, 3 with uneven
batches and a rank without rows, with and without multi-positive labels, for chunk sizes smaller and larger than
the gallery; and the steady-state ``compute`` syncs the cat states in one collective.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import bounds, rand, seed
from torchmetrics_diff import (
    CrossModalMAPAtK,
    CrossModalMeanRank,
    CrossModalMedianRank,
    CrossModalRecallAtK,
    Metric,
)
from torchmetrics_diff.functional import retrieval_recall_at_k

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [6, 0, 9], "uneven": [5, 3, 4]}
DIM, KS, AP_K = 6, (1, 3, 5), 4

METRICS: dict[str, Callable[[int], Metric]] = {
    "recall": lambda chunk: CrossModalRecallAtK(top_k=KS, chunk_size=chunk),
    "mean rank": lambda chunk: CrossModalMeanRank(chunk_size=chunk),
    "median rank": lambda chunk: CrossModalMedianRank(chunk_size=chunk),
    "mAP": lambda chunk: CrossModalMAPAtK(top_k=AP_K, chunk_size=chunk),
    "recall, raw dot products, i2t only": lambda chunk: CrossModalRecallAtK(
        top_k=KS, chunk_size=chunk, normalize=False, directions=("i2t",)
    ),
}


def _data(n: int, tag: str, labelled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    image = rand((n, DIM), tag, "image")
    text = image + 1.2 * rand((n, DIM), tag, "text")  # related but noisy: ranks spread over 1..n
    labels = None
    if labelled:
        labels = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(seed(tag, "labels")))
    return image, text, labels


def _reference(image: torch.Tensor, text: torch.Tensor, labels: torch.Tensor | None, normalize: bool) -> dict:
    """Per direction: every query's rank (ties against the query) and AP@AP_K, by brute force."""
    from torchmetrics.functional.retrieval import retrieval_average_precision

    if normalize:
        image, text = image / image.norm(dim=1, keepdim=True), text / text.norm(dim=1, keepdim=True)
    n = image.shape[0]
    out = {}
    for direction, (queries, gallery) in {"i2t": (image, text), "t2i": (text, image)}.items():
        scores = queries @ gallery.T
        ranks, aps = [], []
        for i in range(n):
            pos = {i} | ({j for j in range(n) if labels[j] == labels[i]} if labels is not None else set())
            best = max(float(scores[i, j]) for j in pos)
            ranks.append(1 + sum(1 for j in range(n) if j not in pos and float(scores[i, j]) >= best))
            target = torch.tensor([j in pos for j in range(n)])
            # shifted above 0: torchmetrics counts an item with a score <= 0 as not relevant, which a cosine
            # ranking must not do (the ranking, and so AP, must not depend on the scores' sign)
            shifted = scores[i] - scores[i].min() + 1
            aps.append(float(retrieval_average_precision(shifted, target, top_k=AP_K)))
        out[direction] = (np.array(ranks), np.array(aps))
    return out


def _expected(name: str, ref: dict) -> dict[str, float]:
    directions = ("i2t",) if "i2t only" in name else ("i2t", "t2i")
    out: dict[str, float] = {}
    for d in directions:
        ranks, aps = ref[d]
        if name.startswith("recall"):
            out.update({f"{d}_R@{k}": float(np.mean(ranks <= k)) for k in KS})
        elif name == "mean rank":
            out[f"{d}_mean_rank"] = float(np.mean(ranks))
        elif name == "median rank":
            out[f"{d}_median_rank"] = float(np.median(ranks))
        else:
            out[f"{d}_mAP@{AP_K}"] = float(np.mean(aps))
    return out


def _body(rank: int, world: int) -> dict:
    values: dict = {}
    calls: dict[str, list[str]] = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        mid = (lo + hi) // 2
        for labelled in (False, True):
            image, text, labels = _data(sum(sizes), layout, labelled)
            local_labels = (None, None) if labels is None else (labels[lo:mid], labels[mid:hi])
            for name, build in METRICS.items():
                for chunk in (2, 1000):
                    metric = build(chunk)
                    metric.update(image[lo:mid], text[lo:mid], local_labels[0])
                    metric.update(image[mid:hi], text[mid:hi], local_labels[1])
                    values[(layout, labelled, name, chunk)] = metric.compute()
                    with record_collectives() as log:
                        again = metric.compute()
                    calls[f"[{layout}] labels={labelled} {name} chunk={chunk}: second compute"] = list(log)
                    values[(layout, labelled, name, chunk, "again")] = again
    # the functional twin on the global rows, in this process
    image, text, labels = _data(sum(LAYOUTS["uneven"][:world]), "uneven", True)
    values["functional"] = retrieval_recall_at_k(image, text, labels, top_k=KS, chunk_size=3)
    return {"values": values, "calls": calls}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_brute_force_over_the_global_gallery(world_size: int) -> None:
    """Recall@k (both directions, raw dot products too), mean and median rank and mAP@k over every rank's pairs
    equal the brute-force reference, with and without labels, with chunks smaller than the gallery; a repeated
    ``compute`` costs one collective (the cat states' agreed capacity)."""
    results = run_distributed(_body, world_size, timeout=180)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for labelled in (False, True):
            image, text, labels = _data(n, layout, labelled)
            refs = {norm: _reference(image, text, labels, norm) for norm in (True, False)}
            for name in METRICS:
                expected = _expected(name, refs["raw dot" not in name])
                for chunk in (2, 1000):
                    for rank, res in enumerate(results):
                        for again in ((), ("again",)):
                            got = res["values"][(layout, labelled, name, chunk, *again)]
                            case = f"[{layout}] labels={labelled} {name} chunk={chunk} {again} (rank {rank})"
                            checks.true(case, list(got) == list(expected), f"keys {list(got)} != {list(expected)}")
                            for key, value in expected.items():
                                checks.close(f"{case} {key}", float(got[key]), value, atol=1e-6, rtol=1e-6)
    expected = _expected("recall", _reference(*_data(sum(LAYOUTS["uneven"][:world_size]), "uneven", True), True))
    for key, value in expected.items():
        checks.close(f"functional {key}", float(results[0]["values"]["functional"][key]), value, atol=1e-6, rtol=1e-6)
    for rank, res in enumerate(results):
        for case, log in res["calls"].items():
            allowed = 0 if world_size == 1 else 1
            checks.true(case, len(log) == allowed, f"rank {rank}: {len(log)} collectives {log}, expected {allowed}")
    assert_no_failures(checks.failures)


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: CrossModalRecallAtK(top_k=0), "`top_k` must be a positive int"),
    (lambda: CrossModalRecallAtK(top_k=[]), "`top_k` must be a positive int or a non-empty sequence"),
    (lambda: CrossModalMeanRank(directions=("i2i",)), "`directions` must be a non-empty sequence"),
    (lambda: CrossModalMAPAtK(chunk_size=0), "`chunk_size` must be a positive int; got 0"),
    (
        lambda: CrossModalRecallAtK().update(torch.zeros(3, 4), torch.zeros(2, 4)),
        r"`image` and `text` must be paired rows of one shape \(N, D\); got \(3, 4\) and \(2, 4\)",
    ),
    (lambda: CrossModalRecallAtK().update(torch.zeros(3), torch.zeros(3)), r"`image` must be a floating \(N, D\)"),
    (
        lambda: CrossModalRecallAtK().update(torch.zeros(3, 2), torch.zeros(3, 2), torch.tensor([0, 1])),
        r"`labels` must have shape \(3,\); got \(2,\)",
    ),
    (
        lambda: CrossModalRecallAtK().update(torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([0, -2])),
        r"`labels` must be >= 0; found \[-2\]",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
