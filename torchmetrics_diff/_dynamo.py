"""``torch.compile`` support of the metric classes: what makes Dynamo cache their frames apart, and where they
step out of the graph.

:class:`~torchmetrics_diff.Metric` and :class:`~torchmetrics_diff.MetricCollection` call into this module at a
few fixed points (docs/guide/compile.rst has the whole picture):

- :func:`give_own_code`: each metric class runs its own copy of the lifecycle's code (:func:`own_code`), made
  when the class is created, so Dynamo caches and counts its compiled frames per class;
- :func:`wrap_lifecycle`: a subclass's own ``update``/``compute`` wrapped once in the lifecycle template;
- :func:`run_outside_graph`: the methods that run eagerly behind one graph break when a compiled step calls them
  with something to sync (a copy per class for the metrics, see :func:`give_own_code`); :func:`steps_outside_graph`
  says when ``forward`` does;
- :func:`set_aside_lists` and :func:`folded_lists`: how traced code keeps each list state one tensor.

The one question asked everywhere, :func:`~torchmetrics_diff.distributed._compile.compiling`, lives in
``distributed/_compile.py`` with the collectives' own support; this module knows metrics, that one tensors.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any, Callable

import torch

from torchmetrics_diff.distributed._compile import outside_graph
from torchmetrics_diff.distributed._reductions import as_rows

#: per base class, the methods it runs outside the graph: attribute -> the base's function (run_outside_graph)
_OUTSIDE_GRAPH: dict[type, dict[str, Callable[..., Any]]] = {}


def own_code(fn: Callable, owner: type) -> Callable:
    """A copy of the function ``fn`` for the class ``owner``, running a copy of ``fn``'s code object.

    Dynamo keeps the frames it compiles per code object, and its ``recompile_limit`` (8) counts them per code
    object. A method every metric class inherits, compiled as a frame of its own (below a graph break), guards
    on the class of ``self``: one compiled frame per class, all in one code object, so that one compiled step
    calling nine metric classes would exceed the limit and run the rest of it eagerly. With a copy per class,
    each class's frames are cached apart. Same name, file, lines, defaults and docstring; nothing changes in
    eager mode.
    """
    # a new code object, equal to fn's but for the name tracebacks show
    if sys.version_info >= (3, 11):
        code = fn.__code__.replace(co_qualname=f"{owner.__qualname__}.{fn.__name__}")
    else:
        code = fn.__code__.replace()
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    for attr in ("__doc__", "__module__", "__qualname__", "__annotations__"):
        setattr(copy, attr, getattr(fn, attr))
    return copy


def wrap_lifecycle(raw: Callable, template: Callable) -> Callable:
    """``raw`` (a subclass's own ``update`` or ``compute``) run through ``template(self, raw, ...)``."""

    @functools.wraps(raw)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return template(self, raw, *args, **kwargs)

    return wrapped


def run_outside_graph(base: type, methods: dict[str, str]) -> None:
    """Give ``base`` the attributes of ``methods`` (attribute -> the name of one of ``base``'s methods): each
    runs that method eagerly behind one graph break when compiled code calls it (``self`` passed explicitly).

    The host round trips are counted by the method's qualified name (``"Metric.forward"``). Subclasses of a
    metric base get copies of their own (:func:`give_own_code`): Dynamo resumes in the wrapper after the break
    and caches that frame per code object.
    """
    registered = _OUTSIDE_GRAPH.setdefault(base, {})
    for attribute, name in methods.items():
        registered[attribute] = base.__dict__[name]
        setattr(base, attribute, staticmethod(outside_graph(registered[attribute])))


def give_own_code(cls: type, names: tuple[str, ...]) -> None:
    """Give ``cls`` its own copy of the code of the inherited methods ``names`` (:func:`own_code`) and of the
    outside-graph methods of its bases (:func:`run_outside_graph`).

    Called for every metric class when it is created (``Metric.__init_subclass__``), with the lifecycle methods
    that Dynamo may compile as frames of their own (``Metric._per_class_code``). Why a copy: Dynamo caches
    compiled frames, and counts its recompile limit, per code object, and such a frame guards on the class of
    ``self``; sharing one code object, the classes of one compiled step would pile their frames onto it and reach
    the limit (docs/guide/compile.rst, "Many metric classes in one compiled step"). A copy changes nothing in eager
    mode: same function, name, file and lines, its own code object.
    """
    for name in names:
        inherited = next((c.__dict__[name] for c in cls.__mro__ if name in c.__dict__), None)
        if name not in cls.__dict__ and inspect.isfunction(inherited):
            setattr(cls, name, own_code(inherited, cls))
    for base in cls.__mro__[1:]:
        for attribute, fn in _OUTSIDE_GRAPH.get(base, {}).items():
            setattr(cls, attribute, staticmethod(own_code(outside_graph(fn), cls)))


def steps_outside_graph(target: Any) -> bool:
    """Whether, under ``torch.compile``, ``target.forward`` runs eagerly behind one graph break: it syncs across
    ranks (the sync is host-side, and Dynamo cannot resume after a break inside the step's ``try``), or its
    class always steps out (a wrapper: its members' protocol is host code). List states stay in the graph
    (:func:`folded_lists`)."""
    return target._forward_outside_graph or target._step_syncs()


def set_aside_lists(metric: Any) -> dict[str, list]:
    """The list states of ``metric``, replaced by fresh empty lists for ``update`` to append to (traced code)."""
    state = metric.__dict__
    rows = {name: state[name] for name in metric._list_states}
    state.update({name: [] for name in metric._list_states})
    return rows


def folded_lists(rows: dict[str, list], new: dict[str, Any]) -> dict[str, list]:
    """Under ``torch.compile``: each list state of ``rows`` (the accumulated rows) with the tensors ``update`` just
    appended to ``new[name]``, as a list holding *one* tensor, their concatenation (or an empty list).

    Eager code appends a batch to the list (a step costs the same after 10,000 steps as after one). Traced code
    that grows a list makes Dynamo guard on its length, so every step would compile anew; a list that always holds
    one tensor keeps its length, and the tensor's growing first dimension becomes a dynamic size after one
    recompile. The price is a copy of the accumulated rows per traced step.
    """
    out = {}
    for name, acc in rows.items():
        parts = [as_rows(t) for t in (*acc, *new[name])]
        out[name] = [torch.cat(parts)] if parts else []
    return out
