"""Collectives with autograd, and the state-sync engine. Knows tensors, not metrics."""

from __future__ import annotations

from torchmetrics_diff.distributed._collectives import (
    GRAD_MODES,
    REDUCE_OPS,
    all_gather_cat,
    all_reduce,
    gather_all_tensors,
)

__all__ = ["GRAD_MODES", "REDUCE_OPS", "all_gather_cat", "all_reduce", "gather_all_tensors"]
