"""Empty ranks everywhere: every public metric class of the package takes a batch of zero rows as a no-op, and a rank
without rows gets the global value from ``compute()``, silently.

The classes are enumerated from the public names (``torchmetrics_diff`` and its subpackages ``classification``,
``regression``, ``retrieval``, ``text``, and the classes of ``aggregation``; the losses have their own empty-rank
tests), so a new class fails :func:`test_every_public_metric_class_has_a_case` until it has a case here. A case
is derived from the class's name where its family fixes the inputs (``Binary*``, ``Multiclass*``, ``Multilabel*``,
``Retrieval*``, ``CrossModal*``, a task class's generic name with each task), else it is written out in
``EXPLICIT``; ``SKIPPED`` names the classes that have no rows to take, each with its reason.

- One process: an update of zero rows leaves every state as it was (a tensor state equal, in dtype and shape; a list
  state holds no more rows) and warns nothing, on a fresh metric and after data, and the value after the data is
  the value without the empty batches.
- W = 3, the ranks holding 4, 0 and 5 rows (float64): ``compute()`` on every rank equals torchmetrics' class of the
  same name (the cross-modal metrics: a brute-force formula) on the concatenated rows in one process, whether the
  empty rank called ``update`` with zero rows or never called it, and no rank warns (``compute()`` before
  ``update()`` warns only for a local value; see the decisions page). Without a sync on compute, the rank that
  never updated still warns. All cases run in one ``run_distributed`` call.

Package modules covered: ``metric`` (the compute-before-update warning), ``aggregation``, ``classification``,
``regression``, ``retrieval``, ``text``, ``functional._retrieval_queries``.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch

import torchmetrics_diff
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import bounds, generator, rand
from torchmetrics_diff import Metric, aggregation, classification, regression, retrieval, text

tm = pytest.importorskip("torchmetrics")

pytestmark = pytest.mark.timeout(240)

F64 = torch.float64
SIZES = [4, 0, 5]  # rows per rank at W = 3: rank 1 is empty
FLOAT32_RTOL, FLOAT32_ATOL = 1e-5, 1e-6
N_CLASSES, N_LABELS, DIM, TOKENS, VOCAB = 3, 3, 4, 3, 5

SKIPPED = {
    "Metric": "the abstract base class: no update of its own",
    "CompositionalMetric": "arithmetic on metrics: its operands are the metrics, each covered here",
    "BaseAggregator": "the aggregators' base class: no update of its own",
}


def public_metric_classes() -> dict[str, type]:
    """Every public metric class: the exports of the package and its metric subpackages, and ``aggregation``'s."""
    found: dict[str, type] = {}
    for module in (torchmetrics_diff, classification, regression, retrieval, text):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, Metric):
                found[name] = obj
    for name, obj in vars(aggregation).items():
        own = isinstance(obj, type) and issubclass(obj, Metric) and obj.__module__ == aggregation.__name__
        if own and not name.startswith("_"):
            found[name] = obj
    return found


CLASSES = public_metric_classes()


# ----------------------------------------------------------------------------------------------- the rows
def _labels(n: int, k: int, *tag: object) -> torch.Tensor:
    """``n`` labels in ``[0, k)``, every label present when ``n >= k`` (a permutation of ``0, 1, ..., k-1, 0, ...``)."""
    return torch.randperm(n, generator=generator(*tag)) % k


def _values(n: int, tag: str) -> tuple:
    return (rand((n,), tag, "value"),)


def _weighted(n: int, tag: str) -> tuple:
    return rand((n,), tag, "value"), rand((n,), tag, "weight").abs() + 0.5


def _binary(n: int, tag: str) -> tuple:
    return torch.sigmoid(rand((n,), tag, "preds")), _labels(n, 2, tag, "target")


def _multiclass(n: int, tag: str) -> tuple:
    return torch.softmax(rand((n, N_CLASSES), tag, "preds"), dim=1), _labels(n, N_CLASSES, tag, "target")


def _multilabel(n: int, tag: str) -> tuple:
    target = torch.stack([_labels(n, 2, tag, "target", j) for j in range(N_LABELS)], dim=1)
    return torch.sigmoid(rand((n, N_LABELS), tag, "preds")), target


def _regression(n: int, tag: str) -> tuple:
    target = rand((n,), tag, "target")
    return target + 0.5 * rand((n,), tag, "noise"), target


def _away_from_zero(n: int, tag: str) -> tuple:
    target = rand((n,), tag, "target").abs() + 1.0
    return target + 0.5 * rand((n,), tag, "noise"), target


def _vectors(n: int, tag: str) -> tuple:
    return rand((n, DIM), tag, "preds"), rand((n, DIM), tag, "target")


def _distributions(n: int, tag: str) -> tuple:
    return tuple(torch.softmax(rand((n, DIM), tag, side), dim=1) for side in ("p", "q"))


def _documents(n: int, tag: str) -> tuple:
    return rand((n,), tag, "preds"), _labels(n, 2, tag, "target"), _labels(n, 3, tag, "indexes")


def _pairs(n: int, tag: str) -> tuple:
    image = rand((n, DIM), tag, "image")
    return image, image + 1.2 * rand((n, DIM), tag, "text")


def _tokens(n: int, tag: str) -> tuple:
    target = torch.randint(0, VOCAB, (n, TOKENS), generator=generator(tag, "target"))
    return rand((n, TOKENS, VOCAB), tag, "preds"), target


def rows_of(args: tuple, lo: int, hi: int) -> tuple:
    return tuple(x[lo:hi] for x in args)


# ------------------------------------------------------------------------------------------ the references
def _torchmetrics_class(name: str) -> Any:
    for module in (tm, tm.classification, tm.regression, tm.retrieval, tm.text, tm.aggregation):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"torchmetrics has no class {name}")


def _torchmetrics(name: str, **kwargs: Any) -> Callable[[tuple], Any]:
    """torchmetrics' class ``name`` (float64 states) updated with every row at once."""

    def reference(args: tuple) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchmetrics' own warnings are not under test
            metric = _torchmetrics_class(name)(**kwargs).set_dtype(F64)
            metric.update(*args)
            return metric.compute()

    return reference


def _cross_modal(name: str) -> Callable[[tuple], dict]:
    """Brute force over the score matrix: each query's one positive is its own pair; its rank counts the other
    gallery items scoring at least as high (ties against the query)."""

    def reference(args: tuple) -> dict:
        image, text_ = (x / x.norm(dim=1, keepdim=True) for x in args)
        out: dict[str, float] = {}
        for d, (queries, gallery) in {"i2t": (image, text_), "t2i": (text_, image)}.items():
            s = (queries @ gallery.T).tolist()
            n = len(s)
            ranks = np.array([1 + sum(s[i][j] >= s[i][i] for j in range(n) if j != i) for i in range(n)], float)
            if name == "CrossModalRecallAtK":
                out.update({f"{d}_R@{k}": float(np.mean(ranks <= k)) for k in (1, 5, 10)})
            elif name == "CrossModalMeanRank":
                out[f"{d}_mean_rank"] = float(np.mean(ranks))
            elif name == "CrossModalMedianRank":
                out[f"{d}_median_rank"] = float(np.median(ranks))
            elif name == "CrossModalMAPAtK":  # one positive: its precision, 1 / rank, within the top 10
                out[f"{d}_mAP@10"] = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
            elif name == "CrossModalMRR":
                out[f"{d}_MRR"] = float(np.mean(1.0 / ranks))
            elif name == "CrossModalNormalizedDCG":  # one positive: the ideal DCG is 1
                out[f"{d}_nDCG"] = float(np.mean(1.0 / np.log2(ranks + 1.0)))
            else:
                raise LookupError(f"no brute-force reference for {name}")
        return out

    return reference


# ------------------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    """A class with its constructor's arguments, the rows it takes and the reference of its value."""

    name: str
    kwargs: dict
    data: Callable[[int, str], tuple]
    reference: Callable[[tuple], Any]
    atol: float = 1e-12
    rtol: float = 1e-9

    def build(self) -> Metric:
        metric = CLASSES[self.name](**self.kwargs)
        return metric.set_dtype(F64)


_TASKS: dict[str, tuple[dict, Callable[[int, str], tuple]]] = {
    "Binary": ({}, _binary),
    "Multiclass": ({"num_classes": N_CLASSES}, _multiclass),
    "Multilabel": ({"num_labels": N_LABELS}, _multilabel),
}

EXPLICIT: dict[str, Case] = {
    "SumMetric": Case("SumMetric", {}, _values, _torchmetrics("SumMetric")),
    "MeanMetric": Case("MeanMetric", {}, _weighted, _torchmetrics("MeanMetric")),
    "CatMetric": Case("CatMetric", {}, _values, _torchmetrics("CatMetric")),
    "MinMetric": Case("MinMetric", {}, _values, _torchmetrics("MinMetric")),
    "MaxMetric": Case("MaxMetric", {}, _values, _torchmetrics("MaxMetric")),
    "CosineSimilarity": Case("CosineSimilarity", {}, _vectors, _torchmetrics("CosineSimilarity")),
    "KLDivergence": Case("KLDivergence", {}, _distributions, _torchmetrics("KLDivergence")),
    "MeanAbsolutePercentageError": Case(
        "MeanAbsolutePercentageError", {}, _away_from_zero, _torchmetrics("MeanAbsolutePercentageError")
    ),
    "SymmetricMeanAbsolutePercentageError": Case(
        "SymmetricMeanAbsolutePercentageError",
        {},
        _away_from_zero,
        _torchmetrics("SymmetricMeanAbsolutePercentageError"),
    ),
    "Perplexity": Case("Perplexity", {}, _tokens, _torchmetrics("Perplexity")),
}
# the regression metrics of (preds, target) vectors
for _name in (
    "MeanSquaredError",
    "MeanAbsoluteError",
    "PearsonCorrCoef",
    "R2Score",
    "ExplainedVariance",
    "SpearmanCorrCoef",
):
    EXPLICIT[_name] = Case(_name, {}, _regression, _torchmetrics(_name))


def _cases_of(name: str, cls: type) -> dict[str, Case]:
    """The cases of one class, by label: its family's, or the one written out in ``EXPLICIT``."""
    if name in EXPLICIT:
        return {name: EXPLICIT[name]}
    for prefix, (kwargs, data) in _TASKS.items():
        if name.startswith(prefix):
            return {name: Case(name, kwargs, data, _torchmetrics(name, **kwargs))}
    if "task" in inspect.signature(cls.__init__).parameters:  # a generic class: each task
        out = {}
        for prefix, (kwargs, data) in _TASKS.items():
            args = {"task": prefix.lower(), **kwargs}
            out[f"{name}[{prefix.lower()}]"] = Case(name, args, data, _torchmetrics(name, **args))
        return out
    if name.startswith("Retrieval"):
        return {name: Case(name, {}, _documents, _torchmetrics(name))}
    if name.startswith("CrossModal"):
        return {name: Case(name, {}, _pairs, _cross_modal(name))}
    return {}


def all_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for name, cls in CLASSES.items():
        cases.update(_cases_of(name, cls))
    return cases


CASES = all_cases()


def test_every_public_metric_class_has_a_case() -> None:
    covered = {case.name for case in CASES.values()}
    missing = sorted(set(CLASSES) - covered - set(SKIPPED))
    assert not missing, f"public metric classes without an empty-rank case (add one, or a reason to SKIPPED): {missing}"
    assert not set(SKIPPED) & covered, "a class is both skipped and covered"
    assert not set(SKIPPED) - set(CLASSES), f"SKIPPED names no class any more: {sorted(set(SKIPPED) - set(CLASSES))}"


# ------------------------------------------------------------------------------------------------ one process
def _rows_held(value: list) -> int:
    return sum(1 if t.ndim == 0 else t.shape[0] for t in value)


def _same_states(before: dict, after: dict) -> list[str]:
    """What a zero-row update changed: a tensor state must be equal (dtype, shape, values); a list state may only
    gain tensors of zero rows with the trailing shape and dtype of the rows it holds."""
    changed = []
    for name, old in before.items():
        new = after[name]
        if isinstance(old, torch.Tensor):
            if old.dtype != new.dtype or old.shape != new.shape or not torch.equal(old, new):
                changed.append(f"{name}: {old!r} -> {new!r}")
            continue
        added = new[len(old) :]
        if len(new) < len(old) or any(a is not b for a, b in zip(new, old)):
            changed.append(f"{name}: rows held before were replaced")
        if _rows_held(new) != _rows_held(old):
            changed.append(f"{name}: {_rows_held(old)} rows -> {_rows_held(new)}")
        like = old[0] if old else None
        for t in added:
            if like is not None and (t.dtype != like.dtype or t.shape[1:] != like.shape[1:]):
                changed.append(f"{name}: appended {t.dtype} {tuple(t.shape)} to rows {like.dtype} {tuple(like.shape)}")
    return changed


def _snapshot(metric: Metric) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else list(v) for k, v in metric.metric_state.items()}


def _array(value: Any) -> np.ndarray:
    """A tensor or number as an array: float32 stays float32 (its tolerance is float32's), anything else float64."""
    tensor = torch.as_tensor(value).detach().cpu()
    return np.asarray(tensor if tensor.dtype == torch.float32 else tensor.double())


def _flat(value: Any) -> dict[str, np.ndarray]:
    """A value (tensor, tuple, dict) as arrays by key."""
    if isinstance(value, dict):
        return {str(k): _array(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return {str(i): _array(v) for i, v in enumerate(value)}
    return {"": _array(value)}


def _compare(label: str, got: Any, expected: Any, case: Case) -> list[str]:
    """Mismatches of ``got`` against ``expected``: to float64 rounding (the case's tolerance) when both are float64,
    to float32 rounding when either side is float32 (the stat-score classes' values are in the default dtype;
    torchmetrics computes some values in float32, for instance its retrieval scores, Spearman and cosine)."""
    got, expected = _flat(got), _flat(expected)
    if list(got) != list(expected):
        return [f"{label}: keys {list(got)}, expected {list(expected)}"]
    out = []
    for key, value in expected.items():
        single = np.float32 in (got[key].dtype, value.dtype)
        rtol, atol = (FLOAT32_RTOL, FLOAT32_ATOL) if single else (case.rtol, case.atol)
        if got[key].shape != value.shape or not np.allclose(got[key], value, rtol=rtol, atol=atol):
            out.append(f"{label} {key}: {got[key]!r}, expected {value!r}")
    return out


@pytest.mark.parametrize("label", list(CASES))
def test_a_zero_row_update_changes_no_state_and_warns_nothing(label: str) -> None:
    case = CASES[label]
    args = case.data(9, label)
    empty, first, second = rows_of(args, 0, 0), rows_of(args, 0, 4), rows_of(args, 4, 9)
    plain, metric = case.build(), case.build()
    plain.update(*first)
    plain.update(*second)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        before = _snapshot(metric)
        metric.update(*empty)
        changed = _same_states(before, metric.metric_state)
        metric.update(*first)
        before = _snapshot(metric)
        metric.update(*empty)
        changed += _same_states(before, metric.metric_state)
        metric.update(*second)
        mismatches = _compare("value after empty batches", metric.compute(), plain.compute(), case)
    assert not changed, f"{label}: a zero-row update changed states: {changed}"
    assert not mismatches, mismatches


# ------------------------------------------------------------------------------------------------ three ranks
def _warnings_text(caught: list) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def _on_rank(rank: int, world: int, sizes: list[int], labels: list[str]) -> dict:
    """For each case: the value of a metric the empty rank updated with zero rows, and of one it never updated;
    the warnings each rank saw. Then the decision's two ends: a synced compute where no rank updated, and an
    unsynced one on the rank that did not update."""
    lo, hi = bounds(sizes, rank)
    out: dict[str, Any] = {}
    for label in labels:
        case = CASES[label]
        local = rows_of(case.data(sum(sizes), label), lo, hi)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            updated, idle = case.build(), case.build()
            updated.update(*local)
            if hi > lo:
                idle.update(*local)
            values = (updated.compute(), idle.compute())
        out[label] = (values, _warnings_text(caught))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchmetrics_diff.SumMetric().compute()  # synced: no rank updated, and none warns
    out["no rank updated"] = _warnings_text(caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        local_only = torchmetrics_diff.SumMetric(sync_on_compute=False)
        if hi > lo:
            local_only.update(torch.ones(hi - lo))
        local_only.compute()
    out["unsynced"] = _warnings_text(caught)
    return out


def test_an_empty_rank_gets_the_global_value_and_no_warning() -> None:
    labels = list(CASES)
    results = run_distributed(_on_rank, 3, SIZES, labels, timeout=180)
    empty_rank = SIZES.index(0)
    failures = []
    for label in labels:
        case = CASES[label]
        expected = case.reference(case.data(sum(SIZES), label))
        for rank, result in enumerate(results):
            (updated, idle), caught = result[label]
            failures += _compare(f"{label} rank {rank} (empty rank updated)", updated, expected, case)
            failures += _compare(f"{label} rank {rank} (empty rank never updated)", idle, expected, case)
            if caught:
                failures.append(f"{label} rank {rank}: warned {caught}")
    for rank, result in enumerate(results):
        if result["no rank updated"]:
            failures.append(f"rank {rank}: a synced compute where no rank updated warned {result['no rank updated']}")
        unsynced = result["unsynced"]
        if rank == empty_rank:
            if not (len(unsynced) == 1 and "called before update" in unsynced[0]):
                failures.append(f"rank {rank}: an unsynced compute before update warned {unsynced}")
        elif unsynced:
            failures.append(f"rank {rank}: an unsynced compute after update warned {unsynced}")
    assert not failures, "\n".join(failures)


def test_the_reference_cases_are_not_degenerate() -> None:
    """The rows of the references hold what the metrics need to be informative: every class and label present,
    finite values (a NaN reference would compare equal to a NaN value)."""
    for label, case in CASES.items():
        for key, value in _flat(case.reference(case.data(sum(SIZES), label))).items():
            assert np.all(np.isfinite(value)), f"{label} {key}: {value}"
