"""States, sync buffers and results stay on the state's device: the single-process checks on ``cuda:0``.

Skipped (never failed) without CUDA; marked ``cuda``, which ``benchmarks/device_check.sh`` (``make test-cuda``)
selects. Every loss and metric class inside a process group on the GPU: ``test_cuda_distributed.py``. The checks
are written as ``_check_*(device)`` helpers so that they read the same on any device; the CPU-only counterparts (a
``meta`` device, and the device of every communication buffer on two gloo ranks) live in
``tests/unittests/reliability/test_devices.py``. A steady loss step is checked under CUDA's sync debug mode: no
host synchronization at all.

Package modules covered: ``metric``, ``aggregation``, ``losses`` and the sync engine on ``cuda:0``.
"""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch

from tests._helpers.checks import tensor_devices
from torchmetrics_diff import CatMetric, MeanMetric, Metric, MetricCollection, SumMetric
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.distributed._sync import sync_states
from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)"),
]


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda:0")


def _on(metric: Metric, device: torch.device) -> None:
    where = tensor_devices(metric.metric_state) | tensor_devices(metric._defaults)
    assert where <= {device}, f"{type(metric).__name__} states on {where}, expected {device}"
    assert metric.device == device


def _check_aggregator(cls: type, device: torch.device) -> None:
    metric = cls().to(device)
    _on(metric, device)
    metric.update(torch.tensor([1.0, 2.0], device=device))
    metric.update(3.0)  # a number becomes a tensor on the metric's device
    _on(metric, device)
    value = metric(torch.tensor([4.0, 5.0], device=device))
    assert value.device == device
    computed = metric.compute()
    assert computed.device == device
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    reference = {MeanMetric: expected.mean(), SumMetric: expected.sum(), CatMetric: expected}[cls]
    torch.testing.assert_close(computed.cpu(), reference)

    metric.to("cpu")
    _on(metric, torch.device("cpu"))
    torch.testing.assert_close(metric.compute(), computed.cpu())
    metric.to(device)
    _on(metric, device)
    torch.testing.assert_close(metric.compute().cpu(), computed.cpu())

    metric.set_dtype(torch.float64)
    _on(metric, device)
    metric.update(torch.tensor([6.0], device=device))
    assert metric.compute().dtype == torch.float64 and metric.compute().device == device
    metric.reset()
    _on(metric, device)
    assert metric.update_count == 0


@pytest.mark.parametrize("cls", [MeanMetric, CatMetric, SumMetric])
def test_aggregator_states_stay_on_the_device(cls: type, device: torch.device) -> None:
    _check_aggregator(cls, device)


def _check_collection_and_state_dict(device: torch.device) -> None:
    coll = MetricCollection({"mean": MeanMetric(), "cat": CatMetric()}).to(device)
    coll.update(torch.tensor([1.0, 3.0], device=device))
    assert tensor_devices(coll.compute()) == {device}
    source = MeanMetric()
    source.persistent(True)
    source.update(torch.tensor([2.0, 4.0]))
    target = MeanMetric().to(device)
    target.persistent(True)
    target.load_state_dict(source.state_dict())  # CPU states loaded onto the metric's device
    _on(target, device)
    assert target.compute().item() == 3.0


def test_collection_and_state_dict_on_the_device(device: torch.device) -> None:
    _check_collection_and_state_dict(device)


LOSSES: dict[str, Callable[[], Metric]] = {
    "CLIPLoss": CLIPLoss,
    "InfoNCELoss": lambda: InfoNCELoss(temperature=0.5),
    "SupConLoss": lambda: SupConLoss(temperature=0.5),
    "SigLIPLoss": SigLIPLoss,
    "BarlowTwinsLoss": BarlowTwinsLoss,
    "GlobalMeanLoss": GlobalMeanLoss,
    "TokenCrossEntropyLoss": TokenCrossEntropyLoss,
}


def _inputs(name: str, where: torch.device) -> list[torch.Tensor]:
    """The differentiable inputs of loss ``name`` (the same values on every device)."""
    g = torch.Generator().manual_seed(0)
    if name == "TokenCrossEntropyLoss":
        return [torch.randn(2, 3, 5, generator=g).to(where).requires_grad_(True)]
    emb = [torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1) for _ in range(2)]
    return [e.to(where).requires_grad_(True) for e in emb[: 1 if name in ("SupConLoss", "GlobalMeanLoss") else 2]]


def _call(name: str, loss: Metric, inputs: list[torch.Tensor]) -> torch.Tensor:
    where = inputs[0].device
    if name == "CLIPLoss":
        return loss(*inputs, torch.tensor(10.0, device=where))
    if name == "SigLIPLoss":
        return loss(*inputs, 10.0, -5.0)
    if name == "SupConLoss":
        return loss(inputs[0], torch.tensor([0, 1, 0, 1, 2, 2], device=where))
    if name == "GlobalMeanLoss":
        values = inputs[0].reshape(-1)
        return loss(values, mask=values.detach() > 0)
    if name == "TokenCrossEntropyLoss":
        return loss(inputs[0], torch.tensor([[0, 4, -100], [2, 1, 3]], device=where))
    return loss(*inputs)


def _check_loss(name: str, device: torch.device) -> None:
    """Value, gradients and recorded states on the inputs' device, equal to the CPU ones."""
    values, grads = {}, {}
    for where in (torch.device("cpu"), device):
        inputs = _inputs(name, where)
        loss = LOSSES[name]().to(where)
        value = _call(name, loss, inputs)
        assert value.device == where, f"{name}: value on {value.device}, expected {where}"
        value.backward()
        assert all(x.grad is not None and x.grad.device == where for x in inputs), f"{name}: gradients not on {where}"
        assert tensor_devices(loss.metric_state) <= {where}, f"{name}: states on {tensor_devices(loss.metric_state)}"
        assert loss.compute().device == where
        values[where.type] = value.detach().cpu()
        grads[where.type] = [x.grad.cpu() for x in inputs]
    torch.testing.assert_close(values[device.type], values["cpu"], rtol=1e-4, atol=1e-5)
    for got, expected in zip(grads[device.type], grads["cpu"]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_on_the_device(name: str, device: torch.device) -> None:
    _check_loss(name, device)


def _check_collectives_world_size_1(device: torch.device) -> None:
    """No process group: no collective, and results (and gradients) stay where the input is."""
    x = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_(True)
    for mode in ("none", "local", "sync"):
        slots = gather_all_tensors(x, grad=mode)
        assert tensor_devices(slots) == {device}
        assert all_gather_cat(x, grad=mode).device == device
        for op in ("sum", "mean", "min", "max"):
            assert all_reduce(x, op, grad=mode).device == device
    (all_gather_cat(x) ** 2).sum().backward()
    assert x.grad is not None and x.grad.device == device
    states = {"total": torch.ones(2, device=device), "rows": [torch.ones(2, 3, device=device)], "peak": x.detach()}
    synced = sync_states(states, {"total": "sum", "rows": "cat", "peak": "max"}, device=device)
    assert tensor_devices(synced) == {device}


def test_collectives_world_size_1_on_the_device(device: torch.device) -> None:
    _check_collectives_world_size_1(device)


def _steady_step(name: str, strategy: str, device: torch.device) -> list[str]:
    """A loss step after a first one of the same shapes, under CUDA's sync debug mode: the synchronizing
    operations it reports (a host read of a device value, a blocking copy from the host, ...)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=1).to(device) for _ in range(2))
    a.requires_grad_(True)
    b.requires_grad_(True)
    scale = torch.full((), 10.0, device=device, requires_grad=True)
    if name == "CLIPLoss":
        loss, call = CLIPLoss(strategy=strategy).to(device), lambda: loss(a, b, scale)
    elif name == "SigLIPLoss":
        loss, call = SigLIPLoss(strategy=strategy).to(device), lambda: loss(a, b, scale, -5.0)
    else:
        loss, call = InfoNCELoss(temperature=0.5, strategy=strategy).to(device), lambda: loss(a, b)
    call().backward()  # the first call may read sizes back
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]


@pytest.mark.parametrize("strategy", ["replicated", "sharded", "ring"])
@pytest.mark.parametrize("name", ["CLIPLoss", "SigLIPLoss", "InfoNCELoss"])
def test_steady_loss_step_never_waits_for_the_gpu(name: str, strategy: str, device: torch.device) -> None:
    """One process: a step whose shapes match the previous one makes no host synchronization at all (CUDA's
    own count, which also sees blocking host-to-device copies that a count of ``Tensor`` methods misses)."""
    syncs = _steady_step(name, strategy, device)
    assert not syncs, f"{name}(strategy={strategy!r}) synchronized {len(syncs)} times: {syncs}"
