"""Bugs found by the property suite, pinned as plain examples (
the generators in ``tests/_helpers/states.py`` and ``test_prop_metric.py`` now draw these cases too).

Each test states the contract, a minimal reproduction, and the fix; they failed before it.

Package modules covered: the sync engine ``distributed._sync`` and ``metric``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from torchmetrics_diff.distributed._sync import SyncPlan, sync_states

pytestmark = pytest.mark.timeout(120)


def sum0(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as err:  # the error is the result here
        return type(err).__name__, str(err)


# ------------------------------------------------------------------------------- zero bytes in one gather


def _zero_byte_body(rank: int, world: int) -> dict:
    out = {}
    # a None-reduction state of zero elements on every rank (the row's only piece has no room)
    out["None state of shape (0, 2)"] = _outcome(lambda: sync_states({"a": torch.zeros(0, 2)}, {"a": None}))
    # the plan's row again: its only piece besides the sum is the zero-size gathered state
    plan = SyncPlan()
    states = {"s": torch.ones(2), "g": torch.zeros(0)}
    sync_states(states, {"s": "sum", "g": None}, plan=plan)
    out["second sync, None state of shape (0,)"] = _outcome(
        lambda: sync_states(states, {"s": "sum", "g": None}, plan=plan)
    )
    # a large sum state goes to all_reduce, so the row holds only a zero-size min state
    big = {"big": torch.ones(5000, dtype=torch.float64), "m": torch.zeros(0)}
    out["large sum + zero-size min"] = _outcome(lambda: sync_states(big, {"big": "sum", "m": "min"}))
    return out


def test_round_b_of_zero_bytes() -> None:
    """A gather whose row is zero bytes long breaks the engine.

    ``_gather_rows`` sizes the row as the aligned sum of the pieces; when every piece is zero bytes the row is 0
    bytes, the ``(W, 0)`` uint8 table gets stride ``(1, 1)``, and ``table[:, off:off + 0].view(float32)`` raises
    ``RuntimeError: self.stride(0) must be divisible by 4 to view Byte as Float``. Reached by zero-size states with
    a callable/``None``/``min``/``max`` reduction (a zero-size sum/mean state next to a large all-reduced one,
    too). Suggested fix: in ``_RowJob.run`` give zero-capacity slots ``torch.empty((W, 0), dtype=t.dtype)``
    instead of a view (or make ``row_bytes`` at least 8), or skip round B when its row is empty — every rank knows.
    """
    results = run_distributed(_zero_byte_body, 2)
    bad = {k: v for r in results for k, v in r.items() if v[0] != "ok"}
    assert not bad, f"zero-byte gathers failed: {bad}"
    assert results[0]["None state of shape (0, 2)"][1]["a"].shape == (2, 0, 2)


# -------------------------------------------------------------------------------- cat with a 0 trailing dim


def _zero_trailing_body(rank: int, world: int) -> Any:
    states = {"s": torch.ones(1), "a": torch.zeros(1 + rank, 0, 2)}
    return _outcome(lambda: sync_states(states, {"s": "sum", "a": "cat"}))


def test_cat_state_with_a_zero_trailing_dim() -> None:
    """A ``cat`` state whose trailing shape contains a 0 cannot be unpacked.

    ``_Sync._finish`` restores each cat state with ``flat.view(-1, *dims)``, ambiguous when ``dims`` has a 0:
    ``RuntimeError: cannot reshape tensor of 0 elements into shape [-1, 0, 2]``. (Alone, the state hits the
    zero-byte gather of :func:`test_round_b_of_zero_bytes` first.) Suggested fix: ``flat.view(sum(rows[name]),
    *dims)``.
    """
    results = run_distributed(_zero_trailing_body, 2)
    for rank, (status, value) in enumerate(results):
        assert status == "ok", f"rank {rank}: {status}: {value}"
        assert value["a"].shape == (3, 0, 2), f"rank {rank}: {value['a'].shape}"


# ------------------------------------------------------------------------------------ complex128 alignment


def _complex_body(rank: int, world: int) -> dict:
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128) * (rank + 1)
    return {
        "sum": _outcome(lambda: sync_states({"f": torch.ones(1), "z": z}, {"f": "sum", "z": "sum"})),
        "cat": _outcome(lambda: sync_states({"f": torch.ones(1), "z": z}, {"f": "sum", "z": "cat"})),
    }


def test_complex128_state_after_a_4_byte_state() -> None:
    """complex128 is a supported dtype (``_backend._DTYPES``), but the engine aligns pieces to 8 bytes only.

    With a float32 state of one element first, the complex128 piece starts at byte offset 8 of its row and
    ``view(torch.complex128)`` raises ``self.storage_offset() must be divisible by 16``. Suggested fix: align
    offsets (and row sizes) to 16 bytes, or to the largest itemsize in the row.
    """
    results = run_distributed(_complex_body, 2)
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
    for rank, got in enumerate(results):
        status, value = got["sum"]
        assert status == "ok", f"rank {rank} sum: {status}: {value}"
        torch.testing.assert_close(value["z"], 3 * z)
        status, value = got["cat"]
        assert status == "ok", f"rank {rank} cat: {status}: {value}"
        torch.testing.assert_close(value["z"], torch.cat([z, 2 * z]))


# ---------------------------------------------------------------------------------- grad_scale at W = 1


def test_sync_states_grad_scale_ignored_at_world_size_1() -> None:
    """``grad_scale`` "multiplies the gradient reaching the local inputs" — except with one rank.

    ``sync_states`` returns ``_single(...)`` for world size 1 before ``scale_grad`` is applied, so
    ``grad_scale=3`` gives a gradient of 1 there and 3 with two ranks. (``Metric`` passes its scale through
    ``scale_grad`` itself and is not affected.) Suggested fix: apply ``scale_grad(value, grad_scale)`` in the
    world-size-1 branch when ``grad == "local"``.
    """
    x = torch.ones(2, requires_grad=True)
    out = sync_states({"a": x}, {"a": "sum"}, grad="local", grad_scale=3.0)
    out["a"].sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 3.0)), f"gradient {x.grad}, expected 3s"


# ------------------------------------------------------------- a bad argument on one rank hangs the others


def _bad_argument_body(rank: int, world: int) -> list:
    # a subgroup with a short timeout: with the bug, the other rank waits for it instead of 30 min
    group = dist.new_group(timeout=timedelta(seconds=4))
    out = []
    try:
        for what, grad, fx in (("grad='sync'", "sync", "sum"), ("reduction 'prod'", "none", "prod")):
            bad = rank == 1
            start = time.monotonic()
            status, message = _outcome(
                lambda g=grad if bad else "none", f=fx if bad else "sum": sync_states(
                    {"a": torch.ones(1)}, {"a": f}, group, grad=g
                )
            )
            out.append((what, status, str(message)[:300], round(time.monotonic() - start, 1)))
            if status == "CollectiveError" and "failed" in message:
                break  # the subgroup timed out: it is broken now
    finally:
        dist.barrier()  # on the default group: rank 1 must not tear the subgroup down under rank 0
        dist.destroy_process_group(group)
    return out


def test_bad_argument_on_one_rank_raises_everywhere_without_waiting() -> None:
    """A rank passing a bad ``grad`` or reduction raises ``ValueError`` at once, *before* round A; the other ranks
    wait in round A until the group's timeout (30 minutes by default) and then fail with a collective timeout.

    The docs promise otherwise ("when ... a collective's arguments are bad on one rank, that rank still takes part
    in the first exchange with a failure marker"), and the collectives do it. Suggested fix: in ``sync_states``
    validate ``grad`` and ``reductions`` inside the ``try`` that calls ``fail_sync`` (after ``group_size``), so
    a bad argument joins round A with the failure marker.
    """
    results = run_distributed(_bad_argument_body, 2, timeout=60)
    problems = []
    for what, status, message, seconds in results[0]:
        if status != "PeerFailedError" or "rank(s) [1]" not in message or seconds > 2:
            problems.append(f"rank 0, {what} on rank 1: {status} after {seconds}s: {message!r}")
    for what, status, message, _ in results[1]:
        if status != "ValueError":
            problems.append(f"rank 1, {what}: {status}: {message!r}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------- reductions missing from the signature


def _reduction_body(rank: int, world: int) -> dict:
    value = torch.ones(2) * (rank + 1)
    return {
        "tensor state: None vs callable": _outcome(
            lambda: sync_states({"a": value}, {"a": None if rank == 0 else sum0})
        ),
        "list state: 'cat' vs callable": _outcome(
            lambda: sync_states({"a": [value]}, {"a": "cat" if rank == 0 else sum0})
        ),
    }


def test_callable_and_none_reductions_disagreeing_raise() -> None:
    """Ranks disagreeing on a reduction must raise on every rank (the sync engine's rule: "every rank's state names,
    reductions, dtypes and shapes ... Any mismatch raises ..., never silently wrong numbers").

    The signature records only the *kind* ("gather" for every callable and ``None``; "cat" for every list state),
    so rank 0 with ``None`` and rank 1 with a callable silently return different values: the stack on rank 0,
    ``fn(stack)`` on rank 1. Suggested fix: put the reduction in the signature: its name for strings, ``None``, and
    for callables a stable tag such as ``f"{fn.__module__}.{fn.__qualname__}"`` (or at least "callable").
    """
    results = run_distributed(_reduction_body, 2)
    problems = [
        f"rank {rank}, {what}: {status} {value!r}"
        for rank, got in enumerate(results)
        for what, (status, value) in got.items()
        if status != "RanksDisagreeError"
    ]
    assert not problems, "no error where ranks disagree on a reduction:\n" + "\n".join(problems)


# ------------------------------------------------------------------- dtype of an integer mean state


def _int_mean_body(rank: int, world: int) -> Any:
    try:
        sync_states({"n": torch.tensor([2, 4])}, {"n": "mean"})
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("world", [2])
def test_int_mean_state_raises_at_every_world_size(world: int) -> None:
    """A ``mean`` state of int64 used to come back int64 with one rank and float32 with two.

    Decision (the test allowed "raise or keep the dtype"): like ``all_reduce``, the engine refuses ``mean`` of
    integers (and ``sum``/``mean`` of bools) with ``ValueError``, at every world size and on every rank.
    """
    with pytest.raises(ValueError, match="mean"):
        sync_states({"n": torch.tensor([2, 4])}, {"n": "mean"})
    results = run_distributed(_int_mean_body, world)
    assert all(r is not None and "mean" in r for r in results), results
