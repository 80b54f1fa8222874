"""Run every benchmark and print side-by-side tables, then the acceptance targets as PASS/FAIL lines.

Usage::

    python benchmarks/run_all.py                # everything (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick        # fewer repeats
    python benchmarks/run_all.py --only sync    # one module (bench_sync.py); repeatable

A benchmark is a module ``benchmarks/bench_<name>.py`` with ``main(args) -> list[_timing.Check]``; it is found
by its file name, so adding one is adding the file (``BENCHMARKS`` below only fixes the order of known ones).
The targets are reported, never asserted: the printed report is the output.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["sync", "losses"]  # run first, in this order; any other bench_*.py follows alphabetically


def _load() -> str:
    """The 1/5/15-minute load averages: other work on the machine inflates every number (ratios less so)."""
    try:
        return " / ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def discover() -> list[str]:
    found = sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    return [n for n in BENCHMARKS if n in found] + [n for n in found if n not in BENCHMARKS]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a rough look, not a measurement)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only bench_NAME.py (NAME or bench_NAME; repeatable)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    names = discover()
    if args.only:
        wanted = [n.removeprefix("bench_").removesuffix(".py") for n in args.only]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"unknown benchmark(s) {unknown}; available: {names}", file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]

    import torch
    from _timing import torchmetrics_or_none

    tm = torchmetrics_or_none()
    print("# torchmetrics_diff benchmarks\n")
    print(
        f"torch {torch.__version__}, torchmetrics {tm.__version__ if tm else 'not installed'}, python "
        f"{sys.version.split()[0]}, gloo on 127.0.0.1, spawned processes with torch.set_num_threads(1)"
        f"{', --quick' if args.quick else ''}"
    )
    print(f"{os.cpu_count()} CPUs, load average at start: {_load()}\n")
    started = time.perf_counter()
    checks, failed = [], []
    for name in names:
        t0 = time.perf_counter()
        print(f"## bench_{name}\n")
        sys.stdout.flush()
        try:
            module = importlib.import_module(f"bench_{name}")
            checks += module.main(args) or []
        except Exception as err:  # one broken benchmark must not hide the others' numbers
            failed.append(name)
            print(f"bench_{name} FAILED: {type(err).__name__}: {err}\n{traceback.format_exc()}")
        print(f"(bench_{name}: {time.perf_counter() - t0:.0f} s)\n")
        sys.stdout.flush()

    print("## Acceptance targets\n")
    for check in checks:
        print(check.line())
    for name in failed:
        print(f"FAIL  bench_{name} did not run to completion")
    print(f"\ntotal runtime: {time.perf_counter() - started:.0f} s; load average at the end: {_load()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
