"""``torchmetrics_diff.collections``: ``MetricCollection``'s constructor checks, copies, device moves, the rollback
of a call whose member raises, and compute groups whose followers read the leader's synced states.

The collection's sync, its parity with torchmetrics' ``MetricCollection`` and its compile behaviour are covered by
the concern suites (``contract/test_sync.py``, ``parity/test_collection_parity.py``, ``compile/``).
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from tests._helpers.checks import tensor_devices
from tests._helpers.harness import run_distributed
from tests._helpers.metrics import InPlace
from tests._helpers.outcomes import expect_error, members_differences, snapshot
from torchmetrics_diff import CatMetric, MeanMetric, MetricCollection, SumMetric

META = torch.device("meta")


def test_collection_pickle_and_clone() -> None:
    coll = MetricCollection([SumMetric(), MeanMetric()], prefix="p/")
    coll.update(torch.tensor([1.0, 3.0]))
    for name, other in {"pickle": pickle.loads(pickle.dumps(coll)), "clone": coll.clone(postfix="/x")}.items():
        other.update(torch.tensor([5.0]))
        out = other.compute()
        suffix = "/x" if name == "clone" else ""
        assert out == {f"p/SumMetric{suffix}": torch.tensor(9.0), f"p/MeanMetric{suffix}": torch.tensor(3.0)}, name
    assert coll.compute() == {"p/SumMetric": torch.tensor(4.0), "p/MeanMetric": torch.tensor(2.0)}


def test_collection_duplicate_names() -> None:
    expect_error(lambda: MetricCollection([SumMetric(), SumMetric()]), ValueError, "'SumMetric'", "dict")
    expect_error(lambda: MetricCollection([MetricCollection([MeanMetric()]), MeanMetric()]), ValueError, "'MeanMetric'")


@pytest.mark.parametrize(("member", "type_name"), [(3, "int"), ("x", "str"), (nn.Linear(2, 2), "Linear")])
def test_collection_non_metric_members(member: Any, type_name: str) -> None:
    expect_error(lambda: MetricCollection([SumMetric(), member]), ValueError, "Metric", type_name)
    expect_error(lambda: MetricCollection({"a": SumMetric(), "b": member}), ValueError, "Metric", type_name)


def test_collection_bad_metrics_and_prefix() -> None:
    expect_error(lambda: MetricCollection(3), ValueError, "`metrics`", "int")
    expect_error(lambda: MetricCollection([SumMetric()], prefix=3), ValueError, "`prefix`", "int")
    expect_error(lambda: MetricCollection([SumMetric()], postfix=b"x"), ValueError, "`postfix`", "bytes")


def _pair(**kwargs: Any) -> MetricCollection:
    return MetricCollection({"a": SumMetric(), "b": SumMetric(), "m": MeanMetric()}, **kwargs)


@pytest.mark.parametrize(
    ("groups", "needles"),
    [
        ([["a", "c"]], ("compute group", "'c'", "['a', 'b', 'm']")),
        ([[]], ("compute group", "must name members")),
        ([["a", "b"], ["b", "a"]], ("compute groups", "'b'")),
        ([["a", "m"]], ("compute group", "'m'", "'a'", "states")),
    ],
    ids=["unknown member", "empty group", "member in two groups", "different states"],
)
def test_collection_bad_compute_groups(groups: Any, needles: tuple) -> None:
    expect_error(lambda: _pair(compute_groups=groups), ValueError, *needles)


@pytest.mark.parametrize(("groups", "shown"), [([3], "3"), (3, "3")], ids=["[3]", "3"])
def test_collection_compute_groups_of_a_bad_type(groups: Any, shown: str) -> None:
    """``compute_groups`` must be lists of member names; anything else deserves the same clear ValueError, not
    ``TypeError: 'int' object is not iterable`` from deep inside the check."""
    expect_error(lambda: _pair(compute_groups=groups), ValueError, "compute", shown)


def test_collection_follows_to_another_device() -> None:
    coll = MetricCollection([SumMetric(nan_strategy="disable"), CatMetric(nan_strategy="disable")]).to("meta")
    coll.update(torch.ones(2, device=META))
    assert all(m.device == META for m in coll.values())
    assert tensor_devices(coll.compute()) == {META}


def _collection() -> MetricCollection:
    return MetricCollection(
        {"sum": SumMetric(), "cat": CatMetric(), "mean": MeanMetric(nan_strategy="error"), "inplace": InPlace()}
    )


@pytest.mark.parametrize("how", ["update", "forward"])
def test_collection_call_that_raises_in_one_member_leaves_every_member_untouched(how: str) -> None:
    """A member that raises must not leave the members before it updated: a retry would count their batch twice.
    (``forward`` is rolled back for every member; ``update`` should be too.)"""
    coll = _collection()
    coll.update(torch.tensor([1.0, 2.0]))
    before = {k: snapshot(m) for k, m in coll.items()}
    call = coll.update if how == "update" else coll
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SumMetric/CatMetric drop the NaN with a warning
        with pytest.raises(RuntimeError, match="NaN"):
            call(torch.tensor([4.0, float("nan")]))
    assert not members_differences(before, coll), members_differences(before, coll)


def _groups_body(rank: int, world: int) -> dict[str, Any]:
    """A compute group {a, b} of two SumMetrics and a lone MaxMetric: values and collectives of compute()."""
    from tests._helpers.collectives import record_collectives
    from torchmetrics_diff import MaxMetric

    coll = MetricCollection({"a": SumMetric(), "b": SumMetric(), "c": MaxMetric()}, compute_groups=[["a", "b"]])
    coll.update(torch.tensor([float(rank + 1)]))
    coll.compute()  # the first sync agrees a plan
    coll.update(torch.tensor([float(rank + 1)]))
    with record_collectives() as log:
        out = coll.compute()
    return {k: v.item() for k, v in out.items()} | {"collectives": len(log)}


def test_compute_group_followers_read_the_synced_states_once() -> None:
    """The follower's value is the leader's global one (not synced a second time), in the one collective (the
    call's header exchange, which carries the small row of CPU states inline)."""
    results = run_distributed(_groups_body, 2, timeout=60)
    total = 2 * (1 + 2)  # two updates of rank + 1 on each of 2 ranks
    for r in results:
        assert r["a"] == r["b"] == total, r
        assert r["c"] == 2.0, r
        assert r["collectives"] == 1, r
