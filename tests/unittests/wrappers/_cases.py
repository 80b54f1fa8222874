"""Scenarios run side by side on our wrappers and torchmetrics' (same inner metric, same data, same calls).

Each scenario builds a wrapper of one library, feeds it this rank's share of a few seeded batches (uneven sizes,
an empty rank in one step) and returns what every call gave, by name. Run with ``lib="ours"`` and ``lib="tm"``
in the same process (one rank, or every rank of a gloo group), the two results must agree: torchmetrics 1.9's
wrapper around torchmetrics' metric is the reference. Where torchmetrics' wrapper is known to differ (listed in
the docs' decisions page), the scenario leaves that call out of the comparison and the tests check it against a
brute-force value instead.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tests._helpers.seeds import F64, bounds, generator

# rows of the global batch per step and rank (rank 1 empty at step 1; W=1 takes the whole step)
SIZES = {2: [[5, 3], [4, 0], [2, 6]], 3: [[5, 3, 2], [4, 0, 3], [2, 6, 1]]}
STEPS = 3
CLASSES = 3


def step_sizes(step: int, world: int, kind: str = "real") -> list[int]:
    """Rows per rank; torchmetrics' classification metrics refuse an empty batch, so those ranks get 2 rows (but
    for a kind ending in "(empty rank)", which only our metrics see)."""
    sizes = SIZES[2 if world == 1 else world][step]
    sizes = sizes if kind == "real" or kind.endswith("(empty rank)") else [s or 2 for s in sizes]
    return [sum(sizes)] if world == 1 else sizes


def global_batch(kind: str, step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of a step (what one process on the concatenated data sees)."""
    n = sum(step_sizes(step, world, kind))
    g = generator("wrappers", kind, step, n)
    if kind.startswith("multiclass"):
        return torch.randint(CLASSES, (n,), generator=g), torch.randint(CLASSES, (n,), generator=g)
    if kind == "binary":
        return torch.randint(2, (n,), generator=g), torch.randint(2, (n,), generator=g)
    return torch.randn(n, generator=g, dtype=F64), torch.randn(n, generator=g, dtype=F64)


def local_batch(kind: str, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    preds, target = global_batch(kind, step, world)
    lo, hi = bounds(step_sizes(step, world, kind), rank)
    return preds[lo:hi], target[lo:hi]


def _mse(lib: str, **kw: Any) -> Any:
    if lib == "ours":
        from torchmetrics_diff import MeanSquaredError

        return MeanSquaredError(**kw).set_dtype(F64)
    import torchmetrics

    return torchmetrics.MeanSquaredError(**kw).set_dtype(F64)


def _acc(lib: str, **kw: Any) -> Any:
    if lib == "ours":
        from torchmetrics_diff import Accuracy

        return Accuracy(task="multiclass", num_classes=CLASSES, **kw)
    from torchmetrics.classification import MulticlassAccuracy

    return MulticlassAccuracy(num_classes=CLASSES, **kw)


def _binary_acc(lib: str, **kw: Any) -> Any:
    if lib == "ours":
        from torchmetrics_diff import Accuracy

        return Accuracy(task="binary", **kw)
    from torchmetrics.classification import BinaryAccuracy

    return BinaryAccuracy(**kw)


def _w(lib: str) -> Any:
    if lib == "ours":
        import torchmetrics_diff.wrappers as w

        return w
    import torchmetrics.aggregation as agg
    import torchmetrics.wrappers as w

    class _Both:  # torchmetrics keeps RunningMean/RunningSum in aggregation
        def __getattr__(self, name: str) -> Any:
            return getattr(w, name, None) or getattr(agg, name)

    return _Both()


def _collection(lib: str, metrics: dict) -> Any:
    if lib == "ours":
        from torchmetrics_diff import MetricCollection

        return MetricCollection(metrics)
    from torchmetrics import MetricCollection

    # torchmetrics infers compute groups from equal states; a ClasswiseWrapper grouped with its inner metric's
    # class then keeps its first value (a torchmetrics bug, listed in the decisions page): no groups here
    return MetricCollection(metrics, compute_groups=False)


def _flat(value: Any) -> Any:
    """Tensors as float64 (torchmetrics and we may differ in a value's float dtype, not in its digits)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(F64)
    if isinstance(value, dict):
        return {k: _flat(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_flat(v) for v in value)
    return value


def _rekey(value: dict[str, Any], inner: Any) -> dict[str, Any]:
    """Default classwise keys start with the inner metric's class name (``accuracy_`` here, ``multiclassaccuracy_``
    in torchmetrics): compared as ``class_``."""
    prefix = f"{type(inner).__name__.lower()}_"
    return {("class_" + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in value.items()}


def minmax(lib: str, rank: int, world: int) -> dict[str, Any]:
    """``update`` + ``compute`` after every step (the bounds move with each compute), reset, one more step;
    and a second wrapper driven by ``forward`` (its returns only: torchmetrics' forward drops the accumulated
    states of the inner metric, so its ``compute`` after ``forward`` is not a reference)."""
    out: dict[str, Any] = {}
    metric = _w(lib).MinMaxMetric(_mse(lib))
    for step in range(STEPS):
        metric.update(*local_batch("real", step, rank, world))
        out[f"compute {step}"] = metric.compute()
    metric.reset()
    metric.update(*local_batch("real", 0, rank, world))
    out["compute after reset"] = metric.compute()["raw"]
    stepped = _w(lib).MinMaxMetric(_mse(lib, dist_sync_on_step=True))
    for step in range(STEPS):
        out[f"forward {step}"] = stepped(*local_batch("real", step, rank, world))
    # ours also saves the bounds (min_val, max_val), as torchmetrics' main branch does and 1.9 does not
    # (tests/unittests/wrappers/test_minmax_state_dict.py): the other keys are compared
    out["state_dict"] = sorted(k for k in metric.state_dict() if k not in ("min_val", "max_val"))
    return _flat(out)


def classwise(lib: str, rank: int, world: int) -> dict[str, Any]:
    """``forward`` (synced on step) and ``compute`` per step, default keys and labels with a prefix, reset, and a
    collection holding a classwise wrapper and a plain metric."""
    out: dict[str, Any] = {}
    w = _w(lib)
    plain = w.ClasswiseWrapper(_acc(lib, average=None, dist_sync_on_step=True))
    named = w.ClasswiseWrapper(_acc(lib, average=None), labels=["a", "b", "c"], prefix="acc/")
    coll = _collection(lib, {"cw": w.ClasswiseWrapper(_acc(lib, average=None)), "acc": _acc(lib, average="macro")})
    for step in range(STEPS):
        batch = local_batch("multiclass", step, rank, world)
        out[f"forward {step}"] = _rekey(plain(*batch), plain.metric)
        named.update(*batch)
        coll.update(*batch)
        out[f"compute {step}"] = _rekey(plain.compute(), plain.metric)
        out[f"named compute {step}"] = named.compute()
        out[f"collection compute {step}"] = _rekey(coll.compute(), plain.metric)
    plain.reset()
    plain.update(*local_batch("multiclass", 2, rank, world))
    out["compute after reset"] = _rekey(plain.compute(), plain.metric)
    out["state_dict"] = sorted(plain.state_dict())
    return _flat(out)


def multitask(lib: str, rank: int, world: int) -> dict[str, Any]:
    """Two tasks (binary accuracy, MSE) with a prefix: ``update`` + ``compute`` per step, reset; ``forward``."""
    out: dict[str, Any] = {}
    w = _w(lib)
    metric = w.MultitaskWrapper({"cls": _binary_acc(lib), "reg": _mse(lib)}, prefix="val/")
    stepped = w.MultitaskWrapper(
        {"cls": _binary_acc(lib, dist_sync_on_step=True), "reg": _mse(lib, dist_sync_on_step=True)}
    )
    for step in range(STEPS):
        cls_batch, reg_batch = local_batch("binary", step, rank, world), local_batch("real", step, rank, world)
        preds, target = {"cls": cls_batch[0], "reg": reg_batch[0]}, {"cls": cls_batch[1], "reg": reg_batch[1]}
        metric.update(preds, target)
        out[f"compute {step}"] = metric.compute()
        out[f"forward {step}"] = stepped(preds, target)
        out[f"forward compute {step}"] = stepped.compute()
    metric.reset()
    out["keys"] = list(metric.keys())
    out["state_dict"] = sorted(metric.state_dict())
    return _flat(out)


def bootstrap(lib: str, rank: int, world: int) -> dict[str, Any]:
    """``update`` + ``compute`` per step with torch's global generator seeded alike for both libraries (the same
    resamples), poisson and multinomial, with quantile and raw values; reset."""
    out: dict[str, Any] = {}
    for strategy in ("poisson", "multinomial"):
        torch.manual_seed(1234 + rank)
        # torchmetrics: a copy whose resample was empty on one rank keeps its cached value there and skips the
        # sync the other ranks enter (a hang): its cache is off for the reference
        inner = _mse(lib) if lib == "ours" else _mse(lib, compute_with_cache=False)
        metric = _w(lib).BootStrapper(inner, num_bootstraps=4, quantile=0.25, raw=True, sampling_strategy=strategy)
        kind = "real" if strategy == "poisson" else "real, no empty rank"  # torchmetrics' multinomial refuses 0 rows
        for step in range(STEPS):
            metric.update(*local_batch(kind, step, rank, world))
            out[f"{strategy} compute {step}"] = metric.compute()
        metric.reset()
        metric.update(*local_batch(kind, 1, rank, world))
        out[f"{strategy} compute after reset"] = metric.compute()
    out["state_dict"] = sorted(metric.state_dict())
    return _flat(out)


def running(lib: str, rank: int, world: int) -> dict[str, Any]:
    """``Running(MSE, window=2)``, ``RunningMean`` and ``RunningSum`` (window 2): ``forward`` and ``compute`` per
    step (the window slides after the second), reset."""
    out: dict[str, Any] = {}
    w = _w(lib)
    metric = w.Running(_mse(lib, dist_sync_on_step=True), window=2)
    mean, total = w.RunningMean(window=2), w.RunningSum(window=2)
    for step in range(STEPS + 1):
        preds, target = local_batch("real", step % STEPS, rank, world)
        out[f"forward {step}"] = metric(preds, target)
        out[f"compute {step}"] = metric.compute()
        mean.update(preds)
        total.update(preds)
        out[f"mean {step}"] = mean.compute()
        out[f"sum {step}"] = total.compute()
    metric.reset()
    metric.update(*local_batch("real", 0, rank, world))
    out["compute after reset"] = metric.compute()
    out["state_dict"] = sorted(metric.state_dict())
    return _flat(out)


def tracker(lib: str, rank: int, world: int) -> dict[str, Any]:
    """A tracker of MSE and one of a collection (MSE, MAE): three epochs, ``compute_all``, ``best_metric``
    with and without the step, reset of the latest copy."""
    out: dict[str, Any] = {}
    w = _w(lib)
    single = w.MetricTracker(_mse(lib))
    if lib == "ours":
        from torchmetrics_diff import MeanAbsoluteError, MetricCollection
    else:
        from torchmetrics import MeanAbsoluteError, MetricCollection
    coll = w.MetricTracker(MetricCollection({"mse": _mse(lib), "mae": MeanAbsoluteError().set_dtype(F64)}))
    for epoch in range(STEPS):
        single.increment()
        coll.increment()
        for step in range(2):
            batch = local_batch("real", (epoch + step) % STEPS, rank, world)
            single.update(*batch)
            coll.update(*batch)
        out[f"compute {epoch}"] = single.compute()
        out[f"collection compute {epoch}"] = coll.compute()
    out["compute_all"] = single.compute_all()
    out["collection compute_all"] = coll.compute_all()
    out["best"] = single.best_metric()
    out["best, step"] = single.best_metric(return_step=True)
    out["collection best, step"] = coll.best_metric(return_step=True)
    out["n_steps"] = single.n_steps
    single.reset()
    single.update(*local_batch("real", 0, rank, world))
    out["compute_all after reset"] = single.compute_all()
    return _flat(out)


SCENARIOS: dict[str, Callable[[str, int, int], dict[str, Any]]] = {
    "MinMaxMetric": minmax,
    "ClasswiseWrapper": classwise,
    "MultitaskWrapper": multitask,
    "BootStrapper": bootstrap,
    "Running": running,
    "MetricTracker": tracker,
}


def compare(ours: Any, theirs: Any, where: str, failures: list[str]) -> None:
    """Record where ``ours`` and ``theirs`` differ (structure, keys, values to 1e-6)."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict) or list(ours) != list(theirs):
            failures.append(f"{where}: keys {list(ours) if isinstance(ours, dict) else ours!r} != {list(theirs)}")
            return
        for key in theirs:
            compare(ours[key], theirs[key], f"{where}[{key!r}]", failures)
    elif isinstance(theirs, (list, tuple)):
        if not isinstance(ours, (list, tuple)) or len(ours) != len(theirs):
            failures.append(f"{where}: {ours!r} != {theirs!r}")
            return
        for i, (a, b) in enumerate(zip(ours, theirs)):
            compare(a, b, f"{where}[{i}]", failures)
    elif isinstance(theirs, torch.Tensor):
        try:
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
        except (AssertionError, TypeError) as err:
            failures.append(f"{where}: {str(err).splitlines()[0]} (ours {ours}, torchmetrics {theirs})")
    elif isinstance(theirs, float) and isinstance(ours, float):
        if abs(ours - theirs) > 1e-6 * max(1.0, abs(theirs)):
            failures.append(f"{where}: {ours} != {theirs}")
    elif ours != theirs:
        failures.append(f"{where}: {ours!r} != {theirs!r}")


def side_by_side(rank: int, world: int, names: list[str] | None = None) -> list[str]:
    """Every scenario in both libraries on this rank; the differences."""
    failures: list[str] = []
    for name, scenario in SCENARIOS.items():
        if names is not None and name not in names:
            continue
        try:
            ours = scenario("ours", rank, world)
        except Exception as err:  # reported with the scenario's name
            failures.append(f"W={world} rank {rank} {name}: ours raised {type(err).__name__}: {err}")
            continue
        theirs = scenario("tm", rank, world)
        compare(ours, theirs, f"W={world} rank {rank} {name}", failures)
    return failures
