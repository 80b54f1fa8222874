"""The call header (``distributed._call``): fixed size, names and counts, failure markers, the inline area, the
fingerprint that stands for it in large groups, and the checks modes. (The gloo twin beside a backend without CPU
tensors: ``test_host_groups.py``.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._helpers.collectives import record_collectives
from tests._helpers.harness import run_distributed, run_once
from tests._helpers.outcomes import outcome, problem
from torchmetrics_diff.distributed import _call, all_gather_cat

pytestmark = pytest.mark.timeout(120)


def test_names_round_trip_through_the_header_and_are_truncated() -> None:
    for name in ("", "all_reduce", "CLIPLoss.update: gather_all_tensors"):
        assert _call._decode(_call._encode(name)) == name
    long = "x" * 100
    assert _call._decode(_call._encode(long)) == "x" * (8 * _call._NAME_INTS)


def test_a_payload_longer_than_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match=f"at most {_call.PAYLOAD} ints; got {_call.PAYLOAD + 1}"):
        _call.exchange("too long", [0] * (_call.PAYLOAD + 1), None)


def _headers_body(rank: int, world: int) -> dict[str, Any]:
    """Payloads come back by rank; a public collective is its header exchange and its data collective."""
    with record_collectives() as log:
        got = _call.exchange("probe", [rank, 7 * rank], None)
        all_gather_cat(torch.ones(2 + rank, 3), grad="none")
    return {"got": got, "log": log}


def test_every_rank_gets_every_payload() -> None:
    results = run_distributed(_headers_body, 3, timeout=60)
    for rank, res in enumerate(results):
        assert res["got"] == [[r, 7 * r] for r in range(3)], f"rank {rank}: {res['got']}"
        assert len(res["log"]) == 3, f"rank {rank}: header + (header + data) of all_gather_cat: {res['log']}"


def _area_body(rank: int, world: int) -> dict[str, Any]:
    """The inline area follows the CPU rows calls on the group want: it grows, carries them, and shrinks back."""
    from torchmetrics_diff import CatMetric, SumMetric
    from torchmetrics_diff.distributed import all_reduce

    out: dict[str, Any] = {"start": _call.inline_capacity(None)}
    g = torch.Generator().manual_seed(rank)
    metric = CatMetric()
    counts, values = [], []
    for _ in range(3):  # rows of 2000 floats (8 KB): over the first area, under the largest
        metric.reset()
        metric.update(torch.rand(2000 + rank, generator=g))
        with record_collectives() as log:
            values.append(metric.compute())
        counts.append(len(log))
    out["counts"], out["values"], out["grown"] = counts, values, _call.inline_capacity(None)
    # ranks in different calls after the area grew: still one size per exchange, so every rank raises
    out["mismatch"] = outcome(lambda: metric.compute() if rank == 0 else all_reduce(torch.ones(2), grad="none"))
    small = SumMetric()
    small.update(torch.ones(2))
    for _ in range(_call._WINDOW):
        small.compute()
    out["shrunk"] = _call.inline_capacity(None)
    huge = CatMetric()  # rows over the largest area: never inline, the area stays small
    huge.update(torch.rand(_call.MAX_INLINE_BYTES // 4 + 10))
    counts = []
    for _ in range(3):
        with record_collectives() as log:
            huge.compute()
        counts.append(len(log))
    out["huge counts"], out["after huge"] = counts, _call.inline_capacity(None)
    # an all_reduce of a CPU tensor larger than the area: its header asks for room, so the next ones ride inline
    x = torch.rand(2000, generator=g, dtype=torch.float64, requires_grad=True)
    counts, sums, grads = [], [], []
    for _ in range(3):
        with record_collectives() as log:
            total = all_reduce(x * 3.0)
        counts.append(len(log))
        (grad,) = torch.autograd.grad(total.sum(), x)
        sums.append(total.detach())
        grads.append(grad)
    out["reduce counts"], out["reduce sums"], out["reduce grads"] = counts, sums, grads
    out["reduce input"] = x.detach()
    return out


def test_the_inline_area_grows_to_the_rows_calls_want_and_shrinks_back() -> None:
    results = run_distributed(_area_body, 2, timeout=90)
    every = [torch.rand(2000 + r, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    expected = torch.cat(every)
    for rank, res in enumerate(results):
        assert res["start"] == _call.INLINE_BYTES, res["start"]
        for value in res["values"][:1]:
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
        assert all(v.shape == (4001,) for v in res["values"]), [v.shape for v in res["values"]]
        # first sync: header + the agreement's metadata + the row; second: the plan's row, the
        # row after the header, whose header asks for an area that fits it; third: the row inside the header exchange
        assert res["counts"] == [3, 2, 1], f"rank {rank}: {res['counts']}"
        assert 8004 <= res["grown"] <= 8004 + _call._STEP, f"rank {rank}: area {res['grown']}"
        err = problem(f"rank {rank}", res["mismatch"], "RuntimeError", ("different calls", "CatMetric.sync"))
        assert err is None, err
        assert res["shrunk"] == _call.INLINE_BYTES, f"rank {rank}: area after {_call._WINDOW} small calls"
        assert res["huge counts"][1:] == [2, 2], f"rank {rank}: header + row: {res['huge counts']}"
        assert res["after huge"] == _call.INLINE_BYTES, f"rank {rank}: {res['after huge']}"
        # header + all-reduce, then the rows inside the header exchange: the same sums and (local) gradients
        assert res["reduce counts"] == [2, 1, 1], f"rank {rank}: {res['reduce counts']}"
        want = 3.0 * (results[0]["reduce input"] + results[1]["reduce input"])
        for total, grad in zip(res["reduce sums"], res["reduce grads"]):
            torch.testing.assert_close(total, want, rtol=1e-15, atol=0)
            torch.testing.assert_close(grad, torch.full_like(grad, 3.0), rtol=0, atol=0)


# --------------------------------------------------------------------------- the fingerprint of large groups
# Groups of more than FULL_HEADER_MAX_RANKS ranks exchange a fingerprint; the bodies lower that bound to 1 so that the
# two and three ranks here take the same path as a group of thousands.


def _fingerprint_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff import SumMetric
    from torchmetrics_diff.distributed import all_reduce, gather_all_tensors
    from torchmetrics_diff.distributed._collectives import fail_together

    saved = _call.FULL_HEADER_MAX_RANKS
    _call.FULL_HEADER_MAX_RANKS = 1
    try:
        out: dict[str, Any] = {"capacity": _call.inline_capacity(None)}
        logs, cats, gathers = [], [], []
        rows = [2 + rank, 2 + rank, 2 + rank, 5 if rank == world - 1 else 2 + rank, 2 + rank]
        for n in rows:  # the last rank's rows change at the 4th call, then change back
            x = torch.arange(float(n)) + 10 * rank
            with record_collectives() as log:
                cats.append(all_gather_cat(x, grad="none"))
                gathers.append(gather_all_tensors(x.view(1, -1), grad="none"))
            logs.append(log)
        out["logs"], out["cats"], out["gathers"] = logs, cats, gathers
        metric = SumMetric()
        syncs = []
        for step in range(4):
            metric.update(torch.tensor(float(rank + step)))
            with record_collectives() as log:
                value = metric.compute()
            syncs.append((value.item(), log))
        out["syncs"] = syncs
        x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
        total = all_reduce(x * (rank + 1))
        (out["reduce grad"],) = torch.autograd.grad(total.sum(), x)
        out["reduce"] = total.detach()
        # ranks in different calls, after steady calls: every rank raises, in this call
        out["mismatch"] = outcome(lambda: metric.compute() if rank == 0 else all_reduce(torch.ones(2), grad="none"))
        out["after mismatch"] = all_gather_cat(torch.tensor([float(rank)]), grad="none").tolist()
        # a failed rank in a steady call: its peers raise naming it
        y = torch.ones(3)
        all_gather_cat(y, grad="none")
        if rank == 1:
            out["failed"] = outcome(lambda: fail_together(ValueError("rank 1's bad input")))
        else:
            out["failed"] = outcome(lambda: all_gather_cat(y, grad="none"))
        return out
    finally:
        _call.FULL_HEADER_MAX_RANKS = saved


@pytest.mark.parametrize("world_size", [2, 3])
def test_fingerprint_calls_agree_without_every_header_and_raise_on_every_rank(world_size: int) -> None:
    results = run_distributed(_fingerprint_body, world_size, timeout=120)
    last = world_size - 1
    for rank, res in enumerate(results):
        assert res["capacity"] == 0, "no inline area: fingerprints carry no data"
        for call, log in enumerate(res["logs"]):
            # every call: a fingerprint, then the data; every rank's header too at a first call or a change of rows
            full = call in (0, 3, 4)
            expected = ["host_max_reduce", *(["_all_gather_flat"] if full else []), "_all_gather_flat"] * 2
            assert log == expected, f"rank {rank}, call {call}: {log}"
        for call, (cat, gathered) in enumerate(zip(res["cats"], res["gathers"])):
            rows = [2 + r if not (call == 3 and r == last) else 5 for r in range(world_size)]
            expected = torch.cat([torch.arange(float(n)) + 10 * r for r, n in enumerate(rows)])
            assert torch.equal(cat, expected), (rank, call, cat)
            assert [t.shape[1] for t in gathered] == rows, (rank, call)
        for step, (value, log) in enumerate(res["syncs"]):
            assert value == sum(r * (step + 1) + step * (step + 1) / 2 for r in range(world_size)), (step, value)
            # the first sync agrees on a plan (every rank's header, the metadata, the row), the second is the first
            # through the plan's row (its header is new: every rank's again); then the fingerprint and the data
            steady = ["host_max_reduce", "_all_gather_flat"]
            assert (log[0] == "host_max_reduce" and len(log) > 2) if step < 2 else log == steady, (step, log)
        weights = sum(range(1, world_size + 1))
        torch.testing.assert_close(res["reduce"], torch.tensor([1.0, 2.0], dtype=torch.float64) * weights)
        torch.testing.assert_close(res["reduce grad"], torch.full((2,), float(rank + 1), dtype=torch.float64))
        failure = problem(f"rank {rank}", res["mismatch"], "RuntimeError", ("different calls", "SumMetric"))
        assert not failure, failure
        assert res["after mismatch"] == [float(r) for r in range(world_size)]
        if rank == 1:
            failure = problem(f"rank {rank}", res["failed"], "ValueError", ("rank 1's bad input",))
        else:
            failure = problem(f"rank {rank}", res["failed"], "RuntimeError", ("rank 1", "raised an error"))
        assert not failure, failure


def _off_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff.distributed import get_checks, set_checks

    # a group of its own: with checks off a rank trusts the metadata it remembers, so the ranks' histories must be the
    # same, and the pool's default group has run other tasks (with rows that differ between ranks)
    group = dist.new_group(list(range(world)))
    set_checks("off", group)
    out: dict[str, Any] = {"mode": get_checks(group)}
    logs, values = [], []
    for rows in (2, 2, 2, 3, 3):  # the shapes change on every rank alike at the fourth call
        with record_collectives() as log:
            values.append(all_gather_cat(torch.full((rows,), float(rank)), group=group, grad="none"))
        logs.append(log)
    out["logs"], out["values"] = logs, values
    dist.destroy_process_group(group)
    return out


def test_checks_off_exchanges_headers_only_for_metadata_new_to_the_rank() -> None:
    results = run_distributed(_off_body, 2, timeout=60)
    header_and_data, data = ["_all_gather_flat", "_all_gather_flat"], ["_all_gather_flat"]
    for rank, res in enumerate(results):
        assert res["mode"] == "off", rank
        assert res["logs"] == [header_and_data, data, data, header_and_data, data], (rank, res["logs"])
        for call, value in enumerate(res["values"]):
            rows = 2 if call < 3 else 3
            assert value.tolist() == [0.0] * rows + [1.0] * rows, (rank, call, value)


def test_checks_are_validated_and_read_without_a_process_group() -> None:
    from torchmetrics_diff.distributed import get_checks, set_checks

    with pytest.raises(ValueError, match="`mode` must be one of"):
        set_checks("sometimes")
    assert get_checks() == "steady"


def _subgroup_fingerprint_body(rank: int, world: int) -> dict[str, Any]:
    """The fingerprint's pairwise rounds address group ranks, not global ones: a subgroup of global ranks 1 and 2."""
    from torchmetrics_diff import SumMetric

    saved = _call.FULL_HEADER_MAX_RANKS
    _call.FULL_HEADER_MAX_RANKS = 1
    try:
        group = dist.new_group([1, 2])
        if rank == 0:
            return {}
        metric = SumMetric(process_group=group)
        values, logs = [], []
        for step in range(3):
            metric.update(torch.tensor(float(rank + step)))
            with record_collectives() as log:
                values.append(metric.compute().item())
            logs.append(log)
        cat = all_gather_cat(torch.full((rank,), float(rank)), group=group, grad="none")
        return {"values": values, "logs": logs, "cat": cat.tolist()}
    finally:
        _call.FULL_HEADER_MAX_RANKS = saved


def test_fingerprint_rounds_on_a_subgroup_address_its_group_ranks() -> None:
    results = run_distributed(_subgroup_fingerprint_body, 3, timeout=90)
    for rank in (1, 2):
        res = results[rank]
        # the sums over global ranks 1 and 2 of every update so far
        expected = [sum(r + s for r in (1, 2) for s in range(step + 1)) for step in range(3)]
        assert res["values"] == expected, (rank, res["values"])
        assert all(log[0] == "host_max_reduce" for log in res["logs"]), (rank, res["logs"])
        assert res["cat"] == [1.0, 2.0, 2.0], (rank, res["cat"])


# ------------------------------------------------------------------ whole names compared; errors sized for W
def _long_names_body(rank: int, world: int) -> dict[str, Any]:
    """Two metric classes whose names share their first 64 characters, one on rank 0, the other elsewhere, under
    every checks mode in turn (each mode's first call exchanges every rank's header)."""
    from torchmetrics_diff import SumMetric
    from torchmetrics_diff.distributed import set_checks

    shared = "GlobalTokenWeightedAccumulatorForTheValidationSetOfEveryLanguage"  # 64 characters, then the class's own
    assert len(shared) == 64
    out = {}
    for mode in ("steady", "full", "off"):
        set_checks(mode)
        cls = type(shared + ("Sum" if rank == 0 else "Total") + mode, (SumMetric,), {})
        metric = cls()
        metric.update(torch.tensor(1.0 if rank == 0 else 100.0))
        out[mode] = outcome(metric.compute)
    set_checks("steady")
    return out


@pytest.mark.parametrize("world_size", [2, 9])
def test_calls_whose_names_share_64_characters_are_not_paired(world_size: int) -> None:
    """The header compares a hash of the whole name (its readable part is 48 bytes): every rank raises, in every
    checks mode, where the ranks used to pair and return a wrong sum (201 at W=2 for 3 and 300)."""
    results = run_once(_long_names_body, world_size, forked=True, timeout=120)
    for rank, res in enumerate(results):
        for mode, got in res.items():
            failure = problem(
                f"rank {rank} {mode}", got, "RanksDisagreeError", ("ranks are in different calls", "...'")
            )
            assert not failure, failure


def _table(calls: list[tuple[str, int, int]]) -> Any:
    """A received header table of one row per rank: ``(name, count, sequence)``."""
    import numpy as np

    heads = np.zeros((len(calls), _call.HEADER_INTS), dtype=np.int64)
    for r, (name, count, seq) in enumerate(calls):
        heads[r, :4] = (_call._MAGIC, seq, count, 0)
        heads[r, _call._NAME] = (_call._name_ids(name)[0], *_call._encode(name))
    return heads


def test_an_error_of_4096_ranks_names_them_by_what_they_did_in_a_few_hundred_characters() -> None:
    world = 4096
    names = [f"rank {r}" for r in range(world)]
    one_late = _table([("MeanMetric.compute: sync", 11, 56)] * (world - 1) + [("MeanMetric.update", 3, 56)])
    message = str(_call._different_calls(one_late, names))
    assert "ranks 0-4094: 'MeanMetric.compute: sync' (the object's 12th such call; call 57 on the group)" in message
    assert "rank 4095: 'MeanMetric.update' (the object's 4th such call; call 57 on the group)" in message
    assert len(message) < 400, len(message)
    # every rank in a call of its own: four kinds named, the rest counted
    scattered = _table([(f"Metric{r % 7}.compute", r % 3, 9) for r in range(world)])
    message = str(_call._different_calls(scattered, names))
    assert "other calls on" in message and "more runs" in message, message
    assert len(message) < 1000, len(message)


def test_peers_that_failed_are_listed_in_a_bounded_message() -> None:
    from torchmetrics_diff.distributed._failure import peers_failed, ranks_text

    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"
    assert ranks_text(list(range(0, 40, 2))) == "ranks 0, 2, 4, 6 and 16 more runs (20 ranks)"
    message = str(peers_failed("SumMetric", list(range(4000)), sync=True))
    assert "ranks 0-3999" in message and len(message) < 200, message
    assert "rank(s) [1, 2]" in str(peers_failed("SumMetric", [1, 2], sync=True))


def _raising_entry_body(rank: int, world: int) -> dict[str, Any]:
    from torchmetrics_diff.losses import CLIPLoss

    loss = CLIPLoss()
    image, text = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)  # dtypes that differ: refused
    error = outcome(lambda: loss(image, text, 2.0))
    after = _call.call_name("all_gather_cat")
    with record_collectives() as log:
        cat = all_gather_cat(torch.full((1,), float(rank)), grad="none")
    return {"error": error, "after": after, "cat": cat.tolist(), "log": log}


def test_an_entry_point_that_raises_names_no_later_call() -> None:
    """An entry point that raises on its way (an input refused before any collective) ends its name there: the next
    call outside any entry point is named by its operation alone, and the ranks still agree on it."""
    for rank, res in enumerate(run_distributed(_raising_entry_body, 2, timeout=60)):
        failure = problem(f"rank {rank}", res["error"], "ValueError", ("dtype",))
        assert not failure, failure
        assert res["after"] == "all_gather_cat", (rank, res["after"])
        assert res["cat"] == [0.0, 1.0] and res["log"], (rank, res)
