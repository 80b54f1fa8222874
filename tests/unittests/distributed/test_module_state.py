"""No module-level mutable state in ``torchmetrics_diff.distributed`` beyond what its design names.

Every piece of state that outlives a call lives in the group's ``_groups.GroupState`` (one registry, keyed weakly
by the group and released with it). A module attribute may otherwise hold only immutable values (numbers,
strings, tuples of them, frozen sets, read-only arrays, types, functions, including caches keyed by immutable
inputs). The test imports every module of the subpackage and inspects every attribute the module defines.

Package modules covered: every module of ``torchmetrics_diff.distributed``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from typing import Any

import numpy as np
import torch

import torchmetrics_diff.distributed as package

#: ``module.name`` -> why that mutable object may be a module attribute
ALLOWED = {
    "torchmetrics_diff.distributed._groups.REGISTRY": "the one registry of per-group state (and the default checks)",
    "torchmetrics_diff.distributed._compile.HOST_ROUND_TRIPS": "the one instrumentation counter",
    "torchmetrics_diff.distributed._backend._REDUCE_OPS": "a constant table, never written (read in compiled code:"
    " Dynamo cannot trace a mappingproxy)",
    "torchmetrics_diff.distributed._backend._DTYPE_CODE": "a constant table, never written (as _REDUCE_OPS)",
    "torchmetrics_diff.distributed._call._ENTRY": "the call context: a ContextVar (each thread its own, reset in a"
    " finally)",
}
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), frozenset, range, slice, torch.dtype, torch.device)
_IMMUTABLE += (types.MappingProxyType,)
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, types.MethodType)


def _immutable(value: Any) -> bool:
    if isinstance(value, (_IMMUTABLE, _CODE)) or type(value) is object:  # (a bare ``object()``: a sentinel)
        return True
    if type(value).__module__ in ("typing", "__future__", "operator"):  # annotations, ``itemgetter``s
        return True
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    if isinstance(value, np.ndarray):
        return not value.flags.writeable
    return inspect.isfunction(getattr(value, "__wrapped__", None))  # functools caches: keyed by immutable inputs


def _modules() -> list[types.ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return [package, *(importlib.import_module(n) for n in names)]


def _allowed_objects() -> set[int]:
    out = set()
    for dotted in ALLOWED:
        module, name = dotted.rsplit(".", 1)
        out.add(id(getattr(importlib.import_module(module), name)))
    return out


def test_every_module_attribute_of_the_engine_is_immutable_or_named() -> None:
    found, allowed = [], _allowed_objects()
    for module in _modules():
        for name, value in vars(module).items():
            if name.startswith("__") or isinstance(value, types.ModuleType):
                continue
            if isinstance(value, (type, types.FunctionType)) and value.__module__ != module.__name__:
                continue  # imported from elsewhere (checked in its own module)
            if not _immutable(value) and id(value) not in allowed:  # (an allowed object, wherever it is imported)
                found.append(f"{module.__name__}.{name}: {type(value).__name__}")
    assert not found, "module-level mutable state (keep it in the group's state, _groups.GroupState):\n" + "\n".join(
        found
    )


def test_every_allowed_object_still_exists() -> None:
    for dotted in ALLOWED:
        module, name = dotted.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), f"{dotted} is gone: remove it from ALLOWED"
