"""``torchmetrics_diff.metric``: the ``Metric`` lifecycle in one process: state_dict, pickling, copies, devices and
dtypes, ``merge_state``, ``reset``, the compute cache, and forward's cost not growing with the number of accumulated
steps."""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.metrics import SoftmaxScore, softmax_score_ref
from tests._helpers.seeds import F64, rand
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, Metric, SumMetric


class Kinds(Metric):
    """One state per reduction: sum, cat (list), max, mean (the batch mean of the last update), int count."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("seen", [], dist_reduce_fx="cat")
        self.add_state("peak", torch.tensor(float("-inf")), dist_reduce_fx="max")
        self.add_state("avg", torch.tensor(0.0), dist_reduce_fx="mean")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")
        self.compute_calls = 0

    def update(self, x: torch.Tensor) -> None:
        self.total += x.sum()  # in place, as many torchmetrics subclasses write it
        self.seen.append(x)
        self.peak = torch.maximum(self.peak, x.max())
        self.avg = x.mean()
        self.count = self.count + x.numel()

    def compute(self) -> dict[str, torch.Tensor]:
        self.compute_calls += 1
        seen = torch.cat(list(self.seen)) if self.seen else torch.zeros(0)
        return {"total": self.total, "seen": seen, "peak": self.peak, "avg": self.avg}


def _kinds(*batches: list[float]) -> Kinds:
    m = Kinds()
    for b in batches:
        m.update(torch.tensor(b))
    return m


def _state_values(m: Metric) -> dict[str, Any]:
    return {k: [t.clone() for t in v] if isinstance(v, list) else v.clone() for k, v in m.metric_state.items()}


# ------------------------------------------------------------------------------------- state_dict and copies


def test_state_dict_round_trip_persistent_states_only() -> None:
    m = _kinds([1.0, 2.0], [5.0])
    assert m.state_dict() == {}, "states are not persistent by default"
    m.persistent(True)
    sd = m.state_dict()
    assert set(sd) == {"total", "seen", "peak", "avg", "count"}, f"keys {sorted(sd)}"
    for key, value in sd.items():
        for t in value if isinstance(value, list) else [value]:
            assert t.grad_fn is None and not t.requires_grad, f"state_dict[{key!r}] is not detached"
    fresh = Kinds()
    fresh.load_state_dict(sd)
    checks = Checks("load_state_dict ")
    checks.close("states", _state_values(fresh), _state_values(m), atol=0, rtol=0)
    # nested in a parent module: prefixed keys; strict loading reports a missing persistent state
    parent = nn.ModuleDict({"metric": _kinds([3.0])})
    parent["metric"].persistent(True)
    assert "metric.total" in parent.state_dict(), f"parent keys {sorted(parent.state_dict())}"
    target = nn.ModuleDict({"metric": Kinds()})
    target["metric"].persistent(True)
    target.load_state_dict(parent.state_dict())
    checks.close("nested", _state_values(target["metric"]), _state_values(parent["metric"]), atol=0, rtol=0)
    partial = {k: v for k, v in parent.state_dict().items() if k != "metric.peak"}
    with pytest.raises(RuntimeError, match=r"metric\.peak"):
        target.load_state_dict(partial)

    # add_state(persistent=True)
    class Saved(Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("kept", torch.tensor(2.0), persistent=True)
            self.add_state("dropped", torch.tensor(3.0), persistent=False)

        def update(self) -> None:
            pass

        def compute(self) -> torch.Tensor:
            return self.kept

    assert set(Saved().state_dict()) == {"kept"}
    assert_no_failures(checks.failures)


def test_loaded_states_are_independent_of_the_source() -> None:
    """``load_state_dict`` copies values like ``nn.Module`` does for buffers: updating the loaded metric (in place,
    as ``self.total += ...`` does) must not change the metric the state_dict came from."""
    source = _kinds([1.0, 2.0])
    source.persistent(True)
    target = Kinds()
    target.load_state_dict(source.state_dict())
    target.update(torch.tensor([10.0]))
    assert source.total.item() == 3.0, f"the source's `total` changed to {source.total.item()} (states are aliased)"
    assert len(source.seen) == 1, "the source's list state grew"


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "clone"])
def test_copies_are_equal_and_independent(how: str) -> None:
    m = _kinds([1.0, 2.0], [4.0])
    copied = {
        "pickle": lambda: pickle.loads(pickle.dumps(m)),
        "deepcopy": lambda: copy.deepcopy(m),
        "clone": m.clone,
    }[how]()
    assert type(copied) is Kinds
    checks = Checks(f"{how} ")
    checks.close("states", _state_values(copied), _state_values(m), atol=0, rtol=0)
    checks.true("update_count", copied.update_count == 2, f"{copied.update_count}")
    before = _state_values(m)
    copied.update(torch.tensor([100.0]))  # `total` in place, `seen` appended
    checks.close("original unchanged after updating the copy", _state_values(m), before, atol=0, rtol=0)
    checks.close("copy", copied.compute()["total"], torch.tensor(107.0))
    checks.close("original", m.compute()["total"], torch.tensor(7.0))
    # the copy's lifecycle still works (wrapped update/compute, forward)
    checks.close("copy forward", copied(torch.tensor([1.0, 1.0]))["total"], torch.tensor(2.0))
    assert_no_failures(checks.failures)


# --------------------------------------------------------------------------------------------- device, dtype


def test_to_cpu_keeps_states() -> None:
    m = _kinds([1.0, 2.0])
    before = _state_values(m)
    assert m.to("cpu") is m
    assert m.device == torch.device("cpu")
    Checks().close("states after .to('cpu')", _state_values(m), before, atol=0, rtol=0)


def test_set_dtype_double_and_parent_half() -> None:
    m = _kinds([1.0, 2.0])
    assert m.set_dtype(F64) is m
    assert m.dtype == F64
    for name, value in m.metric_state.items():
        for t in value if isinstance(value, list) else [value]:
            expected = torch.int64 if name == "count" else F64
            assert t.dtype == expected, f"set_dtype: state {name!r} is {t.dtype}"
    m.reset()
    assert m.total.dtype == F64 and m.peak.dtype == F64 and m.count.dtype == torch.int64, "reset lost the dtype"
    m.update(torch.tensor([1.0]))
    assert m.total.dtype == F64, f"update into a float64 metric gave {m.total.dtype}"

    metric = _kinds([1.0, 2.0])
    parent = nn.Sequential(nn.Linear(2, 2), metric).half()
    assert parent[0].weight.dtype == torch.float16, "the Linear must become half"
    assert metric.total.dtype == torch.float32 and metric.peak.dtype == torch.float32, "a parent's cast changed states"
    assert metric.seen[0].dtype == torch.float32 and metric.dtype == torch.float32
    metric.reset()
    assert metric.total.dtype == torch.float32, "a parent's cast changed the defaults"


# every nn.Module dtype method is a no-op on the states (set_dtype is the one way). torchmetrics agrees for
# double/float/half/bfloat16/type, but its `.to(dtype)` casts the states (a parent's `.to(torch.float16)` too):
# the one difference, kept on purpose (docs/guide/decisions.rst)
_DTYPE_METHODS = {
    "to(float64)": (lambda m: m.to(torch.float64), torch.float64),
    "to(cpu, float16)": (lambda m: m.to("cpu", torch.float16), torch.float16),
    "double()": (lambda m: m.double(), torch.float32),
    "float()": (lambda m: m.float(), torch.float32),
    "half()": (lambda m: m.half(), torch.float32),
    "bfloat16()": (lambda m: m.bfloat16(), torch.float32),
    "type(float64)": (lambda m: m.type(torch.float64), torch.float32),
}


@pytest.mark.parametrize("method", list(_DTYPE_METHODS))
@pytest.mark.parametrize("through_parent", [False, True], ids=["metric", "parent"])
def test_dtype_methods_never_cast_states(method: str, through_parent: bool) -> None:
    import torchmetrics

    apply, torchmetrics_dtype = _DTYPE_METHODS[method]
    ours, theirs = SumMetric(), torchmetrics.SumMetric()
    for m in (ours, theirs):
        m.update(torch.tensor([1.0, 2.0]))
    if through_parent:
        apply(nn.Sequential(nn.Linear(2, 2), ours))
        apply(nn.Sequential(nn.Linear(2, 2), theirs))
    else:
        assert apply(ours) is ours, f"{method} must return the metric"
        apply(theirs)
    assert theirs.sum_value.dtype == torchmetrics_dtype, f"torchmetrics' {method} now gives {theirs.sum_value.dtype}"
    assert ours.sum_value.dtype == torch.float32 and ours.dtype == torch.float32, f"{method} cast the states"
    ours.update(torch.tensor([3.0], dtype=torch.float64))
    assert ours.compute().dtype == torch.float32 and ours.compute().item() == 6.0
    ours.reset()
    assert ours.sum_value.dtype == torch.float32, f"{method} changed the default's dtype"


def test_set_dtype_refuses_half_and_non_floating() -> None:
    m = SumMetric().set_dtype("float64")
    assert m.sum_value.dtype == F64
    for bad in (torch.float16, torch.bfloat16, "half", torch.int64, "nonsense", 3):
        with pytest.raises(ValueError, match="`dst_type` must be"):
            m.set_dtype(bad)
    assert m.sum_value.dtype == F64 and m.dtype == F64, "a refused set_dtype changed the states"


# ------------------------------------------------------------------------------------------------ merge_state


def test_merge_state_sum_cat_max_mean_and_cache() -> None:
    a_batches = [[1.0, 2.0], [7.0], [3.0, 3.0]]  # 3 updates, avg = last batch mean = 3
    b_batches = [[10.0, -4.0]]  # 1 update, avg = 3
    a, b = _kinds(*a_batches), _kinds(*b_batches)
    b.avg = torch.tensor(11.0)  # make the weighting visible: (3 * 3 + 1 * 11) / 4 = 5
    first = a.compute()
    a.merge_state(b)
    merged = a.compute()
    everything = np.concatenate([np.array(x) for x in a_batches + b_batches])
    checks = Checks("merge_state ")
    checks.true("cache", a.compute_calls == 2, f"compute ran {a.compute_calls} times (merge must clear the cache)")
    checks.true("cache", merged["total"].item() != first["total"].item(), "stale cached value after merge")
    checks.close("total (sum)", merged["total"], torch.tensor(everything.sum(), dtype=torch.float32))
    checks.close("seen (cat)", merged["seen"], torch.tensor(everything, dtype=torch.float32))
    checks.close("peak (max)", merged["peak"], torch.tensor(everything.max(), dtype=torch.float32))
    checks.close("avg (mean weighted by update counts)", merged["avg"], torch.tensor((3 * 3.0 + 1 * 11.0) / 4))
    checks.true("update_count", a.update_count == 4, f"{a.update_count}")
    checks.close("incoming unchanged", b.compute()["total"], torch.tensor(6.0))
    # merging a dict of states counts as one update
    c = _kinds([1.0])
    c.merge_state(
        {
            "total": torch.tensor(2.0),
            "seen": [torch.tensor([5.0])],
            "peak": torch.tensor(9.0),
            "avg": torch.tensor(3.0),
            "count": torch.tensor(1),
        }
    )
    out = c.compute()
    checks.close("dict total", out["total"], torch.tensor(3.0))
    checks.close("dict seen", out["seen"], torch.tensor([1.0, 5.0]))
    checks.close("dict peak", out["peak"], torch.tensor(9.0))
    checks.close("dict avg", out["avg"], torch.tensor(2.0))
    assert_no_failures(checks.failures)
    with pytest.raises(ValueError, match="incoming_state"):
        c.merge_state(SumMetric())
    with pytest.raises(ValueError, match="incoming_state"):
        c.merge_state({"total": torch.tensor(1.0)})


def test_merge_state_with_a_never_updated_metric_keeps_mean_states() -> None:
    """Mean states are weighted by update counts: a metric with zero updates has weight zero."""
    a = _kinds([3.0, 3.0], [5.0, 1.0])  # avg = 3 (mean of the last batch), 2 updates
    a.merge_state(Kinds())
    assert a.update_count == 2
    out = a.compute()
    assert out["avg"].item() == 3.0, f"avg moved to {out['avg'].item()} towards the empty metric's default"
    assert out["total"].item() == 12.0 and out["peak"].item() == 5.0 and out["seen"].tolist() == [3, 3, 5, 1]


def test_merge_state_of_aggregators_equals_numpy_on_all_data() -> None:
    x, y = rand((7,), "merge", "x", dtype=torch.float32), rand((4,), "merge", "y", dtype=torch.float32)
    both = np.concatenate([x.numpy(), y.numpy()])
    expected = {MeanMetric: both.mean(), SumMetric: both.sum(), MaxMetric: both.max(), CatMetric: both}
    for cls, ref in expected.items():
        a, b = cls(), cls()
        a.update(x)
        b.update(y)
        a.merge_state(b)
        np.testing.assert_allclose(a.compute().numpy(), ref, rtol=1e-6, err_msg=cls.__name__)


# ------------------------------------------------------------------------------------ reset, count and cache


def test_reset_update_count_cache_and_warning() -> None:
    m = Kinds()
    with pytest.warns(UserWarning, match="before update"):
        m.compute()
    m.update(torch.tensor([1.0, 2.0]))
    m(torch.tensor([4.0]))
    assert m.update_count == 2, "update and forward both count"
    calls = m.compute_calls
    first = m.compute()
    assert m.compute() is first and m.compute_calls == calls + 1, "compute is cached until the next update"
    m.update(torch.tensor([10.0]))
    calls = m.compute_calls
    assert m.compute()["total"].item() == 17.0 and m.compute_calls == calls + 1, "recomputed after update"
    m(torch.tensor([1.0]))  # forward computes the batch value itself
    calls = m.compute_calls
    assert m.compute()["total"].item() == 18.0 and m.compute_calls == calls + 1, "recomputed after forward"
    assert m.compute()["total"].item() == 18.0 and m.compute_calls == calls + 1, "cached again"
    m.reset()
    assert m.update_count == 0
    for name, value in m.metric_state.items():
        default = {
            "total": torch.tensor(0.0),
            "seen": [],
            "peak": torch.tensor(float("-inf")),
            "avg": torch.tensor(0.0),
            "count": torch.tensor(0),
        }[name]
        if isinstance(default, list):
            assert value == [], f"reset: {name} = {value}"
        else:
            assert torch.equal(value, default) and value.dtype == default.dtype, f"reset: {name} = {value}"
    with pytest.warns(UserWarning, match="before update"):
        m.compute()  # the cache was cleared too: the default states, not the old value
    no_cache = Kinds(compute_with_cache=False)
    no_cache.update(torch.tensor([1.0]))
    no_cache.compute()
    no_cache.compute()
    assert no_cache.compute_calls == 2, "compute_with_cache=False recomputes"


def test_reset_restores_defaults_after_in_place_updates() -> None:
    """An in-place ``update`` (``self.total += ...``) must never alter the default that ``reset`` restores."""
    m = _kinds([5.0])
    m.reset()
    assert m.total.item() == 0.0, f"reset gave total={m.total.item()}"
    m(torch.tensor([2.0]))  # forward starts from fresh defaults too
    m.reset()
    m.update(torch.tensor([1.0]))
    assert m.compute()["total"].item() == 1.0


def test_bad_constructor_arguments() -> None:
    for kwargs, word in (
        ({"grad_reduction": "max"}, "grad_reduction"),
        ({"dist_sync_on_step": 1}, "dist_sync_on_step"),
        ({"unknown": True}, "unknown"),
        ({"dist_sync_fn": 3}, "dist_sync_fn"),
    ):
        with pytest.raises(ValueError, match=word):
            SumMetric(**kwargs)
    with pytest.raises(ValueError, match="dist_reduce_fx"):
        SumMetric().add_state("x", torch.tensor(0.0), dist_reduce_fx="median")
    with pytest.raises(ValueError, match="default"):
        SumMetric().add_state("x", [torch.tensor(0.0)])


# ---------------------------------------------------------------------------------------- forward cost


def test_forward_does_not_copy_accumulated_states() -> None:
    """After 2000 steps a CatMetric forward still returns only the batch's values, appends one element, and leaves
    the accumulated elements themselves untouched (same objects: nothing cloned or concatenated per step)."""
    m = CatMetric()
    first: list[torch.Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(2000):
            batch = torch.tensor([float(step), -float(step)])
            out = m(batch)
            if step < 5:
                first.append(m.value[-1])
            assert torch.equal(out, batch), f"step {step}: forward returned {out}"
            assert len(m.value) == step + 1, f"step {step}: {len(m.value)} accumulated elements"
    assert all(m.value[i] is first[i] for i in range(5)), "earlier accumulated elements were replaced"
    assert torch.equal(m.value[1999], torch.tensor([1999.0, -1999.0]))
    total = m.compute()
    assert total.shape == (4000,) and total[:4].tolist() == [0.0, -0.0, 1.0, -1.0]


def test_forward_returns_batch_value_and_compute_all_batches() -> None:
    score = SoftmaxScore()
    x1, x2 = rand((3, 2), "fwd", 1), rand((4, 2), "fwd", 2)
    v1 = score(x1)
    score.update(x2)
    checks = Checks()
    checks.close("batch value", v1, softmax_score_ref(x1))
    checks.close("epoch value", score.compute(), softmax_score_ref(torch.cat([x1, x2])))
    assert_no_failures(checks.failures)
