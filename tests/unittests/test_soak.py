"""A short soak (the long one is ``benchmarks/bench_soak.py``): memory and live tensors stay flat over steps.

Package modules covered: ``metric``, ``aggregation`` and ``losses`` over many steps."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from torchmetrics_diff import CatMetric, MeanMetric
from torchmetrics_diff.losses import CLIPLoss

# thousands of steps (20-60 s on the 2-core machines): in `make test`, not in the developer's `make test-fast`
pytestmark = pytest.mark.soak


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _live_tensors() -> int:
    """Real tensors alive (a compiled test run earlier leaves Dynamo's fake tensors, which it frees at its own
    pace: they are not the metric's)."""
    with warnings.catch_warnings():  # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and not _is_fake(o))


def _is_fake(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "FakeTensor"  # (importing the fake tensor module would import Dynamo)


def _states_have_graph(metric: torch.nn.Module) -> bool:
    values = [v for s in metric.metric_state.values() for v in (s if isinstance(s, list) else [s])]
    return any(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in values)


def _soak(step, metric, steps: int, checkpoints: tuple[int, int]) -> dict[int, tuple[float, int]]:
    seen = {}
    for i in range(1, steps + 1):
        step(i)
        assert not _states_have_graph(metric), f"a state holds a grad_fn after step {i}"
        if i in checkpoints:
            gc.collect()
            seen[i] = (_rss_mib(), _live_tensors())
    return seen


@pytest.mark.timeout(120)
def test_loss_forward_soak_keeps_memory_and_live_tensors_flat() -> None:
    torch.manual_seed(0)
    model, loss = torch.nn.Linear(16, 8), CLIPLoss()
    data, scale = torch.randn(32, 16), torch.tensor(5.0)

    def step(i: int) -> None:
        emb = model(data)
        loss(emb, emb.flip(0), scale).backward()
        model.zero_grad(set_to_none=True)

    seen = _soak(step, loss, 1500, (500, 1500))
    (rss_a, live_a), (rss_b, live_b) = seen[500], seen[1500]
    assert live_b == live_a, f"live tensors grew from {live_a} to {live_b}"
    assert rss_b <= 1.05 * rss_a, f"RSS grew from {rss_a:.1f} MiB to {rss_b:.1f} MiB"


@pytest.mark.timeout(120)
def test_update_only_cat_metric_with_epoch_resets_stays_flat() -> None:
    metric, x = CatMetric(), torch.randn(64)

    def step(i: int) -> None:
        metric.update(x)
        if i % 250 == 0:
            assert metric.compute().numel() == 250 * 64
            metric.reset()

    seen = _soak(step, metric, 1500, (500, 1500))
    (rss_a, live_a), (rss_b, live_b) = seen[500], seen[1500]
    assert live_b == live_a, f"live tensors grew from {live_a} to {live_b}"
    assert rss_b <= 1.05 * rss_a, f"RSS grew from {rss_a:.1f} MiB to {rss_b:.1f} MiB"


@pytest.mark.timeout(120)
def test_mean_metric_forward_with_grad_never_keeps_a_graph() -> None:
    weight = torch.nn.Parameter(torch.ones(8))
    metric = MeanMetric()
    seen = _soak(lambda i: metric(torch.randn(8) * weight).backward(), metric, 1000, (200, 1000))
    assert seen[1000][1] == seen[200][1]
