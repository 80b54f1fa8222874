"""Shared helpers of the benchmark scripts: spawned gloo workers (the test harness's), medians, aligned tables,
acceptance checks, and the one loader of open_clip's loss module.

A benchmark module ``bench_<name>.py`` exposes ``main(args) -> list[Check]`` (``args.quick``: fewer repeats);
``run_all.py`` finds it by its file name and prints every returned :class:`Check` at the end.

Timing rules used throughout:

* every process runs with ``torch.set_num_threads(1)`` (the machines have 2 cores);
* distributed cases: every rank runs the same loop of ``n`` calls with no barrier inside it; a barrier only
  separates the timed blocks. The reported time is rank 0's median over blocks of ``block time / n``;
* warm-up calls first (they also let the sync engine agree on its plan), and the garbage collector is off
  while a block runs.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the workers come from the test harness (``tests/_helpers/harness.py``)
    sys.path.insert(0, str(REPO))

from tests._helpers.harness import run_once  # noqa: E402


@dataclass
class Check:
    """One acceptance target: ``value`` compared with ``limit`` (``<=`` or ``>=``)."""

    name: str
    value: float | None  # None: not measured (e.g. torchmetrics missing)
    op: str  # "<=" or ">="
    limit: float
    unit: str = "x"

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "N/A "}[self.passed]
        shown = "n/a" if self.value is None else f"{self.value:.2f}{self.unit}"
        return f"{verdict}  {self.name}: {shown} (target {self.op} {self.limit:g}{self.unit})"


# ----------------------------------------------------------------------------------------------- processes
def _quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def _quietly(rank: int, world: int, fn: Callable, *args: Any) -> Any:
    """``fn(rank, world, *args)`` with warnings off (the harness's workers already run one thread each)."""
    _quiet()
    return fn(rank, world, *args)


def run_spawned(fn: Callable, world: int, *args: Any, timeout: float = 600.0) -> Any:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh spawned processes (gloo on 127.0.0.1 when ``world > 1``).

    Returns rank 0's return value. The processes are the test harness's (:func:`tests._helpers.harness.run_once`),
    started for this call only, so a run's peak memory is its own and environment variables set before the call
    reach them. Any rank's exception is re-raised here with its traceback; a run longer than ``timeout`` seconds
    is killed. ``fn`` must be a module-level function (it is pickled by name).
    """
    return run_once(_quietly, world, fn, *args, timeout=timeout, init_group=world > 1)[0]


# ----------------------------------------------------------------------------------------------- anchors
@functools.cache
def open_clip_loss() -> ModuleType:
    """open_clip's ``loss`` module, loaded from its file without running the package.

    The package's ``__init__`` imports torchvision, which cannot be installed beside the pinned CPU torch (the
    Makefile installs open_clip_torch with ``--no-deps``); ``loss.py`` imports only torch.

    Raises:
        ImportError: open_clip_torch is not installed.
    """
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("open_clip_torch is not installed")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "loss.py")
    module_spec = importlib.util.spec_from_file_location("_open_clip_loss", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ timing
@dataclass
class Budget:
    """How much to measure: ``repeats`` timed blocks of about ``block_s`` seconds each, after ``warmup`` calls."""

    repeats: int = 21
    block_s: float = 0.025
    warmup: int = 10

    @classmethod
    def from_args(cls, args: Any) -> Budget:
        return cls(repeats=5, block_s=0.01, warmup=5) if getattr(args, "quick", False) else cls()


def _calls_per_block(fn: Callable[[], Any], budget: Budget) -> int:
    t0 = time.perf_counter()
    fn()
    fn()
    per = (time.perf_counter() - t0) / 2
    return max(1, min(10_000, int(budget.block_s / max(per, 1e-7))))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Collect garbage, then keep the collector off inside the block (timed code must not pay for collections)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _interleaved(
    fns: dict[str, Callable[[], Any]], calls: dict[str, int], repeats: int, sync: Callable[[], None] | None
) -> dict[str, list[float]]:
    """Per-call seconds of each function in each round; blocks of the functions alternate within a round, so
    load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    with _gc_paused():
        for _ in range(repeats):
            for name, fn in fns.items():
                n = calls[name]
                if sync is not None:
                    sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times[name].append((time.perf_counter() - t0) / n)
    return times


def time_local(fns: dict[str, Callable[[], Any]], budget: Budget) -> dict[str, float]:
    """Median seconds per call of each ``fn()`` in this process (blocks of the functions interleaved)."""
    for fn in fns.values():
        for _ in range(budget.warmup):
            fn()
    calls = {name: _calls_per_block(fn, budget) for name, fn in fns.items()}
    return {name: statistics.median(t) for name, t in _interleaved(fns, calls, budget.repeats, None).items()}


def time_dist(fns: dict[str, Callable[[], Any]], budget: Budget) -> dict[str, float]:
    """Median seconds per call of each ``fn()``, every rank running the same loops; call it on every rank.

    The number of calls per block is rank 0's choice, broadcast to all ranks, so every rank issues the same
    collectives; a barrier precedes each block, none runs inside one. Blocks of the functions alternate, so
    a load spike from outside hits them alike. The values are meaningful on rank 0 (the report uses rank 0's).
    """
    return {name: statistics.median(t) for name, t in time_dist_rounds(fns, budget).items()}


def time_dist_rounds(fns: dict[str, Callable[[], Any]], budget: Budget) -> dict[str, list[float]]:
    """:func:`time_dist`'s per-call seconds of every round (``budget.repeats`` of them, in order) instead of
    their median: the blocks of one round ran back to back, so ``a[i] / b[i]`` compares them under the same load
    (see :func:`paired_ratio`)."""
    for fn in fns.values():
        for _ in range(budget.warmup):
            fn()
    dist.barrier()
    counts = torch.tensor([_calls_per_block(fn, budget) for fn in fns.values()])
    dist.broadcast(counts, 0)
    calls = dict(zip(fns, counts.tolist()))
    return _interleaved(fns, calls, budget.repeats, dist.barrier)


def time_round_robin(
    fns: dict[str, Callable[[], Any]], rounds: int, before: dict[str, Callable[[], Any]] | None = None
) -> dict[str, float]:
    """Median seconds of single calls: each round calls every ``fn()`` once, in turn, each timed on its own.

    ``before[name]()``, when given, runs untimed before each call of ``fns[name]`` (e.g. a reset). State is
    carried from call to call otherwise.
    """
    before = before or {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    with _gc_paused():
        for _ in range(rounds):
            for name, fn in fns.items():
                if name in before:
                    before[name]()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratio(a: list[float] | None, b: list[float] | None) -> float | None:
    """Median over rounds of ``a[i] / b[i]``, for per-round times from :func:`time_dist_rounds`.

    On a shared machine the load drifts between rounds; within a round the blocks ran back to back, so the
    round's ratio cancels most of the drift, and the median over rounds discards the rounds a spike split.
    """
    if not a or not b:
        return None
    return statistics.median(x / y for x, y in zip(a, b) if y > 0)


# ------------------------------------------------------------------------------------------------ memory
def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    """This process's resident set (``VmRSS``), MiB."""
    return _status_mib("VmRSS")


def peak_rise_mib(fn: Callable[[], Any]) -> float:
    """How far this process's resident set rose above its size before ``fn()`` while ``fn()`` ran, MiB.

    The peak (``VmHWM``) is reset to the current resident set through ``/proc/self/clear_refs`` first; ``nan``
    where that file cannot be written. Set ``MALLOC_MMAP_THRESHOLD_`` (e.g. 65536) in the environment of the
    process, so that large tensors are their own mappings and the resident set follows the live tensors.
    """
    baseline = rss_mib()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the peak resident set) to the current RSS
    except OSError:
        fn()
        return float("nan")
    fn()
    return _status_mib("VmHWM") - baseline


# ------------------------------------------------------------------------------------------------ output
def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fx(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def table(title: str, headers: list[str], rows: list[list[Any]], notes: list[str] | tuple = ()) -> str:
    """A markdown table with aligned columns: the first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(["-" * (widths[0] + 2)] + ["-" * (w + 1) + ":" for w in widths[1:]]) + "|"
    out = [f"### {title}", "", line(cells[0]), rule] + [line(r) for r in cells[1:]]
    out += [""] + [f"  {n}" for n in notes] if notes else []
    return "\n".join(out) + "\n"


def torchmetrics_or_none() -> Any:
    """The ``torchmetrics`` module, or ``None`` when it is not installed (its columns then read n/a)."""
    try:
        import torchmetrics
    except ImportError:
        return None
    return torchmetrics
