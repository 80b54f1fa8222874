"""``Metric``: a state registry with an update/compute/forward/reset lifecycle and differentiable sync.

The lifecycle is one template. Subclasses write ``update`` and ``compute`` as plain methods; the class wraps
them once, when the subclass is created (:meth:`Metric.__init_subclass__`), so instances carry no rewrapped
bound methods and pickle like any module.

``forward`` builds the batch's states from fresh defaults with the caller's autograd mode, syncs them
differentiably when ``dist_sync_on_step`` (each rank's own contribution keeps its graph, its gradient scaled
by the group size under ``grad_reduction="mean"``), computes the batch value, and merges the *detached* batch
states into the accumulated ones. Nothing a step does depends on how many steps came before. The steps and
their hooks are the batch-step protocol of ``torchmetrics_diff._batch_step``; what ``torch.compile`` needs of
the class is in ``torchmetrics_diff._dynamo``.

This module holds the class itself: its constructor, the lifecycle (``update``, ``compute``, ``forward``,
``merge_state``, ``reset``), the methods that return a metric (``clone``, ``set_dtype``) and the operators'
types. The rest of ``Metric``'s methods come from private base classes, each in a module of its own, one job
each (a base cannot name ``Metric`` in a signature: it would import this module):

- ``_MetricStates`` (``torchmetrics_diff._metric_states``): the state registry (``add_state``, ``metric_state``,
  the update count, the device and dtype);
- ``_MetricSyncing`` (``torchmetrics_diff._metric_syncing``): ``sync``, ``unsync``, ``sync_context`` and whether
  a sync has anything to do;
- ``_MetricPersistence`` (``torchmetrics_diff._metric_persistence``): ``state_dict``, pickling, deep copies and
  device moves;
- ``_MetricDisplay`` (``torchmetrics_diff._metric_display``): ``repr`` and ``plot``;
- ``_MetricBatchSteps`` (``torchmetrics_diff._batch_step``): the hooks of ``forward``'s batch step.

The arithmetic and comparison operators of :class:`Metric` (and ``metric[idx]``) are defined in
:mod:`torchmetrics_diff.composition`, next to the :class:`~torchmetrics_diff.CompositionalMetric` they build.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Iterator
from copy import deepcopy
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from torchmetrics_diff._batch_step import _MetricBatchSteps
from torchmetrics_diff._dynamo import (
    folded_lists,
    give_own_code,
    own_code,
    run_outside_graph,
    set_aside_lists,
    steps_outside_graph,
    wrap_lifecycle,
)
from torchmetrics_diff._metric_display import _MetricDisplay
from torchmetrics_diff._metric_persistence import _MetricPersistence
from torchmetrics_diff._metric_states import _MetricStates
from torchmetrics_diff._metric_syncing import _MetricSyncing
from torchmetrics_diff._tensors import default_device, detach, promoted, unaliased
from torchmetrics_diff._torchmetrics import refuse_in_torchmetrics_containers
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._reductions import as_rows
from torchmetrics_diff.distributed._sync import SyncPlan
from torchmetrics_diff.exceptions import TorchMetricsUserError

_GRAD_REDUCTIONS = ("mean", "sum")


def dim_zero_cat(x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """Concatenate a list state (or return a tensor state) along dim 0; 0-d elements count as one row.

    Example:
        >>> import torch
        >>> dim_zero_cat([torch.tensor([1.0, 2.0]), torch.tensor(3.0)])
        tensor([1., 2., 3.])
    """
    if isinstance(x, torch.Tensor):
        return as_rows(x)
    if not x:
        raise ValueError("No samples to concatenate: the list state is empty")
    return torch.cat([as_rows(t) for t in x])


def register_with_torchmetrics() -> bool:
    """Make our metrics ``isinstance(m, torchmetrics.Metric)`` when torchmetrics is already imported.

    ``torchmetrics.Metric`` is an abstract base class, so registering :class:`Metric` as a virtual subclass is
    enough for Lightning's ``self.log(name, metric)`` checks; Lightning then only uses ``_forward_cache``,
    ``compute()`` and ``reset()``, which :class:`Metric` provides. torchmetrics is never imported here: the
    check costs a dictionary lookup, and frameworks that accept torchmetrics objects import it themselves.

    Returns:
        Whether :class:`Metric` is now registered (``False`` while torchmetrics is not imported).
    """
    global _TORCHMETRICS_REGISTERED
    module = sys.modules.get("torchmetrics")
    base = getattr(module, "Metric", None)
    if base is None or not hasattr(base, "register"):
        return False
    base.register(Metric)
    _TORCHMETRICS_REGISTERED = True
    return True


_TORCHMETRICS_REGISTERED = False


class Metric(_MetricStates, _MetricSyncing, _MetricPersistence, _MetricDisplay, _MetricBatchSteps, nn.Module):
    """Base class of every metric and loss: states, lifecycle, and sync across ranks with autograd.

    Subclasses register states with :meth:`add_state` in ``__init__`` and implement ``update`` (fold a batch
    into the states) and ``compute`` (the value from the states).

    Args:
        dist_sync_on_step: sync the batch's states in ``forward`` so the returned value is the one of the
            global batch on every rank, differentiable (the gradient contract of the package). Default ``False``.
        sync_on_compute: sync the accumulated states in :meth:`compute` (default ``True``).
        process_group (torch.distributed.ProcessGroup | None): the group to sync over (default ``None``: the
            default group).
        dist_sync_fn: a custom gather ``fn(tensor, group=None) -> list[Tensor]`` used instead of the
            bucketed engine (slower: one gather per state). Default ``None``: the engine.
        compute_on_cpu: move list states to the CPU after each update (saves accelerator memory). Default
            ``False``.
        compute_with_cache: cache the result of :meth:`compute` until the next update or reset (default
            ``True``).
        grad_reduction: how the trainer combines gradients across ranks: ``"mean"`` (DDP, FSDP, DeepSpeed;
            the local gradient is scaled by the group size; the default) or ``"sum"`` (raw local gradient).
        distributed_available_fn: a callable returning whether to sync at all (checked before every sync, on
            step and on compute); ``None`` (default): sync whenever the process group has more than one rank.
        kwargs: none is accepted: an unknown keyword argument raises (subclasses pass on what they do not take).

    Raises:
        ValueError: unknown keyword argument or a bad value for one of the above.

    Example:
        >>> import torch
        >>> class Total(Metric):
        ...     total: torch.Tensor  # the state's type, for type checkers
        ...     def __init__(self, **kwargs):
        ...         super().__init__(**kwargs)
        ...         self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        ...     def update(self, x):
        ...         self.total = self.total + x.sum()
        ...     def compute(self):
        ...         return self.total
        >>> metric = Total()
        >>> metric(torch.tensor([1.0, 2.0]))  # the batch value
        tensor(3.)
        >>> metric.update(torch.tensor([4.0]))
        >>> metric.compute()  # every batch since the last reset
        tensor(7.)

    Internals, for the package's own subclasses (protected members, not part of the public API): ``forward``
    runs the batch-step protocol of ``torchmetrics_diff._batch_step``, whose module docstring lists the hooks
    (inherited from ``_MetricBatchSteps``) and who may call them. What a collection needs besides:
    ``_filter_kwargs`` (the keyword arguments ``update`` takes), ``_snapshot``/``_restore`` (an all-or-nothing
    ``update``, of ``_MetricStates``), ``_same_update`` and ``_share_states`` (compute groups), ``_sync_spec``,
    ``_hold_synced`` and ``_is_synced`` (one sync for every member, of ``_MetricSyncing``), and the questions
    ``_step_syncs``, ``_step_syncs_by_engine`` (of ``_MetricBatchSteps``), ``_compute_syncs`` and
    ``_joins_compute_sync`` (of ``_MetricSyncing``).
    """

    is_differentiable: ClassVar[bool | None] = None
    higher_is_better: ClassVar[bool | None] = None
    full_state_update: ClassVar[bool | None] = None
    plot_lower_bound: ClassVar[float | None] = None
    plot_upper_bound: ClassVar[float | None] = None
    plot_legend_name: ClassVar[str | None] = None

    _raw_update: ClassVar[Callable[..., Any]]
    _raw_compute: ClassVar[Callable[..., Any]]
    # forward and compute run eagerly behind one graph break (a copy per class: _dynamo.run_outside_graph)
    _outside_forward: ClassVar[Callable[..., Any]]
    _outside_compute: ClassVar[Callable[..., Any]]
    #: the lifecycle methods shared by every subclass that ``torch.compile`` may compile as frames of their own
    #: (when a graph break below them stops Dynamo inlining them): each subclass runs its own copy of their code,
    #: so their compiled frames are cached per class (see ``_dynamo.own_code``)
    _per_class_code: ClassVar[tuple[str, ...]] = (
        "forward",
        "_run_batch_step",
        "_update_template",
        "_compute_template",
        "_begin_batch",
        "_update_batch",
        "_batch_value",
        "_finish_batch",
        "_abort_batch",
        "_run_in_lifecycle",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the subclass its own copy of the lifecycle's code (:attr:`_per_class_code`), and wrap its own
        ``update``/``compute`` once, at class creation, in the lifecycle template."""
        super().__init_subclass__(**kwargs)
        give_own_code(cls, cls._per_class_code)
        if not cls.__dict__.get("_wrap_lifecycle", True):
            return
        for which in ("update", "compute"):
            raw = cls.__dict__.get(which)
            if raw is not None:
                setattr(cls, f"_raw_{which}", raw)
                setattr(cls, which, own_code(wrap_lifecycle(raw, getattr(cls, f"_{which}_template")), cls))

    def __init__(
        self,
        *,
        dist_sync_on_step: bool = False,
        sync_on_compute: bool = True,
        process_group: Group = None,
        dist_sync_fn: Callable | None = None,
        compute_on_cpu: bool = False,
        compute_with_cache: bool = True,
        grad_reduction: str = "mean",
        distributed_available_fn: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if not _TORCHMETRICS_REGISTERED:
            register_with_torchmetrics()
        if kwargs:
            raise ValueError(f"Unexpected keyword arguments for {type(self).__name__}: {sorted(kwargs)}")
        for name, value in (
            ("dist_sync_on_step", dist_sync_on_step),
            ("sync_on_compute", sync_on_compute),
            ("compute_on_cpu", compute_on_cpu),
            ("compute_with_cache", compute_with_cache),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be a bool; got {value!r}")
        if grad_reduction not in _GRAD_REDUCTIONS:
            raise ValueError(f"`grad_reduction` must be one of {_GRAD_REDUCTIONS}; got {grad_reduction!r}")
        # (a rank outside a group created with new_group() holds its non-member marker: it raises when it syncs)
        if process_group is not None and not (
            dist.is_available()
            and (isinstance(process_group, dist.ProcessGroup) or process_group is dist.GroupMember.NON_GROUP_MEMBER)
        ):
            raise ValueError(
                f"`process_group` must be a torch.distributed ProcessGroup or None; got {type(process_group).__name__}"
            )
        if dist_sync_fn is not None and not callable(dist_sync_fn):
            raise ValueError(f"`dist_sync_fn` must be callable or None; got {type(dist_sync_fn).__name__}")
        if distributed_available_fn is not None and not callable(distributed_available_fn):
            raise ValueError(
                f"`distributed_available_fn` must be callable or None; got {type(distributed_available_fn).__name__}"
            )
        self.dist_sync_on_step = dist_sync_on_step
        self.sync_on_compute = sync_on_compute
        self.process_group = process_group
        self.dist_sync_fn = dist_sync_fn
        self.compute_on_cpu = compute_on_cpu
        self.compute_with_cache = compute_with_cache
        self.grad_reduction = grad_reduction
        self.distributed_available_fn = distributed_available_fn

        self._defaults: dict[str, torch.Tensor | list] = {}
        self._reductions: dict[str, str | Callable | None] = {}
        self._persistent: dict[str, bool] = {}
        # the update count: a Python int in eager mode, a tensor for the updates made inside torch.compile'd code
        # (Dynamo guards on every int it reads: an int counted there recompiles each step; see _add_count)
        self._eager_count = 0
        self._traced_count = torch.zeros((), dtype=torch.int64)
        self._computed: Any = None
        self._forward_cache: Any = None
        self._synced_cache: dict[str, Any] | None = None
        self._in_lifecycle = False
        self._sync_plans = {"step": SyncPlan(), "epoch": SyncPlan()}
        self._list_states: tuple[str, ...] = ()  # names of the list states, in registration order
        self._callable_lists: tuple[str, ...] = ()
        # whether batch states merge by their reductions, or update replays on the accumulators (_finish_batch)
        self._merged_by_reduction = not self.full_state_update
        self._weighs_count = False  # whether a ``mean`` state needs the update count to merge
        # where tensors are made now: the CPU, or the device of an enclosing ``with torch.device(...)``
        self._device = default_device()
        self._dtype = torch.get_default_dtype()

    # -------------------------------------- what a collection asks of a member
    def _filter_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments ``update`` accepts (all of them when it takes ``**kwargs``).

        Called as torchmetrics calls it (``m._filter_kwargs(**kwargs)``), so torchmetrics' own containers
        (``torchmetrics.MetricCollection``, its ``CompositionalMetric``) can drive our metrics too.
        """
        params = inspect.signature(self.update).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return kwargs
        return {k: v for k, v in kwargs.items() if k in params}

    def _share_states(self, leader: Metric) -> None:
        """Read ``leader``'s states and update count (a follower in a collection's compute group)."""
        self._set_states(leader.metric_state)
        self._update_count = leader._update_count  # (a tensor when compiled: no guard, no break)
        self._computed = None

    def _same_update(self, other: Metric) -> bool:
        """Whether ``other`` has this metric's states and ``update``, so that one can stand for both."""
        return other._reductions == self._reductions and type(other)._raw_update is type(self)._raw_update

    # --------------------------------------------------------------- lifecycle
    def update(self, *args: Any, **kwargs: Any) -> None:
        """Fold a batch into the states. Implemented by subclasses.

        Args:
            args: the batch, as the subclass's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the subclass's ``update`` takes them.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `update`")

    def compute(self) -> Any:
        """The metric value from the states. Implemented by subclasses."""
        raise NotImplementedError(f"{type(self).__name__} must implement `compute`")

    def _update_template(self, raw: Callable, *args: Any, **kwargs: Any) -> None:
        if self._in_lifecycle:  # inside forward, or a subclass calling super().update(): just run it
            return raw(self, *args, **kwargs)
        if self._synced_cache is not None:
            raise self._synced_error("update")
        # traced: ``update`` appends to fresh lists, folded into the accumulated rows after (see _folded_lists)
        rows = set_aside_lists(self) if compiling() and self._list_states else None
        # In-place updates (``self.total += x``) must not leave half-updated states when ``update`` raises.
        snapshot = self._snapshot()
        self._computed = None
        self._add_count(1)  # not `+= 1`: under torch.compile, see _add_count
        try:
            with torch.no_grad():  # accumulated states never hold a graph (nor a view of one)
                self._run_in_lifecycle(raw, *detach(args), **detach(kwargs))
        except BaseException:
            self._restore(snapshot)
            if rows is not None:
                self._set_states(rows)
            raise
        if rows is not None:
            self._set_states(folded_lists(rows, self.metric_state))
        for name, before in snapshot[0].items():  # a float64 input must not promote a float32 accumulator
            after = getattr(self, name)
            if promoted(before, after):
                setattr(self, name, after.to(before.dtype))
        if self.compute_on_cpu:
            self._move_list_states(torch.device("cpu"))
        return None

    def _compute_template(self, raw: Callable) -> Any:
        if self._in_lifecycle:
            return raw(self)
        if compiling() and self._compute_syncs():
            return self._outside_compute(self, raw)  # the sync runs inside a context manager: one break around it all
        if not compiling() and self._update_count == 0:  # (traced: the count is a tensor; no data-dependent branch)
            warnings.warn(
                f"{type(self).__name__}.compute() was called before update(); the value is that of the default states",
                UserWarning,
                stacklevel=2,
            )
        if self._cache_usable():
            return self._computed
        external = self._synced_cache is not None  # a MetricCollection synced every member at once
        should_sync = self.sync_on_compute and not external
        with self.sync_context(should_sync=should_sync, should_unsync=should_sync), torch.no_grad():
            value = detach(self._run_in_lifecycle(raw))
            # a value that is a state (``return self.total``) would change with the next in-place update
            value = unaliased(value, self.metric_state)
        if self.compute_with_cache:
            self._computed = value
        return value

    def _cache_usable(self) -> bool:
        """A cached value may only skip a sync that no rank needs: ranks that updated since would sync alone."""
        if not self.compute_with_cache or self._computed is None:
            return False
        return not (self._defaults and self._compute_syncs())

    def _synced_error(self, what: str) -> TorchMetricsUserError:
        return TorchMetricsUserError(
            f"{type(self).__name__}.{what}() was called while the metric is synced: its batch would be lost at "
            "unsync(). Call unsync() first (or leave the sync_context block)."
        )

    def _run_in_lifecycle(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(self, ...)`` inside the metric's own lifecycle, where a subclass's ``super().update()`` (or
        ``compute()``) runs plainly instead of starting a lifecycle of its own."""
        state = self.__dict__
        previous, state["_in_lifecycle"] = state["_in_lifecycle"], True
        try:
            return fn(self, *args, **kwargs)
        finally:
            state["_in_lifecycle"] = previous

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Update with a batch and return the metric of that batch (of the global batch when syncing).

        With ``dist_sync_on_step=True`` the value is identical on every rank and, after ``backward`` and the
        trainer's gradient averaging, every parameter gradient equals the single-device one.

        Args:
            args: the batch, as the subclass's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the subclass's ``update`` takes them.
        """
        if compiling() and steps_outside_graph(self):
            return self._outside_forward(self, *args, **kwargs)
        return self._run_batch_step(args, kwargs)

    def merge_state(self, incoming_state: dict[str, Any] | Metric) -> None:
        """Merge the states of another metric (or a dict of states) of the same kind into this one.

        Args:
            incoming_state: a metric of the same class, or a dict with every state of this metric.

        Raises:
            ValueError: a different metric class, or missing states.
            RuntimeError: the metric has ``full_state_update=True`` (its states cannot be merged by their
                reductions; override ``merge_state``).
        """
        if self.full_state_update:
            raise RuntimeError(
                f"{type(self).__name__}.merge_state() is not supported for metrics with full_state_update=True: "
                "their update reads the accumulated states, so merging them by their reductions would be wrong. "
                "Override merge_state in the metric class."
            )
        if isinstance(incoming_state, Metric):
            if type(incoming_state) is not type(self):
                raise ValueError(
                    f"`incoming_state` must be a {type(self).__name__}; got {type(incoming_state).__name__}"
                )
            other_count, incoming_state = incoming_state._update_count, incoming_state.metric_state
        elif isinstance(incoming_state, dict):
            missing = set(self._defaults) - set(incoming_state)
            if missing:
                raise ValueError(f"`incoming_state` lacks states {sorted(missing)}")
            other_count = 1
        else:
            raise ValueError(f"`incoming_state` must be a dict or a Metric; got {type(incoming_state).__name__}")
        total = self._update_count + other_count
        # `mean` states average with weights update_count : other_count (see _merged's running mean); a metric
        # that never updated brings nothing
        if other_count:
            self._set_states(self._merged(self.metric_state, detach(dict(incoming_state)), total / other_count))
        self._update_count = total
        self._computed = None

    def reset(self) -> None:
        """Put every state back to its default and clear the update count and the cached values.

        List states are emptied in place (their items are freed; a reference to the list sees it empty), tensor
        states get a fresh copy of their default.
        """
        for name in self._list_states:
            getattr(self, name).clear()
        self._set_states({n: self._fresh(d) for n, d in self._defaults.items() if not isinstance(d, list)})
        self._update_count = 0
        self._computed = None
        self._forward_cache = None
        self._synced_cache = None

    # -------------------------------------------------------- copies and casts
    def clone(self) -> Metric:
        """A deep copy of the metric, states included."""
        return deepcopy(self)

    def set_dtype(self, dst_type: str | torch.dtype) -> Metric:
        """Cast every floating-point state (and default) to ``dst_type``: the one way to change the states' dtype.

        Args:
            dst_type: ``torch.float32`` or ``torch.float64`` (or their names). Half precision is refused: states
                never accumulate in float16 or bfloat16 (half-precision inputs are accumulated in float32).

        Raises:
            ValueError: ``dst_type`` is not a dtype, not floating, or a half-precision one.

        Example:
            >>> import torch
            >>> from torchmetrics_diff import SumMetric
            >>> SumMetric().set_dtype(torch.float64).sum_value.dtype
            torch.float64
        """
        dtype = getattr(torch, dst_type, None) if isinstance(dst_type, str) else dst_type
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"`dst_type` must be a floating torch.dtype (float32 or float64); got {dst_type!r}")
        if torch.finfo(dtype).bits < 32:
            raise ValueError(
                f"`dst_type` must be float32 or float64; got {dtype}: metric states never accumulate in half "
                "precision (half-precision inputs are accumulated in float32)"
            )

        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(dtype) if value.is_floating_point() else value
            if isinstance(value, list):
                return [cast(v) for v in value]
            return value

        self._dtype = dtype
        self._set_states({n: cast(v) for n, v in self.metric_state.items()})
        self._defaults = {n: cast(v) for n, v in self._defaults.items()}
        self._computed = None
        return self

    # ------------------------------------------------ unpickling and operators
    def __setstate__(self, state: dict[str, Any]) -> None:
        # an unpickled metric runs no __init__: a process it reaches (ddp_spawn, mp.spawn, a DataLoader worker)
        # registers here, or Lightning's self.log would refuse it there
        super().__setstate__(state)
        if not _TORCHMETRICS_REGISTERED:
            register_with_torchmetrics()

    __hash__ = nn.Module.__hash__

    def __iter__(self) -> Iterator:
        raise TypeError(f"{type(self).__name__} is not iterable")

    if TYPE_CHECKING:  # the operators torchmetrics_diff.composition attaches (each builds a CompositionalMetric)

        def __add__(self, other: Any) -> Metric: ...
        def __radd__(self, other: Any) -> Metric: ...
        def __sub__(self, other: Any) -> Metric: ...
        def __rsub__(self, other: Any) -> Metric: ...
        def __mul__(self, other: Any) -> Metric: ...
        def __rmul__(self, other: Any) -> Metric: ...
        def __truediv__(self, other: Any) -> Metric: ...
        def __rtruediv__(self, other: Any) -> Metric: ...
        def __floordiv__(self, other: Any) -> Metric: ...
        def __rfloordiv__(self, other: Any) -> Metric: ...
        def __mod__(self, other: Any) -> Metric: ...
        def __rmod__(self, other: Any) -> Metric: ...
        def __pow__(self, other: Any) -> Metric: ...
        def __rpow__(self, other: Any) -> Metric: ...
        def __matmul__(self, other: Any) -> Metric: ...
        def __rmatmul__(self, other: Any) -> Metric: ...
        def __and__(self, other: Any) -> Metric: ...
        def __rand__(self, other: Any) -> Metric: ...
        def __or__(self, other: Any) -> Metric: ...
        def __ror__(self, other: Any) -> Metric: ...
        def __xor__(self, other: Any) -> Metric: ...
        def __rxor__(self, other: Any) -> Metric: ...
        def __eq__(self, other: Any) -> Metric: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> Metric: ...  # type: ignore[override]
        def __lt__(self, other: Any) -> Metric: ...
        def __le__(self, other: Any) -> Metric: ...
        def __gt__(self, other: Any) -> Metric: ...
        def __ge__(self, other: Any) -> Metric: ...
        def __neg__(self) -> Metric: ...
        def __pos__(self) -> Metric: ...
        def __abs__(self) -> Metric: ...
        def __invert__(self) -> Metric: ...
        def __getitem__(self, idx: Any) -> Metric: ...


refuse_in_torchmetrics_containers(Metric)  # the torchmetrics containers that cannot hold our metrics say so

# Under torch.compile with more than one rank, forward and compute run eagerly behind one graph break each
# (docs/guide/compile.rst), through a copy per class (_dynamo.give_own_code)
run_outside_graph(Metric, {"_outside_forward": "forward", "_outside_compute": "_compute_template"})
