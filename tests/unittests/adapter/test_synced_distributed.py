"""``Synced`` on spawned gloo ranks: torchmetrics metrics of seven domains on the global batch.

- values: ``compute`` after two updates per rank and a synced ``forward`` equal torchmetrics' own metric on the
  concatenation of every rank's rows, computed in the pytest process (W = 1, 2, 3, uneven batches, a rank with
  no rows);
- gradients: SSIM, PSNR, SI-SDR and SNR as global-batch losses: the DDP-averaged float64 gradient equals one
  process's gradient of torchmetrics' metric on the concatenated batch; and the ``dist_sync_fn`` recipe for
  torchmetrics' own metrics: ``partial(gather_all_tensors, grad="sync")`` is exact, the plain gather gives
  ``1/W`` of it;
- counts: one collective per steady-state sync and synced step, for one adapted metric and for a collection of
  ten;
- errors: an update that raises on one rank raises on every rank.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, NamedTuple

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests._helpers.adapter_cases import color_images, image_collection_members, stacked_reductions_metric, value_cases
from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, bounds, rand

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

LAYOUTS = {"uneven": [3, 1, 2], "empty rank": [3, 0, 2]}


def _quiet() -> None:
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


# ---------------------------------------------------------------------------------------------------- values
def _values_body(rank: int, world: int) -> dict:
    """Per (layout, case): ``compute`` after two updates of this rank's rows (none on an empty rank), the value
    of a synced ``forward`` of them, and ``compute`` after that forward."""
    from torchmetrics_diff.wrappers import Synced

    _quiet()
    checks = Checks(f"W={world} rank {rank} ")
    out: dict = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, case in value_cases().items():
            data = case.rows(sum(sizes), f"{layout}/{name}")
            metric = Synced(case.build()).set_dtype(F64)
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid, hi)):
                if b > a:
                    metric.update(*case.take(data, a, b))
            value = metric.compute()
            checks.detached(f"[{layout}] {name} compute", value)
            stepped = after = None
            if case.empty_update or 0 not in sizes:
                stepper = Synced(case.build(), dist_sync_on_step=True).set_dtype(F64)
                stepped = stepper(*case.take(data, lo, hi))
                after = stepper.compute()
            out[(layout, name)] = (value, stepped, after)
        # a custom callable reduction and a None one (the gather path)
        data = rand((sum(sizes) * 4,), layout, "moments")
        metric = Synced(stacked_reductions_metric())
        if hi > lo:
            metric.update(data[lo * 4 : hi * 4])
        stepper = Synced(stacked_reductions_metric(), dist_sync_on_step=True)
        out[(layout, "callable reductions")] = (metric.compute(), stepper(data[lo * 4 : hi * 4]), stepper.compute())
    return {"values": out, "failures": checks.failures}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_torchmetrics_on_the_global_batch(world_size: int) -> None:
    """Image (SSIM, PSNR), audio (SI-SDR, SNR), text (WER, CER), segmentation (Dice, mean IoU), clustering (mutual
    information, adjusted Rand), nominal (Cramér's V), detection (panoptic quality), shape (Procrustes) and a metric
    with custom callable / ``None`` reductions: ``compute``, a synced ``forward`` and ``compute`` after it equal
    torchmetrics' metric on every rank's rows, on every rank."""
    _quiet()
    results = run_distributed(_values_body, world_size, timeout=240)
    checks = Checks(f"W={world_size} ")
    for layout, all_sizes in LAYOUTS.items():
        n = sum(all_sizes[:world_size])
        for name, case in value_cases().items():
            reference = case.build().set_dtype(F64)
            reference.update(*case.rows(n, f"{layout}/{name}"))
            expected = reference.compute()
            stepping = case.empty_update or 0 not in all_sizes[:world_size]
            for rank, res in enumerate(results):
                value, stepped, after = res["values"][(layout, name)]
                what = f"[{layout}] {name} (rank {rank})"
                tol = {"atol": 1e-12, "rtol": case.rtol}
                checks.close(f"{what} compute", value, expected, **tol)
                checks.true(what, (stepped is not None) == stepping, f"forward ran: {stepped is not None}")
                if stepping:
                    checks.close(f"{what} forward", stepped, expected, **tol)
                    checks.close(f"{what} compute after forward", after, expected, **tol)
        data = rand((n * 4,), layout, "moments")
        variance = data.var(unbiased=False)
        for rank, res in enumerate(results):
            for i, got in enumerate(res["values"][(layout, "callable reductions")]):
                checks.close(f"[{layout}] callable reductions value {i} (rank {rank})", got, variance, atol=1e-12)
    assert_no_failures(checks.failures + [f for res in results for f in res["failures"]])


# ------------------------------------------------------------------------------------------ gradient contract
IN_FEATURES, PIXELS = 4, 256  # the model maps 4 features to a 16 x 16 image (or a 256-sample signal)


def _model() -> nn.Linear:
    model = nn.Linear(IN_FEATURES, PIXELS, dtype=F64)
    with torch.no_grad():
        model.weight.copy_(rand((PIXELS, IN_FEATURES), "adapter model", "weight") * 0.5)
        model.bias.copy_(rand((PIXELS,), "adapter model", "bias") * 0.5)
    return model


class GradCase(NamedTuple):
    build: Callable[..., Any]  # (**metric kwargs) -> a torchmetrics metric
    loss: Callable[[torch.Tensor, torch.Tensor], tuple]  # (model output, target) -> update arguments
    sign: float  # the loss is sign * value
    empty_update: bool = True


def _image(out: torch.Tensor, target: torch.Tensor) -> tuple:
    return torch.sigmoid(out).view(-1, 1, 16, 16), torch.sigmoid(target).view(-1, 1, 16, 16)


def _grad_cases() -> dict[str, GradCase]:
    from torchmetrics.audio import ScaleInvariantSignalDistortionRatio, SignalNoiseRatio
    from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

    return {
        "SSIM": GradCase(lambda **kw: StructuralSimilarityIndexMeasure(data_range=1.0, **kw), _image, -1.0),
        "PSNR": GradCase(lambda **kw: PeakSignalNoiseRatio(data_range=1.0, **kw), _image, -1.0),
        "SI-SDR": GradCase(ScaleInvariantSignalDistortionRatio, lambda o, t: (o, t), -1.0),
        "SNR": GradCase(SignalNoiseRatio, lambda o, t: (o, t), -1.0),
    }


def _grad_body(rank: int, world: int) -> dict:
    """Per (layout, case, how): this rank's loss and DDP gradients, and the one-process reference's.

    ``how`` is ``"Synced"`` (the adapter), or torchmetrics' own metric with ``dist_sync_fn`` the ``grad="sync"``
    gather (``"tm sync gather"``) or the plain one (``"tm plain gather"``).
    """
    from torchmetrics_diff.distributed import gather_all_tensors
    from torchmetrics_diff.wrappers import Synced

    _quiet()
    out: dict = {}
    recipes: dict[str, Callable[[GradCase], Any]] = {
        "Synced": lambda c: Synced(c.build(), dist_sync_on_step=True).set_dtype(F64),
        "tm sync gather": lambda c: c.build(
            dist_sync_on_step=True, dist_sync_fn=functools.partial(gather_all_tensors, grad="sync")
        ).set_dtype(F64),
        "tm plain gather": lambda c: c.build(dist_sync_on_step=True, dist_sync_fn=gather_all_tensors).set_dtype(F64),
    }
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for name, case in _grad_cases().items():
            if not case.empty_update and 0 in sizes:
                continue  # (SSIM with an empty rank: its value and gradients in test_synced_states.py)
            x = rand((sum(sizes), IN_FEATURES), layout, name, "x")
            target = rand((sum(sizes), PIXELS), layout, name, "target")
            ref_model = _model()
            reference = case.build().set_dtype(F64)
            ref_value = case.sign * reference(*case.loss(ref_model(x), target))
            ref_value.backward()
            ref_grads = [p.grad.clone() for p in ref_model.parameters()]
            for how, build in recipes.items():
                if how != "Synced" and name != "PSNR":
                    continue  # the recipe on one metric is enough
                model = DistributedDataParallel(_model())
                metric = build(case)
                value = case.sign * metric(*case.loss(model(x[lo:hi]), target[lo:hi]))
                has_graph = value.requires_grad
                value.backward()  # every rank, the empty one too: DDP's gradient all-reduce needs them all
                out[(layout, name, how)] = {
                    "value": value.detach(),
                    "has_graph": has_graph,
                    "grads": [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()],
                    "ref_value": ref_value.detach(),
                    "ref_grads": ref_grads,
                }
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ddp_gradient_equals_single_process_gradient(world_size: int) -> None:
    """SSIM, PSNR, SI-SDR and SNR adapted as global-batch losses: the value is identical on every rank and equals
    torchmetrics' on the concatenated batch, and the DDP-averaged float64 gradient equals one process's. Through
    torchmetrics' own sync, ``dist_sync_fn=partial(gather_all_tensors, grad="sync")`` gives the same gradient and
    the plain ``gather_all_tensors`` exactly ``1/W`` of it (the docs' recipe)."""
    _quiet()
    results: list[dict] = run_distributed(_grad_body, world_size, timeout=240)
    checks = Checks(f"W={world_size} ")
    for key, first in results[0].items():
        case = f"[{key[0]}] {key[1]} via {key[2]}"
        scale = 1.0 / world_size if key[2] == "tm plain gather" else 1.0
        for rank, res in enumerate(r[key] for r in results):
            checks.true(case, res["has_graph"], f"rank {rank}: the loss has no grad_fn")
            checks.true(case, torch.equal(res["value"], first["value"]), f"rank {rank}: value differs from rank 0")
            checks.close(f"{case} value (rank {rank})", res["value"], res["ref_value"], atol=1e-12, rtol=1e-10)
            for i, (g, ref) in enumerate(zip(res["grads"], res["ref_grads"])):
                checks.close(f"{case} DDP grad of param {i} (rank {rank})", g, ref * scale, atol=1e-10, rtol=1e-9)
    expected = {(lay, n, h) for lay in LAYOUTS for n in ("PSNR", "SI-SDR", "SNR") for h in ("Synced",)}
    expected |= {(lay, "PSNR", h) for lay in LAYOUTS for h in ("tm sync gather", "tm plain gather")}
    assert expected <= set(results[0]), f"cases that did not run: {expected - set(results[0])}"
    assert_no_failures(checks.failures)


# ---------------------------------------------------------------------------------------------------- counts
def _count_body(rank: int, world: int) -> dict[str, list[str]]:
    """The collectives of three syncs and three synced steps of one adapted metric and of a collection of ten."""
    from torchmetrics_diff import MetricCollection
    from torchmetrics_diff.wrappers import Synced

    _quiet()
    single = Synced(image_collection_members()["psnr"], dist_sync_on_step=True)
    ten = MetricCollection({k: Synced(m, dist_sync_on_step=True) for k, m in image_collection_members().items()})
    calls: dict[str, list[str]] = {}
    for i in range(1, 4):
        preds, target = color_images(2 + rank, f"count {i} rank {rank}")
        for name, metric in (("one", single), ("ten", ten)):
            with record_collectives() as log:
                metric(preds, target)
            calls[f"{name} forward {i}"] = list(log)
            with record_collectives() as log:
                metric.compute()
            calls[f"{name} sync {i}"] = list(log)
    return calls


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_adapted_metric_and_a_collection_of_ten_sync_in_one_collective(world_size: int) -> None:
    """PSNR adapted, and ten adapted image/audio metrics in one collection (sum and mean states): one
    collective per synced ``forward`` and per ``compute`` in the steady state (the third call)."""
    results = run_distributed(_count_body, world_size, timeout=240)
    problems = [
        f"rank {rank} {case}: {log}"
        for rank, calls in enumerate(results)
        for case, log in calls.items()
        if case.endswith(" 3") and len(log) != 1
    ]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------- errors
def _error_body(rank: int, world: int) -> str:
    """SSIM adapted with ``dist_sync_on_step``: rank 1 steps with images without their channel dimension, which
    torchmetrics' update refuses; every rank must raise (no rank may wait for the others in the sync)."""
    from torchmetrics_diff.wrappers import Synced

    _quiet()
    metric = Synced(value_cases()["SSIM"].build(), dist_sync_on_step=True)
    preds, target = value_cases()["SSIM"].rows(2, f"error {rank}")
    if rank == 1:
        preds, target = preds[:, 0], target[:, 0]
    try:
        metric(preds.float(), target.float())
    except Exception as err:  # the failing rank's own error, or the peers' RuntimeError naming it
        kind = "RuntimeError" if isinstance(err, RuntimeError) else type(err).__name__
        return f"{kind}: {err}"
    return "no error"


def test_an_update_that_raises_on_one_rank_raises_on_every_rank() -> None:
    results = run_distributed(_error_body, 2, timeout=120)
    assert results[1].startswith("ValueError"), results[1]
    assert results[0].startswith("RuntimeError") and "rank(s) [1]" in results[0], results[0]


# ---------------------------------------------------------------------------------------------- torch.compile
def _compile_body(rank: int, world: int) -> dict:
    """A compiled training step with an adapted SI-SDR (``dist_sync_on_step``) as the loss, vs the same step
    eager: values and DDP gradients of four steps (uneven rows: rank r holds 2 + r)."""
    from torchmetrics.audio import ScaleInvariantSignalDistortionRatio

    from torchmetrics_diff.wrappers import Synced

    _quiet()
    out: dict = {"values": [], "grads": []}
    for compiled in (False, True):
        model = DistributedDataParallel(_model())
        metric = Synced(ScaleInvariantSignalDistortionRatio(), dist_sync_on_step=True).set_dtype(F64)

        def step(x: torch.Tensor, target: torch.Tensor, model: Any = model, metric: Any = metric) -> torch.Tensor:
            return -metric(model(x), target)

        run = torch.compile(step, backend="eager") if compiled else step
        for i in range(4):
            x, target = rand((2 + rank, IN_FEATURES), "compile x", i, rank), rand((2 + rank, PIXELS), "t", i, rank)
            model.zero_grad()
            value = run(x, target)
            value.backward()
            out["values"].append(value.detach())
            out["grads"].append(model.module.weight.grad.clone())
    return out


def test_a_compiled_step_with_an_adapted_loss_equals_eager_on_two_ranks() -> None:
    """Under ``torch.compile`` at two ranks the adapted metric's ``forward`` runs eagerly behind one graph break
    (as our metrics'): the values and DDP gradients of four compiled steps equal the eager ones."""
    results = run_distributed(_compile_body, 2, timeout=240)
    for rank, res in enumerate(results):
        half = len(res["values"]) // 2
        for i in range(half):
            torch.testing.assert_close(res["values"][half + i], res["values"][i], msg=f"rank {rank} step {i}")
            torch.testing.assert_close(res["grads"][half + i], res["grads"][i], msg=f"rank {rank} step {i} grad")
