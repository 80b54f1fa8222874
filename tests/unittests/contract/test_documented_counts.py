"""Every collective count the documentation states, measured.

The documentation states counts in prose ("one collective", "three on the first step"). Each passage that does is
tied to the situations it describes by a marker just before it, invisible in the built pages::

    .. count: sync steady; CatMetric huge row sync 3

(``<!-- count: ... -->`` in Markdown; several keys separated by ``;``, continued on indented lines). A key is a
situation of :data:`SITUATIONS` (a call measured by :func:`_situations`, with the number of collectives the docs
state for it) or a named group of them (:data:`GROUPS`). The test runs every situation on real gloo ranks, counts
the collectives the package issues from the backend (``record_collectives``: every ``torch.distributed``
collective and point-to-point batch, the backend's captured flat gather and reduce-scatter, and the functional
collectives), and checks

- that each count of :data:`SITUATIONS` is the measured count (a change of the package that changes a count
  fails here, naming the situation);
- that every number a marked passage states ("<number> [more] collective(s)/all-gather(s)/...") is a count of one
  of its situations (or the difference of two: "two more"): a page whose number changed fails here, naming the
  passage; its wording may change freely;
- that every situation of the table is marked somewhere in the docs, and every marker names known situations;
- that every such number phrase on a page lies in a marked passage, or in one marked
  ``.. not a count: <reason>`` (a count of torchmetrics', an operation inside a larger call): a new count on a
  page needs a marker.

The package's own docstrings and comments that state counts (:data:`SOURCE_PASSAGES`) are still quoted here, word
for word: markers there are the package's to add.

Data are small and on the CPU: a sync's row fits the call header's first inline area (1536 bytes) unless the
situation says otherwise: a ``large row`` outgrows it and fits once the group's area has grown (from its second
sync on), a ``huge row`` is larger than the largest area (128 KiB).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests._helpers.adapter_cases import ADAPTER_STEADY, adapter_situations
from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------------------ situations
def _emb(g: torch.Generator, rows: int = 4, dim: int = 8) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(rows, dim, generator=g, dtype=torch.float64), dim=1)


def _situations(rank: int, world: int) -> dict[str, list[str]]:
    """Run every situation on this rank; return the collectives each issued (one name per call). At W = 3 only
    the losses run: the ring's counts depend on the world size, the gathering strategies' must not."""
    from tests._helpers.loss_cases import column_branch
    from tests._helpers.metrics import BigSum, ManySums
    from torchmetrics_diff import (
        AUROC,
        Accuracy,
        CatMetric,
        ConfusionMatrix,
        CrossModalRecallAtK,
        F1Score,
        MeanAbsoluteError,
        MeanMetric,
        MeanSquaredError,
        Metric,
        MetricCollection,
        PearsonCorrCoef,
        Precision,
        R2Score,
        Recall,
        SumMetric,
    )
    from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
    from torchmetrics_diff.losses import (
        BarlowTwinsLoss,
        CLIPLoss,
        DINOCenter,
        GlobalMeanLoss,
        InfoNCELoss,
        LoadBalancingLoss,
        RouterZLoss,
        SigLIPLoss,
        SupConLoss,
        TokenCrossEntropyLoss,
        VICRegLoss,
    )

    g = torch.Generator().manual_seed(100 + rank)
    calls: dict[str, list[str]] = {}

    def count(name: str, fn: Callable[[], Any]) -> Any:
        with record_collectives() as log:
            out = fn()
        calls[name] = list(log)
        return out

    if world == 2:  # the metrics' counts do not depend on the world size: W = 3 runs the losses only
        # --- the public collectives
        count("all_gather_cat", lambda: all_gather_cat(_emb(g, 2 + rank), grad="none"))
        count("gather_all_tensors", lambda: gather_all_tensors(_emb(g, 2 + rank), grad="none"))
        count("all_reduce", lambda: all_reduce(torch.ones(3, dtype=torch.float64), "sum", grad="none"))
        count("all_reduce huge", lambda: all_reduce(torch.ones(20_000, dtype=torch.float64), "sum", grad="none"))
        x = _emb(g, 2 + rank).requires_grad_(True)
        y = count("all_gather_cat grad=sync forward", lambda: all_gather_cat(x, grad="sync"))
        count("all_gather_cat grad=sync backward", lambda: y.square().sum().backward())

        # --- syncs of metrics (compute)
        def epochs(prefix: str, metric: Any, batch: Callable[[int], tuple], n: int = 3, reset: bool = True) -> None:
            for i in range(n):
                if reset:
                    metric.reset()
                metric.update(*batch(i))
                count(f"{prefix} sync {i + 1}", metric.compute)

        epochs("SumMetric", SumMetric(), lambda i: (torch.ones(4 + rank),))
        epochs("16 sum states", ManySums(16), lambda i: (torch.rand(16, generator=g, dtype=torch.float64),))
        epochs("CatMetric", CatMetric(), lambda i: (torch.rand(3 + rank, generator=g),))
        epochs("CatMetric large row", CatMetric(), lambda i: (torch.rand(600 + rank, generator=g),))
        epochs("CatMetric huge row", CatMetric(), lambda i: (torch.rand(33_000 + rank, generator=g),))
        epochs("CatMetric growing", CatMetric(), lambda i: (torch.rand(4 * (i + 1), generator=g),))
        # the states change between syncs: float32 rows, then float64 rows (another signature)
        changing = CatMetric()
        epochs("CatMetric dtype change", changing, lambda i: (torch.rand(3, generator=g, dtype=torch.float32),), 2)
        changing.reset()
        changing.update(torch.rand(3, generator=g, dtype=torch.float64))
        count("CatMetric dtype change sync 3 (changed)", changing.compute)
        # metadata longer than the first round's row
        epochs("400 sum states", ManySums(400), lambda i: (torch.rand(400, generator=g, dtype=torch.float64),), 2)
        epochs("large sum state", BigSum(20_000), lambda i: (torch.rand(20_000, generator=g, dtype=torch.float64),))
        epochs(
            "MeanMetric dist_sync_fn=gather_all_tensors",
            MeanMetric(dist_sync_fn=gather_all_tensors),
            lambda i: (torch.rand(5, generator=g, dtype=torch.float64),),
        )
        coll = MetricCollection(
            {"mean": MeanMetric(), "sum": SumMetric(), "cat": CatMetric(), "many": ManySums(8)}, compute_groups=False
        )
        epochs("collection of 4 metrics", coll, lambda i: (torch.rand(8, generator=g, dtype=torch.float64),))

        # classification, regression, retrieval as their pages describe them
        classes = 4
        cls = MetricCollection(
            {
                "acc": Accuracy(task="multiclass", num_classes=classes),
                "precision": Precision(task="multiclass", num_classes=classes, average="macro"),
                "recall": Recall(task="multiclass", num_classes=classes, average="macro"),
                "f1": F1Score(task="multiclass", num_classes=classes, average="macro"),
                "confmat": ConfusionMatrix(task="multiclass", num_classes=classes),
            }
        )
        epochs(
            "classification collection",
            cls,
            lambda i: (torch.randn(6, classes, generator=g), torch.randint(0, classes, (6,), generator=g)),
        )
        auroc = MetricCollection({"acc": Accuracy(task="binary"), "auroc": AUROC()})
        epochs(
            "collection with AUROC",
            auroc,
            lambda i: (torch.rand(6, generator=g), torch.randint(0, 2, (6,), generator=g)),
        )
        reg = MetricCollection(
            {"mse": MeanSquaredError(), "mae": MeanAbsoluteError(), "r2": R2Score(), "pearson": PearsonCorrCoef()}
        )
        epochs("regression collection", reg, lambda i: (torch.randn(6, generator=g), torch.randn(6, generator=g)))
        retrieval = CrossModalRecallAtK(top_k=(1,))
        epochs("retrieval", retrieval, lambda i: (_emb(g, 2, 4), _emb(g, 2, 4)))
        retrieval = CrossModalRecallAtK(top_k=(1,))
        epochs("retrieval large row", retrieval, lambda i: (_emb(g, 16, 32), _emb(g, 16, 32)))

        class ListCallable(Metric):  # a list state with a callable reduction (decisions.rst)
            full_state_update = False

            def __init__(self) -> None:
                super().__init__()
                self.add_state("rows", [], dist_reduce_fx=torch.cat)

            def update(self, x: torch.Tensor) -> None:
                self.rows.append(x)

            def compute(self) -> torch.Tensor:
                return torch.cat(self.rows) if isinstance(self.rows, list) else self.rows

        epochs("list state, callable reduction", ListCallable(), lambda i: (torch.rand(3, generator=g),))

        class Unreduced(Metric):  # a tensor state with a None reduction next to a sum state
            full_state_update = False

            def __init__(self) -> None:
                super().__init__()
                self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
                self.add_state("last", torch.zeros(2), dist_reduce_fx=None)

            def update(self, x: torch.Tensor) -> None:
                self.total = self.total + x.sum()
                self.last = x[:2].clone()

            def compute(self) -> torch.Tensor:
                return self.total

        epochs("None reduction", Unreduced(), lambda i: (torch.rand(3, generator=g),))

        class SixteenCats(Metric):  # the benchmark's 16 cat states of 137 x 8 floats (sync_engine.rst)
            full_state_update = False

            def __init__(self) -> None:
                super().__init__()
                for i in range(16):
                    self.add_state(f"c{i}", [], dist_reduce_fx="cat")

            def update(self, x: torch.Tensor) -> None:
                for i in range(16):
                    getattr(self, f"c{i}").append(x)

            def compute(self) -> int:
                return 0

        epochs("16 cat states of 137 x 8 floats", SixteenCats(), lambda i: (torch.rand(137, 8, generator=g),))

        # --- syncs in forward (dist_sync_on_step=True): the quickstart's token loss, the guide's global softmax
        mse = MeanSquaredError(dist_sync_on_step=True)
        for i in range(3):
            p = torch.randn(5, generator=g).requires_grad_(True)
            count(f"MeanSquaredError(dist_sync_on_step=True) forward {i + 1}", lambda p=p: mse(p, torch.zeros(5)))
        token_loss = MeanMetric(dist_sync_on_step=True)
        for i in range(3):
            v = torch.rand(6, generator=g, dtype=torch.float64).requires_grad_(True)
            mask = (torch.arange(6) % (2 + rank) != 0).to(torch.float64)
            out = count(
                f"MeanMetric(dist_sync_on_step=True) forward {i + 1}", lambda v=v, mask=mask: token_loss(v, weight=mask)
            )
            count(f"MeanMetric(dist_sync_on_step=True) backward {i + 1}", out.backward)

        class GlobalSoftmaxNLL(Metric):  # docs/examples/global_softmax_ddp.py
            is_differentiable = True
            full_state_update = False

            def __init__(self, **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self.add_state("scores", [], dist_reduce_fx="cat")
                self.add_state("positive", [], dist_reduce_fx="cat")
                self.add_state("n_positive", torch.tensor(0.0), dist_reduce_fx="sum")

            def update(self, scores: torch.Tensor, positive: torch.Tensor) -> None:
                self.scores.append(scores)
                self.positive.append(positive.to(scores.dtype))
                self.n_positive = self.n_positive + positive.sum()

            def compute(self) -> torch.Tensor:
                log_p = torch.log_softmax(torch.cat(self.scores), dim=0)
                return -(log_p * torch.cat(self.positive)).sum() / self.n_positive

        softmax = GlobalSoftmaxNLL(dist_sync_on_step=True)
        rows = [5, 0, 3][rank]
        for i in range(2):
            s = torch.randn(rows, generator=g, dtype=torch.float64).requires_grad_(True)
            p = torch.rand(rows, generator=g) > 0.5
            out = count(f"global softmax forward {i + 1}", lambda s=s, p=p: softmax(s, p))
            count(f"global softmax backward {i + 1}", out.backward)

    # --- the contrastive losses, per strategy: three steps of forward and backward
    def contrastive(name: str, loss: Any, args: Callable[[], tuple]) -> None:
        for i in range(3):
            a = args()
            out = count(f"{name} forward {i + 1}", lambda a=a: loss(*a))
            count(f"{name} backward {i + 1}", out.backward)

    def grad(t: torch.Tensor) -> torch.Tensor:
        return t.requires_grad_(True)

    def _views() -> torch.Tensor:
        return grad(torch.stack([_emb(g), _emb(g)], dim=1))

    for strategy in ("replicated", "sharded", "ring"):
        contrastive(f"CLIPLoss {strategy}", CLIPLoss(strategy=strategy), lambda: (grad(_emb(g)), grad(_emb(g)), 3.0))
        if strategy == "sharded":  # the column statistics' other branch (from 5 ranks and a 64 KiB table on)
            with column_branch("reductions"):
                contrastive(
                    "CLIPLoss sharded, column reductions",
                    CLIPLoss(strategy=strategy),
                    lambda: (grad(_emb(g)), grad(_emb(g)), 3.0),
                )
        contrastive(
            f"SigLIPLoss {strategy}", SigLIPLoss(strategy=strategy), lambda: (grad(_emb(g)), grad(_emb(g)), 3.0, -1.0)
        )
        contrastive(f"InfoNCELoss {strategy}", InfoNCELoss(strategy=strategy), lambda: (grad(_emb(g)), grad(_emb(g))))
        contrastive(f"SupConLoss {strategy} without labels", SupConLoss(strategy=strategy), lambda: (_views(),))
        contrastive(
            f"SupConLoss {strategy} with labels",
            SupConLoss(strategy=strategy),
            lambda: (_views(), torch.tensor([0, 1, 0, 1])),
        )
    contrastive("BarlowTwinsLoss", BarlowTwinsLoss(), lambda: (grad(_emb(g)), grad(_emb(g))))
    # statistics over the call header's largest inline area (128 KiB): D = 200 in float64
    contrastive("BarlowTwinsLoss D=200", BarlowTwinsLoss(), lambda: (grad(_emb(g, 3, 200)), grad(_emb(g, 3, 200))))
    contrastive("VICRegLoss", VICRegLoss(), lambda: (grad(_emb(g, 3 + rank)), grad(_emb(g, 3 + rank))))
    contrastive("VICRegLoss D=200", VICRegLoss(), lambda: (grad(_emb(g, 3, 200)), grad(_emb(g, 3, 200))))
    dino = DINOCenter(8)
    for i in range(3):
        count(f"DINOCenter update {i + 1}", lambda: dino.update(_emb(g, 2 * rank)))
    dino = DINOCenter(20_000)
    for i in range(3):
        count(f"DINOCenter D=20000 update {i + 1}", lambda: dino.update(_emb(g, 2, 20_000)))

    # --- the normalized losses: per call, and a block of gradient accumulation
    for name, build, args in (
        ("GlobalMeanLoss", GlobalMeanLoss, lambda: (grad(torch.rand(6, generator=g)),)),
        (
            "TokenCrossEntropyLoss",
            TokenCrossEntropyLoss,
            lambda: (grad(torch.randn(6, 5, generator=g)), torch.randint(0, 5, (6,), generator=g)),
        ),
    ):
        loss = build()
        contrastive(name, loss, args)
        batches = [args() for _ in range(2)]
        items = [b[-1] if name == "TokenCrossEntropyLoss" else torch.ones(6) for b in batches]
        for how, kwargs in (("items", {"items": items}), ("total=", {"total": 12.0 * world})):
            block = loss.accumulate(**kwargs)
            count(f"{name} accumulate({how}) enter", block.__enter__)
            for i, b in enumerate(batches):
                out = count(f"{name} accumulate({how}) forward {i + 1}", lambda b=b, loss=loss: loss(*b))
                out.backward()
            count(f"{name} accumulate({how}) exit", lambda block=block: block.__exit__(None, None, None))
        flat = loss.flat_accumulation([b[0] for b in batches])  # the micro-batches' sums; one finish per step
        acc = count(f"{name} flat_accumulation enter", flat.__enter__)
        for i, b in enumerate(batches):
            count(f"{name} flat_accumulation forward {i + 1}", lambda b=b, loss=loss: loss(*b)).backward()
        count(f"{name} flat_accumulation finish_step", acc.finish_step)
        count(f"{name} flat_accumulation exit", lambda flat=flat: flat.__exit__(None, None, None))

    # --- the MoE router losses: one layer and three layers in one call
    def router(layers: int) -> tuple:
        probs = grad(torch.randn(layers, 5, 4, generator=g, dtype=torch.float64)).softmax(-1)
        return probs, probs.detach().topk(2, dim=-1).indices

    for layers in (1, 3):
        contrastive(f"LoadBalancingLoss L={layers}", LoadBalancingLoss(4, 2), lambda layers=layers: router(layers))
    contrastive("RouterZLoss", RouterZLoss(), lambda: (grad(torch.randn(3, 5, 4, generator=g)),))
    if world == 2:
        _wrapper_situations(rank, g, count)
        adapter_situations(rank, count)

    # --- torchmetrics, for the pages' comparison
    import torchmetrics

    for name, build in (
        ("MeanMetric (2 scalar states)", torchmetrics.MeanMetric),
        ("CatMetric", torchmetrics.CatMetric),
    ):
        tm = build()
        tm.update(torch.rand(5, generator=g))
        count(f"torchmetrics {name} sync", tm.compute)
    return calls


def _wrapper_situations(rank: int, g: torch.Generator, count: Callable[[str, Callable[[], Any]], Any]) -> None:
    """The wrappers as docs/metrics/wrappers.rst describes them: three calls of each, the third the steady one."""
    from torchmetrics_diff import Accuracy, MeanMetric, MeanSquaredError, MetricCollection
    from torchmetrics_diff.wrappers import BootStrapper, ClasswiseWrapper, MetricTracker, MinMaxMetric, Running

    def mse(**kw: Any) -> Any:
        return MeanSquaredError(**kw).set_dtype(torch.float64)

    def pair() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(4 + rank, generator=g, dtype=torch.float64), torch.randn(4 + rank, generator=g)

    boot = BootStrapper(mse(dist_sync_on_step=True), num_bootstraps=8, generator=rank)
    tracker = MetricTracker(mse())
    running = Running(MeanMetric(dist_sync_on_step=True), window=4)
    acc = {"task": "multiclass", "num_classes": 3, "dist_sync_on_step": True}
    coll = MetricCollection(
        {
            "classwise": ClasswiseWrapper(Accuracy(average=None, **acc)),
            "minmax": MinMaxMetric(Accuracy(**acc)),
            "boot": BootStrapper(Accuracy(**acc), num_bootstraps=4, generator=rank),
            "acc": Accuracy(**acc),
        }
    )
    for i in range(1, 4):
        tracker.increment()
        for metric in (boot, tracker):
            metric.update(*pair())
        running.update(pair()[0])
        count(f"BootStrapper(8 copies) sync {i}", boot.compute)
        count(f"MetricTracker(epoch {i}) compute_all {i}", tracker.compute_all)
        count(f"Running(window 4) sync {i}", running.compute)
        count(f"BootStrapper(8 copies) forward {i}", lambda: boot(*pair()))
        batch = torch.randint(0, 3, (5,), generator=g), torch.randint(0, 3, (5,), generator=g)
        count(f"collection of wrappers forward {i}", lambda b=batch: coll(*b))
        count(f"collection of wrappers sync {i}", coll.compute)


_WRAPPERS = {
    "BootStrapper(8 copies) sync 3": 1,
    "MetricTracker(epoch 3) compute_all 3": 1,
    "Running(window 4) sync 3": 1,
    "BootStrapper(8 copies) forward 3": 1,
    "collection of wrappers forward 3": 1,
    "collection of wrappers sync 3": 1,
}


def _steps(loss: str, n: int) -> dict[str, int]:
    """Forward + backward of the first and the third step of ``loss`` (the same count at every step)."""
    return {f"{loss} forward {i} + {loss} backward {i}": n for i in (1, 3)}


def _each(situation: str, n: Any, steps: tuple[int, ...] = (1, 3)) -> dict[str, Any]:
    """``situation`` ("... forward {}") at the first and the third call."""
    return {situation.format(i): n for i in steps}


_TORCHMETRICS = {"torchmetrics CatMetric sync": 3, "torchmetrics MeanMetric (2 scalar states) sync": 4}
_SMALL_STEADY = {"SumMetric sync 3": 1, "16 sum states sync 3": 1, "CatMetric sync 3": 1}
_FIRST = {"SumMetric sync 1": 3, "CatMetric sync 1": 3, "collection of 4 metrics sync 1": 3}
_LARGE_ROW = {"CatMetric large row sync 3": 1, "16 cat states of 137 x 8 floats sync 3": 1, "400 sum states sync 2": 1}
_HUGE_ROW = {"CatMetric huge row sync 3": 2, "CatMetric huge row sync 2": 2}
_CHANGE = {"CatMetric dtype change sync 2": 1, "CatMetric dtype change sync 3 (changed)": 3}
_OUTGROWN = {"CatMetric growing sync 3": 2}
_DSOS = {"MeanMetric(dist_sync_on_step=True) forward 1": 3, "MeanMetric(dist_sync_on_step=True) forward 3": 1}
_NORMALIZED = {
    **_each("GlobalMeanLoss forward {}", 1),
    **_each("TokenCrossEntropyLoss forward {}", 1),
    **_each("GlobalMeanLoss forward {} [all_reduce]", 0),
    **_each("TokenCrossEntropyLoss backward {}", 0),
    **_each("GlobalMeanLoss backward {}", 0),
}
_GATHERING = ("CLIPLoss", "SigLIPLoss", "InfoNCELoss")


def _ring_forward(loss: str, w: int) -> int:
    """The ring's forward: the plan's header exchange, W - 1 block batches (CLIP: and W of column statistics),
    one all-reduce of the value."""
    return 1 + (w - 1) + (w if loss == "CLIPLoss" else 0) + 1


# ------------------------------------------------------------------------------------------ the documented counts
#: Each measured situation and the number of collectives the docs state for it (a function of the world size where
#: it depends on it). ``"A + B"`` is the sum of two situations (a step: forward and backward); ``"A [name]"``
#: counts only the calls of that name (``_all_gather_flat`` is the header exchange or a gather, ``all_reduce``,
#: ``_reduce_scatter_flat``, ``batch_isend_irecv`` one batch of the ring's point-to-point); ``"A per state"`` is
#: the count of ``A`` per state of its metric (two states).
SITUATIONS: dict[str, Any] = {
    "collection of 4 metrics sync 3": 1,
    "BootStrapper(8 copies) sync 3": 1,
    "Running(window 4) sync 3": 1,
    "collection of wrappers sync 3": 1,
    "classification collection sync 3": 1,
    "MeanMetric(dist_sync_on_step=True) backward 1": 0,
    "MeanMetric(dist_sync_on_step=True) backward 3": 0,
    "None reduction sync 3": 1,
    "400 sum states sync 1": 3,
    "CatMetric sync 3": 1,
    "16 sum states sync 3": 1,
    "SumMetric sync 3": 1,
    "400 sum states sync 2": 1,
    "large sum state sync 3": 2,
    "large sum state sync 3 [all_reduce]": 1,
    "collection of 4 metrics sync 1": 3,
    # two states: two collectives per state
    "MeanMetric dist_sync_fn=gather_all_tensors sync 3 per state": 2,
    "torchmetrics CatMetric sync": 3,
    "16 cat states of 137 x 8 floats sync 2": 2,
    "16 cat states of 137 x 8 floats sync 3": 1,
    "list state, callable reduction sync 3": 1,
    "CatMetric large row sync 2": 2,
    "CatMetric large row sync 3": 1,
    "global softmax forward 1": 3,
    "global softmax forward 2": 1,
    "global softmax backward 1": 0,
    "global softmax backward 2": 0,
    "all_gather_cat": 2,
    "gather_all_tensors": 2,
    "all_gather_cat grad=sync forward": 2,
    "all_reduce": 1,
    "all_reduce huge": 2,
    "regression collection sync 3": 1,
    "classification collection sync 1": 3,
    "collection with AUROC sync 3": 1,
    "retrieval sync 3": 1,
    "retrieval large row sync 3": 1,
    "retrieval sync 1": 3,
    "TokenCrossEntropyLoss backward 1": 0,
    "TokenCrossEntropyLoss backward 3": 0,
    "GlobalMeanLoss backward 1": 0,
    "GlobalMeanLoss backward 3": 0,
    "GlobalMeanLoss forward 3": 1,
    "GlobalMeanLoss accumulate(items) enter": 1,
    "GlobalMeanLoss accumulate(items) exit": 2,
    "TokenCrossEntropyLoss accumulate(items) enter": 1,
    "TokenCrossEntropyLoss accumulate(items) exit": 2,
    "TokenCrossEntropyLoss accumulate(total=) enter": 0,
    "TokenCrossEntropyLoss accumulate(total=) exit": 0,
    "TokenCrossEntropyLoss accumulate(items) forward 2": 1,
    "TokenCrossEntropyLoss flat_accumulation enter": 0,
    "TokenCrossEntropyLoss flat_accumulation forward 1": 0,
    "TokenCrossEntropyLoss flat_accumulation forward 2": 0,
    "TokenCrossEntropyLoss flat_accumulation finish_step": 1,
    "TokenCrossEntropyLoss flat_accumulation exit": 1,
    "BarlowTwinsLoss forward 1": 1,
    "BarlowTwinsLoss forward 3": 1,
    "BarlowTwinsLoss forward 1 [all_reduce]": 0,
    "BarlowTwinsLoss forward 3 [all_reduce]": 0,
    "BarlowTwinsLoss D=200 forward 1": 2,
    "BarlowTwinsLoss D=200 forward 3": 2,
    "BarlowTwinsLoss D=200 forward 1 [all_reduce]": 1,
    "BarlowTwinsLoss D=200 forward 3 [all_reduce]": 1,
    "BarlowTwinsLoss backward 1": 0,
    "BarlowTwinsLoss backward 3": 0,
    "VICRegLoss forward 1": 1,
    "VICRegLoss forward 3": 1,
    "VICRegLoss forward 1 [all_reduce]": 0,
    "VICRegLoss forward 3 [all_reduce]": 0,
    "VICRegLoss D=200 forward 1": 2,
    "VICRegLoss D=200 forward 3": 2,
    "VICRegLoss D=200 forward 1 [all_reduce]": 1,
    "VICRegLoss D=200 forward 3 [all_reduce]": 1,
    "VICRegLoss backward 1": 0,
    "VICRegLoss backward 3": 0,
    "DINOCenter update 1": 1,
    "DINOCenter update 3": 1,
    "DINOCenter update 1 [all_reduce]": 0,
    "DINOCenter update 3 [all_reduce]": 0,
    "DINOCenter D=20000 update 1": 2,
    "DINOCenter D=20000 update 3": 2,
    "DINOCenter D=20000 update 1 [all_reduce]": 1,
    "DINOCenter D=20000 update 3 [all_reduce]": 1,
    "CLIPLoss sharded forward 3": 4,
    "InfoNCELoss sharded forward 3": 3,
    "CLIPLoss sharded, column reductions forward 3": 5,
    "CLIPLoss sharded, column reductions forward 3 [all_reduce]": 3,
    "CLIPLoss sharded, column reductions forward 3 [_all_gather_flat]": 2,
    "CLIPLoss sharded, column reductions backward 3": 1,
    "CLIPLoss sharded backward 3": 1,
    "CLIPLoss sharded backward 3 [_reduce_scatter_flat]": 1,
    "InfoNCELoss replicated forward 3": 2,
    "InfoNCELoss ring forward 3": lambda w: _ring_forward("InfoNCELoss", w),
    "SupConLoss replicated with labels forward 3": 5,
    "SupConLoss sharded with labels forward 3": 6,
    "SupConLoss ring with labels forward 3": lambda w: _ring_forward("InfoNCELoss", w) + 2,
    "SupConLoss replicated without labels forward 3": 3,
    "SupConLoss sharded without labels forward 3": 4,
    "SupConLoss ring without labels forward 3": lambda w: _ring_forward("InfoNCELoss", w),
    "SigLIPLoss sharded forward 3": 3,
    "CLIPLoss sharded forward 3 [all_reduce]": 1,
    "SigLIPLoss sharded forward 3 [all_reduce]": 1,
    "InfoNCELoss sharded forward 3 [all_reduce]": 1,
    "SigLIPLoss sharded backward 3 [_reduce_scatter_flat]": 1,
    "InfoNCELoss sharded backward 3 [_reduce_scatter_flat]": 1,
    "CLIPLoss replicated forward 1": 2,
    "CLIPLoss replicated forward 3": 2,
    "SigLIPLoss replicated forward 1": 2,
    "SigLIPLoss replicated forward 3": 2,
    "InfoNCELoss replicated forward 1": 2,
    "SigLIPLoss sharded forward 1": 3,
    "InfoNCELoss sharded forward 1": 3,
    "CLIPLoss replicated backward 3": 0,
    "SigLIPLoss replicated backward 3": 0,
    "InfoNCELoss replicated backward 3": 0,
    "SigLIPLoss sharded backward 3": 1,
    "InfoNCELoss sharded backward 3": 1,
    "CLIPLoss sharded, column reductions forward 1 + CLIPLoss sharded, column reductions backward 1": 6,
    "CLIPLoss sharded, column reductions forward 3 + CLIPLoss sharded, column reductions backward 3": 6,
    "InfoNCELoss replicated forward 1 + InfoNCELoss replicated backward 1": 2,
    "InfoNCELoss replicated forward 3 + InfoNCELoss replicated backward 3": 2,
    "SigLIPLoss replicated forward 1 + SigLIPLoss replicated backward 1": 2,
    "SigLIPLoss replicated forward 3 + SigLIPLoss replicated backward 3": 2,
    "CLIPLoss replicated forward 1 + CLIPLoss replicated backward 1": 2,
    "CLIPLoss replicated forward 3 + CLIPLoss replicated backward 3": 2,
    "InfoNCELoss sharded forward 1 + InfoNCELoss sharded backward 1": 4,
    "InfoNCELoss sharded forward 3 + InfoNCELoss sharded backward 3": 4,
    "SigLIPLoss sharded forward 1 + SigLIPLoss sharded backward 1": 4,
    "SigLIPLoss sharded forward 3 + SigLIPLoss sharded backward 3": 4,
    "CLIPLoss sharded forward 1 + CLIPLoss sharded backward 1": 5,
    "CLIPLoss sharded forward 3 + CLIPLoss sharded backward 3": 5,
    "CLIPLoss ring forward 1 [all_reduce]": 1,
    "CLIPLoss ring forward 3 [all_reduce]": 1,
    "SigLIPLoss ring forward 1 [all_reduce]": 1,
    "SigLIPLoss ring forward 3 [all_reduce]": 1,
    "InfoNCELoss ring forward 1 [all_reduce]": 1,
    "InfoNCELoss ring forward 3 [all_reduce]": 1,
    "CLIPLoss ring backward 3 [all_reduce]": 0,
    "SigLIPLoss ring backward 3 [all_reduce]": 0,
    "InfoNCELoss ring backward 3 [all_reduce]": 0,
    "CLIPLoss ring forward 1 [_all_gather_flat]": 1,
    "CLIPLoss ring forward 3 [_all_gather_flat]": 1,
    "SigLIPLoss ring forward 1 [_all_gather_flat]": 1,
    "SigLIPLoss ring forward 3 [_all_gather_flat]": 1,
    "InfoNCELoss ring forward 1 [_all_gather_flat]": 1,
    "InfoNCELoss ring forward 3 [_all_gather_flat]": 1,
    "SupConLoss ring with labels forward 3 [_all_gather_flat]": 3,
    "SigLIPLoss ring forward 3 [batch_isend_irecv]": lambda w: w - 1,
    "InfoNCELoss ring forward 3 [batch_isend_irecv]": lambda w: w - 1,
    "CLIPLoss ring forward 3 [batch_isend_irecv]": lambda w: (w - 1) + w,
    "CLIPLoss ring forward 3": lambda w: _ring_forward("CLIPLoss", w),
    "SigLIPLoss ring forward 3": lambda w: _ring_forward("SigLIPLoss", w),
    "CLIPLoss ring backward 3": lambda w: (w - 1) + w,
    "SigLIPLoss ring backward 3": lambda w: (w - 1) + w,
    "InfoNCELoss ring backward 3": lambda w: (w - 1) + w,
    "SupConLoss ring with labels backward 3": lambda w: (w - 1) + w,
    "LoadBalancingLoss L=1 forward 1": 1,
    "LoadBalancingLoss L=1 forward 3": 1,
    "LoadBalancingLoss L=3 forward 1": 1,
    "LoadBalancingLoss L=3 forward 3": 1,
    "LoadBalancingLoss L=1 forward 1 [all_reduce]": 0,
    "LoadBalancingLoss L=1 forward 3 [all_reduce]": 0,
    "LoadBalancingLoss L=3 forward 1 [all_reduce]": 0,
    "LoadBalancingLoss L=3 forward 3 [all_reduce]": 0,
    "LoadBalancingLoss L=1 backward 1": 0,
    "LoadBalancingLoss L=1 backward 3": 0,
    "LoadBalancingLoss L=3 backward 1": 0,
    "LoadBalancingLoss L=3 backward 3": 0,
    "RouterZLoss forward 1": 1,
    "RouterZLoss forward 3": 1,
    "RouterZLoss forward 1 [all_reduce]": 0,
    "RouterZLoss forward 3 [all_reduce]": 0,
    "SumMetric sync 1": 3,
    "MeanSquaredError(dist_sync_on_step=True) forward 3": 1,
    "BootStrapper(8 copies) forward 3": 1,
    "collection of wrappers forward 3": 1,
}

#: Named groups of situations, for the passages that describe a whole kind of call.
GROUPS: dict[str, dict[str, Any]] = {
    "torchmetrics per state": _TORCHMETRICS,
    "sync steady": _SMALL_STEADY,
    "sync first": _FIRST,
    "sync large row": _LARGE_ROW,
    "sync huge row": _HUGE_ROW,
    "sync signature change": _CHANGE,
    "sync outgrown": _OUTGROWN,
    "forward dist_sync_on_step": _DSOS,
    "normalized losses": _NORMALIZED,
    "wrappers steady": _WRAPPERS,
    "adapter steady": ADAPTER_STEADY,
}

#: Passages of the package's sources (docstrings, comments), quoted, with the keys they state.
SOURCE_PASSAGES: list[tuple[str, str, list[str]]] = [
    (
        "torchmetrics_diff/distributed/_sync/engine.py",
        "So a sync of small CPU states costs one collective",
        ["sync steady", "sync first"],
    ),
    (
        "torchmetrics_diff/distributed/_sync/plan.py",
        "a fresh plan costs two collectives more.",
        ["SumMetric sync 1", "SumMetric sync 3"],
    ),
    (
        "torchmetrics_diff/classification/__init__.py",
        "(one collective for a whole collection)",
        ["classification collection sync 3"],
    ),
    (
        "torchmetrics_diff/regression/metrics.py",
        "one collective per step (every state is a ``sum``",
        ["MeanSquaredError(dist_sync_on_step=True) forward 3"],
    ),
]


def _counts_of(key: str) -> dict[str, Any]:
    """The situations (and their documented counts) a marker key stands for."""
    if key in GROUPS:
        return GROUPS[key]
    return {key: SITUATIONS[key]}


def _all_situations() -> dict[str, Any]:
    every = dict(SITUATIONS)
    for group in GROUPS.values():
        for name, count in group.items():
            assert every.setdefault(name, count) == count or callable(count), f"{name}: two documented counts"
    return every


# ------------------------------------------------------------------------------------------------ the markers
_COUNT_WORDS = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+)"
_COLLECTIVE_WORDS = r"(?:collectives?|all-gathers?|all-reduces?|all_reduces?|reduce-scatters?|gathers?)"
STATED_COUNT = re.compile(rf"\b({_COUNT_WORDS})(\s+more)?\s+{_COLLECTIVE_WORDS}\b", re.IGNORECASE)
_NUMBERS = {
    w: i for i, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"])
}
_RST_MARKER = re.compile(r"^(?P<indent> *)\.\. (?P<kind>count|not a count): ?(?P<body>.*)$")
_MD_MARKER = re.compile(r"^<!-- (?P<kind>count|not a count): (?P<body>.*?) -->$")

ROOT = Path(__file__).resolve().parents[3]


def _pages() -> list[str]:
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.parts)
    return ["README.md", *docs]


class Passage:
    """A marked passage: its page and line, the marker's keys (or its reason), and its text."""

    def __init__(self, page: str, line: int, kind: str, body: str, text: str) -> None:
        self.page, self.line, self.kind, self.text = page, line, kind, text
        self.keys = [k.strip() for k in body.split(";") if k.strip()] if kind == "count" else []
        self.reason = body if kind == "not a count" else ""

    def __repr__(self) -> str:
        return f"{self.page}:{self.line}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def passages(page: str) -> tuple[list[Passage], list[tuple[int, int]]]:
    """The marked passages of ``page`` and the character spans they cover.

    A marker covers the block that follows it: up to the first blank line after which a line is indented no
    deeper than the marker (a paragraph, a list item, a whole list-table).
    """
    raw = (ROOT / page).read_text(encoding="utf-8")
    lines = raw.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    found, spans = [], []
    i = 0
    while i < len(lines):
        m = (_MD_MARKER if page.endswith(".md") else _RST_MARKER).match(lines[i])
        if m is None:
            i += 1
            continue
        indent = len(m.groupdict().get("indent") or "")
        body, j = m["body"], i + 1
        while not page.endswith(".md") and j < len(lines) and lines[j].strip() and _indent(lines[j]) > indent:
            body += " " + lines[j].strip()  # the marker's continuation lines
            j += 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        start, end, seen_blank = j, j, False
        while end < len(lines):
            line = lines[end]
            if not line.strip():
                seen_blank = True
            elif (seen_blank and _indent(line) <= indent) or (
                page.endswith(".md") and (_MD_MARKER.match(line) or line.startswith("#"))
            ):
                break
            end += 1
        text = raw[offsets[start] : offsets[end]]
        found.append(Passage(page, start + 1, m["kind"], body, text))
        spans.append((offsets[start], offsets[end]))
        i = end
    return found, spans


def _every_passage() -> list[Passage]:
    return [p for page in _pages() for p in passages(page)[0]]


def _allowed(counts: dict[str, Any]) -> set[int]:
    """The numbers a passage about these situations may state: their counts at W = 2 and 3, and differences."""
    values = set()
    for count in counts.values():
        values |= {count(2), count(3)} if callable(count) else {count}
    return values | {a - b for a in values for b in values if a > b}


# ----------------------------------------------------------------------------------------------------- tests
def test_every_marker_names_known_situations() -> None:
    unknown = [f"{p}: {k!r}" for p in _every_passage() for k in p.keys if k not in GROUPS and k not in SITUATIONS]
    assert not unknown, "markers naming no situation of SITUATIONS or GROUPS:\n" + "\n".join(unknown)
    empty = [repr(p) for p in _every_passage() if p.kind == "count" and not p.keys]
    assert not empty, f"count markers without a key: {empty}"


def test_every_situation_is_documented() -> None:
    """Every situation of the table is named by a marker (directly or through a group) or a source passage."""
    named = set()
    for key in [k for p in _every_passage() for k in p.keys] + [k for _, _, ks in SOURCE_PASSAGES for k in ks]:
        named |= set(_counts_of(key)) | {key}
    missing = sorted(set(SITUATIONS) - named) + sorted(set(GROUPS) - named)
    assert not missing, "situations no page states (mark the passage, or drop them from SITUATIONS):\n" + "\n".join(
        missing
    )


def test_every_stated_number_is_a_count_of_its_situations() -> None:
    """Each "<number> collective(s)" of a marked passage is a documented count of one of the passage's situations
    (or the difference of two, for "N more"); a passage whose numbers disagree with the table fails."""
    wrong = []
    for passage in _every_passage():
        if passage.kind != "count" or any(k not in GROUPS and k not in SITUATIONS for k in passage.keys):
            continue
        counts: dict[str, Any] = {}
        for key in passage.keys:
            counts.update(_counts_of(key))
        allowed = _allowed(counts)
        for hit in STATED_COUNT.finditer(passage.text):
            word = hit.group(1).lower()
            number = int(word) if word.isdigit() else _NUMBERS[word]
            if number not in allowed:
                wrong.append(
                    f"{passage}: {' '.join(hit.group(0).split())!r} but its situations count {sorted(allowed)}"
                )
    assert not wrong, "numbers the marked situations do not have:\n" + "\n".join(wrong)


def test_every_stated_count_is_marked() -> None:
    """Every "<number> collective(s)/all-gather(s)/..." on a page lies in a passage marked ``count`` or ``not a
    count``."""
    unmarked = []
    for page in _pages():
        raw = (ROOT / page).read_text(encoding="utf-8")
        _, spans = passages(page)
        for hit in STATED_COUNT.finditer(raw):
            if not any(a <= hit.start() and hit.end() <= b for a, b in spans):
                line = raw.count("\n", 0, hit.start()) + 1
                unmarked.append(f"{page}:{line}: {' '.join(hit.group(0).split())!r}")
    assert not unmarked, "counts of collectives no marker ties to a situation (add `.. count: <key>`):\n" + "\n".join(
        unmarked
    )


def test_not_a_count_markers_say_why() -> None:
    bare = [repr(p) for p in _every_passage() if p.kind == "not a count" and not p.reason.strip()]
    assert not bare, f"`not a count` markers without a reason: {bare}"


@pytest.mark.parametrize(
    ("page", "text", "keys"), SOURCE_PASSAGES, ids=[f"{p}: {t[:40]}" for p, t, _ in SOURCE_PASSAGES]
)
def test_the_source_passage_is_in_its_file(page: str, text: str, keys: list[str]) -> None:
    """The package's own statements of counts, quoted (see the module docstring)."""
    body = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert " ".join(text.split()) in body, f"{page} no longer says {text!r}: update SOURCE_PASSAGES"
    allowed = _allowed({n: c for k in keys for n, c in _counts_of(k).items()})
    for hit in STATED_COUNT.finditer(text):
        word = hit.group(1).lower()
        assert (int(word) if word.isdigit() else _NUMBERS[word]) in allowed, (page, hit.group(0), allowed)


def test_a_wrong_number_in_a_marked_passage_is_caught() -> None:
    """The check reads the numbers, not the words: "two collectives" where the situation counts one fails."""
    allowed = _allowed(_counts_of("sync steady"))
    assert 1 in allowed and 2 not in allowed
    text = "so on CPU/gloo a small sync is still **two collectives**"
    assert [int(_NUMBERS[h.group(1)]) for h in STATED_COUNT.finditer(text)] == [2]


def _measure(counts: dict[str, list[str]], key: str, world: int) -> int | None:
    """The count of ``key`` (see :data:`SITUATIONS`); ``None`` for a situation of the metrics at W = 3 (not run)."""
    if key.endswith(" per state"):  # the situations' metrics have 2 states (MeanMetric)
        total = _measure(counts, key.removesuffix(" per state"), world)
        return None if total is None else total // 2
    total = 0
    for part in key.split(" + "):
        only = None
        if part.endswith("]"):
            part, only = part[: part.rindex(" [")], part[part.rindex(" [") + 2 : -1]
        if part not in counts and world == 3 and "Loss" not in part:
            return None
        assert part in counts, f"no situation {part!r} (W={world})"
        total += sum(1 for name in counts[part] if only is None or name == only)
    return total


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"W={w}")
def measured(request: pytest.FixtureRequest) -> tuple[int, dict[str, list[str]]]:
    """Every situation's collectives at one world size (the same on every rank, checked)."""
    world = request.param
    results = run_distributed(_situations, world, timeout=200)
    for name, log in results[0].items():
        per_rank = [r[name] for r in results]
        assert all(p == log for p in per_rank), f"W={world} {name}: the ranks issued different collectives {per_rank}"
    return world, results[0]


def test_every_documented_count_is_the_measured_count(measured: tuple[int, dict[str, list[str]]]) -> None:
    """Each count of the table equals the count taken from the backend in the situation it names."""
    world, counts = measured
    wrong = []
    for key, stated in _all_situations().items():
        expected = stated(world) if callable(stated) else stated
        got = _measure(counts, key, world)
        if got is not None and got != expected:
            wrong.append(f"{key}: the docs say {expected}, measured {got}")
    assert not wrong, f"W={world}:\n" + "\n".join(wrong)
