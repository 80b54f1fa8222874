"""States, sync buffers and results stay on the state's device — the checks that run on a CPU-only machine.

``tests/unittests/test_cuda.py`` repeats the single-process ones on ``cuda:0`` where a GPU exists. Here the
``meta`` device stands in for "another device than the CPU" in one process (tensors without data: every value
check is replaced by a device check), and a two-rank gloo run records the device of every communication buffer.
A metric cannot come back from ``meta`` with ``.to("cpu")`` (there is no data to copy: torch says to use
``to_empty``), so that direction is only checked on CUDA.

Package modules covered: ``metric``, ``aggregation``, ``losses`` and the sync engine ``distributed._sync`` (devices
of states and buffers).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._helpers.checks import tensor_devices
from tests._helpers.harness import run_distributed
from torchmetrics_diff import CatMetric, MeanMetric, Metric, MetricCollection, SumMetric, _state_sync
from torchmetrics_diff import collections as collections_module
from torchmetrics_diff import metric as metric_module
from torchmetrics_diff._global import contrastive as _contrastive
from torchmetrics_diff._global import strategy as _strategy
from torchmetrics_diff.distributed import _call, _collectives, all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.distributed._groups import GroupState, known
from torchmetrics_diff.distributed._sync import engine as _sync
from torchmetrics_diff.distributed._sync import layout as _layout
from torchmetrics_diff.distributed._sync import rows as _rows
from torchmetrics_diff.distributed._sync import sync_states
from torchmetrics_diff.losses import CLIPLoss, GlobalMeanLoss, InfoNCELoss

pytestmark = pytest.mark.timeout(120)

META = torch.device("meta")


@pytest.mark.parametrize("cls", [SumMetric, MeanMetric, CatMetric])
def test_states_follow_the_metric_to_another_device(cls: type) -> None:
    """``nan_strategy="disable"``: the NaN check reads a value (``.any()``), which a meta tensor does not have."""
    metric = cls(nan_strategy="disable").to("meta")
    assert metric.device == META
    assert tensor_devices(metric.metric_state) <= {META}
    x = torch.ones(3, device=META)
    metric.update(x)
    metric.update(2.0)  # a Python number is made a tensor on the metric's device
    assert tensor_devices(metric.metric_state) == {META}, metric.metric_state
    assert metric(x).device == META
    assert metric.compute().device == META
    assert tensor_devices(metric.metric_state) == {META}
    metric.set_dtype(torch.float64)
    assert tensor_devices(metric.metric_state) <= {META} and metric.compute().device == META
    metric.reset()
    assert tensor_devices(metric.metric_state) <= {META}
    assert tensor_devices(metric._defaults) <= {META}


def test_world_size_1_keeps_the_device() -> None:
    """Without a process group nothing is communicated and nothing is moved, whatever ``device`` says."""
    states = {"total": torch.ones(2, device=META), "rows": [torch.ones(2, 3, device=META)]}
    synced = sync_states(states, {"total": "sum", "rows": "cat"}, device=META)
    assert tensor_devices(synced) == {META}
    x = torch.ones(2, 3, device=META)
    assert tensor_devices(gather_all_tensors(x)) == {META}
    assert all_gather_cat(x).device == META
    assert all_reduce(x, "max").device == META


def test_losses_keep_the_device() -> None:
    x = torch.ones(4, 3, device=META)
    assert CLIPLoss().to("meta")(x, x, 1.0).device == META
    assert InfoNCELoss().to("meta")(x, x).device == META
    assert GlobalMeanLoss().to("meta")(torch.ones(5, device=META)).device == META


# ------------------------------------------------------------------------------------ two ranks: the buffers


def _buffers_body(rank: int, world: int) -> dict[str, Any]:
    seen: list[tuple[str, str]] = []
    original = _rows.all_gather_flat  # the agreement's gather (_rows) and the rows' (_layout)

    def recording(out: torch.Tensor, inp: torch.Tensor, group: Any = None) -> None:
        seen.append((str(out.device), str(inp.device)))
        original(out, inp, group)

    _rows.all_gather_flat = _layout.all_gather_flat = recording
    try:
        states = {"total": torch.ones(3, dtype=torch.float64), "rows": [torch.ones(rank + 1, 2)]}
        cpu = torch.device("cpu")
        synced = sync_states(states, {"total": "sum", "rows": "cat"}, device=cpu)
        metric = MeanMetric(dist_sync_on_step=True)
        value = metric(torch.ones(2))
        metric.update(torch.ones(3))
        computed = metric.compute()
    finally:
        _rows.all_gather_flat = _layout.all_gather_flat = original
    return {
        "buffers": seen,
        "results": sorted(str(d) for d in tensor_devices(synced) | tensor_devices([value, computed])),
        "states": sorted(str(d) for d in tensor_devices(metric.metric_state)),
        "rows": tuple(synced["rows"].shape),
        "cached": sorted({str(k[0]) for k in known(dist.group.WORLD).rows}),
    }


def test_sync_buffers_and_results_on_the_given_device() -> None:
    results = run_distributed(_buffers_body, 2, timeout=60)
    for rank, res in enumerate(results):
        assert res["buffers"], f"rank {rank}: no gather recorded"
        assert {d for pair in res["buffers"] for d in pair} == {"cpu"}, res["buffers"]
        assert res["results"] == ["cpu"] and res["states"] == ["cpu"] and res["cached"] == ["cpu"], res
        assert res["rows"] == (3, 2), res["rows"]


# ------------------------------------------- the failure marker travels on the device its peers communicate on


class _Sentinel(Exception):
    """Stops a call at its first collective (which the fake below has recorded)."""


class _Picky(Metric):
    """A sum that refuses 2-D input: the "bad rank" of the cases below."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        if x.ndim != 1:
            raise ValueError(f"_Picky: `x` must be 1-D; got shape {tuple(x.shape)}")
        self.total = self.total + x.sum()

    def compute(self) -> torch.Tensor:
        return self.total


def _first_collective_device(monkeypatch: pytest.MonkeyPatch, call: Any) -> str:
    """The device of the buffer ``call`` sends in its first collective, as rank 0 of a pretend world of 2."""
    seen: list[str] = []

    def fake_gather(out: torch.Tensor, inp: torch.Tensor, group: Any = None) -> None:
        seen.append(str(inp.device))
        raise _Sentinel

    modules = (metric_module, collections_module, _state_sync, _sync, _rows, _layout, _collectives)
    modules += (_contrastive, _strategy, _call)
    # no process group here: the call header's group state is made up, and its exchange is the fake gather too
    state = GroupState(lambda: None, 2, 0)
    state.checks = "full"
    monkeypatch.setattr(_call, "_state", lambda group: state)
    monkeypatch.setattr(_rows, "state_of", lambda group: state)
    host = types.SimpleNamespace(call="")  # (the exchange names the running call on its host)
    monkeypatch.setattr(_call, "_host_of", lambda state: host)
    monkeypatch.setattr(_call._hosts, "all_gather", lambda host, out, inp: fake_gather(out, inp))
    for module in modules:
        if hasattr(module, "group_size"):
            monkeypatch.setattr(module, "group_size", lambda group=None: 2)
        if hasattr(module, "group_rank"):
            monkeypatch.setattr(module, "group_rank", lambda group=None: 0)
        if hasattr(module, "all_gather_flat"):
            monkeypatch.setattr(module, "all_gather_flat", fake_gather)
    with pytest.raises(_Sentinel):
        call()
    return seen[0]


def _clip(bad: bool) -> Any:
    x = torch.ones(4, 3, device=META)
    return lambda: CLIPLoss()(x, x[:2] if bad else x, 1.0)


def _metric(bad: bool) -> Any:
    metric = _Picky(dist_sync_on_step=True).to("meta")
    return lambda: metric(torch.ones(2, 2, device=META) if bad else torch.ones(2, device=META))


def _collection(bad: bool) -> Any:
    coll = MetricCollection({"picky": _Picky(dist_sync_on_step=True)}).to("meta")
    return lambda: coll(torch.ones(2, 2, device=META) if bad else torch.ones(2, device=META))


@pytest.mark.parametrize("make", [_metric, _clip, _collection], ids=["Metric.forward", "CLIPLoss", "MetricCollection"])
def test_failure_marker_uses_the_device_of_the_collective_it_joins(monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    """A rank with a bad input joins its peers' first collective with a failure marker, so the marker must travel
    as the peers' buffer does: under NCCL a buffer on another device cannot be sent at all. Every call's first
    collective is its header exchange, a CPU tensor of host values (over a CPU-capable group, a gloo twin beside
    NCCL) whatever the data's device: the good rank's and the bad rank's first buffers are both on the CPU.

    No GPU needed: ``meta`` stands in for the accelerator (where the data lives), ``group_size``/``group_rank``
    pretend a world of two, and a fake gather records the device of the first buffer sent."""
    good = _first_collective_device(monkeypatch, make(bad=False))
    bad = _first_collective_device(monkeypatch, make(bad=True))
    assert good == "cpu", f"the good rank sent its header on {good}"
    assert bad == good, f"the bad rank's failure marker went on {bad}, the peers' header on {good}"


@pytest.mark.filterwarnings("ignore:.*compute\\(\\) was called before update")
@pytest.mark.parametrize(
    "name", ["CrossModalRecallAtK", "CrossModalMeanRank", "CrossModalMedianRank", "CrossModalMAPAtK"]
)
def test_retrieval_without_pairs_answers_on_the_metric_device(name: str) -> None:
    """Before any pair the values are NaN, made on the metric's device (not a CPU tensor from a Python float)."""
    import torchmetrics_diff

    values = getattr(torchmetrics_diff, name)().to("meta").compute()
    assert values and tensor_devices(values) == {META}, values
