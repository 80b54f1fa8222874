"""Types reach users: a script using the public API type-checks with mypy against this checkout's source.

One mypy run (mypy's API, in process) checks a user's script together with the package: the script's only error
is the line written to be wrong (proof that the check can fail), and the package has none. mypy is part of the
``test`` extra: without it this module fails to import, it is never skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

import pytest
from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parents[2]

# What a user writes: a metric of their own with a tensor and a list state, a collection, composition, a loss
# class, the functional API, a collective and the sync context. The last line must be an error.
USER_SCRIPT = """\
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import torchmetrics_diff.functional as F
from torchmetrics_diff import Accuracy, MeanMetric, Metric, MetricCollection
from torchmetrics_diff.distributed import all_gather_cat, all_reduce, gather_all_tensors
from torchmetrics_diff.losses import CLIPLoss, GlobalMeanLoss


class RowMean(Metric):
    total: Tensor
    rows: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("rows", [], dist_reduce_fx="cat")

    def update(self, x: Tensor) -> None:
        self.total = self.total + x.sum()
        self.rows.append(x)

    def compute(self) -> Tensor:
        return self.total / sum(r.shape[0] for r in self.rows)


def evaluate(x: Tensor, y: Tensor, labels: Tensor, scale: Tensor) -> dict[str, Any]:
    metric = RowMean(dist_sync_on_step=True, grad_reduction="sum")
    metric.update(x)
    value: Tensor = metric.compute()
    with metric.sync_context(should_unsync=True):
        synced: Tensor = metric.compute()
    metric.reset()

    collection = MetricCollection({"rows": RowMean(), "mean": MeanMetric()}, prefix="val/", compute_groups=False)
    collection.add_metrics({"acc": Accuracy(task="multiclass", num_classes=3)})
    collection.update(x)
    member: Metric = collection["val/rows"]
    names: list[str] = list(collection.keys())
    results: dict[str, Any] = collection.compute()

    ratio: Metric = (metric + MeanMetric()) / 2
    negated: Metric = -metric[0]

    clip = CLIPLoss(strategy="ring", tile=8)
    step: Tensor = clip.forward(x, y, scale)
    epoch: Tensor = clip.compute()
    token_mean = GlobalMeanLoss()
    with token_mean.accumulate(total=12.0):
        part: Tensor = token_mean.forward(x, mask=labels > 0)

    plain: Tensor = F.clip_loss(x, y, scale)
    # a name of the global layer, which ``functional`` resolves lazily: typed through its TYPE_CHECKING import
    global_loss: Tensor = F.global_clip_loss(x, y, scale, strategy="ring")
    accuracy: Tensor = F.accuracy(x, labels, task="multiclass", num_classes=3)
    rows: Tensor = all_gather_cat(x, grad="local")
    total: Tensor = all_reduce(x, "sum", grad="none")
    per_rank: list[Tensor] = gather_all_tensors(x)
    return {"value": value, "synced": synced, "member": member, "names": names, "results": results,
            "ratio": ratio, "negated": negated, "step": step, "epoch": epoch, "part": part, "plain": plain,
            "global_loss": global_loss, "accuracy": accuracy, "rows": rows, "total": total, "per_rank": per_rank}


F.clip_loss("image embeddings", torch.zeros(2, 4), 10.0)  # WRONG: a str where a Tensor is expected
"""

_ERROR = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def mypy_errors() -> dict[str, list[tuple[int, str]]]:
    """One mypy run over the user's script and the package: errors by file, ``(line, message)``."""
    # kept between runs, one folder per checkout: mypy checks every cached module against its source (about 1 s
    # warm, 15-30 s cold); the script keeps its path too, since mypy reports a cached module's errors by its path.
    # In the system's temporary folder, not beside pytest's: under pytest-xdist that one is new in every run
    checkout = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    tmp = Path(tempfile.gettempdir()) / f"torchmetrics_diff_typing_{checkout}"
    tmp.mkdir(exist_ok=True)
    script = tmp / "user_script.py"
    if not script.exists() or script.read_text() != USER_SCRIPT:
        script.write_text(USER_SCRIPT)
    args = [
        str(script),
        str(ROOT / "torchmetrics_diff"),
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(tmp / "mypy_cache"),
        "--no-error-summary",
        "--hide-error-context",
        "--no-pretty",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MYPYPATH", str(ROOT))  # this checkout's source, ahead of any installed copy
        mp.chdir(ROOT)
        start, cpu = time.perf_counter(), time.process_time()
        stdout, stderr, status = mypy_api.run(args)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert status in (0, 1) and not stderr, f"mypy did not run (exit {status}): {stderr}{stdout}"
    print(f"mypy on the user script and the package: {seconds:.1f} s ({cpu:.1f} s of CPU)")
    errors: dict[str, list[tuple[int, str]]] = {}
    for m in _ERROR.finditer(stdout):
        path = Path(m["path"])
        path = path if path.is_absolute() else ROOT / path
        key = "script" if path.resolve() == script.resolve() else os.path.relpath(path.resolve(), ROOT)
        errors.setdefault(key, []).append((int(m["line"]), m["message"]))
    return errors


def test_user_script_type_checks_except_the_wrong_line(mypy_errors: dict[str, list[tuple[int, str]]]) -> None:
    wrong_line = next(i for i, line in enumerate(USER_SCRIPT.splitlines(), 1) if "# WRONG" in line)
    got = mypy_errors.get("script", [])
    assert [line for line, _ in got] == [wrong_line], f"the user script's errors: {got}"
    message = got[0][1]
    assert '"clip_loss"' in message and '"str"' in message and '"Tensor"' in message, message
    assert message.endswith("[arg-type]"), message


def test_package_type_checks_clean(mypy_errors: dict[str, list[tuple[int, str]]]) -> None:
    in_package = {path: errs for path, errs in mypy_errors.items() if path != "script"}
    shown = "\n".join(f"{path}:{line}: {msg}" for path, errs in in_package.items() for line, msg in errs)
    assert not in_package, f"mypy errors in the package:\n{shown}"
