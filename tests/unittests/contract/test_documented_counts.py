"""Every collective count the documentation states, measured.

:data:`CLAIMS` is the single source: each entry quotes a passage of a page (or a docstring) that states a
number of collectives, names the situation it describes, and gives the number the passage states, per world
size. The test runs every situation on real gloo ranks, counts the collectives the package issues from the
backend (``record_collectives``: every ``torch.distributed`` collective and point-to-point batch, the backend's
captured flat gather and reduce-scatter, and the functional collectives), and checks

- that the passage is still on its page, word for word (whitespace aside): a page whose number changed without
  this table fails here, naming the passage;
- that the count measured in the situation is the count the table (and so the page) states: a change of the
  package that changes a count fails here, naming the page.

:data:`NOT_COUNTS` lists the passages that read like a count of collectives but are not one of this package's
calls (a count of torchmetrics', an operation inside a larger call); :func:`test_every_stated_count_is_checked`
fails on any other such passage that neither list covers, so a new count on a page needs a line here.

Data are small and on the CPU: a sync's row fits the call header's first inline area (1536 bytes) unless the
situation says otherwise: a ``large row`` outgrows it and fits once the group's area has grown (from its second
sync on), a ``huge row`` is larger than the largest area (128 KiB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

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

    # --- the MoE router losses: one layer and three layers in one call
    def router(layers: int) -> tuple:
        probs = grad(torch.randn(layers, 5, 4, generator=g, dtype=torch.float64)).softmax(-1)
        return probs, probs.detach().topk(2, dim=-1).indices

    for layers in (1, 3):
        contrastive(f"LoadBalancingLoss L={layers}", LoadBalancingLoss(4, 2), lambda layers=layers: router(layers))
    contrastive("RouterZLoss", RouterZLoss(), lambda: (grad(torch.randn(3, 5, 4, generator=g)),))
    if world == 2:
        _wrapper_situations(rank, g, count)

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


# ---------------------------------------------------------------------------------------------------- claims
Count = "int | Callable[[int], int]"


@dataclass(frozen=True)
class Claim:
    """A passage of ``page`` (quoted; whitespace is not compared) and the counts it states.

    ``counts`` maps a situation of :func:`_situations` to the number of collectives the passage says it issues,
    or a function of the world size. ``"A + B"`` is the sum of two situations (a step: forward and backward);
    ``"A [name]"`` counts only the calls of that name (``_all_gather_flat`` is the header exchange or a gather,
    ``all_reduce``, ``_reduce_scatter_flat``, ``batch_isend_irecv`` one batch of the ring's point-to-point).
    """

    page: str
    text: str
    counts: dict[str, Any]


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


CLAIMS: list[Claim] = [
    # ------------------------------------------------------------------------------------ front pages
    Claim("README.md", "spends about three collectives per state", _TORCHMETRICS),
    Claim(
        "README.md",
        "collection syncs in one collective in the steady state, `cat` states included",
        {"collection of 4 metrics sync 3": 1},
    ),
    Claim(
        "README.md",
        "`MultitaskWrapper`, `Running`) whose members sync in one collective in the steady state",
        {"BootStrapper(8 copies) sync 3": 1, "Running(window 4) sync 3": 1, "collection of wrappers sync 3": 1},
    ),
    Claim(
        "README.md", "confusion matrix: a whole collection in one collective", {"classification collection sync 3": 1}
    ),
    Claim("docs/index.rst", "it spends about three collectives per state", _TORCHMETRICS),
    Claim(
        "docs/index.rst",
        "syncs in one collective in the steady state, ``cat`` states included (two when its states live on a GPU or "
        "outgrow the call header's inline area, which grows to fit rows of up to 128 KiB)",
        {"collection of 4 metrics sync 3": 1, **_SMALL_STEADY, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/quickstart.rst",
        "syncs them with one collective (three on the first step, which agrees on a sync plan)",
        _DSOS,
    ),
    Claim(
        "docs/quickstart.rst",
        "``loss.backward()`` runs no collective of its own",
        _each("MeanMetric(dist_sync_on_step=True) backward {}", 0),
    ),
    # ------------------------------------------------------------------------------------ the engine
    Claim(
        "docs/guide/architecture.rst",
        "**one collective per sync in the steady state** for CPU states whose row fits the call header's inline "
        "area (the group's: it grows to fit the rows its calls send, up to 128 KiB), two otherwise",
        {**_SMALL_STEADY, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/guide/architecture.rst",
        "The row: metadata and data in one all-gather",
        {**_SMALL_STEADY, "None reduction sync 3": 1},
    ),
    Claim(
        "docs/guide/architecture.rst",
        "every rank grows the plan alike and sends again, one more all-gather",
        {"CatMetric growing sync 3": 2},
    ),
    Claim(
        "docs/guide/architecture.rst",
        "the ranks gather their full metadata in one all-gather",
        {**_FIRST, **_CHANGE, "400 sum states sync 1": 3},
    ),
    Claim(
        "docs/guide/architecture.rst",
        "The first sync costs three collectives (the header, the metadata, the data); the first after a change of "
        "signature two more than a steady sync, once.",
        {**_FIRST, **_CHANGE},
    ),
    Claim("docs/guide/sync_engine.rst", "so on CPU/gloo a small sync is still **one collective**", _SMALL_STEADY),
    Claim(
        "docs/guide/sync_engine.rst",
        "A larger CPU row is then one collective from its second sync on; a row over 128 KiB, or a sync of GPU "
        "tensors, sends its row in a second collective on the data's device.",
        {**_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "CPU states whose row fits its inline area (grown to fit rows up to 128 KiB). A larger row, or GPU states, "
        "add one collective for the row",
        {**_SMALL_STEADY, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "**The row — one all-gather of a byte row**",
        {**_SMALL_STEADY, "None reduction sync 3": 1},
    ),
    Claim("docs/guide/sync_engine.rst", "this one collective is the whole sync", _SMALL_STEADY),
    Claim(
        "docs/guide/sync_engine.rst",
        "packs again and sends the row in one more all-gather",
        {**_OUTGROWN, "CatMetric sync 3": 1},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "one all-gather of every rank's metadata",
        {**_FIRST, **_CHANGE, "400 sum states sync 1": 3},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "so the first sync costs three collectives (the call header, the metadata, the row)",
        _FIRST,
    ),
    Claim("docs/guide/sync_engine.rst", "two collectives more than a steady sync, once", _CHANGE),
    Claim(
        "docs/guide/sync_engine.rst",
        "* - only ``sum``/``mean``/``min``/``max`` states, any number of them - 1 (2 for a row over 128 KiB or on a "
        "GPU)",
        {"16 sum states sync 3": 1, "SumMetric sync 3": 1, "400 sum states sync 2": 1},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "* - with ``cat`` (list) states, or callable/``None`` reductions, whose sizes fit the room the plan has for "
        "them - 1 (2 for a row over 128 KiB or on a GPU)",
        {"CatMetric sync 3": 1, "None reduction sync 3": 1, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "* - a ``cat`` or gathered state that outgrew its room - one more",
        {**_OUTGROWN, "CatMetric sync 3": 1},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "* - the first sync, or the first after the signature changed - 3",
        {**_FIRST, **_CHANGE},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        r"* - ``sum``/``mean`` states of more than 64 KiB / ``W`` in total - \+ 1 ``all_reduce`` per (op, dtype)",
        {"large sum state sync 3": 2, "large sum state sync 3 [all_reduce]": 1},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "* - a :class:`~torchmetrics_diff.MetricCollection` of ``n`` metrics - the same as one metric holding all "
        "the states",
        {"collection of 4 metrics sync 3": 1, "collection of 4 metrics sync 1": 3},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "(with :func:`~torchmetrics_diff.distributed.gather_all_tensors`, two collectives per state)",
        {"MeanMetric dist_sync_fn=gather_all_tensors sync 3": 2 * 2},
    ),
    Claim(
        "docs/guide/sync_engine.rst",
        "(a barrier, a gather of the shapes — skipped for a scalar state —, a gather of the data)",
        _TORCHMETRICS,
    ),
    Claim("docs/guide/sync_engine.rst", "- about 3 per state", {"torchmetrics CatMetric sync": 3}),
    Claim("docs/guide/sync_engine.rst", "since the one collective is a gather", {"16 sum states sync 3": 1}),
    Claim(
        "docs/guide/sync_engine.rst",
        "ride in the area from their second sync on: one collective",
        {"16 cat states of 137 x 8 floats sync 2": 2, "16 cat states of 137 x 8 floats sync 3": 1},
    ),
    Claim(
        "docs/guide/decisions.rst",
        "The rows still travel in the sync's one collective",
        {"list state, callable reduction sync 3": 1},
    ),
    Claim(
        "docs/guide/decisions.rst",
        "The cost is one collective more per call where the data cannot ride in the header",
        {"CatMetric sync 3": 1, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim("docs/guide/decisions.rst", "a small sync of CPU states is still one collective", _SMALL_STEADY),
    Claim(
        "docs/guide/decisions.rst",
        "so that on CPU/gloo a sync is one collective; but every call",
        {**_SMALL_STEADY, **_LARGE_ROW},
    ),
    Claim(
        "docs/guide/decisions.rst",
        "The first steady sync of a row larger than the area is two collectives (its header asks for the room), the "
        "next ones one.",
        {
            "CatMetric large row sync 2": 2,
            "CatMetric large row sync 3": 1,
            "16 cat states of 137 x 8 floats sync 2": 2,
            "16 cat states of 137 x 8 floats sync 3": 1,
        },
    ),
    Claim(
        "docs/guide/decisions.rst",
        "the rows travel with everything else in one collective. A state that outgrows its room takes one more gather",
        {"CatMetric sync 3": 1, "CatMetric growing sync 3": 2},
    ),
    Claim(
        "docs/guide/metrics_as_losses.rst",
        "on this first step three all-gathers — the call header, every rank's metadata (the row counts of the "
        "``cat`` states among it), then the rows and the small ``sum`` state; from the next step on one",
        {"global softmax forward 1": 3, "global softmax forward 2": 1},
    ),
    Claim(
        "docs/guide/metrics_as_losses.rst",
        "Syncing a metric's states adds no collective to ``backward``",
        {"global softmax backward 1": 0, "global softmax backward 2": 0},
    ),
    Claim(
        "docs/api/distributed.rst",
        "validated identically everywhere so that a disagreement raises the same ``RuntimeError`` on every rank "
        "instead of hanging, then one data collective",
        {"all_gather_cat": 2, "gather_all_tensors": 2, "all_gather_cat grad=sync forward": 2},
    ),
    Claim(
        "docs/api/distributed.rst",
        "rides in the header's exchange instead, and every rank reduces the gathered rows itself in rank order (the "
        "same bits on every rank): one collective in all.",
        {"all_reduce": 1, "all_reduce huge": 2},
    ),
    # ------------------------------------------------------------------------------------ metrics pages
    Claim(
        "docs/metrics/index.rst",
        "one collective per sync in the steady state, for a single metric or a whole",
        {"SumMetric sync 3": 1, "classification collection sync 3": 1, "regression collection sync 3": 1},
    ),
    Claim(
        "docs/metrics/classification.rst",
        "syncs in **one collective** in the steady state (the tests count it; the first sync agrees the plan and "
        "costs two more)",
        {"classification collection sync 3": 1, "classification collection sync 1": 3},
    ),
    Claim("docs/metrics/classification.rst", "it rides in the same collective", {"collection with AUROC sync 3": 1}),
    Claim(
        "docs/metrics/regression.rst",
        "a sync is one collective whatever the number of metrics",
        {"regression collection sync 3": 1},
    ),
    Claim(
        "docs/metrics/retrieval.rst",
        "one collective gathers every rank's rows (steady state, while they fit the call header's inline area of up "
        "to 128 KiB, two beyond; the first sync agrees the plan and costs two more)",
        {"retrieval sync 3": 1, "retrieval large row sync 3": 1, "retrieval sync 1": 3},
    ),
    # ------------------------------------------------------------------------------------ losses
    Claim(
        "docs/losses/normalized.rst",
        "One collective per call on the CPU: the all-reduce of two numbers (this rank's weighted sum and weight) "
        "rides in the call header's exchange",
        _NORMALIZED,
    ),
    Claim(
        "docs/losses/normalized.rst",
        "No communication in backward",
        {**_each("TokenCrossEntropyLoss backward {}", 0), **_each("GlobalMeanLoss backward {}", 0)},
    ),
    Claim(
        "docs/losses/normalized.rst",
        "in one collective in the steady state as well (three on the first call, which agrees on a sync plan)",
        {**_DSOS, "GlobalMeanLoss forward 3": 1},
    ),
    Claim(
        "docs/losses/normalized.rst",
        "which sums them over the ranks (on the CPU in one collective, its call header's exchange; leaving the block "
        "costs two more, which gather every rank's check of the count)",
        {
            f"{loss} accumulate(items) {when}": n
            for loss in ("GlobalMeanLoss", "TokenCrossEntropyLoss")
            for when, n in (("enter", 1), ("exit", 2))
        },
    ),
    Claim(
        "docs/losses/normalized.rst",
        "pass ``total=`` instead of the items: no collective at all.",
        {"TokenCrossEntropyLoss accumulate(total=) enter": 0, "TokenCrossEntropyLoss accumulate(total=) exit": 0},
    ),
    Claim(
        "docs/losses/barlow_twins.rst",
        "ride in its exchange: one collective per call; larger ones, or on a GPU, two collectives per call",
        {
            **_each("BarlowTwinsLoss forward {}", 1),
            **_each("BarlowTwinsLoss forward {} [all_reduce]", 0),
            **_each("BarlowTwinsLoss D=200 forward {}", 2),
            **_each("BarlowTwinsLoss D=200 forward {} [all_reduce]", 1),
        },
    ),
    Claim("docs/losses/barlow_twins.rst", "and the backward needs none", _each("BarlowTwinsLoss backward {}", 0)),
    Claim(
        "docs/losses/vicreg.rst",
        "ride in its exchange: one collective per call; larger ones, or on a GPU, two collectives per call",
        {
            **_each("VICRegLoss forward {}", 1),
            **_each("VICRegLoss forward {} [all_reduce]", 0),
            **_each("VICRegLoss D=200 forward {}", 2),
            **_each("VICRegLoss D=200 forward {} [all_reduce]", 1),
        },
    ),
    Claim("docs/losses/vicreg.rst", "and the backward needs none", _each("VICRegLoss backward {}", 0)),
    Claim(
        "docs/losses/dino.rst",
        "ride in its exchange: one collective per update; else two collectives",
        {
            **_each("DINOCenter update {}", 1),
            **_each("DINOCenter update {} [all_reduce]", 0),
            **_each("DINOCenter D=20000 update {}", 2),
            **_each("DINOCenter D=20000 update {} [all_reduce]", 1),
        },
    ),
    Claim(
        "docs/losses/clip.rst",
        "in one all-gather, and every rank combines them",
        {"CLIPLoss sharded forward 3": 4, "InfoNCELoss sharded forward 3": 3},
    ),
    Claim(
        "docs/losses/clip.rst",
        "two all-reduces of ``N`` numbers give the same log-sum-exps instead",
        {
            "CLIPLoss sharded, column reductions forward 3": 4 + 1,
            "CLIPLoss sharded, column reductions forward 3 [all_reduce]": 2 + 1,
            "CLIPLoss sharded, column reductions forward 3 [_all_gather_flat]": 2,
            "CLIPLoss sharded, column reductions backward 3": 1,
        },
    ),
    Claim(
        "docs/losses/clip.rst",
        "gather's backward) — no collective of its own",
        {"CLIPLoss sharded backward 3": 1, "CLIPLoss sharded backward 3 [_reduce_scatter_flat]": 1},
    ),
    Claim(
        "docs/losses/supcon.rst",
        "they cost one more gather (its metadata exchange and its data) than the other contrastive losses, and the "
        "replicated and sharded strategies one more header exchange (whether every rank gives labels; also without "
        "labels)",
        {
            **{f"InfoNCELoss {s} forward 3": n for s, n in (("replicated", 2), ("sharded", 3))},
            "InfoNCELoss ring forward 3": lambda w: _ring_forward("InfoNCELoss", w),
            **{f"SupConLoss {s} with labels forward 3": n for s, n in (("replicated", 2 + 3), ("sharded", 3 + 3))},
            "SupConLoss ring with labels forward 3": lambda w: _ring_forward("InfoNCELoss", w) + 2,
            **{f"SupConLoss {s} without labels forward 3": n for s, n in (("replicated", 3), ("sharded", 4))},
            "SupConLoss ring without labels forward 3": lambda w: _ring_forward("InfoNCELoss", w),
        },
    ),
    Claim("docs/losses/infonce.rst", "both views travel in one gather", {"InfoNCELoss sharded forward 3": 3}),
    Claim(
        "docs/losses/siglip.rst",
        "here one gather brings every caption",
        {"SigLIPLoss sharded forward 3 [_all_gather_flat]": 2},
    ),
    # ------------------------------------------------------------------------------------ strategies (counts only)
    Claim(
        "docs/guide/strategies.rst",
        "in one more all-gather of ``N`` numbers, or beyond 4 ranks, once the gathered ``W × N`` table would outgrow "
        "64 KiB, in two more all-reduces of ``N`` numbers",
        {
            "CLIPLoss sharded forward 3": 4,
            "SigLIPLoss sharded forward 3": 3,
            "CLIPLoss sharded, column reductions forward 3": 3 + 2,
        },
    ),
    Claim(
        "docs/guide/strategies.rst",
        "One all-reduce of the two numbers ``(Σ loss, count)``, without gradient",
        {f"{loss} sharded forward 3 [all_reduce]": 1 for loss in _GATHERING},
    ),
    Claim(
        "docs/guide/strategies.rst",
        "``backward()`` runs one reduce-scatter",
        {f"{loss} sharded backward 3 [_reduce_scatter_flat]": 1 for loss in _GATHERING},
    ),
    Claim(
        "docs/guide/strategies.rst",
        "* - collectives in forward - 2 all-gathers: the gather's metadata exchange (a small fixed-size row) and the "
        "data - 3: the same 2 all-gathers, then one all-reduce of 2 numbers for the value",
        {
            **{f"{loss} replicated forward {i}": 2 for loss in _GATHERING for i in (1, 3)},
            **{f"{loss} sharded forward {i}": 3 for loss in ("SigLIPLoss", "InfoNCELoss") for i in (1, 3)},
        },
    ),
    Claim(
        "docs/guide/strategies.rst",
        "* - collectives in backward - none - 1 reduce-scatter of the gathered rows' gradients",
        {
            **{f"{loss} replicated backward 3": 0 for loss in _GATHERING},
            **{f"{loss} sharded backward 3": 1 for loss in _GATHERING},
        },
    ),
    Claim(
        "docs/guide/strategies.rst",
        "- 3 all-gathers for the labels (whether every rank gives them, then metadata and data); 1 without labels "
        "- the same 3 (1)",
        {
            "SupConLoss replicated with labels forward 3": 2 + 3,
            "SupConLoss replicated without labels forward 3": 2 + 1,
            "SupConLoss sharded with labels forward 3": 3 + 3,
            "SupConLoss sharded without labels forward 3": 3 + 1,
        },
    ),
    Claim(
        "docs/guide/strategies.rst",
        "- none - 1 all-gather of ``N`` column statistics per rank; beyond 4 ranks and a 64 KiB ``W × N`` table, 2 "
        "all-reduces of ``N`` numbers instead",
        {
            "CLIPLoss replicated forward 3": 2,
            "CLIPLoss sharded forward 3": 3 + 1,
            "CLIPLoss sharded, column reductions forward 3": 3 + 2,
            "CLIPLoss sharded, column reductions forward 3 [all_reduce]": 1 + 2,
        },
    ),
    Claim(
        "docs/guide/strategies.rst",
        "Replicated issues two collectives per step, sharded four (one more in forward, the reduce-scatter in "
        "backward; CLIP five, with the all-gather of its column statistics, six where two all-reduces replace it)",
        {
            **_steps("CLIPLoss sharded, column reductions", 6),
            **_steps("InfoNCELoss replicated", 2),
            **_steps("SigLIPLoss replicated", 2),
            **_steps("CLIPLoss replicated", 2),
            **_steps("InfoNCELoss sharded", 4),
            **_steps("SigLIPLoss sharded", 4),
            **_steps("CLIPLoss sharded", 5),
        },
    ),
    # ------------------------------------------------------------------------------------ the ring (counts only)
    Claim(
        "docs/guide/ring.rst",
        "- after the ring - one all-reduce of ``(Σ loss, count)`` for the value",
        {
            **{f"{loss} ring forward {i} [all_reduce]": 1 for loss in _GATHERING for i in (1, 3)},
            **{f"{loss} ring backward 3 [all_reduce]": 0 for loss in _GATHERING},
        },
    ),
    Claim(
        "docs/guide/ring.rst",
        "from one all-reduce of two numbers",
        {f"{loss} ring forward 3 [all_reduce]": 1 for loss in _GATHERING},
    ),
    Claim(
        "docs/guide/ring.rst",
        "one call-header exchange (one all-gather) of a few integers per rank",
        {f"{loss} ring forward {i} [_all_gather_flat]": 1 for loss in _GATHERING for i in (1, 3)},
    ),
    Claim(
        "docs/guide/ring.rst",
        "SupCon with labels: one ``all_gather_cat`` of the ``N`` labels.",
        {"SupConLoss ring with labels forward 3 [_all_gather_flat]": 1 + 2},
    ),
    Claim(
        "docs/guide/ring.rst",
        "``irecv`` the next block from ``r - 1``, one batch (overlapped with the tiles); CLIP also sends the block's "
        "column statistics on after its tiles (``W`` messages of ``B`` numbers)",
        {
            **{
                f"{loss} ring forward 3 [batch_isend_irecv]": (lambda w: w - 1)
                for loss in ("SigLIPLoss", "InfoNCELoss")
            },
            "CLIPLoss ring forward 3 [batch_isend_irecv]": lambda w: (w - 1) + w,
            **{f"{loss} ring forward 3": (lambda w, loss=loss: _ring_forward(loss, w)) for loss in _GATHERING},
        },
    ),
    Claim(
        "docs/guide/ring.rst",
        "after the tiles one ``isend`` of the block's gradient to ``r + 1`` with the matching ``irecv`` from ``r - 1``",
        {
            f"{ring} backward 3": (lambda w: (w - 1) + w)
            for ring in (*(f"{loss} ring" for loss in _GATHERING), "SupConLoss ring with labels")
        },
    ),
    # ------------------------------------------------------------------------------------ docstrings
    Claim(
        "docs/losses/moe.rst",
        "on the CPU it rides in the call header's exchange (statistics up to 128 KiB): one collective per call, two "
        "on a GPU (the header's exchange, then the all-reduce). No communication in backward.",
        {
            **{f"LoadBalancingLoss L={n} forward {i}": 1 for n in (1, 3) for i in (1, 3)},
            **{f"LoadBalancingLoss L={n} forward {i} [all_reduce]": 0 for n in (1, 3) for i in (1, 3)},
            **{f"LoadBalancingLoss L={n} backward {i}": 0 for n in (1, 3) for i in (1, 3)},
        },
    ),
    Claim(
        "docs/losses/moe.rst",
        "in the call header's exchange on the CPU (one collective per call)",
        {**_each("RouterZLoss forward {}", 1), **_each("RouterZLoss forward {} [all_reduce]", 0)},
    ),
    Claim(
        "torchmetrics_diff/distributed/_sync/engine.py",
        "So a sync of small CPU states costs one collective in the steady state, cat states included, three when the "
        "ranks agree on a plan.",
        {**_SMALL_STEADY, **_FIRST},
    ),
    Claim(
        "torchmetrics_diff/distributed/_sync/plan.py",
        "a fresh plan costs two collectives more.",
        {"SumMetric sync 1": 3, "SumMetric sync 3": 1},
    ),
    Claim(
        "torchmetrics_diff/classification/__init__.py",
        "(one collective for a whole collection)",
        {"classification collection sync 3": 1},
    ),
    Claim(
        "torchmetrics_diff/regression/metrics.py",
        "one collective per step (every state is a ``sum`` state)",
        {"MeanSquaredError(dist_sync_on_step=True) forward 3": 1},
    ),
    Claim(
        "docs/guide/decisions.rst",
        "they stay ``sum`` states (one collective for a whole collection)",
        {"classification collection sync 3": 1},
    ),
    # ------------------------------------------------------------------------------------ wrappers
    Claim(
        "docs/metrics/wrappers.rst",
        "holding wrappers and metrics sync in **one collective** in the steady state (once the ranks agreed on the "
        "states' layout; a CPU row larger than the call header's largest inline area, 128 KiB, or states on a GPU, "
        "take one more, as for any metric",
        {**_WRAPPERS, **_LARGE_ROW, **_HUGE_ROW},
    ),
    Claim(
        "docs/metrics/wrappers.rst",
        "are synced together, in one collective, between their ``update`` and their value",
        {"BootStrapper(8 copies) forward 3": 1, "collection of wrappers forward 3": 1},
    ),
    Claim(
        "docs/metrics/wrappers.rst",
        "and a collection of three wrappers and a metric each sync in one collective per call",
        _WRAPPERS,
    ),
    Claim("docs/guide/decisions.rst", "All inner states sync in one collective", _WRAPPERS),
    Claim(
        "docs/guide/decisions.rst",
        "all synced in the one collective, then merged",
        {"Running(window 4) sync 3": 1},
    ),
    Claim(
        "docs/guide/decisions.rst",
        "its members join the wrapper's one collective; its ``forward`` runs as the collection's own (one collective "
        "for the collection)",
        {"collection of wrappers sync 3": 1, "collection of 4 metrics sync 3": 1},
    ),
]

# Passages that read like a count of collectives but state none of this package's calls.
NOT_COUNTS: dict[str, tuple[str, str]] = {
    "docs/guide/architecture.rst": (
        "packing the views of a rank's rows for one gather",
        "which views share a gather, not how many collectives a call issues",
    ),
    "docs/guide/architecture.rst ": (
        "Two views gathered in two collectives may see",
        "a rule for writing a loss, not a count of the package",
    ),
    "docs/api/functional.rst": (
        "all views travel in one collective",
        "views share the data collective; a call's counts are the strategies' (checked above)",
    ),
    "docs/guide/sync_engine.rst": (
        "one all-gather of the same size on every rank",
        "the header exchange itself, part of every count above",
    ),
    "docs/guide/sync_engine.rst ": (
        "between two collectives runs two to three times slower",
        "timing",
    ),
    "docs/losses/moe.rst": (
        "a hand-rolled loss with one all-reduce per layer pays it",
        "the benchmark's hand-rolled baseline, not a call of the package",
    ),
}

_COUNT_WORDS = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+)"
_COLLECTIVE_WORDS = r"(?:collectives?|all-gathers?|all-reduces?|all_reduces?|reduce-scatters?|gathers?)"
STATED_COUNT = re.compile(rf"\b{_COUNT_WORDS}(?: more)? {_COLLECTIVE_WORDS}\b", re.IGNORECASE)


def _normalized(text: str) -> str:
    return " ".join(text.split())


def _page(page: str) -> str:
    return _normalized((ROOT / page).read_text(encoding="utf-8"))


def _pages_to_scan() -> list[str]:
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.rst"))
    return ["README.md", *docs]


# ----------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.page}: {c.text[:50]}")
def test_the_passage_is_on_its_page(claim: Claim) -> None:
    """The table quotes the page as it is: a page whose count changed must change the table (and the test)."""
    assert _normalized(claim.text) in _page(claim.page), (
        f"{claim.page} no longer says {claim.text!r}: update CLAIMS in this file with the page's new wording and "
        "the counts it states"
    )


def test_every_stated_count_is_checked() -> None:
    """Every "<number> collective(s)/all-gather(s)/..." on a page lies inside a passage of CLAIMS or NOT_COUNTS."""
    covered: dict[str, list[str]] = {}
    for claim in CLAIMS:
        covered.setdefault(claim.page, []).append(_normalized(claim.text))
    for page, (text, _why) in NOT_COUNTS.items():
        covered.setdefault(page.strip(), []).append(_normalized(text))
    unchecked = []
    for page in _pages_to_scan():
        body = _page(page)
        spans = [(m.start(), m.end()) for quoted in covered.get(page, []) for m in re.finditer(re.escape(quoted), body)]
        for hit in STATED_COUNT.finditer(body):
            if not any(a <= hit.start() and hit.end() <= b for a, b in spans):
                unchecked.append(f"{page}: ...{body[max(0, hit.start() - 60) : hit.end() + 30]}...")
    assert not unchecked, "counts of collectives no test checks (add them to CLAIMS):\n" + "\n".join(unchecked)


def _measure(counts: dict[str, list[str]], key: str, world: int) -> int | None:
    """The count of ``key`` (see :class:`Claim`); ``None`` for a situation of the metrics at W = 3 (not run)."""
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
    """Each count a passage states equals the count taken from the backend in the situation it describes."""
    world, counts = measured
    wrong = []
    for claim in CLAIMS:
        for key, stated in claim.counts.items():
            expected = stated(world) if callable(stated) else stated
            got = _measure(counts, key, world)
            if got is not None and got != expected:
                wrong.append(f"{claim.page}: {claim.text!r}\n    {key}: the page says {expected}, measured {got}")
    assert not wrong, f"W={world}:\n" + "\n".join(wrong)
