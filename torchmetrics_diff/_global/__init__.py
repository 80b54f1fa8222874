"""The global layer: the functions that compute a loss or a statistic of every rank's rows, and communicate.

It sits between :mod:`torchmetrics_diff.distributed` (the collectives it runs) and the metrics and losses above,
and may import ``functional`` (the local maths it runs on each rank's rows) and ``distributed``, nothing else of
the package (:ref:`architecture-layers`). Its public names are those of :mod:`torchmetrics_diff.functional`,
which resolves them from here on first use: import them from there.

One job per module: ``strategy`` (the strategy table, the option checks, ``checked_together``, the replicated and
sharded runs of a row-decomposable loss and the global values), ``ring_losses`` (the ring strategy's kernels),
``contrastive`` (``clip_sum`` and the ``global_*`` contrastive losses), ``barlow_twins``, ``normalized``
(the weighted mean and the token cross-entropy), ``vicreg``, ``dino`` (the teacher center's update) and ``moe``
(the Mixture-of-Experts router losses), each the global form of its namesake in ``functional``.
"""

from __future__ import annotations

from torchmetrics_diff._global.barlow_twins import global_barlow_twins_loss
from torchmetrics_diff._global.contrastive import (
    clip_sum,
    global_clip_loss,
    global_info_nce_loss,
    global_siglip_loss,
    global_supcon_loss,
)
from torchmetrics_diff._global.dino import dino_center_update
from torchmetrics_diff._global.moe import global_load_balancing_loss, global_router_z_loss
from torchmetrics_diff._global.normalized import global_token_cross_entropy, global_weighted_mean
from torchmetrics_diff._global.strategy import STRATEGIES, global_rows_loss
from torchmetrics_diff._global.vicreg import global_vicreg_loss, global_vicreg_stats

__all__ = [
    "STRATEGIES",
    "clip_sum",
    "dino_center_update",
    "global_barlow_twins_loss",
    "global_clip_loss",
    "global_info_nce_loss",
    "global_load_balancing_loss",
    "global_router_z_loss",
    "global_rows_loss",
    "global_siglip_loss",
    "global_supcon_loss",
    "global_token_cross_entropy",
    "global_vicreg_loss",
    "global_vicreg_stats",
    "global_weighted_mean",
]
