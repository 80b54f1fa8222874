"""``Metric``: a state registry with an update/compute/forward/reset lifecycle and differentiable sync.

This module is the whole of :class:`Metric`, read top to bottom: its constructor, its states (``add_state`` and
the update count), ``update`` and ``compute``, ``forward`` and the hooks of its batch step, ``merge_state`` and
``reset``, ``sync``, ``state_dict`` with pickling, copies and device moves, and ``repr``/``plot``. What it hands
to other modules has one job each, and none of them knows ``Metric``:

- ``torchmetrics_diff._state_sync``: turning metric states into one call of the sync engine (plain functions,
  for a metric's sync and a collection's alike);
- ``torchmetrics_diff._batch_step``: the batch-step protocol (``run_batch_step``, the loop ``forward`` runs when
  it syncs or is compiled, and that collections and wrappers run too; ``record_step`` of the losses);
- ``torchmetrics_diff._dynamo``: what ``torch.compile`` needs of the class (the per-class copies of the
  lifecycle's code, the methods that run outside the graph, list states kept one tensor in traced code);
- ``torchmetrics_diff._tensors``: walking, detaching and copying nested containers of tensors.

The lifecycle is one template. Subclasses write ``update`` and ``compute`` as plain methods; the class wraps
them once, when the subclass is created (:meth:`Metric.__init_subclass__`), so instances carry no rewrapped
bound methods and pickle like any module.

``forward`` builds the batch's states from fresh defaults with the caller's autograd mode, syncs them
differentiably when ``dist_sync_on_step`` (each rank's own contribution keeps its graph, its gradient scaled
by the group size under ``grad_reduction="mean"``), computes the batch value, and merges the *detached* batch
states into the accumulated ones. Nothing a step does depends on how many steps came before.

The arithmetic and comparison operators of :class:`Metric` (and ``metric[idx]``) are defined in
:mod:`torchmetrics_diff.composition`, next to the :class:`~torchmetrics_diff.CompositionalMetric` they build.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from torchmetrics_diff._batch_step import BatchStep, run_batch_step
from torchmetrics_diff._dynamo import (
    folded_lists,
    give_own_code,
    own_code,
    run_outside_graph,
    set_aside_lists,
    steps_outside_graph,
    wrap_lifecycle,
)
from torchmetrics_diff._state_sync import SyncSpec, gather_each, sync_metric_states
from torchmetrics_diff._tensors import HALF, default_device, detach, promoted, unaliased, unhalved
from torchmetrics_diff._torchmetrics import refuse_in_torchmetrics_containers
from torchmetrics_diff.distributed._backend import Group, group_size
from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._reductions import REDUCTIONS, as_rows, merge, valid
from torchmetrics_diff.distributed._sync import SyncPlan, fail_sync
from torchmetrics_diff.exceptions import TorchMetricsUserError

_GRAD_REDUCTIONS = ("mean", "sum")
_CPU = torch.device("cpu")
_M = TypeVar("_M", bound="Metric")

#: attributes of the lifecycle's bookkeeping, assigned on every step (``Metric.__setattr__``'s fast path)
_BOOKKEEPING = frozenset(
    {"_computed", "_eager_count", "_traced_count", "_in_lifecycle", "_synced_cache", "_forward_cache"}
)
#: class-level facts about a metric: an instance cannot change them (as in torchmetrics)
_CONSTANTS = frozenset(
    {
        "is_differentiable",
        "higher_is_better",
        "full_state_update",
        "plot_lower_bound",
        "plot_upper_bound",
        "plot_legend_name",
    }
)
#: the hooks ``forward``'s eager step runs inline (:meth:`Metric.forward`): a class that overrides one of them (a
#: wrapper) runs the protocol's loop instead, which calls them
_INLINED_HOOKS = (
    "_run_batch_step",
    "_begin_batch",
    "_update_batch",
    "_step_syncs",
    "_sync_batch",
    "_batch_value",
    "_finish_batch",
    "_abort_batch",
    "_merged",
    "_add_count",
    "_set_states",
    "_run_in_lifecycle",
    "_move_list_states",
)
#: the value of ``Metric._in_lifecycle`` while ``forward``'s eager step runs ``update`` and ``compute``: that step
#: asked :func:`compiling` once for the whole batch, so the code they call need not ask again (:func:`_tracing`)
_EAGER_STEP = "eager step"


def _tracing(metric: Metric) -> bool:
    """Whether Dynamo traces the lifecycle call of ``metric`` that runs now: ``False`` without asking inside
    ``forward``'s eager step (:data:`_EAGER_STEP`), else :func:`~torchmetrics_diff.distributed._compile.compiling`.

    For the code ``update`` and ``compute`` call (the aggregators' NaN policy), so that an eager ``forward`` asks
    once. Inside a traced lifecycle call the flag it reads was set by that call itself (Dynamo knows its value).
    """
    return metric.__dict__["_in_lifecycle"] is not _EAGER_STEP and compiling()


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


def _batch_state(value: Any, default: Any) -> Any:
    """A state as ``update`` left it in a batch: a copy when it is still the default itself (a class whose
    ``update`` replaces its states starts a batch from the defaults, :attr:`Metric._replaces_states`: no batch
    state may be one of them), and never narrower than its default (:func:`~torchmetrics_diff._tensors.unhalved`)."""
    if value is default:
        return default.clone()
    return unhalved(value, default)


def _origin(fn: Any) -> tuple[str | None, str | None]:
    """Where a function was written: its module and qualified name (the same for a per-class copy)."""
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def _differs(value: Any, default: Any) -> bool:
    if value is default:
        return False
    try:
        return bool(value != default)
    except Exception:  # tensors of several elements, objects without a usable comparison
        return True


class Metric(nn.Module):
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
    (defined below) and who may call them. What a collection needs besides: ``_filter_kwargs`` (the keyword
    arguments ``update`` takes), ``_snapshot``/``_restore`` (an all-or-nothing ``update``), ``_same_update`` and
    ``_share_states`` (compute groups), ``_sync_spec``, ``_hold_synced`` and ``_is_synced`` (one sync for every
    member), and the questions ``_step_syncs``, ``_step_syncs_by_engine``, ``_compute_syncs`` and
    ``_joins_compute_sync``.
    """

    is_differentiable: ClassVar[bool | None] = None
    higher_is_better: ClassVar[bool | None] = None
    full_state_update: ClassVar[bool | None] = None
    plot_lower_bound: ClassVar[float | None] = None
    plot_upper_bound: ClassVar[float | None] = None
    plot_legend_name: ClassVar[str | None] = None
    #: tensor attributes besides the states that ``state_dict`` always holds, whatever :meth:`persistent` says (a
    #: wrapper's record of past values, e.g. ``MinMaxMetric``'s bounds); a state dict without one loads too, the
    #: attribute keeping its value
    _saved_attributes: ClassVar[tuple[str, ...]] = ()

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
    #: constructor arguments a subclass fixes itself (not in ``repr``)
    _repr_hidden: ClassVar[tuple[str, ...]] = ()
    #: whether ``forward`` always runs eagerly under ``torch.compile`` (see ``_dynamo.steps_outside_graph``)
    _forward_outside_graph: ClassVar[bool] = False
    #: whether the class's ``update`` only ever *replaces* its tensor states (``self.total = self.total + x``),
    #: never changes them in place (``self.total += x``): then an eager ``forward`` starts the batch from the
    #: defaults themselves instead of copies. Declared by the class that defines ``update`` (a subclass that
    #: defines its own ``update`` is back to ``False`` unless it says so too: see :meth:`__init_subclass__`)
    _replaces_states: ClassVar[bool] = False
    #: whether ``compute`` reads ``_in_batch_value`` (set while it computes ``forward``'s batch value, eagerly):
    #: the metrics of ``_batch_step.QuietBatchValue``, whose NaN policy stays quiet for the batch value
    _quiet_batch_value: ClassVar[bool] = False
    #: whether the class's batch-step hooks are this class's own (none of :data:`_INLINED_HOOKS` overridden), so
    #: that an eager, unsynced ``forward`` runs them inline (set per class by :meth:`__init_subclass__`)
    _inline_step: ClassVar[bool] = True
    #: the loop of the batch-step protocol as a method, so that each class runs its own copy of its code
    _run_batch_step = run_batch_step

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the subclass its own copy of the lifecycle's code (:attr:`_per_class_code`), wrap its own
        ``update``/``compute`` once, at class creation, in the lifecycle template, and note whether ``forward``
        may run its batch step inline (:attr:`_inline_step`) and from the defaults (:attr:`_replaces_states`)."""
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__ and "_replaces_states" not in cls.__dict__:
            cls._replaces_states = False  # a new update says for itself whether it works in place
        # torch.compile caches the frames it compiles (and counts its recompile limit, 8) per *code object*. A
        # lifecycle method inherited by every class and compiled as a frame of its own (below a graph break)
        # guards on the class of ``self``: one code object would hold a frame per class and a compiled step
        # calling nine classes would hit the limit. So each class gets copies of these methods, the same
        # functions with code objects of their own (docs/guide/compile.rst, "Many metric classes").
        give_own_code(cls, cls._per_class_code)
        # (a copy keeps the module and qualified name of the function it copies: see _METRIC_HOOKS)
        cls._inline_step = all(_origin(getattr(cls, name)) == _METRIC_HOOKS[name] for name in _INLINED_HOOKS)
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

        # the state registry (add_state): default, reduction and persistence of every state, by name
        self._defaults: dict[str, torch.Tensor | list] = {}
        self._reductions: dict[str, str | Callable | None] = {}
        self._persistent: dict[str, bool] = {}
        # the update count: a Python int in eager mode, a tensor for the updates made inside torch.compile'd code
        # (Dynamo guards on every int it reads: an int counted there recompiles each step; see _add_count)
        self._eager_count = 0
        self._traced_count = torch.zeros((), dtype=torch.int64)
        self._computed: Any = None  # compute()'s cached value
        self._forward_cache: Any = None  # the last forward's value, detached (what Lightning logs)
        self._synced_cache: dict[str, Any] | None = None  # the local states while the synced ones are in place
        # False outside the lifecycle, True inside it (a subclass's super().update() then just runs), _EAGER_STEP
        # inside forward's eager step
        self._in_lifecycle: bool | str = False
        self._sync_plans = {"step": SyncPlan(), "epoch": SyncPlan()}
        self._list_states: tuple[str, ...] = ()  # names of the list states, in registration order
        self._callable_lists: tuple[str, ...] = ()
        # whether batch states merge by their reductions, or update replays on the accumulators (_finish_batch)
        self._merged_by_reduction = not self.full_state_update
        self._weighs_count = False  # whether a ``mean`` state needs the update count to merge
        # where tensors are made now: the CPU, or the device of an enclosing ``with torch.device(...)``
        self._device = default_device()
        self._dtype = torch.get_default_dtype()

    # ------------------------------------------------------------------------------------------------ the states
    def add_state(
        self,
        name: str,
        default: torch.Tensor | list,
        dist_reduce_fx: str | Callable | None = None,
        persistent: bool = False,
    ) -> None:
        """Register a state: a tensor, or an empty list that ``update`` appends tensors to.

        Args:
            name: attribute name of the state.
            default: its value after :meth:`reset`: a tensor, or ``[]`` for a list state.
            dist_reduce_fx: how ranks combine it: ``"sum"``, ``"mean"``, ``"min"``, ``"max"``, ``"cat"``, a
                callable that receives the per-rank values stacked on a new dim 0, or ``None`` (the stack).
            persistent: whether the state goes into ``state_dict``.

        Raises:
            ValueError: ``default`` is neither a tensor nor an empty list, or ``dist_reduce_fx`` is unknown.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"`name` must be a valid attribute name; got {name!r}")
        taken = hasattr(type(self), name) or any(
            name in d for d in (self.__dict__, self._modules, self._parameters, self._buffers)
        )
        if taken and name not in self._defaults:
            raise ValueError(f"`name` {name!r} is already an attribute of {type(self).__name__}; choose another")
        if not (isinstance(default, torch.Tensor) or (isinstance(default, list) and not default)):
            raise ValueError(f"`default` of state {name!r} must be a tensor or an empty list; got {default!r}")
        if not valid(dist_reduce_fx):
            raise ValueError(
                f"`dist_reduce_fx` of state {name!r} must be one of {REDUCTIONS}, a callable or None; "
                f"got {dist_reduce_fx!r}"
            )
        if isinstance(default, torch.Tensor):
            default = default.detach().clone()
        setattr(self, name, self._fresh(default))
        self._defaults[name] = default
        self._reductions[name] = dist_reduce_fx
        self._persistent[name] = persistent
        self._list_states = tuple(n for n, d in self._defaults.items() if isinstance(d, list))
        # list states whose callable reduction receives the per-rank tensors (as torchmetrics hands them over)
        self._callable_lists = tuple(n for n in self._list_states if callable(self._reductions[n]))
        self._merged_by_reduction = not self.full_state_update and all(
            isinstance(fx, str) for fx in self._reductions.values()
        )
        self._weighs_count = "mean" in self._reductions.values()

    @staticmethod
    def _fresh(default: torch.Tensor | list) -> torch.Tensor | list:
        return default.clone() if isinstance(default, torch.Tensor) else []

    @property
    def metric_state(self) -> dict[str, torch.Tensor | list]:
        """The current value of every state, by name."""
        return {name: getattr(self, name) for name in self._defaults}

    @property
    def update_count(self) -> int:
        """How many times ``update`` (or ``forward``) ran since the last reset (a tensor inside compiled code)."""
        return self._update_count

    @property
    def _update_count(self) -> Any:
        """The update count: an int in eager mode; under ``torch.compile`` a tensor (reading it as an int there
        would be a graph break)."""
        if compiling():
            return self._traced_count + self._eager_count
        return self._eager_count + int(self._traced_count)

    @_update_count.setter
    def _update_count(self, value: Any) -> None:
        if compiling() and isinstance(value, torch.Tensor):
            self._eager_count, self._traced_count = 0, value.to(torch.int64)
        else:
            self._eager_count, self._traced_count = int(value), torch.zeros((), dtype=torch.int64)

    def _add_count(self, delta: int) -> None:
        """Count ``delta`` updates without a Dynamo guard: traced code adds to a tensor (whose value no guard
        reads), eager code to an int (cheaper than a tensor add on every step)."""
        if compiling():
            self._traced_count = self._traced_count + delta
        else:
            self._eager_count += delta

    @property
    def update_called(self) -> bool:
        """Whether ``update`` (or ``forward``) ran since creation or the last reset."""
        return self._update_count > 0

    @property
    def device(self) -> torch.device:
        """The device of the states."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the states (changed only by :meth:`set_dtype`)."""
        return self._dtype

    def _snapshot(self) -> Any:
        """Enough to undo any update (:meth:`_restore`): tensor states cloned (updates may work in place), list
        lengths, counters."""
        states = {n: v.clone() if isinstance(v, torch.Tensor) else (v, len(v)) for n, v in self.metric_state.items()}
        return states, self._update_count, self._computed

    def _restore(self, snapshot: Any) -> None:
        states, self._update_count, self._computed = snapshot
        for name, saved in states.items():
            if isinstance(saved, tuple):  # a list state: the same list object, cut back to its old length
                values, length = saved
                del values[length:]
                saved = values
            self.__dict__[name] = saved

    def _set_states(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)  # states are plain attributes, never parameters, buffers or modules

    def __setattr__(self, name: str, value: Any) -> None:
        # ``self.total = self.total + x`` in every update: skip nn.Module's parameter/buffer/module checks for
        # names that are states or bookkeeping (a hot path: a forward assigns about a dozen of them)
        if name in _BOOKKEEPING or name in self.__dict__.get("_defaults", ()):
            self.__dict__[name] = value
        elif name in _CONSTANTS:
            raise RuntimeError(f"Can't change const `{name}`: it is a class attribute of {type(self).__name__}")
        else:
            super().__setattr__(name, value)

    # --------------------------------------------------------------------------------------- update and compute
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
        traced = compiling()  # (asked once: passed down)
        # traced: ``update`` appends to fresh lists, folded into the accumulated rows after (see _folded_lists)
        rows = set_aside_lists(self) if traced and self._list_states else None
        # In-place updates (``self.total += x``) must not leave half-updated states when ``update`` raises.
        snapshot = self._snapshot()
        state = self.__dict__
        state["_computed"] = None
        if traced:  # (_add_count, inline)
            state["_traced_count"] = state["_traced_count"] + 1
        else:
            state["_eager_count"] += 1
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
        traced = compiling()
        if traced and self._compute_syncs():
            return self._outside_compute(self, raw)  # the sync runs inside a context manager: one break around it all
        # (traced: the count is a tensor; no data-dependent branch.) Only a local value warns: a synced one is every
        # rank's, so a rank without an update gets the global value (decisions page). The sync is asked about only
        # before any update: the steady path reads the count and nothing else.
        if not traced and self._update_count == 0 and self._synced_cache is None and not self._syncs_states():
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

    # ---------------------------------------------------------------------------------- forward: the batch step
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Update with a batch and return the metric of that batch (of the global batch when syncing).

        With ``dist_sync_on_step=True`` the value is identical on every rank and, after ``backward`` and the
        trainer's gradient averaging, every parameter gradient equals the single-device one.

        Args:
            args: the batch, as the subclass's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the subclass's ``update`` takes them.
        """
        # A batch step: begin (refuse a synced metric, count the update, fresh batch states), update with the
        # caller's autograd mode, sync the batch states (dist_sync_on_step), compute the batch value, finish
        # (merge the detached batch states into the accumulated ones); on any error, abort (put everything back).
        # Synced or compiled, or for a class with hooks of its own, that is the protocol's loop over the hooks
        # below (_batch_step.run_batch_step, which collections and wrappers run too).
        if compiling():
            if steps_outside_graph(self):
                return self._outside_forward(self, *args, **kwargs)
            return self._run_batch_step(args, kwargs)
        if self.dist_sync_on_step or not self._inline_step:
            return self._run_batch_step(args, kwargs)
        # Eager and unsynced: the same steps, inline (the hooks' bodies for this case, without their calls).
        state = self.__dict__
        if state["_synced_cache"] is not None:  # begin
            raise self._synced_error("forward")
        defaults = self._defaults
        computed, state["_computed"] = state["_computed"], None
        state["_eager_count"] += 1
        accumulated = {}
        replaces = self._replaces_states
        for name, default in defaults.items():  # (and _batch_defaults, inline)
            accumulated[name] = state[name]
            if not isinstance(default, torch.Tensor):
                state[name] = []
            else:
                state[name] = default if replaces else default.clone()
        quiet = self._quiet_batch_value
        previous, state["_in_lifecycle"] = state["_in_lifecycle"], _EAGER_STEP
        try:
            try:
                type(self)._raw_update(self, *args, **kwargs)  # update
                batch = {}
                for name, default in defaults.items():  # (_batch_state, inline)
                    current = state[name]
                    if current is default:
                        current = default.clone()
                    elif isinstance(current, torch.Tensor) and current.dtype in HALF:
                        current = unhalved(current, default)
                    batch[name] = current
                state.update(batch)
                if not quiet:
                    value = type(self)._raw_compute(self)  # the batch value
                else:  # (_batch_value, inline)
                    state["_in_batch_value"] = True
                    try:
                        value = type(self)._raw_compute(self)
                    finally:
                        state["_in_batch_value"] = False
            except BaseException:  # abort
                state.update(accumulated)
                state["_eager_count"] -= 1
                state["_computed"] = computed
                raise
            if self._merged_by_reduction:  # finish: merge the batch states, detached, into the accumulated ones
                count = state["_eager_count"] + int(state["_traced_count"]) if self._weighs_count else 1
                owner = type(self).__name__
                merged: dict[str, Any] = {}
                for name, fx in self._reductions.items():
                    new, old = batch[name], accumulated[name]
                    if not isinstance(new, torch.Tensor) or new.requires_grad:
                        new = detach(new)
                    elif fx == "sum" and old.__class__ is torch.Tensor and new.dtype is old.dtype:
                        merged[name] = old + new  # (merge's sum, inline: the common case of every forward)
                        continue
                    merged[name] = merge(fx, old, new, count, owner=owner, name=name)
                state.update(merged)
            else:  # no known reduction to merge by: replay ``update`` on the accumulated states
                state.update(accumulated)
                with torch.no_grad():
                    type(self)._raw_update(self, *detach(args), **detach(kwargs))
        finally:
            state["_in_lifecycle"] = previous
        if self.compute_on_cpu:
            self._move_list_states(_CPU)
        state["_forward_cache"] = (
            value if isinstance(value, torch.Tensor) and not value.requires_grad else detach(value)
        )
        return value

    def _batch_defaults(self, eager: bool) -> dict[str, Any]:
        """Fresh batch states: copies of the tensor defaults and empty lists; in eager code, the tensor defaults
        themselves when the class's ``update`` replaces its states (:attr:`_replaces_states`)."""
        if eager and self._replaces_states:
            return {n: d if isinstance(d, torch.Tensor) else [] for n, d in self._defaults.items()}
        return {n: d.clone() if isinstance(d, torch.Tensor) else [] for n, d in self._defaults.items()}

    # The hooks of the batch-step protocol (``_batch_step.Stepper``), which ``run_batch_step`` calls in order;
    # ``MetricCollection`` and ``WrapperMetric`` call a member's hooks to step several metrics as one.
    def _step_syncs(self) -> bool:
        """Whether ``forward`` syncs the batch across ranks, by the engine or a custom gather (then, under
        ``torch.compile``, the whole ``forward`` runs eagerly behind one graph break)."""
        return self.dist_sync_on_step and self._distributed_available()

    def _step_syncs_by_engine(self) -> bool:
        """Whether ``forward`` syncs through the engine (so peers wait in its first round, and a collection may
        sync it with its other members)."""
        return self.dist_sync_on_step and self.dist_sync_fn is None and self._distributed_available()

    def _begin_batch(self) -> BatchStep:
        """Refuse a synced metric, count the update and swap in fresh batch states.

        Raises:
            TorchMetricsUserError: the metric is synced (its batch would be lost at ``unsync``).
        """
        state = self.__dict__
        if state["_synced_cache"] is not None:
            raise self._synced_error("forward")
        step = BatchStep({name: state[name] for name in self._defaults}, state["_computed"])
        state["_computed"] = None
        self._add_count(1)  # not `+= 1`: under torch.compile, see _add_count
        state.update(self._batch_defaults(eager=not compiling()))
        return step

    def _update_batch(self, step: BatchStep, args: tuple, kwargs: dict[str, Any], announce: bool = True) -> None:
        """Fold the batch into the batch states with the caller's autograd mode (``update``).

        If ``update`` raises while the other ranks are about to sync, the error is announced to them through the
        sync's first round (``announce``; a collection announces once for all its members), so every rank raises
        instead of waiting. The caller aborts the step.
        """
        step.args, step.kwargs = args, kwargs
        try:
            self._run_in_lifecycle(type(self)._raw_update, *args, **kwargs)
        except Exception as err:
            if announce and self._step_syncs_by_engine():
                fail_sync(
                    err, self.process_group, plan=self._plan("local"), owner=type(self).__name__, device=self.device
                )
            raise
        state = self.__dict__
        step.batch = {name: _batch_state(state[name], default) for name, default in self._defaults.items()}
        state.update(step.batch)  # (a state left in half precision is widened to its default's dtype)

    def _sync_batch(self, step: BatchStep, synced: dict[str, Any] | None = None) -> None:
        """Replace the batch states by their values over every rank, differentiably (``grad="local"``).

        Args:
            step: the step whose batch states to sync.
            synced: the synced states when the caller synced them with others' (a collection); ``None``: sync
                them here.
        """
        batch: dict[str, Any] = step.batch  # type: ignore[assignment]  # (set by _update_batch)
        self._set_states(synced if synced is not None else self._sync_values(batch, grad="local"))

    def _batch_value(self) -> Any:
        """The value of the states in place (``compute`` without sync or cache); eagerly, a
        ``QuietBatchValue`` metric holds ``_in_batch_value = True`` meanwhile."""
        if compiling() or not self._quiet_batch_value:  # (traced code never warns: nothing to mark)
            return self._run_in_lifecycle(type(self)._raw_compute)
        state = self.__dict__
        state["_in_batch_value"] = True
        try:
            return self._run_in_lifecycle(type(self)._raw_compute)
        finally:
            state["_in_batch_value"] = False

    def _finish_batch(self, step: BatchStep, value: Any) -> Any:
        """Fold the detached batch states into the accumulated ones; keep the detached value; return ``value``."""
        if self._merged_by_reduction:
            # the count only weighs `mean` states: reading it in traced code would guard on the eager count
            count = self._update_count if self._weighs_count else 1
            batch = step.batch if step.batch is not None else self.metric_state
            # (a batch state without a graph merges as it is: the merge makes new tensors or extends a list)
            batch = {
                n: v if isinstance(v, torch.Tensor) and not v.requires_grad else detach(v) for n, v in batch.items()
            }
            self._set_states(self._merged(step.accumulated, batch, count))
        else:  # no known reduction to merge by: replay ``update`` on the accumulated states
            self._set_states(step.accumulated)
            with torch.no_grad():
                self._run_in_lifecycle(type(self)._raw_update, *detach(step.args), **detach(step.kwargs))
        if self.compute_on_cpu:
            self._move_list_states(_CPU)
        # (a value without a graph is kept as it is: nothing to detach)
        self.__dict__["_forward_cache"] = (
            value if isinstance(value, torch.Tensor) and not value.requires_grad else detach(value)
        )
        return value

    def _abort_batch(self, step: BatchStep) -> None:
        """Undo :meth:`_begin_batch` and whatever came after it: the accumulated states, count and cache return."""
        self._set_states(step.accumulated)
        self._add_count(-1)
        self.__dict__["_computed"] = step.computed

    def _merged(self, acc: dict[str, Any], new: dict[str, Any], count: float) -> dict[str, Any]:
        """Fold states ``new`` (detached) into ``acc``; a ``mean`` state moves ``1/count`` of the way to new (the
        batch fold of :meth:`_finish_batch`, and ``merge_state``)."""
        owner = type(self).__name__
        if compiling() and self._list_states:  # traced: a list state stays one tensor (see folded_lists)
            lists = folded_lists({n: acc[n] for n in self._list_states}, new)
            return {
                n: lists[n] if n in lists else merge(fx, acc[n], new[n], count, owner=owner, name=n)
                for n, fx in self._reductions.items()
            }
        return {n: merge(fx, acc[n], new[n], count, owner=owner, name=n) for n, fx in self._reductions.items()}

    # ---------------------------------------------------------------------------------- merge_state and reset
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

    # ------------------------------------------------------------------------------------------- sync and unsync
    def _distributed_available(
        self, group: Group = None, fn: Callable[[], bool] | None = None, sync_fn: Callable | None = None
    ) -> bool:
        """Whether a sync has anything to do: ``distributed_available_fn`` (if any) agrees and the group has peers
        (or a custom gather, this call's ``sync_fn`` or the metric's, runs where the callable says so)."""
        fn = fn if fn is not None else self.distributed_available_fn
        if fn is not None and not fn():
            return False
        if group_size(group if group is not None else self.process_group) > 1:
            return True
        # a custom gather is the caller's own business: when the caller's `distributed_available_fn` says so, it
        # runs even without a process group (as in torchmetrics, whose tests emulate ranks that way)
        return fn is not None and (sync_fn or self.dist_sync_fn) is not None

    def _compute_syncs(self) -> bool:
        """Whether :meth:`compute` syncs across ranks (then, under ``torch.compile``, it runs eagerly)."""
        return self.sync_on_compute and self._distributed_available()

    def _syncs_states(self) -> bool:
        """Whether :meth:`compute` would replace the states by synced ones (it has states, and syncs)."""
        return bool(self._defaults) and self._compute_syncs()

    def _joins_compute_sync(self) -> bool:
        """Whether :meth:`compute` would sync through the engine now, so a collection may sync it with others."""
        return (
            self.sync_on_compute
            and self._synced_cache is None
            and not self._cache_usable()
            and self.dist_sync_fn is None
            and bool(self._defaults)
            and self._distributed_available()
        )

    def _sync_spec(self) -> SyncSpec:
        """What the sync needs to know about this metric (its reductions, list states, device, ...)."""
        return SyncSpec(
            owner=type(self).__name__,
            reductions=self._reductions,
            list_states=self._list_states,
            callable_lists=self._callable_lists,
            grad_reduction=self.grad_reduction,
            device=self._device,
        )

    def _sync_values(self, states: dict[str, Any], grad: str) -> dict[str, Any]:
        """Synced copies of ``states`` (list states become a one-element list holding the concatenation)."""
        if self.dist_sync_fn is not None:
            return gather_each(self._sync_spec(), states, self.dist_sync_fn, self.process_group, grad)
        call = "forward" if grad == "local" else "sync"
        return sync_metric_states(
            {"": self._sync_spec()}, {"": states}, self.process_group, self._plan(grad), grad, call
        )[""]

    def _plan(self, grad: str) -> SyncPlan:
        """Step syncs (batch states, input dtype) and epoch syncs (accumulators) keep separate agreed plans."""
        return self._sync_plans["step" if grad == "local" else "epoch"]

    @property
    def _is_synced(self) -> bool:
        """Whether the synced states are in place (between :meth:`sync` and :meth:`unsync`)."""
        return self._synced_cache is not None

    def _hold_synced(self, local: dict[str, Any], synced: dict[str, Any]) -> None:
        """Put the ``synced`` states in place and keep the ``local`` ones for :meth:`unsync` (what :meth:`sync`
        does after syncing; a collection syncs every member in one call, then hands each its states here)."""
        self._synced_cache = local
        self._set_states(synced)

    def sync(
        self,
        dist_sync_fn: Callable | None = None,
        process_group: Group = None,
        should_sync: bool = True,
        distributed_available: Callable[[], bool] | None = None,
    ) -> None:
        """Replace the local states by the synced ones (detached); :meth:`unsync` restores them.

        Args:
            dist_sync_fn: overrides the metric's ``dist_sync_fn`` for this call.
            process_group: overrides the metric's ``process_group`` for this call.
            should_sync: ``False`` makes this a no-op.
            distributed_available: a callable returning whether to sync (default: the metric's
                ``distributed_available_fn``); there is nothing to sync without a group of more than one rank.

        Raises:
            TorchMetricsUserError: the metric is already synced (a ``RuntimeError``).
            RuntimeError: ranks disagree on the states.
        """
        if not should_sync or not self._defaults:
            return
        if self._synced_cache is not None:
            raise TorchMetricsUserError(f"{type(self).__name__} is already synced; call unsync() first")
        group = process_group if process_group is not None else self.process_group
        if not self._distributed_available(group, distributed_available, dist_sync_fn):
            return
        local = self.metric_state
        overrides = dist_sync_fn is not None or group is not self.process_group
        if overrides:  # this call's gather and group, for this call only
            saved_fn, saved_group = self.dist_sync_fn, self.process_group
            self.dist_sync_fn = dist_sync_fn or self.dist_sync_fn
            self.process_group = group
        try:
            synced = self._sync_values(local, grad="none")  # detached: the engine runs without grad for "none"
        finally:
            if overrides:
                self.dist_sync_fn, self.process_group = saved_fn, saved_group
        self._hold_synced(local, synced)

    def unsync(self, should_unsync: bool = True) -> None:
        """Restore the local states saved by :meth:`sync`.

        Args:
            should_unsync: ``False`` makes the call a no-op. Default ``True``.

        Raises:
            TorchMetricsUserError: the metric is not synced (a ``RuntimeError``).
        """
        if not should_unsync:
            return
        if self._synced_cache is None:
            raise TorchMetricsUserError(f"{type(self).__name__} is not synced; nothing to unsync")
        self._set_states(self._synced_cache)
        self._synced_cache = None

    @contextmanager
    def sync_context(
        self,
        dist_sync_fn: Callable | None = None,
        process_group: Group = None,
        should_sync: bool = True,
        should_unsync: bool = True,
        distributed_available: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """Within the block the states are synced; afterwards the local ones are back (when ``should_unsync``).

        Args:
            dist_sync_fn: a custom gather for this sync, as the constructor's. Default ``None``: the metric's.
            process_group: the group to sync over. Default ``None``: the metric's.
            should_sync: ``False`` leaves the states local. Default ``True``.
            should_unsync: restore the local states when the block ends. Default ``True``.
            distributed_available: a callable returning whether to sync at all. Default ``None``: the metric's.

        Example:
            >>> import torch
            >>> from torchmetrics_diff import SumMetric
            >>> metric = SumMetric()
            >>> metric.update(torch.tensor([1.0, 2.0]))
            >>> with metric.sync_context():  # one process: nothing to sync
            ...     metric.sum_value
            tensor(3.)
        """
        was_synced = self._synced_cache is not None
        self.sync(dist_sync_fn, process_group, should_sync, distributed_available)
        synced = self._synced_cache is not None and not was_synced
        try:
            yield
        finally:
            if synced and should_unsync:
                self.unsync()

    # -------------------------------------------------- state_dict, pickling, copies, device moves and dtypes
    def persistent(self, mode: bool = False) -> None:
        """Set whether every state is saved in ``state_dict``.

        Args:
            mode: ``True`` saves the states in ``state_dict``. Default ``False``.
        """
        for name in self._persistent:
            self._persistent[name] = mode

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, keep in self._persistent.items():
            if keep:
                value = getattr(self, name)
                destination[prefix + name] = detach(value) if not keep_vars else value
                if isinstance(value, list):
                    destination[prefix + name] = list(destination[prefix + name])
        for name in self._saved_attributes:
            value = getattr(self, name)
            destination[prefix + name] = value if keep_vars else value.detach()

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        for name in self._defaults:
            key = prefix + name
            if key in state_dict:
                value = state_dict.pop(key)
                # copies, like nn.Module's parameters: an in-place update must not reach the source
                copy = [v.detach().clone().to(self._device) for v in value] if isinstance(value, list) else None
                setattr(self, name, copy if copy is not None else value.detach().clone().to(self._device))
            elif self._persistent[name] and strict:
                missing_keys.append(key)
        for name in self._saved_attributes:
            value, mine = state_dict.pop(prefix + name, None), getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.numel() != mine.numel():
                want = "a one-element tensor" if mine.numel() == 1 else f"a tensor of {mine.numel()} elements"
                error_msgs.append(f"{prefix + name}: expected {want}; got {value!r}")
                continue
            setattr(self, name, value.detach().clone().reshape(mine.shape).to(self._device))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["process_group"] = None  # process groups cannot travel between processes
        state["_sync_plans"] = {"step": SyncPlan(), "epoch": SyncPlan()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # an unpickled metric runs no __init__: a process it reaches (ddp_spawn, mp.spawn, a DataLoader worker)
        # registers here, or Lightning's self.log would refuse it there
        super().__setstate__(state)
        if not _TORCHMETRICS_REGISTERED:
            register_with_torchmetrics()

    def __deepcopy__(self: _M, memo: dict) -> _M:
        group = self.process_group
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = value if key == "process_group" else deepcopy(value, memo)
        new.__dict__["process_group"] = group
        new.__dict__["_sync_plans"] = {"step": SyncPlan(), "epoch": SyncPlan()}
        return new

    def clone(self) -> Metric:
        """A deep copy of the metric, states included."""
        return deepcopy(self)

    def _apply(self: _M, fn: Callable, *args: Any, **kwargs: Any) -> _M:
        """Follow device moves, never dtype casts: the one rule for every ``nn.Module`` method that reaches here.

        ``metric.to(device)``, ``.cuda()``, ``.cpu()`` and a parent's ``.to(...)`` move the states;
        ``metric.to(torch.float64)``, ``.double()``, ``.float()``, ``.half()``, ``.bfloat16()``, ``.type(...)``
        and a parent's casts leave them in their dtype (as in torchmetrics), so ``model.half()`` cannot turn
        accumulators into float16. :meth:`set_dtype` is the one way to change it. The target device is read by
        applying ``fn`` to an empty probe tensor.

        Example:
            >>> import torch
            >>> from torchmetrics_diff import SumMetric
            >>> metric = SumMetric()
            >>> metric.double().to(torch.float16).sum_value.dtype
            torch.float32
        """
        super()._apply(fn, *args, **kwargs)
        device = fn(torch.empty(0, device=self._device)).device

        def move(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(device)
            if isinstance(value, list):
                return [move(v) for v in value]
            return value

        self._device = device
        self._set_states({n: move(v) for n, v in self.metric_state.items()})
        self._defaults = {n: move(v) for n, v in self._defaults.items()}
        if self._computed is not None:
            self._computed = detach(self._computed)
            self._computed = move(self._computed) if isinstance(self._computed, (torch.Tensor, list)) else None
        return self

    def _move_list_states(self, device: torch.device) -> None:
        for name, default in self._defaults.items():
            if isinstance(default, list):
                setattr(self, name, [t.to(device) for t in getattr(self, name)])

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

    def __prepare_scriptable__(self: _M) -> _M:
        """``torch.jit.script`` calls this first: refuse with one clear error instead of a compiler dump."""
        raise TypeError(
            f"torch.jit.script does not support {type(self).__name__}: torchmetrics_diff metrics are not "
            "TorchScript-compatible (torch deprecates TorchScript). Use torch.compile, or script the model "
            "without its metrics and call them outside the scripted module."
        )

    # ------------------------------------------------------------------------------------------- repr and plot
    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={value!r}" for name, value in self._settings().items())
        return f"{type(self).__name__}({settings})"

    def _settings(self) -> dict[str, Any]:
        """Constructor arguments whose current value differs from the default (what ``repr`` shows).

        Read from the ``__init__`` signatures along the class hierarchy (the most derived default wins) and the
        instance attributes of the same names; arguments that are not kept as attributes are not shown.
        """
        out: dict[str, Any] = {}
        seen: set[str] = set()
        for cls in type(self).__mro__:
            init = cls.__dict__.get("__init__")
            if init is None:
                continue
            for param in list(inspect.signature(init).parameters.values())[1:]:
                if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in seen:
                    continue
                seen.add(param.name)
                if param.name not in self.__dict__ or param.name in self._repr_hidden:
                    continue
                value = self.__dict__[param.name]
                if param.default is param.empty or _differs(value, param.default):
                    out[param.name] = value
            if cls is Metric:  # its base, nn.Module, takes no arguments
                break
        return out

    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """Plot a value of the metric, or a sequence of values (one per step or epoch), with matplotlib.

        The picture is torchmetrics': the same points, labels, legend, ``plot_lower_bound`` and
        ``plot_upper_bound`` lines and "Optimal value" mark (see the plotting guide).

        Args:
            val: a value as ``forward`` or ``compute`` return it (a scalar or 1-D tensor, a 2-D tensor shown as
                an image, a dict of those), or a sequence of such values (drawn over their index);
                ``None`` plots :meth:`compute`.
            ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

        Returns:
            ``(figure, axes)``.

        Raises:
            ModuleNotFoundError: matplotlib is not installed (the ``plot`` extra: ``pip install 'matplotlib>=3.6'``).

        Example:
            >>> import torch
            >>> from torchmetrics_diff import MeanMetric
            >>> metric = MeanMetric()
            >>> values = [metric(torch.tensor([float(i), 1.0])) for i in range(5)]
            >>> fig, ax = metric.plot(values)  # doctest: +SKIP
        """
        from torchmetrics_diff._plot import plot_metric

        return plot_metric(self, val, ax)

    # -------------------------------------------------------------------------- what a collection asks of a member
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

    # ------------------------------------------------------------------------------------------------ operators
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


#: the qualified names of ``Metric``'s own hooks (a per-class copy keeps them): how ``__init_subclass__`` tells
#: an inherited hook from an overriding one
_METRIC_HOOKS = {name: _origin(getattr(Metric, name)) for name in _INLINED_HOOKS}

refuse_in_torchmetrics_containers(Metric)  # the torchmetrics containers that cannot hold our metrics say so

# Under torch.compile with more than one rank, forward and compute run eagerly behind one graph break each
# (docs/guide/compile.rst), through a copy per class (_dynamo.give_own_code)
run_outside_graph(Metric, {"_outside_forward": "forward", "_outside_compute": "_compute_template"})
