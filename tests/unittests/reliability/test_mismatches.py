"""Ranks that disagree: every kind of mismatch raises the same clear ``RuntimeError`` on every rank, naming the
state (or argument), the ranks and what each rank had — never a hang, never silently wrong numbers — and the ranks
are still in step afterwards. Also: a rank outside a subgroup.

The last rank is the odd one out. Messages quoted in ``docs/guide/failure_modes.rst`` come from these bodies.

Package modules covered: the agreement checks of ``distributed`` (collectives and the sync engine) as ``metric`` and
``losses`` meet them.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff import Metric, SumMetric
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.functional import supcon_loss
from torchmetrics_diff.losses import CLIPLoss, InfoNCELoss, SupConLoss

pytestmark = pytest.mark.timeout(120)

F64 = torch.float64


class Configurable(Metric):
    """States given as ``{name: (default, dist_reduce_fx)}``; ``update(name=value)`` adds or appends."""

    full_state_update = False

    def __init__(self, states: dict[str, tuple[Any, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, (default, fx) in states.items():
            self.add_state(name, default, dist_reduce_fx=fx)

    def update(self, **values: torch.Tensor) -> None:
        for name, value in values.items():
            current = getattr(self, name)
            if isinstance(current, list):
                current.append(value)
            else:
                setattr(self, name, current + value)

    def compute(self) -> dict[str, Any]:
        return dict(self.metric_state)


def _metric_cases(rank: int, world: int) -> dict[str, tuple[Callable[[], Any], tuple[str, ...]]]:
    """Case -> (the call on this rank, what every rank's message must contain)."""
    odd = rank == world - 1
    last = f"rank {world - 1}"
    zero = torch.tensor(0.0, dtype=F64)

    def compute(states: dict, **values: torch.Tensor) -> Callable[[], Any]:
        metric = Configurable(states)
        metric.update(**values)
        return metric.compute

    def forward(states: dict, **values: torch.Tensor) -> Callable[[], Any]:
        return lambda: Configurable(states, dist_sync_on_step=True)(**values)

    dtype = torch.float32 if odd else F64
    width = 4 if odd else 3
    return {
        "missing state": (
            compute({"total": (zero, "sum")} if odd else {"total": (zero, "sum"), "extra": (zero, "sum")}, total=zero),
            ("Configurable", "'extra'", "missing on rank(s)", f"[{world - 1}]"),
        ),
        "dtype": (
            compute({"total": (torch.tensor(0.0, dtype=dtype), "sum")}, total=torch.tensor(1.0, dtype=dtype)),
            ("'total'", "dtype", last, "torch.float32", "torch.float64"),
        ),
        "shape": (
            compute({"total": (torch.zeros(width, dtype=F64), "sum")}, total=zero),
            ("'total'", "shape", last, "(3,)", "(4,)"),
        ),
        "cat trailing shape": (
            compute({"rows": ([], "cat")}, rows=torch.ones(2, width, dtype=F64)),
            ("'rows'", "trailing shape", last, "(*, 3)", "(*, 4)"),
        ),
        "0-d vs 1-d": (
            compute({"total": (torch.zeros(1, dtype=F64) if odd else zero, "sum")}, total=zero),
            ("'total'", "shape", last, "()", "(1,)"),
        ),
        "reduction": (
            compute({"total": (zero, "max" if odd else "sum")}, total=zero + 1),
            ("'total'", "reduction", last, "sum", "max"),
        ),
        "order": (
            compute(
                {"a": (zero, "sum"), "b": (zero, "sum")} if odd else {"b": (zero, "sum"), "a": (zero, "sum")},
                a=zero,
                b=zero,
            ),
            ("different order", "['a', 'b']", "['b', 'a']"),
        ),
        "gathered state ndim": (
            compute({"stack": (torch.zeros(2, 2) if odd else torch.zeros(2), None)}, stack=torch.tensor(1.0)),
            ("'stack'", "number of dimensions", last, "ndim 1", "ndim 2"),
        ),
        "forward: shape": (
            forward({"total": (torch.zeros(width, dtype=F64), "sum")}, total=torch.zeros(width, dtype=F64)),
            ("'total'", "shape", last, "(3,)", "(4,)"),
        ),
    }


def _collective_cases(rank: int, world: int) -> dict[str, tuple[Callable[[], Any], tuple[str, ...]]]:
    odd = rank == world - 1
    last = f"rank {world - 1}"

    def t(shape: tuple = (2, 3), dtype: torch.dtype = F64, requires_grad: bool = False) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype).requires_grad_(requires_grad)

    return {
        "collective ndim": (lambda: gather_all_tensors(t((2,)) if odd else t()), ("gather_all_tensors", "ndim", last)),
        "collective dtype": (
            lambda: all_gather_cat(t(dtype=torch.float32) if odd else t()),
            ("all_gather_cat", "dtype", last, "torch.float32", "torch.float64"),
        ),
        "collective trailing shape": (
            lambda: all_gather_cat(t((2, 4)) if odd else t((5, 3))),
            ("all_gather_cat", "trailing dimensions", last, "(3,)", "(4,)"),
        ),
        "collective shape": (
            lambda: all_reduce(t((4,)) if odd else t((3,))),
            ("all_reduce", "shape", last, "(3,)", "(4,)"),
        ),
        "collective grad mode": (
            lambda: gather_all_tensors(t(requires_grad=True), grad="sync" if odd else "local"),
            ("gather_all_tensors", "grad", last, "sync", "local"),
        ),
        "collective op": (
            lambda: all_reduce(t(), "max" if odd else "sum"),
            ("all_reduce", "op", last, "max", "sum"),
        ),
        "collective requires_grad under grad='sync'": (
            lambda: all_reduce(t(requires_grad=not odd), "sum", grad="sync"),
            ("all_reduce", "requires_grad", last, "True", "False"),
        ),
    }


def _mismatch_body(rank: int, world: int) -> dict[str, Any]:
    cases = {**_metric_cases(rank, world), **_collective_cases(rank, world)}
    out = {name: outcome(call) for name, (call, _) in cases.items()}
    # the forward path rolls back: the accumulated states are those of before the failed call
    metric = Configurable({"total": (torch.zeros(3 if rank != world - 1 else 4, dtype=F64), "sum")})
    metric.dist_sync_on_step = True
    state_before = metric.total.clone()
    outcome(lambda: metric(total=torch.ones_like(state_before)))
    out["forward rolled back"] = bool(torch.equal(metric.total, state_before) and metric.update_count == 0)
    out["after"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_mismatch_raises_the_same_error_on_every_rank(world_size: int) -> None:
    results = run_distributed(_mismatch_body, world_size, timeout=60)
    cases = {**_metric_cases(0, world_size), **_collective_cases(0, world_size)}
    problems = []
    for name, (_, needles) in cases.items():
        for rank, res in enumerate(results):
            problems.append(problem(f"{name} rank {rank}", res[name], "RuntimeError", needles, within=5.0))
        messages = {res[name].message for res in results}
        if len(messages) != 1:
            problems.append(f"{name}: the ranks raised different messages {sorted(messages)}")
    for rank, res in enumerate(results):
        if not res["forward rolled back"]:
            problems.append(f"rank {rank}: a forward that failed in its sync did not restore the states")
        after = res["after"]
        if after.kind != "ok" or after.value.item() != world_size:
            problems.append(f"rank {rank}: all_reduce after the mismatches gave {after}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


# --------------------------------------------------------------------------------------------- loss mismatches


def _loss_mismatch_body(rank: int, world: int) -> dict[str, Any]:
    odd = rank == world - 1
    g = torch.Generator().manual_seed(rank)
    x = torch.nn.functional.normalize(torch.randn(3, 4, generator=g, dtype=F64), dim=1)
    out = {}
    for strategy in ("sharded", "replicated"):
        dim = 3 if odd else 4
        out[f"clip embedding width {strategy}"] = outcome(
            lambda strategy=strategy, dim=dim: CLIPLoss(strategy=strategy)(x[:, :dim], x[:, :dim], 5.0)
        )
        out[f"infonce embedding width {strategy}"] = outcome(
            lambda strategy=strategy, dim=dim: InfoNCELoss(strategy=strategy)(x[:, :dim], x[:, :dim])
        )
    out["after"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    return out


@pytest.mark.parametrize("world_size", [2])
def test_loss_embedding_width_differs_between_ranks(world_size: int) -> None:
    """Embeddings of another width on one rank: every rank raises, and the message says that the ranks disagree
    and on what (today: torch's ``Sizes of tensors must match except in dimension 0`` from ``torch.cat`` after the
    gather, which names neither the argument nor the rank)."""
    results = run_distributed(_loss_mismatch_body, world_size, timeout=60)
    problems = []
    for case in results[0]:
        if case == "after":
            continue
        for rank, res in enumerate(results):
            problems.append(
                problem(f"{case} rank {rank}", res[case], "RuntimeError", ("disagree", f"rank {world_size - 1}"))
            )
    for rank, res in enumerate(results):
        if res["after"].kind != "ok" or res["after"].value.item() != world_size:
            problems.append(f"rank {rank}: all_reduce afterwards gave {res['after']}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def _supcon_labels_body(rank: int, world: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(rank)
    feats = torch.nn.functional.normalize(torch.randn(3, 4, generator=g, dtype=F64), dim=1)
    labels = None if rank == world - 1 else torch.tensor([0, 1, 0])
    return {s: outcome(lambda s=s: SupConLoss(strategy=s)(feats, labels)) for s in ("sharded", "replicated")}


@pytest.mark.parametrize("world_size", [2])
def test_supcon_labels_on_some_ranks_only(world_size: int) -> None:
    """Labels on some ranks and ``None`` ("every sample its own class") on another is a mismatch: every rank must
    raise. Today the two code paths issue collectives of the same shape (``all_gather_cat`` of the labels here,
    ``gather_all_tensors`` of the row counts there), so they pair up and each rank computes a different, wrong
    loss (replicated) or a wrong global value (sharded), silently."""
    results = run_distributed(_supcon_labels_body, world_size, timeout=60)
    problems = []
    for strategy in ("sharded", "replicated"):
        for rank, res in enumerate(results):
            problems.append(problem(f"{strategy} rank {rank}", res[strategy], "RuntimeError", ("labels",)))
    if results[0]["replicated"].kind == "ok":
        problems.append(f"replicated values per rank: {[r['replicated'].value.item() for r in results]}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_supcon_reference_is_consistent() -> None:
    """Sanity check of the oracle used above: no labels equals distinct labels."""
    feats = torch.nn.functional.normalize(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), dim=1)
    torch.testing.assert_close(supcon_loss(feats, None), supcon_loss(feats, torch.arange(5)))


# ------------------------------------------------------------------------------------------ outside a subgroup


def _non_member_body(rank: int, world: int) -> dict[str, Any]:
    group = dist.new_group([0, 1])  # every rank must call new_group; rank 2 is not a member
    x = torch.tensor([float(rank + 1)], dtype=F64)
    out = {
        "gather_all_tensors": outcome(lambda: gather_all_tensors(x, group)),
        "all_gather_cat": outcome(lambda: all_gather_cat(x, group)),
        "all_reduce": outcome(lambda: all_reduce(x, "sum", group)),
        "CLIPLoss": outcome(lambda: CLIPLoss(process_group=group)(torch.eye(2), torch.eye(2), 1.0)),
    }
    metric = SumMetric(process_group=group).set_dtype(F64)
    metric.update(x)
    out["SumMetric.compute"] = outcome(metric.compute)
    out["SumMetric.forward"] = outcome(lambda: SumMetric(process_group=group, dist_sync_on_step=True)(x))
    dist.barrier()
    dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world_size", [3])
def test_rank_outside_a_subgroup(world_size: int) -> None:
    """A rank that is not in ``process_group`` gets a ValueError saying so from the collectives and the losses;
    a metric must do the same rather than silently returning the rank's local value as if it were synced
    (``group_size`` reads ``dist.get_world_size(group) == -1`` there as "not distributed")."""
    results = run_distributed(_non_member_body, world_size, timeout=60)
    problems = []
    for case, got in results[2].items():
        needles = ("global rank 2", "not a member", "[0, 1]")
        problems.append(problem(f"rank 2 (outside) {case}", got, "ValueError", needles))
    for rank in (0, 1):
        for case, got in results[rank].items():
            if got.kind != "ok":
                problems.append(f"rank {rank} (member) {case}: raised {got.kind} {got.message!r}")
        compute = results[rank]["SumMetric.compute"]
        if compute.kind == "ok" and compute.value.item() != 3.0:
            problems.append(f"rank {rank}: SumMetric over the subgroup gave {compute.value}, expected 1 + 2")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
