"""The three ``strategy="ddp"`` runs of the tests in one launch of two processes.

Usage: ``python run_ddp.py OUT_DIR``: the ``main`` of ``run_trainer.py``, ``run_log_dict.py`` and ``run_fabric.py``
one after the other, writing to ``OUT_DIR/trainer``, ``OUT_DIR/log_dict`` and ``OUT_DIR/fabric``. Lightning
re-launches this script for rank 1 at the first ``Trainer``'s fit; the second ``Trainer`` and Fabric find both
ranks and the process group in place (as under ``torchrun``) and start nothing. Each process pays for importing
lightning once instead of three times (about 5 s each on the CI machines). Fabric starting its processes itself
is what the docs' Fabric program does (docs/guide/lightning.rst).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integration.lightning import run_fabric, run_log_dict, run_trainer

RUNS = {"trainer": run_trainer.main, "log_dict": run_log_dict.main, "fabric": run_fabric.main}


def main(out: Path) -> None:
    for name, run in RUNS.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        run(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
