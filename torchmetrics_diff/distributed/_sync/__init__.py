"""The state-sync engine, as a package: entry points (:mod:`.engine`), the round protocol (:mod:`.rounds`), the plan
model (:mod:`.plan`), the agreement checks (:mod:`.agreement`), the steady state's fast path (:mod:`.steady`) and
the byte rows they exchange (:mod:`.rows`).

The names the rest of the package uses are importable from here.
"""

from __future__ import annotations

from torchmetrics_diff.distributed._reductions import REDUCTIONS, Reduction, State
from torchmetrics_diff.distributed._sync.engine import fail_sync, scale_state_grad, sync_states
from torchmetrics_diff.distributed._sync.plan import SteadyStatus, SyncPlan

__all__ = [
    "REDUCTIONS",
    "Reduction",
    "State",
    "SteadyStatus",
    "SyncPlan",
    "fail_sync",
    "scale_state_grad",
    "sync_states",
]
