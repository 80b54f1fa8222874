"""The state registry of :class:`~torchmetrics_diff.Metric`: its states, their values and its update count.

``_MetricStates`` is a base class of ``Metric`` (as ``_MetricBatchSteps`` of ``torchmetrics_diff._batch_step``):
``add_state`` registers a state with its default, reduction and persistence; the other members read and replace
the values (``metric_state``, ``_set_states``), undo an update (``_snapshot`` / ``_restore``), count updates (an
int in eager mode, a tensor under ``torch.compile``), tell the states' device and dtype, and keep states plain
attributes (``__setattr__``). The registry's dictionaries are made by ``Metric.__init__``; what becomes of the
states when the metric steps, syncs, moves or is saved is the business of ``Metric``'s other bases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import nn

from torchmetrics_diff.distributed._compile import compiling
from torchmetrics_diff.distributed._reductions import REDUCTIONS, valid

_BOOKKEEPING = frozenset(
    {"_computed", "_eager_count", "_traced_count", "_in_lifecycle", "_synced_cache", "_forward_cache"}
)
# class-level facts about a metric: an instance cannot change them (as in torchmetrics)
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

if TYPE_CHECKING:
    _Module = nn.Module  # what ``super()`` reaches here, and the registries ``add_state`` checks: the nn.Module's
else:
    _Module = object


class _MetricStates(_Module):
    """:class:`~torchmetrics_diff.Metric`'s state registry: ``add_state`` and what reads or replaces the states.

    The attributes below the ``TYPE_CHECKING`` guard are made by ``Metric.__init__``.
    """

    if TYPE_CHECKING:
        full_state_update: ClassVar[bool | None]
        _defaults: dict[str, torch.Tensor | list]
        _reductions: dict[str, str | Callable | None]
        _persistent: dict[str, bool]
        _list_states: tuple[str, ...]
        _callable_lists: tuple[str, ...]
        _merged_by_reduction: bool
        _weighs_count: bool
        _eager_count: int
        _traced_count: torch.Tensor
        _computed: Any
        _device: torch.device
        _dtype: torch.dtype

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
