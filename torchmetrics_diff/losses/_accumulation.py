"""The errors of the normalized losses' accumulation protocols: the ranks made different numbers of calls.

Inside :meth:`~torchmetrics_diff.losses.GlobalMeanLoss.accumulate` every call communicates, so every rank must
make as many; in :meth:`~torchmetrics_diff.losses.GlobalMeanLoss.flat_accumulation` every rank ends the same
steps. The blocks name their collectives apart (``"<Loss>.accumulate start"``, ``"<Loss>.accumulate"`` with the
calls made before, ``"<Loss>.accumulate end"`` with the calls made, ``"<Loss>.finish_step"``,
``"<Loss>.finish_step at exit"``), so ranks that break the protocol meet in a call header that differs, which
raises a :class:`~torchmetrics_diff.exceptions.RanksDisagreeError` on every rank alike, carrying what each group of
ranks was doing (``calls``). :func:`protocol_error` words it as the protocol's own error. Also the check of the
parameters a ``flat_accumulation()`` block rescales (:func:`block_parameters`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor, nn

from torchmetrics_diff.distributed._failure import ranks_text
from torchmetrics_diff.exceptions import AccumulationMismatchError, RanksDisagreeError

#: what every accumulation error ends with: the rule and the remedy
_PAD = (
    "a rank with fewer micro-batches pads with empty ones, (0, T) (no rows, e.g. targets of shape (0, T)), "
    "and lists them in `items` too"
)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


def plan_mismatch(owner: str, counts: Sequence[float]) -> str:
    """The message when the ranks' ``items`` planned different numbers of micro-batches (``counts``, by rank)."""
    by_count: dict[int, list[int]] = {}
    for rank, n in enumerate(counts):
        by_count.setdefault(round(n), []).append(rank)
    parts = [f"{ranks_text(ranks)}: {n}" for n, ranks in sorted(by_count.items(), key=lambda kv: kv[1][0])]
    return (
        f"{owner}.accumulate(): the ranks planned different numbers of micro-batches for the step "
        f"({'; '.join(parts)}). Every rank must make the same number of calls inside the block (each call "
        f"communicates): {_PAD}"
    )


def _doing(owner: str, name: str | None, count: int, flat: bool, counted: bool) -> str | None:
    """What a rank in the call ``name`` (its header's ``count``) was doing, or ``None``: not a call of the block.
    ``counted``: the block's calls carry the calls made before them (a loss whose calls are named ``forward``,
    such as ``LoadBalancingLoss``, counts them otherwise)."""
    if name is None:
        return None
    entry = name.split(": ", 1)[0]  # (the name of the operation follows the entry point's)
    if flat:
        return {
            f"{owner}.finish_step": "{was} finishing a step (finish_step())",
            f"{owner}.finish_step at exit": "{was} leaving the flat_accumulation() block (its loop had ended)",
        }.get(entry)
    return {
        f"{owner}.accumulate start": "{was} entering the next accumulate() block",
        f"{owner}.accumulate": f"had made {_calls(count)} and {{was}} making the {_ordinal(count + 1)}",
        f"{owner}.accumulate end": f"had made {_calls(count)} and {{was}} leaving the block"
        if counted
        else "{was} leaving the block",
        f"{owner}.forward": "{was} making a micro-batch call",
    }.get(entry)


def protocol_error(owner: str, err: RanksDisagreeError, *, flat: bool) -> AccumulationMismatchError | None:
    """``err`` (ranks in different calls) worded as the error of ``owner``'s accumulation protocol when every rank
    was in a call of the block (``flat``: a ``flat_accumulation()`` block, else an ``accumulate()`` block);
    ``None`` when some rank was elsewhere (``err`` says where)."""
    groups: Any = getattr(err, "calls", ())
    counted = not any(name is not None and name.startswith(f"{owner}.forward:") for _, name, _ in groups)
    parts = []
    for ranks, name, count in groups:
        doing = _doing(owner, name, count, flat, counted)
        if doing is None:
            return None
        parts.append(f"{ranks_text(ranks)} {doing.format(was='was' if len(ranks) == 1 else 'were')}")
    if not parts:
        return None
    if flat:
        return AccumulationMismatchError(
            f"{owner}.flat_accumulation(): the ranks are not at the same step: {'; '.join(parts)}. Every rank must "
            "call finish_step() at the same steps and leave the block together: a rank whose loop has fewer steps "
            "(or no micro-batch in a step) still ends each step with the others, running an empty micro-batch, "
            "(0, T), where DDP or FSDP needs its forward and backward"
        )
    return AccumulationMismatchError(
        f"{owner}.accumulate(): the ranks made different numbers of micro-batch calls in the step: "
        f"{'; '.join(parts)}. Every rank must make the same number of calls inside the block (each call "
        f"communicates): {_PAD}"
    )


def stalled(owner: str, calls: int, err: BaseException) -> str:
    """The message of a ``finish_step()`` whose collective ran out the group's timeout (``err``), on a rank that
    had made ``calls`` micro-batch calls in the step."""
    return (
        f"{owner}.finish_step(): the other ranks did not reach the end of the step within the group's timeout, "
        f"while this rank had made {_calls(calls)} in it. A peer is most likely waiting in another collective: "
        "under DDP every rank must run at least one micro-batch per step (a rank without one runs an empty one, "
        "(0, T), its last backward outside no_sync()), under FSDP every rank the same number. "
        f"The backend said: {err}"
    )


def block_parameters(params: Iterable[Tensor] | nn.Module) -> list[Tensor]:
    """The distinct tensors of ``params`` (a module: its parameters), or a ``ValueError`` naming what came."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    elif isinstance(params, Tensor):
        params = [params]
    listed: list[Tensor] = []
    seen: set[int] = set()
    for p in params:
        if not isinstance(p, Tensor):
            raise ValueError(
                "`params` must hold the parameters (tensors) whose gradients the micro-batches accumulate, e.g. "
                f"model.parameters(); got a {type(p).__name__} among them"
            )
        if id(p) not in seen:  # (a parameter listed twice is rescaled once)
            seen.add(id(p))
            listed.append(p)
    if not listed:
        raise ValueError("`params` must hold at least one parameter (e.g. model.parameters()); got none")
    return listed
