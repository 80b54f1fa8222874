"""torchmetrics' own unit tests, run on the real classes and with every class served as ``Synced(real class)``.

A held-out check of the adapter (``torchmetrics_diff.wrappers.Synced``): the same tests, the same data, the same
references, twice side by side; any test whose outcome differs between the two runs is printed, and the exit
status is 1. Tests that fail on both (a reference package that does not install, data that cannot be downloaded)
say nothing about the adapter and are only counted.

torchmetrics' tests are not in its PyPI package, so this needs a checkout of torchmetrics at the installed
version, and a Python environment with torchmetrics' test requirements (its ``requirements/*_test.txt``; install
them with torch pinned, e.g. ``pip install -c constraints.txt``, where ``constraints.txt`` says
``torch==<this torch>``), numpy, packaging, pytest and pytest-timeout. This package is put on ``PYTHONPATH``;
nothing is installed into it::

    git clone --branch v1.9.0 --depth 1 https://github.com/Lightning-AI/torchmetrics /tmp/torchmetrics
    python benchmarks/check_torchmetrics_suite.py --tests /tmp/torchmetrics/tests --python /tmp/tmvenv/bin/python
    python benchmarks/check_torchmetrics_suite.py --tests ... --only unittests/text/test_eed.py  # a subset

How the classes are served: ``torchmetrics_suite/synced_plugin.py`` (loaded by pytest with ``-p synced_plugin``
and, in the DDP pool's spawned workers, by ``torchmetrics_suite/sitecustomize.py``) hands the test modules proxies
of torchmetrics' modules whose metric classes are stand-ins building ``Synced(real class, ...)``; torchmetrics
itself and its functional API are untouched. torchmetrics' testers first ``torch.jit.script`` every metric, which
this package refuses by design: the plugin records that refusal (``--log``) and lets the test go on.

The two runs go side by side (two pytest processes, each with torchmetrics' pool of two gloo ranks); on a 2-core
machine the nine domains below take about 25 minutes.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "torchmetrics_suite"
DOMAINS = ("image", "audio", "text", "segmentation", "clustering", "nominal", "shape", "regression", "detection")
OUTCOMES = ("passed", "failed", "error", "skipped")


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, message) from a junit XML file."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                message = (child.get("message") or "").strip()
        out[f"{case.get('classname')}::{case.get('name')}"] = (outcome, message)
    return out


def _domain(test_id: str) -> str:
    parts = test_id.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "unittests" else "?"


def _start(mode: str, args: argparse.Namespace, out: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "TM_SYNCED": "1" if mode == "synced" else "0",
        "TM_SYNCED_LOG": str(out / f"events_{mode}.jsonl") if args.log else "",
        "PYTHONPATH": os.pathsep.join([str(PLUGIN), str(REPO)]),
        "USE_PYTEST_POOL": "1",  # torchmetrics' conftest: the pool of two gloo ranks for its DDP cases
        "PYTEST_REFERENCE_CACHE": str(out / f"cache_{mode}"),
    }
    targets = args.only or [f"unittests/{d}" for d in DOMAINS]
    cmd = [args.python, "-m", "pytest", *targets, "-p", "synced_plugin", "-p", "no:cacheprovider", "-q"]
    cmd += ["--timeout", "300", "--tb=short", f"--junitxml={out / f'results_{mode}.xml'}"]
    # torchmetrics' own pytest options, less the doctest plugins its pyproject.toml may ask for
    cmd += ["-o", "addopts=--disable-pytest-warnings", "-o", "xfail_strict=true"]
    log = open(out / f"log_{mode}.txt", "w")  # noqa: SIM115 (closed with the process, below)
    return subprocess.Popen(cmd, cwd=args.tests, env=env, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, type=Path, help="the tests/ folder of a torchmetrics checkout")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the test environment")
    parser.add_argument("--out", type=Path, default=Path("torchmetrics_suite_results"), help="where results go")
    parser.add_argument("--only", action="append", help="a test path under --tests (repeatable); default: nine domains")
    parser.add_argument("--log", action="store_true", help="keep the plugin's events (events_<mode>.jsonl)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs = {mode: _start(mode, args, args.out) for mode in ("real", "synced")}
    for proc in runs.values():
        proc.wait()
    real = _outcomes(args.out / "results_real.xml")
    synced = _outcomes(args.out / "results_synced.xml")

    counts: dict[str, dict[str, collections.Counter]] = {"real": {}, "synced": {}}
    for mode, results in (("real", real), ("synced", synced)):
        for test_id, (outcome, _) in results.items():
            for key in (_domain(test_id), "all"):
                counts[mode].setdefault(key, collections.Counter())[outcome] += 1
    print(f"torchmetrics' tests under {args.tests}, {time.monotonic() - started:.0f} s (both runs side by side)\n")
    print(f"{'domain':14s}" + "".join(f"{m + ' ' + o:>16s}" for m in ("real", "synced") for o in OUTCOMES))
    for key in sorted(counts["real"], key=lambda k: (k == "all", k)):
        row = [counts[m].get(key, collections.Counter())[o] for m in ("real", "synced") for o in OUTCOMES]
        print(f"{key:14s}" + "".join(f"{n:16d}" for n in row))

    both_failed = collections.Counter(
        real[t][1].splitlines()[0][:100] if real[t][1] else "(no message)"
        for t in real
        if real[t][0] in ("failed", "error") and synced.get(t, ("",))[0] == real[t][0]
    )
    print("\nfailing in both runs (not the adapter's), by message:")
    for message, n in both_failed.most_common(10):
        print(f"  {n:5d}  {message}")

    differ = [
        t for t in sorted(set(real) | set(synced)) if real.get(t, ("missing",))[0] != synced.get(t, ("missing",))[0]
    ]
    print(f"\n{len(differ)} test(s) whose outcome differs")
    for test_id in differ:
        a, b = real.get(test_id, ("missing", "")), synced.get(test_id, ("missing", ""))
        print(f"  {test_id}: real {a[0]}, synced {b[0]}: {(b[1] or a[1])[:300]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
