"""Global-batch losses as metrics: call them like a loss, get the one-big-device gradient under DDP."""

from __future__ import annotations

from torchmetrics_diff.losses._base import GlobalBatchLoss
from torchmetrics_diff.losses.contrastive import BarlowTwinsLoss, CLIPLoss, InfoNCELoss, SigLIPLoss, SupConLoss
from torchmetrics_diff.losses.moe import LoadBalancingLoss, RouterZLoss
from torchmetrics_diff.losses.normalized import FlatAccumulation, GlobalMeanLoss, TokenCrossEntropyLoss
from torchmetrics_diff.losses.self_supervised import DINOCenter, VICRegLoss

__all__ = [
    "BarlowTwinsLoss",
    "CLIPLoss",
    "FlatAccumulation",
    "GlobalBatchLoss",
    "GlobalMeanLoss",
    "InfoNCELoss",
    "SigLIPLoss",
    "SupConLoss",
    "TokenCrossEntropyLoss",
    "DINOCenter",
    "VICRegLoss",
    "LoadBalancingLoss",
    "RouterZLoss",
]
