"""The property-based suite's budgets, seeded tensors in every memory layout, and batch dispatch.

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

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests._helpers.checks import short
from tests._helpers.harness import run_distributed
from tests._helpers.seeds import generator

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


def is_float(name: str) -> bool:
    return name in FLOATS


# --------------------------------------------------------------------------------------------- seeded data


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
