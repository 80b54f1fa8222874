"""What the harness's fork server imports once, before it forks the workers of the persistent pools.

Each import here is one a worker would otherwise pay for itself (seconds on the CI machines): torch, the package
and the parts of it the tests reach, torchmetrics (which the parity tests import) when installed. The thread limits
come first: torch reads them when it loads.
"""

from __future__ import annotations

import contextlib

from tests._helpers import harness

harness._limit_threads()

import torch.distributed  # noqa: E402, F401

import torchmetrics_diff  # noqa: E402
import torchmetrics_diff.losses  # noqa: E402, F401

with contextlib.suppress(ImportError):
    import torchmetrics  # noqa: F401
