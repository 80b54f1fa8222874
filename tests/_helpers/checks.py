"""Checking results: a failure collector, comparisons and fingerprints of tensors.

Bodies that run on several ranks collect failures as strings instead of asserting, so one run reports every
broken case, no rank leaves the others waiting in a collective, and the test asserts in the pytest process.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

#: (rtol, atol) of values computed by a different order of float operations than the reference
TOLERANCES = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 5e-2),
    torch.float32: (1e-5, 1e-6),
    torch.float64: (1e-10, 1e-12),
}


class Checks:
    """Collects failures as readable strings, so one run reports every broken case and ranks stay in step.

    ``where`` prefixes every failure (e.g. ``"W=2 rank 1 "``). When ``case`` is set (the property suite sets it
    for each case of a batch), the failures are grouped under one heading line ``{where}{case}`` instead.
    """

    def __init__(self, where: str = "") -> None:
        self.where = where
        self.case = ""
        self.failures: list[str] = []

    def fail(self, what: str, msg: str) -> None:
        if not self.case:
            self.failures.append(f"{self.where}{what}: {msg}")
            return
        head = "" if self.failures else f"{self.where}{self.case}\n"
        self.failures.append(f"{head}    {what}: {msg}")

    def true(self, what: str, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(what, msg)

    def close(self, what: str, actual: Any, expected: Any, *, atol: float = 1e-12, rtol: float = 1e-12) -> None:
        try:
            torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
        except (AssertionError, TypeError) as err:
            self.fail(what, str(err).replace("\n", " | "))

    def detached(self, what: str, value: Any, strict: bool = True) -> None:
        """No tensor in ``value`` (tensor, list, dict) carries a graph.

        ``strict=False`` only asks for ``grad_fn is None``; ``strict`` also rejects ``requires_grad`` and views
        of a tensor that requires grad (a view made under ``no_grad`` keeps its base, and so the base's graph).
        """
        if isinstance(value, dict):
            for k, v in value.items():
                self.detached(f"{what}[{k}]", v, strict)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self.detached(f"{what}[{i}]", v, strict)
        elif isinstance(value, torch.Tensor):
            base = value._base if value._is_view() else None
            ok = value.grad_fn is None
            if strict:
                ok = ok and not value.requires_grad and (base is None or not base.requires_grad)
            self.true(
                what,
                ok,
                f"not detached: requires_grad={value.requires_grad}, grad_fn={value.grad_fn}, "
                f"view of a tensor with grad_fn={getattr(base, 'grad_fn', None)} (whose graph stays alive)",
            )

    def same(self, what: str, actual: Any, expected: Any, exact: bool = False) -> None:
        """``actual`` equals ``expected``: dtype, shape, values (floats within the dtype's tolerance)."""
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                self.fail(what, f"expected a list of {len(expected)}, got {show(actual)}")
                return
            for i, (a, e) in enumerate(zip(actual, expected)):
                self.same(f"{what}[{i}]", a, e, exact)
            return
        if not isinstance(actual, torch.Tensor):
            self.fail(what, f"expected a tensor, got {show(actual)}")
            return
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            self.fail(
                what,
                f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} {tuple(expected.shape)}",
            )
            return
        if exact or not expected.is_floating_point():
            ok = torch.equal(actual.detach(), expected.detach())
            if not ok:
                self.fail(what, f"values differ:\n      got      {show(actual)}\n      expected {show(expected)}")
            return
        rtol, atol = TOLERANCES[expected.dtype]
        try:
            torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol)
        except AssertionError as err:
            self.fail(what, " | ".join(str(err).splitlines()[:4]) + f" | got {show(actual)} expected {show(expected)}")

    def grad(self, what: str, x: torch.Tensor, expected: torch.Tensor) -> None:
        """``x.grad`` equals ``expected`` (a missing gradient counts as zeros)."""
        got = x.grad if x.grad is not None else torch.zeros_like(x)
        rtol, atol = TOLERANCES[x.dtype]
        try:
            torch.testing.assert_close(got, expected.to(x.dtype), rtol=rtol, atol=atol * 10)
        except AssertionError as err:
            self.fail(what, " | ".join(str(err).splitlines()[:4]) + f" | got {show(got)} expected {show(expected)}")


def assert_no_failures(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} failing checks:\n" + "\n".join(failures)


def max_err(got: torch.Tensor | float | None, want: torch.Tensor | float) -> float:
    """Max |got - want| measured against 1e-10 × max(1, |want|): ≤ 1 is a pass (NaN / None never pass)."""
    if got is None:
        return math.inf
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    if got.shape != want.shape:
        return math.inf
    if got.numel() == 0:
        return 0.0
    scale = max(1.0, float(want.abs().max()))
    err = float((got - want).abs().max())
    return math.inf if math.isnan(err) else err / (1e-10 * scale)


def tensor_devices(value: Any) -> set[torch.device]:
    """Every device of the tensors in ``value`` (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return {value.device}
    if isinstance(value, (list, tuple)):
        return set().union(*map(tensor_devices, value)) if value else set()
    if isinstance(value, dict):
        return tensor_devices(list(value.values()))
    return set()


def show(x: Any) -> str:
    """A short description of a tensor (dtype, shape, first values) or a list of them."""
    if isinstance(x, torch.Tensor):
        flat = x.detach().reshape(-1)
        head = flat[:8].tolist()
        more = "..." if flat.numel() > 8 else ""
        return f"{x.dtype} {tuple(x.shape)} {head}{more}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(show(v) for v in x) + "]"
    return repr(x)


def digest(x: Any) -> str:
    """A short fingerprint of a (nested) result: dtype, shape and bytes of every tensor."""
    h = hashlib.blake2b(digest_size=8)

    def feed(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            # a fresh dense copy: ``contiguous()`` keeps the stride of a 1-element slice, and bytes need stride 1
            v = torch.empty(v.shape, dtype=v.dtype).copy_(v.detach())
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
        elif isinstance(v, dict):
            for k in v:
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for item in v:
                feed(item)
            h.update(b"]")
        else:
            h.update(repr(v).encode())

    feed(x)
    return h.hexdigest()


def short(case: Any, limit: int = 1500) -> str:
    """``repr(case)`` cut to ``limit`` characters (long state names make huge reprs)."""
    text = repr(case)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"
