"""Mixed precision: every loss and every differentiable metric under ``torch.autocast`` (bfloat16 and float16, CPU).

Through the harness, at W = 1 and W = 2 with uneven rows (``grad_reduction="sum"``, so a rank's input gradient is
the global loss's gradient for its rows):

- the losses CLIP, SigLIP, InfoNCE, SupCon (one and two views), each with the strategies ``"replicated"``,
  ``"sharded"`` and ``"ring"``, Barlow Twins, the weighted mean and the token cross-entropy: value and input
  gradients within the bounds that ``docs/guide/mixed_precision.rst`` documents (:data:`LOSS_BOUNDS`) of a float64
  reference written from the formulas (``tests._helpers.references``) on the same input values; the value is
  float32 and each gradient has its input's dtype;
- the differentiable metrics (``SumMetric``, ``MeanMetric``, ``MaxMetric``, ``MinMetric``, ``CatMetric``,
  ``MeanSquaredError``, ``MeanAbsoluteError``, ``R2Score``, ``PearsonCorrCoef``, ``CosineSimilarity``,
  ``Perplexity``) with ``dist_sync_on_step=True``: value within float32 rounding of a float64 formula (nothing is
  summed in half precision), the value float32, gradients in the input's dtype, and every state float32 after
  ``forward`` and ``update`` with half-precision inputs.

Each case runs with two forms of input: float32 tensors under autocast (the kernels cast them as ``torch.mm``
would) and half-precision tensors (what a model under autocast hands the loss).

In this process: ``MeanMetric`` and ``SumMetric`` fed 10⁵ bfloat16 values agree with the float64 sum to float32
rounding; float64 inputs under autocast give bit for bit the values and gradients they give without it; the
matrix products of the contrastive kernels take operands in the autocast dtype in forward and backward; a state
that an update leaves in half precision is widened to its default's dtype.

Package modules covered: ``functional`` (``_checks``, ``_kernels``, ``_contrastive``, ``_normalized``,
``_barlow_twins``, ``_regression``, ``_text``), ``_global`` (``ring_losses``, ``contrastive``), ``losses``,
``aggregation``, ``metric``, ``_tensors``, ``regression``, ``text``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tests._helpers.harness import run_distributed
from tests._helpers.loss_cases import LAMBDA_OFFDIAG, TEMPERATURE, make_criterion
from tests._helpers.references import (
    IGNORE,
    ref_barlow,
    ref_clip,
    ref_info_nce,
    ref_siglip,
    ref_supcon,
    ref_token_ce,
    ref_weighted_mean,
)
from tests._helpers.seeds import bounds, generator
from torchmetrics_diff import (
    CatMetric,
    CosineSimilarity,
    MaxMetric,
    MeanAbsoluteError,
    MeanMetric,
    MeanSquaredError,
    Metric,
    MinMetric,
    PearsonCorrCoef,
    Perplexity,
    R2Score,
    SumMetric,
)
from torchmetrics_diff import functional as TF

pytestmark = pytest.mark.timeout(300)

F64 = torch.float64
HALF = (torch.bfloat16, torch.float16)
SIZES = {1: (11,), 2: (4, 7)}  # rows per rank: uneven at W = 2
D, SEQ, CLASSES = 8, 3, 6
SCALE, BIAS = 5.0, -2.0
STRATEGIES = ("replicated", "sharded", "ring")
LOSS_KINDS = [(k, s) for k in ("clip", "siglip", "infonce", "supcon", "supcon_mv") for s in STRATEGIES]
LOSS_KINDS += [("barlow", None), ("mean", None), ("tokence", None)]

#: ``dtype -> (value, gradient)`` bounds on the relative errors against float64 of the losses (the value's
#: ``|v - v64| / |v64|`` and the gradients' ``‖g - g64‖ / ‖g64‖``), as documented in the mixed-precision guide
LOSS_BOUNDS = {torch.bfloat16: (3e-3, 1.5e-2), torch.float16: (6e-4, 2e-3)}
#: the same for the metrics: their statistics are float32 sums, their gradients rounded once to the input dtype
METRIC_BOUNDS = {torch.bfloat16: (1e-5, 4e-3), torch.float16: (1e-5, 1e-3)}


# --------------------------------------------------------------------------------------------------- data
def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _loss_data(kind: str, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(float inputs, other inputs)`` of a global batch of ``n`` rows, float64; every tensor is sliced by rows."""
    g = generator("mixed-precision", kind, n)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=F64)

    if kind in ("clip", "siglip", "infonce", "barlow"):
        a = randn(n, D)
        b = a + 0.5 * randn(n, D)
        return ([_unit(a), _unit(b)] if kind in ("clip", "siglip") else [a, b]), []
    if kind in ("supcon", "supcon_mv"):
        x = randn(n, D) if kind == "supcon" else randn(n, 2, D)
        return [x], [torch.randint(0, 3, (n,), generator=g)]
    if kind == "mean":
        values = randn(n, 4).abs() + 0.5
        weight = 0.5 + torch.rand(n, 1, generator=g, dtype=F64)
        return [values], [weight, torch.rand(n, 4, generator=g) < 0.7]
    if kind == "tokence":
        target = torch.randint(0, CLASSES, (n, SEQ), generator=g)
        target = torch.where(torch.rand(n, SEQ, generator=g) < 0.3, torch.full_like(target, IGNORE), target)
        return [2 * randn(n, SEQ, CLASSES)], [target]
    raise ValueError(kind)


def _loss_args(kind: str, floats: list[torch.Tensor], others: list[torch.Tensor]) -> tuple[tuple, dict]:
    if kind == "clip":
        return (*floats, torch.tensor(SCALE)), {}
    if kind == "siglip":
        return (*floats, torch.tensor(SCALE), torch.tensor(BIAS)), {}
    if kind == "mean":
        return (floats[0],), {"weight": others[0].to(floats[0].dtype), "mask": others[1]}
    return (*floats, *others), {}


def _loss_reference(kind: str, floats: list[torch.Tensor], others: list[torch.Tensor]) -> torch.Tensor:
    if kind == "clip":
        return ref_clip(*floats, SCALE)
    if kind == "siglip":
        return ref_siglip(*floats, SCALE, BIAS)
    if kind == "infonce":
        return ref_info_nce(*floats, TEMPERATURE)
    if kind in ("supcon", "supcon_mv"):
        # the reference orders anchors view-major; the loss does not depend on the order
        return ref_supcon(floats[0], others[0], TEMPERATURE)
    if kind == "barlow":
        return ref_barlow(*floats, LAMBDA_OFFDIAG)
    if kind == "mean":
        return ref_weighted_mean(floats[0], others[0], others[1])
    return ref_token_ce(floats[0], others[0])


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """``‖got - want‖ / ‖want‖`` in float64."""
    got, want = got.detach().to(F64), want.detach().to(F64)
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


# --------------------------------------------------------------------------------------------- the losses
def _run_losses(rank: int, world: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every loss case on this rank: value, its dtype, the input gradients (float64) and their dtypes."""
    lo, hi = bounds(sizes, rank)
    out = []
    for kind, strategy in LOSS_KINDS:
        floats, others = _loss_data(kind, sum(sizes))
        for dtype in HALF:
            for form in ("float32", "half"):
                criterion = make_criterion(kind, strategy, "sum")
                xs = [x[lo:hi].to(torch.float32 if form == "float32" else dtype).requires_grad_() for x in floats]
                args, kwargs = _loss_args(kind, xs, [o[lo:hi] for o in others])
                with torch.autocast("cpu", dtype=dtype):
                    value = criterion(*args, **kwargs)
                value.backward()
                out.append(
                    {
                        "case": (kind, strategy, dtype, form),
                        "value": value.detach().to(F64),
                        "dtype": value.dtype,
                        "grads": [x.grad.to(F64) for x in xs],
                        "grad_dtypes": [(x.dtype, x.grad.dtype) for x in xs],
                        "states": {n: v.dtype for n, v in criterion.metric_state.items()},
                    }
                )
    return out


def _dtype_problems(where: str, case: dict[str, Any]) -> list[str]:
    """A float32 value, and every input's gradient in that input's dtype."""
    out = []
    if case["dtype"] != torch.float32:
        out.append(f"{where}: value dtype {case['dtype']}, expected torch.float32")
    for x_dtype, g_dtype in case["grad_dtypes"]:
        if g_dtype != x_dtype:
            out.append(f"{where}: gradient dtype {g_dtype} for an input of {x_dtype}")
    return out


@pytest.mark.parametrize("world_size", [1, 2])
def test_losses_under_autocast(world_size: int) -> None:
    """Every loss and strategy under bf16/fp16 autocast: float32 value, gradients in the input dtype, errors
    against float64 within the documented bounds."""
    sizes = SIZES[world_size]
    results = run_distributed(_run_losses, world_size, sizes, timeout=240.0)
    problems = []
    references: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    for i, first in enumerate(results[0]):
        kind, strategy, dtype, form = first["case"]
        where = f"[{kind} {strategy} W={world_size} autocast={dtype} inputs={form}]"
        floats, others = _loss_data(kind, sum(sizes))
        # the reference sees exactly the values the ranks were given
        key = (kind, dtype if form == "half" else torch.float32)
        if key not in references:
            xs = [x.to(key[1]).to(F64).requires_grad_() for x in floats]
            given = [o.to(key[1]).to(F64) if o.is_floating_point() else o for o in others]  # a weight, as passed
            ref = _loss_reference(kind, xs, given)
            references[key] = (ref.detach(), list(torch.autograd.grad(ref, xs)))
        ref_value, ref_grads = references[key]
        value_bound, grad_bound = LOSS_BOUNDS[dtype]
        for rank, r in enumerate(results):
            case = r[i]
            problems.extend(_dtype_problems(f"{where} rank {rank}", case))
            for name, state_dtype in case["states"].items():
                if state_dtype in HALF:
                    problems.append(f"{where} rank {rank}: state {name} in {state_dtype}")
            err = _rel(case["value"], ref_value)
            if not err <= value_bound:
                problems.append(f"{where} rank {rank}: value error {err:.2e} > {value_bound:.0e}")
        grads = [torch.cat([r[i]["grads"][j] for r in results]) for j in range(len(ref_grads))]
        err = _rel(torch.cat([g.reshape(-1) for g in grads]), torch.cat([g.reshape(-1) for g in ref_grads]))
        if not err <= grad_bound:
            problems.append(f"{where}: gradient error {err:.2e} > {grad_bound:.0e}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


# -------------------------------------------------------------------------------------------- the metrics
METRICS = ("sum", "mean", "max", "min", "cat", "mse", "mae", "r2", "pearson", "cosine", "perplexity")


def _metric(name: str) -> Metric:
    kwargs: dict[str, Any] = {"dist_sync_on_step": True, "grad_reduction": "sum"}
    table = {
        "sum": lambda: SumMetric(**kwargs),
        "mean": lambda: MeanMetric(**kwargs),
        "max": lambda: MaxMetric(**kwargs),
        "min": lambda: MinMetric(**kwargs),
        "cat": lambda: CatMetric(**kwargs),
        "mse": lambda: MeanSquaredError(**kwargs),
        "mae": lambda: MeanAbsoluteError(**kwargs),
        "r2": lambda: R2Score(**kwargs),
        "pearson": lambda: PearsonCorrCoef(**kwargs),
        "cosine": lambda: CosineSimilarity(reduction="mean", **kwargs),
        "perplexity": lambda: Perplexity(ignore_index=IGNORE, **kwargs),
    }
    return table[name]()


def _metric_data(name: str, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(float inputs, other inputs)`` of a global batch of ``n`` rows, float64."""
    g = generator("mixed-precision-metric", name, n)
    if name in ("sum", "mean"):
        return [1 + torch.rand(n, 5, generator=g, dtype=F64)], []
    if name in ("max", "min", "cat"):  # distinct values, exact in half precision (no ties to split a gradient)
        return [1 + torch.randperm(n * 5, generator=g).to(F64).reshape(n, 5) / 64], []
    if name == "cosine":
        return [torch.randn(n, D, generator=g, dtype=F64), torch.randn(n, D, generator=g, dtype=F64)], []
    if name == "perplexity":
        target = torch.randint(0, CLASSES, (n, SEQ), generator=g)
        target = torch.where(torch.rand(n, SEQ, generator=g) < 0.3, torch.full_like(target, IGNORE), target)
        return [2 * torch.randn(n, SEQ, CLASSES, generator=g, dtype=F64)], [target]
    target = torch.randn(n, generator=g, dtype=F64)
    return [target + 0.3 * torch.randn(n, generator=g, dtype=F64), target], []


def _metric_reference(name: str, floats: list[torch.Tensor], others: list[torch.Tensor]) -> torch.Tensor:
    x = floats[0]
    if name == "sum":
        return x.sum()
    if name == "mean":
        return x.mean()
    if name == "max":
        return x.max()
    if name == "min":
        return x.min()
    if name == "cat":
        return x  # rows kept
    if name == "cosine":
        y = floats[1]
        return ((x * y).sum(1) / (x.norm(dim=1) * y.norm(dim=1))).mean()
    if name == "perplexity":
        return torch.exp(ref_token_ce(x, others[0]))
    t = floats[1]
    if name == "mse":
        return ((x - t) ** 2).mean()
    if name == "mae":
        return (x - t).abs().mean()
    if name == "r2":
        return 1 - ((t - x) ** 2).sum() / ((t - t.mean()) ** 2).sum()
    xc, tc = x - x.mean(), t - t.mean()
    return (xc * tc).sum() / (xc.norm() * tc.norm())  # pearson


def _run_metrics(rank: int, world: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    lo, hi = bounds(sizes, rank)
    out = []
    for name in METRICS:
        floats, others = _metric_data(name, sum(sizes))
        for dtype in HALF:
            for form in ("float32", "half"):
                metric = _metric(name)
                xs = [x[lo:hi].to(torch.float32 if form == "float32" else dtype).requires_grad_() for x in floats]
                local_others = [o[lo:hi] for o in others]
                with torch.autocast("cpu", dtype=dtype):
                    value = metric(*xs, *local_others)
                    states_after_forward = {n: _dtypes(v) for n, v in metric.metric_state.items()}
                    metric.update(*[x.detach() for x in xs], *local_others)
                value.sum().backward()
                out.append(
                    {
                        "case": (name, dtype, form),
                        "value": value.detach().to(F64),
                        "dtype": value.dtype,
                        "grads": [x.grad.to(F64) for x in xs],
                        "grad_dtypes": [(x.dtype, x.grad.dtype) for x in xs],
                        "states": {"forward": states_after_forward, "update": _states(metric)},
                    }
                )
    return out


def _dtypes(value: Any) -> list[torch.dtype]:
    items = value if isinstance(value, list) else [value]
    return [t.dtype for t in items if isinstance(t, torch.Tensor)]


def _states(metric: Metric) -> dict[str, list[torch.dtype]]:
    return {n: _dtypes(v) for n, v in metric.metric_state.items()}


@pytest.mark.parametrize("world_size", [1, 2])
def test_metrics_under_autocast(world_size: int) -> None:
    """Every differentiable metric, synced on step, fed half-precision (or float32 under autocast) inputs: a
    float32 value within float32 rounding of float64, gradients in the input dtype, no half-precision state."""
    sizes = SIZES[world_size]
    results = run_distributed(_run_metrics, world_size, sizes, timeout=240.0)
    problems = []
    for i, first in enumerate(results[0]):
        name, dtype, form = first["case"]
        where = f"[{name} W={world_size} autocast={dtype} inputs={form}]"
        floats, others = _metric_data(name, sum(sizes))
        xs = [x.to(dtype if form == "half" else torch.float32).to(F64).requires_grad_() for x in floats]
        ref = _metric_reference(name, xs, others)
        ref_grads = torch.autograd.grad(ref.sum(), xs)
        value_bound, grad_bound = METRIC_BOUNDS[dtype] if form == "half" else (1e-5, 1e-5)
        for rank, r in enumerate(results):
            case = r[i]
            problems.extend(_dtype_problems(f"{where} rank {rank}", case))
            for when, states in case["states"].items():
                for state, dtypes in states.items():
                    if any(dt in HALF for dt in dtypes):
                        problems.append(f"{where} rank {rank}: after {when}, state {state} holds {dtypes}")
            err = _rel(case["value"], ref)
            if not err <= value_bound:
                problems.append(f"{where} rank {rank}: value error {err:.2e} > {value_bound:.0e}")
        for j, ref_grad in enumerate(ref_grads):
            got = torch.cat([r[i]["grads"][j] for r in results])
            err = _rel(got, ref_grad)
            if not err <= grad_bound:
                problems.append(f"{where}: gradient error of input {j} {err:.2e} > {grad_bound:.0e}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------ in this process
@pytest.mark.parametrize("metric_cls", [MeanMetric, SumMetric])
@pytest.mark.parametrize("chunk", [100_000, 1000])
def test_accumulators_fed_1e5_bf16_values(metric_cls: type, chunk: int) -> None:
    """10⁵ bfloat16 values, in one update or in 100: the result is within float32 rounding of the float64 one."""
    values = (0.5 + torch.rand(100_000, generator=generator("bf16-accumulate"), dtype=F64)).to(torch.bfloat16)
    metric = metric_cls()
    for part in values.split(chunk):
        metric.update(part)
    got = metric.compute()
    exact = values.to(F64)
    want = exact.mean() if metric_cls is MeanMetric else exact.sum()
    assert got.dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in metric.metric_state.values())
    # float32 rounding: the textbook bound of a float32 summation, one unit of float32's epsilon per addition on
    # the way (log2 of a chunk for the pairwise sum of a chunk, one per update, one for the mean's division);
    # a bfloat16 sum is off by ~2^-9 (1e-3)
    additions = math.log2(chunk) + len(values) // chunk + 1
    assert abs(float(got) - float(want)) <= additions * torch.finfo(torch.float32).eps * abs(float(want))


def test_metric_forward_with_bf16_values_is_float32() -> None:
    """``forward`` on bf16 values: the step value and the batch it folds in are float32 sums."""
    values = (0.5 + torch.rand(20_000, generator=generator("bf16-forward"), dtype=F64)).to(torch.bfloat16)
    metric = MeanMetric()
    value = metric(values)
    assert value.dtype == torch.float32
    want = float(values.to(F64).mean())
    assert abs(float(value) - want) <= (math.log2(len(values)) + 1) * torch.finfo(torch.float32).eps * want
    assert metric.mean_value.dtype == torch.float32


class _AssignsSum(Metric):
    """A user metric whose ``update`` assigns a half-precision sum to a float32 state."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self.total = self.total.to(x.dtype) + x.sum()

    def compute(self) -> torch.Tensor:
        return self.total


def test_state_left_in_half_precision_is_widened() -> None:
    """A state an update leaves in bfloat16 returns to its float32 default's dtype, in ``forward`` and ``update``."""
    metric = _AssignsSum()
    x = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    value = metric(x)
    assert value.dtype == torch.float32
    value.backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    metric.update(x.detach())
    assert metric.total.dtype == torch.float32
    assert float(metric.compute()) == 6.0


def _float64_cases() -> tuple[list[tuple[str, Any]], tuple[torch.Tensor, torch.Tensor]]:
    g = generator("float64-under-autocast")
    a, b = _unit(torch.randn(9, D, generator=g, dtype=F64)), _unit(torch.randn(9, D, generator=g, dtype=F64))
    labels = torch.randint(0, 3, (9,), generator=g)
    return [
        ("clip", lambda x, y: TF.clip_loss(x, y, SCALE)),
        ("clip ring", lambda x, y: TF.global_clip_loss(x, y, SCALE, strategy="ring", tile=4)),
        ("siglip", lambda x, y: TF.siglip_loss(x, y, SCALE, BIAS)),
        ("siglip ring", lambda x, y: TF.global_siglip_loss(x, y, SCALE, BIAS, strategy="ring", tile=4)),
        ("infonce", lambda x, y: TF.info_nce_loss(x, y, TEMPERATURE)),
        ("infonce ring", lambda x, y: TF.global_info_nce_loss(x, y, TEMPERATURE, strategy="ring", tile=4)),
        ("supcon", lambda x, y: TF.supcon_loss(torch.stack([x, y], 1), labels, TEMPERATURE)),
        ("supcon ring", lambda x, y: TF.global_supcon_loss(x + y, labels, TEMPERATURE, strategy="ring", tile=4)),
        ("barlow", lambda x, y: TF.barlow_twins_loss(x, y, LAMBDA_OFFDIAG)),
        ("mean", lambda x, y: TF.weighted_mean(x * y)),
    ], (a, b)


@pytest.mark.parametrize("dtype", HALF)
def test_float64_is_untouched_by_autocast(dtype: torch.dtype) -> None:
    """float64 inputs under autocast: bit for bit the value and gradients they have without autocast."""
    cases, inputs = _float64_cases()
    for name, fn in cases:
        runs = []
        for on in (False, True):
            xs = [x.clone().requires_grad_() for x in inputs]
            with torch.autocast("cpu", dtype=dtype, enabled=on):
                value = fn(*xs)
            value.backward()
            runs.append((value.detach(), [x.grad for x in xs]))
        (v0, g0), (v1, g1) = runs
        assert v1.dtype == F64, name
        assert torch.equal(v0, v1), f"{name}: {float(v0)!r} != {float(v1)!r}"
        assert all(torch.equal(a, b) for a, b in zip(g0, g1)), f"{name}: gradients differ"


class _Products(TorchDispatchMode):
    """Records, for every matrix product, whether its operands are numbers of ``dtype``: tensors of ``dtype``, or
    float32 tensors whose values ``dtype`` holds exactly (the CPU form of a half-precision product with a float32
    result)."""

    PRODUCTS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.mm.dtype"})

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.seen: list[tuple[str, list[str]]] = []

    def _kind(self, t: torch.Tensor) -> str:
        if t.dtype == self.dtype:
            return "half"
        if t.dtype == torch.float32 and torch.equal(t, t.to(self.dtype).to(torch.float32)):
            return "half values"
        return str(t.dtype)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if str(func) in self.PRODUCTS:
            operands = args[1:3] if str(func) == "aten.addmm.default" else args[:2]
            self.seen.append((str(func), [self._kind(t) for t in operands]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", HALF)
def test_contrastive_products_run_in_the_autocast_dtype(dtype: torch.dtype) -> None:
    """float32 embeddings under autocast: every matrix product of forward and backward multiplies numbers of the
    autocast dtype; the value is float32 and the gradients float32."""
    g = generator("products")
    a, b = torch.randn(6, D, generator=g), torch.randn(6, D, generator=g)
    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    cases = {
        "clip": lambda x, y: TF.clip_loss(x, y, SCALE),
        "clip part": lambda x, y: TF.clip_block(x[:2], y[:2], x, y, SCALE, 0)[0],
        "clip ring": lambda x, y: TF.global_clip_loss(x, y, SCALE, strategy="ring", tile=4),
        "siglip": lambda x, y: TF.siglip_loss(x, y, SCALE, BIAS),
        "siglip ring": lambda x, y: TF.global_siglip_loss(x, y, SCALE, BIAS, strategy="ring", tile=4),
        "infonce": lambda x, y: TF.info_nce_loss(x, y, TEMPERATURE),
        "infonce ring": lambda x, y: TF.global_info_nce_loss(x, y, TEMPERATURE, strategy="ring", tile=4),
        "supcon": lambda x, y: TF.supcon_loss(x + y, labels, TEMPERATURE),
        "supcon ring": lambda x, y: TF.global_supcon_loss(x + y, labels, TEMPERATURE, strategy="ring", tile=4),
    }
    for name, fn in cases.items():
        xs = [a.clone().requires_grad_(), b.clone().requires_grad_()]
        with _Products(dtype) as mode:
            with torch.autocast("cpu", dtype=dtype):
                value = fn(*xs)
            value.backward()
        assert value.dtype == torch.float32, name
        assert all(x.grad.dtype == torch.float32 for x in xs), name
        assert len(mode.seen) >= 3, f"{name}: {len(mode.seen)} matrix products seen; forward and backward have 3"
        wrong = [(op, kinds) for op, kinds in mode.seen if any(k not in ("half", "half values") for k in kinds)]
        assert not wrong, f"{name}: products of numbers outside {dtype}: {wrong}"


def test_half_scale_is_not_rounded() -> None:
    """A number scale (``1 / temperature``) is not rounded to bfloat16, nor are the scaled embeddings: bfloat16
    inputs give InfoNCE within 2e-4 of float64 on the same values (a scale rounded to bfloat16 is off by 0.2 %,
    the loss then by ~1e-3)."""
    g = generator("scale")
    n, d, temperature = 256, 64, 0.07  # 1 / 0.07 = 14.2857... is not a bfloat16 number
    z1 = _unit(torch.randn(n, d, generator=g)).to(torch.bfloat16)
    z2 = _unit(z1.float() + 0.3 * torch.randn(n, d, generator=g)).to(torch.bfloat16)
    got = TF.info_nce_loss(z1, z2, temperature)
    z = _unit(torch.cat([z1, z2]).to(F64))  # the NT-Xent formula in float64
    logits = (z @ z.T / temperature).fill_diagonal_(-torch.inf)
    want = F.cross_entropy(logits, (torch.arange(2 * n) + n) % (2 * n))
    assert got.dtype == torch.float32
    assert abs(float(got) - float(want)) <= 2e-4 * float(want)


def test_token_cross_entropy_of_half_logits_is_float32() -> None:
    """Half-precision logits: the log-sum-exp over the classes runs in float32 (the value is float32)."""
    g = generator("token-ce")
    logits = (4 * torch.randn(5, 7, 50, generator=g)).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 50, (5, 7), generator=g)
    got = TF.token_cross_entropy(logits, target)
    want = F.cross_entropy(logits.detach().to(F64).reshape(-1, 50), target.reshape(-1))
    assert got.dtype == torch.float32
    assert abs(float(got.detach()) - float(want)) <= 1e-5 * float(want)
    got.backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("dtype", HALF)
def test_losses_under_cuda_autocast(dtype: torch.dtype) -> None:
    """The contrastive losses under CUDA autocast (one process): float32 value, gradients in the input dtype,
    errors against float64 within :data:`LOSS_BOUNDS`, and every product of half-precision numbers (there the
    kernels use ``torch.mm``'s mixed-dtype form)."""
    device = torch.device("cuda")
    g = generator("cuda-autocast")
    a, b = _unit(torch.randn(11, D, generator=g, dtype=F64)), _unit(torch.randn(11, D, generator=g, dtype=F64))
    labels = torch.randint(0, 3, (11,), generator=g)
    cases = {
        "clip": (lambda x, y: TF.clip_loss(x, y, SCALE), lambda x, y: ref_clip(x, y, SCALE)),
        "clip ring": (
            lambda x, y: TF.global_clip_loss(x, y, SCALE, strategy="ring", tile=4),
            lambda x, y: ref_clip(x, y, SCALE),
        ),
        "siglip": (lambda x, y: TF.siglip_loss(x, y, SCALE, BIAS), lambda x, y: ref_siglip(x, y, SCALE, BIAS)),
        "infonce": (lambda x, y: TF.info_nce_loss(x, y, TEMPERATURE), lambda x, y: ref_info_nce(x, y, TEMPERATURE)),
        "supcon": (
            lambda x, y: TF.supcon_loss(torch.stack([x, y], 1), labels.to(x.device), TEMPERATURE),
            lambda x, y: ref_supcon(torch.stack([x, y], 1), labels, TEMPERATURE),
        ),
        "barlow": (
            lambda x, y: TF.barlow_twins_loss(x, y, LAMBDA_OFFDIAG),
            lambda x, y: ref_barlow(x, y, LAMBDA_OFFDIAG),
        ),
    }
    value_bound, grad_bound = LOSS_BOUNDS[dtype]
    problems = []
    for name, (loss, reference) in cases.items():
        for form in (torch.float32, dtype):
            exact = [x.to(form).to(F64).requires_grad_() for x in (a, b)]
            ref = reference(*exact)
            ref_grads = torch.autograd.grad(ref, exact)
            xs = [x.to(form).to(device).requires_grad_() for x in (a, b)]
            with torch.autocast("cuda", dtype=dtype):
                value = loss(*xs)
            value.backward()
            where = f"[{name} autocast={dtype} inputs={form}]"
            if value.dtype != torch.float32:
                problems.append(f"{where}: value dtype {value.dtype}")
            if any(x.grad.dtype != x.dtype for x in xs):
                problems.append(f"{where}: gradient dtypes {[x.grad.dtype for x in xs]}")
            err = _rel(value.cpu(), ref)
            if not err <= value_bound:
                problems.append(f"{where}: value error {err:.2e} > {value_bound:.0e}")
            got = torch.cat([x.grad.cpu().to(F64).reshape(-1) for x in xs])
            err = _rel(got, torch.cat([r.reshape(-1) for r in ref_grads]))
            if not err <= grad_bound:
                problems.append(f"{where}: gradient error {err:.2e} > {grad_bound:.0e}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
