"""Our metrics stay ``torchmetrics.Metric`` instances (what Lightning's ``self.log`` checks) in a process they reach
by pickling — ``ddp_spawn``, ``mp.spawn``, spawned DataLoader workers — where no metric's ``__init__`` runs, and
importing the package imports neither torchmetrics nor Accelerate.

Each check runs in a fresh interpreter: in this one the class is registered long ago. The real ``ddp_spawn`` run
is in ``tests/integration/lightning``.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
import torch

from torchmetrics_diff import Accuracy, MeanSquaredError, MetricCollection, SumMetric
from torchmetrics_diff.losses import CLIPLoss

pytest.importorskip("torchmetrics", reason="the registration tests need the `test` extra")

_UNPICKLE = """
import json, pickle, sys
import torchmetrics_diff, torchmetrics_diff.integrations.accelerate
imported = sorted(m for m in ("torchmetrics", "accelerate", "lightning") if m in sys.modules)
import torchmetrics
objects = pickle.loads(sys.stdin.buffer.read())
objects.update(objects.pop("collection").items())  # log_dict(collection) logs each member
registered = {name: isinstance(obj, torchmetrics.Metric) for name, obj in objects.items()}
print(json.dumps({"imported": imported, "registered": registered}))
"""


@pytest.mark.one_child
def test_unpickled_metrics_register_in_a_fresh_process() -> None:
    """A process whose only metrics come from ``pickle.loads`` sees them as torchmetrics metrics, with no import
    of ``torchmetrics_diff.integrations.lightning``; the package import itself pulled in no framework."""
    acc = Accuracy(task="multiclass", num_classes=3)
    acc.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    objects = {
        "metric": acc,
        "collection": MetricCollection({"mse": MeanSquaredError(), "sum": SumMetric()}),
        "loss": CLIPLoss(),
    }
    out = subprocess.run(
        [sys.executable, "-c", _UNPICKLE],
        input=pickle.dumps(objects),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    result = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert result["imported"] == []
    assert result["registered"] == {"metric": True, "loss": True, "mse": True, "sum": True}
