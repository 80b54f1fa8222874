"""Walking the tensors inside a value: detaching, copying what shares memory with the states, dtype checks.

A metric's states and values are tensors, lists of tensors, or (values only) tuples, named tuples and dicts of
them. These helpers treat every such container alike, so ``Metric``, ``MetricCollection`` and
``CompositionalMetric`` agree on what "detached" and "a copy" mean.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from torchmetrics_diff.distributed._compile import compiling


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (through lists, tuples, named tuples and dicts).

    Example:
        >>> import torch
        >>> map_tensors(lambda t: t * 2, {"a": [torch.tensor(1.0)], "b": "kept"})
        {'a': [tensor(2.)], 'b': 'kept'}
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list):
        return [map_tensors(fn, v) for v in value]
    if isinstance(value, tuple):
        items = (map_tensors(fn, v) for v in value)
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: map_tensors(fn, v) for k, v in value.items()}
    return value


def detach(value: Any) -> Any:
    """``value`` with every tensor detached from the autograd graph."""
    if type(value) is torch.Tensor:  # the common case (a metric's value), without the walk
        return value.detach()
    return map_tensors(torch.Tensor.detach, value)


def storages(states: dict[str, Any]) -> set[int]:
    """The storage addresses of every tensor in ``states`` (list states included)."""
    out = set()
    for value in states.values():
        for t in value if isinstance(value, list) else (value,):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                ptr = t.untyped_storage().data_ptr()
                if ptr:
                    out.add(ptr)
    return out


def unaliased(value: Any, states: dict[str, Any]) -> Any:
    """``value`` with every tensor that shares memory with a state replaced by a copy."""
    if compiling():  # storage addresses are not traceable: copy every tensor (compute values are small)
        return map_tensors(torch.Tensor.clone, value)
    taken = storages(states)
    if not taken:
        return value

    def copy_if_alias(t: torch.Tensor) -> torch.Tensor:
        return t.clone() if t.device.type != "meta" and t.untyped_storage().data_ptr() in taken else t

    return map_tensors(copy_if_alias, value)


def promoted(before: Any, after: Any) -> bool:
    """Whether a floating state changed floating dtype (type promotion by an input of another precision)."""
    return (
        isinstance(before, torch.Tensor)
        and isinstance(after, torch.Tensor)
        and before.is_floating_point()
        and after.is_floating_point()
        and after.dtype != before.dtype
    )


#: floating dtypes a metric state never takes from its inputs (only :meth:`~torchmetrics_diff.Metric.set_dtype` asks)
HALF = (torch.float16, torch.bfloat16)


def unhalved(value: Any, default: Any) -> Any:
    """A tensor state that an update left in half precision, in its default's (wider) dtype; else ``value``.

    A ``forward``'s batch states keep a wider input dtype (a float64 loss stays float64) but are never narrower
    than their defaults: a batch state synced or merged in float16 would add up in float16.
    """
    if (
        isinstance(value, torch.Tensor)
        and value.dtype in HALF
        and isinstance(default, torch.Tensor)
        and default.is_floating_point()
        and default.dtype not in HALF
    ):
        return value.to(torch.promote_types(value.dtype, default.dtype))
    return value


def default_device() -> torch.device:
    """The device factory functions use now (``torch.get_default_device`` where torch has it)."""
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else torch.empty(0).device
