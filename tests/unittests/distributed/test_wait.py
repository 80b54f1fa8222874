"""How the backend waits for an asynchronous collective (``_backend._wait``): on CPU tensors it polls the work
for up to ``_POLL_S`` seconds (yielding the CPU between polls) and then blocks in ``wait()``; elsewhere it only
calls ``wait()``.

A fake work object records the calls and a fake clock stands in for ``time.perf_counter``: it moves only when
the waiting code yields, by a step the test chooses, so the poll schedule is exact whatever the machine's load
(the wall-clock form of these tests counted polls in a 2 ms window and failed on a busy machine).
"""

from __future__ import annotations

import types

import pytest
import torch

from torchmetrics_diff.distributed import _backend


class _Clock:
    """``perf_counter`` that advances by ``step`` at each yield of the CPU; records what happened, in order."""

    def __init__(self, step: float, start: float = 1000.0) -> None:
        self.now, self.step, self.events = start, step, []

    def perf_counter(self) -> float:
        return self.now

    def yield_cpu(self) -> None:
        self.events.append("yield")
        self.now += self.step


class _Work:
    """Completes at the ``polls``-th call of ``is_completed`` (never, for ``None``); ``wait`` may raise.

    More than ``limit`` polls fail the test instead of spinning forever (a wait without its bound).
    """

    def __init__(self, clock: _Clock, polls: int | None, error: Exception | None = None, limit: int = 1000) -> None:
        self.clock, self.polls, self.error, self.limit = clock, polls, error, limit
        self.asked = self.waited = 0

    def is_completed(self) -> bool:
        self.asked += 1
        self.clock.events.append("poll")
        assert self.asked <= self.limit, f"polled {self.asked} times: the poll is not bounded"
        return self.polls is not None and self.asked >= self.polls

    def wait(self) -> bool:
        self.waited += 1
        self.clock.events.append("wait")
        if self.error is not None:
            raise self.error
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """A controlled clock for ``_backend``: ``_POLL_S`` = 10 steps of 1/1024 s (exact in binary)."""
    clock = _Clock(step=1 / 1024)
    monkeypatch.setattr(_backend, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(_backend, "_yield", clock.yield_cpu)
    monkeypatch.setattr(_backend, "_POLL_S", 10 / 1024)
    return clock


def test_cpu_work_is_polled_until_it_completes_then_waited_once(clock: _Clock) -> None:
    work = _Work(clock, polls=5)  # completes at the 5th poll, well within the bound
    _backend._wait(work, torch.zeros(1))
    assert (work.asked, work.waited) == (5, 1)
    # the CPU is yielded between polls, and the blocking wait comes once, after the last poll
    assert clock.events == ["poll", "yield"] * 4 + ["poll", "wait"]


def test_polling_is_bounded_then_it_blocks(clock: _Clock) -> None:
    work = _Work(clock, polls=None)  # never completes while polled: the wait must stop polling and block
    _backend._wait(work, torch.zeros(1))
    # polls at t0, t0 + 1 step, ..., t0 + 10 steps: the last one finds the deadline t0 + _POLL_S reached
    assert (work.asked, work.waited) == (11, 1)
    assert clock.events == ["poll", "yield"] * 10 + ["poll", "wait"]


def test_the_bound_counts_from_the_call(clock: _Clock) -> None:
    clock.now = 5000.0  # a later start: the deadline moves with it
    work = _Work(clock, polls=None)
    _backend._wait(work, torch.zeros(1))
    assert (work.asked, work.waited) == (11, 1)


def test_a_slower_clock_polls_more_often_within_the_same_bound(clock: _Clock) -> None:
    clock.step = 1 / 2048  # half-size steps: twice the polls in the same 10/1024 s
    work = _Work(clock, polls=None)
    _backend._wait(work, torch.zeros(1))
    assert (work.asked, work.waited) == (21, 1)


def test_non_cpu_work_is_not_polled(clock: _Clock) -> None:
    work = _Work(clock, polls=None)
    _backend._wait(work, torch.zeros(1, device="meta"))
    assert (work.asked, work.waited) == (0, 1)
    assert clock.events == ["wait"]


def test_a_failed_work_raises_from_wait(clock: _Clock) -> None:
    work = _Work(clock, polls=1, error=RuntimeError("peer died"))
    with pytest.raises(RuntimeError, match="peer died"):
        _backend._wait(work, torch.zeros(1))
    assert (work.asked, work.waited) == (1, 1)


def test_a_replaced_collective_returning_nothing_is_not_waited(clock: _Clock) -> None:
    _backend._wait(None, torch.zeros(1))  # tests replace collectives by functions that return None
    assert clock.events == []
