"""Run a program under torchrun as its entry point, then fail if its default process group outlives it.

Usage: ``torchrun [...] tests/_helpers/run_to_exit.py program.py [args]``. The program runs as ``__main__``; its
top-level names are kept while the check runs, as they live until the interpreter exits in a real run.

A group still alive when the program is done (an object holding it, such as a DDP module in a global, or a missing
``destroy_process_group()``) keeps gloo's worker threads until the interpreter shuts down, where one of them may
abort the finished process ("terminate called without an active exception"): a failure that shows in a few runs
in a hundred. The check turns it into one that shows every time. Self-contained: it imports nothing of the
repository, so the program sees the same modules as when it is run directly.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import weakref
from typing import Any

import torch.distributed as dist


def _main() -> int:
    program, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(program))  # as when the program is run directly
    groups: list[Any] = []
    init = dist.init_process_group

    def recording_init(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        groups.append(weakref.ref(dist.group.WORLD))

    dist.init_process_group = recording_init
    top_level: dict[str, Any] = {}
    try:
        top_level = runpy.run_path(program, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    gc.collect()
    if any(ref() is not None for ref in groups):
        held = sorted(name for name, value in top_level.items() if type(value).__name__ == "DistributedDataParallel")
        print(
            f"{program}: its default process group is alive after the program ended"
            + (f" (held by the DDP module in {', '.join(held)}: `del` it)" if held else "")
            + "; free what holds it and call destroy_process_group() (docs/guide/failure_modes.rst, shutting down)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
