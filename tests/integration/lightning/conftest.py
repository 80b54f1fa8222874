"""The ``strategy="ddp"`` runs the Lightning tests read, made once for all of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._helpers import lightning_runs as C


@pytest.fixture(scope="package")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of ``run_ddp.py``'s three runs (the Trainer's, the ``log_dict`` one's and Fabric's, in
    ``trainer/``, ``log_dict/`` and ``fabric/``): one launch of two processes for the tests of both modules."""
    out = tmp_path_factory.mktemp("ddp_runs")
    C.run_script("run_ddp.py", out)
    return out
