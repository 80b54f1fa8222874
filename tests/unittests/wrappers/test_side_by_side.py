"""Our wrappers side by side with torchmetrics 1.9's, on the same inner metric and data: values of ``forward``
and ``compute`` over several steps, ``reset``, ``state_dict`` keys, the behaviour under a ``MetricCollection``, in
one process and on two and three gloo ranks with uneven batches (a rank empty in one step).

Package modules covered: ``wrappers`` (every wrapper) against torchmetrics' ``wrappers`` and its ``RunningMean``
/ ``RunningSum``.
"""

from __future__ import annotations

import pytest

from tests._helpers.harness import run_distributed
from tests.unittests.wrappers._cases import SCENARIOS, side_by_side

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_one_process_matches_torchmetrics(name: str) -> None:
    failures = side_by_side(0, 1, [name])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_match_torchmetrics(world_size: int) -> None:
    """Every scenario on two and three gloo ranks: torchmetrics' wrapper around torchmetrics' metric is the
    reference."""
    results = run_distributed(side_by_side, world_size, timeout=150)
    failures = [f for res in results for f in res]
    assert not failures, "\n".join(failures)
