"""Data, model and an independent reference for the Lightning and Fabric runs (imported by the scripts and the
tests), and how the tests start a run script and read its CSV log.

Two ranks, two epochs of two steps. Every step's global batch has 5 rows, split 3 + 2 between the ranks (uneven).
The towers are trained with plain SGD, so the reference replays the same steps on one process: the global batch,
the same initial weights, the gradient of the one-device loss, the same update.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

EPOCHS, STEPS, ROWS, SPLIT, DIM, OUT = 2, 2, 5, (3, 2), 4, 3
LR = 0.5
LOGIT_SCALE = 2.0


def global_batch(epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images, texts (ROWS, DIM) and per-row values (ROWS,) of one step, float64, the same on every process."""
    g = torch.Generator().manual_seed(1000 * epoch + step)
    img = torch.randn(ROWS, DIM, generator=g, dtype=torch.float64)
    txt = img + 0.5 * torch.randn(ROWS, DIM, generator=g, dtype=torch.float64)
    values = torch.rand(ROWS, generator=g, dtype=torch.float64) * 10 - 5
    return img, txt, values


def rank_rows(rank: int) -> slice:
    start = sum(SPLIT[:rank])
    return slice(start, start + SPLIT[rank])


def initial_weights() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return (
        torch.randn(OUT, DIM, generator=g, dtype=torch.float64) / 2,
        torch.randn(OUT, DIM, generator=g, dtype=torch.float64) / 2,
    )


def towers() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The image and text towers of both runs: bias-free float64 ``Linear`` layers with :func:`initial_weights`."""
    img, txt = (torch.nn.Linear(DIM, OUT, bias=False, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        for layer, weight in zip((img, txt), initial_weights()):
            layer.weight.copy_(weight)
    return img, txt


def weight_norm(img: torch.nn.Linear, txt: torch.nn.Linear) -> float:
    """The norm of both towers' weights together (what the runs report after training)."""
    return float((img.weight.detach() ** 2).sum() + (txt.weight.detach() ** 2).sum()) ** 0.5


def reference_clip(img_emb: torch.Tensor, txt_emb: torch.Tensor) -> torch.Tensor:
    """CLIP loss written from its definition: mean of both cross-entropies over the full (N, N) logits."""
    logits = LOGIT_SCALE * img_emb @ txt_emb.T
    target = torch.arange(len(logits))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def reference_run() -> dict[str, list[float]]:
    """What the runs must log: per step and per epoch, computed on one process from the global batches."""
    w_img, w_txt = initial_weights()
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "clip_step",
            "clip_epoch",
            "mean_step",
            "mean_epoch",
            "sum_step",
            "sum_epoch",
            "max_step",
            "max_epoch",
        )
    }
    for epoch in range(EPOCHS):
        clips, everything = [], []
        for step in range(STEPS):
            img, txt, values = global_batch(epoch, step)
            w_img.requires_grad_(True)
            w_txt.requires_grad_(True)
            loss = reference_clip(F.normalize(img @ w_img.T, dim=1), F.normalize(txt @ w_txt.T, dim=1))
            loss.backward()
            with torch.no_grad():
                w_img = w_img - LR * w_img.grad
                w_txt = w_txt - LR * w_txt.grad
            clips.append(loss.item())
            everything.append(values)
            out["clip_step"].append(loss.item())
            out["mean_step"].append(values.mean().item())
            out["sum_step"].append(values.sum().item())
            out["max_step"].append(values.max().item())
        flat = torch.cat(everything)
        out["clip_epoch"].append(sum(clips) / len(clips))
        out["mean_epoch"].append(flat.mean().item())
        out["sum_epoch"].append(flat.sum().item())
        out["max_epoch"].append(flat.max().item())
    out["final_weight_norm"] = [math.sqrt(float((w_img**2).sum() + (w_txt**2).sum()))]
    return out


# the ddp_spawn validation run: VAL_ROWS rows, split by Lightning's DistributedSampler (divides evenly: no padding)
VAL_ROWS, VAL_BATCH, CLASSES = 24, 4, 3


def val_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features (VAL_ROWS, DIM) float64, class labels (VAL_ROWS,) and regression targets (VAL_ROWS,)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(VAL_ROWS, DIM, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (VAL_ROWS,), generator=g)
    targets = torch.randn(VAL_ROWS, generator=g, dtype=torch.float64)
    return x, labels, targets


def val_weight() -> torch.Tensor:
    """The (CLASSES, DIM) weight of the validated bias-free ``Linear``; its first output is the regression."""
    return torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(12), dtype=torch.float64)


def reference_val() -> dict[str, float]:
    """Accuracy, MSE and MAE of the whole validation set on one process, from their definitions."""
    x, labels, targets = val_data()
    logits = x @ val_weight().T
    err = logits[:, 0] - targets
    return {
        "val/acc": (logits.argmax(1) == labels).double().mean().item(),
        "val/mse": (err**2).mean().item(),
        "val/mae": err.abs().mean().item(),
    }


# the log_dict run: dict-valued members (cross-modal MRR, a ClasswiseWrapper) logged with self.log_dict(collection)
LOG_STEPS, LABELS = 2, ("cat", "dog", "owl")
#: every step's global labels: each class in every step's batch, so no per-class accuracy is 0 / 0
STEP_LABELS = (0, 1, 2, 1, 0)


def log_dict_batch(stage: str, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's global batch (ROWS rows, the same on every process): image and text embeddings (ROWS, DIM)
    float32, class logits (ROWS, CLASSES) float32 and labels (ROWS,)."""
    g = torch.Generator().manual_seed(5000 + 100 * epoch + 10 * step + (stage == "train"))
    image = torch.randn(ROWS, DIM, generator=g)
    text = image + 0.8 * torch.randn(ROWS, DIM, generator=g)
    logits = torch.randn(ROWS, CLASSES, generator=g)
    return image, text, logits, torch.tensor(STEP_LABELS)


def _mrr(queries: torch.Tensor, gallery: torch.Tensor) -> float:
    """Mean over queries of 1 / rank of the query's own pair among all gallery rows by cosine similarity, ties
    counted against the query, by a loop over the queries."""
    q, g = F.normalize(queries.double(), dim=1), F.normalize(gallery.double(), dim=1)
    total = 0.0
    for i in range(len(q)):
        scores = g @ q[i]
        rank = 1 + sum(1 for j in range(len(g)) if j != i and scores[j] >= scores[i])
        total += 1.0 / rank
    return total / len(q)


def _classwise(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Per-class accuracy: the share of each class's rows predicted as that class."""
    pred = logits.argmax(1)
    return {f"accuracy_{name}": (pred[labels == c] == c).double().mean().item() for c, name in enumerate(LABELS)}


def reference_log_dict() -> dict[str, list[float]]:
    """What the log_dict run must log, per key: the validation values of each epoch's whole validation set,
    and the training per-class accuracy of each step's global batch and of each epoch."""
    out: dict[str, list[float]] = {}
    for epoch in range(EPOCHS):
        train = [log_dict_batch("train", epoch, step) for step in range(LOG_STEPS)]
        for _, _, logits, labels in train:
            for key, value in _classwise(logits, labels).items():
                out.setdefault(f"train/{key}_step", []).append(value)
        logits, labels = torch.cat([b[2] for b in train]), torch.cat([b[3] for b in train])
        for key, value in _classwise(logits, labels).items():
            out.setdefault(f"train/{key}_epoch", []).append(value)
        val = [log_dict_batch("val", epoch, step) for step in range(LOG_STEPS)]
        image, text, logits, labels = (torch.cat([b[i] for b in val]) for i in range(4))
        epoch_values = {
            "val/i2t_MRR": _mrr(image, text),
            "val/t2i_MRR": _mrr(text, image),
            "val/acc": (logits.argmax(1) == labels).double().mean().item(),
            **{f"val/{key}": value for key, value in _classwise(logits, labels).items()},
        }
        for key, value in epoch_values.items():
            out.setdefault(key, []).append(value)
    return out


# ---------------------------------------------------------------------------------------- running the scripts
SCRIPTS = Path(__file__).resolve().parents[1] / "integration" / "lightning"
#: how long one run script may take (the three runs of ``run_ddp.py`` together)
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(script: str, out: Path) -> str:
    """Run ``tests/integration/lightning/<script> out`` in a new session (Lightning and Fabric re-launch their own
    script for rank 1, so a run cannot happen inside pytest's process); kill every process of it after
    ``TIMEOUT_S``. Fails the calling test on a timeout or a non-zero exit; returns the output."""
    import pytest

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
        [sys.executable, str(SCRIPTS / script), str(out)],
        cwd=SCRIPTS.parents[2],
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
    return text


def logged(out: Path) -> dict[str, list[float]]:
    """Each column of rank 0's ``metrics.csv`` in ``out``, in row order, empty cells skipped."""
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value not in ("", None):
                columns.setdefault(key, []).append(float(value))
    return columns
