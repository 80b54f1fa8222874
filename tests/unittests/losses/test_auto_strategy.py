"""``strategy="auto"``, the default of the contrastive losses: what it picks, that every rank picks alike, and that
its gradients are those of one process.

- Gradient equivalence on 3 gloo ranks, float64, uneven batches with a rank of 0 rows, for ``CLIPLoss`` and
  ``InfoNCELoss``: one loss object runs a sequence of steps that walks through every regime of the rule (a small
  batch: replicated; a large, wide one: sharded; a tiny memory budget: ring), and each step's value and gradients
  equal those of an independent single-process formula (torch's ``cross_entropy`` on the whole batch).
- The pick follows the documented rule (docs/guide/strategies.rst) from the global batch, one call late after the
  first: it is written here by hand per step, not computed by the package's rule.
- Every rank picks the same strategy when the local batches straddle the crossover (a rank with 0 rows beside one
  with most of them), for the loss classes and for the ``global_*`` functions.
- Ranks that pick differently (here forced: a constant changed on one rank, which the docs forbid) raise the error
  of ranks in different calls on every rank, naming the strategies: the pick is part of the call's name.
- A bad ``strategy`` is refused with a message that lists ``"auto"``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests._helpers.harness import run_distributed
from tests._helpers.outcomes import outcome
from tests._helpers.seeds import bounds, rand

pytestmark = pytest.mark.timeout(300)

F64 = torch.float64
WIDTH = 1024  # wide enough that 500 rows on 3 ranks are past the crossover
TEMPERATURE = 0.5
SMALL = (3, 0, 5)
LARGE = (200, 0, 300)
#: the steps of one loss object: (rows per rank, memory budget in bytes or None for the default)
STEPS = [(SMALL, None), (SMALL, None), (LARGE, None), (LARGE, None), (LARGE, 100), (SMALL, None)]
#: what "auto" picks at each step, by the documented rule, worked by hand:
#: step 0 is the first call: the ranks exchange their rows, so it decides from its own batch (8 rows: replicated);
#: later steps decide from the previous step's batch: step 2 from a small batch (replicated), step 3 from
#: N = 500, B_max = 300, D = 1024: (500 - 300) · 500 · (1024 + 64) = 109e6 >= 40e6 · (W - 1) = 80e6 (sharded; InfoNCE:
#: 2 views, 1000 candidates, even more; the ring is not faster: 1024 + 180000 / 300 > 140); step 4's budget of 100
#: bytes holds no logits: ring; step 5 decides from step 4's large batch with the default budget: sharded.
EXPECTED = ["replicated", "replicated", "replicated", "sharded", "ring", "sharded"]


def _clip_reference(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    logits = scale * img @ txt.T
    target = torch.arange(img.shape[0])
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def _info_nce_reference(z1: torch.Tensor, z2: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = (z @ z.T / TEMPERATURE).masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    return F.cross_entropy(logits, torch.arange(2 * n).roll(n))


def _step_errors(kind: str, loss: Any, rank: int, world: int, sizes: tuple[int, ...], step: int) -> dict[str, float]:
    """One step of ``loss`` on this rank's rows against the reference on every rank's: the largest errors."""
    n = sum(sizes)
    lo, hi = bounds(sizes, rank)
    a_all = F.normalize(rand((n, WIDTH), kind, step, "a"), dim=1)
    b_all = F.normalize(rand((n, WIDTH), kind, step, "b"), dim=1)
    scale = torch.tensor(7.0, dtype=F64, requires_grad=True)
    a, b = a_all[lo:hi].clone().requires_grad_(), b_all[lo:hi].clone().requires_grad_()
    value = loss(a, b, scale) if kind == "clip" else loss(a, b)
    value.backward()

    ref_a, ref_b = a_all.clone().requires_grad_(), b_all.clone().requires_grad_()
    ref_scale = torch.tensor(7.0, dtype=F64, requires_grad=True)
    ref = (_clip_reference if kind == "clip" else _info_nce_reference)(ref_a, ref_b, ref_scale)
    ref.backward()
    # grad_reduction="mean": a rank's inputs get W times their share, so that the trainer's averaging of the
    # parameters' gradients gives the whole; the scale (a parameter here) is averaged by hand
    errors = {
        "value": abs(value.item() - ref.item()),
        "grad a": (a.grad - world * ref_a.grad[lo:hi]).abs().max().item() if hi > lo else 0.0,
        "grad b": (b.grad - world * ref_b.grad[lo:hi]).abs().max().item() if hi > lo else 0.0,
    }
    if kind == "clip":
        grad = scale.grad.clone()
        torch.distributed.all_reduce(grad)
        errors["grad scale"] = abs(grad.item() / world - ref_scale.grad.item())
    return errors


def _regimes_body(rank: int, world: int, kind: str) -> list[dict[str, Any]]:
    from torchmetrics_diff._global import strategy
    from torchmetrics_diff.losses import CLIPLoss, InfoNCELoss

    loss = CLIPLoss() if kind == "clip" else InfoNCELoss(temperature=TEMPERATURE)
    default_budget = strategy.AUTO_MEMORY_BYTES
    out = []
    try:
        for step, (sizes, budget) in enumerate(STEPS):
            strategy.AUTO_MEMORY_BYTES = default_budget if budget is None else budget
            errors = _step_errors(kind, loss, rank, world, sizes, step)
            out.append({"picked": loss.last_strategy, "errors": errors})
    finally:
        strategy.AUTO_MEMORY_BYTES = default_budget
    return out


@pytest.mark.parametrize("kind", ["clip", "infonce"])
def test_auto_walks_the_regimes_with_exact_gradients(kind: str) -> None:
    results = run_distributed(_regimes_body, 3, kind, timeout=240)
    problems = []
    for rank, steps in enumerate(results):
        picked = [s["picked"] for s in steps]
        if picked != EXPECTED:
            problems.append(f"rank {rank}: picked {picked}, expected {EXPECTED}")
        for step, s in enumerate(steps):
            worst = max(s["errors"].values())
            if not worst <= 1e-10:
                problems.append(f"rank {rank} step {step} ({s['picked']}): errors {s['errors']}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------ every rank picks alike
#: local batches straddling the crossover (W = 3, width 1024): judged by its own rows, rank 2 (380 of 400 rows)
#: would shard and rank 0 (0 rows) would not; the global batch decides. (20 rows off the largest rank:
#: (400 - 380) · 400 · 1088 = 9e6 < 80e6: replicated.) Then an even split of 400 rows, where the rank with 0 rows
#: would still say replicated: (400 - 200) · 400 · 1088 = 87e6: sharded.
STRADDLE = [((20, 0, 380), "replicated"), ((0, 200, 200), "sharded")]


def _straddle_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff.functional import global_clip_loss
    from torchmetrics_diff.losses import CLIPLoss

    out: dict[str, Any] = {"class": [], "function": [], "values": []}
    for step, (sizes, _) in enumerate(STRADDLE):
        lo, hi = bounds(sizes, rank)
        img = F.normalize(rand((sum(sizes), WIDTH), "straddle", step, "img"), dim=1)
        txt = F.normalize(rand((sum(sizes), WIDTH), "straddle", step, "txt"), dim=1)
        loss = CLIPLoss()  # a new object: its first call decides from this batch
        value = loss(img[lo:hi], txt[lo:hi], 5.0)
        out["class"].append(loss.last_strategy)
        out["values"].append((value.item(), _clip_reference(img, txt, torch.tensor(5.0, dtype=F64)).item()))
        # the function keeps its memory per process group: its first call here decides from this batch, the
        # second from the first's; the same batch twice, so both decide from it
        for _ in range(2):
            global_clip_loss(img[lo:hi], txt[lo:hi], 5.0)
        out["function"].append(_function_pick())
        _forget_function_memory()
    return out


def _function_pick() -> str | None:
    from torchmetrics_diff._global.strategy import AutoChoice
    from torchmetrics_diff.distributed._call import group_state

    memory = group_state(None).auto.get("global_clip_loss")
    return memory.last if isinstance(memory, AutoChoice) else None


def _forget_function_memory() -> None:
    from torchmetrics_diff.distributed._call import group_state

    group_state(None).auto.pop("global_clip_loss", None)


def test_every_rank_picks_from_the_global_batch() -> None:
    results = run_distributed(_straddle_body, 3, timeout=180)
    expected = [pick for _, pick in STRADDLE]
    problems = []
    for rank, res in enumerate(results):
        if res["class"] != expected or res["function"] != expected:
            problems.append(f"rank {rank}: class {res['class']}, function {res['function']}, expected {expected}")
        for got, ref in res["values"]:
            if abs(got - ref) > 1e-10:
                problems.append(f"rank {rank}: value {got} against {ref}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------ divergent picks raise, named
def _diverge_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff._global import strategy
    from torchmetrics_diff.distributed import all_reduce
    from torchmetrics_diff.losses import CLIPLoss

    default = strategy.AUTO_SHARDED_MIN_WORK
    img = F.normalize(rand((4, 8), "diverge", rank), dim=1)
    try:
        if rank == 0:  # (the docs: the constants must be the same on every rank; here they are not)
            strategy.AUTO_SHARDED_MIN_WORK = 0
        out = {"call": outcome(lambda: CLIPLoss()(img, img, 5.0))}
    finally:
        strategy.AUTO_SHARDED_MIN_WORK = default
    out["after"] = outcome(lambda: all_reduce(torch.ones(1), "sum", grad="none"))
    return out


def test_ranks_that_pick_differently_raise_naming_the_strategies() -> None:
    results = run_distributed(_diverge_body, 2, timeout=120)
    problems = []
    for rank, res in enumerate(results):
        message = res["call"].message or ""
        needles = ("ranks are in different calls", "CLIPLoss.forward: sharded", "CLIPLoss.forward: replicated")
        if res["call"].kind == "ok" or not all(n in message for n in needles):
            problems.append(f"rank {rank}: {res['call']}")
        if res["after"].kind != "ok" or res["after"].value.item() != 2:
            problems.append(f"rank {rank}: the ranks are out of step after the error: {res['after']}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------ checks "off": no header to carry the rows
def _checks_off_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff.distributed import get_checks, set_checks
    from torchmetrics_diff.losses import CLIPLoss

    sizes = (3, 5)
    lo, hi = bounds(sizes, rank)
    img = F.normalize(rand((8, 6), "off", "img"), dim=1)
    txt = F.normalize(rand((8, 6), "off", "txt"), dim=1)
    before = get_checks()
    set_checks("off")
    try:
        first, second = CLIPLoss(), CLIPLoss()
        picks, values = [], []
        for loss in (first, first, second):
            values.append(loss(img[lo:hi], txt[lo:hi], 4.0).item())
            picks.append(loss.last_strategy)
    finally:
        set_checks(before)
    return {"picks": picks, "values": values, "ref": _clip_reference(img, txt, torch.tensor(4.0, dtype=F64)).item()}


def test_with_checks_off_the_first_call_is_sharded_then_the_rule() -> None:
    """With the checks "off" no header carries the rows: each loss's first call runs "sharded" (a fixed rule, the
    same on every rank), the next ones decide from the batch the previous gather showed (8 rows: replicated)."""
    problems = []
    for rank, res in enumerate(run_distributed(_checks_off_body, 2, timeout=120)):
        if res["picks"] != ["sharded", "replicated", "sharded"]:
            problems.append(f"rank {rank}: picks {res['picks']}")
        if any(abs(v - res["ref"]) > 1e-10 for v in res["values"]):
            problems.append(f"rank {rank}: values {res['values']} against {res['ref']}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------ one process, and bad values
def test_one_process_picks_replicated_or_ring_and_the_value_is_the_loss() -> None:
    from torchmetrics_diff._global import strategy
    from torchmetrics_diff.losses import CLIPLoss

    img = F.normalize(rand((6, 4), "single", "img"), dim=1)
    txt = F.normalize(rand((6, 4), "single", "txt"), dim=1)
    expected = _clip_reference(img, txt, torch.tensor(3.0, dtype=F64))
    loss = CLIPLoss()
    assert loss.last_strategy is None  # no call yet
    assert torch.allclose(loss(img, txt, 3.0), expected, rtol=0, atol=1e-12)
    assert loss.last_strategy == "replicated"
    default = strategy.AUTO_MEMORY_BYTES
    try:
        strategy.AUTO_MEMORY_BYTES = 100  # 6 x 6 logits of 16 bytes do not fit: the ring's tiles
        assert torch.allclose(loss(img, txt, 3.0), expected, rtol=0, atol=1e-12)
        assert loss.last_strategy == "ring"
    finally:
        strategy.AUTO_MEMORY_BYTES = default
    assert CLIPLoss(strategy="sharded").last_strategy == "sharded"  # a fixed strategy is what it says


def test_bad_strategy_names_auto_among_the_choices() -> None:
    from torchmetrics_diff.functional import global_clip_loss, global_rows_loss
    from torchmetrics_diff.losses import CLIPLoss, InfoNCELoss

    needles = ("`strategy`", "'auto'", "'replicated'", "'sharded'", "'ring'", "'fast'")
    calls = [
        lambda: CLIPLoss(strategy="fast"),
        lambda: InfoNCELoss(strategy="fast"),
        lambda: global_clip_loss(torch.eye(2), torch.eye(2), 1.0, strategy="fast"),
        lambda: global_rows_loss([torch.eye(2)], lambda *a: (torch.zeros(()), torch.ones(())), strategy="fast"),
    ]
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        assert all(n in str(err.value) for n in needles), str(err.value)


def test_the_rule_by_hand() -> None:
    """The documented rule at points worked by hand (docs/guide/strategies.rst)."""
    from torchmetrics_diff._global.strategy import auto_strategy

    # W = 2, 256 + 256 rows, width 128: (512 - 256) · 512 · (128 + 64) = 25.2e6 < 40e6: replicated; width 256: 41.9e6
    assert auto_strategy(512, 256, 128, 2) == "replicated"
    assert auto_strategy(512, 256, 256, 2) == "sharded"
    # W = 3, 3 x 128 rows, width 512: 256 · 384 · 576 = 56.6e6 < 80e6: replicated; 3 x 192 rows: 127e6: sharded
    assert auto_strategy(384, 128, 512, 3) == "replicated"
    assert auto_strategy(576, 192, 512, 3) == "sharded"
    # memory: 16384 x 16384 float32 logits and gradient = 2 GiB > 1 GiB replicated; sharded at W = 2: 1 GiB fits
    # (for a loss of unknown family; CLIP's ring is faster there: below)
    assert auto_strategy(16384, 8192, 64, 2) == "sharded"
    # float64 doubles it: the sharded block no longer fits
    assert auto_strategy(16384, 8192, 64, 2, itemsize=8) == "ring"
    # one rank: replicated (the plain loss), ring when the N x N logits would not fit
    assert auto_strategy(100, 100, 64, 1) == "replicated"
    assert auto_strategy(16384, 16384, 64, 1) == "ring"
    # beyond three ranks each further rank costs one hop, 5e5: W = 4, 4 x 128 rows: 384 · 512 · (D + 64) against
    # 40e6 · 2 + 5e5 = 80.5e6: width 345: 80.41e6, replicated; width 346: 80.61e6, sharded
    assert auto_strategy(512, 128, 345, 4) == "replicated"
    assert auto_strategy(512, 128, 346, 4) == "sharded"
    # W = 1024, 4 rows of width 8 per rank: 4092 · 4096 · 72 = 1.21e9 >= 40e6 · 2 + 5e5 · 1021 = 5.9e8: sharded
    # (by the fitted per-peer cost alone, 40e6 · 1023 = 4.1e10, it was replicated: N x N logits on every rank)
    assert auto_strategy(4096, 4, 8, 1024) == "sharded"
    # W = 256, 4 rows of width 8: 1020 · 1024 · 72 = 7.5e7 < 8e7 + 5e5 · 253 = 2.07e8: replicated
    assert auto_strategy(1024, 4, 8, 256) == "replicated"


def test_the_ring_is_picked_for_its_speed_by_family_and_width() -> None:
    """The ring instead of the one logit block where D + 180000 / B_max <= 140 for CLIP and SigLIP; never for its
    speed for SupCon and InfoNCE, nor for a loss of unknown family (the default): only for memory."""
    from torchmetrics_diff._global.strategy import auto_strategy

    # 4096 rows per rank at W = 2: width 64: 64 + 44 = 108 <= 140, the ring; width 128: 172, sharded
    for family in ("clip", "siglip"):
        assert auto_strategy(8192, 4096, 64, 2, family=family) == "ring"
        assert auto_strategy(8192, 4096, 128, 2, family=family) == "sharded"
    # 2048 rows: width 32: 120, the ring; width 64: 152, sharded; 1024 rows: 64 + 176 = 240, sharded
    assert auto_strategy(4096, 2048, 32, 2, family="clip") == "ring"
    assert auto_strategy(4096, 2048, 64, 2, family="clip") == "sharded"
    assert auto_strategy(2048, 1024, 64, 2, family="clip") == "sharded"
    # SupCon and InfoNCE (whose kernels SupCon's are), and no family: sharded
    assert auto_strategy(8192, 4096, 64, 2, family="supcon") == "sharded"
    assert auto_strategy(8192, 4096, 64, 2, views=2, family="supcon") == "sharded"
    assert auto_strategy(8192, 4096, 64, 2, views=2, family="info_nce") == "sharded"
    assert auto_strategy(8192, 4096, 64, 2) == "sharded"
    # only where the one block would run: small batches stay replicated whatever the family
    assert auto_strategy(512, 256, 64, 2, family="clip") == "replicated"
    # the anchors of the largest rank count: 4096 rows on one rank of an uneven split, width 64: the ring
    assert auto_strategy(6144, 4096, 64, 3, family="siglip") == "ring"
    # one rank: the ring against the plain loss, by the same rule (B_max = N)
    assert auto_strategy(4096, 4096, 64, 1, family="clip") == "ring"
    assert auto_strategy(2048, 2048, 64, 1, family="clip") == "replicated"
    assert auto_strategy(4096, 4096, 128, 1, family="clip") == "replicated"
    # memory still decides first where the block would not fit: SupCon at float64, 16384 x 8192
    assert auto_strategy(16384, 8192, 64, 2, itemsize=8, family="supcon") == "ring"


def test_auto_picks_on_the_measured_grid() -> None:
    """The picks at representative cells of the grid measured by ``benchmarks/bench_auto.py`` (W = 2 gloo ranks,
    float32, docs/guide/strategies.rst): each pick was the fastest fixed strategy there, or within 1.15x of it."""
    from torchmetrics_diff._global.strategy import auto_strategy

    # (rows per rank, width) -> the pick per family (clip, siglip, supcon), as measured fastest (bench_auto.py)
    grid = {
        (64, 64): ("replicated", "replicated", "replicated"),
        (64, 512): ("replicated", "replicated", "replicated"),
        (256, 64): ("replicated", "replicated", "replicated"),  # SigLIP: 5-25 % faster than sharded
        (256, 128): ("replicated", "replicated", "replicated"),
        (256, 512): ("sharded", "sharded", "sharded"),
        (1024, 64): ("sharded", "sharded", "sharded"),
        (1024, 512): ("sharded", "sharded", "sharded"),
        (4096, 64): ("ring", "ring", "sharded"),  # CLIP, SigLIP: the ring 0.8-0.9x sharded; SupCon's 1.3-1.5x
        (4096, 128): ("sharded", "sharded", "sharded"),
        (4096, 512): ("sharded", "sharded", "sharded"),
    }
    for (rows, width), picks in grid.items():
        for family, expected in zip(("clip", "siglip", "supcon"), picks):
            got = auto_strategy(2 * rows, rows, width, 2, family=family)
            assert got == expected, (rows, width, family, got, expected)


# ------------------------------------------------------------- what auto adds to a call: one exchange, once
def _counts_body(rank: int, world: int) -> dict[str, Any]:
    from tests._helpers.collectives import record_collectives
    from torchmetrics_diff.losses import CLIPLoss

    img, txt = (F.normalize(rand((4 + rank, 8), f"counts {side}", rank), dim=1) for side in ("img", "txt"))
    out: dict[str, Any] = {}
    auto = CLIPLoss()
    for strategy, loss in (("auto", auto), ("replicated", CLIPLoss(strategy="replicated"))):
        logs = []
        for _ in range(3):
            with record_collectives() as log:
                loss(img, txt, 5.0)
            logs.append(list(log))
        out[strategy] = logs
    out["pick"] = auto.last_strategy
    return out


def test_auto_adds_one_header_exchange_at_the_first_call_and_nothing_after() -> None:
    """docs/guide/strategies.rst: the first call exchanges every rank's rows, width and element size in one header
    exchange; in the steady state auto adds nothing to a call (the same collectives as the strategy it picked)."""
    for rank, res in enumerate(run_distributed(_counts_body, 2, timeout=120)):
        assert res["pick"] == "replicated", res["pick"]  # (a small batch: the rule's pick, fixed here for the count)
        first, *steady = res["auto"]
        fixed_first, *fixed_steady = res["replicated"]
        assert len(first) == len(fixed_first) + 1, (rank, first, fixed_first)
        assert steady == fixed_steady, (rank, steady, fixed_steady)
