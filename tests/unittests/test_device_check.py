"""The GPU check kept from rotting on machines without a GPU: ``benchmarks/device_check.sh`` (``make test-cuda``).

Without CUDA the script prints one line saying so and exits 0, and its benchmark alone does the same; the parts
it runs are where it looks for them (the ``cuda`` marker registered, the tests carrying it, the benchmark file),
``make test-cuda`` runs it after the venv like the other targets, and its cases cover every exported metric and
loss class. With CUDA the two runs without CUDA are skipped: the script then runs the whole check.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"

without_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the whole device check")


@without_cuda
def test_without_cuda_the_script_says_so_in_one_line_and_exits_0() -> None:
    env = {**os.environ, "PY": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], done.stdout
    assert done.stderr == ""


@without_cuda
def test_without_cuda_the_benchmark_alone_prints_one_line(capsys: pytest.CaptureFixture) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        bench = importlib.import_module("bench_device")
        assert bench.main(None) == []
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    lines = capsys.readouterr().out.splitlines()
    assert lines == [bench.SKIP_LINE]


def _marked_cuda(path: Path) -> bool:
    """Whether the module's ``pytestmark`` names ``pytest.mark.cuda``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return "pytest.mark.cuda" in ast.unparse(node.value)
    return False


def test_the_parts_it_runs_are_there() -> None:
    script = SCRIPT.read_text(encoding="utf-8")
    assert re.search(r"pytest -q -m cuda tests\b", script)
    assert (ROOT / "benchmarks" / "bench_device.py").is_file() and "benchmarks/bench_device.py" in script
    assert "tests/unittests/reliability/test_host_round_trips.py" in script
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"cuda: ', pyproject), "the `cuda` marker is not registered in pyproject.toml"
    for name in ("test_cuda.py", "test_cuda_distributed.py"):
        assert _marked_cuda(ROOT / "tests" / "unittests" / name), f"{name} is not marked cuda"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^test-cuda: \$\(STAMP\)\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "benchmarks/device_check.sh" in target.group(1), "make test-cuda does not run the script"


def test_the_device_cases_cover_every_metric_and_loss_class() -> None:
    import torchmetrics_diff as tmd
    from tests._helpers.device_cases import LOSS_CASES, METRIC_CASES
    from tests._helpers.loss_cases import make_criterion
    from torchmetrics_diff import losses

    generic = {"Metric", "MetricCollection", "CompositionalMetric"}
    metrics = {n for n in tmd.__all__ if n not in generic and issubclass(getattr(tmd, n), tmd.Metric)}
    assert set(METRIC_CASES) == metrics
    # (DINOCenter: a module that centers outputs, not a loss; FlatAccumulation: the handle of a flat accumulation block)
    abstract = {"GlobalBatchLoss", "DINOCenter", "FlatAccumulation"}
    covered = {type(make_criterion(kind, strategy)).__name__ for kind, strategy in LOSS_CASES}
    assert covered == set(losses.__all__) - abstract
    strategies = {s for _, s in LOSS_CASES}
    assert strategies == {"replicated", "sharded", "ring", None}
