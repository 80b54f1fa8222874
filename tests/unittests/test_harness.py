"""Self-tests of the multi-process harness (``tests/_helpers/harness.py``): rank identity, persistence, failures that
must not hang, and the one-off workers the benchmarks run on."""

from __future__ import annotations

import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist

from tests._helpers import harness as _harness
from tests._helpers.harness import DistributedTestFailure, run_distributed, run_once


def _identity(rank: int, world_size: int) -> tuple:
    ones = torch.ones(1)
    dist.all_reduce(ones)
    return rank, world_size, dist.get_rank(), dist.get_world_size(), ones.item()


def _rank_and_pid(rank: int, world_size: int) -> tuple[int, int]:
    return dist.get_rank(), os.getpid()


def _raise_on_rank1(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on purpose")
    return rank


def _hang_on_rank1(rank: int, world_size: int) -> int:
    if rank == 1:
        time.sleep(600)
    return rank


def _die_on_rank0(rank: int, world_size: int) -> int:
    if rank == 0:
        os._exit(3)
    return rank


def _unpicklable(rank: int, world_size: int) -> object:
    return lambda: rank


def _group_and_pid(rank: int, world_size: int) -> tuple[bool, int, int]:
    return dist.is_initialized(), os.getpid(), os.getppid()


def _add(rank: int, world_size: int, x: torch.Tensor, *, y: int) -> torch.Tensor:
    return x + rank + y


def _pids(world_size: int) -> list[int]:
    result = run_distributed(_rank_and_pid, world_size)
    assert [rank for rank, _ in result] == list(range(world_size))
    return [pid for _, pid in result]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_and_all_reduce(world_size: int) -> None:
    expected = [(rank, world_size, rank, world_size, float(world_size)) for rank in range(world_size)]
    assert run_distributed(_identity, world_size) == expected


def test_args_and_kwargs_are_passed() -> None:
    result = run_distributed(_add, 2, torch.tensor([10.0, 20.0]), y=100)
    torch.testing.assert_close(torch.stack(result), torch.tensor([[110.0, 120.0], [111.0, 121.0]]))


def test_pool_is_persistent_and_ranks_stable() -> None:
    first = _pids(3)
    assert _pids(3) == first
    assert len(set(first)) == 3 and os.getpid() not in first


def test_exception_on_one_rank_is_reported_and_pool_rebuilt() -> None:
    before = _pids(2)
    with pytest.raises(DistributedTestFailure) as info:
        run_distributed(_raise_on_rank1, 2)
    message = str(info.value)
    assert "rank 1" in message and "rank 0" not in message
    assert "Traceback" in message and "ValueError: boom on purpose" in message
    after = _pids(2)
    assert not set(after) & set(before)


def test_hang_times_out_and_pool_rebuilt() -> None:
    _pids(2)  # make sure the pool exists so the timing measures only the hang
    start = time.monotonic()
    with pytest.raises(DistributedTestFailure, match=r"timed out after 2\.0s; ranks \[1\] did not finish"):
        run_distributed(_hang_on_rank1, 2, timeout=2.0)
    assert time.monotonic() - start < 15.0
    assert run_distributed(_identity, 2) == [(0, 2, 0, 2, 2.0), (1, 2, 1, 2, 2.0)]


def test_worker_death_is_reported_and_pool_rebuilt() -> None:
    with pytest.raises(DistributedTestFailure, match="exit code 3") as info:
        run_distributed(_die_on_rank0, 2)
    assert "rank 0" in str(info.value) and "rank 1" not in str(info.value)
    assert run_distributed(_identity, 2) == [(0, 2, 0, 2, 2.0), (1, 2, 1, 2, 2.0)]


def test_unpicklable_return_value_is_a_failure() -> None:
    with pytest.raises(DistributedTestFailure, match="not picklable"):
        run_distributed(_unpicklable, 1)
    assert run_distributed(_identity, 1) == [(0, 1, 0, 1, 1.0)]


def test_stale_answers_are_ignored() -> None:
    run_distributed(_identity, 1)
    _harness._POOLS[1].results.put((0, -1, "ok", pickle.dumps("stale")))
    assert run_distributed(_identity, 1) == [(0, 1, 0, 1, 1.0)]


def test_unsupported_world_size() -> None:
    with pytest.raises(ValueError, match="world_size"):
        run_distributed(_identity, 4)


def test_run_once_starts_fresh_workers_of_any_size_and_stops_them() -> None:
    """The benchmarks' form: new processes per call (their peak memory is their own), no group when asked; spawned
    by this process, or with ``forked=True`` forked by the pools' fork server (what tests use)."""
    (first,) = run_once(_group_and_pid, 1, init_group=False, timeout=120.0)
    (second,) = run_once(_group_and_pid, 1, init_group=False, forked=True, timeout=120.0)
    assert first[0] is False and second[0] is False
    assert first[1] != second[1] and os.getpid() not in (first[1], second[1])
    assert first[2] == os.getpid() and second[2] != os.getpid()  # spawned here; forked by the server
    assert run_once(_identity, 3, timeout=120.0) == [(r, 3, r, 3, 3.0) for r in range(3)]
    with pytest.raises(DistributedTestFailure, match="ValueError: boom on purpose"):
        run_once(_raise_on_rank1, 2, forked=True, timeout=120.0)
