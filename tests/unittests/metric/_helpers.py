"""Shared pieces of the ``Metric``-layer acceptance tests: seeded data, test-only metrics, a check collector and a
collective recorder.

Every expected value in these tests is written with plain torch/numpy ops; the metrics below only exist to drive
the code under test (``Metric``'s lifecycle and the sync engine) through the cases the contract names.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from torchmetrics_diff import Metric
from torchmetrics_diff.distributed import _backend

F64 = torch.float64
IN_FEATURES, OUT_FEATURES = 4, 2


def seed(*parts: object) -> int:
    """A seed equal in every process (``hash`` of a str is salted per process)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def rand(shape: tuple, *parts: object, dtype: torch.dtype = F64) -> torch.Tensor:
    """Standard normal data from a seed derived from ``parts``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed(*parts)), dtype=dtype)


def bounds(sizes: list[int], rank: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the global batch held by ``rank``."""
    return sum(sizes[:rank]), sum(sizes[: rank + 1])


def make_model() -> nn.Linear:
    """The replicated model: a float64 ``Linear`` with the same (seeded) parameters in every process."""
    model = nn.Linear(IN_FEATURES, OUT_FEATURES, dtype=F64)
    with torch.no_grad():
        model.weight.copy_(rand((OUT_FEATURES, IN_FEATURES), "model", "weight") * 0.5)
        model.bias.copy_(rand((OUT_FEATURES,), "model", "bias") * 0.5)
    return model


# ----------------------------------------------------------------------------------------- test-only metrics


class SoftmaxScore(Metric):
    """A ``training_end``-style global loss: a ``cat`` list state and a ``sum`` state, nonlinear global compute.

    ``update(out)`` appends ``out[:, 0]`` (scores) and adds ``Σ out[:, 1]²`` (energy);
    ``compute() = Σ softmax(scores) ⊙ scores · log1p(energy)`` over every example seen.
    """

    is_differentiable = True
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("scores", [], dist_reduce_fx="cat")
        self.add_state("energy", torch.tensor(0.0, dtype=F64), dist_reduce_fx="sum")

    def update(self, out: torch.Tensor) -> None:
        self.scores.append(out[:, 0])
        self.energy = self.energy + (out[:, 1] ** 2).sum()

    def compute(self) -> torch.Tensor:
        scores = torch.cat(list(self.scores))
        return (torch.softmax(scores, 0) * scores).sum() * torch.log1p(self.energy)


def softmax_score_ref(out: torch.Tensor) -> torch.Tensor:
    """``SoftmaxScore`` of the rows ``out``, written independently with plain torch ops."""
    s = out[:, 0]
    weights = torch.exp(s - s.max())
    weights = weights / weights.sum()
    return (weights * s).sum() * torch.log(1 + (out[:, 1] ** 2).sum())


class Projection(Metric):
    """A large vector ``sum`` state (``n`` float64: past the size where the engine all-reduces instead of gathering).

    ``state = Σ_rows out[:, 0] ⊗ basis[:, 0] + out[:, 1] ⊗ basis[:, 1]``; ``compute = log(1 + Σ state² / n)``.
    """

    full_state_update = False

    def __init__(self, n: int = 10_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = n
        self.add_state("proj", torch.zeros(n, dtype=F64), dist_reduce_fx="sum")

    def update(self, out: torch.Tensor) -> None:
        self.proj = self.proj + out.sum(0) @ projection_basis(self.n)

    def compute(self) -> torch.Tensor:
        return torch.log1p((self.proj**2).sum() / self.n)


def projection_basis(n: int) -> torch.Tensor:
    return rand((OUT_FEATURES, n), "projection basis")


def projection_ref(out: torch.Tensor, n: int = 10_000) -> torch.Tensor:
    basis = projection_basis(n)
    state = (out[:, :1] * basis[0]).sum(0) + (out[:, 1:] * basis[1]).sum(0)
    return torch.log(1 + state.pow(2).mean())


class ManySums(Metric):
    """``n`` scalar ``sum`` states; ``update(x)`` adds ``x[i]`` to state ``i``; ``compute`` stacks them."""

    full_state_update = False

    def __init__(self, n: int = 16, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = n
        for i in range(n):
            self.add_state(f"s{i}", torch.tensor(0.0, dtype=F64), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        for i in range(self.n):
            setattr(self, f"s{i}", getattr(self, f"s{i}") + x[i])

    def compute(self) -> torch.Tensor:
        return torch.stack([getattr(self, f"s{i}") for i in range(self.n)])


class Rows(Metric):
    """One ``cat`` list state of 2-D rows (appended only when non-empty) and a ``sum`` row count."""

    full_state_update = False

    def __init__(self, width: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width = width
        self.add_state("rows", [], dist_reduce_fx="cat")
        self.add_state("count", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, rows: torch.Tensor) -> None:
        if rows.numel():
            self.rows.append(rows)
        self.count = self.count + rows.shape[0]

    def compute(self) -> torch.Tensor:
        if not self.rows:
            return torch.zeros(0, self.width, dtype=F64)
        return torch.cat(list(self.rows))


class BigSum(Metric):
    """A large fixed-shape ``sum`` state (bandwidth-bound: all-reduced) next to a small one and a ``max`` one."""

    full_state_update = False

    def __init__(self, n: int = 20_000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("big", torch.zeros(n, dtype=F64), dist_reduce_fx="sum")
        self.add_state("small", torch.tensor(0.0, dtype=F64), dist_reduce_fx="sum")
        self.add_state("peak", torch.tensor(float("-inf"), dtype=F64), dist_reduce_fx="max")

    def update(self, x: torch.Tensor) -> None:
        self.big = self.big + x
        self.small = self.small + x.sum()
        self.peak = torch.maximum(self.peak, x.max())

    def compute(self) -> dict[str, torch.Tensor]:
        return {"big": self.big, "small": self.small, "peak": self.peak}


class VectorSum(Metric):
    """A vector ``sum`` state of shape ``(3,)``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(3), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self.total = self.total + x

    def compute(self) -> torch.Tensor:
        return self.total


# ------------------------------------------------------------------------------------------------ checking


def tensor_devices(value: Any) -> set[torch.device]:
    """Every device of the tensors in ``value`` (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return {value.device}
    if isinstance(value, (list, tuple)):
        return set().union(*map(tensor_devices, value)) if value else set()
    if isinstance(value, dict):
        return tensor_devices(list(value.values()))
    return set()


class Checks:
    """Collects failures as readable strings, so one run reports every broken case and ranks stay in step."""

    def __init__(self, where: str = "") -> None:
        self.where = where
        self.failures: list[str] = []

    def fail(self, case: str, msg: str) -> None:
        self.failures.append(f"{self.where}{case}: {msg}")

    def true(self, case: str, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(case, msg)

    def close(self, case: str, actual: Any, expected: Any, *, atol: float = 1e-12, rtol: float = 1e-12) -> None:
        try:
            torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
        except (AssertionError, TypeError) as err:
            self.fail(case, str(err).replace("\n", " | "))

    def detached(self, case: str, value: Any, strict: bool = True) -> None:
        """No tensor in ``value`` (tensor, list, dict) carries a graph.

        ``strict=False`` only asks for ``grad_fn is None``; ``strict`` also rejects ``requires_grad`` and views
        of a tensor that requires grad (a view made under ``no_grad`` keeps its base, and so the base's graph).
        """
        if isinstance(value, dict):
            for k, v in value.items():
                self.detached(f"{case}[{k}]", v, strict)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self.detached(f"{case}[{i}]", v, strict)
        elif isinstance(value, torch.Tensor):
            base = value._base if value._is_view() else None
            ok = value.grad_fn is None
            if strict:
                ok = ok and not value.requires_grad and (base is None or not base.requires_grad)
            self.true(
                case,
                ok,
                f"not detached: requires_grad={value.requires_grad}, grad_fn={value.grad_fn}, "
                f"view of a tensor with grad_fn={getattr(base, 'grad_fn', None)} (whose graph stays alive)",
            )


def assert_no_failures(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} failing checks:\n" + "\n".join(failures)


# ------------------------------------------------------------------------------------ collective recording

_DIST_NAMES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
)


@contextmanager
def record_collectives(on_call: Callable[[str], Any] | None = None) -> Iterator[list[str]]:
    """Wrap ``torch.distributed``'s collectives and the backend's captured flat gather; yield the call log.

    ``on_call`` replaces the collective when given (outside a process group, where any call is a failure).
    The originals are restored on exit.
    """
    log: list[str] = []
    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, attr: str, name: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            log.append(name)
            return on_call(name) if on_call is not None else original(*args, **kwargs)

        saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    for name in _DIST_NAMES:
        wrap(dist, name, name)
    wrap(_backend, "_all_gather_flat", "_all_gather_flat")
    wrap(_backend, "_reduce_scatter_flat", "_reduce_scatter_flat")
    try:
        yield log
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
