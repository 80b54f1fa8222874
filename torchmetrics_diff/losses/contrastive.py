"""Contrastive losses over the global batch: CLIP, InfoNCE (NT-Xent), SupCon, SigLIP, and Barlow Twins."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from torchmetrics_diff import functional as F
from torchmetrics_diff.functional._docs import shared_docs
from torchmetrics_diff.losses._base import GlobalBatchLoss, _TwoViewsLoss


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"`temperature` must be a finite positive number; got {temperature!r}")
    if not (0 < float(temperature) < float("inf")):
        raise ValueError(f"`temperature` must be a finite positive number; got {temperature!r}")
    return float(temperature)


#: the last arguments and the errors of CLIP and SigLIP, and the heading of their examples (the first line an
#: ``Args`` entry, indented as one)
_TILE_DOCS = """\
    tile: with ``"ring"`` (chosen or picked), candidate columns per logit tile (``None``: 64). Default ``None``.
    dist_sync_on_step: compute the loss over every rank's rows (default ``True``); ``False`` gives the
        plain local loss.
    kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``, ``grad_reduction``...).

Raises:
    ValueError: an unknown ``strategy``, a bad ``tile``, or a bad :class:`~torchmetrics_diff.Metric` keyword
        argument.

Example:"""


@shared_docs(tile=_TILE_DOCS)
class CLIPLoss(GlobalBatchLoss):
    r"""Symmetric image–text contrastive loss of CLIP (Radford et al., 2021) over the global batch.

    .. math::
        \ell = \frac{1}{2N}\sum_{i=1}^{N}\bigl[\mathrm{CE}(s\,I T^\top, i)_i + \mathrm{CE}(s\,T I^\top, i)_i\bigr]

    over the ``N`` rows of every rank, with ``s`` the ``logit_scale`` given per call.

    Args:
        strategy: ``"auto"`` (default: picks one of the others per call from the global batch and the width, see
            :attr:`~torchmetrics_diff.losses.GlobalBatchLoss.last_strategy`), ``"sharded"`` (each rank scores its
            own rows against all), ``"replicated"`` or
            ``"ring"`` (the candidate blocks travel around the ranks; :doc:`/guide/ring`); see
            :doc:`/guide/strategies`.
    {tile}
        >>> import torch
        >>> from torchmetrics_diff.losses import CLIPLoss
        >>> loss = CLIPLoss()
        >>> img = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0]]), dim=1)
        >>> txt = torch.nn.functional.normalize(torch.tensor([[0.9, 0.1], [0.0, 1.0]]), dim=1)
        >>> loss(img, txt, logit_scale=torch.tensor(10.0))
        tensor(0.0004)
    """

    _same_dtype = ("image_embeds", "text_embeds")

    def forward(self, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor | float) -> Tensor:
        """The CLIP loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            image_embeds: this rank's image embeddings (B, D), used as given (normalize them in the model).
            text_embeds: this rank's text embeddings (B, D) of the same dtype and device; row i pairs with image i.
            logit_scale: the multiplier of the similarities (``model.logit_scale.exp()``): a number, a 0-d tensor
                or a shape-(1,) tensor (FSDP2 refuses 0-d parameters); its gradient has its shape.

        Returns:
            The loss of every rank's rows, identical on every rank: 0-d, float64 for float64 inputs, else float32.
        """
        return self._step(image_embeds=image_embeds, text_embeds=text_embeds, logit_scale=logit_scale)

    def update(self, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor | float) -> None:
        """Record the loss of a batch without gradient (validation); arguments as in :meth:`forward`.

        Args:
            image_embeds: this rank's image embeddings ``(B, D)``.
            text_embeds: this rank's text embeddings ``(B, D)``.
            logit_scale: the multiplier of the similarities (a number, a 0-d or a shape-(1,) tensor).
        """
        self._update_from(image_embeds=image_embeds, text_embeds=text_embeds, logit_scale=logit_scale)

    def _loss(  # type: ignore[override]
        self, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor | float, *, sync: bool
    ) -> Tensor:
        if not sync:
            return F.clip_loss(image_embeds, text_embeds, logit_scale)
        return F.global_clip_loss(image_embeds, text_embeds, logit_scale, **self._options())


#: the arguments and errors of InfoNCE and SupCon, and the heading of their examples (the first line an ``Args``
#: entry, indented as one)
_TEMPERATURE_DOCS = """\
    temperature: ``τ``, a finite positive number. Default ``0.1``.
    strategy: ``"auto"`` (default: picks one of the others per call, see
        :attr:`~torchmetrics_diff.losses.GlobalBatchLoss.last_strategy`), ``"sharded"``, ``"replicated"`` or
        ``"ring"`` (:doc:`/guide/strategies`, :doc:`/guide/ring`).
    tile: with ``"ring"`` (chosen or picked), candidate columns per logit tile (``None``: 64). Default ``None``.
    kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments (``dist_sync_on_step``, default ``True``,
        ``process_group``, ``grad_reduction``...).

Raises:
    ValueError: a ``temperature`` that is not a finite positive number, an unknown ``strategy``, a bad ``tile``, or
        a bad :class:`~torchmetrics_diff.Metric` keyword argument.

Example:"""


@shared_docs(temperature=_TEMPERATURE_DOCS)
class InfoNCELoss(GlobalBatchLoss):
    r"""NT-Xent loss of SimCLR (Chen et al., 2020) over the global batch of two views.

    The 2N L2-normalized embeddings of every rank; each is an anchor whose positive is the other view of its
    sample and whose negatives are the other 2N - 2:

    .. math::
        \ell = \frac{1}{2N}\sum_{a}-\log\frac{\exp(\cos(z_a, z_{p(a)})/\tau)}{\sum_{k\ne a}\exp(\cos(z_a, z_k)/\tau)}

    Args:
    {temperature}
        >>> import torch
        >>> from torchmetrics_diff.losses import InfoNCELoss
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> InfoNCELoss(temperature=0.5)(z, z)
        tensor(0.2395)
    """

    _same_dtype = ("z1", "z2")

    def __init__(self, temperature: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.temperature = _check_temperature(temperature)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The NT-Xent loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            z1: this rank's first-view embeddings (B, D), L2-normalized inside.
            z2: the second views (B, D), same dtype and device; row i is the other view of ``z1[i]``.

        Returns:
            The loss of every rank's 2N anchors, identical on every rank: 0-d, float64 for float64 inputs, else float32.
        """
        return self._step(z1=z1, z2=z2)

    def update(self, z1: Tensor, z2: Tensor) -> None:
        """Record the loss of a batch without gradient (validation); arguments as in :meth:`forward`.

        Args:
            z1: this rank's first-view embeddings ``(B, D)``.
            z2: the second views ``(B, D)``.
        """
        self._update_from(z1=z1, z2=z2)

    def _loss(self, z1: Tensor, z2: Tensor, *, sync: bool) -> Tensor:  # type: ignore[override]
        if not sync:
            return F.info_nce_loss(z1, z2, self.temperature)
        return F.global_info_nce_loss(z1, z2, self.temperature, **self._options())


@shared_docs(temperature=_TEMPERATURE_DOCS)
class SupConLoss(GlobalBatchLoss):
    r"""Supervised contrastive loss (Khosla et al., 2020, :math:`L^{sup}_{out}`) over the global batch.

    Labels are gathered from every rank (without gradient). Anchors without a positive are left out; the mean
    is over the global number of anchors with at least one positive.

    Args:
    {temperature}
        >>> import torch
        >>> from torchmetrics_diff.losses import SupConLoss
        >>> feats = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> SupConLoss(temperature=1.0)(feats, torch.tensor([0, 0, 1]))
        tensor(0.4846)
    """

    _same_dtype = ("features",)

    def __init__(self, temperature: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.temperature = _check_temperature(temperature)

    def forward(self, features: Tensor, labels: Tensor | None = None) -> Tensor:
        """The SupCon loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            features: this rank's embeddings (B, D) or views (B, V, D), L2-normalized inside.
            labels: integer class labels (B,) on the same device; ``None``: each sample is its own class
                (SimCLR with the views as positives).

        Returns:
            The loss over every rank's anchors that have a positive, identical on every rank:
            0-d, float64 for float64 inputs, else float32.
        """
        return self._step(features=features, labels=labels)

    def update(self, features: Tensor, labels: Tensor | None = None) -> None:
        """Record the loss of a batch without gradient (validation); arguments as in :meth:`forward`.

        Args:
            features: this rank's embeddings ``(B, D)`` or views ``(B, V, D)``.
            labels: integer class labels ``(B,)``. Default ``None``: each sample its own class.
        """
        self._update_from(features=features, labels=labels)

    def _loss(self, features: Tensor, labels: Tensor | None = None, *, sync: bool) -> Tensor:  # type: ignore[override]
        if not sync:
            return F.supcon_loss(features, labels, self.temperature)
        return F.global_supcon_loss(features, labels, self.temperature, **self._options())


@shared_docs(tile=_TILE_DOCS)
class SigLIPLoss(GlobalBatchLoss):
    r"""Pairwise sigmoid loss of SigLIP (Zhai et al., 2023) over the global batch.

    .. math::
        \ell = -\frac{1}{N}\sum_{i,j}\log\sigma\bigl(z_{ij}(t\,x_i\cdot y_j + b)\bigr),\quad z_{ij}=\pm1

    with ``t = logit_scale`` and ``b = logit_bias`` given per call, over the ``N`` rows of every rank.

    Args:
        strategy: ``"auto"`` (default: picks one of the others per call, see
            :attr:`~torchmetrics_diff.losses.GlobalBatchLoss.last_strategy`), ``"sharded"``, ``"replicated"`` or
            ``"ring"`` (:doc:`/guide/strategies`, :doc:`/guide/ring`).
    {tile}
        >>> import torch
        >>> from torchmetrics_diff.losses import SigLIPLoss
        >>> SigLIPLoss()(torch.eye(2), torch.eye(2), torch.tensor(10.0), torch.tensor(-5.0))
        tensor(0.0134)
    """

    _same_dtype = ("image_embeds", "text_embeds")

    def forward(
        self, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor | float, logit_bias: Tensor | float
    ) -> Tensor:
        """The SigLIP loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            image_embeds: this rank's image embeddings (B, D).
            text_embeds: this rank's text embeddings (B, D), same dtype and device; row i pairs with image i.
            logit_scale: ``t``, a number, a 0-d or a shape-(1,) tensor.
            logit_bias: ``b``, a number, a 0-d or a shape-(1,) tensor.

        Returns:
            The loss of every rank's rows, identical on every rank: 0-d, float64 for float64 inputs, else float32.
        """
        return self._step(
            image_embeds=image_embeds, text_embeds=text_embeds, logit_scale=logit_scale, logit_bias=logit_bias
        )

    def update(
        self, image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor | float, logit_bias: Tensor | float
    ) -> None:
        """Record the loss of a batch without gradient (validation); arguments as in :meth:`forward`.

        Args:
            image_embeds: this rank's image embeddings ``(B, D)``.
            text_embeds: this rank's text embeddings ``(B, D)``.
            logit_scale: ``t`` (a number, a 0-d or a shape-(1,) tensor).
            logit_bias: ``b`` (a number, a 0-d or a shape-(1,) tensor).
        """
        self._update_from(
            image_embeds=image_embeds, text_embeds=text_embeds, logit_scale=logit_scale, logit_bias=logit_bias
        )

    def _loss(  # type: ignore[override]
        self,
        image_embeds: Tensor,
        text_embeds: Tensor,
        logit_scale: Tensor | float,
        logit_bias: Tensor | float,
        *,
        sync: bool,
    ) -> Tensor:
        if not sync:
            return F.siglip_loss(image_embeds, text_embeds, logit_scale, logit_bias)
        return F.global_siglip_loss(image_embeds, text_embeds, logit_scale, logit_bias, **self._options())


class BarlowTwinsLoss(_TwoViewsLoss):
    r"""Barlow Twins (Zbontar et al., 2021) on the cross-correlation of the global batch.

    Computed from all-reduced sufficient statistics (``Σz``, ``Σz²``, ``Σ z_a z_bᵀ``, count): the
    communication is ``O(D²)`` whatever the batch size, and the objective is that of the global batch (not a
    per-rank batch normalization). ``strategy`` does not apply.

    .. math::
        \ell = \sum_i (1 - C_{ii})^2 + \lambda \sum_{i \ne j} C_{ij}^2

    Args:
        lambda_offdiag: ``λ``. Default ``5e-3``.
        eps: added to the variances. Default ``1e-5``.
        kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments.

    Raises:
        ValueError: a ``lambda_offdiag`` or ``eps`` that is not a finite number ``>= 0``, or a bad
            :class:`~torchmetrics_diff.Metric` keyword argument.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import BarlowTwinsLoss
        >>> za = torch.tensor([[1.0, 2.0], [2.0, 1.0], [3.0, 3.0]])
        >>> BarlowTwinsLoss()(za, za)
        tensor(0.0025)
    """

    def __init__(self, lambda_offdiag: float = 5e-3, eps: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, value in (("lambda_offdiag", lambda_offdiag), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"`{name}` must be a finite number >= 0; got {value!r}")
        self.lambda_offdiag, self.eps = float(lambda_offdiag), float(eps)

    def forward(self, za: Tensor, zb: Tensor) -> Tensor:
        """The Barlow Twins loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        Args:
            za: this rank's embeddings of the first views (B, D).
            zb: the second views (B, D), same dtype and device.

        Returns:
            The loss of the global cross-correlation, identical on every rank:
            0-d, float64 for float64 inputs, else float32.
        """
        return self._step(za=za, zb=zb)

    def _loss(self, za: Tensor, zb: Tensor, *, sync: bool) -> Tensor:  # type: ignore[override]
        if not sync:
            return F.barlow_twins_loss(za, zb, self.lambda_offdiag, self.eps)
        return F.global_barlow_twins_loss(
            za, zb, self.lambda_offdiag, self.eps, group=self.process_group, grad_reduction=self.grad_reduction
        )
