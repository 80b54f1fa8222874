"""What one steady metric sync runs: a bound on its Python calls and on the package files they are in.

One ``MeanMetric`` ``update`` + ``compute`` at W = 2 (gloo), after warm-up syncs, is profiled with
``sys.setprofile`` on rank 0: every Python function call, in the package or in torch, counts. The waits poll
until their collective completes (C calls, not counted), so a loaded machine does not add the slow path's calls.
The bounds are the figures of the tree of 2026-11-23 (d2c2c41: 172 calls here, in 15 package files; the same
harness), so a change that makes the steady path longer or spreads it over more modules fails here and must say
why.

Package modules covered: ``metric``, ``aggregation``, ``_state_sync``, ``distributed._sync``, ``distributed._call``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._helpers.harness import run_distributed

pytestmark = pytest.mark.timeout(120)

MAX_CALLS = 172  # d2c2c41's count
MAX_FILES = 14  # d2c2c41 ran code in 15 package files


def _profile(rank: int, world: int) -> dict[str, Any]:
    import torch

    from torchmetrics_diff import MeanMetric
    from torchmetrics_diff.distributed import _backend

    # the wait polls (C calls only) until its collective completes: never the slow path past the poll bound, whose
    # Python calls (the board's watch, a threading.Event) depend on the machine's load, not on the sync's path
    # (restored below: the pool's workers run later tasks, whose waits must not spin for a minute)
    poll, _backend._POLL_S = _backend._POLL_S, 60.0
    try:
        return _profile_steady(MeanMetric(), torch.randn(64))
    finally:
        _backend._POLL_S = poll


def _profile_steady(metric: Any, x: Any) -> dict[str, Any]:
    import sys

    for _ in range(5):  # the plan agreed, the fingerprint steady
        metric.update(x)
        metric.compute()
    calls, files = 0, set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1
            name = frame.f_code.co_filename
            if "torchmetrics_diff" in name:
                files.add(name.split("torchmetrics_diff")[-1])

    sys.setprofile(profile)
    try:
        metric.update(x)
        value = metric.compute()
    finally:
        sys.setprofile(None)
    return {"calls": calls, "files": sorted(files), "value": float(value)}


def test_a_steady_sync_runs_no_more_calls_in_fewer_package_files() -> None:
    results = run_distributed(_profile, 2, timeout=60)
    res = results[0]
    assert results[1]["value"] == pytest.approx(res["value"])  # (a real sync: both ranks see the global mean)
    assert res["calls"] <= MAX_CALLS, f"{res['calls']} Python calls (at most {MAX_CALLS}); files: {res['files']}"
    assert len(res["files"]) <= MAX_FILES, f"{len(res['files'])} package files: {res['files']}"
