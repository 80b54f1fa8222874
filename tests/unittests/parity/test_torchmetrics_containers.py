"""Our metrics inside torchmetrics' own containers and operators, against the same containers of torchmetrics metrics.

Every container that works must give the values it gives with torchmetrics' metrics of the same name; the ones
that cannot hold ours (``Running``, ``FeatureShare``) raise one ``TypeError`` at construction that names what to
use instead, never an ``AttributeError`` from inside torchmetrics. Operators between ours and torchmetrics' build
torchmetrics' ``CompositionalMetric`` in both orders, whose ``compute()`` is a tensor.

Package modules covered: ``_torchmetrics``, ``composition`` (operators with a torchmetrics metric), ``metric``
(``_filter_kwargs`` as torchmetrics calls it).
"""

from __future__ import annotations

import copy
import operator
import warnings
from typing import Any, Callable

import pytest
import torch
import torchmetrics
import torchmetrics.wrappers as tmw

import torchmetrics_diff as ours_pkg
from tests._helpers.harness import run_distributed

PREDS = torch.tensor([[0.5, 1.0], [2.0, -1.0], [0.25, 3.0], [1.5, 0.0], [-2.0, 4.0], [0.0, 0.5]])
TARGET = torch.tensor([[1.0, 1.0], [1.5, -2.0], [0.0, 2.0], [2.0, 1.0], [-1.0, 3.5], [0.5, 0.0]])
BATCHES = [slice(0, 2), slice(2, 3), slice(3, 6)]


def _both(build: Callable[[Any], Any]) -> tuple[Any, Any]:
    """The same construction with our package's metrics and with torchmetrics'."""
    return build(ours_pkg), build(torchmetrics)


def _close(a: Any, b: Any, what: str) -> None:
    if isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), f"{what}: keys {list(a)} vs {list(b)}"
        for k in b:
            _close(a[k], b[k], f"{what}[{k}]")
        return
    if isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{what}: {len(a)} values vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{what}[{i}]")
        return
    assert isinstance(a, torch.Tensor), f"{what}: {type(a).__name__} instead of a tensor"
    torch.testing.assert_close(a.double(), torch.as_tensor(b).double(), rtol=1e-6, atol=1e-6, msg=what)


# --------------------------------------------------------------------------------------------- what works
def _drive(m: Any, call: Callable[[Any, slice], Any]) -> tuple[list[Any], Any]:
    steps = [call(m, s) for s in BATCHES]
    return steps, m.compute()


# name -> (build from a package, one batch call (forward or update), whether it returns a value)
WORKING: dict[str, tuple[Callable[[Any], Any], Callable[[Any, slice], Any]]] = {
    "MetricCollection(dict)": (
        lambda p: torchmetrics.MetricCollection({"mse": p.MeanSquaredError(), "mae": p.MeanAbsoluteError()}),
        lambda m, s: m(PREDS[s], TARGET[s]),
    ),
    "MetricCollection(list, prefix)": (
        lambda p: torchmetrics.MetricCollection([p.SumMetric(), p.MeanMetric()], prefix="val/"),
        lambda m, s: m(PREDS[s, 0]),
    ),
    "MetricCollection(update, groups)": (
        lambda p: torchmetrics.MetricCollection({"a": p.MeanMetric(), "b": p.MeanMetric(), "c": p.MaxMetric()}),
        lambda m, s: m.update(PREDS[s, 0]),
    ),
    "MetricCollection(nested)": (
        lambda p: torchmetrics.MetricCollection(
            {"inner": torchmetrics.MetricCollection({"s": p.SumMetric()}, postfix="_x"), "m": p.MinMetric()}
        ),
        lambda m, s: m(PREDS[s, 1]),
    ),
    "MinMaxMetric": (lambda p: tmw.MinMaxMetric(p.MeanMetric()), lambda m, s: m(PREDS[s, 0])),
    "ClasswiseWrapper": (
        lambda p: tmw.ClasswiseWrapper(p.CatMetric(), labels=["a", "b", "c", "d"]),
        lambda m, s: m.update(PREDS[s, 0][:1].repeat(4)),
    ),
    "MultitaskWrapper": (
        lambda p: tmw.MultitaskWrapper({"reg": p.MeanSquaredError(), "abs": p.MeanAbsoluteError()}),
        lambda m, s: m({"reg": PREDS[s, 0], "abs": PREDS[s, 1]}, {"reg": TARGET[s, 0], "abs": TARGET[s, 1]}),
    ),
    "MultioutputWrapper": (
        lambda p: tmw.MultioutputWrapper(p.MeanSquaredError(), num_outputs=2),
        lambda m, s: m(PREDS[s], TARGET[s]),
    ),
    "LambdaInputTransformer": (
        lambda p: tmw.LambdaInputTransformer(p.MeanSquaredError(), transform_pred=lambda x: 2 * x),
        lambda m, s: m(PREDS[s, 0], TARGET[s, 0]),
    ),
    "BinaryTargetTransformer": (
        lambda p: tmw.BinaryTargetTransformer(p.MeanAbsoluteError(), threshold=0.5),
        lambda m, s: m.update(PREDS[s, 0], TARGET[s, 0]),
    ),
}


@pytest.mark.parametrize("name", list(WORKING))
def test_container_with_our_metrics_gives_torchmetrics_values(name: str) -> None:
    build, call = WORKING[name]
    ours, theirs = _both(build)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics' own warnings (compute before update, ...), same for both
        steps_ours, epoch_ours = _drive(ours, call)
        steps_theirs, epoch_theirs = _drive(theirs, call)
    if steps_theirs[0] is not None:
        _close(steps_ours, steps_theirs, f"{name}: batch values")
    _close(epoch_ours, epoch_theirs, f"{name}: compute()")
    ours.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _drive(ours, call)
        _close(ours.compute(), epoch_theirs, f"{name}: compute() after reset and the same batches")


def test_metric_tracker_and_bootstrapper_with_our_metric() -> None:
    ours, theirs = _both(lambda p: tmw.MetricTracker(p.MeanSquaredError(), maximize=False))
    for tracker in (ours, theirs):
        for epoch in range(3):
            tracker.increment()
            for s in BATCHES[epoch:]:
                tracker.update(PREDS[s, 0] * (epoch + 1), TARGET[s, 0])
    _close(ours.compute_all(), theirs.compute_all(), "MetricTracker.compute_all()")
    best_ours, best_theirs = ours.best_metric(return_step=True), theirs.best_metric(return_step=True)
    assert best_ours[1] == best_theirs[1], f"best step {best_ours[1]} vs {best_theirs[1]}"
    assert best_ours[0] == pytest.approx(best_theirs[0], rel=1e-6)

    boot = {}
    for label, p in (("ours", ours_pkg), ("theirs", torchmetrics)):
        torch.manual_seed(3)  # the same resampling for both
        b = tmw.BootStrapper(p.MeanSquaredError(), num_bootstraps=5, quantile=torch.tensor([0.1, 0.9]))
        for s in BATCHES:
            b.update(PREDS[s, 0], TARGET[s, 0])
        boot[label] = b.compute()
    _close(boot["ours"], boot["theirs"], "BootStrapper.compute()")


def test_torchmetrics_collection_mixes_ours_and_theirs() -> None:
    mixed = torchmetrics.MetricCollection({"ours": ours_pkg.MeanSquaredError(), "theirs": torchmetrics.SumMetric()})
    pure = torchmetrics.MetricCollection({"ours": torchmetrics.MeanSquaredError(), "theirs": torchmetrics.SumMetric()})
    # keyword arguments are routed by each member's update signature (torchmetrics calls `_filter_kwargs(**kw)`)
    for s in BATCHES:
        for coll in (mixed, pure):
            coll.update(preds=PREDS[s, 0], target=TARGET[s, 0], value=PREDS[s, 1])
    _close(mixed.compute(), pure.compute(), "mixed collection")
    assert ours_pkg.SumMetric()._filter_kwargs(value=1, target=2) == {"value": 1}


# ----------------------------------------------------------------------------------------- what is refused
REFUSED: dict[str, Callable[[Any], Any]] = {
    "Running": lambda m: tmw.Running(m, window=2),
    "FeatureShare": lambda m: tmw.FeatureShare([m]),
    "FeatureShare(dict)": lambda m: tmw.FeatureShare({"a": m}),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_containers_that_cannot_hold_ours_raise_one_type_error_at_construction(name: str) -> None:
    with pytest.raises(TypeError, match=r"torchmetrics_diff metric") as info:
        REFUSED[name](ours_pkg.SumMetric())
    message = str(info.value)
    assert name.split("(")[0] in message and ("Use" in message or "merge_state" in message), message
    assert isinstance(tmw.Running(torchmetrics.SumMetric(), window=2), tmw.Running), "torchmetrics' own still work"


def test_running_with_a_collection_member_is_refused_too() -> None:
    with pytest.raises(TypeError, match="Running cannot hold MeanSquaredError"):
        tmw.Running(ours_pkg.MeanSquaredError())


# ---------------------------------------------------------------------------------------------- operators
BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "pow": operator.pow,
    "lt": operator.lt,
    "ge": operator.ge,
    "eq": operator.eq,
}


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours_op_theirs", "theirs_op_ours"])
@pytest.mark.parametrize("op", list(BINARY))
def test_operators_with_a_torchmetrics_metric_compute_tensors(op: str, ours_first: bool) -> None:
    fn = BINARY[op]
    a, b = ours_pkg.MeanMetric(), torchmetrics.SumMetric()
    ra, rb = torchmetrics.MeanMetric(), torchmetrics.SumMetric()
    comp = fn(a, b) if ours_first else fn(b, a)
    ref = fn(ra, rb) if ours_first else fn(rb, ra)
    assert isinstance(comp, torchmetrics.Metric) and not isinstance(comp, ours_pkg.Metric)
    for s in BATCHES:
        _close(comp(PREDS[s, 0].abs()), ref(PREDS[s, 0].abs()), f"{op}: forward")
    _close(comp.compute(), ref.compute(), f"{op}: compute")
    comp.reset()
    assert a.update_count == 0, "reset reaches our member"


# ------------------------------------------------------------------------------------------- two processes
def _mixed_on_rank(rank: int, world: int) -> dict[str, Any]:
    rows = [slice(0, 1), slice(1, 6)][rank]  # uneven: 1 and 5 rows
    coll = torchmetrics.MetricCollection(
        {"mse": ours_pkg.MeanSquaredError(), "cat": ours_pkg.CatMetric(), "sum": torchmetrics.SumMetric()}
    )
    ref = torchmetrics.MetricCollection(
        {"mse": torchmetrics.MeanSquaredError(), "cat": torchmetrics.CatMetric(), "sum": torchmetrics.SumMetric()}
    )
    for c in (coll, ref):
        c["mse"].update(PREDS[rows, 0], TARGET[rows, 0])
        c["cat"].update(PREDS[rows])
        c["sum"].update(PREDS[rows, 1])
    comp = ours_pkg.SumMetric() + torchmetrics.MeanMetric()
    comp.update(PREDS[rows, 0])
    return {"coll": coll.compute(), "ref": ref.compute(), "comp": comp.compute()}


def test_torchmetrics_containers_sync_our_metrics_at_two_ranks() -> None:
    results = run_distributed(_mixed_on_rank, 2, timeout=120.0)
    expected_mse = ((PREDS[:, 0] - TARGET[:, 0]) ** 2).double().mean()
    expected_comp = PREDS[:, 0].double().sum() + PREDS[:, 0].double().mean()
    for rank, r in enumerate(results):
        _close(r["coll"]["mse"], expected_mse, f"rank {rank}: mse")
        _close(r["coll"]["sum"], PREDS[:, 1].double().sum(), f"rank {rank}: sum")
        assert r["coll"]["cat"].shape == (6, 2), f"rank {rank}: cat rows {tuple(r['coll']['cat'].shape)}"
        _close(r["coll"]["cat"], PREDS, f"rank {rank}: cat")
        _close(r["coll"]["cat"], r["ref"]["cat"], f"rank {rank}: cat against torchmetrics")
        _close(r["comp"], expected_comp, f"rank {rank}: ours + torchmetrics")


def test_copies_of_wrapped_metrics_stay_independent() -> None:
    wrapped = tmw.MinMaxMetric(ours_pkg.SumMetric())
    twin = copy.deepcopy(wrapped)
    wrapped.update(torch.tensor([1.0]))
    assert twin._base_metric.update_count == 0 and wrapped._base_metric.update_count == 1
