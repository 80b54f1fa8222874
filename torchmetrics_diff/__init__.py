"""torchmetrics_diff: metrics and losses on the global batch of a distributed run, with exact gradients."""

from __future__ import annotations

__version__ = "0.1.0"
