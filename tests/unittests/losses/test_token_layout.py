"""``TokenCrossEntropyLoss`` and ``token_cross_entropy`` in both layouts, and the errors of a wrong shape or target.

- ``class_dim=1`` reads torch's ``(B, C, T)`` layout: the value and the gradient equal those of the ``(B, T, C)``
  logits transposed, exactly, in float64 (with padding and label smoothing).
- The layout comes from the argument, never from the shapes: with ``T == C`` both fit, and the two readings give
  different values.
- A target that fits neither layout raises a ``ValueError`` naming the layout read and the shape it needs; one
  that fits the other layout says which ``class_dim`` would read it.
- A target outside ``[0, C)`` (not ``ignore_index``) raises an ``IndexError`` naming the value and the range, on
  the CPU by default and with ``validate_args=True``.

Package modules covered: ``losses.normalized``, ``functional._normalized``, ``_global.normalized``.
"""

from __future__ import annotations

import re

import pytest
import torch

from torchmetrics_diff._global.normalized import global_token_cross_entropy
from torchmetrics_diff.functional import token_cross_entropy
from torchmetrics_diff.losses import TokenCrossEntropyLoss

F64 = torch.float64


def _inputs(batch: int = 3, seq: int = 5, classes: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, seq, classes, dtype=F64, generator=gen)
    target = torch.randint(0, classes, (batch, seq), generator=gen)
    target[0, -2:] = -100  # padding
    return logits, target


def _value_and_grad(fn, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logits.detach().clone().requires_grad_(True)
    value = fn(leaf, target)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_torch_layout_equals_the_transposed_language_model_layout(label_smoothing: float) -> None:
    logits, target = _inputs()  # (B, T, C)
    btc = TokenCrossEntropyLoss(label_smoothing=label_smoothing)
    bct = TokenCrossEntropyLoss(label_smoothing=label_smoothing, class_dim=1)
    value, grad = _value_and_grad(btc, logits, target)
    value_t, grad_t = _value_and_grad(bct, logits.transpose(1, 2).contiguous(), target)
    assert value.dtype == F64 and torch.equal(value, value_t), (value, value_t)
    assert torch.equal(grad, grad_t.transpose(1, 2)), (grad - grad_t.transpose(1, 2)).abs().max()
    reference = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), target, ignore_index=-100, label_smoothing=label_smoothing
    )
    torch.testing.assert_close(value_t, reference, rtol=1e-12, atol=1e-12)
    for fn in (token_cross_entropy, global_token_cross_entropy):
        got = fn(logits.transpose(1, 2), target, label_smoothing=label_smoothing, class_dim=1)
        assert torch.equal(got, value), (fn.__name__, got, value)


def test_when_the_sequence_is_as_long_as_the_classes_the_argument_decides() -> None:
    logits, target = _inputs(seq=7, classes=7)  # (B, T, C) with T == C: either layout fits the target
    as_btc = TokenCrossEntropyLoss()(logits, target)
    as_bct = TokenCrossEntropyLoss(class_dim=1)(logits.transpose(1, 2), target)
    assert torch.equal(as_btc, as_bct)
    misread = TokenCrossEntropyLoss()(logits.transpose(1, 2), target)  # (B, C, T) read as (B, T, C): no error
    assert not torch.allclose(misread, as_btc), "the layout must come from class_dim, not from the shapes"
    assert torch.equal(TokenCrossEntropyLoss(class_dim=1)(logits, target), misread)


def test_a_target_that_fits_neither_layout_names_the_layout_read_and_the_shape_needed() -> None:
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError) as info:
        TokenCrossEntropyLoss()(logits, torch.zeros(2, 5, dtype=torch.long))
    message = str(info.value)
    assert "`logits` of shape (2, 3, 4) read as (B, T, C) (class_dim=-1)" in message, message
    assert "needs `target` of shape (2, 3); got (2, 5)" in message and "It fits" not in message, message
    with pytest.raises(ValueError, match=re.escape("read as (B, C, T) (class_dim=1) needs `target` of shape (2, 4)")):
        TokenCrossEntropyLoss(class_dim=1)(logits, torch.zeros(2, 5, dtype=torch.long))
    # torch's layout given without class_dim=1: the message says which argument reads it
    with pytest.raises(ValueError, match=re.escape("It fits class_dim=1, logits (B, C, T) (the layout of torch's")):
        TokenCrossEntropyLoss()(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=re.escape("`class_dim` must be a dimension of `logits`")):
        TokenCrossEntropyLoss(class_dim=3)(logits, torch.zeros(2, 3, dtype=torch.long))
    for bad in (True, 1.0, "1"):
        with pytest.raises(ValueError, match="`class_dim` must be an int"):
            TokenCrossEntropyLoss(class_dim=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("validate_args", [False, True])
@pytest.mark.parametrize("bad", [7, 4, -5])
def test_an_out_of_range_target_names_the_value_and_the_range(bad: int, validate_args: bool) -> None:
    logits = torch.zeros(1, 3, 4)
    target = torch.tensor([[0, -100, bad]])
    expected = f"`target` holds {bad}, outside the valid classes [0, 4) of `logits` (C = 4); targets equal to "
    expected += "ignore_index=-100"
    with pytest.raises(IndexError, match=re.escape(expected)):
        TokenCrossEntropyLoss(validate_args=validate_args)(logits, target)
    with pytest.raises(IndexError, match=re.escape(expected)):
        token_cross_entropy(logits.transpose(1, 2), target, class_dim=1, validate_args=validate_args)
    # ignore_index itself is never out of range, whatever its value
    padded = torch.tensor([[0, 1, bad]])
    assert TokenCrossEntropyLoss(ignore_index=bad, validate_args=validate_args)(logits, padded).isfinite()
