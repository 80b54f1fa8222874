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

from typing import Any, Callable, ClassVar, cast

import torch

from torchmetrics_diff.metric import Metric

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
# changes what a sync, a step or a reset means, which the adapter cannot know
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
    overridden = [why for name, why in _MACHINERY.items() if _overrides(tm.Metric, cls, name)]
    if overridden:
        return "; ".join(overridden)
    return None


def _overrides(base: type, cls: type, name: str) -> bool:
    mine = getattr(cls, name, None)
    return mine is not None and mine is not getattr(base, name, None)


def _reduction(tm: Any, fx: Any) -> str | Callable | None:
    """Our name for a torchmetrics ``dist_reduce_fx`` (its ``dim_zero_*`` functions, compared by identity); any
    other callable is kept as it is (the slower gather path), ``None`` stays ``None``."""
    data = tm.utilities.data
    for name in ("sum", "mean", "cat", "max", "min"):
        if fx is getattr(data, f"dim_zero_{name}", None):
            return name
    return fx


def _squeezed(value: Any) -> Any:
    """torchmetrics' ``compute`` result convention: a one-element tensor is returned as a 0-d tensor."""
    if isinstance(value, torch.Tensor):
        return value.squeeze() if value.numel() == 1 else value
    if isinstance(value, dict):
        return {k: _squeezed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_squeezed(v) for v in value)
    return value


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
    the names) is reduced or concatenated by the engine; one with ``None`` or another callable receives every
    rank's values stacked on a new dim 0 (a list state: one tensor per rank), as torchmetrics hands them over,
    after a gather (slower: the values travel as rows of the gather, not in an all-reduce).

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
            or step machinery, a state that is neither a tensor nor a list, or constructor arguments given
            with an instance.
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
            if not (isinstance(default, torch.Tensor) or (isinstance(default, list) and not default)):
                raise TypeError(
                    f"Synced cannot adapt {owner}: its state {name!r} has default {default!r}, neither a tensor "
                    "nor an empty list"
                )
        self.metric = inner
        for name, default in defaults.items():
            try:
                self.add_state(
                    name, default, dist_reduce_fx=_reduction(tm, reductions[name]), persistent=persistent[name]
                )
            except ValueError as err:
                raise TypeError(f"Synced cannot adapt {owner}: its state {name!r}: {err}") from err
        # an instance that was already updated keeps what it accumulated (copies: the inner metric keeps none)
        self._set_states({n: _copied(getattr(inner, n)) for n in defaults})
        self._update_count = int(getattr(inner, "_update_count", 0))
        inner.persistent(False)  # the adapter saves the states (under their own names) in state_dict
        self._release()

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

        Args:
            args: the batch, as the torchmetrics metric's ``update`` takes it.
            kwargs: the batch's keyword arguments, as the torchmetrics metric's ``update`` takes them.
        """
        inner = self._inner
        lent = inner.__dict__
        lent.update(self.metric_state)
        try:
            type(inner).update(inner, *args, **kwargs)  # the class's function: torchmetrics' wrapper never runs
            self._set_states({name: lent[name] for name in self._defaults})
        finally:
            self._release()

    def compute(self) -> Any:
        """The torchmetrics metric's ``compute`` on the (synced) states; one-element tensors as 0-d tensors."""
        inner = self._inner
        inner.__dict__.update(self.metric_state)
        try:
            return _squeezed(type(inner).compute(inner))
        finally:
            self._release()

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
        self._inner.set_dtype(self.dtype)
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
