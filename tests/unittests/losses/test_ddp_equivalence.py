"""The gradient contract of the losses under a real ``DistributedDataParallel`` model.

Every rank holds a slice of a global batch (seeded, known to all ranks), runs the replicated float64 model under
DDP (gradients averaged) and calls the loss; one process (the test process) runs the same model on the whole
global batch through an *independent* reference formula (``tests._helpers.references``). After ``backward``:

- the returned value is identical on every rank and equals the reference value;
- the encoders' gradients and the loss parameters' gradients (logit scale / bias) equal the reference gradients;
- ``grad_reduction="sum"`` with a manual all-reduce-sum of the gradients (no DDP) gives the same;
- ``compute()`` after the steps is detached and is the mean of the step values (for ``GlobalMeanLoss`` and
  ``TokenCrossEntropyLoss``, as documented, the weighted mean over every element seen: steps weighted by their
  global weight / valid-token count).

World sizes 1, 2, 3 with even, uneven and empty ranks, both strategies where they apply; the sharded CLIP also with
each branch of its column statistics' rule forced (one all-gather, or two all-reduces). All the cases of one loss
kind and world size run in one ``run_distributed`` call; every mismatch is collected and reported with its case.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import max_err
from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import (
    COLUMN_BRANCHES,
    KINDS,
    LOSS_PARAMS,
    STRATEGY_KINDS,
    Net,
    column_branch,
    criterion_call,
    make_batch,
    make_criterion,
    reference_step,
    reference_weight,
    slice_rows,
)
from tests._helpers.seeds import bounds

N_STEPS = 3
SIZES = {
    1: [(4,)],
    2: [(4, 4), (3, 5), (0, 3)],
    3: [(4, 4, 4), (3, 5, 2), (3, 0, 5)],
}


class Case(NamedTuple):
    kind: str
    strategy: str | None
    sizes: tuple[int, ...]
    grad_reduction: str = "mean"

    def __str__(self) -> str:
        strategy = f" strategy={self.strategy}" if self.strategy else ""
        return (
            f"[{self.kind}{strategy} W={len(self.sizes)} sizes={'/'.join(map(str, self.sizes))} "
            f"grad_reduction={self.grad_reduction}]"
        )


def _strategies(kind: str) -> list[str | None]:
    return ["replicated", "sharded"] if kind in STRATEGY_KINDS else [None]


def _cases(kind: str, world_size: int) -> list[Case]:
    cases = []
    for strategy in _strategies(kind):
        for sizes in SIZES[world_size]:
            cases.append(Case(kind, strategy, sizes, "mean"))
            if world_size == 1 or len(set(sizes)) > 1:  # uneven or empty: also the summing trainer
                cases.append(Case(kind, strategy, sizes, "sum"))
    return cases


# ------------------------------------------------------------------------------------------- on the ranks


def _run_cases(rank: int, world_size: int, cases: list[Case], n_steps: int) -> list[dict[str, Any]]:
    """Train-step every case on this rank's rows; return its values, reduced gradients and epoch value."""
    results = []
    for case in cases:
        model = Net(case.kind)
        net = DistributedDataParallel(model) if case.grad_reduction == "mean" else model
        criterion = make_criterion(case.kind, case.strategy, case.grad_reduction)
        lo, hi = bounds(case.sizes, rank)
        values, grads, requires_grad = [], [], []
        for step in range(n_steps):
            inputs, extra = make_batch(case.kind, sum(case.sizes), step)
            model.zero_grad(set_to_none=True)
            outputs = net(*slice_rows(inputs, lo, hi))
            args, kwargs = criterion_call(case.kind, outputs, slice_rows(extra, lo, hi))
            loss = criterion(*args, **kwargs)
            requires_grad.append(loss.requires_grad)
            loss.backward()
            step_grads: dict[str, torch.Tensor | None] = {}
            for name, p in model.named_parameters():
                grad = p.grad
                if case.grad_reduction == "sum":  # the summing trainer; a missing grad still joins the collective
                    grad = torch.zeros_like(p) if grad is None else grad.clone()
                    dist.all_reduce(grad)
                step_grads[name] = None if grad is None else grad.detach().clone()
            values.append(loss.detach().clone())
            grads.append(step_grads)
        result = {"values": values, "grads": grads, "requires_grad": requires_grad, "epoch_error": None}
        try:  # a failing compute() is reported with the case, without hiding the gradient checks
            epoch = criterion.compute()
        except Exception as err:  # it fails alike on every rank (before any collective), so the ranks stay in step
            result["epoch_error"] = f"{type(err).__name__}: {err}"
        else:
            result["epoch"] = epoch.detach().clone()
            result["epoch_requires_grad"] = epoch.requires_grad
            result["epoch_grad_fn"] = type(epoch.grad_fn).__name__ if epoch.grad_fn is not None else None
        results.append(result)
    return results


# --------------------------------------------------------------------------------------------- checks


@cache
def _reference(kind: str, n: int, step: int) -> tuple[float, dict[str, torch.Tensor]]:
    return reference_step(kind, n, step)


def _check_case(case: Case, per_rank: list[dict[str, Any]]) -> list[str]:
    """Every violated expectation of one case, as messages naming the case."""
    problems = []
    n = sum(case.sizes)
    for step in range(N_STEPS):
        ref_value, ref_grads = _reference(case.kind, n, step)
        where = f"{case} step {step}"
        values = [r["values"][step] for r in per_rank]
        if not all(torch.equal(v, values[0]) for v in values):
            problems.append(f"{where}: value differs between ranks: {[float(v) for v in values]}")
        if not all(r["requires_grad"][step] for r in per_rank):
            problems.append(f"{where}: returned value does not require grad on every rank")
        for rank, r in enumerate(per_rank):
            if (err := max_err(r["values"][step], ref_value)) > 1:
                problems.append(f"{where} rank {rank}: value {float(r['values'][step])!r} != reference {ref_value!r}")
            for group, names in (
                ("encoder", [k for k in ref_grads if k not in LOSS_PARAMS]),
                ("loss-parameter", [k for k in ref_grads if k in LOSS_PARAMS]),
            ):
                for name in names:
                    got = r["grads"][step][name]
                    if (err := max_err(got, ref_grads[name])) > 1:
                        ratio = _ratio(got, ref_grads[name])
                        problems.append(
                            f"{where} rank {rank}: {group} grad {name} error {err:.3g}× tolerance; "
                            f"got/reference ≈ {ratio}"
                        )
    for rank, r in enumerate(per_rank):
        if r["epoch_error"] is not None:
            problems.append(f"{case} rank {rank}: compute() raised {r['epoch_error']}")
            continue
        steps = [float(v) for v in r["values"]]
        if case.kind in ("mean", "tokence"):
            # documented: the weighted mean over every element (token) seen, i.e. the steps weighted by their
            # global weight (valid-token count), not the plain mean of the step values
            weights = [reference_weight(case.kind, n, step) for step in range(N_STEPS)]
            expected = sum(v * w for v, w in zip(steps, weights)) / sum(weights)
            what = "weight-averaged steps"
        else:
            expected, what = sum(steps) / N_STEPS, "mean of steps"
        if max_err(r["epoch"], expected) > 1:
            problems.append(f"{case} rank {rank}: compute() = {float(r['epoch'])!r} != {what} {expected!r}")
        if r["epoch_requires_grad"] or r["epoch_grad_fn"] is not None:
            problems.append(f"{case} rank {rank}: compute() is not detached (grad_fn {r['epoch_grad_fn']})")
    return problems


def _ratio(got: torch.Tensor | None, want: torch.Tensor) -> str:
    if got is None:
        return "None (no gradient)"
    big = want.abs() > 1e-6 * max(1e-300, float(want.abs().max()))
    if not bool(big.any()):
        return f"n/a (reference is 0, got max |g| {float(got.abs().max()):.3g})"
    ratios = (got[big] / want[big]).flatten()
    lo, hi = float(ratios.min()), float(ratios.max())
    return f"{lo:.6g}" if math.isclose(lo, hi, rel_tol=1e-6) else f"[{lo:.4g}, {hi:.4g}]"


# ---------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_ddp_gradient_equivalence(kind: str, world_size: int) -> None:
    """Value on every rank and DDP-averaged (or summed) gradients equal one process on the global batch."""
    cases = _cases(kind, world_size)
    results = run_distributed(_run_cases, world_size, cases, N_STEPS, timeout=120.0)
    problems = [p for i, case in enumerate(cases) for p in _check_case(case, [r[i] for r in results])]
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


@pytest.mark.parametrize("sizes", [(3, 5, 2), (3, 0, 5)], ids=["uneven", "empty-rank"])
def test_sharded_equals_replicated(sizes: tuple[int, ...]) -> None:
    """Both strategies give the same values and DDP gradients as each other (W=3, uneven batches)."""
    cases = [Case(kind, strategy, sizes) for kind in STRATEGY_KINDS for strategy in ("replicated", "sharded")]
    results = run_distributed(_run_cases, 3, cases, N_STEPS, timeout=120.0)
    problems = []
    for i in range(0, len(cases), 2):
        replicated_case, sharded_case = cases[i], cases[i + 1]
        for rank, rank_results in enumerate(results):
            replicated, sharded = rank_results[i], rank_results[i + 1]
            for step in range(N_STEPS):
                where = f"{sharded_case} vs replicated, rank {rank} step {step}"
                if max_err(sharded["values"][step], replicated["values"][step]) > 1:
                    problems.append(
                        f"{where}: value {float(sharded['values'][step])!r} != {float(replicated['values'][step])!r}"
                    )
                for name, want in replicated["grads"][step].items():
                    if want is None or max_err(sharded["grads"][step][name], want) > 1:
                        problems.append(f"{where}: grad {name} differs")
        assert replicated_case.kind == sharded_case.kind
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


def _run_clip_columns(rank: int, world_size: int, cases: list[Case], branch: str) -> dict[str, Any]:
    with column_branch(branch) as decisions:
        results = _run_cases(rank, world_size, cases, N_STEPS)
    return {"results": results, "decisions": decisions}


@pytest.mark.parametrize("branch", COLUMN_BRANCHES)
@pytest.mark.parametrize("sizes", [(2, 5), (3, 0, 5)], ids=["W=2", "W=3-empty-rank"])
def test_sharded_clip_column_branches_equal_one_process(sizes: tuple[int, ...], branch: str) -> None:
    """The sharded CLIP under DDP (and summed gradients) equals one process on the global batch whichever way its
    column statistics cross the ranks: one all-gather of the W × N table, or two all-reduces of N numbers."""
    cases = [Case("clip", "sharded", sizes, reduction) for reduction in ("mean", "sum")]
    out = run_distributed(_run_clip_columns, len(sizes), cases, branch, timeout=120.0)
    for rank, r in enumerate(out):  # one combination per step of each case
        assert r["decisions"] == [branch == "gather"] * (N_STEPS * len(cases)), f"rank {rank}: {r['decisions']}"
    problems = [p for i, case in enumerate(cases) for p in _check_case(case, [r["results"][i] for r in out])]
    assert not problems, f"{branch}: {len(problems)} mismatches:\n" + "\n".join(problems)
