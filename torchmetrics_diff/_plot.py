"""Drawing metric values with matplotlib (an optional dependency: the ``plot`` extra).

One job: turn what ``forward``/``compute`` return — a scalar, a 1-D tensor, a 2-D tensor, a dict of those, or a
sequence of such values — into a matplotlib figure. Imported only when a ``plot`` method is called.

The picture is torchmetrics' (``Metric.plot`` there): the same points, lines, labels, legend, y-range, dashed
bound lines and "Optimal value" mark for the same value, so that a figure made with either package reads the
same. What it draws, per kind of ``val``:

* a one-element tensor (or a number): one marker at x = 0; the x axis hidden;
* a tensor of several elements: one marker per element at x = its index, labelled ``"{legend_name} {i}"`` (or
  ``"{i}"``); the x axis hidden;
* a dict: per key in order, a one-element value as one marker at x = its position among the keys, a longer one
  as a line over its index (the x axis then shown: "Step", one tick per index); labelled by the key;
* a sequence (one value per step): the values stacked, one line over the steps per element (labelled as the
  tensor's markers; a scalar's one line has no label) or per key of dict values; x axis "Step", one tick per
  step;
* then: a legend above the axes when anything is labelled; the y-range widened by a tenth of the bounds' span
  (``plot_lower_bound`` to ``plot_upper_bound`` when both are set) or of the drawn range, beyond each bound or
  the drawn extreme; a grid; the y axis labelled with ``name``; a dashed black line at each bound; and with
  ``higher_is_better`` set, "Optimal \\n value" written at the left edge at the upper bound (higher is better) or
  the lower one, the x-range widened left by a tenth to make room.

A single 2-D tensor is drawn as an image instead (torchmetrics' generic plot cannot draw one), with its entries
written in: a confusion matrix.
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


def _tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value))
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"`val` must hold tensors, numbers or dicts of them; got {type(value).__name__} for {name!r}")
    return value.detach().cpu().double()


def _columns(values: torch.Tensor) -> list[list[float]]:
    """A ``(steps, ...)`` stack as one series per element (a 1-D stack is one series)."""
    if values.ndim == 1:
        return [values.tolist()]
    return values.reshape(values.shape[0], -1).T.tolist()


def _label(legend_name: str | None, i: int) -> str:
    return f"{legend_name} {i}" if legend_name else str(i)


def _show_steps(ax: Any, n: int) -> None:
    ax.get_xaxis().set_visible(True)
    ax.set_xlabel("Step")
    ax.set_xticks(range(n))


def _draw_matrix(fig: Any, ax: Any, t: torch.Tensor, title: str, matrix_labels: tuple[str, str] | None) -> None:
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


def _draw_value(ax: Any, val: Any, name: str, legend_name: str | None) -> None:
    """One value (not a sequence): markers, or lines for the multi-element entries of a dict."""
    marker = {"marker": "o", "markersize": 10}
    if isinstance(val, Mapping):
        for i, (key, v) in enumerate(_as_dict(val, name).items()):
            if v.numel() == 1:
                ax.plot([i], [float(v.reshape(()))], label=key, **marker)
                continue
            for ys in _columns(v):
                ax.plot(range(len(ys)), ys, linestyle="-", label=key, **marker)
            _show_steps(ax, v.shape[0])
        return
    t = _tensor(val, name)
    if t.numel() == 1:
        ax.plot([0], [float(t.reshape(()))], **marker)
        return
    if t.ndim != 1:
        raise ValueError(
            f"`val`: {name!r} has shape {tuple(t.shape)}; a single value can be a scalar, a 1-D or a 2-D tensor"
        )
    for i, y in enumerate(t.tolist()):
        ax.plot([i], [y], linestyle="None", label=_label(legend_name, i), **marker)


def _draw_steps(ax: Any, val: Sequence[Any], name: str, legend_name: str | None) -> None:
    """A sequence of values, one per step: a line per element (or per key) over the steps."""
    if not val:
        raise ValueError("`val` must hold at least one value; got an empty sequence")
    line = {"marker": "o", "markersize": 10, "linestyle": "-"}
    steps = [_as_dict(v, name) if isinstance(v, Mapping) else _tensor(v, name) for v in val]
    if len({isinstance(step, dict) for step in steps}) > 1:
        raise ValueError("`val`: a sequence must hold dicts only or tensors (numbers) only; got both")
    try:
        if isinstance(steps[0], dict):
            stacks = {key: torch.stack([step[key] for step in steps]) for key in steps[0]}  # type: ignore[index]
            for key, stack in stacks.items():
                for ys in _columns(stack):
                    ax.plot(range(len(ys)), ys, label=key, **line)
        else:
            stack = torch.stack(steps)  # type: ignore[arg-type]
            series = _columns(stack)
            for i, ys in enumerate(series):
                ax.plot(range(len(ys)), ys, label=_label(legend_name, i) if stack.ndim > 1 else None, **line)
    except (KeyError, RuntimeError, TypeError) as err:
        raise ValueError(f"`val`: the values of a sequence must have the same keys and shapes ({err})") from err
    _show_steps(ax, len(steps))


def plot_values(
    val: Any,
    ax: Any = None,
    *,
    name: str | None,
    higher_is_better: bool | None = None,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    legend_name: str | None = None,
    matrix_labels: tuple[str, str] | None = None,
) -> tuple[Any, Any]:
    """Draw ``val`` (one value or a sequence of values) as torchmetrics does and return ``(figure, axes)``.

    See the module docstring for the picture; ``name`` labels the y axis (``None``: no label), ``legend_name``
    prefixes the index in the labels of a multi-element value. A single 2-D tensor is drawn as an image, its axes
    labelled ``matrix_labels = (columns, rows)`` when given.
    """
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.get_figure()
    if not _is_sequence(val):
        values = _as_dict(val, name or "value")
        matrices = {k: t for k, t in values.items() if t.ndim == 2}
        if matrices:
            if len(values) != 1 or isinstance(val, Mapping):
                raise ValueError("`val`: a 2-D value is drawn as an image on its own; plot dict entries separately")
            _draw_matrix(fig, ax, next(iter(matrices.values())), name or "", matrix_labels)
            return fig, ax
    ax.get_xaxis().set_visible(False)
    if _is_sequence(val):
        _draw_steps(ax, val, name or "value", legend_name)
    else:
        _draw_value(ax, val, name or "value", legend_name)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.15), ncol=3, fancybox=True, shadow=True)
    bottom, top = ax.get_ylim()
    both = lower_bound is not None and upper_bound is not None
    pad = 0.1 * ((upper_bound - lower_bound) if both else (top - bottom))  # type: ignore[operator]
    ax.set_ylim(
        bottom=(bottom if lower_bound is None else lower_bound) - pad,
        top=(top if upper_bound is None else upper_bound) + pad,
    )
    ax.grid(True)
    ax.set_ylabel(name or "")
    left, right = ax.get_xlim()
    bounds = [b for b in (lower_bound, upper_bound) if b is not None]
    if bounds:
        ax.hlines(bounds, left, right, linestyles="dashed", colors="k")
    optimal = None if higher_is_better is None else (upper_bound if higher_is_better else lower_bound)
    if optimal is not None:
        ax.set_xlim(left - 0.1 * (right - left), right)
        ax.text(left, optimal, "Optimal \n value", horizontalalignment="center", verticalalignment="center")
    return fig, ax


def plot_metric(metric: Any, val: Any, ax: Any, task: str | None = None, per_class: bool = False) -> tuple[Any, Any]:
    """``metric.plot(val, ax)``: ``val`` (``None``: ``metric.compute()``) drawn with the metric's class attributes.

    The y axis is labelled with the class name; for a classification metric built with a ``task``, with the name
    of torchmetrics' class for that task (``BinaryAccuracy`` for ``Accuracy(task="binary")``), whose values
    per class or label (``per_class``) are labelled "Class i" or "Label i".
    """
    name = type(metric).__name__
    legend_name = metric.plot_legend_name
    if task is not None:
        prefix = task.capitalize()
        name = name if name.startswith(prefix) else prefix + name
        if legend_name is None and per_class:
            legend_name = {"multiclass": "Class", "multilabel": "Label"}.get(task)
    return plot_values(
        metric.compute() if val is None else val,
        ax=ax,
        name=name,
        higher_is_better=metric.higher_is_better,
        lower_bound=metric.plot_lower_bound,
        upper_bound=metric.plot_upper_bound,
        legend_name=legend_name,
    )
