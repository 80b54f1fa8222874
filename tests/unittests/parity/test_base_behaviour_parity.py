"""The base behaviours torchmetrics' own tests check, side by side with torchmetrics 1.9.

- ``MetricCollection.keys()``/``items()`` return dict views with and without ``keep_base``;
- a custom ``dist_sync_fn`` runs, once per state, when ``distributed_available_fn`` says so, even without a
  process group (torchmetrics' way of emulating ranks in one process);
- the collection's ``repr`` has torchmetrics' layout;
- ``torch.jit.script`` of a metric raises one clear ``TypeError`` (TorchScript is not supported).

Package modules covered: ``collections`` (keys, items, repr), ``metric`` (the sync decision, TorchScript).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torchmetrics
from torch import nn

import torchmetrics_diff as ours_pkg


def _collections(**kwargs: Any) -> tuple[Any, Any]:
    return tuple(  # type: ignore[return-value]
        p.MetricCollection([p.SumMetric(), p.MaxMetric()], **kwargs) for p in (ours_pkg, torchmetrics)
    )


@pytest.mark.parametrize("keep_base", [False, True])
@pytest.mark.parametrize("affixes", [{}, {"prefix": "val/", "postfix": "_x"}], ids=["plain", "affixed"])
def test_keys_and_items_are_dict_views_like_torchmetrics(keep_base: bool, affixes: dict[str, str]) -> None:
    ours, theirs = _collections(**affixes)
    assert type(ours.keys(keep_base=keep_base)) is type(theirs.keys(keep_base=keep_base))
    assert list(ours.keys(keep_base=keep_base)) == list(theirs.keys(keep_base=keep_base))
    assert type(ours.items(keep_base=keep_base)) is type(theirs.items(keep_base=keep_base))
    assert [k for k, _ in ours.items(keep_base=keep_base)] == [k for k, _ in theirs.items(keep_base=keep_base)]
    assert type(ours.values()) is type(theirs.values())
    assert ("val/SumMetric_x" in list(ours.keys())) == bool(affixes)


@pytest.mark.parametrize(
    "affixes", [{}, {"prefix": "val/"}, {"postfix": "_x"}, {"prefix": "val/", "postfix": "_x"}], ids=str
)
def test_collection_repr_has_torchmetrics_layout(affixes: dict[str, str]) -> None:
    ours, theirs = _collections(**affixes)
    assert repr(ours) == repr(theirs), f"ours:\n{ours!r}\ntorchmetrics:\n{theirs!r}"


def _sync_calls(package: Any, available: bool) -> tuple[list[tuple[int, ...]], int, torch.Tensor]:
    """Run a metric with a counting ``dist_sync_fn`` (two emulated ranks holding the same states)."""
    gathered: list[tuple[int, ...]] = []
    asked = []

    def gather(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        gathered.append(tuple(tensor.shape))
        return [tensor, tensor]

    def is_available() -> bool:
        asked.append(True)
        return available

    metric = package.MeanMetric(dist_sync_fn=gather, distributed_available_fn=is_available)
    metric.update(torch.tensor([1.0, 2.0, 6.0]))
    assert not gathered and not asked, "update must not sync"
    value = metric.compute()
    return gathered, len(asked), value


@pytest.mark.parametrize("available", [True, False])
def test_custom_dist_sync_fn_runs_when_distributed_available_fn_says_so(available: bool) -> None:
    ours = _sync_calls(ours_pkg, available)
    theirs = _sync_calls(torchmetrics, available)
    assert ours[0] == theirs[0], f"gather calls: ours {ours[0]}, torchmetrics {theirs[0]}"
    assert len(ours[0]) == (2 if available else 0), "one call per state (mean_value, weight)"
    assert ours[1] == theirs[1] == 1, f"distributed_available_fn asked {ours[1]} times, torchmetrics {theirs[1]}"
    # two emulated ranks with the same values: the same mean either way
    torch.testing.assert_close(ours[2], theirs[2])
    torch.testing.assert_close(ours[2], torch.tensor(3.0))


def test_custom_dist_sync_fn_doubles_a_sum_like_torchmetrics() -> None:
    values = {}
    for p in (ours_pkg, torchmetrics):
        metric = p.SumMetric(dist_sync_fn=lambda t, group=None: [t, t], distributed_available_fn=lambda: True)
        metric.update(torch.tensor([1.0, 2.0]))
        values[p.__name__] = metric.compute()
        assert float(metric.sum_value) == 3.0, "compute() must leave the local state in place"
    torch.testing.assert_close(values["torchmetrics_diff"], values["torchmetrics"])
    torch.testing.assert_close(values["torchmetrics_diff"], torch.tensor(6.0))


def test_a_gather_given_to_sync_runs_like_one_given_at_construction() -> None:
    """``sync(dist_sync_fn=..., distributed_available=...)`` for one call, as torchmetrics' ``sync`` takes them."""
    synced = {}
    for p in (ours_pkg, torchmetrics):
        metric = p.SumMetric()
        metric.update(torch.tensor([1.0, 2.0]))
        metric.sync(dist_sync_fn=lambda t, group=None: [t, t, t], distributed_available=lambda: True)
        synced[p.__name__] = metric.sum_value.clone()
        metric.unsync()
        assert float(metric.sum_value) == 3.0, "unsync() must restore the local state"
    torch.testing.assert_close(synced["torchmetrics_diff"], synced["torchmetrics"])
    torch.testing.assert_close(synced["torchmetrics_diff"], torch.tensor(9.0))


def test_without_a_custom_gather_nothing_syncs_outside_a_process_group() -> None:
    metric = ours_pkg.SumMetric(distributed_available_fn=lambda: True, dist_sync_on_step=True)
    assert metric(torch.tensor([1.0, 2.0])).item() == 3.0
    assert metric.compute().item() == 3.0


# ------------------------------------------------------------------------------------------------- TorchScript
@pytest.mark.parametrize(
    "build",
    [
        lambda: ours_pkg.SumMetric(),
        lambda: ours_pkg.MetricCollection([ours_pkg.SumMetric()]),
        lambda: nn.Sequential(nn.Linear(2, 2), ours_pkg.MeanSquaredError()),
    ],
    ids=["metric", "collection", "model holding a metric"],
)
def test_torchscript_raises_one_clear_type_error(build: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own TorchScript deprecation notice
        with pytest.raises(TypeError, match=r"torch\.jit\.script does not support .*torch\.compile"):
            torch.jit.script(build())
