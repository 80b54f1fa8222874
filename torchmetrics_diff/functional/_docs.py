"""Docstring text shared by several functions or classes, written once: a docstring names a shared part by a
line of its own, ``{name}``, that :func:`shared_docs` replaces with the part, indented as that line."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T", bound=Callable[..., object])


def fill(doc: str, **parts: str) -> str:
    """``doc`` with each line ``{name}`` (alone on its line, after its indentation) replaced by ``parts[name]``,
    every line of the part indented as that line.

    Raises:
        ValueError: a part that ``doc`` does not name.
    """
    missing = [name for name in parts if not re.search(rf"^ *\{{{name}\}}$", doc, flags=re.M)]
    if missing:
        raise ValueError(f"the docstring has no line {{{missing[0]}}}")
    line = re.compile(rf"^( *)\{{({'|'.join(map(re.escape, parts))})\}}$", flags=re.M)
    return line.sub(lambda m: textwrap.indent(parts[m.group(2)], m.group(1)), doc) if parts else doc


def shared_docs(**parts: str) -> Callable[[_T], _T]:
    """A decorator: the docstring of the function or class with its shared parts filled in (:func:`fill`)."""

    def decorate(obj: _T) -> _T:
        if obj.__doc__ is not None:  # (``python -OO`` strips the docstrings)
            obj.__doc__ = fill(obj.__doc__, **parts)
        return obj

    return decorate
