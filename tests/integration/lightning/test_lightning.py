"""Lightning and Fabric, for real: 2 CPU ranks under DDP log our loss, a MeanMetric and a MetricCollection (and,
under the Trainer, a RunningMean wrapper).

Each run is a script (Lightning and Fabric re-launch their own script for rank 1, so they cannot run inside pytest's
process), started in a new session with a timeout that kills every process; the Trainer's and Fabric's runs are made
by one launch (``run_ddp.py``, through the ``ddp_runs`` fixture, with ``test_log_dict.py``'s run). Each test
compares rank 0's CSV log with :func:`tests._helpers.lightning_runs.reference_run` — the same training replayed on
one process from the global batches with an independent CLIP formula. Uneven rows (3 + 2), float64 towers trained by
SGD: the step values are the global ones, the epoch values are ``compute()`` over the epoch's steps on both ranks
(so the metrics were reset between epochs), and the trained weights equal the one-process ones (exact gradients
through Lightning's DDP). A third run validates under ``strategy="ddp_spawn"``, where the metrics reach the ranks by
pickling, and compares what ``trainer.validate`` returned with the whole validation set on one process.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests._helpers import lightning_runs as C

# the runs import lightning in processes of their own: here it only has to be installed (importing it would cost
# seconds in the collection of every pytest worker)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="the lightning integration tests need the `test` extra"
)


# logged key -> reference key
KEYS = {
    "clip_step": "clip_step",
    "clip_epoch": "clip_epoch",
    "mean_step": "mean_step",
    "mean_epoch": "mean_epoch",
    "train/sum_step": "sum_step",
    "train/sum_epoch": "sum_epoch",
    "train/max_step": "max_step",
    "train/max_epoch": "max_epoch",
}


def _check(out: Path, keys: dict[str, str] = KEYS) -> None:
    logged, expected = C.logged(out), C.reference_run()
    problems = []
    for key, ref in keys.items():
        got = logged.get(key)
        want = expected[ref]
        # step values and the loss are float64; epoch values of the aggregators are their float32 accumulators
        tol = 1e-12 if key.endswith("_step") or key.startswith("clip") else 1e-5
        if got is None or len(got) != len(want) or any(abs(g - w) > tol * max(1.0, abs(w)) for g, w in zip(got, want)):
            problems.append(f"{key}: logged {got}, expected {want}")
    final = json.loads((out / "final.json").read_text())
    assert final["world"] == 2
    if abs(final["final_weight_norm"] - expected["final_weight_norm"][0]) > 1e-12:
        problems.append(
            f"trained weights: norm {final['final_weight_norm']} vs one process {expected['final_weight_norm']}"
        )
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(C.TIMEOUT_S + 30)
def test_trainer_ddp_logs_metric_objects_per_step_and_epoch(ddp_runs: Path) -> None:
    """``self.log(name, metric)`` / ``self.log_dict(collection)`` under ``Trainer(strategy="ddp", devices=2)``."""
    out = ddp_runs / "trainer"
    # a RunningMean over the epoch's steps (Lightning resets it with the others): the step and epoch means
    _check(out, {**KEYS, "running_step": "mean_step", "running_epoch": "mean_epoch"})
    assert json.loads((out / "final.json").read_text())["resets"] == 1  # the second epoch started empty


@pytest.mark.timeout(C.TIMEOUT_S + 30)
def test_fabric_ddp_logs_values_per_step_and_epoch(ddp_runs: Path) -> None:
    """The same run with Lightning Fabric: ``fabric.log_dict`` of the values, ``log_epoch`` computes and resets."""
    _check(ddp_runs / "fabric")


@pytest.mark.timeout(C.TIMEOUT_S + 30)
def test_trainer_ddp_spawn_logs_unpickled_metrics(tmp_path: Path) -> None:
    """Under ``strategy="ddp_spawn"`` the metrics reach the ranks by pickling (no ``__init__`` runs there) and are
    still loggable: ``self.log(name, metric)`` and ``self.log_dict(collection)`` in validation give the values of
    the whole validation set, with no import of the integration module in the script."""
    C.run_script("run_spawn.py", tmp_path)
    result = json.loads((tmp_path / "logged.json").read_text())
    assert result["world"] == 2
    expected = C.reference_val()
    assert result["logged"].keys() == expected.keys()
    for key, want in expected.items():
        # the metric states are float32 accumulators
        assert result["logged"][key] == pytest.approx(want, rel=1e-6, abs=1e-7), key
    # rank 0's half alone gives other values: the logged ones were synced
    x, _, targets = C.val_data()
    logits = x[0::2] @ C.val_weight().T
    assert abs(((logits[:, 0] - targets[0::2]) ** 2).mean().item() - expected["val/mse"]) > 1e-3
