"""The wrappers on several gloo ranks: one collective per steady-state sync however many inner metrics a
wrapper (or a collection of wrappers) holds, exact one-device gradients through a wrapper's ``forward`` under
``DistributedDataParallel`` (float64, uneven batches, an empty rank), and values against brute force on the
concatenated batch at W=3.

Package modules covered: ``wrappers`` (``_base``'s flattened sync and batch-step protocol, every wrapper), with
``collections`` holding wrappers.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import Checks
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, bounds, generator
from tests.unittests.wrappers._cases import global_batch, local_batch
from torchmetrics_diff import Accuracy, MeanMetric, MeanSquaredError, MetricCollection
from torchmetrics_diff.wrappers import (
    BootStrapper,
    ClasswiseWrapper,
    MetricTracker,
    MinMaxMetric,
    MultitaskWrapper,
    Running,
)

pytestmark = pytest.mark.timeout(180)

GATHER = "_all_gather_flat"
SIZES = {2: [3, 0], 3: [3, 0, 2]}  # rows per rank of the gradient batch: uneven, rank 1 empty


def _mse(**kw: Any) -> MeanSquaredError:
    return MeanSquaredError(**kw).set_dtype(F64)


# ------------------------------------------------------------------------------------------ collectives
def _counts(rank: int, world: int) -> dict[str, list[str]]:
    """Per case: the collectives of its third call (the steady state)."""
    calls: dict[str, list[str]] = {}

    def steady(case: str, fn: Callable[[], Any], before: Callable[[], Any] = lambda: None) -> None:
        for _ in range(3):
            before()
            with record_collectives() as log:
                fn()
        calls[case] = list(log)

    preds, target = local_batch("real", 0, rank, world)
    cls_preds, cls_target = local_batch("multiclass", 0, rank, world)

    boot = BootStrapper(_mse(dist_sync_on_step=True), num_bootstraps=8, generator=rank)
    steady("BootStrapper(8 copies).compute", boot.compute, lambda: boot.update(preds, target))
    steady("BootStrapper(8 copies).forward", lambda: boot(preds, target))

    tracker = MetricTracker(_mse())
    for _ in range(4):
        tracker.increment()
        tracker.update(preds, target)
    steady("MetricTracker(4 epochs).compute_all", tracker.compute_all)

    running = Running(_mse(dist_sync_on_step=True), window=4)
    steady("Running(window 4).compute", running.compute, lambda: running.update(preds, target))
    steady("Running(window 4).forward", lambda: running(preds, target))

    multi = MultitaskWrapper({"a": _mse(dist_sync_on_step=True), "b": MeanMetric(dist_sync_on_step=True)})
    steady("MultitaskWrapper(2 tasks).forward", lambda: multi({"a": preds, "b": preds}, {"a": target, "b": target}))

    coll = MetricCollection(
        {
            "classwise": ClasswiseWrapper(
                Accuracy(task="multiclass", num_classes=3, average=None, dist_sync_on_step=True)
            ),
            "minmax": MinMaxMetric(Accuracy(task="multiclass", num_classes=3, dist_sync_on_step=True)),
            "boot": BootStrapper(Accuracy(task="multiclass", num_classes=3, dist_sync_on_step=True), 4, generator=rank),
            "acc": Accuracy(task="multiclass", num_classes=3, dist_sync_on_step=True),
        }
    )
    steady("collection of 3 wrappers + a metric, forward", lambda: coll(cls_preds, cls_target))
    steady("collection of 3 wrappers + a metric, compute", coll.compute, lambda: coll.update(cls_preds, cls_target))
    small = MetricCollection({k: coll[k].clone() for k in ("classwise", "acc")})  # (3 epochs' row fits the header)
    tracked = MetricTracker(small)
    for _ in range(3):
        tracked.increment()
        tracked.update(cls_preds, cls_target)
    steady("MetricTracker of that collection (3 epochs).compute_all", tracked.compute_all)
    return calls


@pytest.mark.parametrize("world_size", [2])
def test_steady_sync_is_one_collective(world_size: int) -> None:
    """Every wrapper (8 bootstrap copies, 4 tracked epochs, a window of 4, two tasks) and a collection holding
    three wrappers and a metric sync in one collective per call once the plan is agreed, the same on every
    rank; a tracker of that collection too."""
    results = run_distributed(_counts, world_size, timeout=120)
    problems = []
    for rank, calls in enumerate(results):
        for case, log in calls.items():
            if log != [GATHER]:
                problems.append(f"rank {rank} {case}: {log} (expected one {GATHER})")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ gradients
def _model() -> torch.nn.Linear:
    model = torch.nn.Linear(4, 1).to(F64)
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 4, generator=generator("wrapper model"), dtype=F64))
        model.bias.fill_(0.1)
    return model


def _data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = sum(SIZES[world])
    g = generator("wrapper grads", n)
    return torch.randn(n, 4, generator=g, dtype=F64), torch.randn(n, generator=g, dtype=F64)


Loss = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


def _mse_of(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return ((p - t) ** 2).mean()


def _losses() -> dict[str, tuple[Callable[[], Any], Loss, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]]:
    """Case -> (the wrapper, the loss from its forward, the one-device loss written out)."""
    cases = _mse_losses()
    out = {case: (make, loss_of, _mse_of) for case, (make, loss_of) in cases.items()}
    out["ClasswiseWrapper(MSE of 2 outputs)"] = (
        lambda: ClasswiseWrapper(_mse(dist_sync_on_step=True, num_outputs=2), labels=["p", "2p"]),
        lambda w, p, t: sum(w(torch.stack([p, 2 * p], -1), torch.stack([t, t], -1)).values()),
        lambda p, t: _mse_of(p, t) + _mse_of(2 * p, t),
    )
    out["MultitaskWrapper(MSE, MeanMetric)"] = (
        lambda: MultitaskWrapper(
            {"mse": _mse(dist_sync_on_step=True), "mean": MeanMetric(dist_sync_on_step=True).set_dtype(F64)}
        ),
        lambda w, p, t: sum(w({"mse": p, "mean": (p - t).abs()}, {"mse": t, "mean": torch.ones_like(t)}).values()),
        lambda p, t: _mse_of(p, t) + (p - t).abs().mean(),
    )
    out["collection of two wrappers"] = (
        lambda: MetricCollection(
            {"minmax": MinMaxMetric(_mse(dist_sync_on_step=True)), "running": Running(_mse(dist_sync_on_step=True), 2)}
        ),
        lambda w, p, t: (lambda v: v["raw"] + v["running"])(w(p, t)),
        lambda p, t: 2 * _mse_of(p, t),
    )
    return out


def _mse_losses() -> dict[str, tuple[Callable[[], Any], Loss]]:
    """Case -> (the wrapper, its loss from the wrapper's forward), each the global MSE."""
    return {
        "MinMaxMetric(MSE)": (
            lambda: MinMaxMetric(_mse(dist_sync_on_step=True)),
            lambda w, p, t: w(p, t)["raw"],
        ),
        "Running(MeanMetric)": (
            lambda: Running(MeanMetric(dist_sync_on_step=True).set_dtype(F64), window=2),
            lambda w, p, t: w((p - t) ** 2),
        ),
        "MetricTracker(MSE)": (
            lambda: _tracked(MetricTracker(_mse(dist_sync_on_step=True))),
            lambda w, p, t: w(p, t),
        ),
    }


def _tracked(tracker: MetricTracker) -> MetricTracker:
    tracker.increment()
    return tracker


def _grads(rank: int, world: int) -> dict[str, Any]:
    x, y = _data(world)
    lo, hi = bounds(SIZES[world], rank)
    out: dict[str, Any] = {}
    for case, (make, loss_of, _) in _losses().items():
        model = DistributedDataParallel(_model())
        wrapper = make()
        values = []
        for _ in range(2):  # two steps: the second runs on the agreed plan
            model.zero_grad()
            loss = loss_of(wrapper, model(x[lo:hi]).squeeze(-1), y[lo:hi])
            loss.backward()
            values.append(loss.detach())
        out[case] = {"values": values, "grads": [p.grad.clone() for p in model.parameters()]}
    return out


def _reference(world: int) -> dict[str, Any]:
    x, y = _data(world)
    out = {}
    for case, (_, _, one_device) in _losses().items():
        model = _model()
        loss = one_device(model(x).squeeze(-1), y)
        loss.backward()
        out[case] = {"value": loss.detach(), "grads": [p.grad.clone() for p in model.parameters()]}
    return out


@pytest.mark.parametrize("world_size", [3])
def test_forward_gradient_is_the_one_device_gradient(world_size: int) -> None:
    """A DDP model's loss taken from a wrapper's ``forward`` (float64; rows 3, 0, 2): value and every parameter
    gradient equal one process on the concatenated batch, to 1e-12, on every rank and at every step."""
    results = run_distributed(_grads, world_size, timeout=120)
    reference = _reference(world_size)
    checks = Checks(f"W={world_size} ")
    for rank, res in enumerate(results):
        for case, got in res.items():
            want = reference[case]
            for step, value in enumerate(got["values"]):
                checks.close(f"rank {rank} {case} value step {step}", value, want["value"])
            for i, (g, w) in enumerate(zip(got["grads"], want["grads"])):
                checks.close(f"rank {rank} {case} grad {i}", g, w)
    assert not checks.failures, "\n".join(checks.failures)


# ------------------------------------------------------------------------------------------ W=3 values
def _values(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tracker = MetricTracker(_mse())
    running = Running(_mse(), window=2)
    minmax = MinMaxMetric(_mse())
    classwise = ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None))
    for step in range(3):
        classwise.update(*local_batch("multiclass (empty rank)", step, rank, world))
        batch = local_batch("real", step, rank, world)
        tracker.increment()
        tracker.update(*batch)
        running.update(*batch)
        out[f"minmax {step}"] = minmax(*batch)
        out[f"running {step}"] = running.compute()
    out["compute_all"] = tracker.compute_all()
    out["minmax compute"] = minmax.compute()
    out["classwise"] = classwise.compute()
    return out


def test_values_at_three_ranks_equal_brute_force() -> None:
    """Tracker, window, bounds and per-class accuracy over 3 steps on 3 ranks (uneven, a rank empty): brute force
    on the concatenated batches (float64 means and per-class hit rates written out here)."""
    world = 3
    results = run_distributed(_values, world, timeout=120)

    def mse(steps: list[int]) -> torch.Tensor:
        pairs = [global_batch("real", s, world) for s in steps]
        return torch.cat([(p - t) ** 2 for p, t in pairs]).mean()

    checks = Checks("W=3 ")
    for rank, got in enumerate(results):
        # forward without dist_sync_on_step: the batch value is this rank's own (NaN-free: empty gives nan)
        checks.close(f"rank {rank} compute_all", got["compute_all"], torch.stack([mse([s]) for s in range(3)]))
        for step in range(3):
            checks.close(
                f"rank {rank} running {step}", got[f"running {step}"], mse(list(range(max(0, step - 1), step + 1)))
            )
        checks.close(f"rank {rank} minmax compute", got["minmax compute"]["raw"], mse([0, 1, 2]))
        preds, target = (
            torch.cat(t) for t in zip(*(global_batch("multiclass (empty rank)", s, world) for s in range(3)))
        )
        for c in range(3):
            hits = (preds[target == c] == c).double()
            want = hits.mean() if len(hits) else torch.tensor(0.0, dtype=F64)
            checks.close(f"rank {rank} classwise {c}", got["classwise"][f"accuracy_{c}"].double(), want, rtol=1e-6)
    assert not checks.failures, "\n".join(checks.failures)


# ------------------------------------------------------------------------------------------ failures
def _failing_forward(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 feeds a batch whose shapes disagree inside the forward of wrappers syncing on step."""
    preds, target = local_batch("real, no empty rank", 0, rank, world)
    out: dict[str, Any] = {}
    wrappers = {
        "BootStrapper": BootStrapper(_mse(dist_sync_on_step=True), num_bootstraps=3, generator=0),
        "MultitaskWrapper": MultitaskWrapper({"a": _mse(dist_sync_on_step=True), "b": _mse(dist_sync_on_step=True)}),
        "Running": Running(_mse(dist_sync_on_step=True), window=2),
    }

    def call(name: str, w: Any, p: torch.Tensor, t: torch.Tensor) -> Any:
        return w({"a": p, "b": p}, {"a": t, "b": t}) if name == "MultitaskWrapper" else w(p, t)

    for name, w in wrappers.items():
        call(name, w, preds, target)
        before = w.compute()
        bad = target[:-1] if rank == 1 else target
        try:
            call(name, w, preds, bad)
            out[f"{name} raised"] = None
        except Exception as err:
            out[f"{name} raised"] = type(err).__name__
        out[f"{name} unchanged"] = bool(
            all(torch.equal(a, b) for a, b in zip(_leaves(w.compute()), _leaves(before))) and w.update_count == 1
        )
        call(name, w, preds, target)  # and the next call works
        out[f"{name} count after"] = w.update_count
    try:
        BootStrapper(_mse(), sampling_strategy="bayesian")
    except ValueError as err:
        out["bad strategy message"] = str(err)
    return out


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    return [value]


def test_a_failing_forward_raises_on_every_rank_and_changes_nothing() -> None:
    """A bad batch on rank 1 only: every rank raises (rank 1 its own error, rank 0 a ``RuntimeError`` naming rank
    1) instead of waiting; both keep their states and count; the next call works. A bad argument's message names
    it, what was expected and what came."""
    results = run_distributed(_failing_forward, 2, timeout=120)
    problems = []
    for rank, res in enumerate(results):
        for name in ("BootStrapper", "MultitaskWrapper", "Running"):
            if res[f"{name} raised"] is None:
                problems.append(f"rank {rank} {name}: did not raise")
            if not res[f"{name} unchanged"]:
                problems.append(f"rank {rank} {name}: states or count changed by the failed call")
            if res[f"{name} count after"] != 2:
                problems.append(f"rank {rank} {name}: update_count {res[f'{name} count after']} after the next call")
        message = res["bad strategy message"]
        if not all(word in message for word in ("sampling_strategy", "poisson", "bayesian")):
            problems.append(f"rank {rank}: message {message!r}")
    assert not problems, "\n".join(problems)
