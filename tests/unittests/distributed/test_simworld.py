"""The simulated world of ``benchmarks/_simworld.py``: W identical ranks in one process.

Each expected value is built here from the identical-ranks model itself (every rank holds this rank's tensor), by
plain loops over the W ranks (a sum is W additions, a gather W copies), not by the backend's shortcuts. The tests
leave no process group initialised and undo the backend's registration.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist

import torchmetrics_diff as tmd
from torchmetrics_diff.distributed import all_gather_cat

pytestmark = pytest.mark.timeout(120)

W = 8
PATH = Path(__file__).resolve().parents[3] / "benchmarks" / "_simworld.py"


@pytest.fixture(scope="module")
def sim() -> Iterator[ModuleType]:
    """The module, loaded from its file; its backend unregistered again at the end when it was not before."""
    spec = importlib.util.spec_from_file_location("_simworld_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up by name)
    try:
        spec.loader.exec_module(module)
        was_registered = module.NAME.upper() in dist.Backend._plugins
        yield module
        if not was_registered:
            module.unregister()
            assert module.NAME not in dist.Backend.backend_list
    finally:
        sys.modules.pop(spec.name, None)
    assert not dist.is_initialized()


@pytest.fixture
def world8(sim: ModuleType) -> Iterator[ModuleType]:
    assert not dist.is_initialized()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (torch's renamed collectives)
        with sim.sim_world(W):
            yield sim
    assert not dist.is_initialized()


def _copies(x: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor: this rank's, W times."""
    return [x.clone() for _ in range(W)]


def _sum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in _copies(x):
        out = out + t
    return out


DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.bfloat16]


def _sample(dtype: torch.dtype, n: int = 6) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False, False][:n])
    return torch.arange(1, n + 1).to(dtype)


def test_world_shape(world8: ModuleType) -> None:
    assert dist.get_world_size() == W
    assert dist.get_rank() == 0
    assert dist.get_backend() == world8.NAME


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_gives_every_slot_the_input(world8: ModuleType, dtype: torch.dtype) -> None:
    x = _sample(dtype)
    expected = torch.cat(_copies(x))
    flat = torch.zeros(W * x.numel(), dtype=dtype)
    dist.all_gather_into_tensor(flat, x)
    assert torch.equal(flat, expected)
    stacked = torch.zeros(W, x.numel(), dtype=dtype)
    dist.all_gather_into_tensor(stacked, x)
    assert torch.equal(stacked.view(-1), expected)
    slots = [torch.zeros_like(x) for _ in range(W)]
    dist.all_gather(slots, x)
    assert torch.equal(torch.cat(slots), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
def test_all_reduce_sum_is_w_times(world8: ModuleType, dtype: torch.dtype) -> None:
    x = _sample(dtype)
    expected = _sum(x)
    dist.all_reduce(x)
    assert torch.equal(x, expected)
    assert torch.equal(expected, (W * _sample(torch.int64)).to(dtype))  # (the values are exact)


def test_all_reduce_other_ops(world8: ModuleType) -> None:
    x = torch.tensor([1.5, -2.0, 0.5])
    product = torch.ones_like(x)
    for t in _copies(x):
        product = product * t
    for op, expected in [
        (dist.ReduceOp.PRODUCT, product),
        (dist.ReduceOp.MAX, torch.stack(_copies(x)).amax(0)),
        (dist.ReduceOp.MIN, torch.stack(_copies(x)).amin(0)),
        (dist.ReduceOp.AVG, torch.stack(_copies(x)).mean(0)),
    ]:
        y = x.clone()
        dist.all_reduce(y, op=op)
        torch.testing.assert_close(y, expected)
    flags = torch.tensor([True, False])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.tolist() == [True, False]
    bits = torch.tensor([5, 3], dtype=torch.int64)
    dist.all_reduce(bits, op=dist.ReduceOp.BXOR)
    assert bits.tolist() == [0, 0]  # an even number of equal operands


def test_reduce_scatter_is_w_times_this_ranks_chunk(world8: ModuleType) -> None:
    n = 3
    x = torch.arange(W * n, dtype=torch.float32)
    mine = x[:n]  # rank 0's chunk of every rank's input
    expected = _sum(mine)
    out = torch.zeros(n)
    dist.reduce_scatter_tensor(out, x)
    assert torch.equal(out, expected)
    out = torch.zeros(n)
    dist.reduce_scatter(out, list(x.split(n)))
    assert torch.equal(out, expected)


def test_all_to_all_and_broadcast(world8: ModuleType) -> None:
    chunks = [torch.full((2,), float(r)) for r in range(W)]
    outs = [torch.empty(2) for _ in range(W)]
    dist.all_to_all(outs, chunks)
    # every rank sends this rank its chunk number 0, and every rank's chunks are this rank's
    assert all(torch.equal(o, chunks[0]) for o in outs)
    b = torch.tensor([4, 5])
    dist.broadcast(b, src=3)
    assert b.tolist() == [4, 5]
    dist.barrier()


def test_send_recv_fifo_per_tag(world8: ModuleType) -> None:
    a, b, c = torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([True, False])
    dist.send(a, dst=1)
    dist.send(b, dst=1)
    dist.send(c, dst=1, tag=7)
    got = torch.empty(2, dtype=torch.int64)
    assert dist.recv(got, src=W - 1) == W - 1
    assert torch.equal(got, a)  # the oldest first
    flag = torch.empty(2, dtype=torch.bool)
    dist.recv(flag, src=W - 1, tag=7)
    assert torch.equal(flag, c)
    dist.recv(got)  # from any peer
    assert torch.equal(got, b)
    # a receive posted first completes when its send is posted
    late = torch.zeros(3)
    work = dist.irecv(late, src=W - 1, tag=2)
    assert not work.is_completed()
    dist.isend(torch.ones(3), dst=1, tag=2).wait()
    assert work.is_completed() and work.wait()
    assert torch.equal(late, torch.ones(3))
    # a batch in ring order (as a ring exchange posts it)
    out = torch.zeros(2)
    ops = [dist.P2POp(dist.irecv, out, W - 1, tag=3), dist.P2POp(dist.isend, torch.tensor([6.0, 7.0]), 1, tag=3)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert out.tolist() == [6.0, 7.0]
    orphan = dist.irecv(torch.zeros(1), src=1, tag=9)
    with pytest.raises(RuntimeError, match="never sent"):
        orphan.wait()
    dist.isend(torch.zeros(1), dst=1, tag=9)  # (matches the orphan: nothing left over)
    assert dist.group.WORLD.pending() == 0


def test_work_is_complete(world8: ModuleType) -> None:
    x = torch.ones(2)
    work = dist.all_reduce(x, async_op=True)
    assert work.is_completed() and work.wait() and work.is_success()
    assert torch.equal(work.get_future().value()[0], torch.full((2,), float(W)))


def test_package_gives_the_identical_ranks_answer_at_64(sim: ModuleType) -> None:
    world = 64
    rows = torch.randn(4, 8)
    values = torch.randn(256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with sim.sim_world(world):
            assert torch.equal(all_gather_cat(rows), torch.cat([rows] * world))
            metric = tmd.MeanMetric()
            metric.update(values)
            metric.sync()
            # the synced states: every rank's sum and count, i.e. world times this rank's
            expected = {"mean_value": values.sum() * world, "weight": torch.tensor(float(values.numel() * world))}
            for name, value in expected.items():
                torch.testing.assert_close(getattr(metric, name).to(value.dtype), value, rtol=1e-5, atol=0)
            metric.unsync()
            torch.testing.assert_close(metric.compute(), values.mean())
            step = tmd.MeanMetric(dist_sync_on_step=True)
            torch.testing.assert_close(step(values), values.mean())
    assert not dist.is_initialized()
