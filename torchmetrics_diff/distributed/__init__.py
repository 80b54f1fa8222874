"""Collectives with autograd, and the state-sync engine. Knows tensors, not metrics."""

from __future__ import annotations

from torchmetrics_diff.distributed._call import CHECKS, get_checks, set_checks
from torchmetrics_diff.distributed._collectives import (
    GRAD_MODES,
    REDUCE_OPS,
    all_gather_cat,
    all_reduce,
    gather_all_tensors,
)

__all__ = [
    "CHECKS",
    "GRAD_MODES",
    "REDUCE_OPS",
    "all_gather_cat",
    "all_reduce",
    "gather_all_tensors",
    "get_checks",
    "set_checks",
]
