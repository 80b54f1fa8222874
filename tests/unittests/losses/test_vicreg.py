"""VICReg over the global batch: ``functional._vicreg``, ``_global.vicreg`` and ``losses.VICRegLoss``.

- The reference is the paper's Algorithm 1 written out in float64 (mean squared difference of the views; the
  unbiased per-feature variance under a hinge at 1; the squared off-diagonal covariances over ``D``; each summed
  over the two views), itself checked against a brute-force loop over rows and feature pairs in Python floats.
- The sufficient statistics merge: shards' summed statistics give the one-shot loss and gradient; a shift leaves
  the loss unchanged; no rows and one row are finite; half precision is summed in float32.
- Under DDP (float64, W = 1, 2, 3, even, uneven and empty ranks, ``grad_reduction`` "mean" and "sum"): values on
  every rank and every parameter gradient equal one process on the concatenated rows, over two steps (the second
  with the class's shift); two micro-batches under ``no_sync()`` give the sum of the two global micro-batch
  gradients; the functional ``global_vicreg_loss`` gives each rank the slice of the global input gradient;
  a steady step is one collective forward (the all-reduce of small CPU statistics rides in the call header's
  exchange), none in backward, and no host
  round trip; ranks that disagree (``D``, a bad input on one rank) raise on every rank.

Package modules covered: ``functional._vicreg``, ``_global.vicreg``, ``losses.self_supervised`` (``VICRegLoss``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.checks import max_err
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.outcomes import outcome, problem
from tests._helpers.round_trips import counting, total
from tests._helpers.seeds import F64, bounds, generator
from torchmetrics_diff.functional import (
    VICRegStats,
    global_vicreg_loss,
    vicreg_from_stats,
    vicreg_loss,
    vicreg_stats,
    vicreg_terms,
)
from torchmetrics_diff.losses import VICRegLoss

pytestmark = pytest.mark.timeout(180)

D_IN, D_HID, D = 5, 6, 4
COEFFS = (2.0, 3.0, 0.5)  # sim, std, cov: unequal, so a term weighted by the wrong coefficient shows
EPS = 1e-4


# ------------------------------------------------------------------------------------------------ references
def ref_vicreg_terms(za: Tensor, zb: Tensor, eps: float = EPS) -> tuple[Tensor, Tensor, Tensor]:
    """Algorithm 1 of the paper, float64: invariance, v(Za) + v(Zb), c(Za) + c(Zb)."""
    za, zb = za.to(F64), zb.to(F64)
    n, d = za.shape
    invariance = ((za - zb) ** 2).mean()

    def v(z: Tensor) -> Tensor:
        return torch.relu(1 - torch.sqrt(z.var(dim=0, unbiased=True) + eps)).mean()

    def c(z: Tensor) -> Tensor:
        centered = z - z.mean(dim=0)
        cov = centered.T @ centered / (n - 1)
        return (cov - torch.diag(torch.diagonal(cov))).pow(2).sum() / d

    return invariance, v(za) + v(zb), c(za) + c(zb)


def ref_vicreg(za: Tensor, zb: Tensor, sim: float, std: float, cov: float, eps: float = EPS) -> Tensor:
    inv, var, covariance = ref_vicreg_terms(za, zb, eps)
    return sim * inv + std * var + cov * covariance


def brute_vicreg_terms(za: list[list[float]], zb: list[list[float]], eps: float) -> tuple[float, float, float]:
    """The same three terms by explicit loops over rows and feature pairs (Python floats)."""
    n, d = len(za), len(za[0])
    invariance = sum((za[k][j] - zb[k][j]) ** 2 for k in range(n) for j in range(d)) / (n * d)
    variance = covariance = 0.0
    for z in (za, zb):
        mean = [sum(z[k][j] for k in range(n)) / n for j in range(d)]
        cov = [[0.0] * d for _ in range(d)]
        for i in range(d):
            for j in range(d):
                cov[i][j] = sum((z[k][i] - mean[i]) * (z[k][j] - mean[j]) for k in range(n)) / (n - 1)
        variance += sum(max(0.0, 1 - math.sqrt(cov[j][j] + eps)) for j in range(d)) / d
        covariance += sum(cov[i][j] ** 2 for i in range(d) for j in range(d) if i != j) / d
    return invariance, variance, covariance


def _randn(*shape: int, seed: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale + shift


def _views(n: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    """Views whose features have stds on both sides of 1 (the hinge is active for some) and correlations."""
    za = _randn(n, d, seed=seed) * torch.linspace(0.4, 1.8, d, dtype=F64)
    za = za + 0.5 * za[:, :1]  # correlated features
    return za, za + 0.3 * _randn(n, d, seed=seed + 1)


# ---------------------------------------------------------------------------------------- single process
@pytest.mark.parametrize(("n", "d"), [(2, 1), (3, 2), (7, 3), (12, 5)])
def test_reference_matches_a_brute_force_loop_and_the_loss(n: int, d: int) -> None:
    za, zb = _views(n, d, seed=n * 10 + d)
    brute = brute_vicreg_terms(za.tolist(), zb.tolist(), EPS)
    ref = ref_vicreg_terms(za, zb)
    got = vicreg_terms(vicreg_stats(za, zb), EPS)
    for name, b, r, g in zip(("invariance", "variance", "covariance"), brute, ref, got):
        assert max_err(r, b) <= 1, (name, float(r), b)
        assert max_err(g, b) <= 1, (name, float(g), b)
    want = COEFFS[0] * brute[0] + COEFFS[1] * brute[1] + COEFFS[2] * brute[2]
    assert max_err(vicreg_loss(za, zb, *COEFFS, eps=EPS), want) <= 1


def test_cases_exercise_every_term() -> None:
    """The data of the tests has an active and an inactive variance hinge and nonzero covariances."""
    za, _ = _views(12, 5, seed=3)
    std = za.std(dim=0)
    assert bool((std < 1).any()) and bool((std > 1).any()), std
    assert float(ref_vicreg_terms(*_views(12, 5, seed=3))[2]) > 0.01


def test_defaults_are_the_papers() -> None:
    za, zb = _views(9, 4, seed=5)
    torch.testing.assert_close(vicreg_loss(za, zb), ref_vicreg(za, zb, 25.0, 25.0, 1.0), rtol=1e-12, atol=0)
    assert VICRegLoss().sim_coeff == 25.0 and VICRegLoss().std_coeff == 25.0 and VICRegLoss().cov_coeff == 1.0


@pytest.mark.parametrize("sizes", [(5, 0, 4), (1, 1, 1, 6), (9,)])
def test_summed_shard_statistics_give_the_one_shot_loss_and_gradient(sizes: tuple[int, ...]) -> None:
    za, zb = _views(sum(sizes), 4, seed=11)
    za, zb = za.requires_grad_(), zb.requires_grad_()
    cuts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    shards = [vicreg_stats(za[lo:hi], zb[lo:hi]) for lo, hi in zip(cuts, cuts[1:])]
    merged = shards[0]
    for s in shards[1:]:
        merged = merged.merge(s)
    got = vicreg_from_stats(merged, *COEFFS, eps=EPS)
    want = ref_vicreg(za, zb, *COEFFS)
    assert max_err(got.detach(), want.detach()) <= 1
    g_got = torch.autograd.grad(got, (za, zb))
    g_want = torch.autograd.grad(want, (za, zb))
    for a, b in zip(g_got, g_want):
        assert max_err(a, b) <= 1


def test_shift_leaves_the_loss_unchanged_and_rescues_float32() -> None:
    """Statistics around a shift give the same loss (float64); in float32 with means 1000× the spread the raw
    moments cancel catastrophically, the shifted ones do not, and the class shifts by the previous call's means."""
    za64, zb64 = _views(64, 6, seed=2)
    za64, zb64 = za64 + 1000.0, zb64 + 1000.0
    shift = (torch.full((6,), 999.0, dtype=F64), torch.full((6,), 1001.0, dtype=F64))
    want = ref_vicreg(za64, zb64, *COEFFS)
    assert max_err(vicreg_from_stats(vicreg_stats(za64, zb64, shift), *COEFFS, eps=EPS), want) <= 1
    za, zb = za64.float(), zb64.float()
    exact = ref_vicreg(za, zb, *COEFFS)  # the float64 loss of the float32 values
    raw = vicreg_loss(za, zb, *COEFFS, eps=EPS)
    loss = VICRegLoss(*COEFFS, eps=EPS)
    first, second = loss(za, zb), loss(za, zb)  # the second call is shifted by the first call's means
    assert abs(float(raw) - float(exact)) > 1e-2 * float(exact), (float(raw), float(exact))  # the problem exists
    assert abs(float(second) - float(exact)) < 1e-5 * float(exact), (float(second), float(exact))
    assert first.dtype == second.dtype == torch.float32


def test_no_row_and_one_row_are_finite() -> None:
    none = vicreg_terms(vicreg_stats(torch.zeros(0, 3), torch.zeros(0, 3)), EPS)
    assert [float(t) for t in none] == [0.0, pytest.approx(2 * (1 - math.sqrt(EPS))), 0.0]
    one = vicreg_terms(vicreg_stats(torch.ones(1, 3), torch.zeros(1, 3)), EPS)
    assert [float(t) for t in one] == [1.0, pytest.approx(2 * (1 - math.sqrt(EPS))), 0.0]
    assert all(math.isfinite(float(t)) for t in one)


def test_gradient_matches_finite_differences() -> None:
    za, zb = _views(6, 3, seed=4)
    torch.autograd.gradcheck(
        lambda a, b: vicreg_loss(a, b, *COEFFS, eps=EPS), (za.requires_grad_(), zb.requires_grad_())
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_summed_in_float32(dtype: torch.dtype) -> None:
    za, zb = _views(16, 4, seed=9)
    za, zb = za.to(dtype), zb.to(dtype)
    got = VICRegLoss(*COEFFS, eps=EPS)(za, zb)
    assert got.dtype == torch.float32
    want = ref_vicreg(za, zb, *COEFFS)  # the float64 loss of the half-precision values
    assert abs(float(got) - float(want)) < 1e-5 * max(1.0, float(want))
    stats = vicreg_stats(za, zb)
    assert all(f.dtype == torch.float32 for f in stats)


def test_last_terms_and_compute() -> None:
    za, zb = _views(10, 4, seed=6)
    loss = VICRegLoss(*COEFFS, eps=EPS)
    assert loss.last_terms is None
    value = loss(za.requires_grad_(), zb)
    ref = ref_vicreg_terms(za.detach(), zb)
    for got, want in zip(loss.last_terms, ref):
        assert max_err(got, want) <= 1 and not got.requires_grad
    loss.update(zb, za)
    want = (float(value.detach()) + float(ref_vicreg(zb, za.detach(), *COEFFS))) / 2
    assert max_err(loss.compute(), want) <= 1


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        (lambda: vicreg_loss(torch.zeros(4), torch.zeros(4)), ("`za`", "(B, D)", "(4,)")),
        (lambda: vicreg_loss(torch.zeros(4, 3), torch.zeros(4, 2)), ("`zb`", "(4, 3)", "(4, 2)")),
        (lambda: vicreg_loss(torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 3)), ("`za`", "torch.int64")),
        (lambda: vicreg_loss(torch.zeros(4, 3), torch.zeros(4, 3), sim_coeff=-1.0), ("`sim_coeff`", "-1.0")),
        (lambda: vicreg_loss(torch.zeros(4, 3), torch.zeros(4, 3), std_coeff=math.nan), ("`std_coeff`", "nan")),
        (lambda: vicreg_loss(torch.zeros(4, 3), torch.zeros(4, 3), cov_coeff=True), ("`cov_coeff`", "True")),
        (lambda: vicreg_loss(torch.zeros(4, 3), torch.zeros(4, 3), eps=-1e-4), ("`eps`", "-0.0001")),
        (lambda: vicreg_stats(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(3)), ("`shift`", "Tensor")),
        (
            lambda: vicreg_stats(torch.zeros(4, 3), torch.zeros(4, 3), (torch.zeros(3), torch.zeros(2))),
            ("`shift[1]`", "(3,)", "(2,)"),
        ),
        (
            lambda: vicreg_terms(
                VICRegStats(*(torch.zeros(3), torch.zeros(3, 2)) * 2, torch.zeros(()), torch.zeros(()))
            ),
            ("`stats.gram_a`", "(3, 3)", "(3, 2)"),
        ),
        (lambda: VICRegLoss(sim_coeff=math.inf), ("`sim_coeff`", "inf")),
        (lambda: VICRegLoss(eps="1e-4"), ("`eps`", "'1e-4'")),
        (lambda: VICRegLoss()(torch.zeros(4, 3), torch.zeros(4, 3, dtype=F64)), ("`zb`", "float64", "float32")),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call: Any, needles: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert all(n in str(info.value) for n in needles), (str(info.value), needles)


# ------------------------------------------------------------------------------------------------ under DDP
SIZES = {1: [(5,)], 2: [(2, 5), (0, 6)], 3: [(4, 1, 2), (3, 0, 5)]}  # uneven, and an empty rank
#: rows of [rank] in each of two micro-batches
MICRO = {1: [(4, 3)], 2: [(3, 2), (0, 4)], 3: [(2, 3), (3, 0), (1, 2)]}
STEPS = 2


class Expander(nn.Module):
    """A shared (siamese) float64 encoder, seeded identically in every process."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D_IN, D_HID, dtype=F64), nn.Linear(D_HID, D, dtype=F64)
        g = generator("vicreg-expander")
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64) * 0.6)

    def forward(self, xa: Tensor, xb: Tensor) -> tuple[Tensor, Tensor]:
        return self.fc2(torch.tanh(self.fc1(xa))), self.fc2(torch.tanh(self.fc1(xb)))


def _batch(n: int, *parts: object) -> tuple[Tensor, Tensor]:
    g = generator("vicreg-batch", n, *parts)
    xa = torch.randn(n, D_IN, generator=g, dtype=F64) * 1.5
    return xa, xa + 0.4 * torch.randn(n, D_IN, generator=g, dtype=F64)


def _grads(model: nn.Module, summing: bool) -> dict[str, Tensor]:
    out = {}
    for name, p in model.named_parameters():
        grad = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        if summing:
            dist.all_reduce(grad)
        out[name] = grad
    return out


def _ddp_cases(rank: int, world: int) -> dict[str, Any]:
    """Every DDP case of this world size on this rank: values, terms, gradients, epoch values."""
    out: dict[str, Any] = {}
    for sizes in SIZES[world]:
        for reduction in ("mean", "sum") if world == 1 or len(set(sizes)) > 1 else ("mean",):
            model = Expander()
            net = DistributedDataParallel(model) if reduction == "mean" else model
            loss_fn = VICRegLoss(*COEFFS, eps=EPS, grad_reduction=reduction)
            lo, hi = bounds(sizes, rank)
            steps = []
            for step in range(STEPS):
                model.zero_grad(set_to_none=True)
                xa, xb = _batch(sum(sizes), step)
                value = loss_fn(*net(xa[lo:hi], xb[lo:hi]))
                value.backward()
                steps.append((value.detach(), tuple(loss_fn.last_terms), _grads(model, reduction == "sum")))
            out[f"sizes={sizes} {reduction}"] = {"steps": steps, "epoch": loss_fn.compute()}
    # two micro-batches, the first inside no_sync(): the sum of the two global micro-batch gradients
    model = Expander()
    net = DistributedDataParallel(model)
    loss_fn = VICRegLoss(*COEFFS, eps=EPS)
    values = []
    for m in range(2):
        rows = [r[m] for r in MICRO[world]]
        lo, hi = bounds(rows, rank)
        xa, xb = _batch(sum(rows), "micro", m)
        with net.no_sync() if m == 0 else contextlib.nullcontext():
            value = loss_fn(*net(xa[lo:hi], xb[lo:hi]))
            value.backward()
        values.append(value.detach())
    out["accumulate"] = {"values": values, "grads": _grads(model, False), "epoch": loss_fn.compute()}
    # the functional form: each rank's input gradient is its slice of the global input gradient ("sum")
    sizes = SIZES[world][-1]
    lo, hi = bounds(sizes, rank)
    za, zb = _views(sum(sizes), D, seed=77)
    za, zb = za[lo:hi].clone().requires_grad_(), zb[lo:hi].clone().requires_grad_()
    value = global_vicreg_loss(za, zb, *COEFFS, eps=EPS, grad_reduction="sum")
    value.backward()
    out["functional"] = {"value": value.detach(), "grads": (za.grad, zb.grad)}
    return out


def _reference_step(rows: int, *parts: object) -> tuple[Tensor, tuple[Tensor, ...], dict[str, Tensor]]:
    model = Expander()
    za, zb = model(*_batch(rows, *parts))
    terms = ref_vicreg_terms(za, zb)
    value = COEFFS[0] * terms[0] + COEFFS[1] * terms[1] + COEFFS[2] * terms[2]
    names, params = zip(*model.named_parameters())
    return value.detach(), tuple(t.detach() for t in terms), dict(zip(names, torch.autograd.grad(value, params)))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ddp_gradient_equivalence(world_size: int) -> None:
    results = run_distributed(_ddp_cases, world_size, timeout=150.0)
    problems = []
    for sizes in SIZES[world_size]:
        refs = [_reference_step(sum(sizes), step) for step in range(STEPS)]
        for case, per_rank in ((k, [r[k] for r in results]) for k in results[0] if k.startswith(f"sizes={sizes}")):
            for rank, r in enumerate(per_rank):
                for step, ((value, terms, grads), (ref_value, ref_terms, ref_grads)) in enumerate(
                    zip(r["steps"], refs)
                ):
                    where = f"W={world_size} {case} step {step} rank {rank}"
                    if max_err(value, ref_value) > 1:
                        problems.append(f"{where}: value {float(value)!r} != {float(ref_value)!r}")
                    if not torch.equal(value, per_rank[0]["steps"][step][0]):
                        problems.append(f"{where}: value differs from rank 0's")
                    for name, got, want in zip(("inv", "var", "cov"), terms, ref_terms):
                        if max_err(got, want) > 1:
                            problems.append(f"{where}: term {name} {float(got)!r} != {float(want)!r}")
                    for name, want in ref_grads.items():
                        if max_err(grads[name], want) > 1:
                            problems.append(
                                f"{where}: grad {name} off (max |diff| {(grads[name] - want).abs().max():.3g})"
                            )
                if max_err(r["epoch"], sum(float(v) for v, _, _ in r["steps"]) / STEPS) > 1:
                    problems.append(f"W={world_size} {case} rank {rank}: compute() is not the mean of the steps")
    # accumulation: L(micro 0) + L(micro 1), each over every rank's rows of that micro-batch
    model = Expander()
    total_loss, shares = 0.0, []
    for m in range(2):
        za, zb = model(*_batch(sum(r[m] for r in MICRO[world_size]), "micro", m))
        share = ref_vicreg(za, zb, *COEFFS)
        shares.append(float(share.detach()))
        total_loss = total_loss + share
    names, params = zip(*model.named_parameters())
    ref_grads = dict(zip(names, torch.autograd.grad(total_loss, params)))
    for rank, r in enumerate(results):
        acc = r["accumulate"]
        if max_err(torch.stack(acc["values"]), torch.tensor(shares, dtype=F64)) > 1:
            problems.append(f"W={world_size} accumulate rank {rank}: values {acc['values']} != {shares}")
        for name, want in ref_grads.items():
            if max_err(acc["grads"][name], want) > 1:
                problems.append(f"W={world_size} accumulate rank {rank}: grad {name} off")
        if max_err(acc["epoch"], sum(shares) / 2) > 1:
            problems.append(f"W={world_size} accumulate rank {rank}: compute() is not the mean of the two calls")
    # the functional form
    sizes = SIZES[world_size][-1]
    za, zb = _views(sum(sizes), D, seed=77)
    za, zb = za.requires_grad_(), zb.requires_grad_()
    want = ref_vicreg(za, zb, *COEFFS)
    ga, gb = torch.autograd.grad(want, (za, zb))
    for rank, r in enumerate(results):
        lo, hi = bounds(sizes, rank)
        got = r["functional"]
        if max_err(got["value"], want.detach()) > 1:
            problems.append(f"W={world_size} functional rank {rank}: value {float(got['value'])} != {float(want)}")
        if max_err(got["grads"][0], ga[lo:hi]) > 1 or max_err(got["grads"][1], gb[lo:hi]) > 1:
            problems.append(f"W={world_size} functional rank {rank}: input gradient is not the global one's slice")
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------ collectives, round trips, errors
def _steady_and_errors(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loss_fn = VICRegLoss(*COEFFS, eps=EPS)
    za, zb = _views(2 + rank, 8, seed=rank)
    za, zb = za.requires_grad_(), zb.requires_grad_()
    for _ in range(2):  # warm-up: the first call agrees nothing, the second has a shift
        loss_fn(za, zb).backward()
    with record_collectives() as forward_log, counting() as forward_trips:
        value = loss_fn(za, zb)
    with record_collectives() as backward_log, counting() as backward_trips:
        value.backward()
    out["collectives"] = (list(forward_log), list(backward_log))
    out["round_trips"] = total(forward_trips) + total(backward_trips)
    if world > 1:
        odd = rank == world - 1
        d = 5 if odd else 8
        out["other D"] = outcome(lambda: VICRegLoss()(_views(3, d, seed=1)[0], _views(3, d, seed=2)[0]))
        bad = torch.zeros(3, 8, 2) if odd else torch.zeros(3, 8)
        out["bad input on one rank"] = outcome(lambda: VICRegLoss()(bad, torch.zeros_like(bad)))
        out["functional bad coefficient on one rank"] = outcome(
            lambda: global_vicreg_loss(za, zb, sim_coeff=-1.0 if odd else 1.0)
        )
        out["after the errors"] = outcome(lambda: float(loss_fn(za, zb).detach()))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_steady_step_collectives_round_trips_and_disagreements(world_size: int) -> None:
    results = run_distributed(_steady_and_errors, world_size, timeout=120.0)
    problems = []
    for rank, r in enumerate(results):
        forward, backward = r["collectives"]
        # the call header's exchange, then the all-reduce of the statistics
        if len(forward) != (0 if world_size == 1 else 1) or forward.count("all_reduce") or backward:
            problems.append(f"W={world_size} rank {rank}: collectives forward {forward}, backward {backward}")
        if r["round_trips"]:
            problems.append(f"W={world_size} rank {rank}: {r['round_trips']} host round trips in a steady step")
        if world_size == 1:
            continue
        odd = rank == world_size - 1
        last = f"rank {world_size - 1}"
        for p in (
            problem(f"rank {rank} other D", r["other D"], "RuntimeError", ("shape",)),
            problem(
                f"rank {rank} bad input",
                r["bad input on one rank"],
                "ValueError" if odd else "RuntimeError",
                ("`za`",) if odd else (last,),
            ),
            problem(
                f"rank {rank} bad coefficient",
                r["functional bad coefficient on one rank"],
                "ValueError" if odd else "RuntimeError",
                ("`sim_coeff`",) if odd else (last,),
            ),
        ):
            if p:
                problems.append(f"W={world_size} {p}")
        if r["after the errors"].kind != "ok":
            problems.append(f"W={world_size} rank {rank}: the loss fails after the errors: {r['after the errors']}")
    assert not problems, "\n".join(problems)
