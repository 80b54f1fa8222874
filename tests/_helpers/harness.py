"""Run a test body on N gloo ranks in persistent worker processes.

Why persistent workers: spawning a process and importing torch costs seconds on the 2-core CI machines, so
each world size (1, 2, 3) gets one lazily created pool of N workers that lives for the whole session. The pools'
workers are forked by a fork server that has imported torch, the package and torchmetrics once
(:mod:`tests._helpers.worker_preload`): a pool rebuilt after a failure starts in a fraction of a second instead of
each worker importing them again.
Worker i is always rank i because it owns task queue i; nothing hands tasks to "any free worker", which is how
torchmetrics' ``Pool.map`` harness scrambled rank identity. Any failure or timeout tears the pool down: a
failed collective can leave the process group unusable, and rebuilding costs seconds where a hang costs the
CI run.

The benchmarks run on the same workers through :func:`run_once`: a fresh set of processes for one call (a
benchmark's peak memory must be its own), any world size, a longer collective timeout, and no process group at
world size 1 (what a single-process timing measures).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

__all__ = [
    "DistributedTestFailure",
    "free_port",
    "run_distributed",
    "run_once",
    "run_once_with_departures",
    "shutdown_pools",
]

_WORLD_SIZES = (1, 2, 3)
_PG_TIMEOUT_S = 30.0  # a stuck collective raises inside the worker instead of blocking it forever
_STARTUP_TIMEOUT_S = 120.0  # three ranks importing torch on two cores can take a while
_STARTUP_ATTEMPTS = 3  # the free port can be taken between free_port() and rank 0 binding it
_GRACE_S = 10.0  # after one rank fails, wait this long for the others (their errors often explain it)
_READY = 0  # task id of the start-up handshake; real tasks count from 1

#: called (if set) before every run: tests/conftest.py sets it, in a test not marked ``distributed``, to a function
#: that raises, so a test that reaches the harness without the marker fails even when a pool is already running
spawn_guard: Callable[[], None] | None = None


class DistributedTestFailure(AssertionError):
    """A rank raised, died or did not finish in time; the message has every failing rank's traceback."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the caller must tolerate a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _limit_threads() -> None:
    """One thread per rank, gloo on the loopback interface: set before torch is imported (torch reads the thread
    variables when it loads), which is why this module imports torch lazily."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if "GLOO_SOCKET_IFNAME" not in os.environ and "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo off real interfaces and hostname lookups


def _exit_if_orphaned(parent_pid: int) -> None:
    """Kill this worker once its parent is gone, even if a test body is stuck in a sleep or collective.

    The parent is the process that started it: the test process, or the fork server (which exits with the test
    process)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def _worker(
    rank: int,
    world_size: int,
    port: int,
    tasks: Any,
    results: Any,
    pg_timeout: float = _PG_TIMEOUT_S,
    init_group: bool = True,
) -> None:
    """Join the process group as ``rank`` once (if ``init_group``), then run tasks until the ``None`` sentinel.

    Messages on ``results`` are ``(rank, task_id, status, payload)``; payload is the pickled return value for
    ``"ok"`` and traceback text for ``"error"``. Values are pickled here, not by the queue's feeder thread,
    so that an unpicklable return value is reported as this rank's failure instead of being lost.
    """
    _limit_threads()  # (already done where the fork server imported torch)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it kills the pool
    threading.Thread(target=_exit_if_orphaned, args=(os.getppid(),), daemon=True).start()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if init_group:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout),
            )
    except BaseException:
        results.put((rank, _READY, "error", traceback.format_exc()))
        return
    results.put((rank, _READY, "ok", None))
    while (item := tasks.get()) is not None:
        task_id, blob = item
        try:
            fn, args, kwargs = pickle.loads(blob)
            value = fn(rank, world_size, *args, **kwargs)
            try:
                payload = pickle.dumps(value)
            except Exception as err:
                raise TypeError(f"return value of type {type(value).__name__} is not picklable") from err
            message = (rank, task_id, "ok", payload)
        except BaseException:
            message = (rank, task_id, "error", traceback.format_exc())
        results.put(message)
    if dist.is_initialized():
        dist.destroy_process_group()


class _Pool:
    """``world_size`` workers (spawned, or forked by the fork server); worker i owns task queue i and is rank i for
    its whole life."""

    def __init__(
        self, world_size: int, pg_timeout: float = _PG_TIMEOUT_S, init_group: bool = True, forked: bool = False
    ) -> None:
        ctx = _fork_server() if forked else mp.get_context("spawn")
        self.world_size = world_size
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self._ids = itertools.count(_READY + 1)
        port = free_port()
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(rank, world_size, port, self.tasks[rank], self.results, pg_timeout, init_group),
                name=f"harness-rank{rank}-of-{world_size}",
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for proc in self.procs:
            proc.start()

    def submit(self, blob: bytes) -> int:
        """Send one pickled ``(fn, args, kwargs)`` to every rank; return the task id to collect."""
        task_id = next(self._ids)
        for tasks in self.tasks:
            tasks.put((task_id, blob))
        return task_id

    def collect(
        self, task_id: int, timeout: float, grace: float = _GRACE_S
    ) -> tuple[dict[int, Any], dict[int, str], list[int]]:
        """Wait for every rank's answer to ``task_id``; return (payloads, errors, unfinished ranks).

        Answers are matched by task id so a late answer to an earlier task is never taken for this one.
        Dead workers are noticed while the queue is idle; after the first failure, the deadline shrinks to a
        grace period because the surviving ranks are often stuck in a collective with the failed one
        (start-up uses no grace: it retries on a fresh port instead).
        """
        done: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(done) + len(errors) < self.world_size and (left := deadline - time.monotonic()) > 0:
            try:
                rank, tid, status, payload = self.results.get(timeout=min(left, 0.2))
            except queue.Empty:
                for rank, proc in enumerate(self.procs):
                    if rank not in done and rank not in errors and proc.exitcode is not None:
                        errors[rank] = f"worker process died: {_describe_exit(proc.exitcode)}"
                        deadline = min(deadline, time.monotonic() + grace)
                continue
            if tid != task_id:
                continue
            if status == "ok":
                done[rank] = payload
            else:
                errors[rank] = payload
                deadline = min(deadline, time.monotonic() + grace)
        missing = [rank for rank in range(self.world_size) if rank not in done and rank not in errors]
        return done, errors, missing

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: sentinel and a short join if graceful, then terminate and kill what is left."""
        if graceful:
            for tasks in self.tasks:
                tasks.put(None)
            deadline = time.monotonic() + 5.0
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for q in [*self.tasks, self.results]:
            q.close()
            q.cancel_join_thread()  # never block interpreter exit flushing into a dead worker's pipe


_POOLS: dict[int, _Pool] = {}

#: what the fork server imports before it forks a pool's workers (the module sets the thread limits first)
_PRELOAD = ["tests._helpers.worker_preload"]


def _fork_server() -> Any:
    """The multiprocessing context of the persistent pools: processes forked by a server started on first use,
    which imported :data:`_PRELOAD` (torch included) once. The server is a fresh process (no thread of the test
    process, no CUDA context), so forking it is safe. Where there is no fork server (Windows), spawned
    interpreters."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _report(title: str, errors: dict[int, str], missing: list[int], why: str) -> str:
    parts = [title] + [f"--- rank {rank} ---\n{errors[rank].rstrip()}" for rank in sorted(errors)]
    if missing:
        parts.append(f"ranks {missing} did not finish ({why})")
    return "\n".join(parts)


def _start_pool(
    world_size: int,
    pg_timeout: float = _PG_TIMEOUT_S,
    init_group: bool = True,
    startup_timeout: float = _STARTUP_TIMEOUT_S,
    forked: bool = False,
) -> _Pool:
    """Start ``world_size`` workers and wait until every one is ready, with a new port on each try."""
    for _ in range(_STARTUP_ATTEMPTS):
        pool = _Pool(world_size, pg_timeout, init_group, forked)
        try:
            _, errors, missing = pool.collect(_READY, startup_timeout, grace=0.0)
        except BaseException:
            pool.close(graceful=False)
            raise
        if not errors and not missing:
            return pool
        pool.close(graceful=False)
    raise DistributedTestFailure(
        _report(
            f"could not start {world_size} gloo workers ({_STARTUP_ATTEMPTS} tries)",
            errors,
            missing,
            f"start-up timeout {startup_timeout}s or another rank failed",
        )
    )


def _get_pool(world_size: int) -> _Pool:
    """Return the live pool for ``world_size``, (re)building it if needed."""
    pool = _POOLS.get(world_size)
    if pool is not None and all(proc.is_alive() for proc in pool.procs):
        return pool
    _drop(world_size)
    _POOLS[world_size] = pool = _start_pool(world_size, forked=True)
    return pool


def _drop(world_size: int, graceful: bool = False) -> None:
    pool = _POOLS.pop(world_size, None)
    if pool is not None:
        pool.close(graceful=graceful)


def shutdown_pools() -> None:
    """Stop every pool; registered with atexit and called by the conftest at the end of the session."""
    for world_size in list(_POOLS):
        _drop(world_size, graceful=True)


atexit.register(shutdown_pools)


def _run(pool: _Pool, fn: Callable[..., Any], blob: bytes, timeout: float, on_failure: Callable[[], None]) -> list:
    """Run the pickled task on every worker of ``pool``; return values by rank, or call ``on_failure`` and raise."""
    try:
        done, errors, missing = pool.collect(pool.submit(blob), timeout)
    except BaseException:  # e.g. pytest-timeout or Ctrl-C: the ranks are mid-task, so the pool is unusable
        on_failure()
        raise
    if errors or missing:
        on_failure()
        name = getattr(fn, "__qualname__", repr(fn))
        if errors:
            title = f"{name} failed on {len(errors)} of {pool.world_size} ranks"
        else:
            title = f"{name} timed out after {timeout}s; ranks {missing} did not finish"
            missing = []
        raise DistributedTestFailure(_report(title, errors, missing, f"gave up {_GRACE_S}s after a failure"))
    return [pickle.loads(done[rank]) for rank in range(pool.world_size)]


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0, **kwargs: Any) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` gloo ranks; return values by rank.

    Each rank runs in a worker process whose default process group (gloo, 127.0.0.1) is already
    initialised. ``fn`` and its arguments must be picklable: module-level functions of test modules.

    Raises:
        ValueError: ``world_size`` is not 1, 2 or 3.
        DistributedTestFailure: a rank raised or died, or not every rank finished within ``timeout``
            seconds. The pool is then rebuilt by the next call, as the process group may be broken.
    """
    if world_size not in _WORLD_SIZES:
        raise ValueError(f"world_size must be one of {_WORLD_SIZES}, got {world_size}")
    if spawn_guard is not None:
        spawn_guard()
    blob = pickle.dumps((fn, args, kwargs))  # fail here, in the caller, if the task cannot be sent
    return _run(_get_pool(world_size), fn, blob, timeout, lambda: _drop(world_size))


def run_once(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 600.0,
    pg_timeout: float = 1800.0,
    init_group: bool = True,
    forked: bool = False,
    **kwargs: Any,
) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` once on ``world_size`` fresh processes; return values by rank.

    Unlike :func:`run_distributed`, the workers are started for this call and stopped after it (what a benchmark
    needs: its peak memory is its own, and environment variables set before the call reach the workers), any
    world size is allowed, start-up may take as long as ``timeout`` (eight ranks importing torch on two busy
    cores), ``pg_timeout`` bounds each collective (a benchmark step can take seconds under load), and
    ``init_group=False`` runs without a process group. ``forked=True`` (for tests) forks the workers from the
    persistent pools' fork server instead of spawning interpreters: no imports to pay, but the environment is the
    server's (as it was when it started) and a worker ends with ``os._exit`` (no interpreter shutdown).

    Raises:
        DistributedTestFailure: a rank raised or died, or not every rank finished within ``timeout`` seconds
            (the workers are then killed).
    """
    if spawn_guard is not None:
        spawn_guard()
    blob = pickle.dumps((fn, args, kwargs))
    pool = _start_pool(world_size, pg_timeout, init_group, startup_timeout=timeout, forked=forked)
    failed = False

    def kill() -> None:
        nonlocal failed
        failed = True
        pool.close(graceful=False)

    try:
        return _run(pool, fn, blob, timeout, kill)
    finally:
        if not failed:
            pool.close(graceful=True)


def run_once_with_departures(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    pg_timeout: float = 10.0,
    forked: bool = False,
    **kwargs: Any,
) -> list:
    """Like :func:`run_once` (``forked`` too), for a body in which some ranks leave on purpose (``os._exit``, a lost
    connection).

    Returns the value of each rank that finished, and for each rank that did not a string ``"left: ..."`` (its
    process died) or ``"error: ..."`` (it raised; the traceback). The survivors have the grace period of
    :meth:`_Pool.collect` after the first departure, so ``pg_timeout`` (each collective's bound) must be shorter
    than that for a survivor stuck in a collective to raise in time; the workers are always killed at the end.
    """
    if spawn_guard is not None:
        spawn_guard()
    blob = pickle.dumps((fn, args, kwargs))
    pool = _start_pool(world_size, pg_timeout, startup_timeout=timeout, forked=forked)
    try:
        done, errors, _ = pool.collect(pool.submit(blob), timeout, grace=max(_GRACE_S, pg_timeout + 5.0))
    finally:
        pool.close(graceful=False)
    out: list = []
    for rank in range(world_size):
        if rank in done:
            out.append(pickle.loads(done[rank]))
        elif rank in errors:
            died = errors[rank].startswith("worker process died")
            out.append(("left: " if died else "error: ") + errors[rank])
        else:
            out.append(f"error: did not finish within {timeout}s")
    return out
