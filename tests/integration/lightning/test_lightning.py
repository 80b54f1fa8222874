"""Lightning and Fabric, for real: 2 CPU ranks under DDP log our loss, a MeanMetric and a MetricCollection (and,
under the Trainer, a RunningMean wrapper).

Each run is a script (Lightning and Fabric re-launch their own script for rank 1, so they cannot run inside
pytest's process); the test runs it in a new session with a timeout that kills every process, then compares
rank 0's CSV log with :func:`tests._helpers.lightning_runs.reference_run` — the same training replayed on one
process from the global batches with an independent CLIP formula. Uneven rows (3 + 2), float64 towers trained by
SGD: the step values are the global ones, the epoch values are ``compute()`` over the epoch's steps on both ranks
(so the metrics were reset between epochs), and the trained weights equal the one-process ones (exact gradients
through Lightning's DDP). A third run validates under ``strategy="ddp_spawn"``, where the metrics reach the ranks
by pickling, and compares what ``trainer.validate`` returned with the whole validation set on one process.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers import lightning_runs as C

pytest.importorskip("lightning", reason="the lightning integration tests need the `test` extra")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(script: str, out: Path) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONWARNINGS": "ignore",
    }
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK"):  # a fresh launch, whatever pytest runs under
        env.pop(var, None)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / script), str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        text, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{script} did not finish within {TIMEOUT_S}s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}:\n{text[-5000:]}"


def _logged(out: Path) -> dict[str, list[float]]:
    """Each column of rank 0's metrics.csv, in row order, empty cells skipped."""
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value not in ("", None):
                columns.setdefault(key, []).append(float(value))
    return columns


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
    logged, expected = _logged(out), C.reference_run()
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


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_trainer_ddp_logs_metric_objects_per_step_and_epoch(tmp_path: Path) -> None:
    """``self.log(name, metric)`` / ``self.log_dict(collection)`` under ``Trainer(strategy="ddp", devices=2)``."""
    _run("run_trainer.py", tmp_path)
    # a RunningMean over the epoch's steps (Lightning resets it with the others): the step and epoch means
    _check(tmp_path, {**KEYS, "running_step": "mean_step", "running_epoch": "mean_epoch"})
    assert json.loads((tmp_path / "final.json").read_text())["resets"] == 1  # the second epoch started empty


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_fabric_ddp_logs_values_per_step_and_epoch(tmp_path: Path) -> None:
    """The same run with Lightning Fabric: ``fabric.log_dict`` of the values, ``log_epoch`` computes and resets."""
    _run("run_fabric.py", tmp_path)
    _check(tmp_path)


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_trainer_ddp_spawn_logs_unpickled_metrics(tmp_path: Path) -> None:
    """Under ``strategy="ddp_spawn"`` the metrics reach the ranks by pickling (no ``__init__`` runs there) and are
    still loggable: ``self.log(name, metric)`` and ``self.log_dict(collection)`` in validation give the values of
    the whole validation set, with no import of the integration module in the script."""
    _run("run_spawn.py", tmp_path)
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
