"""How a :class:`~torchmetrics_diff.Metric`'s states leave it or move: ``state_dict``, pickling, deep copies and
device moves.

``_MetricPersistence`` is a base class of ``Metric`` (as ``_MetricBatchSteps`` of ``torchmetrics_diff._batch_step``)
holding ``Metric``'s side of the ``nn.Module`` and Python protocols that copy or carry the states: which states
``state_dict`` saves (``persistent``) and how they load, what a pickle or a deep copy holds (never a process group
or an agreed sync plan), device moves that never cast (``_apply``: ``Metric.set_dtype`` alone changes the dtype),
and the refusal of ``torch.jit.script``. ``Metric.clone`` and ``Metric.set_dtype`` stay in
``torchmetrics_diff.metric`` (they return a ``Metric``, a name this module cannot import), as does
``Metric.__setstate__``, which registers an unpickled metric's class with torchmetrics.
"""

from __future__ import annotations

from copy import deepcopy
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import torch
from torch import nn

from torchmetrics_diff._tensors import detach
from torchmetrics_diff.distributed._backend import Group
from torchmetrics_diff.distributed._sync import SyncPlan

_Self = TypeVar("_Self", bound="_MetricPersistence")

if TYPE_CHECKING:
    _Module = nn.Module  # what ``super()`` reaches here: the metric's ``nn.Module``
else:
    _Module = object


class _MetricPersistence(_Module):
    """:class:`~torchmetrics_diff.Metric`'s ``state_dict``, pickling, deep copies and device moves.

    The attributes and methods below the ``TYPE_CHECKING`` guard are what these read of the metric (the state
    registry of ``torchmetrics_diff._metric_states``, made by ``Metric.__init__``).
    """

    if TYPE_CHECKING:
        process_group: Group
        _defaults: dict[str, torch.Tensor | list]
        _persistent: dict[str, bool]
        _computed: Any
        _device: torch.device

        @property
        def metric_state(self) -> dict[str, torch.Tensor | list]: ...
        def _set_states(self, values: dict[str, Any]) -> None: ...

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
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["process_group"] = None  # process groups cannot travel between processes
        state["_sync_plans"] = {"step": SyncPlan(), "epoch": SyncPlan()}
        return state

    def __deepcopy__(self: _Self, memo: dict) -> _Self:
        group = self.process_group
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = value if key == "process_group" else deepcopy(value, memo)
        new.__dict__["process_group"] = group
        new.__dict__["_sync_plans"] = {"step": SyncPlan(), "epoch": SyncPlan()}
        return new

    def _apply(self: _Self, fn: Callable, *args: Any, **kwargs: Any) -> _Self:
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

    def __prepare_scriptable__(self: _Self) -> _Self:
        """``torch.jit.script`` calls this first: refuse with one clear error instead of a compiler dump."""
        raise TypeError(
            f"torch.jit.script does not support {type(self).__name__}: torchmetrics_diff metrics are not "
            "TorchScript-compatible (torch deprecates TorchScript). Use torch.compile, or script the model "
            "without its metrics and call them outside the scripted module."
        )

    def _move_list_states(self, device: torch.device) -> None:
        for name, default in self._defaults.items():
            if isinstance(default, list):
                setattr(self, name, [t.to(device) for t in getattr(self, name)])
