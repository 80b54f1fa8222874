"""Functions compiled from a signature held in a table: the task forms (``binary_accuracy``, the ``__init__`` of
``MulticlassAUROC``, ...) name their parameters in a tuple, each parameter's annotation and default written once,
instead of spelling the same signature out in every form.

:func:`define` writes the ``def`` of such a function and compiles it in the namespace of the module that offers it,
as :mod:`dataclasses` writes an ``__init__``: a plain function, whose signature, defaults and ``TypeError`` messages
are those of a function written by hand, and whose body passes its arguments on to a function of that module.
"""

from __future__ import annotations
import __future__

import inspect
from collections.abc import Callable, Sequence
from typing import Any

#: a parameter without a default
REQUIRED = inspect.Parameter.empty


def param(name: str, annotation: str, default: Any = REQUIRED, *, keyword_only: bool = False) -> inspect.Parameter:
    """A parameter of a compiled signature; ``annotation`` is the source text of its annotation (under
    ``from __future__ import annotations``, what the annotation of a hand-written one holds)."""
    kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Parameter(name, kind, default=default, annotation=annotation)


#: ``self``, the first parameter of a compiled method
SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
#: ``**kwargs: Any``, the :class:`~torchmetrics_diff.Metric` keyword arguments of a compiled ``__init__``
KWARGS = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD, annotation="Any")


def keywords(params: Sequence[inspect.Parameter]) -> str:
    """The source that passes ``params`` on, each by keyword and ``**kwargs`` as such (``self`` left out):
    ``threshold=threshold, ..., **kwargs``."""
    passed = [f"**{p.name}" if p.kind is p.VAR_KEYWORD else f"{p.name}={p.name}" for p in params if p is not SELF]
    return ", ".join(passed)


def define(
    qualname: str, params: Sequence[inspect.Parameter], returns: str, namespace: dict[str, Any], *body: str
) -> Callable[..., Any]:
    """The function ``def <name>(<params>) -> <returns>: <body>``, the value of its last statement returned.

    Args:
        qualname: its qualified name (``binary_accuracy``, ``BinaryAccuracy.__init__``); the def takes its last part.
        params: its parameters, in order (:func:`param`, :data:`SELF`, :data:`KWARGS`).
        returns: the source text of its return annotation.
        namespace: the globals of the module that offers it (``globals()``): its ``__module__`` and the names its
            body finds, as for a function defined there (doctest collects its docstring with that module's).
        body: its statements, as source; the last one an expression (a call to a function of ``namespace`` that
            does the work, the arguments passed on with :func:`keywords`).
    """
    name = qualname.rsplit(".", 1)[-1]
    inspect.Signature(params)  # checks the order of the kinds, the defaults and the names
    written = []
    for p in params:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in written:
            written.append("*")
        text = p.name if p.annotation is REQUIRED else f"{p.name}: {p.annotation}"
        stars = "**" if p.kind is inspect.Parameter.VAR_KEYWORD else ""
        written.append(stars + text + ("" if p.default is REQUIRED else f" = {p.default!r}"))
    lines = [*body[:-1], f"return {body[-1]}"]
    source = f"def {name}({', '.join(written)}) -> {returns}:\n" + "".join(f"    {line}\n" for line in lines)
    flags = __future__.annotations.compiler_flag
    code = compile(source, f"<{namespace['__name__']}.{qualname}>", "exec", flags=flags, dont_inherit=True)
    scope: dict[str, Any] = {}
    exec(code, namespace, scope)
    function = scope[name]
    function.__qualname__ = qualname
    return function
