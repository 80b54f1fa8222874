"""Run a call and describe what it raised, check messages for needles (the reliability tests' helpers).

Bodies that run on several ranks must never let an expected error escape (the harness would fail the test and
rebuild the pool), so they record ``(type name, message, seconds)`` with :func:`outcome` and the test asserts in
the parent process. :func:`snapshot` and :func:`differences` compare a metric's states before and after a call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import pytest
import torch

from torchmetrics_diff import Metric, MetricCollection


class Outcome(NamedTuple):
    """What a call did on one rank: ``kind`` is ``"ok"`` or the exception's type name; ``bases`` the names of the
    classes it derives from (``RuntimeError`` for the package's ``RanksDisagreeError``, say)."""

    kind: str
    message: str
    seconds: float
    value: Any = None
    bases: tuple[str, ...] = ()


def outcome(call: Callable[[], Any]) -> Outcome:
    """Run ``call`` and record its result or the exception it raised (never re-raised), with the time it took."""
    start = time.monotonic()
    try:
        value = call()
    except Exception as err:
        bases = tuple(c.__name__ for c in type(err).__mro__[1:])
        return Outcome(type(err).__name__, str(err), time.monotonic() - start, bases=bases)
    return Outcome("ok", "", time.monotonic() - start, value)


def missing_needles(message: str, needles: tuple[str, ...] | list[str]) -> list[str]:
    """The needles not found in ``message``."""
    return [n for n in needles if n not in message]


def expect_error(call: Callable[[], Any], kind: type[BaseException], *needles: str) -> str:
    """Assert ``call`` raises ``kind`` whose message holds every needle; return the message."""
    with pytest.raises(kind) as info:
        call()
    message = str(info.value)
    missing = missing_needles(message, needles)
    assert not missing, f"{type(info.value).__name__} message {message!r} does not mention {missing}"
    return message


def problem(
    what: str, got: Outcome, kind: str, needles: tuple[str, ...] | list[str] = (), within: float | None = None
) -> str | None:
    """A description of how ``got`` differs from an error of type ``kind`` (or a subclass) mentioning ``needles``,
    or None."""
    if got.kind != kind and kind not in got.bases:
        return f"{what}: expected {kind}, got {got.kind} {got.message!r}"
    missing = missing_needles(got.message, needles)
    if missing:
        return f"{what}: {kind} message {got.message!r} does not mention {missing}"
    if within is not None and got.seconds > within:
        return f"{what}: raised only after {got.seconds:.1f}s (expected within {within}s): {got.message!r}"
    return None


def snapshot(metric: Metric) -> tuple[dict[str, Any], int]:
    """Copies of every state (list states as lists of copies) and the update count."""
    states = {
        n: [t.detach().clone() for t in v] if isinstance(v, list) else v.detach().clone()
        for n, v in metric.metric_state.items()
    }
    return states, metric.update_count


def differences(before: tuple[dict[str, Any], int], metric: Metric) -> list[str]:
    """How ``metric`` differs from ``before`` (a :func:`snapshot`); empty when identical."""
    states, count = before
    out = [] if metric.update_count == count else [f"update_count {count} -> {metric.update_count}"]
    for name, old in states.items():
        new = getattr(metric, name)
        if isinstance(old, list):
            same = isinstance(new, list) and len(new) == len(old) and all(torch.equal(a, b) for a, b in zip(old, new))
        else:
            same = isinstance(new, torch.Tensor) and new.dtype == old.dtype and torch.equal(new, old)
        if not same:
            out.append(f"state {name!r} {old} -> {new}")
    return out


def members_differences(before: dict[str, tuple], coll: MetricCollection) -> list[str]:
    """How the members of ``coll`` differ from ``before`` (a :func:`snapshot` per member key)."""
    return [f"{k}: {d}" for k, m in coll.items() for d in differences(before[k], m)]
