"""Explorables that work both with a live kernel and on the static website.

On the book's static pages no Python runs, so a widget whose callback redraws a figure is dead
there. :func:`explorable` instead draws every view up front, stacks the pictures in an
``ipywidgets.Stack`` and links the control to the stack with ``jslink``: the link runs in the
browser, so moving the control switches the picture in Jupyter, in Colab and on the website alike.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Sequence

__all__ = ["explorable", "figure_to_png"]

MAX_VIEWS = 64


def figure_to_png(fig, dpi: int = 80, tight: bool = True) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it (so that it is not shown twice).

    ``tight=True`` crops the picture to what is drawn; ``tight=False`` keeps the figure's own size, so that
    views whose labels differ in length still come out the same size.
    """
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buffer.getvalue()


def _control(name: str, values: Sequence[Any], labels: Sequence[str], kind: str):
    import ipywidgets as widgets

    options = [(label, i) for i, label in enumerate(labels)]
    style = {"description_width": "initial"}
    if kind == "slider":
        return widgets.SelectionSlider(options=options, value=0, description=name, continuous_update=True,
                                       style=style, layout=widgets.Layout(width="420px"))
    if kind == "dropdown":  # as wide as its longest option (the default width cuts sentences off)
        return widgets.Dropdown(options=options, value=0, description=name, style=style,
                                layout=widgets.Layout(width="max-content", max_width="100%"))
    if kind == "buttons":  # buttons as wide as their labels, so that a few short ones fit on one line
        return widgets.ToggleButtons(options=options, value=0, description=name,
                                     style={**style, "button_width": "auto"})
    raise ValueError(f"kind must be 'slider', 'dropdown' or 'buttons', got {kind!r}")


def explorable(
    render: Callable[..., Any],
    params: dict[str, Sequence[Any]],
    *,
    kinds: dict[str, str] | None = None,
    labels: dict[str, Sequence[str]] | None = None,
    dpi: int = 80,
    tight: bool = True,
):
    """Make an explorable picture: one control per parameter, every view precomputed.

    Args:
        render: called as ``render(**values)`` for every combination of parameter values; returns a
            matplotlib ``Figure`` (closed after rendering) or PNG bytes.
        params: parameter name -> the values to offer, in order (the first is shown at first).
        kinds: parameter name -> ``"slider"`` (default), ``"dropdown"`` or ``"buttons"``.
        labels: parameter name -> the text shown for each value (default ``str(value)``).
        dpi: resolution of the pictures.
        tight: crop each picture to what it draws (the default), or keep the figure's size (``False``), so
            that every view has the same size and the page does not jump when the control moves; the
            figure's own layout must then leave room for its labels.

    Returns:
        An ``ipywidgets.VBox`` with the controls above the picture. Display it as a cell's last
        expression.

    Example::

        explorable(lambda temperature: plot_attention(softmax(scores / temperature)),
                   {"temperature": [0.25, 0.5, 1, 2, 4]})
    """
    import ipywidgets as widgets

    if not callable(render):
        raise TypeError(f"render must be callable, got {type(render).__name__}")
    if not isinstance(params, dict) or not params:
        raise ValueError(f"params must be a non-empty dict of name -> list of values, got {params!r}")
    kinds, labels = dict(kinds or {}), dict(labels or {})
    names = list(params)
    for name in names:
        values = list(params[name])
        if not values:
            raise ValueError(f"params[{name!r}] must list at least one value, got none")
        if name in labels and len(labels[name]) != len(values):
            raise ValueError(f"labels[{name!r}] has {len(labels[name])} entries but params[{name!r}] has {len(values)}")
    unknown = (set(kinds) | set(labels)) - set(names)
    if unknown:
        raise ValueError(f"kinds/labels name parameters that params does not have: {sorted(unknown)}")
    n_views = 1
    for name in names:
        n_views *= len(params[name])
    if n_views > MAX_VIEWS:
        raise ValueError(f"{n_views} views would be precomputed; offer fewer values (at most {MAX_VIEWS} views in all)")

    def picture(values: dict[str, Any]):
        out = render(**values)
        png = out if isinstance(out, (bytes, bytearray)) else figure_to_png(out, dpi=dpi, tight=tight)
        return widgets.Image(value=bytes(png), format="png", layout=widgets.Layout(max_width="100%", height="auto"))

    controls = [
        _control(name, list(params[name]), [str(v) for v in labels.get(name, params[name])], kinds.get(name, "slider"))
        for name in names
    ]

    # One Stack per level of nesting: the control of parameter k switches every level-k stack.
    stacks_by_level: list[list[Any]] = [[] for _ in names]

    def build(level: int, chosen: dict[str, Any]):
        name = names[level]
        children = []
        for value in params[name]:
            here = {**chosen, name: value}
            children.append(picture(here) if level == len(names) - 1 else build(level + 1, here))
        stack = widgets.Stack(children=children, selected_index=0)
        stacks_by_level[level].append(stack)
        return stack

    top = build(0, {})
    for control, stacks in zip(controls, stacks_by_level):
        for stack in stacks:
            widgets.jslink((control, "index"), (stack, "selected_index"))
    return widgets.VBox([*controls, top])
