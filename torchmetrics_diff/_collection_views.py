"""One tensor-valued metric per entry of a dict-valued member: what ``MetricCollection.items()`` hands to loggers.

Lightning's ``self.log_dict(collection)`` logs each ``(key, metric)`` pair of ``collection.items()`` as a metric
object: ``metric._forward_cache`` on step, ``metric.compute()`` on epoch (which must be a tensor), and
``metric.reset()`` at the end of the epoch. A member whose value is a dict (a cross-modal retrieval metric, a
:class:`~torchmetrics_diff.wrappers.ClasswiseWrapper`) cannot be logged whole; a :class:`ValueView` stands for one
of its entries, under the key that entry has in the collection's flattened results. The views of a member share
one :class:`_SharedValue`: the first view computed in a round computes the member (its one sync over the ranks)
and its siblings read their entries from that value, so the member is computed once per epoch, not once per key.

A member declares the keys of its value with ``result_keys()`` (see :class:`ResultKeys`) so that its views exist
before any value does: Lightning looks a logged metric up among the module's ``named_modules()`` by identity, once
per ``fit``/``validate`` call, so a view must be in place and stable from the first ``self.log`` of that call on.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from torchmetrics_diff.metric import Metric


@runtime_checkable
class ResultKeys(Protocol):
    """A metric whose ``compute`` and ``forward`` return a dict, and which knows that dict's keys in advance."""

    def result_keys(self) -> list[str] | None:
        """The keys of the value, in order, or ``None`` where they depend on the data."""
        ...


def declared_keys(metric: Metric) -> list[str] | None:
    """The keys ``metric`` declares for its dict value, or ``None`` (a tensor value, or keys not known yet)."""
    if not isinstance(metric, ResultKeys):
        return None
    keys = metric.result_keys()
    if keys is None:
        return None
    keys = list(keys)
    if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise ValueError(f"{type(metric).__name__}.result_keys() must return distinct strings; got {keys!r}")
    return keys


_REGISTERED = False


def register_views_with_torchmetrics() -> bool:
    """Make :class:`ValueView` ``isinstance(view, torchmetrics.Metric)`` once torchmetrics is imported (as
    :func:`~torchmetrics_diff.metric.register_with_torchmetrics` does for metrics). Returns whether it is."""
    global _REGISTERED
    if _REGISTERED:
        return True
    base = getattr(sys.modules.get("torchmetrics"), "Metric", None)
    if base is None or not hasattr(base, "register"):
        return False
    base.register(ValueView)
    _REGISTERED = True
    return True


class _SharedValue:
    """A member's last value, computed once for all its views: each view takes its entry once per round."""

    __slots__ = ("count", "keys", "member", "name", "pending", "value")

    def __init__(self, member: Metric, name: str, keys: list[str]) -> None:
        self.member = member
        self.name = name
        self.keys = keys
        self.value: dict[str, Any] = {}
        self.pending: set[str] = set()
        self.count = -1

    def take(self, key: str) -> Any:
        """``key``'s entry: of the value computed in this round when ``key`` has not read it yet and the member
        was not updated since, else of a new ``compute()`` (every view reading it once more)."""
        if key not in self.pending or self.member.update_count != self.count:
            value = self.member.compute()
            if not isinstance(value, dict) or set(value) != set(self.keys):
                got = list(value) if isinstance(value, dict) else type(value).__name__
                raise ValueError(
                    f"member {self.name!r} ({type(self.member).__name__}) declared the keys {self.keys} in "
                    f"result_keys(), but its compute() returned {got}"
                )
            self.value, self.pending, self.count = value, set(value), self.member.update_count
        self.pending.discard(key)
        return self.value[key]

    def clear(self) -> None:
        self.value, self.pending, self.count = {}, set(), -1


class ValueView(nn.Module):
    """One entry of a dict-valued member of a :class:`~torchmetrics_diff.MetricCollection`, as a tensor-valued
    metric: ``compute()`` is the entry of the member's ``compute()``, ``_forward_cache`` the entry of its last
    ``forward`` value, ``reset()`` resets the member. It holds no state of its own (nothing in ``state_dict``) and
    is not updated itself: update the collection or the member.

    Example:
        >>> import torch
        >>> from torchmetrics_diff import MetricCollection
        >>> from torchmetrics_diff.retrieval import CrossModalMeanRank, CrossModalMRR
        >>> metrics = MetricCollection({"mrr": CrossModalMRR(), "rank": CrossModalMeanRank()}, prefix="val/")
        >>> metrics.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.1], [1.0, 0.0]]))
        >>> [(key, type(m).__name__) for key, m in metrics.items()]  # doctest: +NORMALIZE_WHITESPACE
        [('val/i2t_MRR', 'ValueView'), ('val/t2i_MRR', 'ValueView'),
         ('val/i2t_mean_rank', 'ValueView'), ('val/t2i_mean_rank', 'ValueView')]
        >>> dict(metrics.items())["val/t2i_MRR"].compute()
        tensor(0.7500)
    """

    _shared: _SharedValue

    def __init__(self, shared: _SharedValue, key: str) -> None:
        super().__init__()
        self.__dict__["_shared"] = shared  # the member is the collection's submodule, not this view's
        self.key = key
        register_views_with_torchmetrics()

    @property
    def member(self) -> Metric:
        """The member whose entry this is."""
        return self._shared.member

    @property
    def _forward_cache(self) -> Any:
        value = self._shared.member._forward_cache
        return value.get(self.key) if isinstance(value, dict) else None

    @property
    def device(self) -> torch.device:
        """The member's device."""
        return self._shared.member.device

    @property
    def higher_is_better(self) -> bool | None:
        """The member's ``higher_is_better``."""
        return getattr(self._shared.member, "higher_is_better", None)

    def compute(self) -> Any:
        """The entry of the member's epoch value (the member syncs over the ranks once for all its entries)."""
        return self._shared.take(self.key)

    def reset(self) -> None:
        """Reset the member (every entry of it: the views of a member share its states)."""
        self._shared.clear()
        self._shared.member.reset()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Not available: a view reads a member; update the collection or the member."""
        raise TypeError(
            f"this is a view of the entry {self.key!r} of the collection member {self._shared.name!r}, which cannot "
            "be updated: update the collection (or the member) instead"
        )

    def forward(self, *args: Any, **kwargs: Any) -> None:
        """Not available, as :meth:`update`."""
        self.update(*args, **kwargs)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        register_views_with_torchmetrics()

    def extra_repr(self) -> str:
        return f"{self._shared.name}[{self.key!r}]"


def build_views(members: dict[str, Metric], keys: dict[str, list[str]]) -> dict[str, dict[str, ValueView]]:
    """For each member of ``keys``: its views by entry key, sharing one value."""
    out = {}
    for name, member_keys in keys.items():
        shared = _SharedValue(members[name], name, member_keys)
        out[name] = {key: ValueView(shared, key) for key in member_keys}
    return out


def clear_views(views: dict[str, dict[str, ValueView]]) -> None:
    """Forget the values the views hold (the members were reset)."""
    for by_key in views.values():
        for view in by_key.values():
            view._shared.clear()
