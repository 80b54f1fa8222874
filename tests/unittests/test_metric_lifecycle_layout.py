"""``Metric``'s lifecycle in one place, and ``forward``'s eager step equal to the protocol's loop.

- ``Metric`` has no base class but ``nn.Module``: its lifecycle (``update``, ``forward``, ``compute``, ``sync``,
  ``reset``, ``state_dict``'s hooks, pickling, copies) is written in ``metric.py``, and one module of functions,
  ``_state_sync``, faces the sync engine.
- An eager, unsynced ``forward`` runs the batch step inline (``Metric.forward``); every other step runs the
  protocol's loop over the hooks (``_batch_step.run_batch_step``). Both give the same values, states, counts,
  cached values, warnings and errors, and an inline step leaves the defaults untouched (it starts from them
  when the class's ``update`` replaces its states).
- Following a warmed-up ``MeanMetric.forward`` without a process group runs code in at most four package files.

Package modules covered: ``metric``, ``_state_sync``, ``_batch_step``, ``aggregation``.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import torchmetrics_diff
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, Metric, SumMetric
from torchmetrics_diff import metric as metric_module

PACKAGE_DIR = os.path.dirname(torchmetrics_diff.__file__)


def test_metric_has_no_base_class_but_nn_module() -> None:
    assert Metric.__mro__ == (Metric, nn.Module, object)


@pytest.mark.parametrize(
    "name",
    [
        "add_state",
        "update",
        "compute",
        "forward",
        "merge_state",
        "reset",
        "sync",
        "unsync",
        "sync_context",
        "persistent",
        "_save_to_state_dict",
        "_load_from_state_dict",
        "__getstate__",
        "__setstate__",
        "__deepcopy__",
        "_apply",
        "clone",
        "set_dtype",
        "__repr__",
        "plot",
        "_begin_batch",
        "_update_batch",
        "_sync_batch",
        "_batch_value",
        "_finish_batch",
        "_abort_batch",
    ],
)
def test_the_lifecycle_is_written_in_metric_py(name: str) -> None:
    assert name in Metric.__dict__, name
    assert inspect.getsourcefile(inspect.unwrap(Metric.__dict__[name])) == metric_module.__file__


def test_one_module_faces_the_sync_engine() -> None:
    assert importlib.util.find_spec("torchmetrics_diff._state_sync") is not None
    for gone in ("_metric_sync", "_metric_syncing", "_metric_states", "_metric_persistence", "_metric_display"):
        assert importlib.util.find_spec(f"torchmetrics_diff.{gone}") is None, gone


class _Loop:
    """Mixed into a metric class: a hook of its own (the same behaviour), so ``forward`` takes the loop."""

    def _batch_value(self) -> Any:
        return super()._batch_value()  # type: ignore[misc]


class _LoopMean(_Loop, MeanMetric):
    pass


class _LoopSum(_Loop, SumMetric):
    pass


class _LoopMax(_Loop, MaxMetric):
    pass


class _LoopCat(_Loop, CatMetric):
    pass


class _Running(Metric):
    """A ``mean`` state (the merge reads the update count) and an in-place update (no ``_replaces_states``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("avg", torch.tensor(0.0), dist_reduce_fx="mean")

    def update(self, x: torch.Tensor) -> None:
        if x.isnan().any():
            raise ValueError("NaN")
        self.avg += x.mean()

    def compute(self) -> torch.Tensor:
        return self.avg


class _LoopRunning(_Loop, _Running):
    pass


class _Replayed(_Running):
    full_state_update = True


class _LoopReplayed(_Loop, _Replayed):
    pass


PAIRS: dict[str, tuple[Callable[[], Metric], Callable[[], Metric]]] = {
    "mean": (MeanMetric, _LoopMean),
    "mean ignore": (lambda: MeanMetric(nan_strategy="ignore"), lambda: _LoopMean(nan_strategy="ignore")),
    "mean error": (lambda: MeanMetric(nan_strategy="error"), lambda: _LoopMean(nan_strategy="error")),
    "sum": (SumMetric, _LoopSum),
    "sum float64": (lambda: SumMetric().set_dtype(torch.float64), lambda: _LoopSum().set_dtype(torch.float64)),
    "max": (MaxMetric, _LoopMax),
    "cat": (CatMetric, _LoopCat),
    "cat on cpu": (lambda: CatMetric(compute_on_cpu=True), lambda: _LoopCat(compute_on_cpu=True)),
    "running": (_Running, _LoopRunning),
    "replayed": (_Replayed, _LoopReplayed),
}

BATCHES = [
    torch.tensor([1.0, 2.0, 3.0]),
    torch.tensor([0.5, float("nan")]),
    torch.tensor([]),
    torch.tensor([4.0, -1.0], dtype=torch.float16),
    torch.tensor([2.0, 8.0], dtype=torch.float64),
    torch.tensor(5.0, requires_grad=True),
]


def _run(make: Callable[[], Metric]) -> list[Any]:
    metric = make()
    name = type(metric).__mro__[2 if isinstance(metric, _Loop) else 0].__name__  # (messages name the class)

    def said(caught: list[warnings.WarningMessage]) -> list[str]:
        return [str(w.message).replace(type(metric).__name__, name) for w in caught]

    seen: list[Any] = []
    for batch in BATCHES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = metric(batch)
                out: Any = ("value", value.detach().clone(), value.dtype, value.requires_grad)
            except Exception as err:  # (the error is part of what must agree)
                out = ("error", type(err).__name__, str(err).replace(type(metric).__name__, name))
        states = {
            n: [t.clone() for t in v] if isinstance(v, list) else v.clone() for n, v in metric.metric_state.items()
        }
        cached = metric._forward_cache
        seen.append((out, states, metric.update_count, cached, said(caught)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen.append((metric.compute(), said(caught)))
    return seen


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_the_inline_step_equals_the_protocol_loop(case: str) -> None:
    inline, loop = PAIRS[case]
    assert inline()._inline_step and not loop()._inline_step
    assert _same(_run(inline), _run(loop))


def test_a_failing_inline_step_leaves_the_metric_as_it_was() -> None:
    metric = _Running()
    metric(torch.tensor([1.0, 3.0]))
    before = (metric.avg.clone(), metric.update_count, metric.compute())
    with pytest.raises(ValueError, match="NaN"):
        metric(torch.tensor([float("nan")]))
    assert _same((metric.avg, metric.update_count, metric.compute()), before)


def test_the_inline_step_never_changes_the_defaults() -> None:
    metric = MaxMetric()
    value = metric(torch.tensor([]))  # an empty batch leaves the state as it began: the default itself
    value.add_(1.0)  # the caller owns what forward returned
    assert metric._defaults["max_value"].item() == float("-inf")
    assert metric(torch.tensor([2.0])).item() == 2.0


def test_an_update_of_its_own_says_for_itself_whether_it_replaces_states() -> None:
    class InPlace(SumMetric):
        def update(self, value: torch.Tensor) -> None:  # type: ignore[override]
            self.sum_value += value.sum()

    class Inherits(SumMetric):
        pass

    assert SumMetric._replaces_states and Inherits._replaces_states and not InPlace._replaces_states
    metric = InPlace()
    assert metric(torch.tensor([1.0, 2.0])).item() == 3.0
    assert metric(torch.tensor([1.0])).item() == 1.0  # the default was copied, not changed in place
    assert metric.compute().item() == 4.0


def test_an_eager_mean_forward_runs_in_at_most_four_package_files() -> None:
    metric = MeanMetric()
    x = torch.randn(16)
    for _ in range(3):
        metric(x)
    files: set[str] = set()

    def record(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE_DIR):
            files.add(os.path.relpath(frame.f_code.co_filename, PACKAGE_DIR))

    sys.setprofile(record)
    try:
        metric(x)
    finally:
        sys.setprofile(None)
    assert "metric.py" in files and "aggregation.py" in files
    assert len(files) <= 4, sorted(files)
