"""torchmetrics' base-class behaviour, one test per gap in the base class, run side by side with real torchmetrics.

Where torchmetrics has the behaviour, the expected value is what *torchmetrics* does on the same calls (its
aggregation metrics or a twin metric written for both bases); where we keep a documented difference
(``docs/guide/decisions.rst``), the test pins our behaviour.

Package modules covered: ``metric``, ``aggregation`` and ``composition`` (against torchmetrics' base class).
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import torch
import torchmetrics

import torchmetrics_diff as tmd
from torchmetrics_diff import CatMetric, MaxMetric, MeanMetric, Metric, MetricCollection, SumMetric
from torchmetrics_diff.losses import CLIPLoss, GlobalMeanLoss, InfoNCELoss, SigLIPLoss, SupConLoss
from torchmetrics_diff.metric import TorchMetricsUserError


def _twin(base: type) -> type:
    """A running-total metric with an in-place update, on either base class (the aliasing case)."""

    class Total(base):  # type: ignore[misc, valid-type]
        full_state_update = False

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, x: torch.Tensor) -> None:
            self.total += x.sum()

        def compute(self) -> torch.Tensor:
            return self.total

    return Total


OursTotal, TheirsTotal = _twin(Metric), _twin(torchmetrics.Metric)


# ----------------------------------------------------------------------------------------------- aliasing
def test_compute_returns_the_value_as_of_the_call() -> None:
    """``update(1); a = compute(); update(2)`` leaves ``a == 1``, as torchmetrics does."""
    for cls in (OursTotal, TheirsTotal):
        m = cls()
        m.update(torch.tensor(1.0))
        a = m.compute()
        m.update(torch.tensor(2.0))
        assert a.item() == 1.0, cls
        assert m.compute().item() == 3.0


def test_compute_of_a_collection_and_a_composition_is_not_aliased() -> None:
    coll = MetricCollection({"t": OursTotal()})
    coll.update(torch.tensor(1.0))
    a = coll.compute()["t"]
    coll.update(torch.tensor(2.0))
    assert a.item() == 1.0 and coll.compute()["t"].item() == 3.0

    total = OursTotal()
    comp = total * 1  # a composition whose value could be the member's state itself
    comp.update(torch.tensor(1.0))
    b, c = comp.compute(), total.compute()
    comp.update(torch.tensor(2.0))
    assert b.item() == 1.0 and c.item() == 1.0
    first = CatMetric()[0]  # an index into a cat state
    first.update(torch.tensor([4.0, 5.0]))
    d = first.compute()
    first.metric_a.value[0].add_(100)  # an in-place change of the state itself
    assert d.item() == 4.0


def test_compute_copies_only_what_aliases() -> None:
    """A computed value that is already a new tensor is returned as is (no needless copy)."""
    m = MeanMetric()
    m.update(torch.tensor([1.0, 3.0]))
    value = m.compute()
    assert all(value.untyped_storage().data_ptr() != s.untyped_storage().data_ptr() for s in m.metric_state.values())


# ------------------------------------------------------------------------------------- base-class API gaps
def test_update_called_follows_torchmetrics() -> None:
    for m in (SumMetric(), torchmetrics.SumMetric()):
        assert m.update_called is False
        m.update(torch.tensor(1.0))
        assert m.update_called is True
        m.reset()
        assert m.update_called is False
    loss = InfoNCELoss()
    loss(torch.eye(2), torch.eye(2))
    assert loss.update_called


def test_getitem_builds_an_indexing_composition() -> None:
    ours, theirs = CatMetric()[1], torchmetrics.CatMetric()[1]
    assert isinstance(ours, tmd.CompositionalMetric)
    x = torch.tensor([3.0, 7.0, 9.0])
    assert ours(x).item() == theirs(x).item() == 7.0
    ours.update(torch.tensor([1.0]))
    theirs.update(torch.tensor([1.0]))
    assert ours.compute().item() == theirs.compute().item() == 7.0
    again = pickle.loads(pickle.dumps(ours))  # an itemgetter pickles, a lambda would not
    assert again.compute().item() == 7.0


def test_distributed_available_fn_is_a_constructor_argument() -> None:
    calls: list[int] = []

    def never() -> bool:
        calls.append(1)
        return False

    m = SumMetric(distributed_available_fn=never, dist_sync_on_step=True)
    m.update(torch.tensor(2.0))
    assert m.compute().item() == 2.0 and calls
    with pytest.raises(ValueError, match="distributed_available_fn"):
        SumMetric(distributed_available_fn=3)
    # torchmetrics accepts the same keyword
    torchmetrics.SumMetric(distributed_available_fn=never)


@pytest.mark.parametrize(
    "name", ["is_differentiable", "higher_is_better", "full_state_update", "plot_lower_bound", "plot_upper_bound"]
)
def test_class_constants_cannot_be_overwritten_on_an_instance(name: str) -> None:
    """torchmetrics raises ``RuntimeError("Can't change const ...")``; so do we, for metrics and losses."""
    for m in (torchmetrics.SumMetric(), SumMetric(), CLIPLoss()):
        with pytest.raises(RuntimeError, match="Can't change const"):
            setattr(m, name, True)
    assert SumMetric.is_differentiable is True  # the class attribute is untouched


def test_device_follows_a_torch_device_context() -> None:
    """Created under ``with torch.device("meta")`` the states are there, and ``.device`` says so."""
    with torch.device("meta"):
        ours, theirs = SumMetric(), torchmetrics.SumMetric()
    assert ours.sum_value.device.type == "meta"
    assert ours.device == theirs.device == torch.device("meta")
    assert SumMetric().device == torch.device("cpu")


def test_reset_empties_list_states_in_place() -> None:
    for m in (CatMetric(), torchmetrics.CatMetric()):
        m.update(torch.tensor([1.0, 2.0]))
        held = m.value
        m.reset()
        assert held == [] and m.value is held


def test_merge_state_refuses_full_state_update_metrics() -> None:
    class Running(Metric):
        full_state_update = True

        def __init__(self) -> None:
            super().__init__()
            self.add_state("x", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, v: torch.Tensor) -> None:
            self.x = self.x * 0.5 + v

        def compute(self) -> torch.Tensor:
            return self.x

    a, b = Running(), Running()
    b.update(torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="full_state_update=True"):
        a.merge_state(b)
    with pytest.raises(RuntimeError, match="full_state_update=True"):
        a.merge_state({"x": torch.tensor(1.0)})
    # torchmetrics refuses them too
    theirs = torchmetrics.MeanMetric()
    type(theirs).full_state_update, saved = True, type(theirs).full_state_update
    try:
        with pytest.raises(RuntimeError):
            theirs.merge_state(torchmetrics.MeanMetric())
    finally:
        type(theirs).full_state_update = saved


def test_merge_state_keeps_accepting_dist_sync_on_step() -> None:
    """A documented difference: our accumulators are local and detached whatever ``dist_sync_on_step`` says."""
    a, b = SumMetric(dist_sync_on_step=True), SumMetric(dist_sync_on_step=True)
    a.update(torch.tensor(1.0))
    b.update(torch.tensor(2.0))
    a.merge_state(b)
    assert a.compute().item() == 3.0
    with pytest.raises(RuntimeError):  # torchmetrics refuses
        torchmetrics.SumMetric(dist_sync_on_step=True).merge_state(torchmetrics.SumMetric())


def test_sync_errors_are_torchmetrics_user_errors() -> None:
    m = SumMetric()
    with pytest.raises(TorchMetricsUserError, match="not synced"):
        m.unsync()
    assert issubclass(TorchMetricsUserError, RuntimeError)  # except RuntimeError keeps working
    assert TorchMetricsUserError.__name__ == torchmetrics.utilities.exceptions.TorchMetricsUserError.__name__


def test_callable_reduction_of_a_list_state_at_world_size_one() -> None:
    """``dist_reduce_fx=torch.cat`` on a list state: accepted, and compute works like torchmetrics'."""

    def make(base: type) -> Any:
        class Gathered(base):  # type: ignore[misc, valid-type]
            full_state_update = False

            def __init__(self) -> None:
                super().__init__()
                self.add_state("rows", [], dist_reduce_fx=torch.cat)

            def update(self, x: torch.Tensor) -> None:
                self.rows.append(x)

            def compute(self) -> torch.Tensor:
                return torch.cat(self.rows).sum()

        return Gathered()

    ours, theirs = make(Metric), make(torchmetrics.Metric)
    for m in (ours, theirs):
        m.update(torch.tensor([1.0, 2.0]))
        m.update(torch.tensor([4.0]))
    assert ours.compute().item() == theirs.compute().item() == 7.0


# ---------------------------------------------------------------------------------------------- the losses
def test_repr_shows_settings_that_differ_from_the_defaults() -> None:
    assert repr(CLIPLoss(strategy="replicated")) == "CLIPLoss(strategy='replicated')"
    assert (
        repr(InfoNCELoss(temperature=0.5, grad_reduction="sum")) == "InfoNCELoss(temperature=0.5, grad_reduction='sum')"
    )
    assert repr(CLIPLoss()) == "CLIPLoss()"
    assert repr(MeanMetric(nan_strategy="ignore")) == "MeanMetric(nan_strategy='ignore')"
    assert repr(SumMetric(dist_sync_on_step=True)) == "SumMetric(dist_sync_on_step=True)"


def test_loss_forward_has_its_real_signature_and_errors_name_it() -> None:
    import inspect

    assert list(inspect.signature(CLIPLoss.forward).parameters) == [
        "self",
        "image_embeds",
        "text_embeds",
        "logit_scale",
    ]
    assert list(inspect.signature(CLIPLoss.update).parameters) == ["self", "image_embeds", "text_embeds", "logit_scale"]
    assert list(inspect.signature(SigLIPLoss.forward).parameters)[1:] == [
        "image_embeds",
        "text_embeds",
        "logit_scale",
        "logit_bias",
    ]
    assert list(inspect.signature(SupConLoss.forward).parameters)[1:] == ["features", "labels"]
    assert list(inspect.signature(GlobalMeanLoss.forward).parameters)[1:] == ["values", "weight", "mask"]
    assert CLIPLoss.forward.__doc__ and "logit_scale" in CLIPLoss.forward.__doc__
    with pytest.raises(TypeError) as err:
        CLIPLoss()(torch.eye(2), torch.eye(2))
    assert "CLIPLoss.forward()" in str(err.value) and "logit_scale" in str(err.value) and "_loss" not in str(err.value)


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        (
            lambda: CLIPLoss()(torch.eye(2), torch.eye(2, dtype=torch.bfloat16), 1.0),
            ("CLIPLoss", "`text_embeds`", "torch.float32", "torch.bfloat16"),
        ),
        (
            lambda: CLIPLoss()(torch.eye(2), torch.eye(2, device="meta"), 1.0),
            ("CLIPLoss", "`text_embeds`", "device", "meta"),
        ),
        (lambda: InfoNCELoss()(torch.eye(2, dtype=torch.float64), torch.eye(2)), ("InfoNCELoss", "`z2`", "float64")),
        (lambda: SupConLoss()(torch.eye(2), torch.tensor([0, 1], device="meta")), ("SupConLoss", "`labels`", "meta")),
        (
            lambda: SigLIPLoss()(torch.eye(2), torch.eye(2), torch.ones(1, device="meta"), 0.0),
            ("SigLIPLoss", "`logit_scale`", "meta"),
        ),
        (lambda: GlobalMeanLoss()(torch.ones(2), weight=torch.ones(2, device="meta")), ("GlobalMeanLoss", "`weight`")),
    ],
    ids=["dtype", "cpu-meta", "infonce", "labels-device", "scale-device", "weight-device"],
)
def test_loss_inputs_that_mix_dtypes_or_devices_are_a_clear_value_error(call: Any, needles: tuple) -> None:
    with pytest.raises(ValueError) as err:
        call()
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_a_cpu_scalar_scale_goes_with_any_device() -> None:
    """A 0-d CPU ``logit_scale`` is allowed beside embeddings elsewhere, as in torch's own arithmetic."""
    from torchmetrics_diff.losses._base import check_consistent

    check_consistent("CLIPLoss", {"a": torch.eye(2, device="meta"), "s": torch.tensor(2.0)}, ("a",))


def test_logit_scale_of_shape_one_is_accepted_and_gets_its_gradient() -> None:
    """FSDP2 refuses 0-d parameters: a shape-(1,) ``logit_scale`` gives the value and gradient of the 0-d one."""
    torch.manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64), dim=1)
    flat = torch.nn.Parameter(torch.tensor([3.0], dtype=torch.float64))
    scalar = torch.nn.Parameter(torch.tensor(3.0, dtype=torch.float64))
    loss_flat = CLIPLoss()(img, txt, flat)
    loss_scalar = CLIPLoss()(img, txt, scalar)
    loss_flat.backward()
    loss_scalar.backward()
    # the reference: both cross-entropies of the (N, N) logits, written out
    logits = 3.0 * img @ txt.T
    target = torch.arange(5)
    ref = (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target)) / 2
    assert torch.allclose(loss_flat, ref, rtol=0, atol=1e-14)
    assert flat.grad.shape == (1,) and torch.allclose(flat.grad[0], scalar.grad, rtol=0, atol=1e-14)
    s_loss = SigLIPLoss()(img, txt, flat, torch.tensor([-1.0], dtype=torch.float64))
    assert s_loss.ndim == 0


# --------------------------------------------------------------------------------------------------- plot
def test_plot_draws_a_value_and_a_sequence() -> None:
    import matplotlib

    matplotlib.use("Agg")
    m = MeanMetric()
    values = [m(torch.tensor([float(i), 1.0])) for i in range(4)]
    _fig, ax = m.plot(values)
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == pytest.approx([v.item() for v in values])
    _fig2, ax2 = m.plot()  # compute()
    assert ax2.get_lines()[0].get_ydata()[0] == pytest.approx(m.compute().item())
    coll = MetricCollection([SumMetric(), MaxMetric()])
    outs = [coll(torch.tensor([float(i)])) for i in range(3)]
    figs = coll.plot(outs)
    assert len(figs) == 2
    _fig3, ax3 = coll.plot(outs, together=True)
    assert len(ax3.get_lines()) == 2
    import matplotlib.pyplot as plt

    plt.close("all")


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an uninstalled package looks like to import
    with pytest.raises(ModuleNotFoundError, match=r"the plot extra.*: pip install 'matplotlib>=3\.6'"):
        SumMetric().plot(torch.tensor(1.0))


# ----------------------------------------------------------------------------------------- lightning hook
def test_metrics_are_torchmetrics_metrics_for_frameworks() -> None:
    """With torchmetrics imported, our metrics pass ``isinstance(m, torchmetrics.Metric)`` (Lightning's check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in (SumMetric(), CLIPLoss(), SumMetric() + 1):
            assert isinstance(m, torchmetrics.Metric)
    m = SumMetric()
    assert m._forward_cache is None
    m(torch.tensor([1.0, 2.0]))
    assert m._forward_cache.item() == 3.0 and not m._forward_cache.requires_grad
    m.reset()
    assert m._forward_cache is None
