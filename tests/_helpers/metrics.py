"""Test-only metrics and the replicated model of the ``Metric``-layer tests, with the references of their values.

Every expected value in the tests is written with plain torch/numpy ops; the metrics below only exist to drive
the code under test (``Metric``'s lifecycle and the sync engine) through the cases the contract names.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests._helpers.seeds import F64, rand
from torchmetrics_diff import Metric

IN_FEATURES, OUT_FEATURES = 4, 2


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


class InPlace(Metric):
    """Mutates its states in place, then raises on a negative input: a half-done update to roll back."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(2, dtype=F64), dist_reduce_fx="sum")
        self.add_state("rows", [], dist_reduce_fx="cat")
        self.add_state("peak", torch.tensor(float("-inf"), dtype=F64), dist_reduce_fx="max")

    def update(self, x: torch.Tensor) -> None:
        self.total += torch.stack([x.sum(), (x * x).sum()])
        self.rows.append(x)
        self.peak.copy_(torch.maximum(self.peak, x.max()))
        if (x < 0).any():
            raise ValueError(f"InPlace: negative input {x.tolist()}")

    def compute(self) -> torch.Tensor:
        rows = torch.cat(list(self.rows)) if self.rows else torch.zeros(0, dtype=F64)
        return torch.cat([self.total, rows.sum().reshape(1), self.peak.reshape(1)])
