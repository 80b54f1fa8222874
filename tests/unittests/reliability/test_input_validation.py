"""Bad input to every public entry point, in one process: a clear error naming the argument, what was expected
and what was given (not just the exception type), and NaN/Inf handling per ``nan_strategy``.

The distributed collectives are called here without a process group (the pytest process never joins one): their
argument checks run before any collective, identically at every world size (``test_failure_modes`` covers the
checks that need peers).

Package modules covered: the argument checks of ``aggregation``, ``metric``, ``losses``, ``functional`` and
``distributed``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import pytest
import torch

from tests._helpers.outcomes import expect_error
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, Metric, MinMetric, SumMetric
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.functional import global_clip_loss, global_info_nce_loss, global_weighted_mean
from torchmetrics_diff.losses import (
    BarlowTwinsLoss,
    CLIPLoss,
    GlobalMeanLoss,
    InfoNCELoss,
    SigLIPLoss,
    SupConLoss,
    TokenCrossEntropyLoss,
)

AGGREGATORS = [SumMetric, MeanMetric, CatMetric, MinMetric, MaxMetric]
NAN = float("nan")
INF = float("inf")


# ------------------------------------------------------------------------------------------ aggregation metrics


@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("value", "type_name"), [("abc", "str"), (object(), "object"), ({"a": 1}, "dict")])
def test_aggregator_non_numeric_value(cls: type, value: Any, type_name: str) -> None:
    metric = cls()
    expect_error(lambda: metric.update(value), TypeError, "`value`", "tensor or a number", type_name)
    assert metric.update_count == 0


@pytest.mark.parametrize(("weight", "needles"), [("x", ("`weight`", "str")), ([object()], ("`weight`", "list"))])
def test_mean_non_numeric_weight(weight: Any, needles: tuple) -> None:
    expect_error(lambda: MeanMetric().update(torch.ones(3), weight=weight), TypeError, *needles)


@pytest.mark.parametrize(
    ("value", "weight", "needles"),
    [
        (torch.ones(3), torch.ones(4), ("`weight`", "(4,)", "`value`", "(3,)")),
        (torch.ones(2, 3), torch.ones(2), ("`weight`", "(2,)", "(2, 3)")),
        (torch.ones(3), torch.ones(3, 3), ("`weight`", "(3, 3)", "(3,)")),
    ],
)
def test_mean_weight_shape(value: torch.Tensor, weight: torch.Tensor, needles: tuple) -> None:
    metric = MeanMetric()
    expect_error(lambda: metric.update(value, weight=weight), ValueError, *needles)
    assert metric.update_count == 0 and metric.weight.item() == 0


@pytest.mark.parametrize("strategy", ["drop", "", 1, 0, True, None, [0.5]], ids=repr)
@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_bad_nan_strategy(cls: type, strategy: Any) -> None:
    expect_error(lambda: cls(nan_strategy=strategy), ValueError, "`nan_strategy`", "'error'", "float", repr(strategy))


# values with a NaN: what each aggregator gives per nan_strategy ("drop": NaN removed; 0.5: NaN replaced)
NAN_INPUT = [1.0, NAN, -3.0]
DROPPED = {"SumMetric": -2.0, "MeanMetric": -1.0, "CatMetric": [1.0, -3.0], "MinMetric": -3.0, "MaxMetric": 1.0}
REPLACED = {"SumMetric": -1.5, "MeanMetric": -0.5, "CatMetric": [1.0, 0.5, -3.0], "MinMetric": -3.0, "MaxMetric": 1.0}


@pytest.mark.parametrize("strategy", ["error", "warn", "ignore", "disable", 0.5], ids=repr)
@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_nan_per_strategy(cls: type, strategy: Any) -> None:
    metric = cls(nan_strategy=strategy)
    name = cls.__name__
    if strategy == "error":
        expect_error(lambda: metric.update(torch.tensor(NAN_INPUT)), RuntimeError, name, "NaN", "nan_strategy='error'")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.update(torch.tensor(NAN_INPUT))
        at_update = len(caught)
        value = metric.compute()  # "warn" counts NaNs on the device and reports them here (CatMetric: at update)
    messages = [str(w.message) for w in caught if "NaN" in str(w.message)]
    if strategy == "warn":
        assert messages and name in messages[0] and "nan_strategy='warn'" in messages[0], messages
        assert len(messages) == 1, messages
        assert at_update == (1 if cls is CatMetric else 0), f"{name}: {at_update} warnings from update()"
    else:
        assert not messages, f"nan_strategy={strategy!r} must not warn: {messages}"
    if strategy == "disable":
        expected = torch.tensor([1.0, NAN, -3.0]) if cls is CatMetric else torch.tensor(NAN)
    else:
        expected = torch.tensor((REPLACED if isinstance(strategy, float) else DROPPED)[name])
    torch.testing.assert_close(value, expected, equal_nan=True)


@pytest.mark.parametrize("strategy", ["error", "warn", "ignore", "disable", 0.5], ids=repr)
@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_inf_is_a_value_under_every_strategy(cls: type, strategy: Any) -> None:
    """+inf and -inf are values, not missing data: kept by every nan_strategy, "error" included."""
    metric = cls(nan_strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NaN warning for infinities
        metric.update(torch.tensor([1.0, INF, -INF, 2.0]) if cls is CatMetric else torch.tensor([1.0, INF]))
    expected = {
        "SumMetric": INF,
        "MeanMetric": INF,
        "CatMetric": [1.0, INF, -INF, 2.0],
        "MinMetric": 1.0,
        "MaxMetric": INF,
    }[cls.__name__]
    torch.testing.assert_close(metric.compute(), torch.tensor(expected))


def test_mean_weight_nan_under_error_raises() -> None:
    """A NaN weight poisons the mean like a NaN value: nan_strategy="error" must catch it (torchmetrics does)."""
    metric = MeanMetric(nan_strategy="error")
    expect_error(
        lambda: metric.update(torch.tensor([1.0, 2.0, 3.0]), weight=torch.tensor([1.0, NAN, 1.0])),
        RuntimeError,
        "MeanMetric",
        "NaN",
        "`weight`",
    )
    assert metric.update_count == 0


def test_mean_scalar_weight_nan_under_error_raises() -> None:
    metric = MeanMetric(nan_strategy="error")
    expect_error(lambda: metric.update(torch.tensor([1.0, 2.0]), weight=NAN), RuntimeError, "NaN", "`weight`")


@pytest.mark.parametrize("strategy", ["warn", "ignore"])
def test_mean_weight_nan_drops_the_pair(strategy: str) -> None:
    """Under "warn"/"ignore" a NaN weight drops its (value, weight) pair, as a NaN value drops its weight."""
    metric = MeanMetric(nan_strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "warn" reports at compute()
        metric.update(torch.tensor([1.0, 2.0, 3.0]), weight=torch.tensor([1.0, NAN, 1.0]))
        value = metric.compute()
    assert value.item() == pytest.approx(2.0), f"got {value} (expected (1 + 3) / 2)"


# ------------------------------------------------------------------------------------------- Metric constructor


class _Total(Metric):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self.total += x.sum()

    def compute(self) -> torch.Tensor:
        return self.total


@pytest.mark.parametrize("kwarg", ["dist_sync_on_step", "sync_on_compute", "compute_on_cpu", "compute_with_cache"])
@pytest.mark.parametrize("value", [1, 0, "yes", None, torch.tensor(True)], ids=repr)
def test_metric_bool_kwargs(kwarg: str, value: Any) -> None:
    expect_error(lambda: _Total(**{kwarg: value}), ValueError, f"`{kwarg}`", "bool", repr(value))


@pytest.mark.parametrize("value", ["avg", None, "MEAN", 1], ids=repr)
def test_metric_grad_reduction(value: Any) -> None:
    expect_error(lambda: _Total(grad_reduction=value), ValueError, "`grad_reduction`", "'mean'", "'sum'", repr(value))


def test_metric_unknown_kwarg_and_non_callable_sync_fn() -> None:
    expect_error(lambda: _Total(dist_sync_onstep=True), ValueError, "_Total", "dist_sync_onstep")
    expect_error(lambda: _Total(dist_sync_fn=3), ValueError, "`dist_sync_fn`", "callable", "int")


@pytest.mark.parametrize("group", [3, [0, 1]], ids=repr)
def test_metric_process_group_of_a_bad_type(group: Any) -> None:
    """The constructor documents ``ValueError`` for a bad value of any of its arguments: a process group that is
    not a ``ProcessGroup`` would otherwise be accepted silently and fail (or be ignored) only when syncing."""
    expect_error(lambda: _Total(process_group=group), ValueError, "`process_group`", type(group).__name__)


# ---------------------------------------------------------------------------------------------------- add_state


@pytest.mark.parametrize("default", [3, 0.0, [1], [torch.ones(1)], "x", None, (torch.ones(1),)], ids=repr)
def test_add_state_bad_default(default: Any) -> None:
    metric = _Total()
    expect_error(lambda: metric.add_state("x", default), ValueError, "`default`", "'x'", "tensor or an empty list")
    assert "x" not in metric.metric_state


@pytest.mark.parametrize("fx", ["prod", "SUM", 3, "concat"], ids=repr)
def test_add_state_bad_reduction(fx: Any) -> None:
    metric = _Total()
    expect_error(
        lambda: metric.add_state("x", torch.tensor(0.0), dist_reduce_fx=fx),
        ValueError,
        "`dist_reduce_fx`",
        "'x'",
        "'sum'",
        "'cat'",
        "callable",
        repr(fx),
    )


@pytest.mark.parametrize("name", ["1x", "a-b", "", "a b", 3, None], ids=repr)
def test_add_state_bad_name(name: Any) -> None:
    expect_error(lambda: _Total().add_state(name, torch.tensor(0.0)), ValueError, "`name`", repr(name))


@pytest.mark.parametrize("name", ["update", "compute", "process_group"])
def test_add_state_name_that_shadows_the_metric(name: str) -> None:
    """A state named like a method or attribute of the metric replaces it (``metric.update`` becomes a tensor):
    it must be refused with a clear error instead of breaking the metric later."""
    metric = _Total()
    expect_error(lambda: metric.add_state(name, torch.tensor(0.0)), ValueError, "`name`", repr(name))
    metric.update(torch.ones(2))  # still a working metric
    assert metric.compute().item() == 2.0


# --------------------------------------------------------------------------------------------- MetricCollection


# ------------------------------------------------------------------------------------------------------ losses

X = torch.nn.functional.normalize(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), dim=1)
LABELS = torch.tensor([0, 1, 0, 1])

LOSS_CASES: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
    ("clip: list", lambda: CLIPLoss()([1.0], X, 1.0), ("`image_embeds`", "(B, D)", "list")),
    ("clip: 1-d", lambda: CLIPLoss()(X[0], X[0], 1.0), ("`image_embeds`", "(B, D)", "(3,)")),
    ("clip: 3-d", lambda: CLIPLoss()(X[None], X[None], 1.0), ("`image_embeds`", "(1, 4, 3)")),
    ("clip: int", lambda: CLIPLoss()(X.long(), X.long(), 1.0), ("`image_embeds`", "floating", "torch.int64")),
    ("clip: views", lambda: CLIPLoss()(X, X[:3], 1.0), ("`text_embeds`", "`image_embeds`", "(4, 3)", "(3, 3)")),
    ("clip: dims", lambda: CLIPLoss()(X, X[:, :2], 1.0), ("`text_embeds`", "(4, 3)", "(4, 2)")),
    ("clip: nan scale", lambda: CLIPLoss()(X, X, NAN), ("`logit_scale`", "finite", "nan")),
    ("clip: inf scale", lambda: CLIPLoss()(X, X, INF), ("`logit_scale`", "finite", "inf")),
    ("clip: -inf scale", lambda: CLIPLoss()(X, X, -INF), ("`logit_scale`", "finite", "-inf")),
    ("clip: str scale", lambda: CLIPLoss()(X, X, "10"), ("`logit_scale`", "'10'")),
    ("clip: 2-elem scale", lambda: CLIPLoss()(X, X, torch.ones(2)), ("`logit_scale`", "one-element", "(2,)")),
    ("clip: int scale tensor", lambda: CLIPLoss()(X, X, torch.tensor(3)), ("`logit_scale`", "torch.int64")),
    ("infonce: str", lambda: InfoNCELoss()("z", X), ("`z1`", "str")),
    ("infonce: views", lambda: InfoNCELoss()(X, X[:, :2]), ("`z2`", "`z1`", "(4, 3)", "(4, 2)")),
    ("infonce: rows", lambda: InfoNCELoss()(X, X[:2]), ("`z2`", "(4, 3)", "(2, 3)")),
    ("supcon: 4-d", lambda: SupConLoss()(X[None, None], LABELS), ("`features`", "(B, D) or (B, V, D)", "(1, 1, 4, 3)")),
    ("supcon: labels len", lambda: SupConLoss()(X, LABELS[:3]), ("`labels`", "(4,)", "(3,)")),
    ("supcon: labels 2-d", lambda: SupConLoss()(X, LABELS[:, None]), ("`labels`", "(4,)", "(4, 1)")),
    ("supcon: float labels", lambda: SupConLoss()(X, LABELS.float()), ("`labels`", "integer", "torch.float32")),
    ("supcon: list labels", lambda: SupConLoss()(X, [0, 1, 0, 1]), ("`labels`", "integer", "list")),
    ("siglip: views", lambda: SigLIPLoss()(X, X[:2], 1.0, 0.0), ("`text_embeds`", "(4, 3)", "(2, 3)")),
    ("siglip: nan scale", lambda: SigLIPLoss()(X, X, NAN, 0.0), ("`logit_scale`", "finite", "nan")),
    ("siglip: inf bias", lambda: SigLIPLoss()(X, X, 1.0, INF), ("`logit_bias`", "finite", "inf")),
    ("barlow: views", lambda: BarlowTwinsLoss()(X, X[:, :2]), ("`zb`", "`za`", "(4, 3)", "(4, 2)")),
    ("barlow: 1-d", lambda: BarlowTwinsLoss()(X[0], X[0]), ("`za`", "(3,)")),
    ("mean: str", lambda: GlobalMeanLoss()("v"), ("`values`", "str")),
    ("mean: weight shape", lambda: GlobalMeanLoss()(torch.ones(3), weight=torch.ones(4)), ("`weight`", "(3,)", "(4,)")),
    ("mean: float mask", lambda: GlobalMeanLoss()(torch.ones(3), mask=torch.ones(3)), ("`mask`", "bool", "float32")),
    (
        "token ce: target shape",
        lambda: TokenCrossEntropyLoss()(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)),
        ("`target`", "`logits`", "(2, 3)", "(2, 4)"),
    ),
    (
        "token ce: float target",
        lambda: TokenCrossEntropyLoss()(torch.zeros(2, 3, 4), torch.zeros(2, 3)),
        ("`target`", "integer", "torch.float32"),
    ),
    (
        "token ce: int logits",
        lambda: TokenCrossEntropyLoss()(torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)),
        ("`logits`", "floating", "torch.int64"),
    ),
    ("functional clip: views", lambda: global_clip_loss(X, X[:1], 1.0), ("`text_embeds`", "(4, 3)", "(1, 3)")),
    ("functional infonce: temperature", lambda: global_info_nce_loss(X, X, 0.0), ("`temperature`", "positive", "0.0")),
    ("functional mean: mask", lambda: global_weighted_mean(torch.ones(2), mask=torch.ones(2)), ("`mask`", "bool")),
]


@pytest.mark.parametrize(("call", "needles"), [c[1:] for c in LOSS_CASES], ids=[c[0] for c in LOSS_CASES])
def test_loss_bad_input(call: Callable[[], Any], needles: tuple) -> None:
    expect_error(call, ValueError, *needles)


@pytest.mark.parametrize("temperature", [0, 0.0, -1.0, NAN, INF, -INF, True, "0.1", None, torch.tensor(0.1)], ids=repr)
@pytest.mark.parametrize("cls", [InfoNCELoss, SupConLoss])
def test_loss_bad_temperature_in_constructor(cls: type, temperature: Any) -> None:
    expect_error(
        lambda: cls(temperature=temperature), ValueError, "`temperature`", "finite positive", repr(temperature)
    )


@pytest.mark.parametrize("smoothing", [1.5, -0.1, NAN], ids=repr)
def test_token_ce_bad_label_smoothing(smoothing: float) -> None:
    expect_error(lambda: TokenCrossEntropyLoss(label_smoothing=smoothing), ValueError, "`label_smoothing`", "[0, 1]")


@pytest.mark.parametrize("kwargs", [{"lambda_offdiag": NAN}, {"eps": NAN}, {"eps": -1.0}], ids=repr)
def test_barlow_twins_bad_constructor_numbers(kwargs: dict) -> None:
    """Like the temperatures of InfoNCE/SupCon, numbers that make every loss NaN must be refused up front."""
    (name, value), *_ = kwargs.items()
    expect_error(lambda: BarlowTwinsLoss(**kwargs), ValueError, f"`{name}`", repr(value))


@pytest.mark.parametrize("cls", [CLIPLoss, InfoNCELoss, SupConLoss, SigLIPLoss, BarlowTwinsLoss])
def test_loss_bad_strategy_and_grad_reduction(cls: type) -> None:
    needles = ("`strategy`", "'replicated'", "'sharded'", "'ring'", "'bogus'")
    expect_error(lambda: cls(strategy="bogus"), ValueError, *needles)
    expect_error(lambda: cls(grad_reduction="max"), ValueError, "`grad_reduction`", "'mean'", "'max'")


def _empty(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, requires_grad=True)


EMPTY_CASES: list[tuple[str, Callable[[bool], tuple[Any, list[torch.Tensor]]]]] = []


def _empty_case(name: str) -> Callable:
    def register(fn: Callable[[bool], tuple[Any, list[torch.Tensor]]]) -> Callable:
        EMPTY_CASES.append((name, fn))
        return fn

    return register


@_empty_case("CLIPLoss")
def _clip_empty(sync: bool) -> tuple:
    x, y = _empty(0, 3), _empty(0, 3)
    return CLIPLoss(dist_sync_on_step=sync)(x, y, torch.tensor(10.0)), [x, y]


@_empty_case("InfoNCELoss")
def _infonce_empty(sync: bool) -> tuple:
    x, y = _empty(0, 3), _empty(0, 3)
    return InfoNCELoss(dist_sync_on_step=sync)(x, y), [x, y]


@_empty_case("SupConLoss labels")
def _supcon_empty(sync: bool) -> tuple:
    x = _empty(0, 3)
    return SupConLoss(dist_sync_on_step=sync)(x, torch.zeros(0, dtype=torch.long)), [x]


@_empty_case("SupConLoss no positives")
def _supcon_no_positive(sync: bool) -> tuple:
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    return SupConLoss(dist_sync_on_step=sync)(x, torch.tensor([0, 1, 2])), [x]


@_empty_case("SigLIPLoss")
def _siglip_empty(sync: bool) -> tuple:
    x, y = _empty(0, 3), _empty(0, 3)
    return SigLIPLoss(dist_sync_on_step=sync)(x, y, 10.0, -5.0), [x, y]


@_empty_case("GlobalMeanLoss empty")
def _mean_empty(sync: bool) -> tuple:
    v = _empty(0)
    return GlobalMeanLoss(dist_sync_on_step=sync)(v), [v]


@_empty_case("GlobalMeanLoss all masked")
def _mean_masked(sync: bool) -> tuple:
    v = torch.tensor([1.0, NAN]).requires_grad_(True)
    return GlobalMeanLoss(dist_sync_on_step=sync)(v, mask=torch.zeros(2, dtype=torch.bool)), [v]


@_empty_case("TokenCrossEntropyLoss all ignored")
def _token_ignored(sync: bool) -> tuple:
    logits = torch.zeros(2, 3, 4, requires_grad=True)
    return TokenCrossEntropyLoss(dist_sync_on_step=sync)(logits, torch.full((2, 3), -100)), [logits]


@_empty_case("TokenCrossEntropyLoss zero rows")
def _token_empty(sync: bool) -> tuple:
    logits = _empty(0, 3, 4)
    return TokenCrossEntropyLoss(dist_sync_on_step=sync)(logits, torch.zeros(0, 3, dtype=torch.long)), [logits]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "local"])
@pytest.mark.parametrize("make", [c[1] for c in EMPTY_CASES], ids=[c[0] for c in EMPTY_CASES])
def test_loss_of_an_empty_batch_is_zero_not_nan(make: Callable, sync: bool) -> None:
    value, inputs = make(sync)
    assert value.item() == 0.0, f"an empty batch gave {value}, expected 0"
    value.backward()
    assert inputs, "a case without inputs checks no gradient"
    for x in inputs:
        # the inputs are leaves of the loss' graph: each gets a gradient of its shape (an empty batch's is empty),
        # and since nothing of the batch counts towards the value, that gradient is zero, not NaN
        assert x.grad is not None, "no gradient reached an input of the loss"
        assert x.grad.shape == x.shape, f"gradient of shape {tuple(x.grad.shape)} for an input of {tuple(x.shape)}"
        assert torch.equal(x.grad, torch.zeros_like(x)), f"non-zero or non-finite gradient {x.grad}"


def test_barlow_twins_of_an_empty_batch_is_finite() -> None:
    """No rows: no correlation to measure; the value is finite (the loss of a zero cross-correlation)."""
    za, zb = _empty(0, 3), _empty(0, 3)
    value = BarlowTwinsLoss()(za, zb)
    assert torch.isfinite(value), value
    value.backward()
    for z in (za, zb):
        assert z.grad is not None and z.grad.shape == (0, 3), f"gradient {z.grad} for an input of shape (0, 3)"


# ------------------------------------------------------------------------------------ distributed collectives

COLLECTIVES = {
    "gather_all_tensors": lambda t, **kw: gather_all_tensors(t, **kw),
    "all_gather_cat": lambda t, **kw: all_gather_cat(t, **kw),
    "all_reduce": lambda t, **kw: all_reduce(t, **kw),
}


def _unsupported_dtypes() -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is experimental, quantized creation deprecated
        tensors = [torch.zeros(2, dtype=torch.complex32), torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)]
        for name in ("uint16", "float8_e4m3fn"):
            if hasattr(torch, name):
                tensors.append(torch.zeros(2, dtype=getattr(torch, name)))
    return tensors


@pytest.mark.parametrize("fn", list(COLLECTIVES))
@pytest.mark.parametrize(("value", "type_name"), [([1.0, 2.0], "list"), (3.0, "float"), (None, "NoneType")])
def test_collective_non_tensor(fn: str, value: Any, type_name: str) -> None:
    expect_error(lambda: COLLECTIVES[fn](value), TypeError, fn, "`tensor`", "torch.Tensor", type_name)


@pytest.mark.parametrize("fn", list(COLLECTIVES))
@pytest.mark.parametrize("grad", ["bogus", None, "LOCAL", True], ids=repr)
def test_collective_bad_grad(fn: str, grad: Any) -> None:
    expect_error(lambda: COLLECTIVES[fn](torch.ones(2), grad=grad), ValueError, fn, "`grad`", "'sync'", repr(grad))


@pytest.mark.parametrize("op", ["prod", "SUM", 1, None], ids=repr)
def test_all_reduce_bad_op(op: Any) -> None:
    """``op=None`` included: at world size 1 it used to return the input, at W > 1 it raised ``KeyError: None``."""
    expect_error(lambda: all_reduce(torch.ones(2), op=op), ValueError, "all_reduce", "`op`", "'sum'", repr(op))


@pytest.mark.parametrize("fn", list(COLLECTIVES))
def test_collective_more_than_16_dims(fn: str) -> None:
    expect_error(lambda: COLLECTIVES[fn](torch.zeros([1] * 17)), ValueError, fn, "16", "17")
    COLLECTIVES[fn](torch.zeros([1] * 16))  # 16 is fine


@pytest.mark.parametrize("fn", list(COLLECTIVES))
@pytest.mark.parametrize("tensor", _unsupported_dtypes(), ids=lambda t: str(t.dtype))
def test_collective_unsupported_dtype(fn: str, tensor: torch.Tensor) -> None:
    expect_error(lambda: COLLECTIVES[fn](tensor), TypeError, fn, str(tensor.dtype), "cannot be communicated")


@pytest.mark.parametrize(
    ("tensor", "op", "needles"),
    [
        (torch.ones(2, dtype=torch.int64), "mean", ("op='mean'", "floating", "torch.int64")),
        (torch.ones(2, dtype=torch.bool), "sum", ("op='sum'", "bool")),
        (torch.ones(2, dtype=torch.bool), "mean", ("op='mean'", "torch.bool")),
    ],
    ids=["mean of int64", "sum of bool", "mean of bool"],
)
def test_all_reduce_op_undefined_for_dtype(tensor: torch.Tensor, op: str, needles: tuple) -> None:
    expect_error(lambda: all_reduce(tensor, op), ValueError, "all_reduce", *needles)


@pytest.mark.parametrize("op", ["min", "max"])
def test_all_reduce_min_max_of_complex(op: str) -> None:
    """Complex numbers have no order: at W > 1 gloo refuses (``ValueError: all_reduce does not support
    RedOpType.MAX on complex tensors``); world size 1 must refuse alike instead of returning the input."""
    expect_error(lambda: all_reduce(torch.ones(2, dtype=torch.complex64), op), ValueError, f"op={op!r}", "complex")


def test_checks_do_not_depend_on_finite_values() -> None:
    """Collective argument checks never inspect values: NaN and Inf travel like any number."""
    x = torch.tensor([NAN, INF, -INF])
    for out in (gather_all_tensors(x)[0], all_gather_cat(x), all_reduce(x, "max")):
        torch.testing.assert_close(out, x, equal_nan=True)
    assert math.isnan(all_reduce(x, "sum")[0].item())
