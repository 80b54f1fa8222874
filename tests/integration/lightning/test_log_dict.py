"""``self.log_dict(collection)`` with dict-valued members: the cross-modal retrieval metrics and ``ClasswiseWrapper``.

``MetricCollection.items()`` gives one tensor-valued view per entry of a member whose value is a dict and whose keys
are declared (``result_keys()``), under the entry's key in the flattened results. In one process: the keys are
torchmetrics' flattening of the same members (prefix, postfix, clashes, nested collections), the views' values are
those of ``compute()``, a member is computed once for all its views, a view resets its member, and the rest of the
collection's dict access is unchanged. Under a real ``Trainer(strategy="ddp", devices=2)``
(``run_log_dict.py``): the logged keys and values against an independent computation on the whole data of each
epoch, no ``sync_dist`` warning, and what the checkpoints hold of the metric states.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmetrics_diff as T
from tests._helpers import lightning_runs as C
from torchmetrics_diff import Accuracy, MetricCollection, SumMetric
from torchmetrics_diff import wrappers as W
from torchmetrics_diff.retrieval import CrossModalMRR, CrossModalRecallAtK
from torchmetrics_diff.wrappers import ClasswiseWrapper

tm = pytest.importorskip("torchmetrics")
# the runs import lightning in processes of their own: here it only has to be installed (importing it would cost
# seconds in the collection of every pytest worker)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="the lightning integration tests need the `test` extra"
)

LABELS = ["cat", "dog", "owl"]


class _TheirMRR(tm.Metric):
    """A torchmetrics metric whose value has the keys of ``CrossModalMRR``'s (only the keys are compared)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("n", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.n += 1

    def compute(self) -> dict[str, torch.Tensor]:
        return {"i2t_MRR": self.n, "t2i_MRR": self.n}


def _ours(layout: str) -> MetricCollection:
    def cw(prefix: str = "acc_") -> ClasswiseWrapper:
        return ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None), labels=LABELS, prefix=prefix)

    return _build(layout, MetricCollection, cw, CrossModalMRR, SumMetric)


def _theirs(layout: str) -> Any:
    def cw(prefix: str = "acc_") -> Any:
        inner = tm.classification.MulticlassAccuracy(num_classes=3, average=None)
        return tm.wrappers.ClasswiseWrapper(inner, labels=LABELS, prefix=prefix)

    return _build(
        layout, lambda *a, **k: tm.MetricCollection(*a, compute_groups=False, **k), cw, _TheirMRR, tm.SumMetric
    )


def _build(layout: str, coll: Any, cw: Any, mrr: Any, total: Any) -> Any:
    if layout == "affixes":
        return coll({"mrr": mrr(), "cw": cw(), "n": total()}, prefix="val/", postfix="_x")
    if layout == "clash":  # two members with the same entry keys: each entry is named after its member
        return coll({"a": cw(), "b": cw(), "mrr": mrr()}, prefix="val/")
    if layout == "nested":
        inner = coll({"mrr": mrr(), "cw": cw()}, prefix="in/", postfix="!")
        return coll([inner, total()], prefix="out/")
    raise AssertionError(layout)


def _feed(coll: Any, ours: bool) -> None:
    g = torch.Generator().manual_seed(3)
    preds, target = torch.randn(6, 3, generator=g), torch.tensor([0, 1, 2, 0, 1, 2])
    image, text = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    if ours:
        coll.update(image=image, text=text, preds=preds, target=target, value=preds.sum())
    else:
        coll.update(preds=preds, target=target, value=preds.sum())


@pytest.mark.parametrize("layout", ["affixes", "clash", "nested"])
def test_items_give_one_view_per_entry_under_torchmetrics_flattened_keys(layout: str) -> None:
    ours, theirs = _ours(layout), _theirs(layout)
    _feed(ours, True)
    _feed(theirs, False)
    expected = list(theirs.compute())
    assert list(dict(ours.items())) == expected
    computed = ours.compute()
    assert list(computed) == expected
    for key, metric in ours.items():
        assert torch.equal(metric.compute(), computed[key]), key


def test_views_compute_the_member_once_per_round_and_reset_it() -> None:
    class Counted(CrossModalRecallAtK):
        computes = 0

        def compute(self) -> dict[str, torch.Tensor]:
            type(self).computes += 1
            return super().compute()

    coll = MetricCollection({"r": Counted(top_k=(1, 2))})
    g = torch.Generator().manual_seed(0)
    coll.update(torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g))
    views = dict(coll.items())
    assert list(views) == ["i2t_R@1", "i2t_R@2", "t2i_R@1", "t2i_R@2"]
    first = {key: view.compute() for key, view in views.items()}
    assert Counted.computes == 1
    assert first == coll["r"].compute()
    # a second round computes again (as a metric's compute syncs again); so does an update in the middle of one
    views["i2t_R@1"].compute()
    coll.update(torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g))
    assert torch.equal(views["i2t_R@2"].compute(), coll["r"].compute()["i2t_R@2"])
    views["t2i_R@1"].reset()
    assert coll["r"].update_count == 0 and not coll["r"].image
    assert dict(coll.items())["t2i_R@1"] is views["t2i_R@1"]  # the same objects while the layout stays


def test_views_carry_the_entries_of_the_last_forward_and_refuse_updates() -> None:
    coll = MetricCollection({"cw": ClasswiseWrapper(Accuracy(task="multiclass", num_classes=2, average=None))})
    value = coll(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]))
    views = dict(coll.items())
    assert list(views) == list(value) == ["accuracy_0", "accuracy_1"]
    for key, view in views.items():
        assert torch.equal(view._forward_cache, value[key])
        assert view.device == torch.device("cpu")
    with pytest.raises(TypeError, match="update the collection"):
        views["accuracy_0"].update(torch.tensor([0]), torch.tensor([0]))


def test_the_rest_of_dict_access_is_unchanged_and_views_hold_no_state() -> None:
    coll = MetricCollection({"mrr": CrossModalMRR(), "n": SumMetric()}, prefix="val/")
    assert list(coll) == list(coll.keys()) == ["val/mrr", "val/n"]
    assert list(coll.items(keep_base=True)) == [("mrr", coll["mrr"]), ("n", coll["n"])]
    assert list(coll.values()) == [coll["mrr"], coll["n"]]
    coll.persistent(True)
    assert sorted(coll.state_dict()) == ["mrr.image", "mrr.labels", "mrr.text", "n.sum_value"]
    names = [name for name, _ in coll.named_modules()]
    assert names == ["", "mrr", "n", "mrr[i2t_MRR]", "mrr[t2i_MRR]"]  # where Lightning looks logged metrics up
    assert [name for name, _ in coll.named_children()] == ["mrr", "n"]
    assert list(coll.named_parameters()) == []
    for copy in (pickle.loads(pickle.dumps(coll)), coll.clone()):
        views = dict(copy.items())
        assert views["val/i2t_MRR"].member is copy["mrr"]


def _wrapped(ours: bool) -> Any:
    """A min/max wrapper, a bootstrap and a multitask wrapper, ours or torchmetrics'."""
    lib, wrappers = (T, W) if ours else (tm, tm.wrappers)
    members = {
        "bounds": wrappers.MinMaxMetric(lib.MeanMetric()),
        "boot": wrappers.BootStrapper(lib.MeanMetric(), num_bootstraps=4, quantile=0.9),
        "tasks": wrappers.MultitaskWrapper({"a": lib.MeanSquaredError(), "b": lib.MeanAbsoluteError()}, prefix="task/"),
    }
    coll = T.MetricCollection(members, prefix="val/") if ours else tm.MetricCollection(members, prefix="val/")
    for step in range(3):
        value = torch.arange(4.0) + step
        coll["bounds"].update(value)
        coll["boot"].update(value)
        coll["tasks"].update({"a": value, "b": value}, {"a": value + 1, "b": value + 2})
    return coll


def test_min_max_bootstrap_and_multitask_members_give_one_view_per_entry() -> None:
    ours = _wrapped(True)
    expected = list(_wrapped(False).compute())  # torchmetrics' flattened keys of the same members, in its order
    assert list(dict(ours.items())) == expected
    assert expected == [
        "val/mean",
        "val/std",
        "val/quantile",
        "val/raw",
        "val/max",
        "val/min",
        "val/task/a",
        "val/task/b",
    ]
    computed = ours.compute()
    for key, view in ours.items():
        torch.testing.assert_close(view.compute(), computed[key], rtol=0, atol=0)
    # the values themselves, from the updates: the values 0..3, 1..4 and 2..5 (mean 2.5; the bounds move only at a
    # forward or a compute, so one compute leaves them at its value); errors of 1 and 2
    assert computed["val/raw"] == computed["val/max"] == computed["val/min"] == 2.5
    assert computed["val/task/a"] == 1.0 and computed["val/task/b"] == 2.0
    # a task holding a collection has a dict value: the wrapper is itself
    nested = T.MetricCollection({"m": W.MultitaskWrapper({"a": T.MetricCollection({"s": T.SumMetric()})})})
    assert list(dict(nested.items())) == ["m"]


def test_members_without_declared_keys_are_themselves() -> None:
    # a per-class metric with no class count and no labels: its keys are known only from its value
    coll = MetricCollection({"cw": ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None))})
    assert list(dict(coll.items())) == ["accuracy_0", "accuracy_1", "accuracy_2"]
    unknown = ClasswiseWrapper(Accuracy(task="multiclass", num_classes=3, average=None))
    unknown.metric.num_classes = None
    coll = MetricCollection({"cw": unknown})
    assert dict(coll.items()) == {"cw": unknown}


def _class_counts(stage: str, epoch: int, rank: int) -> dict[str, list[int]]:
    """tp and fn per class over ``rank``'s rows of an epoch's steps, counted by a loop."""
    tp, fn = [0] * C.CLASSES, [0] * C.CLASSES
    for step in range(C.LOG_STEPS):
        _, _, logits, labels = C.log_dict_batch(stage, epoch, step)
        rows = C.rank_rows(rank)
        for pred, label in zip(logits[rows].argmax(1).tolist(), labels[rows].tolist()):
            if pred == label:
                tp[label] += 1
            else:
                fn[label] += 1
    return {"tp": tp, "fn": fn}


@pytest.mark.timeout(C.TIMEOUT_S + 30)
def test_trainer_ddp_log_dict_logs_each_entry_of_dict_valued_members(ddp_runs: Path) -> None:
    """``self.log_dict(collection)`` of a collection holding ``CrossModalMRR`` and ``ClasswiseWrapper`` members,
    two epochs under ``Trainer(strategy="ddp", devices=2)``: the flattened keys, the global values of each epoch
    (so the members were reset between epochs), each member computed once per epoch, no ``sync_dist`` warning."""
    out = ddp_runs / "log_dict"
    logged, expected = C.logged(out), C.reference_log_dict()
    ours = {k: v for k, v in logged.items() if k.startswith(("val/", "train/")) and k != "val/control"}
    assert sorted(ours) == sorted(expected)
    for key, want in expected.items():
        # one value per epoch (per step for _step): float32 states and values
        assert ours[key] == pytest.approx(want, rel=1e-6, abs=1e-7), key
    # the control: a tensor logged without sync_dist gets Lightning's warning; the views' entries do not
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["world"] == 2
    sync_warnings = [w for w in ranks[0]["warnings"] if "sync_dist" in w]
    assert len(sync_warnings) == 1 and "val/control" in sync_warnings[0], sync_warnings
    for report in ranks:
        assert report["computes"] == [1, 2]  # the MRR member: once per epoch for its two keys, on every rank

    # what a checkpoint holds of metric states (both collections persistent; ModelCheckpoint saves at the end of
    # each training epoch): rank 0's own states, unsynced; the validation collection already reset by Lightning
    for epoch in range(C.EPOCHS):
        checkpoint = torch.load(out / "checkpoints" / f"epoch={epoch}.ckpt", weights_only=False)
        states = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("layer.")}
        counts = _class_counts("train", epoch, rank=0)
        assert states.pop("train_metrics.cw.metric.tp").tolist() == counts["tp"]
        assert states.pop("train_metrics.cw.metric.fn").tolist() == counts["fn"]
        assert states.pop("train_metrics.cw.metric.fp").sum() == sum(counts["fn"])
        assert states.pop("train_metrics.cw.metric.tn").sum() == 2 * C.LOG_STEPS * C.SPLIT[0] - sum(counts["fn"])
        for name in ("image", "text", "labels"):
            assert states.pop(f"val_metrics.mrr.{name}") == []
        for member in ("acc", "cw.metric"):
            for name in ("tp", "fp", "tn", "fn"):
                assert not states.pop(f"val_metrics.{member}.{name}").any()
        assert states == {}  # nothing else: no view, no state of the non-persistent MeanMetric
