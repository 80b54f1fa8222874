"""Errors that say what happened: the package's public exception classes, a peer that left named as such, and
the disagreements of a loss named by the loss's call.

- The classes of :mod:`torchmetrics_diff.exceptions` are ``RuntimeError`` subclasses in one hierarchy, print and
  pickle under their public module, and are what the distributed code raises.
- A backend connection error (gloo's "Connection closed by peer") becomes a :class:`PeerLeftError` naming the call
  that was running and the peer when it is known; a real run at W = 3 where rank 2's process exits while ranks 0
  and 1 call ``compute()`` (bounded by a 5 s group timeout, so it can never hang).
- A loss whose inputs disagree between ranks (embedding width, dtype) names the loss's call
  (``CLIPLoss.forward: ...``) on every rank.

Package modules covered: ``exceptions``, ``distributed._failure``, ``distributed._call``, ``distributed._collectives``,
``_global.strategy``.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import pytest
import torch

from tests._helpers.harness import run_distributed, run_once_with_departures
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff import exceptions
from torchmetrics_diff.distributed import _failure
from torchmetrics_diff.exceptions import (
    CollectiveError,
    DistributedError,
    PeerFailedError,
    PeerLeftError,
    RanksDisagreeError,
    TorchMetricsUserError,
)

pytestmark = pytest.mark.timeout(180)

GLOO_CLOSED = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:62655. "
    "This is typically caused by a remote worker crashing."
)


# ------------------------------------------------------------------------------------------- the classes
def test_the_exception_classes_are_public_runtime_errors_in_one_hierarchy() -> None:
    assert set(exceptions.__all__) == {
        "AccumulationMismatchError",
        "CollectiveError",
        "DistributedError",
        "PeerFailedError",
        "PeerLeftError",
        "RanksDisagreeError",
        "ShapeMismatchError",
        "TorchMetricsUserError",
    }
    for cls in (DistributedError, CollectiveError, PeerLeftError, PeerFailedError, RanksDisagreeError):
        assert issubclass(cls, RuntimeError) and issubclass(cls, DistributedError), cls
        assert cls.__module__ == "torchmetrics_diff.exceptions", cls
        assert getattr(_failure, cls.__name__) is cls  # one class, raised by the distributed code
    assert issubclass(PeerLeftError, CollectiveError)
    assert issubclass(TorchMetricsUserError, RuntimeError) and not issubclass(TorchMetricsUserError, DistributedError)


def test_the_exceptions_pickle_with_their_attributes() -> None:
    """Errors cross process boundaries (spawned workers, Lightning's launchers): class and attributes survive."""
    left = PeerLeftError("rank 2 left", call="SumMetric.sync", rank=2, detail="Connection reset by peer")
    back = pickle.loads(pickle.dumps(left))
    assert type(back) is PeerLeftError and str(back) == "rank 2 left"
    assert (back.call, back.rank, back.detail) == ("SumMetric.sync", 2, "Connection reset by peer")
    failed = pickle.loads(pickle.dumps(PeerFailedError("rank 1 failed", ranks=[1])))
    assert type(failed) is PeerFailedError and failed.ranks == [1]


def test_a_connection_error_of_the_backend_names_the_call_and_the_peer() -> None:
    from torchmetrics_diff.distributed._hosts import Host

    board = Host(lambda: None, 0, 1, twin=False)  # a group's host without a store (nothing to post to)
    board.call = "CLIPLoss.forward: gather_all_tensors"  # (what the call's header exchange sets)
    err = _failure.backend_error("all_gather", RuntimeError(GLOO_CLOSED), None, board)
    assert type(err) is PeerLeftError and err.rank is None and err.call == "CLIPLoss.forward: gather_all_tensors"
    assert str(err).startswith(
        "a peer left during 'CLIPLoss.forward: gather_all_tensors': its process exited or lost its connection"
    ), err
    assert str(err).endswith(f"(gloo: {GLOO_CLOSED})"), err  # the backend's own text, last
    err = _failure.backend_error("fingerprint exchange", RuntimeError("Connection reset by peer"), peer=1)
    assert type(err) is PeerLeftError and err.rank == 1 and str(err).startswith("rank 1 left during"), err
    timeout = _failure.backend_error("all_gather", RuntimeError("Timed out waiting 2000ms for recv"))
    assert type(timeout) is CollectiveError and str(timeout) == "all_gather failed: Timed out waiting 2000ms for recv"
    # no board (no call exchanged a header on the group yet): the collective names itself
    assert "left during 'all_gather'" in str(_failure.backend_error("all_gather", RuntimeError(GLOO_CLOSED)))


# ------------------------------------------------------------------------------------------ a peer that left
def _rank_2_exits_body(rank: int, world: int) -> Any:
    from torchmetrics_diff.classification import MulticlassAccuracy

    metric = MulticlassAccuracy(num_classes=3)
    metric.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    if rank == 2:
        os._exit(0)  # the process exits without a word: its sockets close
    time.sleep(0.5)  # (the peer is gone before the sync starts)
    got = outcome(metric.compute)
    return got._replace(message=got.message[:600])


def test_a_peer_that_exits_is_named_as_a_peer_that_left() -> None:
    results = run_once_with_departures(_rank_2_exits_body, 3, pg_timeout=5.0, forked=True, timeout=150.0)
    assert isinstance(results[2], str) and results[2].startswith("left:"), results[2]
    needles = ("left during 'MulticlassAccuracy.sync'", "its process exited or lost its connection", "(gloo: ")
    problems = [problem(f"rank {rank}", results[rank], "PeerLeftError", needles, within=8.0) for rank in (0, 1)]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


# ---------------------------------------------------------------------------- a loss's disagreements named
def _clip_disagreement_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff.losses import CLIPLoss

    last = rank == world - 1
    out = {}
    width = 3 if last else 4
    image, text = torch.randn(2, width, dtype=torch.float64), torch.randn(2, width, dtype=torch.float64)
    out["width"] = outcome(lambda: CLIPLoss()(image, text, 2.0))
    dtype = torch.float32 if last else torch.float64
    image, text = torch.randn(2, 4, dtype=dtype), torch.randn(2, 4, dtype=dtype)
    out["dtype"] = outcome(lambda: CLIPLoss()(image, text, 2.0))
    out["after"] = outcome(lambda: CLIPLoss()(torch.randn(2, 4), torch.randn(2, 4), 2.0))
    return out


def test_a_loss_names_itself_when_ranks_disagree() -> None:
    results = run_distributed(_clip_disagreement_body, 2, timeout=60)
    problems = []
    for rank, res in enumerate(results):
        problems.append(
            problem(f"rank {rank} width", res["width"], "RanksDisagreeError", ("CLIPLoss.forward: ", "width"))
        )
        problems.append(
            problem(f"rank {rank} dtype", res["dtype"], "RanksDisagreeError", ("CLIPLoss.forward: ", "dtype"))
        )
        if not res["width"].message.startswith("CLIPLoss.forward: ") or not res["dtype"].message.startswith(
            "CLIPLoss.forward: "
        ):
            problems.append(f"rank {rank}: {res['width'].message!r} / {res['dtype'].message!r}")
        if res["after"].kind != "ok":
            problems.append(f"rank {rank}: the loss fails after the errors: {res['after']}")
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
