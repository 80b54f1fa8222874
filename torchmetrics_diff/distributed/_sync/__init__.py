"""The state-sync engine, as a package: the entry points and the one path of a sync (:mod:`.engine`), the plan
model (:mod:`.plan`), the row of an agreed plan (:mod:`.layout`), the agreement on a plan (:mod:`.agreement`) and
the byte rows (:mod:`.rows`).

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
