"""Losses normalized by a global count: a per-element loss divided by the valid elements of every rank.

The case to get right is token-level cross-entropy with padding under DDP *and* gradient accumulation: the
denominator is the number of valid tokens over every rank and every micro-batch of the optimizer step. Dividing
per micro-batch or per rank weights tokens unequally. Two ways to accumulate give the one-device gradient of the
step's global mean.

*Up front*, when the step's micro-batches are known before they run: the count only needs the targets, so
:meth:`GlobalMeanLoss.accumulate` sums it over the ranks before the first forward pass, and every call returns its
share of the step's loss (the shares add up to the step's global loss; leaving the block checks that the
micro-batches seen add up to the planned count)::

    loss_fn = TokenCrossEntropyLoss()
    for micro_batches in loader:                      # the k micro-batches of one optimizer step
        with loss_fn.accumulate([mb["labels"] for mb in micro_batches]):
            for mb in micro_batches:
                loss = loss_fn(model(mb["input_ids"]), mb["labels"])
                loss.backward()                        # (inside model.no_sync() but for the last one)
        optimizer.step(); optimizer.zero_grad()

*Flat*, when they are not (a ``for micro_batch in loader:`` loop, ranks with different numbers of micro-batches):
inside :meth:`GlobalMeanLoss.flat_accumulation` every call returns this rank's unnormalized sum ``Σ w·v`` of the
micro-batch and communicates nothing; :meth:`FlatAccumulation.finish_step` sums the step's weight over the ranks
and rescales the accumulated ``.grad`` of the parameters to the gradient of the step's global mean::

    with loss_fn.flat_accumulation(model.parameters()) as acc:
        for micro_batch in loader:
            loss_fn(model(micro_batch["input_ids"]), micro_batch["labels"]).backward()
            if step_ends(micro_batch):                 # (DDP: only that backward outside model.no_sync())
                acc.finish_step()                      # before clipping and optimizer.step(); acc.loss: the step's
                optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, cast

import torch
from torch import Tensor

from torchmetrics_diff import functional as F
from torchmetrics_diff._batch_step import record_step
from torchmetrics_diff._global.strategy import checked_together, global_normalized, grad_factor
from torchmetrics_diff.distributed import all_gather_cat, all_reduce
from torchmetrics_diff.distributed._backend import default_device, group_size
from torchmetrics_diff.distributed._call import enter, leave
from torchmetrics_diff.exceptions import CollectiveError, PeerLeftError, RanksDisagreeError
from torchmetrics_diff.functional._checks import safe_divide
from torchmetrics_diff.losses._accumulation import (
    AccumulationMismatchError,
    block_parameters,
    plan_mismatch,
    protocol_error,
    stalled,
)
from torchmetrics_diff.losses._base import check_consistent, named_call, note_value_dtype, value_dtype
from torchmetrics_diff.metric import Metric


class GlobalMeanLoss(Metric):
    """``Σ w·v / Σ w`` over every rank's elements: any per-element loss normalized by the global weight.

    Call it as ``loss(values, weight=None, mask=None)`` with per-element losses (e.g.
    ``F.cross_entropy(..., reduction="none")``), optional weights and/or a bool mask. The returned value is
    identical on every rank and its gradient is the one-big-device gradient
    (:ref:`architecture-gradient-contract`). :meth:`compute`
    returns the weighted mean over every element seen since the last reset, over every rank. With gradient
    accumulation, :meth:`accumulate` normalizes each call by the step's weight known up front, and
    :meth:`flat_accumulation` normalizes the step's gradients at its end (:doc:`/guide/accumulation`).

    Args:
        dist_sync_on_step: normalize by the global weight (default ``True``); ``False``: the local mean.
        kwargs: :class:`~torchmetrics_diff.Metric` keyword arguments (``process_group``, ``grad_reduction``...).

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import GlobalMeanLoss
        >>> loss = GlobalMeanLoss()
        >>> loss(torch.tensor([1.0, 2.0, 9.0]), mask=torch.tensor([True, True, False]))
        tensor(1.5000)
        >>> with loss.accumulate([torch.tensor([True, True]), torch.tensor([True, False])]):  # 3 valid elements
        ...     first = loss(torch.tensor([3.0, 3.0]), mask=torch.tensor([True, True]))
        ...     second = loss(torch.tensor([6.0, 0.0]), mask=torch.tensor([True, False]))
        >>> first, second, first + second  # shares of the step's mean (3 + 3 + 6) / 3
        (tensor(2.), tensor(2.), tensor(4.))
    """

    is_differentiable = True
    higher_is_better = False
    full_state_update = False
    _same_dtype: tuple[str, ...] = ("values",)
    #: why :meth:`flat_accumulation` would not be exact for a subclass ("": it is, the loss is a ratio of sums)
    _not_flat: ClassVar[str] = ""
    loss_sum: Tensor
    weight: Tensor

    def __init__(self, *, dist_sync_on_step: bool = True, **kwargs: Any) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step, **kwargs)
        self.add_state("loss_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        # [global total, local planned (None: given as `total`), local seen] inside accumulate()
        self._accumulation: list[Any] | None = None
        self._flat: FlatAccumulation | None = None  # the open flat_accumulation() block
        self._value_dtype = torch.float32  # the widest value returned (see note_value_dtype)

    def _block(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return F.weighted_mean_block(*args, **kwargs)

    def _local_count(self, item: Any) -> Tensor:
        """The weight one planned micro-batch contributes (``item`` is what you pass as ``weight``/``mask``)."""
        item = torch.as_tensor(item)
        return item.sum().to(torch.float64)

    @contextmanager
    def accumulate(self, items: Sequence[Any] | None = None, *, total: float | Tensor | None = None) -> Iterator[None]:
        """Normalize every call in the block by the weight of *all* its micro-batches on every rank.

        Every rank makes as many calls in the block (each communicates): a rank with fewer micro-batches pads with
        empty ones, ``(0, T)``, listed in ``items`` too. Entering the block checks that the ranks' ``items`` hold as
        many; the calls and the block's end name themselves in their headers. A mismatch raises on every rank at
        once (:doc:`/guide/accumulation`).

        Args:
            items: what each micro-batch of this rank will pass as weight or mask, in the shape of its values
                (a weight that would broadcast counts once, not per element), or for
                :class:`TokenCrossEntropyLoss` its targets; their global total is the denominator.
            total: the global denominator itself, when you have it (no collective).

        Raises:
            ValueError: neither or both of ``items`` and ``total``.
            AccumulationMismatchError: on every rank, when the ranks planned or made different numbers of calls.
            RuntimeError: on leaving the block, when the calls inside did not add up to the planned weight.
        """
        if (items is None) == (total is None):
            raise ValueError("accumulate() needs exactly one of `items` (per micro-batch) or `total`")
        if self._accumulation is not None or self._flat is not None:
            raise RuntimeError(_nested(self, "accumulate"))
        if items is not None:
            items = list(items)
            local = sum((self._local_count(i) for i in items), torch.tensor(0.0, dtype=torch.float64))
            planned_local: float | None = float(local)
            if self.dist_sync_on_step and group_size(self.process_group) > 1:
                total = self._global_plan(local, len(items))
            else:
                total = float(local)
        else:
            planned_local = None
        # [global total, local planned (None: given as `total`), local seen, calls made in the block]
        self._accumulation = [float(cast("float | Tensor", total)), planned_local, 0.0, 0]
        try:
            yield
        except BaseException:
            self._accumulation = None
            raise
        plan, self._accumulation = self._accumulation, None
        if plan[1] is None:
            return
        wrong = abs(plan[2] - plan[1]) > 1e-6 * max(1.0, plan[1])
        if self.dist_sync_on_step and group_size(self.process_group) > 1:
            # one flag per rank, so a mistake on one rank raises on every rank (not a hang at the next step)
            flag = torch.tensor([float(wrong)], device=default_device(self.process_group))
            flags = self._named("accumulate end", plan[3], _gathered, flag, self.process_group)
            ranks = flags.nonzero().flatten().tolist()  # (the failed ranks only: no Python code per rank)
            if ranks and not wrong:
                raise RuntimeError(
                    f"{type(self).__name__}.accumulate(): on rank(s) {ranks} the calls inside the block did not "
                    "add up to the weight their micro-batches planned"
                )
        if wrong:
            raise RuntimeError(
                f"{type(self).__name__}.accumulate(): the micro-batches planned a weight of {plan[1]:g} on this "
                f"rank but the calls inside the block brought {plan[2]:g}"
            )

    def _global_plan(self, local: Tensor, micro_batches: int) -> float:
        """The step's global weight, summed in one all-reduce with each rank's number of micro-batches ``n`` and
        ``n²``: the ranks planned as many exactly when ``W Σn² = (Σn)²``; else every rank raises, before any forward
        pass, naming each rank's number (one all-gather more, on this error's path only)."""
        group = self.process_group
        n = float(micro_batches)
        plan = torch.stack([local, local.new_tensor(n), local.new_tensor(n * n)]).to(default_device(group))
        weight, count, squares = self._named("accumulate start", 0, _summed, plan, group).tolist()
        if group_size(group) * round(squares) != round(count) ** 2:
            counts = self._named("accumulate start", 1, _gathered, plan.new_tensor([n]), group)
            raise AccumulationMismatchError(plan_mismatch(type(self).__name__, counts.tolist()))
        return weight

    def _named(self, what: str, count: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its collectives named ``"<Loss>.<what>"`` with ``count`` (the calls made in the block before)
        in their header; ranks in different calls of the block raise an :class:`AccumulationMismatchError`.
        Compiled code runs ``fn`` as it is (no entry point, no ``try`` around its graph breaks)."""
        token = enter(f"{type(self).__name__}.{what}", count)
        if token is None:
            return fn(*args)
        try:
            return fn(*args)
        except RanksDisagreeError as err:
            mismatch = protocol_error(type(self).__name__, err, flat=False)
            if mismatch is None:
                raise
            raise mismatch from err
        finally:
            leave(token)

    @contextmanager
    def flat_accumulation(self, params: Iterable[Tensor]) -> Iterator[FlatAccumulation]:
        """Accumulate micro-batches whose targets are not known in advance; normalize the gradients at the end.

        Inside the block each call returns this rank's *unnormalized* sum ``Σ w·v`` of its micro-batch, with its
        graph, and communicates nothing: call ``backward()`` on it. Ranks may run different numbers of
        micro-batches in a step, none included.
        :meth:`~torchmetrics_diff.losses.FlatAccumulation.finish_step` ends the optimizer step: on
        every rank it sums the step's weight ``N`` over the ranks and multiplies the ``.grad`` of each of
        ``params`` by ``W / N`` (``grad_reduction="mean"``, the trainer averages over ``W`` ranks) or ``1 / N``
        (``"sum"``), which makes it the one-device gradient of the step's global mean
        (:ref:`architecture-gradient-contract`). Call it after the step's last ``backward()`` and before gradient
        clipping and ``optimizer.step()``. Leaving the block finishes the step in progress (an empty one on every
        rank changes nothing). With ``dist_sync_on_step=False`` ``N`` is this rank's weight (no collective).

        The rescale multiplies the whole ``.grad``: the gradients of ``params`` must come from this loss's calls
        since the last ``zero_grad()`` (add another loss to the returned sum and it is divided by ``N`` too).
        :meth:`update` and :meth:`compute` are unchanged inside the block, and the calls are recorded for
        :meth:`compute` as outside it.

        Args:
            params: the parameters the micro-batches' gradients accumulate in: ``model.parameters()`` (or the
                module itself); parameters whose ``.grad`` is ``None`` are left alone.

        Yields:
            The block's :class:`~torchmetrics_diff.losses.FlatAccumulation`: ``finish_step()``, and
            ``loss`` and ``weight`` of the last
            finished step.

        Raises:
            ValueError: ``params`` holds something other than tensors, or nothing.
            RuntimeError: inside another ``flat_accumulation()`` or :meth:`accumulate` block.
            NotImplementedError: a loss that is not a ratio of sums over its elements (``LoadBalancingLoss``).

        Example:
            >>> import torch
            >>> from torchmetrics_diff.losses import GlobalMeanLoss
            >>> w = torch.tensor([1.0, 2.0], requires_grad=True)
            >>> loss = GlobalMeanLoss()
            >>> with loss.flat_accumulation([w]) as acc:
            ...     loss(3 * w).backward()  # returns Σ v = 3 + 6 (2 elements), not normalized
            ...     loss(w[:1]).backward()  # Σ v = 1 (1 element)
            >>> acc.loss, acc.weight  # the step's mean (3 + 6 + 1) / 3, over 3 elements
            (tensor(3.3333), tensor(3., dtype=torch.float64))
            >>> w.grad  # the gradient of that mean: (3 + 1) / 3 and 3 / 3
            tensor([1.3333, 1.0000])
        """
        if self._not_flat:
            raise NotImplementedError(f"{type(self).__name__}.flat_accumulation(): {self._not_flat}; use accumulate()")
        listed = block_parameters(params)
        if self._accumulation is not None or self._flat is not None:
            raise RuntimeError(_nested(self, "flat_accumulation"))
        flat = self._flat = FlatAccumulation(self, listed)
        try:
            yield flat
        except BaseException:
            self._flat, flat._open = None, False
            raise
        try:
            self._finish_flat_step(flat, last=True)
        finally:
            self._flat, flat._open = None, False

    def forward(self, values: Tensor, weight: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """This call's loss (its share of the step's loss inside :meth:`accumulate`), differentiable.

        Args:
            values: per-element losses of this rank (any shape), e.g. ``F.cross_entropy(..., reduction="none")``.
            weight: per-element weights broadcastable to ``values``, same device and dtype as ``values``.
                Default ``None``.
            mask: a bool tensor broadcastable to ``values``: ``False`` leaves an element out. Default ``None``.

        Returns:
            ``Σ w·v / Σ w`` over every rank's elements, identical on every rank:
            0-d, float64 for float64 inputs, else float32.
        """
        return self._step(values=values, weight=weight, mask=mask)

    def update(self, values: Tensor, weight: Tensor | None = None, mask: Tensor | None = None) -> None:
        """Accumulate the weighted sum and weight of a batch (no gradient); arguments as in :meth:`forward`.

        Args:
            values: per-element losses of this rank (any shape).
            weight: per-element weights broadcastable to ``values``. Default ``None``: 1.
            mask: a bool tensor broadcastable to ``values``. Default ``None``: every element.
        """
        self._update_from(values=values, weight=weight, mask=mask)

    def _check_inputs(self, inputs: dict[str, Any]) -> None:
        check_consistent(type(self).__name__, inputs, self._same_dtype)

    def _step(self, **inputs: Any) -> Tensor:
        """``forward``'s body, a step of the batch-step protocol (``_batch_step.record_step``): the block's sum
        and weight are the batch states, the globally normalized value is the batch value. As in
        ``GlobalBatchLoss._step``, the step begins once every rank has the value."""
        if self._is_synced:
            raise self._synced_error("forward")
        if self._flat is not None:
            return self._flat_step(self._flat, inputs)
        plan = self._accumulation
        if plan is not None and self._step_syncs():  # a call of the block, named with the calls made before it
            calls, plan[3] = plan[3], plan[3] + 1
            loss_sum, count, value = self._named("accumulate", calls, self._normalized_block, inputs)
        else:
            loss_sum, count, value = named_call(self, "forward", self._normalized_block, inputs)
        return record_step(self, value, lambda: self._record_block(loss_sum, count, value))

    def _normalized_block(self, inputs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """The call's block (checked alike on every rank) and its value, normalized over the global batch."""
        loss_sum, count = self._checked_block(inputs)
        total = None if self._accumulation is None else self._accumulation[0]
        if self.dist_sync_on_step:
            value = global_normalized(loss_sum, count, total, self.process_group, self.grad_reduction)
        else:
            denominator = count if total is None else torch.as_tensor(total, dtype=loss_sum.dtype)
            value = safe_divide(loss_sum, denominator)
        return loss_sum, count, value

    def _record_block(self, loss_sum: Tensor, count: Tensor, value: Tensor) -> None:
        """Fold a ``forward`` call into the batch states: the block, the value's dtype, the accumulated weight."""
        self._add_block(loss_sum.detach(), count.detach())
        note_value_dtype(self, value)
        if self._accumulation is not None:
            self._accumulation[2] += float(count)

    def _flat_step(self, flat: FlatAccumulation, inputs: dict[str, Any]) -> Tensor:
        """``forward`` inside :meth:`flat_accumulation`: the block's unnormalized sum, no collective. An input error
        therefore raises on this rank alone; the peers meet it (or its exit) at the step's ``finish_step``."""
        self._check_inputs(inputs)
        loss_sum, count = self._block(**inputs)
        return record_step(self, loss_sum, lambda: self._record_flat(flat, loss_sum, count))

    def _record_flat(self, flat: FlatAccumulation, loss_sum: Tensor, count: Tensor) -> None:
        self._add_block(loss_sum.detach(), count.detach())
        note_value_dtype(self, loss_sum)
        flat._add(loss_sum.detach(), count.detach())

    def _finish_flat_step(self, flat: FlatAccumulation, *, last: bool = False) -> Tensor:
        """End the step of ``flat``: the global sum, weight and calls in one all-reduce, the gradients rescaled.

        ``last`` (leaving the block): a step without calls on any rank leaves ``flat.loss`` as it was.
        """
        if not flat._open:
            raise RuntimeError(f"{type(self).__name__}: finish_step() after its flat_accumulation() block ended")
        mine = flat.micro_batches
        local = flat._take()
        world = 1
        if self._step_syncs():
            group = self.process_group
            # (named apart: a rank leaving the block meets its peers' finish_step() and every rank raises)
            what = "finish_step at exit" if last else "finish_step"
            try:
                local = named_call(self, what, _summed, local.to(default_device(group)), group)
            except RanksDisagreeError as err:
                mismatch = protocol_error(type(self).__name__, err, flat=True)
                if mismatch is None:
                    raise
                raise mismatch from err
            except CollectiveError as err:  # (a timeout: a peer is in another collective, e.g. DDP's all-reduce)
                if isinstance(err, PeerLeftError):
                    raise
                raise CollectiveError(stalled(type(self).__name__, mine, err)) from err
            world = group_size(group)
        _, total_weight, calls = local.tolist()  # (one host read per optimizer step)
        if total_weight > 0:
            factor = grad_factor(world, self.grad_reduction) / total_weight
            with torch.no_grad():
                for p in flat._params:
                    if p.grad is not None:
                        p.grad.mul_(factor)  # (FSDP: the local shard of a sharded gradient, scaled alike)
        value = safe_divide(local[0], local[1]).to(value_dtype(self))
        if calls or not last:
            flat.loss, flat.weight, flat.steps = value, local[1], flat.steps + 1
        return value

    def _checked_block(self, inputs: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """The block's weighted sum and weight; under sync a bad input on one rank raises on every rank."""
        if self._step_syncs():
            first = next(iter(inputs.values()))
            with checked_together(self.process_group, first):
                self._check_inputs(inputs)
                return self._block(**inputs)
        self._check_inputs(inputs)
        return self._block(**inputs)

    def _add_block(self, loss_sum: Tensor, count: Tensor) -> None:
        self.loss_sum = self.loss_sum + loss_sum.to(torch.float64)
        self.weight = self.weight + count.to(torch.float64)

    def _update_from(self, **inputs: Any) -> None:
        self._check_inputs(inputs)
        loss_sum, count = self._block(**inputs)
        self._add_block(loss_sum, count)
        note_value_dtype(self, loss_sum)

    def compute(self) -> Tensor:
        """The weighted mean over everything seen (every rank when ``sync_on_compute``), in ``forward``'s dtype."""
        return (self.loss_sum / self.weight).to(value_dtype(self))


class FlatAccumulation:
    """The handle of a :meth:`~torchmetrics_diff.losses.GlobalMeanLoss.flat_accumulation` block: ends optimizer
    steps, keeps their loss. Made by ``flat_accumulation()``, not by hand.

    Args:
        owner: the loss whose calls the block collects.
        params: the parameters whose ``.grad`` :meth:`finish_step` rescales.

    Attributes:
        loss: the global mean loss of the last finished step, detached and identical on every rank (``None``
            before the first): for logging.
        weight: that step's global weight ``N`` (float64; the valid tokens of
            :class:`~torchmetrics_diff.losses.TokenCrossEntropyLoss`), ``None`` before the first step.
        steps: the steps finished in the block.
        micro_batches: this rank's calls in the step in progress.
    """

    def __init__(self, owner: GlobalMeanLoss, params: list[torch.Tensor]) -> None:
        self._owner, self._params, self._open = owner, params, True
        self._sum: Tensor | None = None  # this rank's Σ w·v of the step in progress (detached, float64)
        self._weight: Tensor | None = None  # and its weight
        self.micro_batches = 0
        self.loss: Tensor | None = None
        self.weight: Tensor | None = None
        self.steps = 0

    def finish_step(self) -> Tensor:
        """End the optimizer step: every rank calls it at the same step, whatever its number of micro-batches.

        Sums the step's ``Σ w·v`` and weight over the ranks (on the CPU in one collective, its call header's
        exchange; none with one process or ``dist_sync_on_step=False``) and multiplies the ``.grad`` of the
        block's parameters so that they hold the gradient of the step's global mean. Call it after the step's
        last ``backward()`` (under DDP, after the one backward outside ``no_sync()``, which all-reduced the
        gradients) and before clipping, ``GradScaler.unscale_`` or ``optimizer.step()``: the rescale commutes
        with the scaler's factor, not with clipping.

        Returns:
            The step's global mean loss, detached (0 when the step's weight is 0; the gradients are then left
            as they are).

        Raises:
            AccumulationMismatchError: on every rank, when a rank leaves the block (its loop had fewer steps) while
                others finish a step.
            CollectiveError: after the group's timeout, naming this rank's calls in the step and the likely cause (a
                peer waiting in another collective, such as DDP's all-reduce for a rank that ran no micro-batch).
            RuntimeError: after the block ended; on every rank when the ranks are not all finishing the step
                (a rank in another call of the loss).
        """
        return self._owner._finish_flat_step(self)

    def _add(self, loss_sum: Tensor, count: Tensor) -> None:
        loss_sum, count = loss_sum.to(torch.float64), count.to(torch.float64)
        self._sum = loss_sum if self._sum is None else self._sum + loss_sum.to(self._sum.device)
        self._weight = count if self._weight is None else self._weight + count.to(self._weight.device)
        self.micro_batches += 1

    def _take(self) -> Tensor:
        """``[Σ w·v, weight, calls]`` of this rank's step in progress (float64), and a fresh step."""
        if self._sum is None or self._weight is None:
            taken = torch.zeros(3, dtype=torch.float64)
        else:
            calls = torch.tensor(float(self.micro_batches), dtype=torch.float64, device=self._sum.device)
            taken = torch.stack([self._sum, self._weight.to(self._sum.device), calls])
        self._sum, self._weight, self.micro_batches = None, None, 0
        return taken


def _nested(loss: GlobalMeanLoss, opening: str) -> str:
    return (
        f"{type(loss).__name__}.{opening}() blocks cannot be nested: an accumulate() or flat_accumulation() "
        "block of this loss is open"
    )


class TokenCrossEntropyLoss(GlobalMeanLoss):
    """Token-level cross-entropy divided by the number of non-ignored tokens of every rank.

    Called as ``loss(logits, target)`` with ``logits`` ``(B, T, C)`` (class dimension last, the language-model
    layout; any ``(..., C)``) and ``target`` ``(B, T)``; with ``class_dim=1``, ``logits`` in the layout of
    :func:`torch.nn.functional.cross_entropy`, ``(B, C, T)``. Inside :meth:`~GlobalMeanLoss.accumulate`, give the
    targets of the step's micro-batches: the denominator is then the valid tokens of every micro-batch on every
    rank.

    The layout is taken from ``class_dim``, never guessed from the shapes: when ``T == C`` both layouts fit the
    target, and reading the wrong one would be silently wrong, so only the argument decides. A ``target`` that fits
    neither layout raises a ``ValueError`` naming the layout read and the target shape it needs.

    Args:
        ignore_index: target value of padding tokens. Default ``-100``.
        label_smoothing: as in :func:`torch.nn.functional.cross_entropy`. Default ``0.0``.
        class_dim: the dimension of ``logits`` holding the classes: ``-1`` (default) or ``1`` for torch's
            ``(B, C, T)`` (any dimension of ``logits`` is accepted).
        validate_args: check before each call that every target is ``ignore_index`` or in ``[0, C)``, on any
            device: one reduction over the targets and a host synchronization per call. Default ``False``: on the
            CPU an out-of-range target raises the same ``IndexError`` (naming the value and the range) anyway, at
            no cost; on a GPU it trips an asynchronous device-side assert instead, so turn this on there to debug.
        kwargs: :class:`GlobalMeanLoss` keyword arguments.

    Example:
        >>> import torch
        >>> from torchmetrics_diff.losses import TokenCrossEntropyLoss
        >>> loss = TokenCrossEntropyLoss()
        >>> loss(torch.zeros(1, 3, 4), torch.tensor([[0, 1, -100]]))  # two valid tokens, each log(4)
        tensor(1.3863)
        >>> TokenCrossEntropyLoss(class_dim=1)(torch.zeros(1, 4, 3), torch.tensor([[0, 1, -100]]))  # (B, C, T)
        tensor(1.3863)
    """

    def __init__(
        self,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        *,
        class_dim: int = -1,
        validate_args: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1]; got {label_smoothing!r}")
        if isinstance(class_dim, bool) or not isinstance(class_dim, int):
            raise ValueError(f"`class_dim` must be an int (-1: (B, T, C), 1: (B, C, T)); got {class_dim!r}")
        if not isinstance(validate_args, bool):
            raise ValueError(f"`validate_args` must be a bool; got {validate_args!r}")
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)
        self.class_dim, self.validate_args = class_dim, validate_args

    _same_dtype = ("logits",)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:  # type: ignore[override]
        """This call's loss (its share of the step's loss inside :meth:`~GlobalMeanLoss.accumulate`).

        Args:
            logits: the classes in dimension ``class_dim``: ``(B, T, C)`` by default, ``(B, C, T)`` with
                ``class_dim=1``.
            target: integer classes, the shape of ``logits`` without dimension ``class_dim``, on the same device;
                ``ignore_index`` marks padding.

        Returns:
            The mean cross-entropy over every rank's valid tokens, identical on every rank:
            0-d, float64 for float64 inputs, else float32.

        Raises:
            ValueError: a ``target`` whose shape does not fit ``logits`` read with ``class_dim``.
            IndexError: a target neither ``ignore_index`` nor in ``[0, C)`` (on the CPU; elsewhere with
                ``validate_args=True``). Under sync, the other ranks raise a
                :class:`~torchmetrics_diff.exceptions.PeerFailedError` naming this rank.
        """
        return self._step(logits=logits, target=target)

    def update(self, logits: Tensor, target: Tensor) -> None:  # type: ignore[override]
        """Accumulate a batch's summed loss and valid-token count (no gradient); arguments as in :meth:`forward`.

        Args:
            logits: as for :meth:`forward`.
            target: as for :meth:`forward`.
        """
        self._update_from(logits=logits, target=target)

    def _block(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        return F.token_cross_entropy_block(
            logits,
            target,
            self.ignore_index,
            self.label_smoothing,
            class_dim=self.class_dim,
            validate_args=self.validate_args,
        )

    def _local_count(self, item: Any) -> Tensor:
        return (torch.as_tensor(item) != self.ignore_index).sum().to(torch.float64)


def _summed(local: Tensor, group: Any) -> Tensor:
    """``local`` summed over the ranks of ``group`` (no gradient)."""
    return all_reduce(local, "sum", group, grad="none")


def _gathered(local: Tensor, group: Any) -> Tensor:
    """Every rank's ``local`` (1-D) concatenated by rank (no gradient)."""
    return all_gather_cat(local, group, grad="none")
