"""Perplexity over every rank's tokens equals torchmetrics' on the concatenated batch (W = 1, 2, 3, uneven
batches, a rank without rows, padding spread unevenly so the global token count matters). Its gradient contract
is tested with the regression metrics (``tests/unittests/regression``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests._helpers.harness import run_distributed
from tests._helpers.seeds import F64, bounds, rand, seed
from torchmetrics_diff import Perplexity

pytestmark = pytest.mark.timeout(120)

LAYOUTS = {"empty rank": [3, 0, 5], "uneven": [4, 1, 2]}
T, V = 6, 5


def _data(n: int, tag: str, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = 2 * rand((n, T, V), tag, "logits")
    target = torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed(tag, "target")))
    if pad:
        lengths = torch.randint(1, T + 1, (n,), generator=torch.Generator().manual_seed(seed(tag, "lengths")))
        target[torch.arange(T)[None, :] >= lengths[:, None]] = -100
    return logits, target


def _body(rank: int, world: int) -> dict:
    out = {}
    for layout, all_sizes in LAYOUTS.items():
        sizes = all_sizes[:world]
        lo, hi = bounds(sizes, rank)
        for pad in (False, True):
            logits, target = _data(sum(sizes), layout, pad)
            ignore = -100 if pad else None
            metric = Perplexity(ignore_index=ignore).set_dtype(F64)
            metric.update(logits[lo:hi], target[lo:hi])
            stepper = Perplexity(ignore_index=ignore, dist_sync_on_step=True).set_dtype(F64)
            log_probs = torch.log_softmax(logits[lo:hi], -1)  # log-probabilities work as well as logits
            out[(layout, pad)] = (metric.compute(), stepper(log_probs, target[lo:hi]))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_values_equal_torchmetrics_on_the_global_batch(world_size: int) -> None:
    from torchmetrics.functional.text import perplexity

    results = run_distributed(_body, world_size, timeout=90)
    for layout, all_sizes in LAYOUTS.items():
        for pad in (False, True):
            logits, target = _data(sum(all_sizes[:world_size]), layout, pad)
            expected = perplexity(logits, target, ignore_index=-100 if pad else None)
            for res in results:
                computed, stepped = res[(layout, pad)]
                torch.testing.assert_close(computed, expected, atol=1e-12, rtol=1e-10)
                torch.testing.assert_close(stepped, expected, atol=1e-12, rtol=1e-10)


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: Perplexity(ignore_index=1.5), "`ignore_index` must be an int or None; got 1.5"),
    (lambda: Perplexity().update(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), r"\(B, T, V\); got \(2, 3\)"),
    (
        lambda: Perplexity().update(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)),
        r"`target` must be an integer tensor of shape \(2, 3\)",
    ),
    (
        lambda: Perplexity().update(torch.zeros(1, 2, 4), torch.tensor([[0, 4]])),
        r"`target` ids must lie in \[0, 3\] or be ignore_index; found \[4\]",
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_raises_value_error_naming_the_argument(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
