"""The torchmetrics classes that override ``Metric`` machinery and that :class:`~.synced.Synced` adapts anyway.

``Synced`` refuses a class that overrides one of torchmetrics' sync, reset or step methods (``_MACHINERY`` in
``synced.py``): the state registry does not say what the override does. The overrides listed here are known, and
the adapter does their work itself:

* the FID family (``FrechetInceptionDistance``, ``KernelInceptionDistance``,
  ``MemorizationInformedFrechetInceptionDistance``) overrides ``reset`` to keep the real images' features when
  ``reset_real_features=False``: the adapter's ``reset`` keeps the same states (:func:`kept_by_reset`). The
  feature extractor is a submodule, never a state: device moves reach it as they reach any submodule, no sync
  sends it. FID and MIFID's ``compute`` reads ``orig_dtype``, an attribute their ``update`` sets, so a rank that
  never updated computes in the metric's dtype instead of raising (:func:`missing_attributes`);
* ``MeanAveragePrecision`` overrides ``_sync_dist`` and ``_apply`` for its mask states, which hold pycocotools'
  run-length encodings (tuples of bytes, not tensors) with ``iou_type="segm"``: gathered with
  ``all_gather_object``, and kept out of device moves. With ``iou_type="bbox"`` the mask states stay empty, the
  overrides do nothing more than the base class, and every state is a list of one tensor per image, synced by
  the engine item by item (the ``None`` reduction). ``"segm"`` is refused (:func:`instance_refusal`).

An override is recognised by the class that defines it, so a subclass that overrides the method again is refused.
"""

from __future__ import annotations

from typing import Any

_FID = "torchmetrics.image.fid.FrechetInceptionDistance"
_KID = "torchmetrics.image.kid.KernelInceptionDistance"
_MIFID = "torchmetrics.image.mifid.MemorizationInformedFrechetInceptionDistance"
_MAP = "torchmetrics.detection.mean_ap.MeanAveragePrecision"

#: the class defining an override -> the overridden methods whose work the adapter does itself
HANDLED: dict[str, frozenset[str]] = {
    _FID: frozenset({"reset"}),
    _KID: frozenset({"reset"}),
    _MIFID: frozenset({"reset"}),
    _MAP: frozenset({"_sync_dist", "_apply"}),
}

#: the class defining ``reset`` -> the states its ``reset`` keeps when ``reset_real_features`` is False
_KEPT = {
    _FID: ("real_features_sum", "real_features_cov_sum", "real_features_num_samples"),
    _KID: ("real_features",),
    _MIFID: ("real_features",),
}

#: the class defining ``compute`` -> the attributes its ``update`` sets and its ``compute`` reads (the features'
#: dtype, which the value is cast to: on a rank that never updated, the adapter lends the metric's dtype)
_SET_BY_UPDATE = {_FID: ("orig_dtype",), _MIFID: ("orig_dtype",)}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _definer(cls: type, name: str) -> str | None:
    """The qualified name of the class in ``cls``'s MRO that defines ``name``."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return _qualname(klass)
    return None


def handled(cls: type, name: str) -> bool:
    """Whether ``cls``'s override of torchmetrics' ``name`` is one the adapter knows and replaces."""
    definer = _definer(cls, name)
    return definer is not None and name in HANDLED.get(definer, frozenset())


def instance_refusal(inner: Any) -> str | None:
    """Why the torchmetrics metric ``inner`` cannot be adapted although its class can, or ``None``."""
    if _definer(type(inner), "_sync_dist") != _MAP:
        return None
    iou_type = inner.iou_type
    if "segm" in ((iou_type,) if isinstance(iou_type, str) else tuple(iou_type)):  # (a tuple since torchmetrics 1.3)
        return (
            "iou_type='segm' is not supported: its mask states hold pycocotools' run-length encodings (tuples of "
            "bytes, not tensors), which torchmetrics gathers with all_gather_object and this package's sync "
            "engine, which moves tensors, cannot carry; use iou_type='bbox', or torchmetrics' own metric for masks"
        )
    return None


def kept_by_reset(inner: Any) -> tuple[str, ...]:
    """The states that torchmetrics' ``reset`` of ``inner`` keeps (the real features of the FID family when
    ``reset_real_features`` is False); ``()`` for a class whose ``reset`` is torchmetrics' own."""
    names = _KEPT.get(_definer(type(inner), "reset") or "", ())
    return names if names and getattr(inner, "reset_real_features", True) is False else ()


def missing_attributes(inner: Any) -> tuple[str, ...]:
    """The attributes that ``inner``'s ``compute`` reads but only its ``update`` sets, and that are not set (this
    rank never updated)."""
    names = _SET_BY_UPDATE.get(_definer(type(inner), "compute") or "", ())
    return tuple(name for name in names if name not in vars(inner))
