"""Shared pieces of the property-based suite: budgets, seeded tensors, comparisons, batch dispatch.

How the suite is built (and why it is fast enough for two busy cores):

* Hypothesis runs only in the pytest process. It draws a *batch* of plain, picklable case descriptions
  (frozen dataclasses of ints, strings and tuples: shapes, dtype names, reductions, a seed).
* One :func:`dispatch` call sends the whole batch to the persistent gloo workers of the harness. Each rank
  rebuilds *every* rank's tensors from the seed, so it can compute the single-process reference itself, runs
  the code under test, compares, and returns per-case failure strings (plus digests of its results, so the
  parent can check that every rank got the same bits).
* A case whose code under test raises unexpectedly is re-raised in the worker with the case attached: the
  harness then reports every rank's traceback and rebuilds the workers (the group may be out of step).

Budgets: the default profile (``make test``) runs a few batches per test, derandomized, with no example
database and no shrinking, so a run is reproducible and bounded. ``HYPOTHESIS_PROFILE=slow`` multiplies the
budgets, draws fresh random batches, shrinks failures, and enables the ``slow``-marked soak tests.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests.unittests._harness import run_distributed

#: the soak profile: ``HYPOTHESIS_PROFILE=slow`` (or ``--hypothesis-profile=slow``)
SLOW = os.environ.get("HYPOTHESIS_PROFILE", "") == "slow" or settings.get_current_profile_name() == "slow"

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}
settings.register_profile("slow", max_examples=60, **_COMMON)

#: skip marker of the soak variants (run them with ``HYPOTHESIS_PROFILE=slow``)
slow = [
    pytest.mark.slow,
    pytest.mark.skipif(not SLOW, reason="soak run: set HYPOTHESIS_PROFILE=slow"),
    pytest.mark.timeout(1800),  # a soak test takes minutes on two busy cores
]


def budget(default: int, slow_examples: int | None = None) -> settings:
    """Settings of one property test: ``default`` batches normally, many more under the slow profile."""
    if SLOW:
        return settings(max_examples=slow_examples or 8 * default, derandomize=False, **_COMMON)
    # no shrinking by default: a failing batch already names the failing case, and shrinking would call the
    # workers hundreds of times
    return settings(
        max_examples=default,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        **_COMMON,
    )


def apply(marks: list) -> Callable:
    def deco(fn: Callable) -> Callable:
        for mark in reversed(marks):
            fn = mark(fn)
        return fn

    return deco


# ------------------------------------------------------------------------------------------------- dtypes

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "bool": torch.bool,
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
dtype_names = st.sampled_from(tuple(DTYPES))
seeds = st.integers(0, 2**31 - 1)

#: (rtol, atol) of values computed by a different order of float operations than the reference
_TOL = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 5e-2),
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-10, 1e-12),
}


def is_float(name: str) -> bool:
    return name in FLOATS


# --------------------------------------------------------------------------------------------- seeded data


def generator(*parts: object) -> torch.Generator:
    """A generator whose seed depends only on ``parts`` (the same in every process; ``hash`` is salted)."""
    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, parts)).encode()))


def values(shape: Sequence[int], dtype: torch.dtype, ties: bool, *parts: object) -> torch.Tensor:
    """Seeded values of ``dtype``: normals (or small integers when ``ties``, so extrema repeat)."""
    gen = generator(*parts)
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if ties:
        return torch.randint(-2, 3, shape, generator=gen).to(dtype)
    if dtype == torch.int64:
        return torch.randint(-50, 51, shape, generator=gen)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


LAYOUTS = ("contiguous", "step", "transpose", "expand", "offset")


def base_shape(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    """Shape of the storage tensor from which :func:`view` cuts a tensor of ``shape`` in ``layout``."""
    shape = tuple(shape)
    if not shape or layout == "contiguous":
        return shape
    if layout == "step":  # every other row: non-contiguous; one row gives a 1-element slice of stride 2
        return (2 * shape[0], *shape[1:])
    if layout == "transpose":
        return shape[::-1]
    if layout == "expand":  # stride 0 along dim 0
        return (1, *shape[1:])
    if layout == "offset":  # contiguous but with a storage offset
        return (shape[0] + 1, *shape[1:])
    raise ValueError(layout)


def view(base: torch.Tensor, shape: Sequence[int], layout: str) -> torch.Tensor:
    """The tensor of ``shape`` seen through ``layout`` (autograd flows back to ``base``)."""
    shape = tuple(shape)
    if not shape or layout == "contiguous":
        return base
    if layout == "step":
        return base[::2]
    if layout == "transpose":
        return base.permute(*reversed(range(base.ndim)))
    if layout == "expand":
        return base.expand(*shape)
    if layout == "offset":
        return base[1:]
    raise ValueError(layout)


def seeded(shape: Sequence[int], dtype_name: str, layout: str, ties: bool, *parts: object) -> torch.Tensor:
    """A (detached) storage tensor for :func:`view`."""
    return values(base_shape(shape, layout), DTYPES[dtype_name], ties, *parts)


def weights(shape: Sequence[int], *parts: object) -> torch.Tensor:
    """Float64 loss weights."""
    return torch.randn(tuple(shape), generator=generator("w", *parts), dtype=torch.float64)


def leaf(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return t.detach().clone().requires_grad_(requires_grad)


# ------------------------------------------------------------------------------------------------ checking


class Checks:
    """Collects one rank's failures of one batch as readable strings."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.failures: list[str] = []
        self.case = ""

    def fail(self, what: str, msg: str) -> None:
        head = "" if self.failures else f"[W={self.world} rank {self.rank}] {self.case}\n"
        self.failures.append(f"{head}    {what}: {msg}")

    def true(self, what: str, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(what, msg)

    def same(self, what: str, actual: Any, expected: Any, exact: bool = False) -> None:
        """``actual`` equals ``expected``: dtype, shape, values (floats within the dtype's tolerance)."""
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                self.fail(what, f"expected a list of {len(expected)}, got {_show(actual)}")
                return
            for i, (a, e) in enumerate(zip(actual, expected)):
                self.same(f"{what}[{i}]", a, e, exact)
            return
        if not isinstance(actual, torch.Tensor):
            self.fail(what, f"expected a tensor, got {_show(actual)}")
            return
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            self.fail(
                what,
                f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} {tuple(expected.shape)}",
            )
            return
        if exact or not expected.is_floating_point():
            ok = torch.equal(actual.detach(), expected.detach())
            if not ok:
                self.fail(what, f"values differ:\n      got      {_show(actual)}\n      expected {_show(expected)}")
            return
        rtol, atol = _TOL[expected.dtype]
        try:
            torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol)
        except AssertionError as err:
            self.fail(
                what, " | ".join(str(err).splitlines()[:4]) + f" | got {_show(actual)} expected {_show(expected)}"
            )

    def grad(self, what: str, x: torch.Tensor, expected: torch.Tensor) -> None:
        """``x.grad`` equals ``expected`` (a missing gradient counts as zeros)."""
        got = x.grad if x.grad is not None else torch.zeros_like(x)
        rtol, atol = _TOL[x.dtype]
        try:
            torch.testing.assert_close(got, expected.to(x.dtype), rtol=rtol, atol=atol * 10)
        except AssertionError as err:
            self.fail(what, " | ".join(str(err).splitlines()[:4]) + f" | got {_show(got)} expected {_show(expected)}")


def _show(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        flat = x.detach().reshape(-1)
        head = flat[:8].tolist()
        more = "..." if flat.numel() > 8 else ""
        return f"{x.dtype} {tuple(x.shape)} {head}{more}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in x) + "]"
    return repr(x)


def digest(x: Any) -> str:
    """A short fingerprint of a (nested) result: dtype, shape and bytes of every tensor."""
    h = hashlib.blake2b(digest_size=8)

    def feed(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            # a fresh dense copy: ``contiguous()`` keeps the stride of a 1-element slice, and bytes need stride 1
            v = torch.empty(v.shape, dtype=v.dtype).copy_(v.detach())
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
        elif isinstance(v, dict):
            for k in v:
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for item in v:
                feed(item)
            h.update(b"]")
        else:
            h.update(repr(v).encode())

    feed(x)
    return h.hexdigest()


def short(case: Any, limit: int = 1500) -> str:
    """``repr(case)`` cut to ``limit`` characters (long state names make huge reprs)."""
    text = repr(case)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@contextmanager
def case_context(index: int, case: Any) -> Iterator[None]:
    """Re-raise an unexpected exception of the code under test with the case that caused it."""
    try:
        yield
    except Exception as err:
        # the harness prints the chained traceback of ``err``
        raise AssertionError(f"case {index} raised {type(err).__name__}: {err}\n  case = {short(case)}") from err


# ------------------------------------------------------------------------------------------------- dispatch


def dispatch(body: Callable, world: int, cases: Sequence[Any], timeout: float = 90.0) -> list[list[Any]]:
    """Run ``body(rank, world, cases)`` on ``world`` ranks; it returns per case ``(failures, digest)``.

    Asserts that no rank reported a failure and that every rank's digest of every case is the same (results are
    identical on every rank); returns the per-rank lists.
    """
    per_rank = run_distributed(body, world, list(cases), timeout=timeout)
    failures = [f for rank_results in per_rank for failures, _ in rank_results for f in failures]
    for i in range(len(cases)):
        digests = [rank_results[i][1] for rank_results in per_rank]
        if any(d != digests[0] for d in digests):
            failures.append(f"[W={world}] case {i}: ranks returned different results {digests}\n    {short(cases[i])}")
    if failures:
        shown = "\n".join(failures[:12])
        more = f"\n... and {len(failures) - 12} more" if len(failures) > 12 else ""
        raise AssertionError(f"{len(failures)} failure(s) in a batch of {len(cases)} cases:\n{shown}{more}")
    return per_rank


def batches(case: st.SearchStrategy, min_size: int = 10, max_size: int = 30) -> st.SearchStrategy:
    return st.lists(case, min_size=min_size, max_size=max_size)
