"""``Synced`` and torchmetrics' states: the form list states reach ``compute`` in, states declared inside
``update``, and batches without rows.

- list states: unsynced (one process), torchmetrics' ``compute`` sees the lists as torchmetrics' own metric holds
  them (one item per append), in ``forward``'s batch value too; synced (W = 2, 3, uneven ranks, a rank without
  rows), exactly what torchmetrics' own sync leaves (a ``cat`` list as one tensor, a ``None`` list item by item),
  recorded inside ``compute`` and compared with torchmetrics' own metric synced by torchmetrics on the same ranks;
  the values equal torchmetrics on the concatenated data in one process (ExtendedEditDistance, ROUGE, CatMetric,
  Spearman, binary AUROC, retrieval MAP, SSIM per image, a custom ``torch.cat`` reduction); and for every
  torchmetrics class with list states that builds here (about a hundred configurations), two emulated ranks leave
  the adapter's lists as torchmetrics' own sync leaves its metric's;
- states declared in ``update``: ``MeanIoU(num_classes=None, per_class=True)`` through several ``forward`` calls,
  ``update``, ``reset``, copies, in one process and synced at W = 2; a ``full_state_update`` metric that declares
  its state on the first batch (a step replays ``update`` on the accumulated states);
- batches without rows: SSIM refuses them, the adapter adds nothing (one process, and W = 3 with an empty rank:
  ``compute`` and a synced ``forward`` equal torchmetrics on the concatenated data, the empty rank's ``backward``
  runs).

References are torchmetrics' own metrics: in one process on the concatenated data, or synced by torchmetrics.

Package modules covered: ``wrappers.synced``, ``_state_sync`` (the item-by-item sync of a list state).
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Callable, NamedTuple

import pytest
import torch

from tests._helpers.adapter_cases import quiet_torchmetrics, value_cases
from tests._helpers.checks import Checks, assert_no_failures
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, generator, rand

tm = pytest.importorskip("torchmetrics")
from torchmetrics import aggregation, classification, image, regression, retrieval, text  # noqa: E402
from torchmetrics.utilities.data import dim_zero_cat  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


# ------------------------------------------------------------------------------------ recording what compute sees
SEEN: list[dict[str, Any]] = []  # what the recording classes' compute saw, in call order (per process)


def _kept(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return [_kept(v) for v in value] if isinstance(value, list) else value


def recording(cls: type) -> type:
    """``cls`` whose ``compute`` first records (copies of) the states it sees in :data:`SEEN`."""

    def compute(self: Any) -> Any:
        SEEN.append({name: _kept(getattr(self, name)) for name in self._defaults})
        return cls.compute(self)

    return type(cls.__name__, (cls,), {"compute": compute})


def _rows_by_torch_cat() -> Any:
    """A torchmetrics metric whose list state is reduced by a callable (``torch.cat``): torchmetrics hands it every
    rank's items and keeps its result (a tensor) as the state."""

    class RowsByTorchCat(tm.Metric):
        full_state_update = True  # (torchmetrics' forward cannot merge a callable list state by its reduction)

        def __init__(self) -> None:
            super().__init__()
            self.add_state("rows", [], dist_reduce_fx=torch.cat)

        def update(self, x: torch.Tensor) -> None:
            self.rows.append(x)

        def compute(self) -> torch.Tensor:
            return dim_zero_cat(self.rows).sort().values

    return RowsByTorchCat


# ------------------------------------------------------------------------------------------------ list-state cases
class ListCase(NamedTuple):
    """A torchmetrics class with list states, and its update arguments for ``rows`` rows (seeded by ``tag``)."""

    build: Callable[[], tuple[type, dict[str, Any]]]  # -> (class, constructor arguments)
    data: Callable[[int, str], tuple]
    own_sync: tuple[str, ...] = ("uneven",)  # the layouts torchmetrics' own sync copes with (compared with ours)
    sort: bool = False  # the value lists rows in torchmetrics' item-major gather order: compare it sorted


def _sentences(rows: int, tag: str) -> tuple:
    return value_cases()["WER"].rows(rows, tag)


def _floats(rows: int, tag: str) -> tuple:
    return (rand((rows,), tag, "x", dtype=torch.float32),)


def _pairs(rows: int, tag: str) -> tuple:
    return rand((rows,), tag, "preds", dtype=torch.float32), rand((rows,), tag, "target", dtype=torch.float32)


def _binary(rows: int, tag: str) -> tuple:
    g = generator(tag, "binary")
    return torch.rand(rows, generator=g), torch.randint(0, 2, (rows,), generator=g)


def _queries(rows: int, tag: str) -> tuple:
    g = generator(tag, "queries")
    preds, target = torch.rand(rows, generator=g), torch.randint(0, 2, (rows,), generator=g).bool()
    return preds, target, torch.randint(0, 3, (rows,), generator=g)


def _images(rows: int, tag: str) -> tuple:
    return tuple(t.float() for t in value_cases()["SSIM"].rows(rows, tag))


#: rows of each update, per rank: two updates of uneven sizes, the same on every rank, or none on rank 1
LAYOUTS: dict[str, Callable[[int], list[int]]] = {
    "uneven": lambda rank: [1 + rank, 2 + rank % 2],
    "even": lambda rank: [2, 1],
    "empty rank": lambda rank: [] if rank == 1 else [1 + rank, 2 + rank % 2],
}
# torchmetrics' own sync gathers a list item by item: a ``None`` list needs as many items on every rank (ROUGE's
# are its sentences: "even" only), a ``cat`` list gathers one tensor per rank (an empty rank sends a 1-D float one:
# only 1-D float states cope). The adapter syncs every layout.
LIST_CASES: dict[str, ListCase] = {
    "ExtendedEditDistance": ListCase(
        lambda: (text.ExtendedEditDistance, {}), _sentences, own_sync=("uneven", "empty rank")
    ),
    "ROUGEScore": ListCase(lambda: (text.ROUGEScore, {"rouge_keys": ("rouge1", "rougeL")}), _sentences, ("even",)),
    "CatMetric": ListCase(lambda: (aggregation.CatMetric, {}), _floats, own_sync=("uneven", "empty rank")),
    "SpearmanCorrCoef": ListCase(lambda: (regression.SpearmanCorrCoef, {}), _pairs, own_sync=("uneven", "empty rank")),
    "BinaryAUROC": ListCase(lambda: (classification.BinaryAUROC, {}), _binary),
    "RetrievalMAP": ListCase(lambda: (retrieval.RetrievalMAP, {}), _queries),
    "SSIM per image": ListCase(
        lambda: (image.StructuralSimilarityIndexMeasure, {"data_range": 1.0, "reduction": "none"}),
        _images,
        sort=True,
    ),
    "torch.cat reduction": ListCase(lambda: (_rows_by_torch_cat(), {}), _floats),
}


def _layouts(case: ListCase) -> list[str]:
    return ["uneven", "empty rank", *(["even"] if "even" in case.own_sync else [])]


def _own_sync(case: ListCase, layout: str) -> bool:
    """Whether torchmetrics' own sync copes with ``layout`` for ``case`` (before 1.4 or so, an empty rank gathers
    nothing while the others gather its list: torchmetrics' ``_sync_dist`` sends an empty tensor for it only
    where it sets ``_TORCH_GREATER_EQUAL_2_1``)."""
    if layout == "empty rank" and not getattr(aggregation.CatMetric(), "_TORCH_GREATER_EQUAL_2_1", False):
        return False
    return layout in case.own_sync


def _batches(name: str, case: ListCase, layout: str, rank: int) -> list[tuple]:
    return [case.data(rows, f"{name}/{layout}/{rank}/{i}") for i, rows in enumerate(LAYOUTS[layout](rank))]


def _flat_sorted(value: Any) -> Any:
    return value.flatten().sort().values if isinstance(value, torch.Tensor) else value


def test_unsynced_list_states_reach_compute_as_torchmetrics_holds_them() -> None:
    """One process (nothing syncs): every ``compute`` (two ``forward`` batch values, then the epoch's) sees the
    list states exactly as torchmetrics' own metric holds them, one item per append, and returns its value."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    checks = Checks()
    for name, case in LIST_CASES.items():
        cls, kwargs = case.build()
        record = recording(cls)
        batches = _batches(name, case, "uneven", 2)
        seen = {}
        values = {}
        for who, metric in (("theirs", record(**kwargs)), ("ours", Synced(record(**kwargs)))):
            SEEN.clear()
            values[who] = [metric(*batch) for batch in batches] + [metric.compute()]
            seen[who] = list(SEEN)
        checks.true(name, len(seen["ours"]) == len(seen["theirs"]) == 3, f"compute calls: {len(seen['ours'])}")
        for i, (ours, theirs) in enumerate(zip(seen["ours"], seen["theirs"])):
            for state, expected in theirs.items():
                checks.same(f"{name} compute {i} state {state}", ours[state], expected, exact=True)
        checks.close(f"{name} values", values["ours"], values["theirs"], atol=0, rtol=0)
    assert_no_failures(checks.failures)


#: constructor arguments tried in turn (the first set that builds a class is kept) ...
_ARGUMENTS: tuple[dict[str, Any], ...] = (
    {},
    {"num_classes": 3},
    {"num_labels": 3},
    {"task": "binary"},
    {"data_range": 1.0},
    {"mouth_map": [0, 1]},
    *({key: 0.5} for key in ("min_recall", "min_precision", "min_specificity", "min_sensitivity")),
    *(
        {key: 0.5, size: 3}
        for key in ("min_recall", "min_precision", "min_specificity", "min_sensitivity")
        for size in ("num_classes", "num_labels")
    ),
)
#: ... and the settings under which a class declares list states it has not by default
_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {
    "StructuralSimilarityIndexMeasure": ({"reduction": "none"}, {"return_full_image": True}),
    "MultiScaleStructuralSimilarityIndexMeasure": ({"reduction": "none"},),
    "PeakSignalNoiseRatio": ({"data_range": 1.0, "dim": 1},),
    "SpectralAngleMapper": ({"reduction": "none"},),
    "UniversalImageQualityIndex": ({"reduction": "none"},),
    "TranslationEditRate": ({"return_sentence_level_score": True},),
    "CHRFScore": ({"return_sentence_level_score": True},),
    "EditDistance": ({"reduction": "none"},),
    "ROUGEScore": ({"rouge_keys": ("rouge1", "rougeL")},),
}


def _list_state_metrics() -> dict[str, tuple[type, dict[str, Any]]]:
    """Every torchmetrics metric class (walking its modules) that builds here with list states, with the
    constructor arguments that build it; optional packages a class needs and the installation lacks leave it out."""
    import importlib
    import inspect
    import pkgutil

    found: dict[str, tuple[type, dict[str, Any]]] = {}
    for module in pkgutil.walk_packages(tm.__path__, "torchmetrics."):
        if ".functional" in module.name or ".utilities" in module.name:
            continue
        try:
            namespace = vars(importlib.import_module(module.name))
        except Exception:  # (a module that needs an optional package)
            continue
        for cls in namespace.values():
            if not (inspect.isclass(cls) and issubclass(cls, tm.Metric) and cls.__module__ == module.name):
                continue
            built = False
            for kwargs in (*_ARGUMENTS, *_VARIANTS.get(cls.__name__, ())):
                if built and kwargs not in _VARIANTS.get(cls.__name__, ()):
                    continue
                try:
                    metric = cls(**kwargs)
                except Exception:
                    continue
                built = True
                if any(isinstance(d, list) for d in metric._defaults.values()):
                    found[f"{cls.__qualname__}({kwargs})"] = (cls, kwargs)
    return found


def test_every_list_state_class_syncs_to_what_torchmetrics_own_sync_leaves() -> None:
    """Every torchmetrics class with list states (built with its defaults, or the fewest arguments it needs, and
    the settings that declare more): two emulated ranks (a gather returning this rank's tensor twice) leave the
    adapter's list states exactly as torchmetrics' own sync leaves its metric's; each list holds a 1-D and a 0-d
    item, the same in both."""
    from torchmetrics_diff.wrappers import Synced
    from torchmetrics_diff.wrappers.synced import _refusal

    quiet_torchmetrics()

    def gather(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        return [t, t.clone()]

    def every_rank() -> bool:
        return True

    checks = Checks()
    found = _list_state_metrics()
    checked = 0
    for name, (cls, kwargs) in found.items():
        theirs = cls(**kwargs)
        if _refusal(tm, type(theirs)) is not None:
            continue
        ours = Synced(cls(**kwargs), dist_sync_fn=gather, distributed_available_fn=every_rank)
        lists = [n for n, d in theirs._defaults.items() if isinstance(d, list)]
        items = {n: [torch.arange(3.0) + 10 * k, torch.tensor(7.0 + k)] for k, n in enumerate(lists)}
        for state, value in items.items():
            setattr(theirs, state, [v.clone() for v in value])
        ours._set_states({state: [v.clone() for v in value] for state, value in items.items()})
        theirs.sync(dist_sync_fn=gather, distributed_available=every_rank)
        ours.sync()
        for state in lists:
            checks.same(f"{name} synced {state}", getattr(ours, state), getattr(theirs, state), exact=True)
        checked += 1
    assert checked >= 40, f"only {checked} classes with list states found: {sorted(found)}"
    assert_no_failures(checks.failures)


def _forms_body(rank: int, world: int) -> dict:
    """Per (case, layout): what ``compute`` saw and returned for torchmetrics' own metric synced by torchmetrics
    and for the adapter synced by our engine, compared here; our value goes back for the one-process reference."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    checks = Checks(f"W={world} rank {rank} ")
    values: dict = {}
    for name, case in LIST_CASES.items():
        cls, kwargs = case.build()
        record = recording(cls)
        for layout in _layouts(case):
            batches = _batches(name, case, layout, rank)
            seen, got = {}, {}
            pair = (("theirs", record(**kwargs)), ("ours", Synced(record(**kwargs))))
            for who, metric in pair if _own_sync(case, layout) else pair[1:]:
                for batch in batches:
                    metric.update(*batch)
                SEEN.clear()
                got[who] = metric.compute()
                seen[who] = list(SEEN)
            what = f"[{layout}] {name}"
            values[(name, layout)] = got["ours"]
            if "theirs" not in got:
                continue
            if len(seen["ours"]) != 1 or len(seen["theirs"]) != 1:
                checks.fail(what, f"compute calls: ours {len(seen['ours'])}, theirs {len(seen['theirs'])}")
                continue
            for state, expected in seen["theirs"][0].items():
                checks.same(f"{what} synced state {state}", seen["ours"][0][state], expected, exact=True)
            checks.close(f"{what} value vs torchmetrics' own sync", got["ours"], got["theirs"], atol=0, rtol=0)
    return {"values": values, "failures": checks.failures}


@pytest.mark.parametrize("world_size", [2, 3])
def test_synced_list_states_reach_compute_as_torchmetrics_own_sync_leaves_them(world_size: int) -> None:
    """At W ranks (two uneven updates per rank; for ``cat`` lists of floats also a rank without any): the states
    torchmetrics' ``compute`` sees through the adapter are those torchmetrics' own sync gives it (type, items,
    shapes, dtypes, values, bit for bit), and the value equals torchmetrics in one process on every rank's data."""
    quiet_torchmetrics()
    results = run_distributed(_forms_body, world_size, timeout=240)
    checks = Checks(f"W={world_size} ")
    for name, case in LIST_CASES.items():
        cls, kwargs = case.build()
        for layout in _layouts(case):
            reference = cls(**kwargs)
            for rank in range(world_size):
                for batch in _batches(name, case, layout, rank):
                    reference.update(*batch)
            expected = reference.compute()
            for rank, res in enumerate(results):
                got = res["values"].get((name, layout))
                what = f"[{layout}] {name} (rank {rank}) vs one process"
                if case.sort:
                    got, expected = _flat_sorted(got), _flat_sorted(expected)
                checks.close(what, got, expected, atol=1e-6, rtol=1e-6)
    assert_no_failures(checks.failures + [f for res in results for f in res["failures"]])


# ------------------------------------------------------------------------------------ states declared in update
def _one_hot(rows: int, tag: str, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(tag, "segmentation")
    target = torch.randint(0, classes, (rows, 6, 6), generator=g)
    flip = torch.rand((rows, 6, 6), generator=g) < 0.4
    preds = torch.where(flip, torch.randint(0, classes, (rows, 6, 6), generator=g), target)
    as_maps = [torch.nn.functional.one_hot(t, classes).permute(0, 3, 1, 2) for t in (preds, target)]
    return as_maps[0], as_maps[1]


def _mean_iou() -> Any:
    """``MeanIoU(num_classes=None, per_class=True)`` (torchmetrics 1.3 has no segmentation domain: skip there)."""
    segmentation = pytest.importorskip("torchmetrics.segmentation")
    return segmentation.MeanIoU(num_classes=None, per_class=True)


def test_mean_iou_declaring_its_states_in_update_steps_like_torchmetrics() -> None:
    """``MeanIoU(num_classes=None, per_class=True)`` declares its per-class states on the first batch: several
    ``forward`` calls, ``update`` and ``compute`` equal torchmetrics' own metric; after ``reset``, a copy and a
    pickle round trip, the states keep their per-class declaration."""
    from torchmetrics_diff.wrappers import Synced

    ours, theirs = Synced(_mean_iou()), _mean_iou()
    for i in range(3):
        batch = _one_hot(2 + i, f"mean iou {i}")
        torch.testing.assert_close(ours(*batch), theirs(*batch), msg=f"forward {i}")
    batch = _one_hot(3, "mean iou update")
    ours.update(*batch)
    theirs.update(*batch)
    torch.testing.assert_close(ours.compute(), theirs.compute())
    assert ours._defaults["score"].shape == (5,) and ours._defaults["num_batches"].dtype == torch.int32
    assert not any(ours.metric._persistent.values())  # the inner metric saves nothing (the adapter does)
    ours.reset()
    theirs.reset()
    assert ours.score.shape == (5,)
    for metric in (ours, copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        again, reference = _one_hot(4, "mean iou after reset"), _mean_iou()
        reference.update(*_one_hot(1, "mean iou first"))  # (so that it declares its states)
        reference.reset()
        torch.testing.assert_close(metric(*again), reference(*again))
        torch.testing.assert_close(metric.compute(), reference.compute())


class _LazyHistogram(tm.Metric):
    """A ``full_state_update`` metric that declares its state on the first batch (classes counted from it)."""

    full_state_update = True

    def __init__(self) -> None:
        super().__init__()
        self.add_state("counts", torch.zeros(1), dist_reduce_fx="sum")
        self.classes: int | None = None

    def update(self, labels: torch.Tensor) -> None:
        if self.classes is None:
            self.classes = int(labels.max()) + 1
            self.add_state("counts", torch.zeros(self.classes), dist_reduce_fx="sum")
        self.counts += torch.bincount(labels, minlength=self.classes)[: self.classes].float()

    def compute(self) -> torch.Tensor:
        return self.counts / self.counts.sum()


def test_a_state_declared_in_update_of_a_full_state_update_metric() -> None:
    """A step replays ``update`` on the accumulated states: those start from the state's new declaration, as after
    torchmetrics' ``add_state``, so each step's value and the epoch's equal torchmetrics' own metric."""
    from torchmetrics_diff.wrappers import Synced

    ours, theirs = Synced(_LazyHistogram()), _LazyHistogram()
    for i, labels in enumerate(([0, 3, 3, 1], [2, 2, 0], [3])):
        batch = torch.tensor(labels)
        torch.testing.assert_close(ours(batch), theirs(batch), msg=f"forward {i}")
    torch.testing.assert_close(ours.compute(), theirs.compute())
    plain = Synced(_LazyHistogram())
    plain.update(torch.tensor([0, 3, 3, 1]))
    plain.update(torch.tensor([2, 2, 0]))
    plain.update(torch.tensor([3]))
    torch.testing.assert_close(plain.compute(), theirs.compute())


class _BadRedeclaration(tm.Metric):
    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self._defaults["total"] = {"not": "a tensor"}  # what torchmetrics' add_state refuses, sneaked in
        self.total = self.total + x.sum()

    def compute(self) -> torch.Tensor:
        return self.total


def test_a_state_redeclared_with_a_default_that_is_no_state_is_refused() -> None:
    from torchmetrics_diff.wrappers import Synced

    metric = Synced(_BadRedeclaration())
    with pytest.raises(TypeError, match=r"state 'total' has default \{'not': 'a tensor'\}; expected a tensor or an"):
        metric.update(torch.ones(2))


def _mean_iou_body(rank: int, world: int) -> dict:
    """Three synced steps of uneven batches (2 + rank + i rows), then ``compute``; and the same batches folded
    by ``update`` into an adapter that syncs at ``compute`` only."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    stepper, plain = Synced(_mean_iou(), dist_sync_on_step=True), Synced(_mean_iou())
    steps = []
    for i in range(3):
        batch = _one_hot(2 + rank + i, f"mean iou step {i} rank {rank}")
        steps.append(stepper(*batch))
        plain.update(*batch)
    return {"steps": steps, "compute": stepper.compute(), "plain": plain.compute()}


def test_mean_iou_declaring_its_states_in_update_syncs_at_two_ranks() -> None:
    """At two ranks, every synced step's value equals torchmetrics on both ranks' batches of that step, and
    ``compute`` (after the steps, and after plain updates) equals torchmetrics on all the batches."""
    _mean_iou()  # (skips where torchmetrics has no segmentation domain)
    results = run_distributed(_mean_iou_body, 2, timeout=240)
    epoch = _mean_iou()
    for i in range(3):
        step = _mean_iou()
        for rank in range(2):
            batch = _one_hot(2 + rank + i, f"mean iou step {i} rank {rank}")
            step.update(*batch)
            epoch.update(*batch)
        expected = step.compute()
        for rank, res in enumerate(results):
            torch.testing.assert_close(res["steps"][i], expected, msg=f"step {i} rank {rank}")
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["compute"], epoch.compute(), msg=f"compute after steps, rank {rank}")
        torch.testing.assert_close(res["plain"], epoch.compute(), msg=f"compute after updates, rank {rank}")


# --------------------------------------------------------------------------------------- batches without rows
def _ssim(**kwargs: Any) -> Any:
    return image.StructuralSimilarityIndexMeasure(data_range=1.0, **kwargs)


def test_an_empty_batch_that_torchmetrics_refuses_adds_nothing() -> None:
    """SSIM's update raises on a batch of zero rows: through the adapter the batch is a no-op (states unchanged,
    counted as an update); a batch that torchmetrics accepts (MeanIoU's, which declares its states from it) runs
    torchmetrics' update; a faulty batch with rows still raises."""
    from torchmetrics_diff.wrappers import Synced

    preds, target = _images(3, "empty batch")
    with pytest.raises(IndexError):
        _ssim().update(preds[:0], target[:0])  # (torchmetrics' own refusal)
    ours, theirs = Synced(_ssim()), _ssim()
    ours.update(preds, target)
    theirs.update(preds, target)
    before = {name: value.clone() for name, value in ours.metric_state.items()}
    ours.update(preds[:0], target=target[:0])
    assert ours.update_count == 2
    for name, value in ours.metric_state.items():
        assert torch.equal(value, before[name]), name
    torch.testing.assert_close(ours.compute(), theirs.compute())
    with pytest.raises(RuntimeError, match="same shape"):
        ours.update(preds, target[:, :, :8])
    assert ours.update_count == 2
    iou = Synced(_mean_iou())
    iou.update(*(t[:0] for t in _one_hot(2, "empty one-hot")))
    assert iou.score.shape == (5,)


def _ssim_body(rank: int, world: int, sizes: list[int]) -> dict:
    """This rank's rows of the global batch (none on an empty rank): ``compute`` after two updates, and a synced
    ``forward`` in float64 whose value is the loss: its value, whether it has a graph, the input's gradient."""
    from torchmetrics_diff.wrappers import Synced

    quiet_torchmetrics()
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    preds, target = value_cases()["SSIM"].rows(sum(sizes), "ssim empty rank")
    accumulated = Synced(_ssim()).set_dtype(F64)
    mid = (lo + hi) // 2
    accumulated.update(preds[lo:mid], target[lo:mid])
    accumulated.update(preds[mid:hi], target[mid:hi])
    stepper = Synced(_ssim(), dist_sync_on_step=True).set_dtype(F64)
    x = preds[lo:hi].clone().requires_grad_(True)
    value = stepper(x, target[lo:hi])
    has_graph = value.requires_grad
    if has_graph:
        value.backward()
    grad = x.grad if x.grad is not None else None
    return {
        "compute": accumulated.compute(),
        "value": value.detach(),
        "has_graph": has_graph,
        "grad": grad,
        "after": stepper.compute(),
    }


def test_ssim_with_an_empty_rank_equals_torchmetrics_on_the_concatenated_data() -> None:
    """Three ranks holding 3, 0 and 2 images: ``compute`` and a synced ``forward`` equal torchmetrics' SSIM on the
    five images on every rank; the empty rank's value has a graph and its ``backward`` runs (DDP needs every
    rank's), and each rank's input gradient is ``W`` times the reference's on its rows (``grad_reduction="mean"``,
    which DDP's averaging divides by ``W``)."""
    sizes = [3, 0, 2]
    results = run_distributed(_ssim_body, 3, sizes, timeout=240)
    preds, target = value_cases()["SSIM"].rows(sum(sizes), "ssim empty rank")
    reference = _ssim().set_dtype(F64)
    x = preds.clone().requires_grad_(True)
    expected = reference(x, target)
    expected.backward()
    checks = Checks("W=3 ")
    for rank, res in enumerate(results):
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        checks.close(f"rank {rank} compute", res["compute"], expected.detach(), atol=1e-12, rtol=1e-10)
        checks.close(f"rank {rank} forward", res["value"], expected.detach(), atol=1e-12, rtol=1e-10)
        checks.close(f"rank {rank} compute after forward", res["after"], expected.detach(), atol=1e-12, rtol=1e-10)
        checks.true(f"rank {rank}", res["has_graph"], "the synced forward's value has no graph")
        if res["has_graph"]:
            checks.true(f"rank {rank}", res["grad"] is not None, "no gradient reached the input")
            if res["grad"] is not None:
                checks.close(f"rank {rank} input grad", res["grad"] / 3, x.grad[lo:hi], atol=1e-12, rtol=1e-9)
    assert_no_failures(checks.failures)
