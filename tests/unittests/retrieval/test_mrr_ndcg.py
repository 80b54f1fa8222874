"""Mean reciprocal rank and nDCG@k of cross-modal retrieval over the global gallery.

One spawned run per world size (W = 1, 2, 3): every rank's pairs, given in two updates per rank with uneven
batches and a rank without rows, with and without multi-positive labels, scored in chunks smaller and larger than
the gallery, must give the brute-force reference computed here on the concatenated rows: each query's score row
and positives are handed to torchmetrics' ``retrieval_normalized_dcg`` (which averages tied scores) and
``retrieval_reciprocal_rank``, or, where scores tie (integer embeddings), the rank is counted by a loop (ties
against the query, the rank's definition). A repeated ``compute`` and a collection's steady ``compute`` cost one
collective.
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
from torchmetrics_diff import CrossModalMRR, CrossModalNormalizedDCG, CrossModalRecallAtK, Metric, MetricCollection
from torchmetrics_diff.functional import retrieval_mrr, retrieval_ndcg

pytestmark = pytest.mark.timeout(240)

LAYOUTS = {"empty rank": [6, 0, 9], "uneven": [5, 3, 4]}
DIM = 6

#: name -> (build(chunk), top_k, normalize, directions)
METRICS: dict[str, tuple[Callable[[int], Metric], int | None, bool, tuple[str, ...]]] = {
    "MRR": (lambda chunk: CrossModalMRR(chunk_size=chunk), None, True, ("i2t", "t2i")),
    "MRR@3": (lambda chunk: CrossModalMRR(top_k=3, chunk_size=chunk), 3, True, ("i2t", "t2i")),
    "nDCG": (lambda chunk: CrossModalNormalizedDCG(chunk_size=chunk), None, True, ("i2t", "t2i")),
    "nDCG@4": (lambda chunk: CrossModalNormalizedDCG(top_k=4, chunk_size=chunk), 4, True, ("i2t", "t2i")),
    "nDCG@40, raw dot products, t2i only": (
        lambda chunk: CrossModalNormalizedDCG(top_k=40, chunk_size=chunk, normalize=False, directions=("t2i",)),
        40,
        False,
        ("t2i",),
    ),
    "nDCG@4, raw dot products": (
        lambda chunk: CrossModalNormalizedDCG(top_k=4, chunk_size=chunk, normalize=False),
        4,
        False,
        ("i2t", "t2i"),
    ),
    "MRR@2, raw dot products": (
        lambda chunk: CrossModalMRR(top_k=2, chunk_size=chunk, normalize=False),
        2,
        False,
        ("i2t", "t2i"),
    ),
}
#: data: "noisy" (continuous, no ties) or "ties" (small integer embeddings: scores tie, also across ranks). Ties
#: are scored with raw dot products only: those are exact integers, where cosines of tied items may differ by
#: rounding (in the reference as in the metric), which would make near-ties of ties at random.
KINDS = ("noisy", "ties")


def _runs(kind: str) -> list[str]:
    return [name for name, (_, _, normalize, _) in METRICS.items() if kind == "noisy" or not normalize]


def _data(n: int, tag: str, kind: str, labelled: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    image = rand((n, DIM), tag, kind, "image")
    text = image + 1.2 * rand((n, DIM), tag, kind, "text")  # related but noisy: ranks spread over 1..n
    if kind == "ties":
        image, text = image.clamp(-1.4, 1.4).round(), text.clamp(-1.4, 1.4).round()
        image[:, 0] = text[:, 0] = 1.0  # no zero rows (they cannot be normalized)
    labels = None
    if labelled:
        labels = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(seed(tag, kind, "labels")))
    return image, text, labels


def _expected(image: torch.Tensor, text: torch.Tensor, labels: torch.Tensor | None, name: str, kind: str) -> dict:
    """Brute force on the global rows: per direction and query, the score row and its positives."""
    from torchmetrics.functional.retrieval import retrieval_normalized_dcg, retrieval_reciprocal_rank

    _, top_k, normalize, directions = METRICS[name]
    if normalize:
        image, text = image / image.norm(dim=1, keepdim=True), text / text.norm(dim=1, keepdim=True)
    n = image.shape[0]
    out: dict[str, float] = {}
    for direction in directions:
        queries, gallery = (image, text) if direction == "i2t" else (text, image)
        scores = queries @ gallery.T
        values = []
        for i in range(n):
            target = torch.tensor([j == i or (labels is not None and bool(labels[j] == labels[i])) for j in range(n)])
            if name.startswith("nDCG"):
                values.append(float(retrieval_normalized_dcg(scores[i], target, top_k=top_k)))
                continue
            best = float(scores[i][target].max())
            rank = 1 + sum(1 for j in range(n) if not target[j] and float(scores[i, j]) >= best)
            values.append(1 / rank if top_k is None or rank <= top_k else 0.0)
            if kind == "noisy":  # no ties: torchmetrics' reciprocal rank is the same (scores shifted above 0)
                shifted = scores[i] - scores[i].min() + 1
                assert (
                    abs(float(retrieval_reciprocal_rank(shifted, target, top_k=top_k)) - values[-1]) < 1e-7
                )  # (float32)
        key = name.split(",")[0]
        out[f"{direction}_{key}"] = float(np.mean(values))
    return out


def _body(rank: int, world: int) -> dict:
    values: dict = {}
    calls: dict[str, list[str]] = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        mid = (lo + hi) // 2
        for kind in KINDS:
            for labelled in (False, True):
                image, text, labels = _data(sum(sizes), layout, kind, labelled)
                local_labels = (None, None) if labels is None else (labels[lo:mid], labels[mid:hi])
                for name in _runs(kind):
                    build = METRICS[name][0]
                    for chunk in (2, 1000):
                        metric = build(chunk)
                        metric.update(image[lo:mid], text[lo:mid], local_labels[0])
                        metric.update(image[mid:hi], text[mid:hi], local_labels[1])
                        values[(layout, kind, labelled, name, chunk)] = metric.compute()
                        with record_collectives() as log:
                            values[(layout, kind, labelled, name, chunk, "again")] = metric.compute()
                        calls[f"[{layout}/{kind}] labels={labelled} {name} chunk={chunk}: second compute"] = list(log)
    # a collection of the cross-modal metrics: one collective per steady compute
    sizes = [3, 0, 2][:world]  # small rows: the sync's row fits the call header (a larger one adds a collective)
    lo, hi = bounds(sizes, rank)
    image, text, labels = _data(sum(sizes), "collection", "noisy", True)
    coll = MetricCollection(
        {"mrr": CrossModalMRR(top_k=5), "ndcg": CrossModalNormalizedDCG(top_k=5), "recall": CrossModalRecallAtK()}
    )
    for step in range(2):
        coll.update(image[lo:hi], text[lo:hi], labels[lo:hi])
        for again in range(2):
            with record_collectives() as log:
                coll.compute()
            calls[f"collection, {step + 1} updates, compute {again}"] = list(log)
    # the functional twins on the global rows, in this process
    image, text, labels = _data(sum(LAYOUTS["uneven"][:world]), "uneven", "ties", True)
    values["functional"] = {
        **retrieval_mrr(image, text, labels, top_k=2, normalize=False, chunk_size=3),
        **retrieval_ndcg(image, text, labels, top_k=4, normalize=False, chunk_size=3),
    }
    return {"values": values, "calls": calls}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_brute_force_over_the_global_gallery(world_size: int) -> None:
    """MRR (whole gallery, @k, raw dot products) and nDCG (whole gallery, @k, a ``k`` beyond the gallery, raw dot
    products, one direction) over every rank's pairs equal the brute-force reference, with and without labels,
    with and without tied scores, with chunks smaller than the gallery; the functional twins too. A repeated
    ``compute`` costs one collective, and so does a collection of MRR, nDCG and recall once its plan is agreed
    (the first compute after an update may agree a new one)."""
    results = run_distributed(_body, world_size, timeout=200)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for kind in KINDS:
            for labelled in (False, True):
                image, text, labels = _data(n, layout, kind, labelled)
                for name in _runs(kind):
                    expected = _expected(image, text, labels, name, kind)
                    for chunk in (2, 1000):
                        for rank, res in enumerate(results):
                            for again in ((), ("again",)):
                                got = res["values"][(layout, kind, labelled, name, chunk, *again)]
                                case = f"[{layout}/{kind}] labels={labelled} {name} chunk={chunk} {again} (rank {rank})"
                                checks.true(case, list(got) == list(expected), f"keys {list(got)} != {list(expected)}")
                                for key, value in expected.items():
                                    checks.close(f"{case} {key}", float(got[key]), value, atol=1e-6, rtol=1e-6)
    image, text, labels = _data(sum(LAYOUTS["uneven"][:world_size]), "uneven", "ties", True)
    expected = {
        **_expected(image, text, labels, "MRR@2, raw dot products", "ties"),
        **_expected(image, text, labels, "nDCG@4, raw dot products", "ties"),
    }
    got = results[0]["values"]["functional"]
    checks.true("functional", list(got) == list(expected), f"keys {list(got)} != {list(expected)}")
    for key, value in expected.items():
        checks.close(f"functional {key}", float(got[key]), value, atol=1e-6, rtol=1e-6)
    for rank, res in enumerate(results):
        for case, log in res["calls"].items():
            if case.endswith("compute 0"):
                continue
            allowed = 0 if world_size == 1 else 1
            checks.true(case, len(log) == allowed, f"rank {rank}: {len(log)} collectives {log}, expected {allowed}")
    assert_no_failures(checks.failures)


def test_ndcg_is_one_for_a_perfect_ranking_and_ties_share_their_gain() -> None:
    """Each row scoring its own pair highest gives nDCG 1 and MRR 1; constant embeddings tie every item, so the
    one positive gets the mean discount of all ``G`` positions (``mean_i 1/log2(i + 1)``), and MRR its worst rank."""
    eye = torch.eye(4)
    assert all(float(v) == 1.0 for v in CrossModalNormalizedDCG()(eye, eye).values())
    assert all(float(v) == 1.0 for v in retrieval_mrr(eye, eye).values())
    ones = torch.ones(4, 3)
    expected = float(np.mean(1 / np.log2(np.arange(2, 6))))
    for value in retrieval_ndcg(ones, ones).values():
        assert abs(float(value) - expected) < 1e-6
    for value in retrieval_mrr(ones, ones).values():
        assert abs(float(value) - 0.25) < 1e-7


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: CrossModalMRR(top_k=0), r"`top_k` must be a positive int or None; got 0"),
    (lambda: CrossModalNormalizedDCG(top_k=(1, 2)), r"`top_k` must be a positive int or None; got \(1, 2\)"),
    (lambda: CrossModalNormalizedDCG(top_k=True), "`top_k` must be a positive int or None; got True"),
    (lambda: CrossModalMRR(directions="x"), "`directions` must be a non-empty sequence"),
    (lambda: CrossModalNormalizedDCG(chunk_size=0), "`chunk_size` must be a positive int; got 0"),
    (lambda: CrossModalMRR(normalize="yes"), "`normalize` must be a bool; got 'yes'"),
    (
        lambda: CrossModalNormalizedDCG().update(torch.zeros(3, 4), torch.zeros(2, 4)),
        r"`image` and `text` must be paired rows of one shape \(N, D\); got \(3, 4\) and \(2, 4\)",
    ),
    (
        lambda: retrieval_ndcg(torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([0, -1])),
        r"`labels` must be >= 0; found \[-1\]",
    ),
    (lambda: retrieval_mrr(torch.zeros(2, 2), torch.zeros(2, 2), top_k=-1), "`top_k` must be a positive int or None"),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
