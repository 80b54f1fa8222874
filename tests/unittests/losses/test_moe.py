"""The Mixture-of-Experts router losses: ``LoadBalancingLoss`` (both ``probs_over`` forms) and ``RouterZLoss``.

- The values against reference formulas written from the papers with brute-force loops over tokens and experts
  (Switch Transformer eq. 4-6: ``E · Σ_i f_i · P_i`` with ``f_i`` the fraction of the ``k·N`` assignments that go
  to expert ``i`` and ``P_i`` the mean router probability; ST-MoE eq. 5: the mean of ``logsumexp(logits)²``).
- The gradient contract: a router of ``L`` layers under ``DistributedDataParallel`` (float64), at W = 1, 2, 3
  with uneven and empty ranks, padding masks, one and three layers, and two micro-batches under ``no_sync()``
  inside ``accumulate()``, against one process on the concatenated tokens of each micro-batch — the references
  loop over the step's micro-batches the way one big device would (``f`` over every rank's tokens of the
  micro-batches so far, ``P`` over the step's tokens).
- One all-reduce per call whatever the number of layers (counted), none in backward; no host round trip in the
  steady state without ``validate_args`` (one, the index check, with it).
- Bad inputs raise naming the argument; a bad input or a disagreement on one rank raises on every rank.

Package modules covered: ``functional/_moe.py``, ``_global/moe.py``, ``losses/moe.py``.
"""

from __future__ import annotations

import contextlib
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
from tests._helpers.seeds import F64, generator
from torchmetrics_diff import functional as F
from torchmetrics_diff.losses import LoadBalancingLoss, RouterZLoss

pytestmark = pytest.mark.timeout(240)

D, E, TOP_K, K_MB = 3, 4, 2, 2
#: tokens of [rank][micro-batch] per world size: uneven, and a rank or micro-batch with none
TOKENS = {1: [[5, 3]], 2: [[4, 0], [6, 5]], 3: [[3, 4], [0, 0], [5, 2]]}
KINDS = ("lb_global", "lb_local", "z")


# ------------------------------------------------------------------------------------------------ references
def ref_load_balancing(probs: Tensor, index: Tensor, keep: Tensor, num_experts: int) -> Tensor:
    """Switch Transformer eq. 4-6 for one layer, by loops: ``E · Σ_i f_i · P_i``, ``f`` detached."""
    n = sum(1 for t in range(probs.shape[0]) if keep[t])
    k = index.shape[1]
    loss = torch.zeros((), dtype=F64)
    for i in range(num_experts):
        routed = sum(1 for t in range(probs.shape[0]) if keep[t] for j in range(k) if int(index[t, j]) == i)
        f_i = routed / (k * n) if n else 0.0
        p_i = sum((probs[t, i] for t in range(probs.shape[0]) if keep[t]), torch.zeros((), dtype=F64))
        loss = loss + num_experts * f_i * (p_i / n if n else p_i * 0)
    return loss


def ref_z(logits: Tensor, keep: Tensor) -> tuple[Tensor, int]:
    """ST-MoE eq. 5 by a loop: ``(Σ_t logsumexp(x_t)², n)`` over the kept tokens of one layer."""
    total_ = torch.zeros((), dtype=F64)
    n = 0
    for t in range(logits.shape[0]):
        if keep[t]:
            total_ = total_ + torch.log(torch.exp(logits[t]).sum()) ** 2
            n += 1
    return total_, n


def test_reference_formulas_by_hand() -> None:
    """The references themselves on numbers worked out by hand."""
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.5, 0.5]], dtype=F64)
    index = torch.tensor([[0], [0], [1], [1]])
    keep = torch.tensor([True, True, True, False])
    # f = (2/3, 1/3), P = (2/3, 1/3): 2 * (4/9 + 1/9)
    assert abs(float(ref_load_balancing(probs, index, keep, 2)) - 10 / 9) < 1e-12
    z, n = ref_z(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64), torch.tensor([True, True]))
    assert (
        n == 2
        and abs(
            float(z)
            - (
                torch.log(torch.tensor(2.0, dtype=F64)) ** 2 * 2 + 2 * torch.log(torch.tensor(2.0, dtype=F64)) + 1
            ).item()
        )
        < 1e-12
    )


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_functional_values_match_the_papers(layers: int, masked: bool) -> None:
    g = torch.Generator().manual_seed(3 + layers)
    logits = torch.randn(layers, 9, 5, generator=g, dtype=F64)
    probs = logits.softmax(-1)
    index = probs.topk(2, dim=-1).indices
    keep = torch.rand(9, generator=g) < 0.6 if masked else torch.ones(9, dtype=torch.bool)
    mask = keep if masked else None
    if masked:
        index = torch.where(keep.view(1, -1, 1), index, torch.full_like(index, -7))  # padding is never read
    want = sum(ref_load_balancing(probs[li], index[li], keep, 5) for li in range(layers)) / layers
    squeeze = (lambda x: x[0]) if layers == 1 else (lambda x: x)
    got = F.load_balancing_loss(squeeze(probs), squeeze(index), 5, mask)
    assert max_err(got, want) <= 1
    assert max_err(F.global_load_balancing_loss(squeeze(probs), squeeze(index), 5, mask), want) <= 1
    z = [ref_z(logits[li], keep) for li in range(layers)]
    want_z = sum(s for s, _ in z) / (layers * z[0][1])
    assert max_err(F.router_z_loss(squeeze(logits), mask), want_z) <= 1
    assert max_err(F.global_router_z_loss(squeeze(logits), mask), want_z) <= 1
    stats = F.load_balancing_stats(squeeze(probs), squeeze(index), 5, mask)
    load = F.expert_load(stats.counts, stats.tokens, 2)
    assert torch.allclose(load.sum(-1), torch.ones((), dtype=F64))


def test_balanced_router_scores_one_and_hf_is_top_k_times_ours() -> None:
    """A perfectly balanced router scores 1 for any k; HuggingFace's per-batch formula (which sums the
    per-selection fractions over the k choices) is k times this loss."""
    probs = torch.full((8, 4), 0.25, dtype=F64)
    index = torch.tensor([[t % 4, (t + 1) % 4] for t in range(8)])
    assert max_err(F.load_balancing_loss(probs, index, 4), 1.0) <= 1
    g = torch.Generator().manual_seed(0)
    probs = torch.randn(10, 4, generator=g, dtype=F64).softmax(-1)
    index = probs.topk(2, dim=-1).indices
    one_hot = torch.nn.functional.one_hot(index, 4).to(F64)  # (T, k, E): HuggingFace's expert_mask
    hf = 4 * torch.sum(one_hot.mean(dim=0) * probs.mean(dim=0).unsqueeze(0))
    assert max_err(2 * F.load_balancing_loss(probs, index, 4), hf) <= 1


def test_half_precision_is_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 16, 4, generator=g)
    probs = logits.softmax(-1)
    index = probs.topk(1, dim=-1).indices
    for dtype in (torch.bfloat16, torch.float16):
        lb = F.load_balancing_loss(probs.to(dtype), index, 4)
        z = F.router_z_loss(logits.to(dtype))
        assert lb.dtype == torch.float32 and z.dtype == torch.float32
        assert abs(float(lb) - float(F.load_balancing_loss(probs.to(dtype).float(), index, 4))) < 1e-6
        assert abs(float(z) - float(F.router_z_loss(logits.to(dtype).float()))) < 1e-6
    loss = LoadBalancingLoss(4, top_k=1)
    assert loss(probs.to(torch.bfloat16), index).dtype == torch.float32


def test_bad_inputs_name_the_argument() -> None:
    probs = torch.rand(5, 4)
    index = torch.zeros(5, 2, dtype=torch.long)
    loss = LoadBalancingLoss(num_experts=4, top_k=2)
    cases = {
        "router_probs width": (lambda: loss(torch.rand(5, 3), index), ("router_probs", "4", "(5, 3)")),
        "router_probs dtype": (lambda: loss(probs.long(), index), ("router_probs", "torch.int64")),
        "router_probs rank": (lambda: loss(torch.rand(4), index), ("router_probs", "(4,)")),
        "expert_indices float": (lambda: loss(probs, index.float()), ("expert_indices", "float32")),
        "expert_indices top_k": (lambda: loss(probs, index[:, :1]), ("expert_indices", "top_k=2", "(5, 1)")),
        "expert_indices tokens": (lambda: loss(probs, index[:4]), ("expert_indices", "(5,)", "(4, 2)")),
        "expert_indices range": (lambda: loss(probs, index + 4), ("expert_indices", "[0, 3]", "found [4")),
        "mask dtype": (lambda: loss(probs, index, mask=torch.ones(5)), ("mask", "bool", "(5,)")),
        "mask shape": (lambda: loss(probs, index, mask=torch.ones(4, dtype=torch.bool)), ("mask", "(5,)", "(4,)")),
        "num_experts": (lambda: LoadBalancingLoss(num_experts=0), ("num_experts", "0")),
        "top_k": (lambda: LoadBalancingLoss(num_experts=2, top_k=3), ("top_k", "3")),
        "probs_over": (lambda: LoadBalancingLoss(num_experts=2, probs_over="rank"), ("probs_over", "'rank'")),
        "z logits": (lambda: RouterZLoss()(torch.zeros(5, dtype=torch.long)), ("router_logits", "(T, E)")),
        "z mask": (lambda: RouterZLoss()(probs, mask=torch.ones(5)), ("mask", "bool")),
        "functional": (lambda: F.load_balancing_loss(probs, index, 5), ("router_probs", "5")),
        "local without items": (
            lambda: LoadBalancingLoss(4, 2, probs_over="local").accumulate(total=5).__enter__(),
            ("items",),
        ),
    }
    problems = [problem(name, outcome(call), "ValueError", needles) for name, (call, needles) in cases.items()]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
    assert float(loss.weight) == 0  # nothing was recorded


def test_masked_indices_are_not_read_and_compute_is_the_step_mean() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]], dtype=F64)
    loss = LoadBalancingLoss(2, top_k=1)
    a = loss(probs, torch.tensor([[0], [1], [99]]), mask=torch.tensor([True, True, False]))
    b = loss(probs[:2], torch.tensor([[0], [0]]))
    assert max_err(a, ref_load_balancing(probs, torch.tensor([[0], [1], [0]]), torch.tensor([1, 1, 0]), 2)) <= 1
    assert max_err(loss.compute(), (a + b) / 2) <= 1
    assert torch.equal(loss.expert_load, torch.tensor([1.0, 0.0], dtype=F64))
    loss.update(probs[:2], torch.tensor([[0], [1]]))  # a validation batch: recorded, no graph
    assert max_err(loss.compute(), (a + b + 1.0) / 3) <= 1  # f = P = (1/2, 1/2): 2 * 1/2
    z = RouterZLoss()
    z.update(torch.zeros(2, 4, dtype=F64))
    z.update(torch.zeros(1, 2, dtype=F64), mask=torch.tensor([True]))
    log4, log2 = torch.log(torch.tensor(4.0, dtype=F64)), torch.log(torch.tensor(2.0, dtype=F64))
    assert max_err(z.compute(), (2 * log4**2 + log2**2) / 3) <= 1  # the mean over every token seen


# ---------------------------------------------------------------------------------------------- DDP contract
class Router(nn.Module):
    """``L`` router layers over the same tokens: logits ``(L, T, E)`` (``(T, E)`` for one layer)."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.gates = nn.ModuleList(nn.Linear(D, E).to(F64) for _ in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.stack([gate(x) for gate in self.gates])
        return out[0] if len(self.gates) == 1 else out


def _batch(world: int, rank: int, m: int, masked: bool) -> tuple[Tensor, Tensor]:
    n = TOKENS[world][rank][m]
    g = generator("moe", world, rank, m)
    x = torch.randn(n, D, generator=g, dtype=F64)
    keep = torch.rand(n, generator=g) < 0.7 if masked else torch.ones(n, dtype=torch.bool)
    return x, keep


def _cases(world: int) -> list[tuple[str, int, bool, bool, str]]:
    """(kind, layers, masked, accumulate, grad_reduction): one layer plain, padded, padded and accumulated; three
    layers plain, and padded and accumulated; and that last one with a trainer that sums gradients."""
    combos = [(1, False, False), (1, True, False), (1, True, True), (3, False, False), (3, True, True)]
    cases = [(kind, *combo, "mean") for kind in KINDS for combo in combos]
    return cases + [(kind, 3, True, True, "sum") for kind in KINDS]


def _criterion(kind: str, grad_reduction: str) -> Any:
    if kind == "z":
        return RouterZLoss(grad_reduction=grad_reduction)
    probs_over = "global" if kind == "lb_global" else "local"
    return LoadBalancingLoss(E, TOP_K, probs_over=probs_over, grad_reduction=grad_reduction)


def _call(criterion: Any, kind: str, logits: Tensor, keep: Tensor, masked: bool) -> Tensor:
    mask = keep if masked else None
    if kind == "z":
        return criterion(logits, mask)
    probs = logits.softmax(-1)
    index = probs.detach().topk(TOP_K, dim=-1).indices
    if masked:  # padding holds indices out of range: they must never be read
        index = torch.where(keep.unsqueeze(-1), index, torch.full_like(index, -1))
    return criterion(probs, index, mask)


def _ddp_body(rank: int, world: int) -> list[dict[str, Any]]:
    out = []
    nets = {layers: DistributedDataParallel(Router(layers)) for layers in (1, 3)}  # one each: DDP costs to build
    for kind, layers, masked, acc, grad_reduction in _cases(world):
        model = nets[layers].module
        net = nets[layers] if grad_reduction == "mean" else model  # "sum": no DDP, the gradients summed below
        model.zero_grad(set_to_none=True)
        criterion = _criterion(kind, grad_reduction)
        micro = range(K_MB) if acc else range(1)
        batches = [_batch(world, rank, m, masked) for m in micro]
        block = criterion.accumulate([keep for _, keep in batches]) if acc else contextlib.nullcontext()
        values = []
        with block:
            for m, (x, keep) in enumerate(batches):
                last = m == len(batches) - 1
                sync = (
                    net.no_sync() if isinstance(net, DistributedDataParallel) and not last else contextlib.nullcontext()
                )
                with sync:
                    value = _call(criterion, kind, net(x), keep, masked)
                    value.backward()
                values.append(float(value.detach()))
        load = None if kind == "z" else criterion.expert_load.clone()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        if grad_reduction == "sum" and world > 1:
            for grad in grads:
                dist.all_reduce(grad)
        out.append({"values": values, "grads": grads, "load": load, "compute": float(criterion.compute())})
    return out


def _reference(world: int, kind: str, layers: int, masked: bool, acc: bool) -> tuple[list[float], list, Tensor]:
    """One process, the tokens of every rank concatenated per micro-batch: the shares, gradients and last f."""
    model = Router(layers)
    micro = list(range(K_MB if acc else 1))
    data = {(r, m): _batch(world, r, m, masked) for r in range(world) for m in micro}
    step_tokens = sum(int(keep.sum()) for _, keep in data.values())
    routed = torch.zeros(layers, E, dtype=F64)  # the step's assignments so far, counted by a loop
    seen = 0
    shares, total_loss = [], torch.zeros((), dtype=F64)
    for m in micro:
        xs = [data[r, m][0] for r in range(world)]
        keeps = [data[r, m][1] for r in range(world)]
        logits = [model(x).reshape(layers, x.shape[0], E) for x in xs]
        share = torch.zeros((), dtype=F64)
        if kind == "z":
            for lg, keep in zip(logits, keeps):
                for li in range(layers):
                    share = share + ref_z(lg[li], keep)[0] / layers
            share = share / max(step_tokens, 1)
        else:
            probs = [lg.softmax(-1) for lg in logits]
            index = [p.detach().topk(TOP_K, dim=-1).indices for p in probs]
            for r in range(world):
                for li in range(layers):
                    for t in range(xs[r].shape[0]):
                        if keeps[r][t]:
                            for j in range(TOP_K):
                                routed[li, int(index[r][li, t, j])] += 1
            seen += sum(int(k.sum()) for k in keeps)
            f = routed / (TOP_K * seen) if seen else routed * 0
            for li in range(layers):
                if kind == "lb_global":  # P over every rank's tokens of the step
                    p_sum = sum(
                        (probs[r][li, t] for r in range(world) for t in range(xs[r].shape[0]) if keeps[r][t]),
                        torch.zeros(E, dtype=F64),
                    )
                    share = share + E * (f[li] * p_sum).sum() / max(step_tokens, 1) / layers
                else:  # each rank's own P, the mean over ranks and micro-batches of the ranks' losses
                    for r in range(world):
                        n_r = int(keeps[r].sum())
                        p_sum = sum(
                            (probs[r][li, t] for t in range(xs[r].shape[0]) if keeps[r][t]), torch.zeros(E, dtype=F64)
                        )
                        p_r = p_sum / n_r if n_r else p_sum * 0
                        share = share + E * (f[li] * p_r).sum() / (world * len(micro) * layers)
        shares.append(float(share.detach()))
        total_loss = total_loss + share
    grads = list(torch.autograd.grad(total_loss, list(model.parameters())))
    last_f = routed / (TOP_K * max(seen, 1))
    return shares, grads, last_f[0] if layers == 1 else last_f


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_gradient_equals_one_process_on_the_concatenated_tokens(world_size: int) -> None:
    results = run_distributed(_ddp_body, world_size, timeout=200)
    failures = []
    for i, (kind, layers, masked, acc, reduction) in enumerate(_cases(world_size)):
        case = (
            f"[{kind} L={layers} masked={masked} accumulate={acc} grad_reduction={reduction} W={world_size} "
            f"tokens={TOKENS[world_size]}]"
        )
        shares, grads, load = _reference(world_size, kind, layers, masked, acc)
        for rank, res in enumerate(results):
            got = res[i]
            if max(max_err(v, s) for v, s in zip(got["values"], shares)) > 1:
                failures.append(f"{case} rank {rank}: values {got['values']} != reference {shares}")
            worst = max(max_err(a, b) for a, b in zip(got["grads"], grads))
            if worst > 1:
                failures.append(f"{case} rank {rank}: gradients differ (max_err {worst:.3g})")
            if got["load"] is not None and max_err(got["load"], load) > 1:
                failures.append(f"{case} rank {rank}: expert_load {got['load']} != {load}")
            if max_err(got["compute"], sum(shares)) > 1:
                failures.append(f"{case} rank {rank}: compute() {got['compute']} != step loss {sum(shares)}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------------- costs and failing together
def _costs_body(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(rank)
    for layers in (1, 3, 8):
        for name, criterion in (
            ("lb", LoadBalancingLoss(E, TOP_K, validate_args=False)),
            ("lb local", LoadBalancingLoss(E, TOP_K, probs_over="local", validate_args=False)),
            ("z", RouterZLoss()),
        ):
            logits = torch.randn(layers, 3 + rank, E, generator=g, dtype=F64).requires_grad_()

            def step(name: str = name, criterion: Any = criterion, logits: Tensor = logits) -> Tensor:
                args = (logits,) if name == "z" else (logits.softmax(-1), logits.detach().topk(TOP_K, -1).indices)
                return criterion(*args)

            for _ in range(2):  # warm-up
                step().backward()
            with record_collectives() as fwd:
                value = step()
            with record_collectives() as bwd:
                value.backward()
            with counting() as trips:
                for _ in range(2):
                    step().backward()
            out[f"{name} L={layers}"] = (list(fwd), list(bwd), total(trips))
    checked = LoadBalancingLoss(E, TOP_K)
    probs = torch.rand(5, E).softmax(-1)
    index = probs.topk(TOP_K, dim=-1).indices
    checked(probs, index)
    with counting() as trips:
        checked(probs, index)
    out["validate_args"] = dict(trips)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_collective_per_call_for_any_number_of_layers_and_no_round_trip(world_size: int) -> None:
    results = run_distributed(_costs_body, world_size, timeout=120)
    failures = []
    for rank, res in enumerate(results):
        assert res.pop("validate_args") == {"__bool__": 1}, "the index check reads one flag back"
        for case, (fwd, bwd, trips) in res.items():
            # ONE collective: the call header's exchange, carrying every layer's statistics (small CPU tensors ride
            # in its inline area and every rank sums them: no separate all-reduce)
            if fwd != ["_all_gather_flat"]:
                failures.append(f"rank {rank} {case}: forward issued {fwd}")
            if bwd:
                failures.append(f"rank {rank} {case}: backward issued {bwd}")
            if trips:
                failures.append(f"rank {rank} {case}: {trips} host round trips in 2 steady steps")
    assert not failures, "\n".join(failures)


def _failures_body(rank: int, world: int) -> dict[str, Any]:
    last = rank == world - 1
    probs = torch.rand(4, E, dtype=F64).softmax(-1)
    index = probs.topk(TOP_K, dim=-1).indices
    res: dict[str, Any] = {}
    lb = LoadBalancingLoss(E, TOP_K)
    res["bad index"] = outcome(lambda: lb(probs, index + (E if last else 0)))
    res["layers"] = outcome(lambda: lb(probs.expand(2 if last else 1, 4, E), index.expand(2 if last else 1, 4, 2)))
    res["dtype"] = outcome(lambda: lb(probs.float() if last else probs, index))
    z = RouterZLoss()
    res["z mask"] = outcome(lambda: z(probs, mask=torch.ones(4 if not last else 3, dtype=torch.bool)))
    res["after"] = outcome(lambda: float(lb(probs, index)))  # the loss still works after the failures
    return res


def test_a_bad_input_or_a_disagreement_on_one_rank_raises_on_every_rank() -> None:
    world = 3
    results = run_distributed(_failures_body, world, timeout=60)
    failures = []
    for rank, res in enumerate(results):
        last = rank == world - 1
        for name, needles, local in (
            ("bad index", ("expert_indices",), "ValueError"),
            ("z mask", ("mask",), "ValueError"),
        ):
            want = (local, needles) if last else ("RuntimeError", ("rank 2",))
            failures.append(problem(f"rank {rank} {name}", res[name], want[0], want[1], within=20))
        for name, needles in (("layers", ("layers", "shape", "(1, 9)", "(2, 9)")), ("dtype", ("dtype", "float32"))):
            failures.append(problem(f"rank {rank} {name}", res[name], "RuntimeError", needles, within=20))
        if res["after"].kind != "ok":
            failures.append(f"rank {rank}: the loss fails after the errors: {res['after']}")
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)
