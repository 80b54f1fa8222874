"""A baseline revision beside the working tree: a temporary ``git worktree`` and fresh subprocesses per tree.

Shared by ``bench_forward.py`` and ``check_compat.py``: :func:`baseline_worktree` checks the revision out with
``git worktree add --detach`` into a temporary folder and removes it at the end (``git worktree remove --force``,
``git worktree prune``), on errors and SIGTERM as well; :func:`run_in_tree` runs a fresh interpreter with
``PYTHONPATH`` and the working folder set to one tree, so ``import torchmetrics_diff`` resolves to that tree.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "d2c2c41"


def git(*args: str) -> str:
    """``git -C REPO *args``: its stdout, stripped; raises on a non-zero exit."""
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def short_hash(rev: str) -> str:
    """The abbreviated commit hash of ``rev`` (raises when it names no commit)."""
    return git("rev-parse", "--short", f"{rev}^{{commit}}")


def package_dirty() -> bool:
    """Whether the working tree has uncommitted changes under ``torchmetrics_diff/``."""
    return bool(git("status", "--porcelain", "--", "torchmetrics_diff"))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def baseline_worktree(rev: str, prefix: str = "baseline_") -> Iterator[tuple[Path, Path]]:
    """Yield ``(tmp, tree)``: a temporary folder and, inside it, a detached worktree of ``rev``; both removed after.

    SIGTERM (e.g. from ``timeout``) would end Python without running ``finally``: it raises ``SystemExit`` instead
    while the worktree exists (main thread only).
    """
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if on_main else None
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tree = tmp / "baseline"
    try:
        git("worktree", "add", "--detach", str(tree), short_hash(rev))
        yield tmp, tree
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if on_main:
            signal.signal(signal.SIGTERM, previous)


def run_in_tree(tree: Path, argv: list[str], timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``python *argv`` in a fresh interpreter that imports ``torchmetrics_diff`` from ``tree``.

    ``PYTHONPATH`` is the tree and so is the working folder (``python -c`` puts the working folder first on
    ``sys.path``); one torch thread; warnings off. Raises with the subprocess's stderr on a non-zero exit.
    """
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=tree, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess on {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def assert_imported_from(tree: Path, module_file: str) -> None:
    """Raise unless ``module_file`` (a ``torchmetrics_diff.__file__``) lies inside ``tree``."""
    if Path(tree).resolve() not in Path(module_file).resolve().parents:
        raise RuntimeError(f"torchmetrics_diff imported from {module_file}, not from {tree}")
