"""Run a program under torchrun as its entry point; fail it when its gloo groups do not end with it.

Usage: ``torchrun [...] tests/_helpers/run_to_exit.py program.py [args]``. The program runs as ``__main__``; its
top-level names are kept while the last check runs, as they live until the interpreter exits in a real run.

``destroy_process_group()`` ends a gloo group's worker threads only when it drops the group's last reference.
Where something else still holds the group (a DDP module), the threads end later: when that object is freed, which
can deadlock (a DDP module drops the group while holding the GIL that a worker may need), or at interpreter
shutdown, where a worker may abort the finished process ("terminate called without an active exception"). Either
shows in a few runs in a hundred; this check fails such a program every time: gloo's worker threads must be gone
when ``destroy_process_group()`` returns. Linux only (it reads the thread names); elsewhere it checks nothing.
Self-contained: it imports nothing of the repository, so the program sees the modules it sees when run directly.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Any

import torch.distributed as dist

_GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives the worker threads of a gloo group


def _gloo_workers(grace_s: float = 2.0) -> int:
    """How many gloo worker threads this process runs (0 where threads cannot be listed).

    A thread that was just joined can still be listed for a moment after ``join`` returned (the kernel wakes the
    joiner before it removes the thread), so a count above zero is taken again until ``grace_s`` has passed.
    """
    deadline = time.monotonic() + grace_s
    while True:
        count = 0
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            return 0
        for task in tasks:
            try:
                with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
                    count += comm.read().strip() == _GLOO_WORKER
            except OSError:  # the thread ended meanwhile
                pass
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def _main() -> int:
    program, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(program))  # as when the program is run directly
    problems: list[str] = []
    destroy = dist.destroy_process_group

    def checking_destroy(group: Any = None) -> None:
        destroy(group)
        if group is None and _gloo_workers():
            problems.append(
                "destroy_process_group() returned with gloo's worker threads still running: an object still holds "
                "a group (a DDP module?); free it before destroy_process_group()"
            )

    dist.destroy_process_group = checking_destroy
    top_level: dict[str, Any] = {}
    try:
        top_level = runpy.run_path(program, run_name="__main__")  # kept, as a program's globals live until exit
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    if dist.is_initialized():
        problems.append("the program ended without destroy_process_group()")
    elif _gloo_workers() and not problems:
        problems.append("gloo's worker threads are still running at the end of the program")
    held = sorted(name for name, value in top_level.items() if type(value).__name__ == "DistributedDataParallel")
    for problem in problems:
        hint = f" (the DDP module in {', '.join(held)} is still alive)" if held else ""
        print(f"{program}: {problem}{hint} (docs/guide/failure_modes.rst, shutting down)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main())
