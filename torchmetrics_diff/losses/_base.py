"""The shared shape of a global-batch loss metric: a differentiable value per call, a detached epoch value."""

from __future__ import annotations

import inspect
from contextvars import Token
from typing import Any, Callable, ClassVar, TypeVar

import torch
from torch import Tensor

from torchmetrics_diff._batch_step import record_step
from torchmetrics_diff._global.strategy import AutoChoice, check_strategy, check_tile, checked_together
from torchmetrics_diff.distributed._call import enter, fresh_count, leave
from torchmetrics_diff.metric import Metric

T = TypeVar("T")


def check_consistent(owner: str, tensors: dict[str, Any], same_dtype: tuple[str, ...]) -> None:
    """One call's tensors on one device, and the tensors named in ``same_dtype`` in one dtype.

    A 0-d CPU tensor (a scale given as ``torch.tensor(10.0)``) may go with tensors on any device, as in torch's
    own arithmetic.

    Raises:
        ValueError: naming the two arguments and what they hold.
    """
    present = {n: t for n, t in tensors.items() if isinstance(t, Tensor)}
    anchor = next((n for n in same_dtype if n in present), None)
    if anchor is None:
        return
    ref = present[anchor]
    for name, t in present.items():
        if t.device != ref.device and not (t.ndim == 0 and t.device.type == "cpu"):
            raise ValueError(f"{owner}: `{name}` must be on the device of `{anchor}` ({ref.device}); got {t.device}")
        if name in same_dtype and t.dtype != ref.dtype:
            raise ValueError(
                f"{owner}: `{name}` must have the dtype of `{anchor}` ({ref.dtype}); got {t.dtype} "
                "(cast both to one dtype, e.g. under the same autocast)"
            )


def enter_call(loss: Metric, method: str) -> Token | None:
    """Name this call (``"CLIPLoss.forward"``) in the header every rank exchanges before communicating, so that
    ranks in different calls (one more ``update`` on one rank) raise naming them; only when it syncs, and not in
    compiled code (see ``distributed._call.enter``). The caller ends it with ``leave(token)`` in a ``finally``;
    :func:`named_call` does both."""
    if not loss._step_syncs() or torch.compiler.is_compiling():
        return None
    # this loss's syncing calls so far: tells two of a class apart
    calls, loss.__dict__["_calls"] = fresh_count(loss.__dict__.get("_calls"), loss.process_group)
    return enter(f"{type(loss).__name__}.{method}", calls)


def named_call(loss: Metric, method: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, its calls to the collectives named after ``loss``'s ``method`` (:func:`enter_call`), the name
    ended however ``fn`` ends. Compiled code runs ``fn`` as it is: no ``try`` around its graph breaks."""
    token = enter_call(loss, method)
    if token is None:
        return fn(*args)
    try:
        return fn(*args)
    finally:
        leave(token)


def note_value_dtype(loss: Any, value: Tensor) -> None:
    """Remember the dtype of a value the loss returned, for ``compute()`` to return it too.

    A loss accumulates its epoch value in float64, and ``forward`` returns the wider of float32 and the inputs'
    dtype; ``compute()`` casts to the widest value seen (``loss._value_dtype``, float32 until a float64 value
    comes). The dtype only ever widens, and under ``torch.compile`` the comparison is decided while tracing, so
    float32 and half-precision steps never write it (no guard changes, no recompile).
    """
    if value.dtype != loss._value_dtype and value.dtype.is_floating_point:
        loss._value_dtype = torch.promote_types(loss._value_dtype, value.dtype)


def value_dtype(loss: Any) -> torch.dtype:
    """The dtype of ``compute()``: the wider of the metric's dtype and the widest value ``forward`` returned."""
    return torch.promote_types(loss.dtype, loss._value_dtype)


class GlobalBatchLoss(Metric):
    """Base of the losses: ``loss(*inputs)`` returns the global-batch loss; ``compute()`` the epoch mean.

    Each call's detached value is recorded, and :meth:`compute` returns the mean of the recorded values over
    steps (and ranks).

    Writing a loss: a subclass implements one method, ``_loss(self, <inputs>, *, sync: bool) -> Tensor``. It
    receives the call's inputs by name (the tensors of this rank) and ``sync``: ``True`` when the call must
    return the loss of every rank's rows (``dist_sync_on_step`` and a process group of more than one rank), in
    which case it calls a ``global_*`` function of :mod:`torchmetrics_diff.functional` (or
    :func:`~torchmetrics_diff.functional.global_rows_loss`) with ``**self._options()`` (the strategy, with
    ``"auto"``'s memory of the global batch, ``group=self.process_group``, ``grad_reduction=self.grad_reduction``
    and the ring's ``tile``); ``False``: the plain loss of the
    local rows. It returns the loss as a 0-d floating tensor with its graph. The inherited :meth:`forward` and
    :meth:`update` take the arguments of ``_loss`` (without ``sync``), record the value and, in ``forward``,
    return it. The package's losses also override ``forward`` and
    ``update`` to give them their real signatures and docstrings.

    Args:
        strategy: ``"auto"`` (default: picks ``"replicated"``, ``"sharded"`` or ``"ring"`` per call from the
            global batch and the width, the same on every rank; :attr:`last_strategy` says which),
            ``"replicated"``, ``"sharded"`` or ``"ring"`` (see :doc:`/guide/strategies`, :doc:`/guide/ring`).
            Losses that all-reduce sums (Barlow Twins, the normalized losses) have no strategy and ignore it.
        tile: with ``"ring"`` (chosen, or picked by ``"auto"``), candidate columns per logit tile (default
            ``None``: 64); it bounds the logits a rank holds at a time to (B, tile). Must be a positive int or
            ``None``.
        dist_sync_on_step: compute the loss over every rank's rows (default ``True``); ``False`` gives the
            plain local loss.
        kwargs: the other :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``,
            ``grad_reduction``, ...).

    Raises:
        ValueError: an unknown ``strategy``, a ``tile`` that is not a positive int, or a bad
            :class:`~torchmetrics_diff.Metric` keyword argument.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from torchmetrics_diff.losses import GlobalBatchLoss
        >>> class MeanSquaredNorm(GlobalBatchLoss):
        ...     def _loss(self, x, *, sync):
        ...         return (x**2).sum(dim=1).mean()  # a local loss: ignores sync
        >>> loss = MeanSquaredNorm(dist_sync_on_step=False)
        >>> loss(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
        tensor(3.)
        >>> loss.update(torch.tensor([[2.0, 0.0]]))
        >>> loss.compute()  # the mean of the two recorded values
        tensor(3.5000)
    """

    is_differentiable = True
    higher_is_better = False
    full_state_update = False
    _same_dtype: ClassVar[tuple[str, ...]] = ()  # the arguments that must share one floating dtype
    loss_total: Tensor
    steps: Tensor
    # (a copy of their code per loss class, as the metric lifecycle's: torch.compile caches frames per code object)
    _per_class_code: ClassVar[tuple[str, ...]] = (
        *Metric._per_class_code,
        "_step",
        "_update_from",
        "_raise_if_inconsistent",
    )

    def __init__(
        self, *, strategy: str = "auto", tile: int | None = None, dist_sync_on_step: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step, **kwargs)
        self.strategy = check_strategy(strategy)
        check_tile(tile)
        self.tile = tile
        self._auto = AutoChoice()  # what "auto" knows of the global batch (the same on every rank)
        self.add_state("loss_total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("steps", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self._value_dtype = torch.float32  # the widest value returned (see note_value_dtype)

    # each loss takes its own arguments, narrower than these: its override carries `type: ignore[override]`
    def _loss(self, *args: Any, sync: bool, **kwargs: Any) -> Tensor:
        raise NotImplementedError

    @property
    def last_strategy(self) -> str | None:
        """The strategy of the last call that computed the global loss, the same on every rank (for logging).

        The fixed ``strategy`` itself, or what ``"auto"`` picked; ``None`` before its first such call.

        Example:
            >>> import torch
            >>> from torchmetrics_diff.losses import CLIPLoss
            >>> loss = CLIPLoss()
            >>> _ = loss(torch.eye(2), torch.eye(2), 1.0)
            >>> loss.last_strategy  # one process, two rows
            'replicated'
        """
        return self._auto.last if self.strategy == "auto" else self.strategy

    def _options(self) -> dict[str, Any]:
        # the tile where the ring may run; left out by default, so that global_rows_loss (no ring) takes these too
        ring = {"tile": self.tile} if self.strategy == "ring" or self.tile is not None else {}
        strategy = self._auto if self.strategy == "auto" else self.strategy
        return {"strategy": strategy, "group": self.process_group, "grad_reduction": self.grad_reduction, **ring}

    def _record(self, value: Tensor) -> None:
        self.loss_total = self.loss_total + value.detach().to(self.loss_total.dtype)
        self.steps = self.steps + 1
        note_value_dtype(self, value)

    def _raise_if_inconsistent(self, inputs: dict[str, Any]) -> None:
        """Raise unless this call's tensors agree in device and dtype; under sync a failure raises on every rank."""
        owner = type(self).__name__
        if self._step_syncs():
            like = next((inputs[n] for n in self._same_dtype if isinstance(inputs.get(n), Tensor)), None)
            with checked_together(self.process_group, like):
                check_consistent(owner, inputs, self._same_dtype)
        else:
            check_consistent(owner, inputs, self._same_dtype)

    def _step(self, **inputs: Any) -> Tensor:
        """``forward``'s body: the loss of this call's global batch, differentiable, then recorded.

        A step of the batch-step protocol with the loss in place of ``update`` and the batch value
        (``_batch_step.record_step``): the loss syncs what it needs itself, so the batch states are only the
        record, and the step begins once the value is there.
        """
        if self._is_synced:
            raise self._synced_error("forward")
        value = named_call(self, "forward", self._checked_loss, inputs)
        return record_step(self, value, lambda: self._record(value))

    def _checked_loss(self, inputs: dict[str, Any]) -> Tensor:
        """The loss of the inputs (checked alike on every rank) over the global batch."""
        self._raise_if_inconsistent(inputs)
        return self._loss(**inputs, sync=self.dist_sync_on_step)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The loss of this call's global batch, differentiable; also recorded for :meth:`compute`.

        The losses of this package define ``forward`` with their own arguments; this generic form serves a
        subclass that only implements ``_loss`` (see the class docstring).

        Args:
            args: the positional arguments of the subclass's ``_loss``, without ``sync``.
            kwargs: its keyword arguments, without ``sync``.

        Returns:
            The 0-d loss ``_loss`` returned, with its graph.

        Raises:
            TypeError: arguments that do not bind to ``_loss``'s signature.
        """
        return self._step(**self._bind(args, kwargs))

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Record the loss of a batch without gradient (e.g. in validation); arguments as in :meth:`forward`.

        Args:
            args: as for :meth:`forward`.
            kwargs: as for :meth:`forward`.
        """
        self._update_from(**self._bind(args, kwargs))

    def _bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = inspect.signature(self._loss).bind(*args, sync=False, **kwargs)
        bound.arguments.pop("sync")
        return dict(bound.arguments)

    def _update_from(self, **inputs: Any) -> None:
        """``update``'s body (it runs under ``no_grad`` in the metric lifecycle)."""
        self._record(named_call(self, "update", self._checked_loss, inputs))

    def compute(self) -> Tensor:
        """The mean of the recorded losses (NaN before any call), in the dtype ``forward`` returns."""
        return (self.loss_total / self.steps).to(value_dtype(self))


class _TwoViewsLoss(GlobalBatchLoss):
    """A loss of two views of this rank's batch, ``za`` and ``zb`` (Barlow Twins, VICReg), of one dtype."""

    _same_dtype = ("za", "zb")

    def update(self, za: Tensor, zb: Tensor) -> None:
        """Record the loss of a batch without gradient (validation); arguments as in :meth:`forward`.

        Args:
            za: this rank's embeddings of the first views ``(B, D)``.
            zb: the second views ``(B, D)``.
        """
        self._update_from(za=za, zb=zb)
