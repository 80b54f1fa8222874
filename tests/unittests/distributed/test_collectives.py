"""Acceptance tests of the differentiable collectives.

Every expectation is computed by brute force inside the rank's body: each rank rebuilds *all* ranks' inputs
from seeds known to every rank (``seed`` hashes a case name that never contains the current rank), turns them
into leaf tensors, computes each rank's loss on the full data with plain torch ops, and differentiates with
autograd. Nothing expected comes from the code under test.

Bodies run many cases in lockstep and collect failures as strings instead of raising at the first one, so the
ranks stay in step (no rank leaves a collective half-issued) and one run reports every broken case.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from tests._helpers.harness import run_distributed
from tests._helpers.seeds import seed
from torchmetrics_diff.distributed import _backend, _hosts, all_gather_cat, all_reduce, gather_all_tensors

pytestmark = pytest.mark.timeout(150)

WORLD_SIZES = [1, 2, 3]
MODES = ("none", "local", "sync")
OPS = ("sum", "mean", "min", "max")
ROWS = {"even": [4, 4, 4], "uneven": [3, 1, 5], "empty": [3, 0, 5]}
F64 = torch.float64


# ------------------------------------------------------------------------------------------------ helpers


def _rand(shape: tuple, *parts: object) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed(*parts)), dtype=F64)


class _Checks:
    """Collects failures of one rank as readable strings."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []

    def fail(self, case: str, msg: str) -> None:
        self.failures.append(f"[rank {self.rank}] {case}: {msg}")

    def true(self, case: str, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(case, msg)

    def close(self, case: str, actual: object, expected: object, exact: bool = False) -> None:
        if actual is None:
            self.fail(case, "got None")
            return
        tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-10, "atol": 1e-12}
        try:
            torch.testing.assert_close(actual, expected, **tol)
        except AssertionError as err:
            self.fail(case, str(err).replace("\n", " | "))

    def grad(self, case: str, x: torch.Tensor, expected: torch.Tensor) -> None:
        """``x.grad`` equals ``expected``; a zero-size input may have no gradient at all."""
        if x.grad is None and x.numel() == 0:
            return
        self.close(f"{case} grad", x.grad, expected)
        if x.grad is not None:
            self.true(case, bool(torch.isfinite(x.grad).all()), f"non-finite gradient {x.grad}")

    def detached(self, case: str, out: object) -> None:
        for t in out if isinstance(out, list) else [out]:
            self.true(case, t.grad_fn is None and not t.requires_grad, "grad='none' result is attached")


@contextmanager
def _case(rank: int, case: str):
    """Re-raise an exception of the code under test with the case name (all ranks normally raise alike)."""
    try:
        yield
    except Exception as err:
        raise AssertionError(f"[rank {rank}] {case}: raised {type(err).__name__}: {err}") from err


def _assert_no_failures(results: list) -> None:
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, f"{len(failures)} failing checks:\n" + "\n".join(failures)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1) if t.ndim == 0 else t


def _cat_ref(leaves: list) -> torch.Tensor:
    return torch.cat([_as_rows(t) for t in leaves])


def _reduce_ref(op: str, leaves: list) -> torch.Tensor:
    """The reduction over ranks as plain torch ops; amin/amax split the gradient evenly between ties."""
    return getattr(torch.stack(leaves), {"sum": "sum", "mean": "mean", "min": "amin", "max": "amax"}[op])(0)


def _gather_loss(case: str, r: int, slots: list) -> torch.Tensor:
    """L_r = (r+1) Σ_i Σ w_{r,i} ⊙ slot_i², rank- and slot-specific weights."""
    return (r + 1) * sum((_rand(s.shape, case, "w", r, i) * s**2).sum() for i, s in enumerate(slots))


def _tensor_loss(case: str, r: int, t: torch.Tensor, linear: bool = False) -> torch.Tensor:
    """L_r = (r+1) Σ w_r ⊙ t² (or ⊙ t when ``linear``: finite gradients even where ``t`` is ±inf)."""
    w = _rand(t.shape, case, "w", r)
    return (r + 1) * (w * (t if linear else t**2)).sum()


def _brute_grad(
    data: list, rank: int, mode: str, build: Callable, loss: Callable, owners: list | None = None
) -> torch.Tensor:
    """∂L_rank/∂x_rank ("local") or Σ_r' ∂L_r'/∂x_rank ("sync"), on leaves rebuilt from every rank's data."""
    leaves = [d.clone().requires_grad_(True) for d in data]
    built = build(leaves)
    owners = list(range(len(data))) if owners is None else owners
    total = sum(loss(r, built) for r in (owners if mode == "sync" else [rank]))
    (grad,) = torch.autograd.grad(total, leaves[rank])
    return grad


# -------------------------------------------------------------------- gather_all_tensors / all_gather_cat


def _gather_cat_body(rank: int, world: int) -> list:
    chk = _Checks(rank)
    for fn_name in ("gather", "cat"):
        for size_name, all_rows in ROWS.items():
            rows = all_rows[:world]
            for mode in MODES:
                case = f"{fn_name}/{size_name}/{mode}/W={world}"
                data = [_rand((rows[r], 3), case, "x", r) for r in range(world)]
                x = data[rank].clone().requires_grad_(True)
                with _case(rank, case):
                    if fn_name == "gather":
                        out = gather_all_tensors(x, grad=mode)
                        chk.true(case, isinstance(out, list) and len(out) == world, f"not a list of {world}")
                        for i in range(world):
                            chk.close(f"{case} slot {i}", out[i], data[i], exact=True)
                        build, loss = (
                            (lambda leaves: leaves),
                            (lambda r, g, case=case: _gather_loss(case, r, g)),
                        )
                    else:
                        out = all_gather_cat(x, grad=mode)
                        chk.close(f"{case} value", out, torch.cat(data), exact=True)
                        build, loss = _cat_ref, (lambda r, g, case=case: _tensor_loss(case, r, g))
                    if mode == "none":
                        chk.detached(case, out)
                        continue
                    loss(rank, out).backward()
                chk.grad(case, x, _brute_grad(data, rank, mode, build, loss))
    return chk.failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_and_cat_values_and_gradients(world_size: int) -> None:
    """Values are every rank's tensor in rank order; "local" = ∂L_r/∂x_r; "sync" = Σ_r' ∂L_r'/∂x_r."""
    _assert_no_failures(run_distributed(_gather_cat_body, world_size, timeout=60))


# ------------------------------------------------------------------------------------------------- all_reduce


def _reduce_data(case: str, op: str, values: str, world: int) -> list:
    data = [_rand((2, 3), case, "x", r) for r in range(world)]
    if values == "tie":  # row 0 tied between ranks 0 and 1, element [1, 0] tied between every rank
        extreme = 10.0 if op == "max" else -10.0
        for r in range(min(world, 2)):
            data[r][0] = extreme
        for r in range(world):
            data[r][1, 0] = extreme
    elif values == "inf":  # a min/max state initialised to +inf / -inf on some or all ranks
        init = float("inf") if op == "min" else float("-inf")
        for r in range(world):
            data[r][0, 0] = init  # every rank: the result is ±inf
            if r < world - 1 or world == 1:
                data[r][1, 2] = init  # all but the last rank
        data[0][0, 1] = init  # rank 0 only
    return data


def _all_reduce_body(rank: int, world: int) -> list:
    """Both paths of a CPU ``all_reduce``: the rows riding in the call header's exchange (reduced on every rank: one
    collective) and, with that path switched off (as for a tensor over the inline area, or on a GPU), the header
    and a backend all-reduce (two)."""
    from tests._helpers.collectives import record_collectives
    from torchmetrics_diff.distributed import _collectives

    chk = _Checks(rank)
    inline = _collectives._inline_bytes
    for path in ("inline", "separate"):
        _collectives._inline_bytes = inline if path == "inline" else (lambda tensor, group: None)
        try:
            _all_reduce_cases(chk, rank, world, path, record_collectives)
        finally:
            _collectives._inline_bytes = inline
    return chk.failures


def _all_reduce_cases(chk: _Checks, rank: int, world: int, path: str, record: Any) -> None:
    for op in OPS:
        for values in ("random", "tie", "inf") if op in ("min", "max") else ("random",):
            for mode in MODES:
                case = f"all_reduce/{path}/{op}/{values}/{mode}/W={world}"
                data = _reduce_data(case, op, values, world)
                x = data[rank].clone().requires_grad_(True)
                before = x.detach().clone()
                linear = values == "inf"
                with _case(rank, case):
                    with record() as log:
                        out = all_reduce(x, op, grad=mode)
                    wanted = (
                        0 if world == 1 else 1 if path == "inline" else 2 + (op in ("min", "max") and mode != "none")
                    )
                    chk.true(f"{case} collectives", len(log) == wanted, f"{list(log)}, expected {wanted}")
                    chk.close(f"{case} value", out, _reduce_ref(op, data), exact=op in ("min", "max"))
                    chk.true(case, torch.equal(x.detach(), before), "input tensor was modified")
                    if mode == "none":
                        chk.detached(case, out)
                        continue
                    _tensor_loss(case, rank, out, linear).backward()

                def loss(r: int, red: torch.Tensor, case: str = case, linear: bool = linear) -> torch.Tensor:
                    return _tensor_loss(case, r, red, linear)

                expected = _brute_grad(data, rank, mode, lambda leaves, op=op: _reduce_ref(op, leaves), loss)
                chk.grad(case, x, expected)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_values_and_gradients(world_size: int) -> None:
    """sum/mean/min/max x none/local/sync; min/max ties split like torch.amax; ±inf states give no NaN."""
    _assert_no_failures(run_distributed(_all_reduce_body, world_size, timeout=60))


# ----------------------------------------------------------------------------- oracle: torch.distributed.nn


def _oracle_body(rank: int, world: int) -> list:
    import torch.distributed.nn.functional as dist_nn

    chk = _Checks(rank)
    for fn_name in ("gather", "cat"):
        case = f"oracle/{fn_name}/W={world}"
        data = [_rand((4, 3), case, "x", r) for r in range(world)]
        ours = data[rank].clone().requires_grad_(True)
        theirs = data[rank].clone().requires_grad_(True)
        with _case(rank, case):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated in torch 2.13
                ref_slots = list(dist_nn.all_gather(theirs))
            if fn_name == "gather":
                got = gather_all_tensors(ours, grad="sync")
                _gather_loss(case, rank, got).backward()
                _gather_loss(case, rank, ref_slots).backward()
                for i in range(world):
                    chk.close(f"{case} slot {i}", got[i], ref_slots[i], exact=True)
            else:
                got = all_gather_cat(ours, grad="sync")
                _tensor_loss(case, rank, got).backward()
                _tensor_loss(case, rank, torch.cat(ref_slots)).backward()
                chk.close(f"{case} value", got, torch.cat(ref_slots), exact=True)
        chk.close(f"{case} grad vs torch.distributed.nn", ours.grad, theirs.grad)
    return chk.failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_sync_gradient_matches_torch_distributed_nn(world_size: int) -> None:
    _assert_no_failures(run_distributed(_oracle_body, world_size, timeout=60))


# --------------------------------------------------------------------------------------------------- subgroup


def _subgroup_body(rank: int, world: int) -> object:
    group = dist.new_group([1, 2])  # collective over WORLD: every rank creates it
    if rank == 0:
        errors = {}
        calls = {
            "gather_all_tensors": lambda: gather_all_tensors(torch.ones(2), group),
            "all_gather_cat": lambda: all_gather_cat(torch.ones(2), group),
            "all_reduce": lambda: all_reduce(torch.ones(2), "sum", group),
        }
        for name, call in calls.items():
            try:
                call()
                errors[name] = "no error"
            except Exception as err:
                errors[name] = f"{type(err).__name__}: {err}"
        return errors
    chk = _Checks(rank)
    grank, owners = rank - 1, [0, 1]  # slot i is group rank i = global rank i + 1
    for mode in ("local", "sync"):
        for fn_name in ("gather", "cat", "sum", "max"):
            case = f"subgroup/{fn_name}/{mode}"
            if fn_name in ("gather", "cat"):
                data = [_rand((rows, 3), case, "x", i) for i, rows in enumerate([2, 3])]
            else:
                data = _reduce_data(case, fn_name, "tie", 2)
            x = data[grank].clone().requires_grad_(True)
            with _case(rank, case):
                if fn_name == "gather":
                    out = gather_all_tensors(x, group, grad=mode)
                    chk.true(case, len(out) == 2, f"expected 2 slots, got {len(out)}")
                    for i in range(2):
                        chk.close(f"{case} slot {i}", out[i], data[i], exact=True)
                    build, loss = (lambda leaves: leaves), (lambda r, g, case=case: _gather_loss(case, r, g))
                elif fn_name == "cat":
                    out = all_gather_cat(x, group, grad=mode)
                    chk.close(f"{case} value", out, torch.cat(data), exact=True)
                    build, loss = _cat_ref, (lambda r, g, case=case: _tensor_loss(case, r, g))
                else:
                    out = all_reduce(x, fn_name, group, grad=mode)
                    chk.close(f"{case} value", out, _reduce_ref(fn_name, data), exact=True)
                    build = lambda leaves, op=fn_name: _reduce_ref(op, leaves)  # noqa: E731
                    loss = lambda r, g, case=case: _tensor_loss(case, r, g)  # noqa: E731
                loss(grank, out).backward()
            chk.grad(case, x, _brute_grad(data, grank, mode, build, loss, owners))
    return chk.failures


def test_subgroup_values_gradients_and_non_member() -> None:
    results = run_distributed(_subgroup_body, 3, timeout=60)
    for name, message in results[0].items():
        assert message.startswith("ValueError") and "not a member" in message, (
            f"rank 0 (not in the group) calling {name}: expected ValueError 'not a member', got {message!r}"
        )
    _assert_no_failures(results[1:])


# ------------------------------------------------------------------------------------------------ mismatches


def _mismatch_cases(rank: int, world: int) -> dict:
    """Name -> (call on this rank, what every RuntimeError must contain); the last rank differs."""
    odd = rank == world - 1
    last = f"rank {world - 1}"

    def t(shape: tuple = (2, 3), dtype: torch.dtype = F64, rg: bool = False) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype).requires_grad_(rg)

    nd = t((2,)) if odd else t()
    f32 = t(dtype=torch.float32) if odd else t()
    grad_mode = "sync" if odd else "local"
    rg_sync = t(rg=not odd)
    return {
        "gather ndim": (lambda: gather_all_tensors(nd), ["gather_all_tensors", "ndim", last, "1", "2"]),
        "cat ndim": (lambda: all_gather_cat(nd), ["all_gather_cat", "ndim", last]),
        "reduce ndim": (lambda: all_reduce(nd), ["all_reduce", "ndim", last]),
        "gather dtype": (lambda: gather_all_tensors(f32), ["dtype", last, "float32", "float64"]),
        "cat dtype": (lambda: all_gather_cat(f32), ["dtype", last, "float32", "float64"]),
        "reduce dtype": (lambda: all_reduce(f32, "max"), ["dtype", last, "float32", "float64"]),
        "cat trailing dims": (
            lambda: all_gather_cat(t((2, 4)) if odd else t((5, 3))),
            ["trailing", last, "3", "4"],
        ),
        "reduce shape": (lambda: all_reduce(t((4,)) if odd else t((3,))), ["shape", last, "3", "4"]),
        "gather grad mode": (
            lambda: gather_all_tensors(t(rg=True), grad=grad_mode),
            ["grad", last, "sync", "local"],
        ),
        "cat grad mode": (
            lambda: all_gather_cat(t(rg=True), grad="none" if odd else "sync"),
            ["grad", last, "none", "sync"],
        ),
        "reduce grad mode": (lambda: all_reduce(t(rg=True), grad=grad_mode), ["grad", last, "sync", "local"]),
        "reduce op": (lambda: all_reduce(t(), "max" if odd else "sum"), ["op", last, "max", "sum"]),
        "gather sync requires_grad": (
            lambda: gather_all_tensors(rg_sync, grad="sync"),
            ["requires_grad", last, "True", "False"],
        ),
        "cat sync requires_grad": (
            lambda: all_gather_cat(rg_sync, grad="sync"),
            ["requires_grad", last, "True", "False"],
        ),
        "reduce sync requires_grad": (
            lambda: all_reduce(rg_sync, "min", grad="sync"),
            ["requires_grad", last, "True", "False"],
        ),
    }


def _mismatch_body(rank: int, world: int) -> dict:
    got = {}
    for name, (call, _) in _mismatch_cases(rank, world).items():
        try:
            call()
            got[name] = ("no error", "")
        except Exception as err:
            got[name] = (type(err).__name__, str(err))
    # The group is still usable and in step after all those errors.
    got["after"] = ("sum", all_reduce(torch.ones(1)).item())
    return got


@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatch_raises_on_every_rank(world_size: int) -> None:
    results = run_distributed(_mismatch_body, world_size, timeout=60)
    problems = []
    for name, (_, needles) in _mismatch_cases(0, world_size).items():
        for rank, got in enumerate(results):
            kind, message = got[name]
            if kind != "RanksDisagreeError":
                problems.append(f"{name}: rank {rank} got {kind} {message!r}, expected RanksDisagreeError")
            elif missing := [n for n in needles if n not in message]:
                problems.append(f"{name}: rank {rank} message {message!r} lacks {missing}")
    for rank, got in enumerate(results):
        if got["after"][1] != world_size:
            problems.append(f"rank {rank}: all_reduce after the errors gave {got['after'][1]}, not {world_size}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ edge cases


def _edge_body(rank: int, world: int) -> list:
    chk = _Checks(rank)
    gather_build = lambda leaves: leaves  # noqa: E731

    # 0-d tensors: gather keeps 0-d slots, cat makes one row per rank, all_reduce keeps 0-d.
    for mode in ("local", "sync"):
        case = f"0-d/{mode}/W={world}"
        data = [_rand((), case, "x", r) for r in range(world)]

        def gather_loss(r: int, g: list, case: str = case) -> torch.Tensor:
            return _gather_loss(case, r, g)

        def tensor_loss(r: int, g: torch.Tensor, case: str = case) -> torch.Tensor:
            return _tensor_loss(case, r, g)

        def sum_ref(leaves: list) -> torch.Tensor:
            return _reduce_ref("sum", leaves)

        with _case(rank, case):
            x = data[rank].clone().requires_grad_(True)
            out = gather_all_tensors(x, grad=mode)
            shapes = [tuple(t.shape) for t in out]
            chk.true(case, shapes == [()] * world, f"gather slot shapes {shapes}, expected 0-d")
            for i in range(world):
                chk.close(f"{case} gather slot {i}", out[i], data[i], exact=True)
            gather_loss(rank, out).backward()
            chk.grad(f"{case} gather", x, _brute_grad(data, rank, mode, gather_build, gather_loss))

            x = data[rank].clone().requires_grad_(True)
            out = all_gather_cat(x, grad=mode)
            chk.true(case, out.shape == (world,), f"cat shape {tuple(out.shape)}, expected ({world},)")
            chk.close(f"{case} cat", out, torch.stack(data), exact=True)
            tensor_loss(rank, out).backward()
            chk.grad(f"{case} cat", x, _brute_grad(data, rank, mode, _cat_ref, tensor_loss))

            x = data[rank].clone().requires_grad_(True)
            out = all_reduce(x, "sum", grad=mode)
            chk.true(case, out.shape == (), f"all_reduce shape {tuple(out.shape)}")
            chk.close(f"{case} reduce", out, _reduce_ref("sum", data))
            tensor_loss(rank, out).backward()
            chk.grad(f"{case} reduce", x, _brute_grad(data, rank, mode, sum_ref, tensor_loss))

    # Zero-size tensors on every rank.
    for mode in MODES:
        case = f"zero-size everywhere/{mode}/W={world}"
        with _case(rank, case):
            x = torch.zeros(0, 3, dtype=F64, requires_grad=True)
            slots = gather_all_tensors(x, grad=mode)
            chk.true(
                case,
                [tuple(t.shape) for t in slots] == [(0, 3)] * world,
                f"gather {[t.shape for t in slots]}",
            )
            cat = all_gather_cat(x, grad=mode)
            chk.true(case, tuple(cat.shape) == (0, 3), f"cat shape {tuple(cat.shape)}")
            red = all_reduce(torch.zeros(0, dtype=F64, requires_grad=True), "max", grad=mode)
            chk.true(case, tuple(red.shape) == (0,), f"all_reduce shape {tuple(red.shape)}")
            if mode != "none":
                (sum(t.sum() for t in slots) + cat.sum()).backward()
                chk.true(
                    case,
                    x.grad is not None and tuple(x.grad.shape) == (0, 3),
                    f"gradient {None if x.grad is None else tuple(x.grad.shape)}, expected one of shape (0, 3)",
                )
                red.sum().backward()

    # Non-contiguous inputs (a transposed view of a leaf): values and gradients.
    rows = [2, 3, 4][:world]
    for mode in ("local", "sync"):
        for fn_name in ("gather", "cat", "sum", "max"):
            case = f"non-contiguous/{fn_name}/{mode}/W={world}"
            if fn_name in ("gather", "cat"):
                data = [_rand((rows[r], 3), case, "x", r) for r in range(world)]
            else:
                data = _reduce_data(case, fn_name, "tie", world)
            base = data[rank].t().contiguous().requires_grad_(True)
            x = base.t()
            chk.true(case, not x.is_contiguous(), "test setup: the view should be non-contiguous")
            with _case(rank, case):
                if fn_name == "gather":
                    out = gather_all_tensors(x, grad=mode)
                    for i in range(world):
                        chk.close(f"{case} slot {i}", out[i], data[i], exact=True)
                    build, loss = gather_build, (lambda r, g, case=case: _gather_loss(case, r, g))
                elif fn_name == "cat":
                    out = all_gather_cat(x, grad=mode)
                    chk.close(f"{case} value", out, torch.cat(data), exact=True)
                    build, loss = _cat_ref, (lambda r, g, case=case: _tensor_loss(case, r, g))
                else:
                    out = all_reduce(x, fn_name, grad=mode)
                    chk.close(f"{case} value", out, _reduce_ref(fn_name, data))
                    build = lambda leaves, op=fn_name: _reduce_ref(op, leaves)  # noqa: E731
                    loss = lambda r, g, case=case: _tensor_loss(case, r, g)  # noqa: E731
                loss(rank, out).backward()
            expected = _brute_grad(data, rank, mode, build, loss)
            chk.close(f"{case} grad", base.grad, expected.t())

    # Integer and bool dtypes: values right, dtype kept, never requires grad, input untouched.
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        case = f"dtype {dtype}/W={world}"
        gen = [torch.Generator().manual_seed(seed(case, r)) for r in range(world)]
        high = 2 if dtype == torch.bool else 200
        data = [torch.randint(0, high, ([2, 0, 3][r], 2), generator=gen[r]).to(dtype) for r in range(world)]
        same = [torch.randint(0, high, (2, 3), generator=gen[r]).to(dtype) for r in range(world)]
        with _case(rank, case):
            for mode in MODES:
                slots = gather_all_tensors(data[rank], grad=mode)
                for i in range(world):
                    chk.close(f"{case} {mode} gather slot {i}", slots[i], data[i], exact=True)
                chk.detached(f"{case} {mode} gather", slots)
                cat = all_gather_cat(data[rank], grad=mode)
                chk.close(f"{case} {mode} cat", cat, torch.cat(data), exact=True)
                chk.detached(f"{case} {mode} cat", cat)
            ops = ("min", "max") if dtype in (torch.uint8, torch.bool) else ("sum", "min", "max")
            for op in ops:
                x = same[rank].clone()
                out = all_reduce(x, op)
                stacked = torch.stack(same)
                if dtype == torch.bool:
                    ref = stacked.all(0) if op == "min" else stacked.any(0)
                else:
                    ref = _reduce_ref(op, same).to(dtype)  # torch.sum promotes int32; a sync must not
                chk.close(f"{case} all_reduce {op}", out, ref, exact=True)
                chk.detached(f"{case} all_reduce {op}", out)
                chk.true(case, torch.equal(x, same[rank]), f"all_reduce {op} modified its input")

    # grad="local" where only rank 0's input requires grad: allowed, rank 0 gets its plain gradient.
    case = f"local with requires_grad on rank 0 only/W={world}"
    data = [_rand((3,), case, "x", r) for r in range(world)]
    with _case(rank, case):
        x = data[rank].clone().requires_grad_(rank == 0)
        out = all_reduce(x, "max", grad="local")
        slots = gather_all_tensors(x, grad="local")
        chk.close(f"{case} value", out, _reduce_ref("max", data), exact=True)
        if rank == 0:
            (_tensor_loss(case, 0, out) + _gather_loss(case, 0, slots)).backward()

            def loss(r: int, leaves: list) -> torch.Tensor:
                return _tensor_loss(case, r, _reduce_ref("max", leaves)) + _gather_loss(case, r, leaves)

            chk.grad(case, x, _brute_grad(data, 0, "local", gather_build, loss))

    # World size 1 keeps the structure: a one-element list for gather, the tensor itself for the others.
    if world == 1:
        case = "world size 1 structure"
        x = torch.arange(3.0, dtype=F64, requires_grad=True)
        out = gather_all_tensors(x)
        chk.true(case, isinstance(out, list) and len(out) == 1, f"gather gave {type(out).__name__}")
        chk.close(case, out[0], x.detach(), exact=True)
        (out[0] ** 2).sum().backward()
        chk.close(f"{case} grad", x.grad, 2 * x.detach())
    return chk.failures


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_edge_cases(world_size: int) -> None:
    """0-d, zero-size everywhere, non-contiguous, integer/bool dtypes, mixed requires_grad in "local"."""
    _assert_no_failures(run_distributed(_edge_body, world_size, timeout=60))


# ------------------------------------------------------------------------------------------------- bad args


def _bad_args_errors() -> dict:
    x = torch.ones(3)
    calls = {
        "gather grad": (lambda: gather_all_tensors(x, grad="bogus"), ValueError, "grad"),
        "cat grad": (lambda: all_gather_cat(x, grad="bogus"), ValueError, "grad"),
        "reduce grad": (lambda: all_reduce(x, grad="bogus"), ValueError, "grad"),
        "reduce op": (lambda: all_reduce(x, op="prod"), ValueError, "op"),
        "gather non-tensor": (lambda: gather_all_tensors([1.0, 2.0]), TypeError, "tensor"),
        "cat non-tensor": (lambda: all_gather_cat(3.0), TypeError, "tensor"),
        "reduce non-tensor": (lambda: all_reduce(None), TypeError, "tensor"),
        "reduce mean of int": (
            lambda: all_reduce(torch.ones(2, dtype=torch.int64), "mean"),
            ValueError,
            "mean",
        ),
        "reduce sum of bool": (
            lambda: all_reduce(torch.ones(2, dtype=torch.bool), "sum"),
            ValueError,
            "bool",
        ),
    }
    problems = []
    for name, (call, kind, needle) in calls.items():
        try:
            call()
            problems.append(f"{name}: no error, expected {kind.__name__}")
        except Exception as err:
            if not isinstance(err, kind) or needle not in str(err):
                problems.append(f"{name}: got {type(err).__name__} {err!r}, expected {kind.__name__} naming {needle!r}")
    return problems


def _bad_args_body(rank: int, world: int) -> list:
    return [f"[rank {rank}] {p}" for p in _bad_args_errors()]


@pytest.mark.parametrize("world_size", [2])
def test_bad_args_distributed(world_size: int) -> None:
    """Every rank passes the same bad argument: a clear local error, and the group is not left waiting."""
    _assert_no_failures(run_distributed(_bad_args_body, world_size, timeout=30))


def test_bad_args_not_initialised() -> None:
    assert not dist.is_initialized(), "this test runs in the pytest process, which must not join a group"
    problems = _bad_args_errors()
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------ counting the collectives

_DIST_NAMES = (
    "all_gather_single",
    "all_gather_into_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce_scatter",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
    "monitored_barrier",
)


@contextmanager
def _record_collectives(on_call: Callable | None = None):
    """Wrap every ``torch.distributed`` collective (and the backend's captured flat collectives).

    Yields a list that receives ``(name, sizes of the tensor arguments)`` per call. ``on_call`` runs instead
    of the collective when given (for the not-initialised test, where any call is a failure).
    """
    log: list = []
    saved = []

    def wrap(owner: object, attr: str, name: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return

        def wrapper(*args, **kwargs):
            log.append((name, tuple(a.numel() for a in args if isinstance(a, torch.Tensor))))
            return on_call(name) if on_call is not None else original(*args, **kwargs)

        saved.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    for name in _DIST_NAMES:
        wrap(dist, name, name)
    for attr in ("_all_gather_flat", "_reduce_scatter_flat"):
        fn = getattr(_backend, attr, None)
        wrap(_backend, attr, getattr(fn, "__name__", attr))
    wrap(_hosts, "all_gather", "host all_gather")  # the call header's full exchange
    wrap(_hosts, "max_reduce", "host max_reduce")  # its fingerprint
    try:
        yield log
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _count_body(rank: int, world: int) -> dict:
    """Per case: this rank's (forward, backward) collectives; inputs differ by rank, rank 1 is empty."""
    rows = [3, 0, 5][:world]
    rg0 = rank == 0
    seqs = {}

    def run(case: str, forward: Callable, backward: Callable | bool | None) -> None:
        with _record_collectives() as fwd_log, _case(rank, case):
            out = forward()
        bwd_log: list = []
        if backward:
            with _record_collectives() as bwd_log, _case(rank, case):
                backward(out)
        seqs[case] = (list(fwd_log), list(bwd_log), bool(backward))

    def rows_x(rg: bool = True) -> torch.Tensor:
        return torch.randn(rows[rank], 2, dtype=F64).requires_grad_(rg)

    def rows_int() -> torch.Tensor:
        return torch.ones(rows[rank], dtype=torch.int64)

    def backward_slots(out: list) -> None:
        sum(t.sum() for t in out).backward()

    def backward_sum(out: torch.Tensor) -> None:
        out.sum().backward()

    for mode in MODES:
        with_grad = mode != "none"
        run(
            f"gather/{mode}",
            lambda m=mode: gather_all_tensors(rows_x(), grad=m),
            with_grad and backward_slots,
        )
        run(f"cat/{mode}", lambda m=mode: all_gather_cat(rows_x(), grad=m), with_grad and backward_sum)
        run(f"cat int64/{mode}", lambda m=mode: all_gather_cat(rows_int(), grad=m), None)
    run(
        "gather local, requires_grad on rank 0 only",
        lambda: gather_all_tensors(rows_x(rg0)),
        rg0 and backward_slots,
    )
    for op in OPS:
        # +inf on odd ranks, finite on even ones: the holders of the extremum differ by rank.
        data = torch.full((4,), float("inf") if rank % 2 else 1.0, dtype=F64)

        def call(mode: str, rg: bool, op: str = op, data: torch.Tensor = data) -> Callable:
            return lambda: all_reduce(data.clone().requires_grad_(rg), op, grad=mode)

        run(f"all_reduce {op} local, requires_grad on rank 0 only", call("local", rg0), rg0 and backward_sum)
        run(f"all_reduce {op} sync", call("sync", True), backward_sum)
        run(f"all_reduce {op} none", call("none", True), None)
    run("all_reduce max uint8", lambda: all_reduce(torch.full((3,), rank, dtype=torch.uint8), "max"), None)
    return seqs


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collective_sequence_independent_of_local_data(world_size: int) -> None:
    """Same collectives, same sizes, same order on every rank (one rank empty); no barrier; none at W=1.

    Also: grad="local" issues no collective in backward, and grad="sync" issues one.
    """
    results = run_distributed(_count_body, world_size, timeout=60)
    problems = []
    for case, (fwd, bwd, _) in results[0].items():
        for rank in range(1, world_size):
            if results[rank][case][0] != fwd:
                problems.append(f"{case}: forward rank 0 {fwd} != rank {rank} {results[rank][case][0]}")
            if "requires_grad on rank 0 only" not in case and results[rank][case][1] != bwd:
                problems.append(f"{case}: backward rank 0 {bwd} != rank {rank} {results[rank][case][1]}")
        for rank in range(world_size):
            f_seq, b_seq, ran_backward = results[rank][case]
            names = [name for name, _ in f_seq + b_seq]
            if any("barrier" in name for name in names):
                problems.append(f"{case}: rank {rank} called a barrier: {names}")
            if world_size == 1 and names:
                problems.append(f"{case}: world size 1 called collectives {names}")
            if world_size > 1 and not f_seq:
                problems.append(f"{case}: rank {rank} recorded no forward collective (is the recorder bypassed?)")
            if "local" in case and b_seq:
                problems.append(f"{case}: grad='local' backward communicated on rank {rank}: {b_seq}")
            if world_size > 1 and "sync" in case and ran_backward and len(b_seq) != 1:
                problems.append(f"{case}: grad='sync' backward should issue one collective on rank {rank}: {b_seq}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ not initialised


def test_not_initialised_is_plain_single_process() -> None:
    """No process group: the local tensor in the same structure, plain gradients, and no collective called."""
    assert not dist.is_initialized(), "this test runs in the pytest process, which must not join a group"

    def forbidden(name: str) -> None:
        raise AssertionError(f"collective {name} called without a process group")

    with _record_collectives(forbidden) as log:
        for mode in MODES:
            x = torch.arange(1.0, 4.0, dtype=F64, requires_grad=True)
            out = gather_all_tensors(x, grad=mode)
            assert isinstance(out, list) and len(out) == 1, mode
            torch.testing.assert_close(out[0], x.detach(), rtol=0, atol=0)
            cat = all_gather_cat(x, grad=mode)
            torch.testing.assert_close(cat, x.detach(), rtol=0, atol=0)
            scalar_cat = all_gather_cat(torch.tensor(2.0), grad=mode)
            assert scalar_cat.shape == (1,), f"0-d cat should be one row, got {tuple(scalar_cat.shape)}"
            reduced = {op: all_reduce(x, op, grad=mode) for op in OPS}
            for op, red in reduced.items():
                torch.testing.assert_close(red, x.detach(), rtol=0, atol=0, msg=f"{op}/{mode}")
            if mode == "none":
                for t in [out[0], cat, *reduced.values()]:
                    assert t.grad_fn is None and not t.requires_grad, f"{mode}: attached result"
                continue
            w = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
            loss = (w * out[0] ** 2).sum() + (w * cat).sum() + sum((w * r).sum() for r in reduced.values())
            loss.backward()
            expected = 2 * w * x.detach() + w + len(OPS) * w
            torch.testing.assert_close(x.grad, expected, msg=f"plain gradient, grad={mode}")
        ints = torch.tensor([3, 1, 2])
        torch.testing.assert_close(all_reduce(ints, "max"), ints, rtol=0, atol=0)
        torch.testing.assert_close(gather_all_tensors(ints)[0], ints, rtol=0, atol=0)
    assert log == [], f"collectives called without a process group: {log}"


# ------------------------------------------------------------- argument checks before the metadata exchange


def _mean_of_int_on_one_rank_body(rank: int, world: int) -> tuple:
    x = torch.ones(3, dtype=torch.int64) if rank == world - 1 else torch.ones(3, dtype=F64)
    try:
        all_reduce(x, "mean")
    except Exception as err:
        return type(err).__name__, str(err)
    return "no error", ""


def test_dtype_mismatch_with_op_invalid_for_one_rank_does_not_hang() -> None:
    """A dtype disagreement where one rank's dtype is also invalid for the op (int + "mean").

    The contract (the docstring) is the same RuntimeError on every rank, never a hang. A rank must not
    raise a purely local error before the metadata exchange that its peers are already waiting in.
    """
    results = run_distributed(_mean_of_int_on_one_rank_body, 2, timeout=15)
    for rank, (kind, message) in enumerate(results):
        assert kind == "RanksDisagreeError" and "dtype" in message, f"rank {rank}: {kind} {message!r}"
