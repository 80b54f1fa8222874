"""torchmetrics metrics from domains the package does not implement, with seeded data, for the adapter's tests.

Each :class:`AdapterCase` builds a fresh torchmetrics metric and the global data of ``n`` rows (every rank
rebuilds all of it from the seed parts, then takes its rows). :func:`value_cases` spans seven domains (image,
audio, text, segmentation, clustering, nominal, detection, shape); :func:`image_collection_members` are the
ten metrics of one collection (the counts test and ``benchmarks/bench_adapter.py``).

torchmetrics is imported on first use: only processes that adapt metrics pay for it.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Callable, NamedTuple

import torch

from tests._helpers.seeds import F64, generator, rand

IMAGE = (1, 16, 16)  # one channel, 16 x 16: SSIM's 11 x 11 window fits
SIGNAL = 64  # audio samples per row
WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran")


def quiet_torchmetrics() -> None:
    """Silence torchmetrics' user and deprecation warnings in this process (a rank's body: the tests' own
    ``filterwarnings`` marks do not reach the ranks)."""
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


class AdapterCase(NamedTuple):
    """A torchmetrics metric (``source``: "module.Class" under ``torchmetrics.``), its domain, and its data."""

    domain: str
    source: str
    kwargs: dict[str, Any]  # the constructor's arguments
    data: Callable[[int, str], tuple]  # (items, tag) -> the global update arguments (sliceable by items)
    empty_update: bool = True  # whether its update accepts a batch of zero rows (forward on an empty rank)
    per_row: int = 1  # items of the data per row of a layout (labels: several per row, so the scores are not 1)
    rtol: float = 1e-10  # float32 inside torchmetrics' own maths (per batch): the order of batches shows at 1e-7

    def build(self) -> Any:
        """A fresh torchmetrics metric."""
        module, name = self.source.rsplit(".", 1)
        return getattr(importlib.import_module(f"torchmetrics.{module}"), name)(**self.kwargs)

    def available(self) -> bool:
        """Whether the installed torchmetrics has the metric (older releases lack some domains)."""
        module, name = self.source.rsplit(".", 1)
        try:
            return hasattr(importlib.import_module(f"torchmetrics.{module}"), name)
        except ImportError:
            return False

    def rows(self, n: int, tag: str) -> tuple:
        """The global data of ``n`` rows."""
        return self.data(n * self.per_row, tag)

    def take(self, args: tuple, lo: int, hi: int) -> tuple:
        """Rows ``[lo, hi)`` of every update argument (tensors and lists of strings alike)."""
        return tuple(a[lo * self.per_row : hi * self.per_row] for a in args)


def _images(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    target = torch.sigmoid(rand((n, *IMAGE), tag, "target"))
    preds = (target + 0.1 * rand((n, *IMAGE), tag, "noise")).clamp(0, 1)
    return preds, target


def _signals(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    target = rand((n, SIGNAL), tag, "target")
    return target + 0.3 * rand((n, SIGNAL), tag, "noise"), target


def _sentences(n: int, tag: str) -> tuple[list[str], list[str]]:
    g = generator(tag, "words")

    def sentence() -> str:
        k = int(torch.randint(1, 6, (), generator=g))
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=g))

    return [sentence() for _ in range(n)], [sentence() for _ in range(n)]


def _labels(n: int, tag: str, classes: int = 3, shape: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(tag, "labels")
    target = torch.randint(0, classes, (n, *shape), generator=g)
    flip = torch.rand((n, *shape), generator=g) < 0.3
    preds = torch.where(flip, torch.randint(0, classes, (n, *shape), generator=g), target)
    return preds, target


def _panoptic(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 8, 8, 2) maps of (category in {0, 1, 2}, instance in {0, 1}); categories 0, 1 things, 2 stuff."""
    g = generator(tag, "panoptic")
    target = torch.stack([torch.randint(0, 3, (n, 8, 8), generator=g), torch.randint(0, 2, (n, 8, 8), generator=g)], -1)
    preds = target.clone()
    preds[..., 0] = torch.where(torch.rand((n, 8, 8), generator=g) < 0.2, 2, preds[..., 0])
    return preds, target


def _points(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    target = rand((n, 6, 3), tag, "points")
    return target @ torch.linalg.qr(rand((3, 3), tag, "rotation"))[0] + 0.05 * rand((n, 6, 3), tag, "noise"), target


def _tm() -> Any:
    import torchmetrics

    for domain in ("image", "audio"):
        importlib.import_module(f"torchmetrics.{domain}")
    return torchmetrics


def _label_rows(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _labels(n, tag, shape=(8, 8))


_ALL: dict[str, AdapterCase] = {
    "SSIM": AdapterCase("image", "image.StructuralSimilarityIndexMeasure", {"data_range": 1.0}, _images),
    "PSNR": AdapterCase("image", "image.PeakSignalNoiseRatio", {"data_range": 1.0}, _images),
    "SI-SDR": AdapterCase("audio", "audio.ScaleInvariantSignalDistortionRatio", {}, _signals),
    "SNR": AdapterCase("audio", "audio.SignalNoiseRatio", {}, _signals),
    "WER": AdapterCase("text", "text.WordErrorRate", {}, _sentences),
    "CER": AdapterCase("text", "text.CharErrorRate", {}, _sentences),
    "Dice": AdapterCase(
        "segmentation", "segmentation.DiceScore", {"num_classes": 3, "input_format": "index"}, _label_rows
    ),
    "MeanIoU": AdapterCase(
        "segmentation", "segmentation.MeanIoU", {"num_classes": 3, "input_format": "index"}, _label_rows, rtol=1e-6
    ),
    "MutualInfo": AdapterCase("clustering", "clustering.MutualInfoScore", {}, _labels, per_row=8),
    "AdjustedRand": AdapterCase("clustering", "clustering.AdjustedRandScore", {}, _labels, per_row=8),
    "CramersV": AdapterCase("nominal", "nominal.CramersV", {"num_classes": 3}, _labels, per_row=8),
    "PanopticQuality": AdapterCase(
        "detection", "detection.PanopticQuality", {"things": {0, 1}, "stuffs": {2}}, _panoptic, rtol=1e-6
    ),
    "Procrustes": AdapterCase("shape", "shape.ProcrustesDisparity", {}, _points),
}


@functools.cache
def value_cases() -> dict[str, AdapterCase]:
    """The cases the installed torchmetrics has (1.9 has them all; 1.3 lacks segmentation and shape)."""
    return {name: case for name, case in _ALL.items() if case.available()}


# --------------------------------------------------------------------------- custom reductions (the slow path)
def _sum_over_ranks(stacked: torch.Tensor) -> torch.Tensor:
    return stacked.sum(0)


def stacked_reductions_metric() -> Any:
    """A torchmetrics metric with a custom callable reduction (a tensor state) and ``None`` (a stacked state).

    ``update(x)`` adds ``[Σx, Σx²]`` to ``moments`` (reduced by a callable that sums the per-rank values) and
    ``x.numel()`` to ``count`` (``None``: every rank's value stacked); ``compute`` is the variance.
    """
    tm = _tm()

    class Moments(tm.Metric):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("moments", torch.zeros(2, dtype=F64), dist_reduce_fx=_sum_over_ranks)
            self.add_state("count", torch.zeros((), dtype=F64), dist_reduce_fx=None)

        def update(self, x: torch.Tensor) -> None:
            self.moments = self.moments + torch.stack([x.sum(), (x * x).sum()])
            self.count = self.count + x.numel()

        def compute(self) -> torch.Tensor:
            n = self.count.sum()  # a 0-d local count, or the (W,) stack after a sync
            mean = self.moments[0] / n
            return self.moments[1] / n - mean * mean

    return Moments()


# --------------------------------------------------------------------------- ten metrics of one collection
def image_collection_members() -> dict[str, Any]:
    """Ten torchmetrics metrics of image and audio quality that take the same ``(preds, target)`` images (sum and
    mean states: each syncs its few numbers, whatever the batch)."""
    tm = _tm()
    image, audio = tm.image, tm.audio
    return {
        "ssim": image.StructuralSimilarityIndexMeasure(data_range=1.0),
        "psnr": image.PeakSignalNoiseRatio(data_range=1.0),
        "uqi": image.UniversalImageQualityIndex(),
        "sam": image.SpectralAngleMapper(),
        "scc": image.SpatialCorrelationCoefficient(),
        "ssim_box": image.StructuralSimilarityIndexMeasure(data_range=1.0, gaussian_kernel=False, kernel_size=7),
        "rmse_sw": image.RootMeanSquaredErrorUsingSlidingWindow(),
        "si_sdr": audio.ScaleInvariantSignalDistortionRatio(),
        "snr": audio.SignalNoiseRatio(),
        "si_snr": audio.ScaleInvariantSignalNoiseRatio(),
    }


def color_images(n: int, tag: str, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Three-channel 16 x 16 images in [0, 1] (SpectralAngleMapper needs several channels)."""
    target = torch.sigmoid(rand((n, 3, 16, 16), tag, "target", dtype=dtype))
    return (target + 0.1 * rand((n, 3, 16, 16), tag, "noise", dtype=dtype)).clamp(0, 1), target


# --------------------------------------------------------------------------- the documented counts
def adapter_situations(rank: int, count: Callable[[str, Callable[[], Any]], Any]) -> None:
    """The adapter as docs/guide/torchmetrics_adapter.rst describes it, for the documented-counts test: three
    epochs of one adapted metric (reset, update, ``compute``), and three synced steps and ``compute`` of a
    collection of ten."""
    from torchmetrics_diff import MetricCollection
    from torchmetrics_diff.wrappers import Synced

    single = Synced(image_collection_members()["psnr"])
    ten = MetricCollection({k: Synced(m, dist_sync_on_step=True) for k, m in image_collection_members().items()})
    for i in range(1, 4):
        preds, target = color_images(2 + rank, f"documented count {i} rank {rank}")
        single.reset()
        single.update(preds, target)
        count(f"Synced(PSNR) sync {i}", single.compute)
        count(f"collection of 10 Synced forward {i}", lambda p=preds, t=target: ten(p, t))
        count(f"collection of 10 Synced sync {i}", ten.compute)


#: the steady state (the third call) of :func:`adapter_situations`: one collective each
ADAPTER_STEADY = {
    "Synced(PSNR) sync 3": 1,
    "collection of 10 Synced forward 3": 1,
    "collection of 10 Synced sync 3": 1,
}
