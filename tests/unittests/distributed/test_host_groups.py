"""Host groups beside a backend that carries no CPU tensors: the call headers' gloo twin never hangs and keeps the
group's timeout.

NCCL is stood in for by a backend registered under another name (``"standin_nccl"``) that wraps gloo and declares
CUDA alone in its capability, as NCCL does: the package then gives every group of it a gloo twin for the call
headers, exactly as beside NCCL (the data still moves over the stand-in, on the CPU tensors of this machine). The
process group is ``"cpu:standin_nccl,cuda:standin_nccl"`` so that it can carry the CPU data at all.

Four ranks, because the hangs need ranks that belong to different numbers of groups: torch names a group made with
``use_local_synchronization=True`` from how many groups the process knows, so a twin made that way got different
names on ranks 0, 1 and ranks 2, 3 after a ``new_group([0, 1])``. Each test starts four fresh processes.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests._helpers.doc_blocks import run_command
from tests._helpers.harness import free_port, run_once
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff import MeanMetric, MetricCollection, SumMetric
from torchmetrics_diff.distributed import _call, all_gather_cat
from torchmetrics_diff.functional import clip_loss
from torchmetrics_diff.losses import CLIPLoss

pytestmark = pytest.mark.timeout(240)

WORLD = 4
STANDIN = "standin_nccl"
ROOT = Path(__file__).resolve().parents[3]


def _standin(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _init(rank: int, port: int, timeout_s: float = 60.0, world: int = WORLD) -> None:
    if STANDIN not in dist.Backend.backend_list:
        dist.Backend.register_backend(STANDIN, _standin, devices=["cuda"])  # as NCCL: no CPU in its capability
    dist.init_process_group(
        f"cpu:{STANDIN},cuda:{STANDIN}",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _world_mean(rank: int, group: Any = None) -> float:
    """A world (or ``group``) MeanMetric of every rank's own value: the mean of the members' ranks."""
    metric = MeanMetric(process_group=group)
    metric.update(torch.tensor(float(dist.get_rank())))
    return metric.compute().item()


def _embeddings(rank: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    img = torch.nn.functional.normalize(torch.randn(rows, 4, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(rows, 4, generator=g, dtype=torch.float64), dim=1)
    return img, txt


def _scenarios_body(rank: int, world: int, port: int) -> dict[str, Any]:
    """Every scenario in turn in the same processes (so the groups of the earlier ones still exist)."""
    _init(rank, port)
    out: dict[str, Any] = {"twin": _call.host(None).twin}
    # 1. every rank makes a group of ranks 0 and 1 (Megatron's embedding group), then a world metric
    dist.new_group([0, 1])
    out["after new_group([0, 1])"] = _world_mean(rank)
    # 2. groups made with local synchronization on some ranks only, then a world metric
    if rank < 2:
        dist.new_group([0, 1], use_local_synchronization=True)
    else:
        dist.new_group([2, 3], use_local_synchronization=True)
        dist.new_group([2, 3], use_local_synchronization=True)  # ranks 2, 3 now know one group more
    fresh = MeanMetric()
    fresh.update(torch.tensor(float(rank)))
    out["after local groups"] = fresh.compute().item()
    # 3. a metric on a subgroup first (its twin exists on those ranks only), then a world metric, then the subgroup
    pair = dist.new_group([0, 1])
    out["subgroup first"] = _world_mean(rank, pair) if rank < 2 else None
    out["world after subgroup"] = _world_mean(rank)
    # 4. overlapping subgroups used in different orders on different ranks' sides
    low, high = dist.new_group([0, 1, 2]), dist.new_group([1, 2, 3])
    if rank == 0:
        out["overlap"] = [_world_mean(rank, low)]
    elif rank == 3:
        out["overlap"] = [_world_mean(rank, high)]
    elif rank == 1:  # member of both: low's first call, then high's
        out["overlap"] = [_world_mean(rank, low), _world_mean(rank, high)]
    else:
        out["overlap"] = [_world_mean(rank, low), _world_mean(rank, high)]
    out["world after overlap"] = _world_mean(rank)
    # 5. a 2-D device mesh: a CLIP loss on the data-parallel dimension, a collection on the world
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replica", "shard"))
    dp = mesh.get_group("shard")
    img, txt = _embeddings(rank, 2 + rank)
    out["mesh clip"] = CLIPLoss(process_group=dp)(img, txt, 3.0).detach()
    out["mesh clip ranks"] = dist.get_process_group_ranks(dp)
    collection = MetricCollection({"total": SumMetric(), "avg": MeanMetric()})
    collection.update(torch.tensor([float(rank), 1.0]))
    out["mesh collection"] = {k: v.item() for k, v in collection.compute().items()}
    out["twins"] = [
        _call.host(g).twin for g in (pair, low, high, dp) if dist.get_rank() in dist.get_process_group_ranks(g)
    ]
    # 6. ranks in different calls through the twin still raise on every rank
    metric = MeanMetric(dist_sync_on_step=True)
    out["mismatch"] = outcome(lambda: metric(torch.ones(1)) if rank == 0 else metric.compute())
    out["after mismatch"] = all_gather_cat(torch.tensor([float(rank)]), grad="none").tolist()
    # 7. the fingerprint of large groups over the twins: pairwise rounds between the twins' group ranks
    saved, _call.FULL_HEADER_MAX_RANKS = _call.FULL_HEADER_MAX_RANKS, 1
    try:
        out["fingerprint world"] = [_world_mean(rank) for _ in range(3)]
        out["fingerprint pair"] = [_world_mean(rank, pair) for _ in range(3)] if rank < 2 else None
        late = SumMetric()
        late.update(torch.tensor(1.0))
        out["fingerprint mismatch"] = outcome(lambda: late.compute() if rank == 3 else _world_mean(rank))
    finally:
        _call.FULL_HEADER_MAX_RANKS = saved
    # 8. the package keeps no group alive past destroy_process_group, nor the twins it made for them
    alive = _refs([g for g in (dist.group.WORLD, pair, low, high, dp) if _member(g)])
    alive += _refs([_call.host(g).channel for g in (None, pair, low, high, dp) if _member(g)])
    del pair, low, high, dp, mesh
    dist.destroy_process_group()
    out["alive after destroy"] = _alive(alive)
    return out


def _member(group: Any) -> bool:
    """Whether this rank belongs to ``group`` (``new_group`` gives non-members an int)."""
    return group is None or (not isinstance(group, int) and dist.get_rank() in dist.get_process_group_ranks(group))


def _refs(objects: list[Any]) -> list[Any]:
    return [weakref.ref(obj) for obj in objects]


def _alive(refs: list[Any]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def test_twins_never_hang_whatever_groups_exist_or_come_first() -> None:
    results = run_once(_scenarios_body, WORLD, free_port(), init_group=False, forked=True, timeout=200)
    for rank, res in enumerate(results):
        assert res["twin"], f"rank {rank}: the stand-in declares no CPU: the headers need a gloo twin"
        assert res["after new_group([0, 1])"] == pytest.approx(1.5), res
        assert res["after local groups"] == pytest.approx(1.5), res
        if rank < 2:
            assert res["subgroup first"] == pytest.approx(0.5), res
        assert res["world after subgroup"] == pytest.approx(1.5), res
        expected_overlap = {0: [1.0], 1: [1.0, 2.0], 2: [1.0, 2.0], 3: [2.0]}[rank]
        assert res["overlap"] == pytest.approx(expected_overlap), res
        assert res["world after overlap"] == pytest.approx(1.5), res
        assert res["mesh collection"] == pytest.approx({"total": 6.0 + 4.0, "avg": 10.0 / 8.0}), res
        assert all(res["twins"]), res["twins"]
        members = res["mesh clip ranks"]
        every = [_embeddings(r, 2 + r) for r in members]
        expected = clip_loss(torch.cat([e[0] for e in every]), torch.cat([e[1] for e in every]), 3.0)
        torch.testing.assert_close(res["mesh clip"], expected, rtol=1e-12, atol=1e-12)
        failure = problem(f"rank {rank}", res["mismatch"], "RuntimeError", ("different calls", "MeanMetric"))
        assert not failure, failure
        assert res["after mismatch"] == [0.0, 1.0, 2.0, 3.0], res
        assert res["fingerprint world"] == pytest.approx([1.5] * 3), res
        if rank < 2:
            assert res["fingerprint pair"] == pytest.approx([0.5] * 3), res
        failure = problem(f"rank {rank}", res["fingerprint mismatch"], "RuntimeError", ("different calls",))
        assert not failure, failure
        assert res["alive after destroy"] == 0, f"rank {rank}: groups or twins outlived destroy_process_group"


TIMEOUT_S = 3.0


def _timeout_body(rank: int, world: int, port: int) -> dict[str, Any]:
    """A group made with a short timeout; rank 3 skips the compute() its peers make (they wait in it), then makes
    it after they gave up (it waits in it alone)."""
    _init(rank, port)
    group = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=TIMEOUT_S))
    metric = SumMetric(process_group=group)
    metric.update(torch.tensor(1.0))
    metric.compute()  # the twin exists now, and every rank passed a call
    metric.update(torch.tensor(1.0))
    if rank == 3:
        time.sleep(1.5 * TIMEOUT_S)
    started = time.monotonic()
    got = outcome(metric.compute)
    elapsed = time.monotonic() - started
    dist.barrier()  # (the default group, whose timeout is long): every rank is done before the group goes
    dist.destroy_process_group()
    return {"got": got, "elapsed": elapsed}


def _sockets() -> int:
    """The sockets this process holds open (its file descriptors that are sockets)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the descriptor listdir itself used)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def _twin_sockets_body(rank: int, world: int, port: int) -> dict[str, Any]:
    """Sockets the twin opens over first calls, steady calls, shape changes and full headers."""
    from torchmetrics_diff import CatMetric
    from torchmetrics_diff.distributed import set_checks

    _init(rank, port, world=world)
    before = _sockets()
    mean, cat = MeanMetric(), CatMetric()
    values = []
    for step in range(3):
        mean.update(torch.tensor(float(rank + step)))
        values.append(mean.compute().item())
        cat.update(torch.full((3 + (step + rank) % 2,), float(rank)))  # (its rows change: every rank's header)
        values.append(cat.compute().sum().item())
    set_checks("full")
    values.append(mean.compute().item())
    set_checks("steady")
    return {"twin": _call.host(None).twin, "opened": _sockets() - before, "values": values}


@pytest.mark.parametrize("world", [4, 8, 16])
def test_the_twin_connects_to_its_partners_only(world: int) -> None:
    """The twin connects lazily, to the partners of its log-depth exchanges: at most ``log2 W + 2`` sockets per
    rank (``c = 1``, ``k = 2``: its partners, one more when W is not a power of two, its listening socket), where
    a full mesh holds ``W - 1`` (gloo's eager connection at the twin's making, every rank to every rank)."""
    results = run_once(_twin_sockets_body, world, free_port(), init_group=False, forked=True, timeout=200)
    bound = math.ceil(math.log2(world)) + 2
    for rank, res in enumerate(results):
        assert res["twin"], f"rank {rank}: the stand-in declares no CPU: the headers need a gloo twin"
        assert res["opened"] <= bound, f"rank {rank} of {world}: the twin opened {res['opened']} sockets (> {bound})"
        assert res["values"] == results[0]["values"], (rank, res["values"], results[0]["values"])


def test_a_twin_raises_within_twice_the_groups_timeout_on_every_rank() -> None:
    results = run_once(_timeout_body, WORLD, free_port(), init_group=False, forked=True, timeout=200)
    for rank, res in enumerate(results):
        failure = problem(f"rank {rank}", res["got"], "RuntimeError", ("SumMetric",))
        assert not failure, failure
        assert res["elapsed"] <= 2 * TIMEOUT_S + 1.0, f"rank {rank} raised after {res['elapsed']:.1f} s"


def _gloo_body(rank: int, world: int, port: int) -> int:
    """A plain gloo group (its headers travel over the group itself): used by a metric, a gather and a loss."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    alive = _refs([dist.group.WORLD])
    _world_mean(rank)
    all_gather_cat(torch.ones(2, 3))
    img, txt = _embeddings(rank, 3)
    CLIPLoss()(img.requires_grad_(), txt, 2.0).backward()
    dist.destroy_process_group()
    return _alive(alive)


def test_a_destroyed_gloo_group_is_not_kept_alive_until_interpreter_exit() -> None:
    """A group the package held on to outlived destroy_process_group; its gloo backend then ended during
    interpreter finalization, which sometimes aborted the process ("terminate called without an active
    exception") after a script had finished correctly."""
    assert run_once(_gloo_body, 2, free_port(), init_group=False, timeout=120) == [0, 0]


def _threads() -> int | None:
    """This process's native threads (gloo's workers among them), where the platform lists them."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None


def _ddp_body(rank: int, world: int, port: int) -> dict[str, Any]:
    """A DDP step, a metric and a loss; the process's first DDP loads Dynamo, which imports
    ``torch.distributed.nn.functional`` after the group exists, as in a training script."""
    early = "torch.distributed.nn.functional" in sys.modules
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    alive = _refs([dist.group.WORLD])
    model = DDP(torch.nn.Linear(3, 3))
    model(torch.randn(4, 3)).sum().backward()
    _world_mean(rank)
    img, txt = _embeddings(rank, 3)
    CLIPLoss()(img.requires_grad_(), txt, 2.0).backward()
    del model  # before destroy_process_group(), which then drops the group's last reference
    dist.barrier()
    before = _threads()
    dist.destroy_process_group()
    after = _threads()
    return {"imported before the group": early, "alive": _alive(alive), "threads": (before, after)}


def test_destroy_process_group_ends_a_ddp_runs_gloo_threads() -> None:
    """``torch.distributed.nn.functional`` puts the default group in ten default arguments when first imported.
    Imported after the group exists (DDP loads it), it kept the group, and gloo's worker threads, alive after
    ``destroy_process_group()``; a worker dropping a finished collective's tensors during interpreter shutdown
    then aborted a process that had done its work (5 of 80 runs of ``examples/moe_demo.py`` on a loaded machine).
    Importing the package binds those defaults before any group exists."""
    for rank, res in enumerate(run_once(_ddp_body, 2, free_port(), init_group=False, forked=True, timeout=120)):
        assert res["imported before the group"], f"rank {rank}: the package did not import torch.distributed.nn"
        assert res["alive"] == 0, f"rank {rank}: the default group outlived destroy_process_group()"
        before, after = res["threads"]
        if before is not None:  # gloo's two workers and its transport loop are joined
            assert after <= before - 3, f"rank {rank}: threads {before} before destroy_process_group(), {after} after"


def test_the_package_imported_after_the_group_exists_leaves_torch_distributed_nn_alone(tmp_path: Path) -> None:
    """Imported then, ``torch.distributed.nn.functional`` would capture the group: the package must not import it."""
    code = (
        "import sys\n"
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method={(tmp_path / 'store').as_uri()!r}, rank=0, world_size=1)\n"
        "import torchmetrics_diff.losses\n"
        "print('imported:', 'torch.distributed.nn.functional' in sys.modules)\n"
        "dist.destroy_process_group()\n"
    )
    status, out = run_command([sys.executable, "-c", code], tmp_path, 120, ROOT)
    assert status == 0, out
    assert "imported: False" in out, out
