"""A rank that dies mid-run is named on every survivor, at once: never a wait for the group's timeout.

A rank is killed with ``SIGKILL`` at a random moment of a loop of mixed calls (a metric's ``forward`` with
``dist_sync_on_step``, a metric's ``compute``, a ``CLIPLoss`` forward and backward, a public ``all_gather_cat``),
at W = 5, 9 and 16 (oversubscribed on two cores), with the checks ``"steady"`` (a fingerprint above 8 ranks) and
``"full"`` (every rank's header). Every survivor must raise :class:`~torchmetrics_diff.exceptions.PeerLeftError`
naming the killed rank (``.rank`` and the message) within a few seconds of the kill, far below the group's
timeout (30 s): the ranks that exchange with the dead one see its connection close, post it on the group's store
and send their own partners a notice; the others hear it from a notice or read it from the store while they wait
(``distributed._hosts``).

Package modules covered: ``distributed._hosts``, ``distributed._failure``, ``distributed._backend``,
``distributed._call``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._helpers.harness import run_once_with_departures

pytestmark = pytest.mark.timeout(240)

PG_TIMEOUT = 30.0  # the group's timeout: a survivor that waited for it would raise after 30 s
WITHIN_S = 6.0  # every survivor raises within this long of the kill (two oversubscribed cores: 16 processes)


def _loop(rank: int, world: int, mode: str, victim: int, delay: float, stamp: str) -> dict[str, Any]:
    """Run mixed calls until one raises; the victim is killed ``delay`` seconds into the loop (its kill time is
    written to ``stamp`` first)."""
    from torchmetrics_diff import MeanMetric, SumMetric
    from torchmetrics_diff.distributed import all_gather_cat, set_checks
    from torchmetrics_diff.losses import CLIPLoss

    set_checks(mode)
    torch.manual_seed(rank)
    mean, total, clip = MeanMetric(dist_sync_on_step=True), SumMetric(), CLIPLoss(strategy="sharded")
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    if rank == victim:

        def kill() -> None:
            time.sleep(delay)
            Path(stamp).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
    steps = 0
    try:
        while True:
            x = torch.randn(3 + rank % 2, 4, dtype=torch.float64)
            mean(x.sum(1))
            total.update(x.sum())
            total.compute()
            loss = clip(x @ w, torch.randn(3 + rank % 2, 4, dtype=torch.float64), 2.0)
            loss.backward()
            all_gather_cat(x, grad="none")
            steps += 1
    except Exception as err:  # the departure, whatever its class: the test checks it
        return {
            "at": time.time(),
            "kind": type(err).__name__,
            "rank": getattr(err, "rank", None),
            "message": str(err)[:500],
            "steps": steps,
        }


@pytest.mark.parametrize("mode", ["steady", "full"])
@pytest.mark.parametrize("world_size", [5, 9, 16])
def test_a_killed_rank_is_named_on_every_survivor_at_once(world_size: int, mode: str, tmp_path: Path) -> None:
    rng = random.Random(f"{world_size}/{mode}")
    # (not rank 0: under this harness its process hosts the store, as under `init_method="tcp://..."`; torchrun
    # hosts it in its agent, which outlives the ranks)
    victim, delay = rng.randrange(1, world_size), rng.uniform(0.3, 1.2)
    stamp = str(tmp_path / "killed_at")
    results = run_once_with_departures(
        _loop, world_size, mode, victim, delay, stamp, pg_timeout=PG_TIMEOUT, forked=True, timeout=180.0
    )
    assert isinstance(results[victim], str) and results[victim].startswith("left:"), results[victim]
    killed_at = float(Path(stamp).read_text())
    problems = []
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        if not isinstance(res, dict):
            problems.append(f"rank {rank}: {str(res)[:300]}")
            continue
        if res["kind"] != "PeerLeftError" or res["rank"] != victim or f"rank {victim} left" not in res["message"]:
            problems.append(f"rank {rank}: {res['kind']} naming rank {res['rank']}: {res['message']}")
        if res["at"] - killed_at > WITHIN_S:
            problems.append(f"rank {rank}: raised {res['at'] - killed_at:.1f} s after the kill: {res['message']}")
    assert not problems, f"rank {victim} killed {delay:.2f} s into the loop:\n" + "\n".join(problems)
