"""``Synced`` on the torchmetrics classes that override its machinery: the FID family and ``MeanAveragePrecision``.

- FID, KID and MIFID with a small fixed feature extractor (a conv and a linear layer, ``num_features`` declared, so
  FID runs no dummy image through it): ``compute`` on W = 1, 2, 3 gloo ranks with uneven batches and a rank
  without images equals torchmetrics' class in one process on the concatenated images, in float64; KID's random
  subsets drawn with the same seed on every rank and in the reference (one update of each kind per rank: the
  gathered features are then in the concatenation's order, so the seeded subsets pick the same rows), and with
  one subset of every row (order-free: two updates of each kind per rank); ``reset()`` with
  ``reset_real_features=False`` keeps the real features (also when called between ``sync()`` and ``unsync()``),
  as torchmetrics' ``reset`` does; ``.to(torch.float64)`` reaches the extractor through the adapter, and no sync
  sends its weights (a 1 MiB buffer on it; what a ``compute`` sends is counted, and a per-rank mark on it survives);
- ``MeanAveragePrecision`` (``iou_type="bbox"``, pycocotools): ``compute`` and a synced ``forward`` at W = 1, 2,
  3 (uneven, a rank without images, images without boxes, and no detection on any rank) equal torchmetrics' class
  in one process on every image; the collectives of each ``compute`` and synced ``forward`` are counted (three at
  the first sync, two when the lists grew, one in the steady state), and torchmetrics' own for comparison;
- in one process: what is refused (``iou_type="segm"``, a subclass that overrides ``reset`` again), ``.to("meta")``
  moving the extractor and the states (and mAP's lists), ``forward`` of a batch of one kind, copies, one extractor
  shared by adapted FID, KID and MIFID in a collection, integer states kept integer by ``set_dtype``.

torchvision, which ``MeanAveragePrecision`` imports for ``box_convert`` alone on its ``bbox`` path, cannot be
installed beside the CPU torch here: the tests put a stand-in for that one function in place while they run
(:func:`stand_in_box_convert`), for our metric and for torchmetrics' reference alike.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.machinery
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from tests._helpers.adapter_cases import quiet_torchmetrics
from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, bounds, generator, rand

tm = pytest.importorskip("torchmetrics")
pytest.importorskip("pycocotools")
from torchmetrics.image.fid import FrechetInceptionDistance  # noqa: E402
from torchmetrics.image.kid import KernelInceptionDistance  # noqa: E402
from torchmetrics.image.mifid import MemorizationInformedFrechetInceptionDistance  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


# ------------------------------------------------------------------------------------------ the FID family
FEATURES = 4
BALLAST = 1 << 17  # float64 elements of a buffer on the extractor (1 MiB): no sync may send it


class Extractor(nn.Module):
    """A fixed random feature extractor: (N, 3, 6, 6) images -> (N, 4) features, in the dtype of its weights
    (float32 as built; ``.to(torch.float64)`` of the metric makes it float64)."""

    num_features = FEATURES  # torchmetrics' FID reads it (else it runs a dummy uint8 image through the network)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, stride=2)
        self.linear = nn.Linear(8, FEATURES)
        with torch.no_grad():
            for i, p in enumerate(self.parameters()):
                p.copy_(torch.randn(p.shape, generator=generator("extractor", i)))
        self.register_buffer("ballast", torch.zeros(BALLAST, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.tanh(self.conv(x)).flatten(1))


def _images(n: int, *parts: object) -> torch.Tensor:
    shift = 0.5 if "fake" in parts else 0.0
    return rand((n, 3, 6, 6), *parts) + shift


# real and fake images per rank (rank 1 has none in "empty rank")
IMAGE_LAYOUTS = {"uneven": ([7, 3, 5], [5, 6, 2]), "empty rank": ([7, 0, 5], [6, 0, 4])}


def _generative_cases() -> dict[str, tuple[type, dict[str, Any], int]]:
    """name -> (class, constructor arguments, updates of each kind per rank). KID "seeded" draws random subsets
    (the same seed everywhere, one update of each kind per rank: the gathered order is the concatenation's);
    KID "every row" draws one subset of all rows (as many real as fake images, ``subset_size`` their number)."""
    return {
        "FID": (FrechetInceptionDistance, {}, 2),
        "KID seeded": (KernelInceptionDistance, {"subsets": 4, "subset_size": 3}, 1),
        "KID every row": (KernelInceptionDistance, {"subsets": 1}, 2),
        "MIFID": (MemorizationInformedFrechetInceptionDistance, {}, 2),
    }


def _build_generative(name: str, sizes: tuple[list[int], list[int]]) -> Any:
    """torchmetrics' metric of case ``name`` with ``reset_real_features=False`` (its extractor in float32)."""
    cls, kwargs, _ = _generative_cases()[name]
    if name == "KID every row":
        kwargs = {**kwargs, "subset_size": sum(sizes[1])}
    return cls(feature=Extractor(), reset_real_features=False, **kwargs)


def _sizes(layout: str, world: int, name: str) -> tuple[list[int], list[int]]:
    """Real and fake images per rank (KID "every row": as many real as fake images on each rank)."""
    real, fake = IMAGE_LAYOUTS[layout]
    return (fake if name == "KID every row" else real)[:world], fake[:world]


def _generative_images(layout: str, sizes: tuple[list[int], list[int]]) -> tuple[torch.Tensor, ...]:
    """Every rank's real images, fake images, and the fake images after the reset, concatenated."""
    real, fake = sum(sizes[0]), sum(sizes[1])
    return _images(real, layout, "real"), _images(fake, layout, "fake"), _images(fake, layout, "fake", "again")


def _chunks(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    if parts == 1:
        return [(lo, hi)] if hi > lo else []
    mid = (lo + hi) // 2
    return [(a, b) for a, b in ((lo, mid), (mid, hi)) if b > a]


def _seeded_compute(metric: Any) -> Any:
    torch.manual_seed(1234)  # KID's subsets: the same draws on every rank and in the reference
    return metric.compute()


def _generative_body(rank: int, world: int) -> dict:
    """Per (layout, case, how): the value before and after ``reset()`` (``how`` says whether the reset came
    between ``sync()`` and ``unsync()``); the bytes a ``compute`` sent and whether the extractor's mark survived."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    checks = Checks(f"W={world} rank {rank} ")
    out: dict = {}
    for layout in IMAGE_LAYOUTS:
        for name, (_, _, updates) in _generative_cases().items():
            sizes = _sizes(layout, world, name)
            real, fake, again = _generative_images(layout, sizes)
            for how in ("reset", "reset while synced"):
                metric = Synced(_build_generative(name, sizes))
                metric.to(torch.float64)  # through the adapter: the extractor's weights become float64
                checks.true(name, metric.metric.inception.linear.weight.dtype == F64, "extractor not cast")
                metric.set_dtype(F64)  # (the dtype a rank without images computes in)
                for images, real_ones, per_rank in ((real, True, sizes[0]), (fake, False, sizes[1])):
                    for a, b in _chunks(*bounds(per_rank, rank), updates):
                        metric.update(images[a:b], real=real_ones)
                metric.metric.inception.ballast[0] = rank  # a mark of this rank on the extractor
                sent: list[tuple[str, list[int]]] = []
                with record_collectives(sizes=sent):
                    before = _seeded_compute(metric)
                bytes_sent = sum(sum(b) for _, b in sent)
                mark = float(metric.metric.inception.ballast[0])
                if how == "reset while synced":
                    metric.sync()
                metric.reset()
                checks.true(name, not metric._is_synced, "synced after reset")
                for a, b in _chunks(*bounds(sizes[1], rank), updates):
                    metric.update(again[a:b], real=False)
                after = _seeded_compute(metric)
                out[(layout, name, how)] = {"before": before, "after": after, "bytes": bytes_sent, "mark": mark}
    return {"values": out, "failures": checks.failures}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_fid_family_equals_torchmetrics_on_every_image(world_size: int) -> None:
    """FID, KID (seeded subsets; one subset of every row) and MIFID: ``compute`` equals torchmetrics' class in one
    process on the concatenated images on every rank, the rank without images included; after ``reset()`` with
    ``reset_real_features=False`` and new fake images, it equals torchmetrics' after its own ``reset``; no
    ``compute`` sends the extractor (a 1 MiB buffer) and each rank's mark on it survives."""
    quiet_torchmetrics()
    results = run_distributed(_generative_body, world_size, timeout=240)
    checks = Checks(f"W={world_size} ")
    for layout in IMAGE_LAYOUTS:
        for name in _generative_cases():
            sizes = _sizes(layout, world_size, name)
            real, fake, again = _generative_images(layout, sizes)
            reference = _build_generative(name, sizes).to(torch.float64).set_dtype(F64)
            reference.update(real, real=True)
            reference.update(fake, real=False)
            before = _seeded_compute(reference)
            reference.reset()  # torchmetrics' own reset: keeps the real features
            reference.update(again, real=False)
            after = _seeded_compute(reference)
            for how in ("reset", "reset while synced"):
                for rank, res in enumerate(results):
                    got = res["values"][(layout, name, how)]
                    what = f"[{layout}] {name} {how} (rank {rank})"
                    checks.close(f"{what} compute", got["before"], before, atol=1e-12, rtol=1e-9)
                    checks.close(f"{what} compute after reset", got["after"], after, atol=1e-12, rtol=1e-9)
                    checks.true(what, got["bytes"] < BALLAST * 8 // 4, f"a compute sent {got['bytes']} bytes")
                    checks.true(what, got["mark"] == rank, f"the extractor's mark is {got['mark']}")
    assert_no_failures(checks.failures + [f for res in results for f in res["failures"]])


# ----------------------------------------------------------------------------------------- mean average precision
def _box_convert(boxes: torch.Tensor, in_fmt: str, out_fmt: str) -> torch.Tensor:
    """torchvision's ``box_convert`` for the conversions used here (``xyxy`` to ``xywh``, or none)."""
    if in_fmt == out_fmt:
        return boxes.clone()
    if (in_fmt, out_fmt) != ("xyxy", "xywh"):
        raise NotImplementedError(f"the stand-in converts xyxy to xywh only, not {in_fmt} to {out_fmt}")
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack((x1, y1, x2 - x1, y2 - y1), dim=-1)


@contextlib.contextmanager
def stand_in_box_convert() -> Iterator[type]:
    """``MeanAveragePrecision`` with a stand-in ``torchvision.ops.box_convert`` (torchvision cannot be imported
    beside the CPU torch here), put back as it was on exit; yields the class."""
    from torchmetrics.detection import mean_ap

    package = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    package.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    ops.__spec__ = importlib.machinery.ModuleSpec("torchvision.ops", None)
    ops.box_convert = _box_convert  # type: ignore[attr-defined]
    package.ops = ops  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("torchvision", "torchvision.ops")}
    # the flag its constructor checks (torchmetrics 1.3 names it after the version it needs)
    flags = {
        f: getattr(mean_ap, f)
        for f in ("_TORCHVISION_AVAILABLE", "_TORCHVISION_GREATER_EQUAL_0_8")
        if hasattr(mean_ap, f)
    }
    sys.modules.update({"torchvision": package, "torchvision.ops": ops})
    for flag in flags:
        setattr(mean_ap, flag, True)
    try:
        yield mean_ap.MeanAveragePrecision
    finally:
        for flag, value in flags.items():
            setattr(mean_ap, flag, value)
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _boxes(n: int, g: torch.Generator) -> torch.Tensor:
    corner = torch.rand(n, 2, generator=g) * 50
    return torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=g) * 25], dim=1)


def _detections(n: int, *parts: object, none: bool = False) -> tuple[list[dict], list[dict]]:
    """``n`` images (preds and targets), each seeded by its index: up to 3 objects of 3 classes, most of them
    detected (jittered), some missed, some false detections; every fifth image has no object, every fourth no
    detection. ``none``: no image has a detection."""
    preds, target = [], []
    for i in range(n):
        g = generator("detections", *parts, i)
        objects = 0 if i % 5 == 4 else int(torch.randint(1, 4, (1,), generator=g))
        boxes = _boxes(objects, g)
        labels = torch.randint(0, 3, (objects,), generator=g)
        target.append({"boxes": boxes, "labels": labels})
        found = torch.rand(objects, generator=g) < 0.75
        extra = int(torch.randint(0, 3, (1,), generator=g))
        det_boxes = torch.cat([boxes[found] + torch.randn(int(found.sum()), 4, generator=g), _boxes(extra, g)])
        det_labels = torch.cat([labels[found], torch.randint(0, 3, (extra,), generator=g)])
        if none or i % 4 == 3:
            det_boxes, det_labels = det_boxes[:0], det_labels[:0]
        scores = torch.rand(len(det_labels), generator=g)
        preds.append({"boxes": det_boxes, "scores": scores, "labels": det_labels})
    return preds, target


MAP_LAYOUTS = {"uneven": [4, 2, 3], "empty rank": [4, 0, 3], "no detection anywhere": [2, 1, 2]}


def _map_body(rank: int, world: int) -> dict:
    """Per layout: ``compute`` after two updates of this rank's images, a synced ``forward`` of them and
    ``compute`` after it; at W > 1, the collectives of four rounds of update and ``compute`` (and of synced
    ``forward``), and of torchmetrics' own sync (two images on every rank: it needs as many on each)."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    out: dict = {}
    with stand_in_box_convert() as MeanAveragePrecision:
        for layout, all_sizes in MAP_LAYOUTS.items():
            sizes = all_sizes[:world]
            preds, target = _detections(sum(sizes), layout, none=layout == "no detection anywhere")
            lo, hi = bounds(sizes, rank)
            metric = Synced(MeanAveragePrecision())
            for a, b in _chunks(lo, hi, 2):
                metric.update(preds[a:b], target[a:b])
            stepper = Synced(MeanAveragePrecision(), dist_sync_on_step=True)
            stepped = stepper(preds[lo:hi], target[lo:hi])
            out[layout] = (metric.compute(), stepped, stepper.compute())
        if world > 1:
            counts: dict[str, Any] = {"compute": [], "forward": [], "torchmetrics": []}
            metric = Synced(MeanAveragePrecision())
            stepper = Synced(MeanAveragePrecision(), dist_sync_on_step=True)
            for i in range(4):  # the lists grow: then three computes of the same states
                metric.update(*_detections(2 + rank + i, "counts", i, rank))
                counts["compute"].append([])
                for _ in range(3):
                    with record_collectives() as log:
                        metric.compute()
                    counts["compute"][-1].append(len(log))
                with record_collectives() as log:  # batches of the same size on each rank
                    stepper(*_detections(2 + rank, "steps", i, rank))
                counts["forward"].append(len(log))
            for n in (2, 4):  # torchmetrics' own sync (it needs as many images on every rank)
                theirs = MeanAveragePrecision()
                theirs.update(*_detections(n, "theirs", rank))
                with record_collectives() as log:
                    theirs.compute()
                counts["torchmetrics"].append(len(log))
            out["counts"] = counts
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_mean_average_precision_equals_torchmetrics_on_every_image(world_size: int) -> None:
    """``compute``, a synced ``forward`` and ``compute`` after it equal torchmetrics' ``MeanAveragePrecision`` in
    one process on every rank's images (the rank without images and the layout without detections included).

    Collectives (W = 2, 3): the first sync takes three (the call header, the agreement on the states' layout, the
    row); a ``compute`` whose lists grew takes two (the header, then the row, which outgrew the room or the
    header's inline area); a ``compute`` of states whose row fits takes one, as do synced ``forward`` calls of
    batches of one size in the steady state. torchmetrics' own sync takes 21 per image on each rank (3 for each
    of its 7 non-empty lists: 42 for two images, 84 for four), and needs as many images on every rank.
    """
    quiet_torchmetrics()
    results = run_distributed(_map_body, world_size, timeout=240)
    checks = Checks(f"W={world_size} ")
    with stand_in_box_convert() as MeanAveragePrecision:
        for layout, all_sizes in MAP_LAYOUTS.items():
            preds, target = _detections(sum(all_sizes[:world_size]), layout, none=layout == "no detection anywhere")
            reference = MeanAveragePrecision()
            reference.update(preds, target)
            expected = reference.compute()
            for rank, res in enumerate(results):
                for what, got in zip(("compute", "forward", "compute after forward"), res[layout]):
                    checks.close(f"[{layout}] {what} (rank {rank})", got, expected, atol=1e-7, rtol=1e-6)
    for rank, res in enumerate(results if world_size > 1 else ()):
        computes, forwards, theirs = res["counts"]["compute"], res["counts"]["forward"], res["counts"]["torchmetrics"]
        what = f"(rank {rank}) compute {computes}, forward {forwards}"
        checks.true(what, computes[0][0] == 3 and forwards[0] == 3, "a first sync is not the header, agreement, row")
        checks.true(what, all(n in (1, 2) for c in computes for n in c[1:]) and computes[0][1:] == [1, 1], "")
        checks.true(what, [c[-1] for c in computes] == [1] * 4 and forwards[-2:] == [1, 1], "no steady state of 1")
        checks.true(what, all(c[0] <= 2 for c in computes[1:]), "grown lists take more than two")
        checks.true(f"torchmetrics (rank {rank}) {theirs}", theirs == [42, 84], "not 21 per image")
    assert_no_failures(checks.failures)


# ---------------------------------------------------------------------------------------------- one process
class OwnReset(FrechetInceptionDistance):
    def reset(self) -> None:
        raise AssertionError("never called")


def test_segm_and_a_reset_overridden_again_are_refused() -> None:
    from torchmetrics_diff.wrappers import Synced

    with pytest.raises(TypeError, match=r"^Synced cannot adapt OwnReset: it overrides `reset`"):
        Synced(OwnReset, feature=Extractor())
    with stand_in_box_convert() as MeanAveragePrecision:
        for iou_type in ("segm", ("bbox", "segm")):
            with pytest.raises(TypeError, match=r"^Synced cannot adapt MeanAveragePrecision: iou_type='segm' is not"):
                Synced(MeanAveragePrecision, iou_type=iou_type)
        assert type(Synced(MeanAveragePrecision(iou_type="bbox"))).__name__ == "MeanAveragePrecision"


def test_device_moves_reach_the_extractor_and_the_states() -> None:
    """``.to(torch.float64)`` casts the extractor (an ``nn.Module`` rule) and leaves the states' dtypes;
    ``.to("meta")`` moves the extractor and every state; the registry never holds the extractor."""
    from torchmetrics_diff.wrappers import Synced

    for cls in (FrechetInceptionDistance, KernelInceptionDistance, MemorizationInformedFrechetInceptionDistance):
        metric = Synced(cls(feature=Extractor()))
        metric.to(torch.float64)
        assert metric.metric.inception.conv.weight.dtype == F64
        metric.update(_images(4, "move", "real"), real=True)
        dtypes = {n: [t.dtype for t in v] if isinstance(v, list) else v.dtype for n, v in metric.metric_state.items()}
        metric.to(torch.float32)
        assert metric.metric.inception.conv.weight.dtype == torch.float32
        assert {
            n: [t.dtype for t in v] if isinstance(v, list) else v.dtype for n, v in metric.metric_state.items()
        } == (dtypes)
        metric.to("meta")
        assert {p.device.type for p in metric.metric.inception.parameters()} == {"meta"}
        tensors = [t for v in metric.metric_state.values() for t in (v if isinstance(v, list) else [v])]
        assert tensors and {t.device.type for t in tensors} == {"meta"} and metric.device.type == "meta"
        assert set(metric._defaults) == set(metric.metric._defaults)  # the states, and nothing of the extractor


def test_mean_average_precision_moves_and_copies() -> None:
    """torchmetrics overrides ``_apply`` to keep its mask states (run-length encodings under ``"segm"``) out of
    device moves; with ``"bbox"`` the adapter's own move takes every list state, item by item: ``.to("meta")``
    moves them, ``.to(torch.float64)`` casts none, and a moved, pickled or copied metric computes the same."""
    from torchmetrics_diff.wrappers import Synced

    with stand_in_box_convert() as MeanAveragePrecision:
        preds, target = _detections(5, "moves")
        metric = Synced(MeanAveragePrecision())
        metric.update(preds[:3], target[:3])
        metric.update(preds[3:], target[3:])
        reference = MeanAveragePrecision()
        reference.update(preds, target)
        expected = reference.compute()
        metric.to(torch.float64).to("cpu")
        assert {t.dtype for t in metric.detection_box} == {torch.float32}
        for moved in (metric, copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))):
            torch.testing.assert_close(moved.compute(), expected)
        metric.to("meta")
        items = [t for name in metric._list_states for t in getattr(metric, name)]
        assert len(items) == 5 * 7 and {t.device.type for t in items} == {"meta"}  # 7 lists of 5 images (no masks)


def test_one_process_reset_forward_and_copies_follow_torchmetrics() -> None:
    """In one process: ``reset`` with ``reset_real_features=True`` empties everything and with ``False`` keeps the
    real features (as torchmetrics); ``forward`` of a batch of one kind raises as torchmetrics' does (its batch
    value needs real and fake images) and leaves the states as they were; a copy computes the same value."""
    from torchmetrics_diff.wrappers import Synced

    real, fake = _images(6, "one", "real"), _images(5, "one", "fake")
    for keep in (True, False):
        ours = Synced(FrechetInceptionDistance(feature=Extractor(), reset_real_features=not keep)).to(F64)
        theirs = FrechetInceptionDistance(feature=Extractor(), reset_real_features=not keep).to(F64)
        for metric in (ours, theirs):
            metric.update(real, real=True)
            metric.update(fake, real=False)
        torch.testing.assert_close(ours.compute(), theirs.compute())
        for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
            torch.testing.assert_close(copied.compute(), theirs.compute())
        with pytest.raises(RuntimeError, match="More than one sample is required"):
            ours(fake, real=False)
        assert int(ours.fake_features_num_samples) == 5 and ours.update_count == 2
        ours.reset()
        theirs.reset()
        assert int(ours.real_features_num_samples) == (6 if keep else 0)
        for name in ours._defaults:
            torch.testing.assert_close(getattr(ours, name), getattr(theirs, name))
    kid = Synced(KernelInceptionDistance(feature=Extractor(), reset_real_features=False, subset_size=3)).to(F64)
    kid.update(real, real=True)
    kept = list(kid.real_features)
    kid.reset()
    assert len(kid.real_features) == len(kept) == 1 and kid.real_features[0] is kept[0]
    assert kid.fake_features == [] and kid.update_count == 0


def test_adapted_metrics_given_one_extractor_share_it_in_a_collection() -> None:
    """FID, KID and MIFID adapted with the same ``feature=`` module in one of our collections hold its weights once
    (torchmetrics' ``FeatureShare`` cannot hold our metrics) and equal torchmetrics' metrics."""
    from torchmetrics_diff import MetricCollection
    from torchmetrics_diff.wrappers import Synced

    extractor = Extractor().to(F64)
    members = {
        "fid": FrechetInceptionDistance(feature=extractor),
        "kid": KernelInceptionDistance(feature=extractor, subsets=1, subset_size=5),
        "mifid": MemorizationInformedFrechetInceptionDistance(feature=extractor),
    }
    collection = MetricCollection({k: Synced(m) for k, m in members.items()})
    assert len(list(collection.parameters())) == len(list(extractor.parameters()))
    references = {
        "fid": FrechetInceptionDistance(feature=extractor),
        "kid": KernelInceptionDistance(feature=extractor, subsets=1, subset_size=5),
        "mifid": MemorizationInformedFrechetInceptionDistance(feature=extractor),
    }
    real, fake = _images(6, "shared", "real"), _images(5, "shared", "fake")
    for metric in (collection, *references.values()):
        metric.update(real, real=True)
        metric.update(fake, real=False)
    torch.manual_seed(0)
    values = collection.compute()
    for key, reference in references.items():
        torch.manual_seed(0)
        torch.testing.assert_close(values[key], reference.compute())  # (KID's: its (mean, std) tuple)


def test_set_dtype_keeps_integer_states_integer_through_updates_and_resets() -> None:
    """torchmetrics' ``set_dtype`` casts every default of its metric, integer ones too: the adapter declares no
    state anew for it, so FID's sample counts stay ``int64`` after an update and a reset (a rank that never
    updates after ``set_dtype`` then syncs the same dtypes as the others)."""
    from torchmetrics_diff.wrappers import Synced

    metric = Synced(FrechetInceptionDistance(feature=Extractor())).set_dtype(F64)
    metric.update(_images(3, "dtype", "real"), real=True)
    assert metric._defaults["real_features_num_samples"].dtype == torch.int64
    metric.reset()
    assert {n: v.dtype for n, v in metric.metric_state.items() if "num_samples" in n} == dict.fromkeys(
        ("real_features_num_samples", "fake_features_num_samples"), torch.int64
    )
