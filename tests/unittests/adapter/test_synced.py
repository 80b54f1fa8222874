"""``Synced`` in one process: what it adapts and refuses, the version guard, and the Metric API around it
(``state_dict``, copies, collections with compute groups, our wrappers, ``plot``, ``set_dtype``,
``torch.compile``). References are torchmetrics' own metrics on the same data."""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import pytest
import torch

from tests._helpers.adapter_cases import color_images, image_collection_members, value_cases
from tests._helpers.seeds import F64, rand
from torchmetrics_diff import MetricCollection, SumMetric
from torchmetrics_diff.wrappers import MetricTracker, Synced
from torchmetrics_diff.wrappers import synced as synced_module

tm = pytest.importorskip("torchmetrics")
from torchmetrics.audio import ScaleInvariantSignalDistortionRatio  # noqa: E402
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


def _psnr_data(n: int = 4, tag: str = "psnr") -> tuple[torch.Tensor, torch.Tensor]:
    return value_cases()["PSNR"].rows(n, tag)


# ---------------------------------------------------------------------------------------------------- adapting
def test_an_instance_and_a_class_with_arguments_give_the_same_metric() -> None:
    preds, target = _psnr_data()
    by_instance = Synced(PeakSignalNoiseRatio(data_range=1.0))
    by_class = Synced(PeakSignalNoiseRatio, data_range=1.0, dist_sync_on_step=True)
    assert type(by_instance) is type(by_class)
    assert isinstance(by_instance, Synced) and isinstance(by_instance, tm.Metric)
    assert type(by_instance).__name__ == "PeakSignalNoiseRatio"  # collections key it as torchmetrics does
    assert by_class.dist_sync_on_step and not by_instance.dist_sync_on_step
    reference = PeakSignalNoiseRatio(data_range=1.0)
    reference.update(preds, target)
    for metric in (by_instance, by_class):
        metric.update(preds, target)
        torch.testing.assert_close(metric.compute(), reference.compute())


def test_an_updated_instance_keeps_what_it_accumulated() -> None:
    preds, target = _psnr_data()
    inner = PeakSignalNoiseRatio(data_range=1.0)
    inner.update(preds[:2], target[:2])
    metric = Synced(inner)
    assert metric.update_count == 1
    metric.update(preds[2:], target[2:])
    reference = PeakSignalNoiseRatio(data_range=1.0)
    reference.update(preds, target)
    torch.testing.assert_close(metric.compute(), reference.compute())


def test_class_attributes_and_sync_settings_come_from_the_torchmetrics_metric() -> None:
    ssim = Synced(StructuralSimilarityIndexMeasure(data_range=1.0, dist_sync_on_step=True, compute_on_cpu=True))
    assert (ssim.higher_is_better, ssim.is_differentiable, ssim.full_state_update) == (True, True, False)
    assert ssim.dist_sync_on_step and ssim.compute_on_cpu
    assert ssim._reductions == {"similarity": "sum", "total": "sum"}
    # torchmetrics leaves full_state_update None on SI-SDR: a step replays update (as torchmetrics' forward does)
    assert ScaleInvariantSignalDistortionRatio.full_state_update is None
    assert Synced(ScaleInvariantSignalDistortionRatio()).full_state_update is True


def test_the_torchmetrics_metric_keeps_none_of_the_states_between_calls() -> None:
    """The adapter lends its states to torchmetrics' maths for one call: afterwards the inner metric holds its
    defaults again (no graph, no batch kept alive), and its own update count never moves."""
    metric = Synced(PeakSignalNoiseRatio(data_range=1.0), dist_sync_on_step=True)
    preds, target = _psnr_data()
    value = metric(preds.requires_grad_(True), target)
    assert value.requires_grad
    inner = metric.metric
    for name, default in inner._defaults.items():
        assert getattr(inner, name) is default
    assert inner._update_count == 0 and metric.update_count == 1


def test_a_full_state_update_metric_steps_like_torchmetrics() -> None:
    """BLEU's update reads the accumulated states (``full_state_update=True``): each step's value and the epoch's
    equal torchmetrics' own metric stepped on the same batches."""
    from torchmetrics.text import BLEUScore

    ours, theirs = Synced(BLEUScore(n_gram=2)), BLEUScore(n_gram=2)
    batches = [
        (["the cat sat on the mat"], [["the cat sat on a mat"]]),
        (["a dog ran"], [["the dog ran away"]]),
    ]
    for preds, target in batches:
        torch.testing.assert_close(ours(preds, target), theirs(preds, target))
    torch.testing.assert_close(ours.compute(), theirs.compute())


def test_custom_reductions_are_kept() -> None:
    from tests._helpers.adapter_cases import stacked_reductions_metric

    metric = Synced(stacked_reductions_metric())
    assert callable(metric._reductions["moments"]) and metric._reductions["count"] is None
    x = rand((10,), "moments")
    metric.update(x)
    torch.testing.assert_close(metric.compute(), x.var(unbiased=False))


# ---------------------------------------------------------------------------------------------------- refusing
class _OwnSync(PeakSignalNoiseRatio):
    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        raise AssertionError("never called")


class _OwnReset(PeakSignalNoiseRatio):  # (the FID family's reset is known to the adapter: it is adapted)
    def reset(self) -> None:
        raise AssertionError("never called")


class _OddState(PeakSignalNoiseRatio):
    def __init__(self) -> None:
        super().__init__(data_range=1.0)
        self._defaults["table"] = {"a": 1}  # torchmetrics' add_state would refuse it; a subclass can sneak it in
        self._reductions["table"] = None
        self._persistent["table"] = False
        self.__dict__["table"] = {"a": 1}


def _refused() -> dict[str, tuple[Any, str]]:
    from torchmetrics.wrappers import MinMaxMetric

    psnr = PeakSignalNoiseRatio(data_range=1.0)
    return {
        "a torchmetrics collection": (
            tm.MetricCollection([PeakSignalNoiseRatio(data_range=1.0)]),
            "MetricCollection: it is a torchmetrics MetricCollection",
        ),
        "a torchmetrics wrapper": (MinMaxMetric(psnr), "MinMaxMetric: it is made of other torchmetrics metrics"),
        "a torchmetrics composition": (psnr + psnr, "CompositionalMetric: it is made of other torchmetrics"),
        "our own metric": (SumMetric(), "SumMetric: it is already a torchmetrics_diff metric"),
        "not a metric": (torch.nn.Linear(2, 2), "Linear: it is not a torchmetrics.Metric"),
        "a reset that keeps states": (_OwnReset, "_OwnReset: it overrides `reset`"),
        "its own sync": (_OwnSync, "_OwnSync: it overrides `_sync_dist`"),
        "a state that is not a tensor": (_OddState(), "_OddState: its state 'table' has default"),
    }


@pytest.mark.parametrize("case", list(_refused()))
def test_what_cannot_be_adapted_raises_one_type_error_naming_it_and_why(case: str) -> None:
    metric, message = _refused()[case]
    with pytest.raises(TypeError, match="^Synced cannot adapt " + message.replace("(", r"\(")):
        Synced(metric)


def test_constructor_arguments_with_an_instance_are_refused() -> None:
    with pytest.raises(TypeError, match=r"constructor arguments \['data_range'\] with an instance"):
        Synced(PeakSignalNoiseRatio(data_range=1.0), data_range=2.0)


@pytest.mark.parametrize("version", ["1.2.1", "2.0.0", "2.0.0rc1", "not-a-version"])
def test_an_unsupported_torchmetrics_version_fails_loudly(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(tm, "__version__", version)
    with pytest.raises(ImportError, match=rf"supports torchmetrics>=1.3,<2.0; torchmetrics {version} is installed"):
        Synced(PeakSignalNoiseRatio(data_range=1.0))


def test_the_supported_range_is_the_documented_one() -> None:
    assert synced_module.SUPPORTED_TORCHMETRICS == ">=1.3,<2.0"
    Synced(PeakSignalNoiseRatio(data_range=1.0))  # the installed torchmetrics (1.9 in CI) is inside it


# ------------------------------------------------------------------------------------------- the Metric API
def test_state_dict_round_trip() -> None:
    preds, target = _psnr_data()
    metric = Synced(PeakSignalNoiseRatio(data_range=1.0))
    assert metric.state_dict() == {}  # torchmetrics' states are not persistent by default, nor ours
    metric.persistent(True)
    metric.update(preds, target)
    saved = metric.state_dict()
    assert set(saved) == {"sum_squared_error", "total", "data_range"}  # once: the inner metric saves nothing
    fresh = Synced(PeakSignalNoiseRatio(data_range=1.0))
    fresh.persistent(True)
    fresh.load_state_dict(saved)
    torch.testing.assert_close(fresh.compute(), metric.compute())


def test_pickle_deepcopy_and_clone_keep_the_states() -> None:
    preds, target = value_cases()["MutualInfo"].rows(4, "copies")
    metric = Synced(tm.clustering.MutualInfoScore())
    metric.update(preds, target)
    expected = metric.compute()
    for copied in (pickle.loads(pickle.dumps(metric)), copy.deepcopy(metric), metric.clone()):
        assert type(copied) is type(metric)
        torch.testing.assert_close(copied.compute(), expected)
        copied.update(preds, target)  # the copy's lists are its own
    torch.testing.assert_close(metric.compute(), expected)


def test_a_collection_of_adapted_metrics_equals_torchmetrics_collection() -> None:
    members = image_collection_members()
    ours = MetricCollection({k: Synced(m) for k, m in members.items()})
    theirs = tm.MetricCollection(image_collection_members(), compute_groups=False)
    for i in range(2):
        preds, target = color_images(3, f"collection {i}")
        step = ours(preds, target)
        expected = theirs(preds, target)
        for key, value in expected.items():
            torch.testing.assert_close(step[key], value, msg=key)
    computed, expected = ours.compute(), theirs.compute()
    assert set(computed) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(computed[key], value, msg=key)


def test_compute_groups_of_adapted_metrics() -> None:
    """Mutual information and its normalized form share torchmetrics' update (and states): one compute group,
    values equal torchmetrics'; a group of metrics with different updates is refused."""
    preds, target = value_cases()["MutualInfo"].rows(6, "groups")
    clustering = tm.clustering
    coll = MetricCollection(
        {"mi": Synced(clustering.MutualInfoScore()), "nmi": Synced(clustering.NormalizedMutualInfoScore())},
        compute_groups=[["mi", "nmi"]],
    )
    coll.update(preds, target)
    for key, cls in (("mi", clustering.MutualInfoScore), ("nmi", clustering.NormalizedMutualInfoScore)):
        reference = cls()
        reference.update(preds, target)
        torch.testing.assert_close(coll.compute()[key], reference.compute())
    with pytest.raises(ValueError, match="does not have the states and update"):
        MetricCollection(
            {"a": Synced(clustering.MutualInfoScore()), "b": Synced(clustering.AdjustedRandScore())},
            compute_groups=[["a", "b"]],
        )


def test_metric_tracker_around_an_adapted_metric() -> None:
    tracker = MetricTracker(Synced(PeakSignalNoiseRatio(data_range=1.0)))  # higher is better, from torchmetrics
    values = []
    for epoch, noise in enumerate((0.2, 0.05, 0.1)):
        tracker.increment()
        preds, target = value_cases()["PSNR"].rows(3, f"tracker {epoch}")
        preds = (target + noise * rand(target.shape, "tracker noise", epoch)).clamp(0, 1)
        tracker.update(preds, target)
        reference = PeakSignalNoiseRatio(data_range=1.0)
        reference.update(preds, target)
        values.append(reference.compute())
    torch.testing.assert_close(tracker.compute_all(), torch.stack(values))
    best, step = tracker.best_metric(return_step=True)
    assert step == int(torch.stack(values).argmax())
    assert best == pytest.approx(float(torch.stack(values).max()))


def test_set_dtype_reaches_the_states_and_moves_keep_them() -> None:
    preds, target = _psnr_data()
    metric = Synced(PeakSignalNoiseRatio(data_range=1.0)).set_dtype(F64)
    assert metric.sum_squared_error.dtype == F64 and metric.total.dtype == torch.int64
    metric.update(preds, target)
    metric.to("cpu").double()  # device moves follow, dtype casts of a parent module do not reach the states
    assert metric.sum_squared_error.dtype == F64
    torch.testing.assert_close(metric.compute(), 10 * torch.log10(1 / ((preds - target) ** 2).mean()))


def test_plot_is_torchmetrics_picture() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [torch.tensor(v) for v in (20.0, 22.5, 21.0)]
    try:
        _, ours = Synced(PeakSignalNoiseRatio(data_range=1.0)).plot(values)
        _, theirs = PeakSignalNoiseRatio(data_range=1.0).plot(values)
        assert ours.get_title() == theirs.get_title()
        assert (ours.get_xlabel(), ours.get_ylabel()) == (theirs.get_xlabel(), theirs.get_ylabel())
        assert [line.get_xydata().tolist() for line in ours.lines] == [
            line.get_xydata().tolist() for line in theirs.lines
        ]
        assert [t.get_text() for t in ours.texts] == [t.get_text() for t in theirs.texts]
    finally:
        plt.close("all")


def test_torch_compile_of_a_step_with_an_adapted_metric() -> None:
    """A compiled step calling an adapted SI-SDR as a loss: value and gradient equal eager, and later steps
    compile nothing new."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = torch.nn.Linear(8, 32, dtype=F64)
    metric = Synced(ScaleInvariantSignalDistortionRatio()).set_dtype(F64)

    def step(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return -metric(model(x), target)

    compiled = torch.compile(step, backend="eager")
    for i in range(4):
        x, target = rand((3, 8), "compile", i), rand((3, 32), "compile target", i)
        model.zero_grad()
        eager = step(x, target)
        eager.backward()
        eager_grad = model.weight.grad.clone()
        model.zero_grad()
        if i == 2:  # after two compiled steps of warm-up
            frames = counters["stats"]["unique_graphs"]
        value = compiled(x, target)
        value.backward()
        torch.testing.assert_close(value, eager)
        torch.testing.assert_close(model.weight.grad, eager_grad)
    assert counters["stats"]["unique_graphs"] == frames, "a step after warm-up compiled a new graph"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.isfinite(metric.compute())


def test_lightning_logs_an_adapted_metric_as_torchmetrics_metric() -> None:
    """``self.log(name, synced_metric)`` in a LightningModule (one CPU process): the step value is the batch's and
    the epoch value torchmetrics' PSNR over the epoch's batches."""
    pl = pytest.importorskip("lightning.pytorch")
    batches = [_psnr_data(3, f"lightning {i}") for i in range(3)]

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.psnr = Synced(PeakSignalNoiseRatio(data_range=1.0))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            preds, target = batch
            self.psnr(preds[0], target[0])
            self.log("psnr", self.psnr, on_step=True, on_epoch=True)
            return self.layer(torch.ones(1, 1)).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader([(p[None], t[None]) for p, t in batches], batch_size=None)
    trainer.fit(Module(), train_dataloaders=loader)
    reference = PeakSignalNoiseRatio(data_range=1.0)
    for preds, target in batches:
        reference.update(preds, target)
    torch.testing.assert_close(trainer.logged_metrics["psnr_epoch"], reference.compute())
    last = PeakSignalNoiseRatio(data_range=1.0)
    last.update(*batches[-1])
    torch.testing.assert_close(trainer.logged_metrics["psnr_step"], last.compute())
