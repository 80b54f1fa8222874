"""The example scripts run as their docstrings say, and show what they say they show.

``examples/train_clip_ddp.py`` is ``make demo`` and runs in ``test_torchrun_multinode.py``; this file runs
``examples/moe_demo.py`` under ``torchrun`` with two CPU processes, as its docstring's command does, and checks the
effect it and docs/losses/moe.rst describe: per-rank balancing keeps each rank's expert load near uniform, global
balancing lets each rank's load move away from uniform while the load of all tokens together stays balanced, and
the regression error is lower. ``examples/flat_accumulation.py`` runs with three processes, as its docstring says:
it checks its own gradients against one process, and here its steps must have had different numbers of
micro-batches on the ranks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests._helpers import doc_blocks as D

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _torchrun(script: Path, *args: str, nproc: int = 2) -> str:
    status, out = D.run_command(D.torchrun_command(script, *args, nproc=nproc), ROOT, TIMEOUT_S, ROOT)
    assert status == 0, f"{script.name} exited with {status}:\n{out[-4000:]}"
    return out


def test_moe_demo_global_balancing_balances_the_global_load_not_each_ranks() -> None:
    out = _torchrun(ROOT / "examples" / "moe_demo.py")
    spread = re.search(r"from uniform \(sum \|f_i - 1/4\|\): per rank ([\d.]+), global ([\d.]+)", out)
    assert spread, out
    per_rank, global_ = map(float, spread.groups())
    assert per_rank < 0.35 < global_, f"rank loads' distance from uniform: per rank {per_rank}, global {global_}"
    errors = [float(e) for e in re.findall(r"balancing: regression error ([\d.]+)", out)]
    assert len(errors) == 2 and errors[1] < errors[0], f"regression error per rank / global: {errors}"
    loads = re.findall(r"global expert load: ([\d. ]+)", out)
    assert len(loads) == 2, out
    for line in loads:  # both ways balance the load of every token together
        values = [float(v) for v in line.split()]
        assert len(values) == 4 and abs(sum(values) - 1) < 0.02 and max(abs(v - 0.25) for v in values) < 0.1, line


def test_flat_accumulation_example_matches_one_process_with_uneven_micro_batch_counts() -> None:
    out = _torchrun(ROOT / "examples" / "flat_accumulation.py", nproc=3)
    counts = [json.loads(c) for c in re.findall(r"micro-batches per rank (\[[\d, ]+\]): gradients match", out)]
    assert len(counts) == 3 and all(len(c) == 3 for c in counts), out
    assert any(len(set(c)) > 1 for c in counts), f"every step had as many micro-batches on every rank: {counts}"
    assert out.count("up front step") == 3 and "trained the same weights" in out, out
