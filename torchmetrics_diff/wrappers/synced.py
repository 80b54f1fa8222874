"""``Synced``: any torchmetrics metric, its states synced through our engine (one collective), with exact gradients.

The adapter reads a torchmetrics metric's state registry (names, defaults, ``dist_reduce_fx``, persistence) and
declares the same states on itself, so the whole :class:`~torchmetrics_diff.Metric` lifecycle applies: the sync
engine (one collective per sync in the steady state, for one metric or a whole
:class:`~torchmetrics_diff.MetricCollection`), ``forward`` with ``dist_sync_on_step`` as a global-batch loss whose
DDP gradient is exact under ``grad_reduction``, the every-rank errors, ``state_dict``, copies and the wrappers.
The torchmetrics metric is kept as a child module and only lends its maths: ``update`` and ``compute`` run its
class's own (unwrapped) methods on our states, so torchmetrics never counts, caches or syncs anything itself.
See :doc:`/guide/torchmetrics_adapter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, cast

import torch

from torchmetrics_diff._state_sync import ItemReduction
from torchmetrics_diff.metric import Metric
from torchmetrics_diff.wrappers import _synced_special as special

#: the torchmetrics releases whose ``Metric`` internals (``_defaults``, ``_reductions``, ``_persistent``, the
#: per-instance wrapping of ``update``/``compute``, the ``dim_zero_*`` reductions) the adapter knows
SUPPORTED_TORCHMETRICS = ">=1.3,<2.0"
_OLDEST, _BEYOND = (1, 3), (2,)

# our Metric's constructor arguments: Synced takes them, the torchmetrics constructor gets the others
_OUR_KWARGS = (
    "dist_sync_on_step",
    "sync_on_compute",
    "process_group",
    "dist_sync_fn",
    "compute_on_cpu",
    "compute_with_cache",
    "grad_reduction",
    "distributed_available_fn",
)
# settings of a torchmetrics instance that mean the same here: its values are the adapter's defaults
_INHERITED = ("dist_sync_on_step", "sync_on_compute", "process_group", "compute_on_cpu", "compute_with_cache")

# torchmetrics.Metric methods the adapter relies on (or replaces by ours): a metric class overriding one of them
# changes what a sync, a step or a reset means, which the adapter cannot know. The overrides whose work the adapter
# does itself (the FID family's reset, MeanAveragePrecision's sync and device moves) are in _synced_special.HANDLED
_MACHINERY = {
    "forward": "it overrides `forward` (its step is not update-then-compute)",
    "reset": "it overrides `reset` (some states survive a reset)",
    "_sync_dist": "it overrides `_sync_dist` (its states do not sync by their reductions)",
    "sync": "it overrides `sync`",
    "unsync": "it overrides `unsync`",
    "sync_context": "it overrides `sync_context`",
    "_reduce_states": "it overrides `_reduce_states` (its states do not merge by their reductions)",
    "merge_state": "it overrides `merge_state` (its states do not merge by their reductions)",
    "_apply": "it overrides `_apply` (it keeps states that device moves must reach by other means)",
    "_wrap_update": "it overrides `_wrap_update`",
    "_wrap_compute": "it overrides `_wrap_compute`",
}


def torchmetrics_module() -> Any:
    """``torchmetrics``, imported, after checking that its version is one the adapter supports.

    Raises:
        ModuleNotFoundError: torchmetrics is not installed.
        ImportError: the installed torchmetrics is outside
            :data:`~torchmetrics_diff.wrappers.synced.SUPPORTED_TORCHMETRICS`.
    """
    try:
        import torchmetrics
    except ModuleNotFoundError as err:  # pragma: no cover - torchmetrics is a test dependency
        raise ModuleNotFoundError(
            f"Synced adapts torchmetrics metrics and needs torchmetrics{SUPPORTED_TORCHMETRICS}: "
            "install a torchmetrics release in that range"
        ) from err
    from packaging.version import InvalidVersion, Version

    installed = str(getattr(torchmetrics, "__version__", "unknown"))
    try:
        release = Version(installed).release
    except InvalidVersion:
        release = ()
    if not (_OLDEST <= release < _BEYOND):
        raise ImportError(
            f"Synced supports torchmetrics{SUPPORTED_TORCHMETRICS}; torchmetrics {installed} is installed. Its "
            "Metric internals (state registry, wrapped update/compute) are not known to this torchmetrics_diff: "
            f"install a torchmetrics release in {SUPPORTED_TORCHMETRICS}"
        )
    return torchmetrics


def _refusal(tm: Any, cls: type) -> str | None:
    """Why the torchmetrics metric class ``cls`` cannot be adapted, or ``None`` when it can."""
    if issubclass(cls, Metric):
        return "it is already a torchmetrics_diff metric: use it directly"
    if issubclass(cls, tm.MetricCollection):
        return (
            "it is a torchmetrics MetricCollection: adapt each member and put them in a "
            "torchmetrics_diff.MetricCollection (one sync for all of them)"
        )
    if not issubclass(cls, tm.Metric):
        return "it is not a torchmetrics.Metric"
    wrapper = getattr(getattr(tm, "wrappers", None), "abstract", None)
    wrapper_cls = getattr(wrapper, "WrapperMetric", None)
    composition = getattr(tm.metric, "CompositionalMetric", None)
    if any(base is not None and issubclass(cls, base) for base in (wrapper_cls, composition)):
        return (
            "it is made of other torchmetrics metrics (a wrapper or a composition): adapt the inner metrics and "
            "use torchmetrics_diff's wrappers or arithmetic on the adapted metrics"
        )
    overridden = [
        why for name, why in _MACHINERY.items() if _overrides(tm.Metric, cls, name) and not special.handled(cls, name)
    ]
    if overridden:
        return "; ".join(overridden)
    return None


def _overrides(base: type, cls: type, name: str) -> bool:
    mine = getattr(cls, name, None)
    return mine is not None and mine is not getattr(base, name, None)


@dataclass(frozen=True)
class _GatheredItems(ItemReduction):
    """A torchmetrics list state whose ``dist_reduce_fx`` is not ``dim_zero_cat`` (``None`` or a callable), synced
    as torchmetrics' own sync leaves it.

    torchmetrics gathers such a list item by item: every rank's first item (in rank order), then every rank's
    second, and so on, each with its own shape; ``None`` keeps that list, a callable receives it and its result
    is the state. No item on any rank leaves the empty list (torchmetrics reduces nothing then).
    """

    fx: Callable | None

    def __call__(self, ranks: list[list[torch.Tensor]]) -> Any:
        depth = max((len(items) for items in ranks), default=0)
        gathered = [items[i] for i in range(depth) for items in ranks if i < len(items)]
        return gathered if self.fx is None or not gathered else self.fx(gathered)


def _reduction(tm: Any, fx: Any, listed: bool = False) -> str | Callable | None:
    """Our reduction for a torchmetrics ``dist_reduce_fx`` (its ``dim_zero_*`` functions compared by identity).

    A tensor state's ``dim_zero_*`` becomes its name, any other callable is kept as it is (the slower gather path)
    and ``None`` stays ``None``. A list state (``listed``) with ``dim_zero_cat`` is ``"cat"``; with anything else
    it syncs item by item, as torchmetrics gathers it (:class:`_GatheredItems`).
    """
    data = tm.utilities.data
    if listed:
        return "cat" if fx is data.dim_zero_cat else _GatheredItems(fx)
    for name in ("sum", "mean", "cat", "max", "min"):
        if fx is getattr(data, f"dim_zero_{name}", None):
            return name
    return fx


def _same_default(ours: Any, theirs: Any) -> bool:
    """Whether torchmetrics' default ``theirs`` declares what our ``ours`` does (device moves and ``set_dtype``
    give torchmetrics new default objects, not new states)."""
    if not isinstance(ours, torch.Tensor) or not isinstance(theirs, torch.Tensor):
        return isinstance(ours, list) and isinstance(theirs, list) and not theirs
    return ours.shape == theirs.shape and ours.dtype == theirs.dtype and bool(torch.equal(ours, theirs.to(ours.device)))


def _tensors(args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensor arguments of an ``update`` call (at the top level) that have a first dimension."""
    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.ndim > 0]


def _without_rows(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether an ``update`` call has tensor arguments and all of them have zero rows (first dimension 0)."""
    tensors = _tensors(args, kwargs)
    return bool(tensors) and all(t.shape[0] == 0 for t in tensors)


def _squeezed(value: Any) -> Any:
    """torchmetrics' ``compute`` result convention: a one-element tensor is returned as a 0-d tensor."""
    if isinstance(value, torch.Tensor):
        return value.squeeze() if value.numel() == 1 else value
    if isinstance(value, dict):
        return {k: _squeezed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_squeezed(v) for v in value)
    return value


def _check_default(owner: str, name: str, default: Any) -> None:
    """Refuse a torchmetrics state whose default is neither a tensor nor an empty list (``TypeError``)."""
    if not (isinstance(default, torch.Tensor) or (isinstance(default, list) and not default)):
        raise TypeError(
            f"Synced cannot adapt {owner}: its state {name!r} has default {default!r}; expected a tensor or an "
            "empty list"
        )


def _kept(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return [v.detach().clone() for v in value]


_CLASSES: dict[type, type] = {}


def _adapted_class(inner_cls: type) -> type[Synced]:
    """The subclass of :class:`Synced` for torchmetrics class ``inner_cls`` (made once): its name and class
    attributes (``higher_is_better``, ``is_differentiable``, ``full_state_update``, the plot bounds) are the
    torchmetrics class's, so collections key it, trackers rank it and plots label it as torchmetrics does."""
    cls = _CLASSES.get(inner_cls)
    if cls is None:
        attrs: dict[str, Any] = {
            name: getattr(inner_cls, name, None)
            for name in ("is_differentiable", "higher_is_better", "plot_lower_bound", "plot_upper_bound")
        }
        attrs["plot_legend_name"] = getattr(inner_cls, "plot_legend_name", None)
        # torchmetrics leaves it None where a class does not say: then update may read the accumulated states,
        # and a step replays update on them rather than merging by reductions (as torchmetrics' forward does)
        full = getattr(inner_cls, "full_state_update", None)
        attrs["full_state_update"] = True if full is None else bool(full)
        attrs["__module__"] = __name__
        attrs["__qualname__"] = f"Synced[{inner_cls.__qualname__}]"
        attrs["__doc__"] = f"torchmetrics' {inner_cls.__qualname__}, synced by torchmetrics_diff (see Synced)."
        cls = type(inner_cls.__name__, (Synced,), attrs)
        _CLASSES[inner_cls] = cls
    return cast("type[Synced]", cls)


def _revive(inner_cls: type) -> Synced:
    """Unpickling: an empty instance of the adapted class of ``inner_cls`` (its state follows)."""
    return object.__new__(_adapted_class(inner_cls))


class Synced(Metric):
    """A torchmetrics metric whose states sync through torchmetrics_diff's engine, with exact DDP gradients.

    ``Synced(metric)`` takes a ``torchmetrics.Metric`` instance (and owns it from then on), or a class and its
    constructor arguments. The result is a :class:`~torchmetrics_diff.Metric` named as the torchmetrics class,
    with its states, reductions, ``higher_is_better``, ``is_differentiable`` and plot; ``update`` and
    ``compute`` are the torchmetrics class's own maths, run on the adapter's states. Everything else is ours:
    a sync costs one collective in the steady state (one for a whole
    :class:`~torchmetrics_diff.MetricCollection` of adapted metrics), ``forward`` with ``dist_sync_on_step=True``
    returns the global-batch value whose DDP gradient is exact under ``grad_reduction``, ranks that disagree
    raise on every rank.

    A state whose ``dist_reduce_fx`` is torchmetrics' ``dim_zero_sum``/``mean``/``max``/``min``/``cat`` (or
    the names) is reduced or concatenated by the engine; a tensor state with ``None`` or another callable
    receives every rank's values stacked on a new dim 0, as torchmetrics hands them over, after a gather (slower:
    the values travel as rows of the gather, not in an all-reduce). List states reach torchmetrics' ``compute``
    as torchmetrics' own sync leaves them: synced, a ``cat`` list is one tensor of every rank's rows, a ``None``
    list every rank's items in torchmetrics' gather order (a callable receives those); unsynced, the list of
    items as appended. States that torchmetrics' ``update`` declares (``add_state``) are declared on the adapter
    too; a batch without rows that torchmetrics' ``update`` refuses adds nothing.

    Args:
        metric: a torchmetrics metric instance, or a torchmetrics metric class.
        args: the class's positional constructor arguments (only with a class).
        kwargs: :class:`~torchmetrics_diff.Metric`'s keyword arguments (``dist_sync_on_step``,
            ``sync_on_compute``, ``process_group``, ``dist_sync_fn``, ``compute_on_cpu``, ``compute_with_cache``,
            ``grad_reduction``, ``distributed_available_fn``); with a class, the others go to its constructor.
            Those of the five that an instance has itself (``dist_sync_on_step``, ``sync_on_compute``,
            ``process_group``, ``compute_on_cpu``, ``compute_with_cache``) default to the instance's values.

    Raises:
        TypeError: ``metric`` cannot be adapted (the message names it and says why): not a torchmetrics metric,
            a torchmetrics collection, wrapper or composition, a class that overrides torchmetrics' sync, reset
            or step machinery (but for the FID family's ``reset`` and ``MeanAveragePrecision``'s sync, which the
            adapter does itself), ``MeanAveragePrecision(iou_type="segm")``, a state that is neither a tensor nor
            a list, or constructor arguments given with an instance.
        ImportError: the installed torchmetrics is outside
            :data:`~torchmetrics_diff.wrappers.synced.SUPPORTED_TORCHMETRICS`.

    Example:
        >>> import torch
        >>> from torchmetrics.image import PeakSignalNoiseRatio
        >>> from torchmetrics_diff.wrappers import Synced
        >>> psnr = Synced(PeakSignalNoiseRatio, data_range=1.0)
        >>> psnr
        Synced(PeakSignalNoiseRatio())
        >>> preds, target = torch.full((1, 1, 2, 2), 0.5), torch.full((1, 1, 2, 2), 0.6)
        >>> psnr.update(preds, target)
        >>> round(psnr.compute().item(), 4)
        20.0
    """

    full_state_update: ClassVar[bool | None] = True  # (each adapted class sets the torchmetrics class's)
    metric: Any  # the torchmetrics metric (a child module): its maths, never its states

    def __new__(cls, metric: Any = None, *args: Any, **kwargs: Any) -> Synced:
        if cls is Synced:  # Synced(...) makes an instance of the adapted class of the torchmetrics class
            tm = torchmetrics_module()
            inner_cls = metric if isinstance(metric, type) else type(metric)
            why = _refusal(tm, inner_cls)
            if why is not None:
                raise TypeError(f"Synced cannot adapt {inner_cls.__qualname__}: {why}")
            cls = _adapted_class(inner_cls)
        return super().__new__(cls)

    def __init__(self, metric: Any, *args: Any, **kwargs: Any) -> None:
        tm = torchmetrics_module()
        ours = {name: kwargs.pop(name) for name in _OUR_KWARGS if name in kwargs}
        if isinstance(metric, type):
            inner = metric(*args, **kwargs)
        elif args or kwargs:
            raise TypeError(
                f"Synced got constructor arguments {sorted(kwargs) or list(args)} with an instance of "
                f"{type(metric).__qualname__}: pass the class with its arguments, or the instance alone"
            )
        else:
            inner = metric
        if _CLASSES.get(type(inner)) is not type(self):
            raise TypeError(f"Synced cannot adapt {type(inner).__qualname__}: build it as Synced(metric)")
        for name in _INHERITED:
            ours.setdefault(name, getattr(inner, name))
        super().__init__(**ours)
        self._adopt(tm, inner)

    def _adopt(self, tm: Any, inner: Any) -> None:
        """Declare the torchmetrics metric's states on the adapter and keep the metric as a child module."""
        owner = type(inner).__qualname__
        registry = [getattr(inner, name, None) for name in ("_defaults", "_reductions", "_persistent")]
        if not all(isinstance(r, dict) for r in registry):
            raise TypeError(
                f"Synced cannot adapt {owner}: it has no torchmetrics state registry (`_defaults`, `_reductions`, "
                f"`_persistent`); torchmetrics {tm.__version__} is not laid out as torchmetrics"
                f"{SUPPORTED_TORCHMETRICS}"
            )
        defaults, reductions, persistent = cast("list[dict[str, Any]]", registry)
        children = [n for n, m in inner.named_modules() if m is not inner and isinstance(m, tm.Metric)]
        if children:
            raise TypeError(
                f"Synced cannot adapt {owner}: it holds torchmetrics metrics ({children}) whose states are not in "
                "its own registry; adapt those metrics instead"
            )
        for name, default in defaults.items():
            _check_default(owner, name, default)
        why = special.instance_refusal(inner)
        if why is not None:
            raise TypeError(f"Synced cannot adapt {owner}: {why}")
        self.metric = inner
        for name, default in defaults.items():
            self._declare(tm, name, default, reductions[name], persistent[name])
        # an instance that was already updated keeps what it accumulated (copies: the inner metric keeps none)
        self._set_states({n: _copied(getattr(inner, n)) for n in defaults})
        self._update_count = int(getattr(inner, "_update_count", 0))
        inner.persistent(False)  # the adapter saves the states (under their own names) in state_dict
        # the torchmetrics defaults declared so far (compared by identity after each update: see _follow)
        self.__dict__["_mirrored"] = dict(defaults)
        self.__dict__["_redeclared"] = ()
        self._release()

    def _declare(self, tm: Any, name: str, default: Any, fx: Any, persistent: bool) -> None:
        """Declare torchmetrics' state ``name`` on the adapter (again, when its ``update`` re-declares it)."""
        try:
            self.add_state(
                name, default, dist_reduce_fx=_reduction(tm, fx, isinstance(default, list)), persistent=persistent
            )
        except ValueError as err:
            raise TypeError(f"Synced cannot adapt {type(self._inner).__qualname__}: its state {name!r}: {err}") from err

    def _follow(self) -> None:
        """Declare on the adapter the states torchmetrics' ``update`` has just declared or re-declared.

        torchmetrics' ``add_state`` stores a new default object each time (``MeanIoU(num_classes=None)`` declares
        its per-class states on the first batch), so an unchanged registry costs one identity check per state.
        A re-declared state takes the new default; its value is what the update left. The names land in
        ``_redeclared`` (for :meth:`_update_batch`).
        """
        inner = self._inner
        theirs: dict[str, Any] = inner._defaults
        mirrored: dict[str, Any] = self.__dict__["_mirrored"]
        if len(theirs) == len(mirrored) and all(theirs.get(n) is d for n, d in mirrored.items()):
            return
        tm = torchmetrics_module()
        owner = type(inner).__qualname__
        redeclared = []
        for name, default in theirs.items():
            fx = inner._reductions[name]
            if (
                name in self._defaults
                and _same_default(self._defaults[name], default)
                and self._reductions[name] == _reduction(tm, fx, isinstance(default, list))
            ):
                continue
            _check_default(owner, name, default)
            self._declare(tm, name, default, fx, bool(inner._persistent[name]))
            inner._persistent[name] = False  # (the adapter saves it)
            redeclared.append(name)
        self.__dict__["_mirrored"] = dict(theirs)
        self.__dict__["_redeclared"] = tuple(redeclared)

    # ------------------------------------------------------------------ lending our states to torchmetrics' maths
    @property
    def _inner(self) -> Any:
        """The torchmetrics metric (the child module ``metric``)."""
        return self._modules["metric"]

    def _release(self) -> None:
        """Point the torchmetrics metric's states at its defaults again: it never keeps ours (nor their graph)."""
        inner = self._inner
        inner.__dict__.update({n: inner._defaults[n] for n in self._defaults})

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Fold a batch into the states with the torchmetrics metric's own ``update``.

        A batch without rows (every tensor argument has a first dimension of 0) that torchmetrics' ``update``
        refuses (SSIM raises an ``IndexError``) adds nothing: the states stay as they were, so a rank whose last
        batch is empty syncs as the others do. States that ``update`` declares or re-declares (``add_state``) are
        declared on the adapter too.

        Args:
            args: the batch, as the torchmetrics metric's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the torchmetrics metric's ``update`` takes them.
        """
        inner = self._inner
        state = self.__dict__
        state["_redeclared"] = ()
        empty = self._snapshot() if _without_rows(args, kwargs) else None  # (undoes a refused empty batch)
        lent = inner.__dict__
        lent.update(self.metric_state)
        try:
            try:
                type(inner).update(inner, *args, **kwargs)  # the class's function: torchmetrics' wrapper never runs
            except Exception:
                if empty is None:
                    raise
                refused = True
            else:
                refused = False
            finally:
                self._follow()
            if refused:
                self._restore(empty)
                self._keep_graph(args, kwargs)
            else:
                self._set_states({name: lent[name] for name in self._defaults})
        finally:
            self._release()

    def _keep_graph(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """After a refused empty batch: tie the floating-point tensor states to the batch's inputs that require
        grad (adding zero), so that a synced ``forward`` still has a graph there and ``backward`` runs on that
        rank, as DDP needs on every rank. The values do not change."""
        if not torch.is_grad_enabled():
            return
        inputs = [t for t in _tensors(args, kwargs) if t.requires_grad]
        if not inputs:
            return
        zero = sum(t.sum() for t in inputs) * 0
        self._set_states(
            {
                name: value + cast(torch.Tensor, zero).to(value.device, value.dtype)
                for name, value in self.metric_state.items()
                if isinstance(value, torch.Tensor) and value.is_floating_point()
            }
        )

    def compute(self) -> Any:
        """The torchmetrics metric's ``compute`` on the (synced) states; one-element tensors as 0-d tensors.

        An attribute that torchmetrics' ``compute`` reads and only its ``update`` sets (FID's ``orig_dtype``, the
        features' dtype) is lent the metric's dtype on a rank that never updated, for that call.
        """
        inner = self._inner
        lent = special.missing_attributes(inner)
        inner.__dict__.update(self.metric_state, **dict.fromkeys(lent, self.dtype))
        try:
            return _squeezed(type(inner).compute(inner))
        finally:
            for name in lent:
                del inner.__dict__[name]
            self._release()

    # ------------------------------------------------------------------ syncing as torchmetrics syncs
    def _torchmetrics_form(self, synced: dict[str, Any]) -> dict[str, Any]:
        """``synced`` as torchmetrics' own sync leaves it for its ``compute``: a ``cat`` list state becomes one
        tensor of every rank's rows (``dim_zero_cat``; an empty one of the metric's dtype when no rank has a row),
        where the engine gives a one-element list. (A list state with another reduction comes back from the
        engine as torchmetrics leaves it already, see :class:`_GatheredItems`.)"""
        from torchmetrics.utilities.data import dim_zero_cat

        out = dict(synced)
        for name in self._list_states:
            value = out.get(name)
            if self._reductions[name] == "cat" and isinstance(value, list):
                out[name] = (
                    dim_zero_cat(value) if value else torch.zeros(0, dtype=self._inner.dtype, device=self.device)
                )
        return out

    def _hold_synced(self, local: dict[str, Any], synced: dict[str, Any]) -> None:
        """Hold the synced states in torchmetrics' form (:meth:`_torchmetrics_form`) until ``unsync``."""
        super()._hold_synced(local, self._torchmetrics_form(synced))

    def _update_batch(self, step: Any, args: tuple, kwargs: dict[str, Any], announce: bool = True) -> None:
        """Our batch update; a state the batch re-declared starts the accumulated side from its new default, as
        torchmetrics' ``add_state`` does (what was accumulated under the old declaration is dropped)."""
        try:
            super()._update_batch(step, args, kwargs, announce)
        finally:
            for name in self.__dict__["_redeclared"]:
                step.accumulated[name] = self._fresh(self._defaults[name])

    def _sync_batch(self, step: Any, synced: dict[str, Any] | None = None) -> None:
        """Sync the batch states; the batch value sees them in torchmetrics' form (:meth:`_torchmetrics_form`)."""
        super()._sync_batch(step, synced)
        if self._list_states:
            self._set_states(self._torchmetrics_form(self.metric_state))

    def reset(self) -> None:
        """Our reset; a synced adapter first puts its local states back (the synced ones are in torchmetrics'
        form, whose ``cat`` lists are tensors). The states torchmetrics' ``reset`` keeps (the FID family's real
        features with ``reset_real_features=False``) keep their local values, as torchmetrics keeps them."""
        if self._synced_cache is not None:
            self._set_states(self._synced_cache)
        # (our reset empties lists in place and gives tensor states new objects: keep a list's items, a tensor)
        kept = {n: _kept(getattr(self, n)) for n in special.kept_by_reset(self._inner)}
        super().reset()
        self._set_states(kept)

    # ------------------------------------------------------------------ the rest of the protocol
    def _same_update(self, other: Metric) -> bool:
        """Compute groups: the same torchmetrics ``update`` and the same states."""
        return (
            isinstance(other, Synced)
            and type(other._inner).update is type(self._inner).update
            and super()._same_update(other)
        )

    def _filter_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments the torchmetrics metric's ``update`` accepts."""
        return cast("dict[str, Any]", self._inner._filter_kwargs(**kwargs))

    def set_dtype(self, dst_type: str | torch.dtype) -> Synced:
        """Cast the floating-point states (and the torchmetrics metric's) to ``dst_type`` (float32 or float64).

        Args:
            dst_type: ``torch.float32`` or ``torch.float64`` (or their names).
        """
        super().set_dtype(dst_type)
        inner = self._inner
        inner.set_dtype(self.dtype)  # (FID's casts its extractor too)
        # torchmetrics casts every default, integer ones too, into new objects: no state is declared anew (our
        # integer states stay integer), so that a rank that never updates afterwards agrees with those that do
        self.__dict__["_mirrored"] = dict(inner._defaults)
        self._release()
        return self

    def plot(self, val: Any = None, ax: Any = None) -> tuple[Any, Any]:
        """torchmetrics' plot of the metric (the same picture), for ``val`` or :meth:`compute`.

        Args:
            val: a value as ``forward`` or ``compute`` return it, or a sequence of such values; ``None`` plots
                :meth:`compute`.
            ax: a matplotlib ``Axes`` to draw into; ``None`` makes a new figure.

        Returns:
            ``(figure, axes)``.
        """
        val = val if val is not None else self.compute()
        inner = self._inner
        if not _overrides(torchmetrics_module().Metric, type(inner), "plot"):
            return super().plot(val, ax)
        return cast("tuple[Any, Any]", type(inner).plot(inner, val, ax))

    def __repr__(self) -> str:
        return f"Synced({self._inner!r})"

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # the adapted class is made at run time: unpickling makes it again from the torchmetrics class
        return (_revive, (type(self._inner),), self.__getstate__())
