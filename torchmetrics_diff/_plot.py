"""Drawing metric values with matplotlib (an optional dependency: the ``plot`` extra).

One job: turn what ``forward``/``compute`` return — a scalar, a 1-D tensor, a 2-D tensor, a dict of those, or a
sequence of such values — into a matplotlib figure. Imported only when a ``plot`` method is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

_MISSING = "plot() needs matplotlib (the plot extra), which is not installed: pip install 'matplotlib>=3.6'"


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ModuleNotFoundError(_MISSING) from err
    return plt


def _as_dict(value: Any, name: str) -> dict[str, torch.Tensor]:
    """One value as ``{series name: tensor}``."""
    if isinstance(value, Mapping):
        out = {}
        for key, v in value.items():
            out.update(_as_dict(v, str(key)))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value))
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"`val` must hold tensors, numbers or dicts of them; got {type(value).__name__} for {name!r}")
    return {name: value.detach().cpu().double()}


def _is_sequence(val: Any) -> bool:
    return isinstance(val, Sequence) and not isinstance(val, (str, bytes))


def _series(steps: list[dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """Per series name (1-D tensors give one series per element, ``name[i]``), its value at each step."""
    out: dict[str, list[float]] = {}
    for step in steps:
        for name, t in step.items():
            if t.ndim == 0 or t.numel() == 1:
                out.setdefault(name, []).append(float(t.reshape(())))
            elif t.ndim == 1:
                for i, x in enumerate(t.tolist()):
                    out.setdefault(f"{name}[{i}]", []).append(float(x))
            else:
                raise ValueError(
                    f"`val`: {name!r} has shape {tuple(t.shape)}; a sequence of values can hold scalars or 1-D "
                    "tensors only (plot a single 2-D value on its own)"
                )
    return out


def plot_values(
    val: Any,
    ax: Any = None,
    *,
    name: str,
    higher_is_better: bool | None = None,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    matrix_labels: tuple[str, str] | None = None,
) -> tuple[Any, Any]:
    """Draw ``val`` (one value or a sequence of values) and return ``(figure, axes)``.

    A single value draws one marker per series (its number written beside it); a sequence draws a line per
    series over the step index (integer ticks); a single 2-D tensor is drawn as an image with its entries written
    in, its axes labelled ``matrix_labels = (columns, rows)`` when given.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.get_figure()
    title = name if higher_is_better is None else f"{name} ({'higher' if higher_is_better else 'lower'} is better)"
    if _is_sequence(val):
        if not val:
            raise ValueError("`val` must hold at least one value; got an empty sequence")
        series = _series([_as_dict(v, name) for v in val])
        for label, ys in series.items():
            ax.plot(range(len(ys)), ys, marker="o", label=label)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 0.5 ticks
    else:
        values = _as_dict(val, name)
        matrices = {k: t for k, t in values.items() if t.ndim == 2}
        if matrices:
            if len(values) != 1:
                raise ValueError("`val`: a 2-D value is drawn as an image on its own; plot dict entries separately")
            ((label, t),) = matrices.items()
            image = ax.imshow(t.numpy(), cmap="viridis")
            fig.colorbar(image, ax=ax)
            ax.set_xticks(range(t.shape[1]))
            ax.set_yticks(range(t.shape[0]))
            if matrix_labels is not None:
                ax.set_xlabel(matrix_labels[0])
                ax.set_ylabel(matrix_labels[1])
            middle = (float(t.min()) + float(t.max())) / 2
            for (i, j), x in zip(((i, j) for i in range(t.shape[0]) for j in range(t.shape[1])), t.flatten().tolist()):
                color = "black" if x > middle else "white"  # viridis is bright at the top
                ax.text(j, i, f"{x:.3g}", ha="center", va="center", color=color, fontsize=8)
            ax.set_title(title)
            return fig, ax
        series = _series([values])
        for i, (label, ys) in enumerate(series.items()):
            ax.plot([i], ys, marker="o", linestyle="", label=label)
            ax.annotate(f"{ys[0]:.4g}", (i, ys[0]), textcoords="offset points", xytext=(6, 6))
        ax.set_xticks(range(len(series)), list(series), rotation=30 if len(series) > 4 else 0)
        ax.margins(x=0.25)  # room for the numbers written beside the outer markers
    if lower_bound is not None or upper_bound is not None:
        ax.set_ylim(bottom=lower_bound, top=upper_bound)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(ax.get_lines()) > 1:
        ax.legend(loc="best", fontsize=8)
    return fig, ax
