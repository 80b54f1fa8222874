"""What a reduction means: the one place that interprets ``"sum"``, ``"mean"``, ``"min"``, ``"max"`` and ``"cat"``.

A state's reduction says how the values of several ranks (or of several batches) become one:

- ``"sum"``, ``"mean"``, ``"min"``, ``"max"``: elementwise, over values of one shape (:data:`ELEMENTWISE`);
- ``"cat"``: concatenation along dim 0, where a 0-d tensor counts as one row (:func:`as_rows`);
- a callable: it receives the values stacked along a new dim 0 and returns the result;
- ``None``: the stack itself.

The rules every reader of a reduction follows live here, and only here:

- :func:`reduce_rows`: per-rank values stacked along dim 0, reduced by a name, identically on every rank;
  :func:`reduce_ranks`: the same for a list of per-rank values and any reduction (the reference of a sync).
- :func:`merge`: two values folded into one (a batch into the accumulated states, another metric's states).
- Dtype rules: a reduced value comes back in its own dtype (an ``int32`` sum stays ``int32``); ``"mean"`` needs
  a floating or complex dtype; a ``bool`` state reduces with ``"max"`` (any) or ``"min"`` (all), never
  ``"sum"``/``"mean"``, and travels as bytes (:func:`wire_view`); a merged value keeps the dtype of the
  accumulator it is folded into. :func:`dtype_conflict` says which rule a (reduction, dtype) pair breaks.

Knows tensors and reduction names, nothing of ranks, metrics or collectives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Union, cast

import torch

if TYPE_CHECKING:
    from typing_extensions import TypeGuard

Reduction = Union[str, Callable[[Any], Any], None]
State = Union[torch.Tensor, list]

REDUCTIONS = ("sum", "mean", "min", "max", "cat")  #: every reduction name a state may have
ELEMENTWISE = ("sum", "mean", "min", "max")  #: the names reduced elementwise (an all-reduce can do them)
EXTREMA = ("min", "max")  #: elementwise selections: gradient flows to the holder(s) of the extremum
CAT = "cat"  #: concatenation of rows

# what a dtype_conflict means; callers word their own messages (they name their function and argument)
MEAN_NEEDS_FLOAT = "mean needs a floating dtype"
NO_BOOL_SUM = "bool cannot be summed or averaged"
NO_COMPLEX_ORDER = "complex values have no order"


def is_named(fx: Reduction) -> TypeGuard[str]:
    """Whether ``fx`` is one of the reduction names (not a callable, not ``None``)."""
    return isinstance(fx, str)


def is_elementwise(fx: Reduction) -> TypeGuard[str]:
    """Whether ``fx`` reduces values of one shape elementwise (``sum``, ``mean``, ``min``, ``max``)."""
    return fx in ELEMENTWISE


def is_cat(fx: Reduction) -> TypeGuard[str]:
    """Whether ``fx`` concatenates rows."""
    return fx == CAT


def averages(op: str) -> bool:
    """Whether the elementwise ``op`` is a mean: a sum across ranks divided by their number."""
    return op == "mean"


def selects(op: str) -> bool:
    """Whether the elementwise ``op`` picks one rank's value (``min``/``max``) rather than combining them."""
    return op in EXTREMA


def all_reduce_op(op: str) -> str:
    """The backend reduction that computes ``op``: a mean is a sum, divided by the group size afterwards."""
    return "sum" if op == "mean" else op


def valid(fx: object) -> bool:
    """Whether ``fx`` can be a state's reduction: a name of :data:`REDUCTIONS`, a callable or ``None``."""
    return fx is None or callable(fx) or fx in REDUCTIONS


def dtype_conflict(fx: Reduction, dtype: torch.dtype | None, *, order: bool = True) -> str | None:
    """Which dtype rule reducing a ``dtype`` value with ``fx`` breaks (one of the constants above), or ``None``.

    ``order=False`` leaves out the rule on complex ``min``/``max`` (the sync engine meets it only when reducing).
    """
    if dtype is None or not isinstance(fx, str):
        return None
    if fx == "mean" and not (dtype.is_floating_point or dtype.is_complex):
        return MEAN_NEEDS_FLOAT
    if fx in ("sum", "mean") and dtype == torch.bool:
        return NO_BOOL_SUM
    if order and fx in EXTREMA and dtype.is_complex:
        return NO_COMPLEX_ORDER
    return None


def wire_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as it travels: a ``bool`` tensor as its bytes (not every backend moves bools); others unchanged.

    ``max``/``min`` of those bytes are ``any``/``all`` of the bools.
    """
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as rows along dim 0: a 0-d tensor is one row; any other tensor is its own rows."""
    return t.reshape(1) if t.ndim == 0 else t


def cat_rows(values: list[torch.Tensor]) -> torch.Tensor | None:
    """The rows of a list state as one tensor (0-d items are one row each); ``None`` for an empty list."""
    if not values:
        return None
    rows = [as_rows(v) for v in values]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def reduce_rows(op: str, rows: torch.Tensor) -> torch.Tensor:
    """Reduce per-rank values stacked along dim 0 by the elementwise ``op``; the same bits on every rank.

    The result has the values' dtype (a ``bool`` ``max`` is ``any``, its ``min`` is ``all``); the ``mean`` of
    integers (which the checks reject before) would be a float.
    """
    if rows.dtype == torch.bool:
        return rows.all(0) if op == "min" else rows.any(0)
    if op == "sum":
        return rows.sum(0, dtype=rows.dtype)
    if op == "mean":
        return rows.mean(0) if rows.is_floating_point() or rows.is_complex() else rows.sum(0) / rows.shape[0]
    return rows.amax(0) if op == "max" else rows.amin(0)


def stack_ranks(values: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """Per-rank values as a callable or ``None`` reduction receives them: stacked along a new dim 0, or the list
    itself when their shapes differ. One value is a view with a new leading dim of 1."""
    if len(values) == 1:
        return values[0].unsqueeze(0)
    return torch.stack(values) if all(v.shape == values[0].shape for v in values) else values


def apply_stacked(fx: Reduction, stacked: Any) -> Any:
    """A callable reduction applied to the stacked values; ``None`` returns the stack itself."""
    return stacked if fx is None else cast("Callable[[Any], Any]", fx)(stacked)  # (a name never comes here)


def reduce_ranks(fx: Reduction, values: list[torch.Tensor]) -> Any:
    """What a sync returns for one tensor state: every rank's value (in rank order) reduced by ``fx``.

    The reference semantics of the sync engine, which computes the same from packed bytes.
    """
    if is_elementwise(fx):
        return reduce_rows(fx, torch.stack(values))
    if is_cat(fx):
        return torch.cat([as_rows(v) for v in values])
    return apply_stacked(fx, stack_ranks(values))


def merge(fx: Reduction, acc: State, new: State, count: float, *, owner: str = "merge", name: str = "state") -> State:
    """Fold the value ``new`` into the accumulated ``acc`` by the reduction ``fx``.

    Args:
        fx: the state's reduction.
        acc: the accumulated value. A list is extended in place (a step costs the same after 10,000 steps as after
            one) and returned.
        new: the value folded in (a tensor or a list of them); cast to ``acc``'s dtype first, so that a float64
            batch folds into float32 accumulators without changing their dtype.
        count: for ``"mean"``, how many parts ``acc`` becomes with ``new`` (``acc`` moves ``1/count`` of the way
            to ``new``: a running mean).
        owner: who merges, for the error message.
        name: the state's name, for the error message.

    Returns:
        ``acc + new`` (sum), the running mean (mean), the elementwise ``max``/``min``, the concatenated rows (cat,
        a 0-d value being one row), or ``fx(stack([acc, new]))`` for a callable.

    Raises:
        RuntimeError: ``fx`` is ``None`` (a stack of values cannot be folded into one of them).
    """
    a, b = acc, new
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and b.dtype != a.dtype:
        b = b.to(a.dtype)
    if isinstance(a, list):
        a.extend(b if isinstance(b, list) else [b])
        return a
    if TYPE_CHECKING:  # a tensor state merges tensors (no call at run time: merge runs in every forward)
        b = cast(torch.Tensor, b)
    if fx == "sum":
        return a + b
    if fx == "mean":
        return a + (b - a) / count
    if fx == "max":
        return torch.maximum(a, b)
    if fx == "min":
        return torch.minimum(a, b)
    if fx == "cat":
        return torch.cat([as_rows(a), as_rows(b)])
    if callable(fx):
        return fx(torch.stack([a, b]))
    raise RuntimeError(f"{owner}: state {name!r} with dist_reduce_fx=None cannot be merged")
