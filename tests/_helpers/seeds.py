"""Seeds equal in every process, seeded tensors, and the rows of a global batch that a rank holds.

``hash`` of a str is salted per process, so seeds are derived with ``crc32`` of the parts joined by ``/``: every
rank can rebuild every other rank's data (and the single-process reference) from the same parts.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

F64 = torch.float64


def seed(*parts: object) -> int:
    """A seed equal in every process (``hash`` of a str is salted per process)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def generator(*parts: object) -> torch.Generator:
    """A generator whose seed depends only on ``parts`` (the same in every process)."""
    return torch.Generator().manual_seed(seed(*parts))


def rand(shape: tuple, *parts: object, dtype: torch.dtype = F64) -> torch.Tensor:
    """Standard normal data from a seed derived from ``parts``."""
    return torch.randn(shape, generator=generator(*parts), dtype=dtype)


def bounds(sizes: Sequence[int], rank: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the global batch held by ``rank``."""
    return sum(sizes[:rank]), sum(sizes[: rank + 1])
