"""How the backend waits for an asynchronous collective (``_backend._wait``): on CPU tensors it polls the work
for up to ``_POLL_S`` seconds (yielding the CPU) and then blocks in ``wait()``; elsewhere it only calls ``wait()``.
A fake work object records the calls, so each property is checked without a process group.
"""

from __future__ import annotations

import time

import pytest
import torch

from torchmetrics_diff.distributed import _backend


class _Work:
    """Completes after ``polls`` calls of ``is_completed`` (never, for ``None``); ``wait`` may raise."""

    def __init__(self, polls: int | None, error: Exception | None = None) -> None:
        self.polls, self.asked, self.waited, self.error = polls, 0, 0, error

    def is_completed(self) -> bool:
        self.asked += 1
        return self.polls is not None and self.asked >= self.polls

    def wait(self) -> bool:
        self.waited += 1
        if self.error is not None:
            raise self.error
        return True


def test_cpu_work_is_polled_until_it_completes_then_waited_once() -> None:
    work = _Work(polls=5)
    _backend._wait(work, torch.zeros(1))
    assert (work.asked, work.waited) == (5, 1)


def test_polling_is_bounded_then_it_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_backend, "_POLL_S", 0.01)
    work = _Work(polls=None)
    t0 = time.perf_counter()
    _backend._wait(work, torch.zeros(1))
    elapsed = time.perf_counter() - t0
    assert work.waited == 1 and work.asked > 1
    assert 0.01 <= elapsed < 1.0, f"polled for {elapsed:.3f} s with a 0.01 s bound"


def test_non_cpu_work_is_not_polled() -> None:
    work = _Work(polls=None)
    _backend._wait(work, torch.zeros(1, device="meta"))
    assert (work.asked, work.waited) == (0, 1)


def test_a_failed_work_raises_from_wait() -> None:
    work = _Work(polls=1, error=RuntimeError("peer died"))
    with pytest.raises(RuntimeError, match="peer died"):
        _backend._wait(work, torch.zeros(1))


def test_a_replaced_collective_returning_nothing_is_not_waited() -> None:
    _backend._wait(None, torch.zeros(1))  # tests replace collectives by functions that return None
