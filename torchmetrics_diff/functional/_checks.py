"""The rules the functions of :mod:`torchmetrics_diff.functional` share: input validation, dtypes, counts, scales.

Each rule is written once here and asked for by the loss families (``_contrastive``, ``_normalized``,
``_barlow_twins``, ...), the fused kernels (``_kernels``), the everyday metrics (``_classification``,
``_regression``, ``_retrieval``, ``_text``, ...) and, one layer up, the global layer (``torchmetrics_diff._global``:
the strategies, the ring kernels and the ``global_*`` functions).
Validators raise a ``ValueError`` that names the argument, what it must be and what it is.

Sums and counts are accumulated in at least float32 (:func:`acc_dtype`: half-precision counts are not exact
beyond 2048), and a mean whose count is zero is ``0`` with a zero gradient (:func:`safe_divide`), never ``NaN``.

Mixed precision (:doc:`/guide/mixed_precision`): under ``torch.autocast`` a kernel casts its float32 operands to
the autocast dtype, as ``torch.mm`` would (:func:`compute_dtype`), and runs with autocast off inside
(:func:`autocast_off`), so that nothing else is cast behind its back; its matrix products take operands in that
dtype and give their products in the accumulation dtype (:func:`mm_acc`), which a scale then multiplies
(:func:`scaled_products`): neither a scale nor a scaled operand is rounded to half precision. float64 is never
cast, as under autocast.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Sequence
from typing import Any, Callable, Union

import torch
from torch import Tensor

from torchmetrics_diff.functional._errors import ShapeMismatchError

#: a number or a one-element tensor (a logit scale, a temperature, a bias)
Scalar = Union[Tensor, float]

#: ``True`` while Dynamo traces, ``False`` in eager mode: ``torch.compiler.is_compiling`` where torch has it. The
#: functional layer's own copy of ``distributed._compile.compiling`` (the same function), so that it imports nothing
#: of the package outside ``functional/`` (:ref:`architecture-layers`).
compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)


def _shape(x: Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


# ------------------------------------------------------------------------------------------------ validators
def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` naming ``name``, the choices and the value.

    Example:
        >>> check_choice("strategy", "ring", ("replicated", "sharded", "ring"))
        'ring'
    """
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}; got {value!r}")
    return value  # type: ignore[return-value]


def check_positive_int(name: str, value: Any) -> int:
    """``value`` if it is an int ``>= 1`` (not a bool).

    Raises:
        ValueError: naming the argument ``name``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be a positive int; got {value!r}")
    return value


def check_ignore_index(ignore_index: Any) -> None:
    """``ignore_index`` must be an int (not a bool) or ``None``."""
    if ignore_index is not None and (not isinstance(ignore_index, int) or isinstance(ignore_index, bool)):
        raise ValueError(f"`ignore_index` must be an int or None; got {ignore_index!r}")


def check_float_tensor(name: str, x: object, ndim: int | tuple[int, ...] | None, layout: str) -> None:
    """Raise unless ``x`` is a floating tensor of ``ndim`` dims (one of a tuple; ``None``: at least 1)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a tensor of shape {layout}; got {type(x).__name__}")
    dims_ok = x.ndim >= 1 if ndim is None else x.ndim in ((ndim,) if isinstance(ndim, int) else ndim)
    if not dims_ok or not x.is_floating_point():
        raise ValueError(
            f"`{name}` must be a floating-point tensor of shape {layout}; got shape {_shape(x)} and dtype {x.dtype}"
        )


def check_same_shape(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Raise unless ``x`` has the shape of ``ref``."""
    if x.shape != ref.shape:
        raise ShapeMismatchError(f"`{name}` must have the same shape as `{ref_name}` {_shape(ref)}; got {_shape(x)}")


def check_views(first_name: str, first: Tensor, second_name: str, second: Tensor) -> None:
    """Two views of the same samples: floating (B, D) tensors of one shape."""
    check_float_tensor(first_name, first, 2, "(B, D)")
    check_same_shape(second_name, second, first_name, first)


def check_trailing(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Raise unless ``x`` and ``ref`` agree in every dimension but the first (the rows)."""
    if x.shape[1:] != ref.shape[1:]:
        raise ShapeMismatchError(
            f"`{name}` must have the same trailing shape as `{ref_name}` {_shape(ref)[1:]}; got {_shape(x)[1:]}"
        )


def check_row_block(row_start: int, n_rows: int, local_name: str, total: int, all_name: str) -> int:
    """Validate that rows ``[row_start, row_start + n_rows)`` lie inside ``[0, total)``."""
    try:
        row_start = operator.index(row_start)
    except TypeError:
        raise ValueError(f"`row_start` must be an integer; got {type(row_start).__name__}") from None
    if row_start < 0 or row_start + n_rows > total:
        raise ValueError(
            f"`row_start` + rows of `{local_name}` must lie in [0, {total}] (rows of `{all_name}`); "
            f"got {row_start} + {n_rows} = {row_start + n_rows}"
        )
    return row_start


def check_scalar(name: str, value: object, positive: bool = False) -> Scalar:
    """A real number (finite, and positive if asked) or a one-element floating tensor (returned as 0-d).

    Tensor values are not inspected: that would force a device synchronization on every call.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise ValueError(
                f"`{name}` must be a number or a one-element floating-point tensor; "
                f"got shape {_shape(value)} and dtype {value.dtype}"
            )
        return value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number or a one-element floating-point tensor; got {value!r}")
    if not math.isfinite(value) or (positive and not value > 0):
        kind = "finite positive number" if positive else "finite number"
        raise ValueError(f"`{name}` must be a {kind}; got {value!r}")
    return float(value)


def check_labels(name: str, labels: Tensor, n: int) -> None:
    """Raise unless ``labels`` is an integer tensor of shape ``(n,)``."""
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex():
        got = f"dtype {labels.dtype}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"`{name}` must be an integer tensor of shape ({n},); got {got}")
    if labels.shape != (n,):
        raise ValueError(f"`{name}` must have shape ({n},); got {_shape(labels)}")


def check_values(bad: Tensor, expected: str, actual: Callable[[], str], error: type[Exception] = ValueError) -> None:
    """Raise ``error(f"{expected}; {actual()}")`` when any entry of the boolean ``bad`` is true.

    A check of tensor *values* (shapes and dtypes are checked on the host, for free). In eager mode it reads
    ``bad.any()`` on the host, and the message shows what ``actual`` says (the offending values). In code that
    ``torch.compile`` traces there is no host read: the check is a device assertion in the graph
    (``torch._assert_async``), so it costs no graph break; when it fails, a ``RuntimeError`` carrying
    ``expected`` is raised where the device reports it (at once on the CPU; on CUDA a device-side assertion),
    without the values.

    Example:
        >>> import torch
        >>> labels = torch.tensor([0, 3, 1])
        >>> bad = labels >= 3
        >>> check_values(bad, "`target` values must lie in [0, 2]", lambda: f"found {labels[bad].tolist()}")
        Traceback (most recent call last):
            ...
        ValueError: `target` values must lie in [0, 2]; found [3]
    """
    if bad.is_meta:  # a meta tensor has shapes, no values: nothing to check
        return
    if compiling():
        message = f"{expected}; some value does not (checked on the device under torch.compile, which cannot show it)"
        torch._assert_async(bad.logical_not().all(), message)
    elif bool(bad.any()):
        raise error(f"{expected}; {actual()}")


def check_broadcast(name: str, x: Tensor, values: Tensor) -> None:
    """Raise unless ``x`` broadcasts to the shape of ``values`` (without growing it)."""
    try:
        shape = torch.broadcast_shapes(x.shape, values.shape)
    except RuntimeError:
        shape = None
    if shape != values.shape:
        raise ValueError(f"`{name}` must broadcast to the shape of `values` {_shape(values)}; got {_shape(x)}")


# ------------------------------------------------------------------------------------- dtypes, counts, means
def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums and counts are accumulated in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


#: the half-precision floating dtypes: never the dtype of a sum, a count, a log-sum-exp or a metric state
HALF = (torch.float16, torch.bfloat16)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (e.g. meta)
        return False


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype a kernel's matrix products take their operands in, for operands ``tensors`` (one device).

    Their promoted dtype; under ``torch.autocast`` of their device the autocast dtype instead (they are cast to it
    as ``torch.mm`` would cast them), unless that dtype is float64, which autocast leaves alone.

    Example:
        >>> import torch
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     compute_dtype(torch.ones(1)), compute_dtype(torch.ones(1, dtype=torch.float64))
        (torch.bfloat16, torch.float64)
    """
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    kind = tensors[0].device.type
    if dtype != torch.float64 and dtype.is_floating_point and _autocast_on(kind):
        return torch.get_autocast_dtype(kind)
    return dtype


def autocast_off(x: Tensor) -> contextlib.AbstractContextManager[Any]:
    """A context with autocast off on ``x``'s device (a no-op context when it is off already)."""
    kind = x.device.type
    return torch.autocast(kind, enabled=False) if _autocast_on(kind) else contextlib.nullcontext()


#: ``(device type, dtype)`` -> whether ``torch.mm(..., out_dtype=float32)`` runs there (asked once)
_MIXED_MM: dict[tuple[str, torch.dtype], bool] = {}


def mm_acc(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of 2-d operands of one dtype, with the product in its accumulation dtype (:func:`acc_dtype`).

    float32 and float64 operands: the plain product. Half-precision operands: the products are accumulated in
    float32 and returned in float32, never rounded to half precision: ``torch.mm(..., out_dtype=torch.float32)``
    where the device has it (CUDA), else the float32 product of the operands' exact float32 values (the same
    numbers; CPU). Not differentiable where it uses ``out_dtype``: the kernels call it inside their autograd
    functions.
    """
    acc = acc_dtype(a.dtype)
    if acc == a.dtype:
        return a @ b
    kind = a.device.type
    key = (kind, a.dtype)
    if kind != "cpu" and _MIXED_MM.get(key, True):
        try:
            out = torch.mm(a, b, out_dtype=acc)
            _MIXED_MM[key] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):  # a build or device without the mixed product
            _MIXED_MM[key] = False
    return a.to(acc) @ b.to(acc)


def scaled_products(a: Tensor, b: Tensor, scale: Tensor) -> Tensor:
    """``scale · (a @ b)`` in the accumulation dtype, for 2-d operands of one dtype.

    float32 and float64: ``(a * scale) @ b``, the scale on the ``(n, D)`` operand. Half precision: the float32
    products of :func:`mm_acc` times the float32 scale, so that the scale is never rounded to half precision and
    ``scale · a`` is never rounded either: the logits are exact products of the operands, scaled once.
    """
    acc = acc_dtype(a.dtype)
    if acc == a.dtype:
        return (a * scale.to(a.dtype)) @ b
    return mm_acc(a, b).mul_(scale.to(acc))


def as_count(n: int | Tensor, like: Tensor) -> Tensor:
    """A 0-d float count on ``like``'s device, in the accumulation dtype.

    A number is written on the device by a fill (``torch.full``): ``torch.tensor(n, device=...)`` copies it
    from the host and, on a GPU, waits for the device to finish its queued work first.
    """
    dtype = acc_dtype(like.dtype)
    if isinstance(n, Tensor):
        return n.to(dtype=dtype).reshape(())
    return torch.full((), float(n), dtype=dtype, device=like.device)


def safe_divide(total: Tensor, count: Tensor) -> Tensor:
    """``total / count``, and ``0`` with zero gradient where ``count == 0``.

    Example:
        >>> import torch
        >>> safe_divide(torch.tensor(3.0), torch.tensor(0.0))
        tensor(0.)
    """
    nonzero = count != 0
    return torch.where(nonzero, total / torch.where(nonzero, count, torch.ones_like(count)), 0.0)


# --------------------------------------------------------------------------------------------------- scales
def reciprocal(temperature: Scalar) -> Scalar:
    """``1 / temperature``: the kernels multiply an (n, D) operand by a scale rather than divide the logits."""
    return 1.0 / temperature if isinstance(temperature, float) else temperature.reciprocal()


def as_scale(value: Tensor | float, like: Tensor) -> Tensor:
    """A 0-d tensor on ``like``'s device in ``like``'s accumulation dtype (a tensor keeps its graph and dtype; a
    kernel sees it as an input). A number is never rounded to half precision."""
    if isinstance(value, Tensor):
        return value.reshape(())
    return torch.full((), float(value), dtype=acc_dtype(like.dtype), device=like.device)  # a fill, as in as_count


def needs_grad(*tensors: Tensor) -> bool:
    """Whether a kernel must record its backward: grad mode is on and an input requires gradient."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
