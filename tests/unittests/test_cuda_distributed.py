"""Every loss (each strategy) and every metric class on CUDA tensors inside a process group, against references.

- One process with an NCCL process group (NCCL takes one process per GPU, so one GPU gives one rank): every
  case on ``cuda:0`` with the backend the package meets on GPUs.
- Two processes on the one GPU with gloo, uneven rows (3 and 6): the collectives, the sync engine and the ring
  move CUDA tensors. gloo takes CUDA tensors for some operations only; a first run asks gloo for each operation
  the package uses (raw ``torch.distributed`` calls on small CUDA tensors), and a test whose operations gloo
  refuses is skipped naming them and gloo's error.

The cases and their float64 references are in :mod:`tests._helpers.device_cases`. Skipped without CUDA; run by
``benchmarks/device_check.sh`` (``make test-cuda``) through the ``cuda`` marker.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._helpers.checks import assert_no_failures
from tests._helpers.device_cases import LOSS_CASES, METRIC_CASES, run_loss_cases, run_metric_cases
from tests._helpers.harness import free_port, run_distributed, run_once

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)"),
    pytest.mark.timeout(240),
]

RING = [c for c in LOSS_CASES if c[1] == "ring"]
NOT_RING = [c for c in LOSS_CASES if c[1] != "ring"]


def _nccl_body(rank: int, world: int, port: int) -> list[str]:
    """Every case at one process in an NCCL process group on ``cuda:0``."""
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", 0)
        return run_loss_cases(rank, world, device, LOSS_CASES) + run_metric_cases(
            rank, world, device, list(METRIC_CASES)
        )
    finally:
        dist.destroy_process_group()


def test_every_loss_and_metric_on_cuda_under_nccl_at_one_process() -> None:
    (failures,) = run_once(_nccl_body, 1, free_port(), init_group=False, timeout=180)
    assert_no_failures(failures)


# ------------------------------------------------------------------------------------ gloo at two processes
def _probe_body(rank: int, world: int) -> dict[str, str | None]:
    """Which operations gloo performs on CUDA tensors here: name -> None, or gloo's error (raw torch.distributed
    calls, not the package's wrappers, so that a refusal is gloo's)."""
    from torchmetrics_diff.distributed import _backend

    dev = torch.device("cuda", 0)
    nxt, prev = (rank + 1) % world, (rank - 1) % world

    def p2p() -> None:
        ops = [
            dist.P2POp(dist.isend, torch.ones(2, device=dev), nxt),
            dist.P2POp(dist.irecv, torch.empty(2, device=dev), prev),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    probes = {  # the very functions the package calls (chosen at import in distributed/_backend.py)
        "all_gather (flat)": lambda: _backend._all_gather_flat(
            torch.empty(2 * world, device=dev), torch.ones(2, device=dev)
        ),
        "all_reduce": lambda: dist.all_reduce(torch.ones(2, device=dev)),
        "reduce_scatter (flat)": lambda: _backend._reduce_scatter_flat(
            torch.empty(2, device=dev), torch.ones(2 * world, device=dev)
        ),
        "batch_isend_irecv": p2p,
    }
    out: dict[str, str | None] = {}
    for name, probe in probes.items():
        try:
            probe()
            torch.cuda.synchronize()
            out[name] = None
        except Exception as err:  # gloo's refusal, reported by the test that needs the operation
            out[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    return out


@functools.cache
def _gloo_refuses() -> dict[str, str]:
    refused: dict[str, str] = {}
    for per_rank in run_distributed(_probe_body, 2, timeout=120):
        refused.update({name: why for name, why in per_rank.items() if why is not None})
    return refused


def _needs(*operations: str) -> None:
    refused = {op: why for op, why in _gloo_refuses().items() if op in operations}
    if refused:
        pytest.skip(f"gloo does not take CUDA tensors here for {refused}")


def _gloo_body(rank: int, world: int, what: str, cases: Any) -> list[str]:
    device = torch.device("cuda", 0)
    if what == "losses":
        return run_loss_cases(rank, world, device, cases)
    return run_metric_cases(rank, world, device, cases)


def test_every_metric_on_cuda_under_gloo_at_two_processes() -> None:
    _needs("all_gather (flat)")
    per_rank = run_distributed(_gloo_body, 2, "metrics", list(METRIC_CASES), timeout=180)
    assert_no_failures([f for failures in per_rank for f in failures])


def test_every_loss_on_cuda_under_gloo_at_two_processes() -> None:
    _needs("all_gather (flat)", "all_reduce", "reduce_scatter (flat)")
    per_rank = run_distributed(_gloo_body, 2, "losses", NOT_RING, timeout=180)
    assert_no_failures([f for failures in per_rank for f in failures])


def test_ring_losses_on_cuda_under_gloo_at_two_processes() -> None:
    _needs("all_gather (flat)", "all_reduce", "batch_isend_irecv")
    per_rank = run_distributed(_gloo_body, 2, "losses", RING, timeout=180)
    assert_no_failures([f for failures in per_rank for f in failures])
