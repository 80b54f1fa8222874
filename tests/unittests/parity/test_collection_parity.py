"""``MetricCollection`` against torchmetrics' on the same structures: keys, lookup, outputs, groups, warnings.

Every expectation is what torchmetrics' own ``MetricCollection`` does with the same members (its aggregation
metrics, or a twin written for both bases), except compute groups, which we never infer (a documented difference).

Package modules covered: ``collections`` (against torchmetrics' ``MetricCollection``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics

from torchmetrics_diff import MaxMetric, MeanMetric, Metric, MetricCollection, SumMetric

OURS = {"sum": SumMetric, "max": MaxMetric, "mean": MeanMetric, "coll": MetricCollection}
THEIRS = {
    "sum": torchmetrics.SumMetric,
    "max": torchmetrics.MaxMetric,
    "mean": torchmetrics.MeanMetric,
    "coll": torchmetrics.MetricCollection,
}


def _both(build: Any) -> tuple[Any, Any]:
    return build(OURS), build(THEIRS)


def _values(out: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in out.items()}


def test_keys_iteration_and_items_carry_prefix_and_postfix() -> None:
    ours, theirs = _both(lambda k: k["coll"]([k["sum"](), k["max"]()], prefix="train/", postfix="_x"))
    assert list(ours) == list(theirs) == ["train/SumMetric_x", "train/MaxMetric_x"]
    assert list(ours.keys()) == list(theirs.keys())
    assert list(ours.keys(keep_base=True)) == list(theirs.keys(keep_base=True)) == ["SumMetric", "MaxMetric"]
    assert [k for k, _ in ours.items()] == [k for k, _ in theirs.items()]
    assert [k for k, _ in ours.items(keep_base=True)] == [k for k, _ in theirs.items(keep_base=True)]
    assert len(list(ours.values())) == 2


def test_members_can_be_looked_up_by_prefixed_or_bare_key() -> None:
    ours, theirs = _both(lambda k: k["coll"]({"total": k["sum"]()}, prefix="val/"))
    for coll in (ours, theirs):
        assert coll["val/total"] is coll["total"]
    assert "val/total" in ours and "total" in ours and "other" not in ours
    with pytest.raises(KeyError, match="val/total"):
        ours["other"]


def test_dict_input_is_added_in_sorted_key_order() -> None:
    ours, theirs = _both(lambda k: k["coll"]({"zeta": k["sum"](), "alpha": k["max"](), "mid": k["mean"]()}))
    assert list(ours) == list(theirs) == ["alpha", "mid", "zeta"]
    x = torch.tensor([1.0, 5.0])
    assert list(ours(x)) == list(theirs(x))


def test_a_dict_of_nested_collections_keys_members_by_the_dict_key() -> None:
    def build(k: dict) -> Any:
        return k["coll"](
            {
                "train": k["coll"]([k["sum"](), k["max"]()], prefix="p_"),
                "val": k["coll"]([k["sum"](), k["max"]()]),
            }
        )

    ours, theirs = _both(build)
    assert list(ours) == list(theirs)
    x = torch.tensor([1.0, 4.0])
    assert _values(ours(x)) == _values(theirs(x))


def test_add_metrics_extends_the_collection() -> None:
    ours, theirs = _both(lambda k: k["coll"]([k["sum"]()], prefix="a/"))
    for coll, kinds in ((ours, OURS), (theirs, THEIRS)):
        coll.add_metrics({"peak": kinds["max"]()})
        coll.add_metrics([kinds["mean"]()])
    assert list(ours) == list(theirs)
    with pytest.raises(ValueError, match="named 'peak'"):
        ours.add_metrics({"peak": MaxMetric()})


def test_extra_arguments_that_are_not_metrics_warn_and_are_ignored() -> None:
    with pytest.warns(UserWarning, match="not metrics"):
        ours = MetricCollection([SumMetric()], MaxMetric(), "junk")
    with pytest.warns(UserWarning, match="not `Metric`"):
        theirs = torchmetrics.MetricCollection([torchmetrics.SumMetric()], torchmetrics.MaxMetric(), "junk")
    assert list(ours) == list(theirs) == ["SumMetric", "MaxMetric"]
    with pytest.raises(ValueError, match="additional_metrics"):
        MetricCollection({"a": SumMetric()}, MaxMetric())


def _dict_metric(base: type, keys: tuple[str, ...]) -> type:
    class Stats(base):  # type: ignore[misc, valid-type]
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
            self.add_state("n", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, x: torch.Tensor) -> None:
            self.total = self.total + x.sum()
            self.n = self.n + x.numel()

        def compute(self) -> dict[str, torch.Tensor]:
            return {keys[0]: self.total, keys[1]: self.total / self.n}

    return Stats


@pytest.mark.parametrize("clash", [False, True], ids=["distinct keys", "clashing keys"])
def test_dict_outputs_are_keyed_like_torchmetrics(clash: bool) -> None:
    """Members' dict values spread by their own keys; ``{member}_{key}`` only when keys clash."""
    second = ("total", "avg") if clash else ("sum2", "avg2")

    def build(k: dict, base: type) -> Any:
        return k["coll"]({"a": _dict_metric(base, ("total", "avg"))(), "b": _dict_metric(base, second)()}, prefix="v/")

    ours, theirs = build(OURS, Metric), build(THEIRS, torchmetrics.Metric)
    x = torch.tensor([1.0, 2.0, 6.0])
    assert _values(ours(x)) == _values(theirs(x))
    assert _values(ours.compute()) == _values(theirs.compute())


def test_compute_groups_property_and_one_member_groups() -> None:
    coll = MetricCollection(
        {"a": SumMetric(), "b": SumMetric(), "c": MaxMetric(), "d": MeanMetric()}, compute_groups=[["a", "b"], ["c"]]
    )
    assert coll.compute_groups == {0: ["a", "b"], 1: ["c"], 2: ["d"]}
    theirs = torchmetrics.MetricCollection(
        {
            "a": torchmetrics.SumMetric(),
            "b": torchmetrics.SumMetric(),
            "c": torchmetrics.MaxMetric(),
            "d": torchmetrics.MeanMetric(),
        },
        compute_groups=[["a", "b"], ["c"]],
    )
    assert coll.compute_groups == theirs.compute_groups
    coll.update(torch.tensor([2.0, 3.0]))
    assert coll["b"].compute().item() == 5.0  # b reads a's states
    # True / False / None: no explicit groups (never inferred from values - a documented difference)
    for flag in (True, False, None):
        plain = MetricCollection([SumMetric(), MaxMetric()], compute_groups=flag)
        assert plain.compute_groups == {0: ["SumMetric"], 1: ["MaxMetric"]}


def test_members_set_by_item_assignment_must_be_metrics() -> None:
    coll = MetricCollection([SumMetric()])
    coll["extra"] = MaxMetric()
    assert list(coll) == ["SumMetric", "extra"]
    with pytest.raises(ValueError, match="must be a Metric"):
        coll["bad"] = torch.nn.Linear(1, 1)
