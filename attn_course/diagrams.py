"""The course's diagram language: tensors as labelled blocks with their shapes, operations between them.

Every chapter pictures its mechanism with these helpers, so that a role has one colour in the whole
course and the weights look like the heatmaps of :mod:`attn_course.plotting` (both use
:data:`WEIGHT_CMAP`; masks use :data:`MASK_COLOURS` in both). A builder returns a matplotlib
``Figure`` drawn at the chapter's own sizes, its text alternative in ``fig.attn_alt``
(:func:`alt_text`). A chapter cell::

    fig = ac.diagrams.attention_flow(L=T, D=d_k, E=d_in, mask="causal",
                                     names={"L": "T", "D": "d_k", "E": "d_in"})
    ac.diagrams.show(fig)   # the PNG, with the alt text as the output's text/plain

and the cell's metadata carries the same text for the website, ``"mystnb": {"image": {"alt": ...}}``:
after executing the chapter, ``ac.diagrams.sync_alt_texts("chapters/NN_....ipynb")`` copies each
diagram's text into its cell's metadata; ``tests/test_diagrams.py`` fails while a chapter's metadata
lacks it, and nbval fails when the code changes the text. An author may add sentences after it.

Builders (chapter): :func:`seq2seq_attention` (01), :func:`attention_flow` (02 ``simple=True``, 03,
04 ``mask=...``, 09 ``rotary=True``/``bias="alibi"``, 10 ``mask="sliding"``), :func:`head_split`,
:func:`head_layouts` and :func:`multihead_flow` (05; 10 with ``kv_heads``), :func:`positional_flow` (06),
:func:`transformer_flow` (07), :func:`tiled_attention_flow`, :func:`causal_tiles` and :func:`kv_cache_flow` (08; 10 with
``window``), :func:`rotary_pairs` and :func:`alibi_flow` (09), :func:`grouped_heads` and
:func:`rolling_cache_flow` (10), :func:`latent_attention_flow` (11),
:func:`linear_attention_flow` (12). Sizes are keyword integers; ``names`` renames the symbols in the
shapes (``{"L": "T"}``), ``shapes`` shows "both" (symbols over numbers), "numbers" or "symbols".

The palette (:data:`PALETTE`, role -> fill; text on every fill has WCAG contrast >= 4.5, black on all
but the mask's blue, where it is white):

==============  =========  ==========================================================
role            colour     used for
==============  =========  ==========================================================
input           #B3B3B3    token embeddings X, token ids (grey)
query           #CC79A7    Q, decoder states that query (reddish purple, Okabe-Ito)
key             #E69F00    K (orange, Okabe-Ito)
value           #56B4E9    V (sky blue, Okabe-Ito)
score           #F0E442    scores Q Kᵀ before the softmax (yellow)
weight          viridis    attention weights, shaded like the heatmaps (#21918C mid)
output          #009E73    outputs, context vectors (bluish green)
position        #F4A582    positional encodings, rotary angles, ALiBi bias (salmon)
state           #B9A5D9    recurrent states, caches, latents (lavender)
parameter       #FFFFFF    weight matrices drawn as blocks (white, outlined)
mask_allowed    #1F5FA8    a mask's True, "may attend" (blue)
mask_blocked    #E3E3E3    a mask's False, "blocked" (light grey)
==============  =========  ==========================================================

Heads take :data:`HEAD_COLOURS` (Paul Tol's colour-blind-safe "muted" scheme): head h is
``HEAD_COLOURS[h % 8]`` (:func:`head_colour`).

Diagrams are drawn at true size: one data unit is one inch, a tensor's cell :data:`CELL` inches,
and an axis longer than :data:`CAP` cells grows only logarithmically, so ``(4096, 64)`` stays on
the page; a builder shrinks its cells (not its text) until it is at most :data:`MAX_WIDTH` inches
wide, 700 px at the notebook's 100 dpi. :class:`Diagram` composes new pictures by explicit
coordinates (inches, y pointing down): ``block``, ``op``, ``arrow``, ``group``, ``text``,
``legend``, ``finish(alt)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .alibi import alibi_slopes

__all__ = [
    "PALETTE", "HEAD_COLOURS", "MASK_COLOURS", "WEIGHT_CMAP", "CELL", "CAP", "MAX_WIDTH",
    "head_colour", "text_colour", "contrast_ratio", "alt_text", "show", "sync_alt_texts",
    "Diagram", "Block",
    "attention_flow", "head_split", "head_layouts", "multihead_flow", "seq2seq_attention", "encoder_decoder_step", "positional_flow",
    "transformer_flow", "tiled_attention_flow", "causal_tiles", "kv_cache_flow", "rotary_pairs", "grouped_heads",
    "latent_attention_flow", "linear_attention_flow", "alibi_flow", "rolling_cache_flow", "grouped_fold_flow",
]

# ----------------------------------------------------------------------------------------------
# The palette. Fills are light enough that black text reads on them (WCAG contrast >= 4.5, checked
# by the tests) and keep their contrast on the white card the website puts figures on in dark mode.
# Queries, keys and values take Okabe & Ito's colour-blind-safe orange, sky blue and reddish purple.
PALETTE: dict[str, str] = {
    "input": "#B3B3B3",         # token embeddings X, the tokens themselves (neutral grey)
    "query": "#CC79A7",         # Q (reddish purple)
    "key": "#E69F00",           # K (orange)
    "value": "#56B4E9",         # V (sky blue)
    "score": "#F0E442",         # scores Q Kᵀ before the softmax (yellow)
    "weight": "#21918C",        # attention weights: drawn with WEIGHT_CMAP, this is its middle
    "output": "#009E73",        # outputs and context vectors (bluish green)
    "position": "#F4A582",      # positional encodings, rotary angles, ALiBi biases (salmon)
    "state": "#B9A5D9",         # recurrent states, caches, latents (lavender)
    "parameter": "#FFFFFF",     # weight matrices W_Q, W_K, ... (white, outlined)
    "mask_allowed": "#1F5FA8",  # a mask's "may attend" (True) cells (blue)
    "mask_blocked": "#E3E3E3",  # a mask's "blocked" (False) cells (light grey)
}
# One colour per head (Paul Tol's "muted" scheme, safe for colour-blind readers, without its green,
# which the outputs use); head h takes HEAD_COLOURS[h % 8]. The first three avoid every role colour.
HEAD_COLOURS: tuple[str, ...] = ("#332288", "#882255", "#DDCC77", "#88CCEE", "#999933", "#CC6677", "#44AA99",
                                 "#AA4499")
# Masks everywhere (diagrams, plot_mask, chapter heatmaps): 0 / False = blocked, 1 / True = may attend.
# MASK_COLOURS: a matplotlib ListedColormap [blocked, allowed], built on first use (module __getattr__
# below) so that importing attn_course does not import matplotlib.
WEIGHT_CMAP = "viridis"  # attention weights, in the heatmaps and in the diagrams
CELL = 0.12  # inches per cell of a tensor
CAP = 12     # cells drawn to scale; longer axes grow like log2 beyond this
STEP = 0.05  # offset between the slices of a stack (a head axis), inches
MIN_CELL = 0.07  # the smallest cell a builder shrinks to
MAX_WIDTH = 7.0  # inches: a builder shrinks its cells until the diagram fits a book page (700 px at 100 dpi)
INK = "#222222"    # arrows, outlines of operations, labels
MUTED = "#555555"  # shapes and secondary labels (contrast 7.5 on white)
_NAME_PT, _OP_PT, _SMALL_PT = 10.5, 9.5, 8.5


def __getattr__(name):
    if name == "MASK_COLOURS":  # built once, on first use
        from matplotlib.colors import ListedColormap

        globals()[name] = ListedColormap([PALETTE["mask_blocked"], PALETTE["mask_allowed"]], name="attn_mask")
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rgb(colour) -> tuple:
    """A matplotlib colour (name, hex, tuple) as an (r, g, b) tuple of floats in [0, 1]."""
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def _luminance(colour) -> float:
    rgb = np.array(_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return float(linear @ np.array([0.2126, 0.7152, 0.0722]))


def contrast_ratio(foreground, background) -> float:
    """The WCAG 2 contrast ratio of two colours, from 1 (none) to 21 (black on white)."""
    lighter, darker = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def text_colour(background) -> str:
    """Black or white, whichever contrasts more with ``background`` (a matplotlib colour)."""
    return "#000000" if contrast_ratio("#000000", background) >= contrast_ratio("#ffffff", background) else "#ffffff"


def _edge(colour) -> tuple:
    return tuple(0.55 * c for c in _rgb(colour))  # a darker shade of the fill


def _role(role: str) -> str:
    if role not in PALETTE:
        raise ValueError(f"role must be one of {sorted(PALETTE)}, got {role!r}")
    return PALETTE[role]


def _size(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


_MEASURE = None


def _text_box(text: str, size: float, weight: str = "normal") -> tuple[float, float]:
    """Width and height in inches of ``text`` (one or more lines) at ``size`` points."""
    global _MEASURE
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    if _MEASURE is None:
        _MEASURE = RendererAgg(10, 10, 72)  # 72 dpi: pixels are points
    prop = FontProperties(size=size, weight=weight)
    lines = text.split("\n")
    width = max(_MEASURE.get_text_width_height_descent(line or " ", prop, ismath=False)[0] for line in lines)
    return width / 72, len(lines) * size * 1.25 / 72


# ----------------------------------------------------------------------------------------------
@dataclass
class Block:
    """Where a drawn item lies, in inches (y down): its box and the box of its labels too."""
    x0: float
    y0: float
    w: float
    h: float
    name: str = ""
    role: str = ""
    lift: float = 0.0  # a stack's back slices reach this far above and to the right
    bounds: tuple | None = None  # (x0, y0, x1, y1) of the block with its slices and labels

    @property
    def center(self):
        return (self.x0 + self.w / 2, self.y0 + self.h / 2)

    @property
    def left(self):
        return (self.x0, self.y0 + self.h / 2)

    def _reach(self, half: float) -> float:
        """How far the back slices stick out at the middle of a side of half-length ``half``."""
        return min(self.lift, math.floor(half / STEP - 1e-9) * STEP) if self.lift else 0.0

    @property
    def right(self):
        return (self.x0 + self.w + self._reach(self.h / 2), self.y0 + self.h / 2)

    @property
    def top(self):
        return (self.x0 + self.w / 2, self.y0 - self._reach(self.w / 2))

    @property
    def bottom(self):
        return (self.x0 + self.w / 2, self.y0 + self.h)

    @property
    def x1(self):
        return self.x0 + self.w

    @property
    def y1(self):
        return self.y0 + self.h


class Diagram:
    """A canvas in inches (x right, y down) on which blocks, operations and arrows are placed.

    Each method draws one thing and returns a :class:`Block` whose anchors (``left``, ``right``,
    ``top``, ``bottom``, ``center``) are the points arrows attach to. :meth:`finish` sizes the figure
    to what was drawn (one data unit = one inch) and attaches the text alternative.
    """

    def __init__(self, cell: float = CELL):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.cell = cell
        self.fig = Figure()  # not pyplot's: nothing is shown twice, nothing stays open
        FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_axis_off()
        self._bounds = [math.inf, math.inf, -math.inf, -math.inf]
        self._roles: list[str] = []

    def ext(self, n: int) -> float:
        """Drawn length in inches of an axis of ``n`` cells: to scale up to CAP cells, then logarithmic."""
        return self.cell * (n if n <= CAP else CAP + min(2.0, math.log2(n / CAP)))

    def lift(self, depth: int) -> float:
        """How far the back slice of a stack of ``depth`` slices sits above and right of the front one."""
        return (min(depth, 8) - 1) * STEP

    @property
    def width(self) -> float:
        return self._bounds[2] - self._bounds[0]

    def _note(self, x0, y0, x1, y1):
        b = self._bounds
        self._bounds = [min(b[0], x0), min(b[1], y0), max(b[2], x1), max(b[3], y1)]

    def text(self, x, y, text, *, size=_SMALL_PT, colour=MUTED, ha="center", va="center", weight="normal",
             background=None, **kwargs):
        """Write ``text`` at (x, y); returns the Block of its box."""
        w, h = _text_box(text, size, weight)
        x0 = x - (w / 2 if ha == "center" else (w if ha == "right" else 0))
        y0 = y - (h / 2 if va == "center" else (h if va == "bottom" else 0))
        bbox = None if background is None else dict(boxstyle="round,pad=0.15", facecolor=background, edgecolor="none")
        self.ax.text(x, y, text, fontsize=size, color=colour, ha=ha, va=va, weight=weight, bbox=bbox,
                     linespacing=1.15, **kwargs)
        self._note(x0, y0, x0 + w, y0 + h)
        return Block(x0, y0, w, h, text)

    def block(self, center, rows: int, cols: int, *, role: str, name: str = "", shape: str = "",
              shape_at: str = "below", name_at: str = "inside", grid: bool = True, depth: int = 1,
              values=None, cells=None, slice_edges: Sequence[str] | None = None,
              slice_fills: Sequence[str] | None = None, width: float | None = None,
              height: float | None = None) -> Block:
        """A tensor: a rectangle of ``rows`` x ``cols`` cells (clamped beyond CAP), its name and its shape.

        Args:
            center: (x, y) of the front slice's centre, inches.
            rows, cols: the tensor's last two sizes; they set the drawn height and width.
            role: a key of :data:`PALETTE` (the fill colour).
            name: written on the block (``"Q"``); ``name_at`` "inside", "left", "above" or "right".
            shape: written next to it (``"(L, D)\\n(6, 8)"``); ``shape_at`` "below", "above", "left", "right".
            grid: draw the cell lines (along axes of at most CAP cells).
            depth: a stack of this many slices (a head axis); at most 8 are drawn.
            values: (r, c) numbers that shade the drawn cells with :data:`WEIGHT_CMAP`, 0 to their
                largest as in the heatmaps (weights); usually (min(rows, CAP), min(cols, CAP)).
            cells: (r, c) matplotlib colours, one per drawn cell (masks, heads); overrides ``values``.
            slice_edges: one outline colour per slice, front first (heads).
            slice_fills: one fill per slice, front first (heads); overrides the role's fill.
            width, height: the drawn size in inches, instead of the one ``cols`` and ``rows`` give.

        Returns:
            The :class:`Block` of the front slice.
        """
        import matplotlib.patches as mpatches
        from matplotlib import colormaps

        rows, cols, depth = _size(rows, "rows"), _size(cols, "cols"), _size(depth, "depth")
        fill = _role(role)
        self._roles.append(role)
        w = self.ext(cols) if width is None else float(width)
        h = self.ext(rows) if height is None else float(height)
        x0, y0 = center[0] - w / 2, center[1] - h / 2
        nr, nc = min(rows, CAP), min(cols, CAP)
        if cells is None and values is not None:
            v = np.asarray(values, dtype=float)
            if v.ndim != 2:
                raise ValueError(f"values must be a 2-D grid of numbers, got shape {v.shape}")
            top = v.max() if v.max() > 0 else 1.0
            cells = np.empty(v.shape, dtype=object)
            for (i, j), value in np.ndenumerate(v):
                cells[i, j] = colormaps[WEIGHT_CMAP](value / top)
        if cells is not None:
            cells = _as_cells(cells)  # its own grid: usually (min(rows, CAP), min(cols, CAP))
            nr, nc = cells.shape
            back = cells[-1, 0]  # back slices of a shaded stack take the colour of its bottom-left cell
        else:
            back = fill
        if slice_fills:
            fill = slice_fills[0]
        drawn, step = min(depth, 8), STEP
        for k in range(drawn - 1, 0, -1):  # back slices first, offset up and to the right
            face = slice_fills[k % len(slice_fills)] if slice_fills else back
            edge = slice_edges[k % len(slice_edges)] if slice_edges else _edge(face)
            rect = mpatches.Rectangle((x0 + k * step, y0 - k * step), w, h, facecolor=face, edgecolor=edge,
                                      linewidth=1.6 if slice_edges else 0.8, zorder=2 + (drawn - k) * 0.01)
            rect.set_gid(f"slice:{role}:{name}")
            self.ax.add_patch(rect)
        front = mpatches.Rectangle((x0, y0), w, h, facecolor=fill if cells is None else "none", edgecolor="none",
                                   zorder=2.1)
        front.set_gid(f"block:{role}:{name}")
        self.ax.add_patch(front)
        self._note(x0, y0 - (drawn - 1) * step, x0 + w + (drawn - 1) * step, y0 + h)
        if cells is not None:
            cw, ch = w / nc, h / nr
            for (i, j), colour in np.ndenumerate(cells):
                cell = mpatches.Rectangle((x0 + j * cw, y0 + i * ch), cw, ch, facecolor=colour, edgecolor="none",
                                          zorder=2.2)
                cell.set_gid(f"cell:{role}:{name}")
                self.ax.add_patch(cell)
        if grid:
            gr, gc = (nr, nc) if cells is not None else (rows if rows <= CAP else 1, cols if cols <= CAP else 1)
            lines = [([x0 + j * w / gc] * 2, [y0, y0 + h]) for j in range(1, gc)]
            lines += [([x0, x0 + w], [y0 + i * h / gr] * 2) for i in range(1, gr)]
            for xs, ys in lines:
                self.ax.plot(xs, ys, color="white" if cells is not None else _edge(fill), linewidth=0.5, alpha=0.8,
                             zorder=2.3)
        edge = slice_edges[0] if slice_edges else (_edge(fill) if cells is None else INK)
        frame = mpatches.Rectangle((x0, y0), w, h, facecolor="none", edgecolor=edge,
                                   linewidth=1.6 if slice_edges else 1.0, zorder=2.4)
        self.ax.add_patch(frame)
        item = Block(x0, y0, w, h, name, role, (drawn - 1) * step)
        boxes = [(x0, y0 - item.lift, x0 + w + item.lift, y0 + h)]
        if name:
            boxes.append(self._name(item, name, name_at, fill if cells is None else "#ffffff", shape_at if shape else ""))
        if shape:
            boxes.append(self._label(item, shape, shape_at, depth_offset=(drawn - 1) * step))
        item.bounds = (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes),
                       max(b[3] for b in boxes))
        return item

    def _name(self, item: Block, name: str, at: str, background, shape_at: str = "below"):
        tw, th = _text_box(name, _NAME_PT, "bold")
        if at == "inside" and (tw + 0.06 > item.w or th > item.h + 0.02):
            at = "below" if shape_at == "above" else "above"  # too small to hold its name
        x, y = item.center
        pad = 0.06
        spots = {"inside": (x, y, "center", "center"), "left": (item.x0 - pad, y, "right", "center"),
                 "right": (item.x1 + item.lift + pad, y, "left", "center"),
                 "above": (x, item.y0 - item.lift - pad, "center", "bottom"),
                 "below": (x, item.y1 + pad, "center", "top")}
        if at not in spots:
            raise ValueError(f"name_at must be one of {sorted(spots)}, got {at!r}")
        x, y, ha, va = spots[at]
        bg = background if at == "inside" else None
        t = self.text(x, y, name, size=_NAME_PT, weight="bold", colour=text_colour(bg) if bg else INK, ha=ha, va=va,
                      background=bg, zorder=3)
        return (t.x0, t.y0, t.x1, t.y1)

    def _label(self, item: Block, text: str, at: str, depth_offset: float = 0.0):
        x, y = item.center
        pad = 0.05
        spots = {"below": (x, item.y1 + pad, "center", "top"),
                 "above": (x, item.y0 - pad - depth_offset, "center", "bottom"),
                 "left": (item.x0 - pad, y, "right", "center"),
                 "right": (item.x1 + pad + depth_offset, y, "left", "center")}
        if at not in spots:
            raise ValueError(f"shape_at must be one of {sorted(spots)}, got {at!r}")
        x, y, ha, va = spots[at]
        t = self.text(x, y, text, size=_SMALL_PT, colour=MUTED, ha=ha, va=va, zorder=3)
        return (t.x0, t.y0, t.x1, t.y1)

    def op(self, center, label: str, *, note: str = "", note_at: str = "right", width: float | None = None) -> Block:
        """An operation: a white rounded box (a circle for one symbol such as ``@`` or ``+``).

        Args:
            center: (x, y) in inches.
            label: what it does (``"softmax"``, ``"÷√D"``, ``"@"``, ``"concat"``).
            note: a small comment beside it (``"along each row"``), at ``note_at``.
            width: the box's width in inches (default: its label's), e.g. to span several lanes.

        Returns:
            The :class:`Block` of the node.
        """
        import matplotlib.patches as mpatches

        if not isinstance(label, str) or not label:
            raise ValueError(f"label must be a non-empty string, got {label!r}")
        tw, th = _text_box(label, _OP_PT)
        x, y = center
        if len(label) == 1 and width is None:
            r = 0.14
            patch = mpatches.Circle((x, y), r, facecolor="white", edgecolor=INK, linewidth=1.1, zorder=2)
            w = h = 2 * r
        else:
            w, h = max(tw + 0.16, width or 0.0), max(0.26, th + 0.06)
            patch = mpatches.FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                            facecolor="white", edgecolor=INK, linewidth=1.1, zorder=2)
        patch.set_gid(f"op:{label}")
        self.ax.add_patch(patch)
        self.text(x, y, label, size=_OP_PT, colour=INK, zorder=3)
        item = Block(x - w / 2, y - h / 2, w, h, label, "op")
        self._note(item.x0, item.y0, item.x1, item.y1)
        if note:
            self._label(item, note, note_at)
        return item

    def arrow(self, start, end, *, via: Sequence = (), label: str = "", label_at: str = "auto", colour=INK,
              head: bool = True, label_on: str | int = "longest"):
        """An arrow from ``start`` to ``end`` (points in inches) through the corners ``via``.

        Args:
            label: a shape or operation written beside the longest segment, on a white background.
            label_at: "above", "below", "left", "right" or "auto" (above a horizontal segment, right
                of a vertical one).
            label_on: the segment that carries the label: "longest", "first", "last" or its index.
            head: draw the arrow head (False: a plain line, to join arrows).
        """
        import matplotlib.patches as mpatches
        from matplotlib.path import Path

        points = [tuple(map(float, start)), *[tuple(map(float, p)) for p in via], tuple(map(float, end))]
        patch = mpatches.FancyArrowPatch(path=Path(points), arrowstyle="-|>" if head else "-", mutation_scale=11,
                                         color=colour, linewidth=1.2, shrinkA=0, shrinkB=0, zorder=1.5)
        self.ax.add_patch(patch)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        self._note(min(xs), min(ys), max(xs), max(ys))
        if label:
            segments = list(zip(points[:-1], points[1:]))
            if label_on == "longest":
                (ax_, ay), (bx, by) = max(segments, key=lambda s: math.dist(*s))
            else:
                index = {"first": 0, "last": -1}.get(label_on, label_on)
                if not isinstance(index, int) or not -len(segments) <= index < len(segments):
                    raise ValueError(f"label_on must be 'longest', 'first', 'last' or a segment index, got {label_on!r}")
                (ax_, ay), (bx, by) = segments[index]
            mx, my = (ax_ + bx) / 2, (ay + by) / 2
            horizontal = abs(bx - ax_) >= abs(by - ay)
            at = label_at if label_at != "auto" else ("above" if horizontal else "right")
            offsets = {"above": (0, -0.05, "center", "bottom"), "below": (0, 0.05, "center", "top"),
                       "left": (-0.07, 0, "right", "center"), "right": (0.07, 0, "left", "center")}
            if at not in offsets:
                raise ValueError(f"label_at must be one of {sorted(offsets) + ['auto']}, got {label_at!r}")
            dx, dy, ha, va = offsets[at]
            self.text(mx + dx, my + dy, label, size=_SMALL_PT, colour=MUTED, ha=ha, va=va, zorder=3)

    def group(self, items: Sequence[Block], label: str = "", *, pad: float = 0.12, colour=MUTED,
              label_at: str = "top") -> Block:
        """A dashed rounded box around ``items`` and their labels (e.g. "one head", "decoder layer", "× N")."""
        import matplotlib.patches as mpatches

        if not items:
            raise ValueError("items must name at least one Block to group")
        boxes = [i.bounds or (i.x0, i.y0 - i.lift, i.x1 + i.lift, i.y1) for i in items]
        x0 = min(b[0] for b in boxes) - pad
        y0 = min(b[1] for b in boxes) - pad
        x1 = max(b[2] for b in boxes) + pad
        y1 = max(b[3] for b in boxes) + pad
        patch = mpatches.FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.1",
                                        facecolor="none", edgecolor=colour, linewidth=1.0, linestyle=(0, (4, 3)),
                                        zorder=1)
        patch.set_gid(f"group:{label}")
        self.ax.add_patch(patch)
        self._note(x0, y0, x1, y1)
        box = Block(x0, y0, x1 - x0, y1 - y0, label, "group")
        if label:
            if label_at == "top":
                self.text(x0 + 0.12, y0, label, size=_SMALL_PT, colour=INK, ha="left", va="center",
                          background="white", style="italic", zorder=3)
            elif label_at == "below":
                self.text((x0 + x1) / 2, y1 + 0.05, label, size=_SMALL_PT, colour=INK, va="top", style="italic",
                          zorder=3)
            else:
                raise ValueError(f"label_at must be 'top' or 'below', got {label_at!r}")
        return box

    def legend(self, roles: Sequence[str] | None = None, *, y: float | None = None, x: float | None = None):
        """A row of swatches naming the roles drawn (default: every role used so far, in palette order)."""
        import matplotlib.patches as mpatches
        from matplotlib import colormaps

        names = {"input": "input", "query": "query", "key": "key", "value": "value", "score": "score",
                 "weight": "weight", "output": "output", "position": "position", "state": "state / cache",
                 "parameter": "parameter", "mask_allowed": "may attend", "mask_blocked": "blocked"}
        used = set(self._roles) | ({"mask_blocked"} if "mask_allowed" in self._roles else set())
        roles = [r for r in PALETTE if r in used] if roles is None else list(roles)
        for r in roles:
            _role(r)
        x = self._bounds[0] if x is None else x
        y = self._bounds[3] + 0.25 if y is None else y
        for r in roles:
            if r == "weight":
                for k in range(4):
                    self.ax.add_patch(mpatches.Rectangle((x + k * 0.04, y - 0.07), 0.04, 0.14,
                                                         facecolor=colormaps[WEIGHT_CMAP](k / 3), edgecolor="none"))
            else:
                patch = mpatches.Rectangle((x, y - 0.07), 0.16, 0.14, facecolor=PALETTE[r], edgecolor=_edge(PALETTE[r]))
                patch.set_gid(f"legend:{r}")
                self.ax.add_patch(patch)
            label = self.text(x + 0.22, y, names[r], size=_SMALL_PT, colour=INK, ha="left")
            x = label.x1 + 0.22
        self._note(self._bounds[0], y - 0.1, x, y + 0.1)

    def finish(self, alt: str, *, margin: float = 0.08):
        """Size the figure to its contents (1 data unit = 1 inch) and attach ``alt`` as ``fig.attn_alt``.

        Args:
            alt: the text alternative; it must start with "Diagram".

        Returns:
            The matplotlib ``Figure``.
        """
        if not isinstance(alt, str) or not alt.startswith("Diagram"):
            raise ValueError(f"alt must be a text alternative starting with 'Diagram', got {alt!r}")
        x0, y0, x1, y1 = self._bounds
        x0, y0, x1, y1 = x0 - margin, y0 - margin, x1 + margin, y1 + margin
        self.fig.set_size_inches(x1 - x0, y1 - y0)
        self.ax.set_xlim(x0, x1)
        self.ax.set_ylim(y1, y0)  # y points down
        self.fig.attn_alt = alt
        return self.fig


def alt_text(fig) -> str:
    """The text alternative a builder attached to ``fig`` (``fig.attn_alt``)."""
    alt = getattr(fig, "attn_alt", None)
    if not alt:
        raise ValueError("fig has no text alternative: draw it with an attn_course.diagrams builder or "
                         "Diagram.finish(alt=...)")
    return alt


def show(fig, *, dpi: int = 100):
    """Display ``fig`` in a notebook: the PNG, with its alt text as the output's plain text.

    The plain text is what a reader without the picture gets (a terminal, a screen reader over the
    raw notebook); nbval compares it on every run, so it stays in step with the code. Put the same
    text in the cell's metadata, ``"mystnb": {"image": {"alt": ...}}``, for the website.
    """
    import io

    from IPython.display import display

    alt = alt_text(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    display({"image/png": buffer.getvalue(), "text/plain": alt}, raw=True)


def diagram_alt_texts(cell: dict) -> list[str]:
    """The alt texts of the diagrams a notebook cell shows: image outputs whose plain text starts "Diagram"."""
    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        plain = "".join(data.get("text/plain", ""))
        if "image/png" in data and plain.startswith("Diagram"):
            found.append(plain)
    return found


def sync_alt_texts(path) -> int:
    """Copy each diagram's alt text (what :func:`show` wrote) into its cell's metadata, for the website.

    A cell whose ``"mystnb": {"image": {"alt": ...}}`` already contains the text keeps it (an author
    may add sentences after it); otherwise the text replaces it. Run it on an executed notebook.

    Args:
        path: the ``.ipynb`` file.

    Returns:
        How many cells changed.
    """
    import json
    import pathlib

    path = pathlib.Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise ValueError(f"path must be an existing .ipynb notebook, got {str(path)!r}")
    notebook = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for cell in notebook.get("cells", []):
        texts = diagram_alt_texts(cell)
        if not texts:
            continue
        image = cell.setdefault("metadata", {}).setdefault("mystnb", {}).setdefault("image", {})
        if not all(text in image.get("alt", "") for text in texts):
            image["alt"] = " ".join(texts)
            changed += 1
    if changed:
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


# ----------------------------------------------------------------------------------------------
# Builders. Sizes are the chapter's; ``names`` renames the symbols of the shapes (``{"L": "T"}``)
# and ``shapes`` chooses "both" (symbols over numbers), "numbers" or "symbols".


class _Shapes:
    def __init__(self, names: Mapping[str, str] | None, style: str, sizes: Mapping[str, int]):
        if style not in ("both", "numbers", "symbols"):
            raise ValueError(f"shapes must be 'both', 'numbers' or 'symbols', got {style!r}")
        if names is not None and not isinstance(names, Mapping):
            raise TypeError(f"names must be a mapping such as {{'L': 'T'}}, got {type(names).__name__}")
        self.names, self.style, self.sizes = dict(names or {}), style, sizes

    def sym(self, key: str) -> str:
        return self.names.get(key, key)

    def __call__(self, *keys: str) -> str:
        comma = "," if len(keys) == 1 else ""  # a 1-D shape reads (S,) as in Python
        symbols = ", ".join(self.sym(k) for k in keys) + comma
        numbers = ", ".join(str(self.sizes[k]) for k in keys) + comma
        if self.style == "numbers":
            return f"({numbers})"
        if self.style == "symbols":
            return f"({symbols})"
        return f"({symbols})\n({numbers})"

    def count(self, key: str) -> str:
        """One size in words: ``Sb = 3`` (or ``3``, or ``Sb``, as ``shapes`` says)."""
        return {"numbers": f"{self.sizes[key]}", "symbols": self.sym(key)}.get(self.style,
                                                                            f"{self.sym(key)} = {self.sizes[key]}")

    def alt(self, *keys: str) -> str:
        """The shape for the alt text: ``(L, D) = (6, 8)``."""
        comma = "," if len(keys) == 1 else ""
        symbols = ", ".join(self.sym(k) for k in keys) + comma
        numbers = ", ".join(str(self.sizes[k]) for k in keys) + comma
        return f"({symbols}) = ({numbers})"


def _as_cells(cells) -> np.ndarray:
    """A 2-D object array of matplotlib colours from nested lists of names, hex strings or RGB(A) tuples."""
    if isinstance(cells, np.ndarray) and cells.dtype == object and cells.ndim == 2:
        return cells
    array = np.asarray(cells)
    if array.ndim == 3 and array.shape[-1] in (3, 4) and array.dtype != object:  # numbers: RGB(A) per cell
        out = np.empty(array.shape[:2], dtype=object)
        for index in np.ndindex(*array.shape[:2]):
            out[index] = tuple(array[index])
        return out
    if array.ndim != 2:
        raise ValueError(f"cells must be a 2-D grid of colours, got an array of shape {array.shape}")
    return array.astype(object)


def _demo_weights(rows: int, cols: int, allowed=None, seed: int = 0) -> np.ndarray:
    """Illustrative softmax weights at the drawn resolution (zero where ``allowed`` is False)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0.0, 1.2, (rows, cols)) + 1.5 * np.eye(rows, cols)
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    e = np.nan_to_num(e)
    total = e.sum(axis=1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _mask_grid(kind, L: int, S: int, window: int | None, padding: int):
    """The (min(L, CAP), min(S, CAP)) boolean grid drawn for a mask, True = may attend, and its words."""
    rows, cols = min(L, CAP), min(S, CAP)
    i = np.arange(rows)[:, None] * (L / rows)
    j = np.arange(cols)[None, :] * (S / cols)
    offset = 0  # query i sees keys 0..i, as causal_mask's default align="top_left" (else pass an array)
    if isinstance(kind, str):
        parts = kind.split("+")
        allowed = np.ones((rows, cols), dtype=bool)
        words = []
        for part in parts:
            if part == "causal":
                allowed &= j <= i + offset
                words.append("causal (a query sees itself and the keys before it)")
            elif part == "sliding":
                if window is None:
                    raise ValueError("mask='sliding' needs window=<number of keys a query sees>")
                allowed &= (j <= i + offset) & (j > i + offset - window)
                words.append(f"sliding window (a query sees the last {window} keys, itself included)")
            elif part == "padding":
                allowed &= j < S - padding
                words.append(f"padding (the last {padding} keys are padding)")
            else:
                raise ValueError("mask must be None, 'causal', 'padding', 'sliding', a combination such as "
                                 f"'causal+padding', or an (L, S) boolean array; got {kind!r}")
        return allowed, " and ".join(words)
    grid = np.asarray(kind)
    if grid.dtype != bool or grid.shape != (L, S) or L > CAP or S > CAP:
        raise ValueError(f"a mask array must be boolean of shape (L, S) = {(L, S)} with L, S <= {CAP}, "
                         f"got dtype {grid.dtype} and shape {grid.shape}")
    return grid, "given"


def _mask_cells(allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, PALETTE["mask_allowed"], PALETTE["mask_blocked"]).astype(object)


def _fit(draw, max_width: float = MAX_WIDTH):
    """Run ``draw(diagram) -> alt`` with cells small enough that the diagram is at most ``max_width`` wide.

    The width grows linearly with the cell size (text and gaps stay), so two tries find the line and
    a third draws at the largest cell that fits (never below MIN_CELL).
    """
    d = Diagram(cell=CELL)
    alt = draw(d)
    if d.width <= max_width:
        return d.finish(alt)
    small = Diagram(cell=MIN_CELL)
    small_alt = draw(small)
    if small.width >= max_width:
        return small.finish(small_alt)
    slope = (d.width - small.width) / (CELL - MIN_CELL)
    cell = MIN_CELL + (max_width - small.width) / slope * 0.98
    d = Diagram(cell=cell)
    alt = draw(d)
    return d.finish(alt) if d.width <= max_width else small.finish(small_alt)


def _rename(labels: Mapping[str, str] | None, defaults: Sequence[str]):
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping such as {{'Q': 'queries'}}, got {type(labels).__name__}")
    unknown = set(labels or {}) - set(defaults)
    if unknown:
        raise ValueError(f"labels can rename {sorted(defaults)}, got {sorted(unknown)}")
    return lambda n: (labels or {}).get(n, n)


def attention_flow(L: int = 6, D: int = 8, *, S: int | None = None, E: int | None = None, Dv: int | None = None,
                   heads: int | None = None, batch: int | None = None, projections: bool = True,
                   simple: bool = False, scale: bool = True, mask=None, window: int | None = None,
                   padding: int | None = None, bias: str | None = None, rotary: bool | str = False,
                   names: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
                   shapes: str = "both", legend: bool = False, weights=None, out_proj: bool = False):
    """Attention's data flow: X -> Q, K, V -> scores -> (scale, mask, bias) -> softmax -> weights -> @V -> output.

    Chapters 02 (``simple=True``: Q = K = V = X), 03 (projections and the scale), 04 (``mask``),
    09 (``rotary=True``, ``bias="alibi"``) and 10 (``mask="sliding"``) draw it.

    Args:
        L: queries. D: width of queries and keys. S: keys (default L). E: width of X (default D).
        Dv: width of values (default D). heads: draw every tensor as a stack of this many heads.
        batch: add a batch axis B to the shapes (not drawn).
        projections: start from X and the three projections W_Q, W_K, W_V (else from Q, K, V);
            self-attention only (S = L).
        simple: chapter 02's simple self-attention, softmax(X Xᵀ) X: no projections, no scale.
        scale: divide the scores by √D.
        mask: None, "causal", "padding", "sliding", "causal+padding", or an (L, S) boolean array
            (True = may attend; L, S <= CAP).
        window: the sliding window's width. padding: how many keys are padding (default S // 3).
        bias: None or "alibi" (a bias added to the scores).
        rotary: rotate Q and K by their positions before the scores; a string names those positions
            (e.g. ``"0..5"``), written under each "rotate" node ("by 0..5") and in the alt text.
        names: other symbols for the shapes, e.g. ``{"L": "T", "D": "d_k"}``.
        labels: other names for the blocks X, Q, K, V, QKᵀ, M, A, O, e.g. ``{"A": "α"}``.
        shapes: "both" (symbols over sizes), "numbers" or "symbols".
        legend: add a row naming the colours.
        weights: the (L, S) attention weights to shade the weights block A with (a tensor or an array;
            L, S <= CAP), so that the picture shows the chapter's own numbers (A's name is then written
            under the block, not over its middle cells); by default an illustrative pattern (zero where
            the mask blocks).
        out_proj: with ``heads``, end with the heads' outputs side by side, ``(L, H * Dv)``, through the
            output projection W_O into Y ``(L, E)``, as a multi-head module does (default False: end at O).

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, D = _size(L, "L"), _size(D, "D")
    if out_proj and heads is None:
        raise ValueError("out_proj=True draws the heads merged and W_O: it needs heads")
    self_attention = S is None
    S = L if S is None else _size(S, "S")
    E = D if E is None else _size(E, "E")
    H = None if heads is None else _size(heads, "heads")
    if bias not in (None, "alibi"):
        raise ValueError(f"bias must be None or 'alibi', got {bias!r}")
    if projections and not simple and S != L:
        raise ValueError(f"projections draw self-attention from one X, so S must equal L (got S={S}, L={L}); "
                         "for keys of another length pass projections=False")
    if simple:
        projections, scale, D = False, False, E
    Dv = D if Dv is None else _size(Dv, "Dv")
    padding = max(1, S // 3) if padding is None else _size(padding, "padding")
    if padding >= S and isinstance(mask, str) and "padding" in mask:
        raise ValueError(f"padding must leave at least one real key, got padding={padding} with S={S}")
    allowed, mask_words = (None, "") if mask is None else _mask_grid(mask, L, S, window, padding)
    if weights is not None:
        if hasattr(weights, "detach"):
            weights = weights.detach().cpu().numpy()
        weights = np.asarray(weights, dtype=float)
        if weights.shape != (L, S) or L > CAP or S > CAP or not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"weights must be finite, non-negative (L, S) = {(L, S)} attention weights with L, S <= "
                             f"{CAP}, got shape {weights.shape}")
    if names is not None and not isinstance(names, Mapping):
        raise TypeError(f"names must be a mapping such as {{'L': 'T'}}, got {type(names).__name__}")
    names = dict(names or {})
    if simple:
        names.setdefault("D", names.get("E", "E"))  # X is both: its width is E
    if "Dv" not in names and Dv == D:
        names["Dv"] = names.get("D", "D")  # one symbol when values are as wide as keys
    if self_attention:
        names.setdefault("S", names.get("L", "L"))  # self-attention: as many keys as queries
    shp = _Shapes(names, shapes, {"L": L, "S": S, "D": D, "E": E, "Dv": Dv, "H": H or 1, "B": batch or 1})
    lab = _rename(labels, ["X", "Q", "K", "V", "QKᵀ", "M", "A", "O"])
    lead = (("B",) if batch else ()) + (("H",) if H else ())
    depth = H or 1
    qkv = ("X", "X", "X") if simple else ("Q", "K", "V")
    qkv_roles = ("input",) * 3 if simple else ("query", "key", "value")
    score_name = lab("QKᵀ") if not simple else "XXᵀ"
    chain = (["÷√" + shp.sym("D")] if scale else []) + (["mask"] if mask is not None else []) + \
            (["+ bias"] if bias else []) + ["softmax"]

    def draw(d: Diagram) -> str:
        sx = lambda *k: shp(*lead, *k)  # noqa: E731
        f = d.lift(depth)
        label_h = 0.34  # a two-line shape label
        gap = label_h + 0.16 + f + (0.2 if d.ext(min(L, S)) < 0.24 or d.ext(min(D, Dv)) < 0.3 else 0.0)  # names above
        w_in = d.ext(E)
        x_c2 = (w_in + 0.2 + 0.15 + 0.7 + 0.25) if projections else 0.0
        x_c2 += 0.75 if rotary else 0.0
        w2 = max(d.ext(D if not simple else E), d.ext(Dv))
        y_q = f + d.ext(L) / 2
        y_k = y_q + d.ext(L) / 2 + gap + d.ext(S) / 2
        q = d.block((x_c2 + d.ext(D) / 2, y_q), L, D, role=qkv_roles[0], name=lab(qkv[0]), shape=sx("L", "D"),
                    depth=depth)
        k = d.block((x_c2 + d.ext(D) / 2, y_k), S, D, role=qkv_roles[1], name=lab(qkv[1]), shape=sx("S", "D"),
                    depth=depth)
        steps = []
        # Q Kᵀ and the scores
        dot = d.op((x_c2 + w2 + f + 0.4, (y_q + y_k) / 2), "@")
        d.arrow(q.right, dot.top, via=[(dot.center[0], q.right[1])])
        d.arrow(k.right, dot.bottom, via=[(dot.center[0], k.right[1])], label=lab(qkv[1]) + "ᵀ", label_on="first")
        s = d.block((dot.x1 + 0.35 + d.ext(S) / 2, dot.center[1]), L, S, role="score", name=score_name,
                    shape=sx("L", "S"), shape_at="above", depth=depth)
        d.arrow(dot.right, s.left)
        steps.append(f"{lab(qkv[0])} {lab(qkv[1])}ᵀ gives the scores {score_name} {shp.alt(*lead, 'L', 'S')}")
        # the chain of operations under the scores, side blocks (mask, bias) to its right
        y, prev = s.y1 + 0.3, s.bottom
        side_bottom = -math.inf
        for label in chain:
            side_h = d.ext(L) + f if label in ("mask", "+ bias") else 0.0
            y = max(y, side_bottom + 0.25 + side_h / 2 + f) if side_h else y
            node = d.op((s.center[0], y), label)
            d.arrow(prev, node.top)
            if side_h:
                side_x = s.x1 + f + 0.35 + d.ext(S) / 2
                if label == "mask":
                    side = d.block((side_x, y), L, S, role="mask_allowed", name=lab("M"), shape=sx("L", "S"),
                                   shape_at="right", cells=_mask_cells(allowed), depth=depth)
                    steps.append(f"a {mask_words} mask {lab('M')} {shp.alt(*lead, 'L', 'S')} sets the blocked "
                                 "scores to minus infinity")
                else:
                    side = d.block((side_x, y), L, S, role="position", name="bias", shape=sx("L", "S"),
                                   shape_at="right", cells=_bias_cells(min(L, CAP), min(S, CAP)), depth=depth)
                    steps.append(f"an ALiBi bias {shp.alt(*lead, 'L', 'S')}, more negative the farther the key, "
                                 "is added")
                d.arrow(side.left, node.right)
                side_bottom = side.y1
            elif label.startswith("÷"):
                steps.append(f"they are divided by √{shp.sym('D')} = √{D}")
            prev = node.bottom
            y += 0.42
        y_a = max(y - 0.1 + f, side_bottom + 0.3 + f) + d.ext(L) / 2
        a = d.block((s.center[0], y_a), L, S, role="weight", name=lab("A"), shape=sx("L", "S"), shape_at="left",
                    values=_demo_weights(min(L, CAP), min(S, CAP), allowed) if weights is None else weights,
                    name_at="inside" if weights is None else "below",  # given weights: no cell hidden by the name
                    depth=depth)
        d.arrow(prev, a.top)
        steps.append(f"a softmax along each row gives the weights {lab('A')} {shp.alt(*lead, 'L', 'S')}"
                     + (", zero where the mask blocks" if mask is not None else ""))
        av = d.op((a.x1 + f + 0.4, a.center[1]), "@")
        d.arrow(a.right, av.left)
        o = d.block((av.x1 + 0.35 + d.ext(Dv) / 2, a.center[1]), L, Dv, role="output", name=lab("O"),
                    shape=sx("L", "Dv"), depth=depth)
        d.arrow(av.right, o.left)
        if out_proj:  # the heads side by side, then W_O (the multi-head module's last step)
            wo = d.op((o.x1 + 0.75, o.center[1]), "concat heads,\n@ W_O")
            d.arrow(o.right, wo.left)
            y_out = d.block((wo.x1 + 0.35 + d.ext(E) / 2, o.center[1]), L, E, role="output", name="Y",
                            shape=shp(*lead[:1 if batch else 0], "L", "E"))
            d.arrow(wo.right, y_out.left)
        # V sits under K, low enough that its arrow passes under A's shape label
        y_v = max(k.y1 + gap + d.ext(S) / 2, a.y1 + 0.3)
        v = d.block((x_c2 + d.ext(Dv) / 2, y_v), S, Dv, role=qkv_roles[2], name=lab(qkv[2]), shape=sx("S", "Dv"),
                    depth=depth)
        d.arrow(v.right, av.bottom, via=[(av.center[0], v.right[1])])
        steps.append(f"{lab('A')} {lab(qkv[2])} gives the output {lab('O')} {shp.alt(*lead, 'L', 'Dv')}")
        if out_proj:
            steps.append(f"the {H} heads' outputs, side by side, go through the output projection W_O into "
                         f"Y {shp.alt(*lead[:1 if batch else 0], 'L', 'E')}")
        if projections:
            y_x = (q.center[1] + v.center[1]) / 2
            x = d.block((w_in / 2, y_x), L, E, role="input", name=lab("X"), shape=shp(*lead[:1 if batch else 0], "L", "E"))
            trunk = x.x1 + 0.2
            d.arrow(x.right, (trunk, y_x), head=False)
            for target, w_name in ((q, "W_Q"), (k, "W_K"), (v, "W_V")):
                ty = target.center[1]
                d.arrow((trunk, y_x), (trunk + 0.15, ty), via=[(trunk, ty)], head=False)
                node = d.op((trunk + 0.15 + 0.35, ty), "@ " + w_name)
                d.arrow((trunk + 0.15, ty), node.left)
                d.arrow(node.right, (target.x0 - (0.75 if rotary and target is not v else 0), ty))  # V is not rotated
            steps.insert(0, f"the input {lab('X')} {shp.alt(*lead[:1 if batch else 0], 'L', 'E')} is multiplied by "
                            f"W_Q, W_K and W_V into queries {lab('Q')} {shp.alt(*lead, 'L', 'D')}, keys {lab('K')} "
                            f"{shp.alt(*lead, 'S', 'D')} and values {lab('V')} {shp.alt(*lead, 'S', 'Dv')}")
        elif simple:
            steps.insert(0, f"the input X {shp.alt(*lead, 'L', 'E')} plays the queries, the keys and the values")
        else:
            steps.insert(0, f"queries {lab('Q')} {shp.alt(*lead, 'L', 'D')}, keys {lab('K')} "
                            f"{shp.alt(*lead, 'S', 'D')} and values {lab('V')} {shp.alt(*lead, 'S', 'Dv')}")
        if rotary:
            by = rotary if isinstance(rotary, str) else ""
            for target in (q, k):
                node = d.op((target.x0 - 0.4, target.center[1]), "rotate", note=f"by {by}" if by else "",
                            note_at="below")
                d.arrow(node.right, target.left)
                if not projections:
                    d.arrow((node.x0 - 0.25, target.center[1]), node.left)
            steps.insert(1, f"{lab('Q')} and {lab('K')} are rotated by their positions"
                            + (f" {by}" if by else "") + " (rotary embeddings)")
        if legend:
            d.legend()
        what = ("simple self-attention" if simple else "scaled dot-product attention" if scale
                else "dot-product attention")
        return (f"Diagram of {what}" + (f", every tensor a stack of {H} heads" if H else "") + ": "
                + "; ".join(steps) + ".")

    return _fit(draw)


def _bias_cells(rows: int, cols: int) -> np.ndarray:
    """ALiBi's bias at the drawn resolution: the position colour, darker the farther the key (more negative)."""
    distance = np.abs(np.arange(rows)[:, None] - np.arange(cols)[None, :])
    base = np.array(_rgb(PALETTE["position"]))
    cells = np.empty((rows, cols), dtype=object)
    for (i, j), dist in np.ndenumerate(distance):
        fade = 0.85 * dist / max(1, distance.max())
        cells[i, j] = tuple(base * (1 - fade) + fade * np.array([0.45, 0.2, 0.1]))
    return cells


def head_colour(h: int, tint: float = 0.0) -> tuple:
    """Head ``h``'s colour (:data:`HEAD_COLOURS`, cycling), mixed with ``tint`` parts of white (0 to 1)."""
    base = np.array(_rgb(HEAD_COLOURS[h % len(HEAD_COLOURS)]))
    return tuple(base + (1 - base) * tint)


def _head_columns(rows: int, cols: int, heads: int, tint: float) -> np.ndarray:
    """Drawn cells of an (L, E) tensor whose columns belong to ``heads`` consecutive heads."""
    cells = np.empty((min(rows, CAP), min(cols, CAP)), dtype=object)
    for (i, j), _ in np.ndenumerate(cells):
        cells[i, j] = head_colour(j * heads // cells.shape[1], tint)
    return cells


def _heads_check(E: int, H: int, name_e: str = "E") -> int:
    if E % H:
        raise ValueError(f"{name_e} must be divisible by heads, got {name_e}={E} and heads={H}")
    return E // H


def head_split(L: int = 5, E: int = 12, H: int = 3, *, batch: int | None = None, name: str = "Q",
               names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 05's memory layout: (L, E) -> view (L, H, D) -> transpose -> (H, L, D), no copy.

    Each head's D columns keep one head colour through the three steps.

    Args:
        L: tokens. E: model width. H: heads (``E % H == 0``; D = E / H). batch: add a batch axis B.
        name: the tensor's name (``"Q"``, ``"K"``, ``"V"``). names: other symbols, e.g. ``{"L": "T"}``.
        shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, E, H = _size(L, "L"), _size(E, "E"), _size(H, "H")
    D = _heads_check(E, H)
    shp = _Shapes(names, shapes, {"L": L, "E": E, "H": H, "D": D, "B": batch or 1})
    b = ("B",) if batch else ()
    tint = 0.0

    def draw(d: Diagram) -> str:
        first = d.block((d.ext(E) / 2, 0), L, E, role="query", name=name, shape=shp(*b, "L", "E"),
                        cells=_head_columns(L, E, H, tint))
        view = d.op((first.x1 + 0.55, 0), "view", note="no copy", note_at="below")
        d.arrow(first.right, view.left)
        x = view.x1 + 0.35
        part_w = d.ext(E) / H  # the view only regroups the columns: each head keeps its share of the width
        parts = []
        for h in range(H):
            part = d.block((x + part_w / 2, 0), L, D, role="query", width=part_w, slice_fills=[head_colour(h, tint)])
            parts.append(part)
            x = part.x1 + 0.04
        d.text((parts[0].x0 + parts[-1].x1) / 2, parts[0].y1 + 0.05, shp(*b, "L", "H", "D"), va="top")
        d.arrow(view.right, parts[0].left)
        perm = "transpose(1, 2)" if batch else "transpose(0, 1)"
        swap = d.op((parts[-1].x1 + 0.75, 0), perm, note="strides swap,\\nno copy".replace("\\n", "\n"), note_at="below")
        d.arrow(parts[-1].right, swap.left)
        stack = d.block((swap.x1 + 0.35 + part_w / 2, 0), L, D, role="query", name=name, depth=H, width=part_w,
                        slice_fills=[head_colour(h, tint) for h in range(H)], shape=shp(*b, "H", "L", "D"))
        d.arrow(swap.right, stack.left)
        return (f"Diagram of splitting {name} {shp.alt(*b, 'L', 'E')} into {H} heads: a view to "
                f"{shp.alt(*b, 'L', 'H', 'D')} keeps the memory as it is and gives each run of {D} neighbouring "
                f"columns to one head (one colour per head); {perm} gives {shp.alt(*b, 'H', 'L', 'D')}, a stack "
                "of one (L, D) slice per head, also without copying.")

    return _fit(draw)


def multihead_flow(L: int = 5, E: int = 12, H: int = 3, *, kv_heads: int | None = None, batch: int | None = None,
                   names: Mapping[str, str] | None = None, shapes: str = "both", legend: bool = False,
                   projections: bool = False):
    """Multi-head attention: Q, K, V split into heads, attention in each head, heads concatenated, W_O.

    Args:
        L: tokens. E: model width. H: query heads (``E % H == 0``; D = E / H).
        kv_heads: key/value heads G for grouped-query attention (chapter 10; ``H % G == 0``).
        batch: add a batch axis B to the shapes. names: other symbols, e.g. ``{"L": "T"}``.
        shapes: "both", "numbers" or "symbols". legend: add a row naming the colours, the heads' too.
        projections: start from the input X and each head's own projections W_Q,h, W_K,h, W_V,h
            (E, D) (chapter 05); without it the drawing starts from Q, K and V already split.

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, E, H = _size(L, "L"), _size(E, "E"), _size(H, "H")
    D = _heads_check(E, H)
    G = H if kv_heads is None else _size(kv_heads, "kv_heads")
    if H % G:
        raise ValueError(f"heads must be divisible by kv_heads, got H={H} and kv_heads={G}")
    shp = _Shapes(names, shapes, {"L": L, "E": E, "H": H, "D": D, "G": G, "B": batch or 1})
    b = ("B",) if batch else ()
    heads_edges = [HEAD_COLOURS[h % len(HEAD_COLOURS)] for h in range(H)]

    def draw(d: Diagram) -> str:
        f = d.lift(H)
        gap = 0.5 + f + (0.45 if projections else 0.0)  # room for the shapes below the blocks
        y = f + d.ext(L) / 2
        blocks = []
        for name, role, n in (("Q", "query", H), ("K", "key", G), ("V", "value", G)):
            blk = d.block((d.ext(D) / 2, y), L, D, role=role, name=name, depth=n,
                          shape_at="below" if projections else "left",
                          shape=shp(*b, "H" if n == H else "G", "L", "D"),
                          slice_edges=heads_edges if n == H else None)
            blocks.append(blk)
            y = blk.y1 + gap + d.ext(L) / 2
        q, k = blocks[:2]
        if G != H:  # which query heads each key/value head serves, in words between K and V
            n = H // G  # at least 2
            d.text(k.x1 + d.lift(G), k.y1 + 0.08, f"key/value head g serves\nquery heads {n}g to {n}g + {n - 1}",
                   va="top", ha="right")
        att = d.op((q.x1 + f + 1.0, k.center[1]), "attention\nin each head")
        for blk in blocks:
            d.arrow(blk.right, att.left, via=[(att.x0 - 0.25, blk.right[1]), (att.x0 - 0.25, att.center[1])]
                    if blk is not k else ())
        o = d.block((att.x1 + 0.4 + d.ext(D) / 2, k.center[1]), L, D, role="output", name="", depth=H,
                    slice_fills=[head_colour(h) for h in range(H)], shape=shp(*b, "H", "L", "D"), shape_at="above")
        d.arrow(att.right, o.left)
        cat = d.op((o.center[0], o.y1 + 0.45), "concat heads")
        d.arrow(o.bottom, cat.top)
        c = d.block((o.center[0], cat.y1 + 0.3 + d.ext(L) / 2), L, E, role="output", shape=shp(*b, "L", "E"),
                    cells=_head_columns(L, E, H, 0.0))
        d.arrow(cat.bottom, c.top)
        wo = d.op((c.x1 + 0.55, c.center[1]), "@ W_O")
        d.arrow(c.right, wo.left)
        out = d.block((wo.x1 + 0.35 + d.ext(E) / 2, c.center[1]), L, E, role="output", name="Y",
                      shape=shp(*b, "L", "E"))
        d.arrow(wo.right, out.left)
        start = ""
        if projections:
            w_x = d.ext(E)
            labels = [f"@ W_{name},h" for name in "QKV"]
            node_w = max(_text_box(label, _OP_PT)[0] + 0.16 for label in labels)
            x_node = -(0.22 + node_w / 2)
            trunk = x_node - node_w / 2 - 0.22
            y_x = blocks[1].center[1]
            x_blk = d.block((trunk - 0.15 - w_x / 2, y_x), L, E, role="input", name="X", shape=shp(*b, "L", "E"))
            d.arrow(x_blk.right, (trunk, y_x), head=False)
            for blk, label in zip(blocks, labels):
                ty = blk.center[1]
                node = d.op((x_node, ty), label, width=node_w)
                d.arrow((trunk, y_x), node.left, via=[(trunk, ty)] if ty != y_x else ())
                d.arrow(node.right, (blk.x0, ty))
            d.text(x_node, blocks[0].y0 - f - 0.3, "each head h has its own (E, D)\nslices of W_Q, W_K and W_V",
                   size=_SMALL_PT, colour=MUTED)
            start = (f"the input X {shp.alt(*b, 'L', 'E')} is multiplied by each head's own projections W_Q,h, "
                     f"W_K,h and W_V,h of shape (E, D) = ({E}, {D}), giving ")
        if legend:
            d.legend()
            y_heads = d._bounds[3] + 0.22
            x = d._bounds[0]
            for h in range(H):
                swatch = d.block((x + 0.08, y_heads), 1, 1, role="output", width=0.16, height=0.14, grid=False,
                                 slice_fills=[head_colour(h)])
                label = d.text(swatch.x1 + 0.06, y_heads, f"head {h}", size=_SMALL_PT, colour=INK, ha="left")
                x = label.x1 + 0.22
        kv_words = (f"keys K and values V {shp.alt(*b, 'H', 'L', 'D')}" if G == H else
                    f"keys K and values V {shp.alt(*b, 'G', 'L', 'D')} (written under K: key/value head g serves "
                    f"query heads {H // G}g to {H // G}g + {H // G - 1})")
        return (f"Diagram of {'grouped-query' if G != H else 'multi-head'} attention with {H} heads: {start}queries Q "
                f"{shp.alt(*b, 'H', 'L', 'D')} and {kv_words}{', which' if start else ''} go through attention in "
                f"each head separately; the "
                f"{H} head outputs {shp.alt(*b, 'H', 'L', 'D')}, one colour per head, are concatenated side by "
                f"side into {shp.alt(*b, 'L', 'E')}, and the output projection W_O mixes them into Y "
                f"{shp.alt(*b, 'L', 'E')}.")

    return _fit(draw)


def head_layouts(T: int = 5, E: int = 12, H: int = 3, *, step: str = "split"):
    """Chapter 05's memory layouts, cell by cell: the right split or merge of heads beside the wrong one.

    Every cell carries the index of the token it came from, and the colour of the head its column
    belongs to in ``x`` (one sequence of the batch). ``step="split"``: ``x`` (T, E) goes through
    ``view(B, T, H, D).transpose(1, 2)`` (each head one colour, token t in row t) and through the wrong
    ``view(B, H, T, D)`` (a "head" is a run of T * D numbers of memory: tokens and heads mixed).
    ``step="merge"``: the heads (H, T, D) go back through ``transpose(1, 2).reshape(B, T, E)`` (x again)
    and through ``reshape(B, T, E)`` without the transpose (rows mix tokens).

    Args:
        T: tokens (at most 10). E: model width (at most 16). H: heads (``E % H == 0``; D = E / H).
        step: "split" or "merge".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    T, E, H = _size(T, "T"), _size(E, "E"), _size(H, "H")
    if T > 10 or E > 16:
        raise ValueError(f"head_layouts draws every cell with its token: T must be at most 10 and E at most 16, "
                         f"got T={T} and E={E}")
    D = _heads_check(E, H)
    if step not in ("split", "merge"):
        raise ValueError(f"step must be 'split' or 'merge', got {step!r}")
    tint, gap = 0.5, 0.14
    first, second = (("view(B, T, H, D)\n.transpose(1, 2)", "view(B, H, T, D)") if step == "split" else
                     ("transpose(1, 2)\n.reshape(B, T, E)", "reshape(B, T, E)\nwithout transpose"))
    op_w = max(_text_box(label, _OP_PT)[0] for label in (first, second)) + 0.2
    cell = min(0.2, (MAX_WIDTH - 1.1 - op_w - 2 * (H - 1) * gap) / (2 * E))

    # (token, head) of every cell: x is (T, E); the heads are H slices (T, D); memory is row-major.
    x_cells = [[(t, j // D) for j in range(E)] for t in range(T)]
    heads_right = [[[(t, h) for _ in range(D)] for t in range(T)] for h in range(H)]
    if step == "split":  # a wrong "head" h is the run of numbers h*T*D .. (h+1)*T*D - 1 of x
        flat = [x_cells[n // E][n % E] for n in range(T * E)]
        wrong = [[[flat[h * T * D + r * D + c] for c in range(D)] for r in range(T)] for h in range(H)]
    else:  # merging without the transpose reads the heads' memory (H, T, D) straight into rows of E
        flat = [heads_right[n // (T * D)][(n // D) % T][n % D] for n in range(T * E)]
        wrong = [[flat[r * E + c] for c in range(E)] for r in range(T)]

    def grid(d: Diagram, x0: float, y0: float, cells, edge=None, title: str = ""):
        """A (rows, cols) grid of (token, head) cells with top-left corner (x0, y0); returns its Block."""
        rows, cols = len(cells), len(cells[0])
        colours = [[head_colour(h, tint) for (_, h) in row] for row in cells]
        b = d.block((x0 + cols * d.cell / 2, y0 + rows * d.cell / 2), rows, cols, role="input", cells=colours,
                    width=cols * d.cell, height=rows * d.cell,
                    slice_edges=[edge] if edge is not None else None)
        for r, row in enumerate(cells):
            for c, (t, h) in enumerate(row):
                d.text(x0 + (c + 0.5) * d.cell, y0 + (r + 0.5) * d.cell, str(t), size=6.5,
                       colour=text_colour(head_colour(h, tint)), zorder=3)
        if title:
            d.text(b.center[0], y0 - 0.06, title, size=_SMALL_PT, colour=INK, va="bottom")
        return b

    def heads(d: Diagram, x0: float, y0: float, slices, names):
        blocks = []
        for h, cells in enumerate(slices):
            blocks.append(grid(d, x0, y0, cells, edge=HEAD_COLOURS[h % len(HEAD_COLOURS)], title=names[h]))
            x0 = blocks[-1].x1 + gap
        return blocks

    def draw(d: Diagram) -> str:
        lane_h = T * d.cell + 0.75
        y_right, y_wrong = 0.3, 0.3 + lane_h
        if step == "split":
            left = grid(d, 0.0, (y_right + y_wrong) / 2, x_cells, title=f"x, one sequence (T, E) = ({T}, {E})")
        else:
            left = heads(d, 0.0, (y_right + y_wrong) / 2, heads_right, [f"head {h}" for h in range(H)])
        left_x1 = left.x1 if step == "split" else left[-1].x1
        ops_x = left_x1 + 0.45 + op_w / 2
        for y, label, ok in ((y_right, first, True), (y_wrong, second, False)):
            mid = y + T * d.cell / 2
            o = d.op((ops_x, mid), label, width=op_w)
            d.arrow((left_x1, (y_right + y_wrong) / 2 + T * d.cell / 2), o.left,
                    via=[(left_x1 + 0.2, (y_right + y_wrong) / 2 + T * d.cell / 2), (left_x1 + 0.2, mid)])
            x0 = o.x1 + 0.25
            d.arrow(o.right, (x0, mid))
            if step == "split":
                names = [f"head {h}" if ok else f"'head' {h}" for h in range(H)]
                blocks = heads(d, x0, y, heads_right if ok else wrong, names)
                under = blocks[0].y1
            else:
                block = grid(d, x0, y, x_cells if ok else wrong, title=f"(T, E) = ({T}, {E})")
                under = block.y1
            verdict = ("✓ row t = token t" + ("; one head each" if step == "split" else ": x again")
                       if ok else "✗ rows mix tokens" + (" and heads" if step == "split" else ""))
            d.text(x0, under + 0.07, verdict, size=_SMALL_PT, colour=INK if ok else "#A01010", ha="left", va="top")
        key = "the head of its column in x" if step == "split" else "its head"
        d.text(0.0, y_wrong + T * d.cell + 0.3, f"number in a cell: its token; colour: {key}", size=_SMALL_PT,
               colour=MUTED, ha="left")
        if step == "split":
            w0 = [t for t, _ in (row[0] for row in wrong[0])]
            return (f"Diagram of splitting x, one sequence of shape (T, E) = ({T}, {E}), into {H} heads of width "
                    f"{D}, cell by cell: each cell shows the token it belongs to and has the colour of the head of "
                    f"its column. view(B, T, H, D).transpose(1, 2) gives each head one colour and token t in row t. "
                    f"The wrong view(B, H, T, D) cuts the memory into {H} runs of {T * D} numbers: 'head' 0 holds "
                    f"tokens {', '.join(map(str, w0))} in its rows, with columns of several heads.")
        r0 = sorted({t for t, _ in wrong[0]})
        return (f"Diagram of merging {H} heads of shape (T, D) = ({T}, {D}) back into (T, E) = ({T}, {E}), cell by "
                f"cell: each cell shows its token and has the colour of its head. transpose(1, 2).reshape(B, T, E) "
                f"gives back the layout of x: token t in row t, the heads side by side. reshape(B, T, E) without "
                f"the transpose fills row 0 with tokens {', '.join(map(str, r0))} of head 0.")

    d = Diagram(cell=cell)
    return d.finish(draw(d))

def seq2seq_attention(S: int = 6, D: int = 8, *, kind: str = "additive", tokens: Sequence[str] | None = None,
                      names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 01: one decoder step of an RNN encoder-decoder attending over the encoder states.

    Each source position j is a lane: its token, its encoder state h_j, its score e_j and its weight
    α_j; the context c is the weighted sum of the states.

    Args:
        S: source positions (lanes drawn up to CAP). D: width of the states.
        kind: "additive" (Bahdanau: the previous decoder state s_{i-1} is the query, the context goes
            into the GRU) or "dot" (Luong: the new state s_i is the query, the context is combined with it).
        tokens: the source tokens written over the lanes (default x₁ … x_S).
        names: other symbols, e.g. ``{"D": "h"}``. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    S, D = _size(S, "S"), _size(D, "D")
    if kind not in ("additive", "dot"):
        raise ValueError(f"kind must be 'additive' (Bahdanau) or 'dot' (Luong), got {kind!r}")
    lanes = min(S, CAP)
    if tokens is not None and len(tokens) != S:
        raise ValueError(f"tokens must give one string per source position, {S}, got {len(tokens)}")
    sub = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
    words = [str(t) for t in tokens] if tokens is not None else [f"x{str(j + 1).translate(sub)}" for j in range(S)]
    if S > lanes:  # the lane before the last stands for all the positions not drawn
        words = words[:lanes - 2] + ["⋯", words[-1]]
    shp = _Shapes(names, shapes, {"S": S, "D": D})
    query = "s_{i−1}" if kind == "additive" else "s_i"
    query = query.replace("_{i−1}", "ᵢ₋₁").replace("_i", "ᵢ")
    score_text = "vᵀ tanh(W s + U hⱼ)" if kind == "additive" else "s · hⱼ"

    def draw(d: Diagram) -> str:
        from matplotlib import colormaps

        lane_w, gap = max(d.cell, 0.16), 0.14
        skip = lanes - 2 if S > lanes else None  # the lane drawn as "⋯" when S is above CAP
        sq = d.block((lane_w / 2, 0.22 + d.ext(D) / 2), D, 1, role="query", width=lane_w)
        d.text(sq.center[0], 0.08, "decoder\nstate " + query, size=_SMALL_PT, colour=INK, va="bottom")
        x0 = sq.x1 + 0.75
        xs = [x0 + j * (lane_w + gap) + lane_w / 2 for j in range(lanes)]
        span = (xs[0] - lane_w / 2 - 0.05, xs[-1] + lane_w / 2 + 0.05)
        mid = (span[0] + span[1]) / 2

        def lane_blocks(y, rows, role, colours=None):
            out = []
            for j, x in enumerate(xs):
                if j == skip:
                    d.text(x, y, "⋯", colour=INK)
                    continue
                cells = None if colours is None else [[tuple(colours[j])]]
                out.append(d.block((x, y), rows, 1, role=role, width=lane_w, cells=cells))
            return out

        for j, word in enumerate(words):
            d.text(xs[j], 0, word, size=_SMALL_PT, colour=INK)
        hs = lane_blocks(sq.center[1], D, "state")
        for a, b in zip(hs, hs[1:]):
            d.arrow((a.x1, a.y0 + 0.06), (b.x0, a.y0 + 0.06))
        d.text(span[1] + 0.1, hs[0].y0 + 0.02, "encoder states hⱼ\n" + shp("S", "D"), ha="left", va="top")
        score = d.op((mid, hs[0].y1 + 0.4), "score: " + score_text, width=span[1] - span[0])
        for h in hs:
            d.arrow(h.bottom, (h.bottom[0], score.y0))
        d.arrow(sq.bottom, score.left, via=[(sq.center[0], score.center[1])])
        y_e = score.y1 + 0.3
        es = lane_blocks(y_e, 1, "score")
        for e in es:
            d.arrow((e.center[0], score.y1), e.top)
        d.text(span[1] + 0.1, y_e, "scores eⱼ " + shp("S").replace("\n", " = "), ha="left")
        soft = d.op((mid, y_e + 0.4), "softmax over j", width=span[1] - span[0])
        for e in es:
            d.arrow(e.bottom, (e.center[0], soft.y0))
        y_a = soft.y1 + 0.3
        weights = np.exp(-0.5 * (np.arange(lanes) - 0.6 * (lanes - 1)) ** 2 / 1.2)  # a peak, as attention has
        alphas = lane_blocks(y_a, 1, "weight", [colormaps[WEIGHT_CMAP](w / weights.max()) for w in weights])
        for a in alphas:
            d.arrow((a.center[0], soft.y1), a.top)
        d.text(span[1] + 0.1, y_a, "weights αⱼ " + shp("S").replace("\n", " = "), ha="left")
        total = d.op((mid, y_a + 0.4), "Σⱼ αⱼ hⱼ", width=span[1] - span[0])
        for a in alphas:
            d.arrow(a.bottom, (a.center[0], total.y0))
        right = span[1] + 1.45
        d.arrow((hs[-1].x1, hs[-1].y1 - 0.08), total.right, via=[(right, hs[-1].y1 - 0.08), (right, total.center[1])],
                label="hⱼ", label_on=1)
        c = d.block((mid, total.y1 + 0.25 + d.ext(D) / 2), D, 1, role="output", width=lane_w, name="context c",
                    name_at="right", shape=shp("D"), shape_at="left")
        d.arrow(total.bottom, c.top)
        use = ("GRU([yᵢ₋₁; c], sᵢ₋₁) → sᵢ" if kind == "additive" else "tanh(W_c [c; sᵢ]) → next token")
        nxt = d.op((mid, c.y1 + 0.35), use)
        d.arrow(c.bottom, nxt.top)
        who = ("the previous decoder state sᵢ₋₁" if kind == "additive" else "the new decoder state sᵢ")
        score_words = ("an additive score vᵀ tanh(W s + U hⱼ)" if kind == "additive" else "a dot product s · hⱼ")
        then = ("the context and the previous token go into the GRU that gives the next state sᵢ"
                if kind == "additive" else "the context and sᵢ are combined, tanh(W_c [c; sᵢ]), to predict the "
                "next token")
        return (f"Diagram of one decoder step of {'Bahdanau' if kind == 'additive' else 'Luong'} attention: the "
                f"encoder states h₁ … h_S {shp.alt('S', 'D')} sit in one lane per source token; {who} "
                f"{shp.alt('D')} is compared with every hⱼ by {score_words}, giving one score per lane "
                f"{shp.alt('S')}; a softmax over the lanes gives the weights αⱼ, and the context c "
                f"{shp.alt('D')} is the weighted sum of the states; {then}.")

    return _fit(draw)


def encoder_decoder_step(kind: str = "additive", S: int = 8, E: int = 16, D: int = 64, V: int = 12, *,
                         tokens: Sequence[str] | None = None, names: Mapping[str, str] | None = None,
                         shapes: str = "both"):
    """Chapter 01: an RNN encoder-decoder at decoder step i, without attention, with Bahdanau's or Luong's.

    The encoder's states H (one row h_j per source token) sit on the left, with the summary c made
    from its two ends. The decoder step reads left to right in the order it computes:

    - ``"none"``: the GRU reads the previous token y_{i-1}, the summary c and s_{i-1}; the output
      layer reads [s_i; c]. Nothing but c leaves the encoder: the bottleneck.
    - ``"additive"`` (Bahdanau): s_{i-1} queries H (additive score, softmax over j, weighted sum)
      first; the context c_i goes into the GRU with y_{i-1}; the output layer reads [s_i; c_i].
    - ``"dot"`` (Luong): the GRU reads y_{i-1} and s_{i-1} first; the new state s_i queries H (dot
      product); tanh(W_c [c_i; s_i]) gives h̃_i, which the output layer reads.

    Args:
        kind: "none", "additive" or "dot".
        S: source positions. E: embedding width. D: state width (encoder states, decoder states,
            context). V: vocabulary size (the logits).
        tokens: the S source tokens written beside H's rows (default x₀ … x_{S-1}; at most CAP drawn).
        names: other symbols for the shapes, e.g. ``{"S": "T"}``. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    if kind not in ("none", "additive", "dot"):
        raise ValueError(f"kind must be 'none', 'additive' (Bahdanau) or 'dot' (Luong), got {kind!r}")
    S, E, D, V = _size(S, "S"), _size(E, "E"), _size(D, "D"), _size(V, "V")
    if tokens is not None and len(tokens) != S:
        raise ValueError(f"tokens must give one string per source position, {S}, got {len(tokens)}")
    sub = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
    words = [str(t) for t in tokens] if tokens is not None else [f"x{str(j).translate(sub)}" for j in range(S)]
    rows = min(S, CAP)
    if S > rows:  # the row before the last stands for the positions not drawn
        words = words[:rows - 2] + ["⋯", words[-1]]
    shp = _Shapes(names, shapes, {"S": S, "E": E, "D": D, "V": V})

    def vector(d: Diagram, center, n: int, role: str, name: str, key: str, at: str = "right", values=None):
        """A (n,) vector drawn as one row, labelled "name (shape)" on one side."""
        b = d.block(center, 1, n, role=role, values=values)
        shape = shp.alt(key) if shapes == "both" else shp(key)
        x, y = b.center
        if at == "right":
            t = d.text(b.x1 + 0.07, y, name, size=_NAME_PT, weight="bold", colour=INK, ha="left")
            d.text(t.x1 + 0.07, y, shape, ha="left")
        elif at == "left":
            t = d.text(b.x0 - 0.07, y, shape, ha="right")
            d.text(t.x0 - 0.07, y, name, size=_NAME_PT, weight="bold", colour=INK, ha="right")
        else:  # "above" or "below": name and shape on one line, centred
            wn, _ = _text_box(name, _NAME_PT, "bold")
            ws, _ = _text_box(shape, _SMALL_PT)
            left = x - (wn + 0.07 + ws) / 2
            ty = b.y0 - 0.12 if at == "above" else b.y1 + 0.12
            d.text(left, ty, name, size=_NAME_PT, weight="bold", colour=INK, ha="left")
            d.text(left + wn + 0.07, ty, shape, ha="left")
        return b

    def draw(d: Diagram) -> str:
        wD, wE, wV = d.ext(D), d.ext(E), d.ext(V)
        hH = max(rows * max(d.cell, 0.17), 1.3)  # a row per token, tall enough for its label and the column beside H
        row_h = hH / rows
        x0 = 0.4  # room for the tokens left of H
        top = 0.35  # the decoder's inputs s_{i-1} and y_{i-1}
        y_att = top + 0.95  # the attention's first operation, level with H's top part
        H = d.block((x0 + wD / 2, y_att - 0.1 + hH / 2), S, D, role="state", name="encoder states H",
                    name_at="above", shape=shp("S", "D"), shape_at="below", height=hH)
        for j, word in enumerate(words):
            d.text(x0 - 0.06, H.y0 + (j + 0.5) * row_h, word, size=_SMALL_PT, colour=INK, ha="right")
        # Every decoder starts from s₋₁ = c, the one without attention too. (Unicode has no subscript capital S,
        # so the forward state at position S - 1 is written h_(S−1), as the chapter's printed text does.)
        c_name = "summary c = sᵢ₋₁ at i = 0"
        c = vector(d, (H.center[0], H.y1 + 0.75), D, "state", c_name, "D", at="below")
        d.arrow((H.center[0], H.y1 + 0.38), c.top, label="[→h_(S−1); ←h₀]", label_at="right")
        steps = [f"the encoder's states H {shp.alt('S', 'D')}, one row hⱼ per source token, and the summary c "
                 f"{shp.alt('D')}, the forward state at the last token and the backward state at the first, "
                 "which is the decoder's first state s₋₁"]
        x_b = H.x1 + 0.7 + 0.95  # the attention column's centre, far enough that cᵢ's label stays clear of H's shape
        x_c = x_b + 1.15 + wD / 2 if kind != "none" else H.x1 + 0.9 + wD / 2  # the recurrent column's centre

        def inputs(query, top=top):
            s_prev = vector(d, (x_c, top), D, "query" if query else "state", "sᵢ₋₁", "D", at="above")
            label_w = lambda name, key: _text_box(name, _NAME_PT, "bold")[0] + 0.07 + _text_box(  # noqa: E731
                shp.alt(key) if shapes == "both" else shp(key), _SMALL_PT)[0]
            x_y = max(s_prev.x1 + 0.3 + wE / 2, x_c + label_w("sᵢ₋₁", "D") / 2 + 0.25 + label_w("yᵢ₋₁", "E") / 2)
            y_prev = vector(d, (x_y, top), E, "input", "yᵢ₋₁", "E", at="above")
            return s_prev, y_prev

        def attention(query_point, score_words):
            """The attention over H: scores and softmax, the weights, the weighted sum, the context c_i."""
            att = d.op((x_b, y_att), score_words)
            if query_point[1] < att.y0:  # from above: across, then down into the top
                d.arrow(query_point, att.top, via=[(att.center[0], query_point[1])])
            else:  # from below and to the right: across, up, then into the right side
                turn = att.x1 + 0.3
                d.arrow(query_point, att.right, via=[(turn, query_point[1]), (turn, att.center[1])])
            d.arrow((H.x1, att.center[1]), att.left, label="hⱼ", label_at="below")
            alpha = vector(d, (x_b, att.y1 + 0.35), S, "weight", "αᵢ", "S", at="left")  # flat: no made-up weights
            d.arrow(att.bottom, alpha.top)
            total = d.op((x_b, alpha.y1 + 0.45), "Σⱼ αᵢⱼ hⱼ")
            d.arrow(alpha.bottom, total.top)
            d.arrow((H.x1, total.center[1]), total.left, label="hⱼ", label_at="below")
            ctx = vector(d, (x_b, total.y1 + 0.35), D, "output", "cᵢ", "D", at="left")
            d.arrow(total.bottom, ctx.top)
            return ctx

        if kind == "none":
            s_prev, y_prev = inputs(False, top=H.center[1])
            gru = d.op((x_c, c.center[1]), "GRU([yᵢ₋₁; c], sᵢ₋₁)")
            d.arrow(s_prev.bottom, (x_c - 0.25, gru.y0), via=[(s_prev.center[0], s_prev.y1 + 0.3),
                                                                (x_c - 0.25, s_prev.y1 + 0.3)])
            d.arrow(y_prev.bottom, (x_c + 0.25, gru.y0), via=[(y_prev.center[0], s_prev.y1 + 0.45),
                                                                (x_c + 0.25, s_prev.y1 + 0.45)])
            d.arrow(c.right, gru.left)
            s_new = vector(d, (x_c, gru.y1 + 0.4), D, "state", "sᵢ", "D", at="right")
            d.arrow(gru.bottom, s_new.top)
            out = d.op((x_c, s_new.y1 + 0.45), "W_o [sᵢ; c]")
            d.arrow(s_new.bottom, out.top)
            summary_w = _text_box(c_name, _NAME_PT, "bold")[0] + 0.07 + _text_box(
                shp.alt("D") if shapes == "both" else shp("D"), _SMALL_PT)[0]
            turn = max(c.x1 + 0.3, c.center[0] + summary_w / 2 + 0.15)  # clear of c's label below it
            d.arrow(c.right, out.left, via=[(turn, c.center[1]), (turn, out.center[1])])
            steps.append(f"at step i the GRU reads the embedded previous token yᵢ₋₁ {shp.alt('E')}, the summary c "
                         f"and the previous state sᵢ₋₁ {shp.alt('D')}, and gives the new state sᵢ; the output layer "
                         "reads [sᵢ; c]")
        elif kind == "additive":
            s_prev, y_prev = inputs(True)
            ctx = attention((s_prev.x0, top), "vᵀtanh(W sᵢ₋₁ + U hⱼ)\nsoftmax over j")
            gru = d.op((x_c, ctx.center[1]), "GRU([yᵢ₋₁; cᵢ], sᵢ₋₁)")
            d.arrow(ctx.right, gru.left)
            d.arrow(s_prev.bottom, (x_c - 0.25, gru.y0), via=[(s_prev.center[0], s_prev.y1 + 0.3),
                                                                (x_c - 0.25, s_prev.y1 + 0.3)])
            d.arrow(y_prev.bottom, (x_c + 0.25, gru.y0), via=[(y_prev.center[0], s_prev.y1 + 0.45),
                                                                (x_c + 0.25, s_prev.y1 + 0.45)])
            s_new = vector(d, (x_c, gru.y1 + 0.4), D, "state", "sᵢ", "D", at="right")
            d.arrow(gru.bottom, s_new.top)
            out = d.op((x_c, s_new.y1 + 0.45), "W_o [sᵢ; cᵢ]")
            d.arrow(s_new.bottom, out.top)
            d.arrow(ctx.bottom, out.left, via=[(ctx.center[0], out.center[1])])
            steps.append(f"at step i the previous decoder state sᵢ₋₁ {shp.alt('D')} is the query: an additive score "
                         f"vᵀtanh(W sᵢ₋₁ + U hⱼ) for every row of H, a softmax over j gives the weights αᵢ "
                         f"{shp.alt('S')}, and their weighted sum of the rows is the context cᵢ {shp.alt('D')}; only "
                         f"then does the GRU read the embedded previous token yᵢ₋₁ {shp.alt('E')} and cᵢ and give "
                         "the new state sᵢ; the output layer reads [sᵢ; cᵢ]")
        else:
            s_prev, y_prev = inputs(False)
            gru = d.op((x_c, y_att), "GRU(yᵢ₋₁, sᵢ₋₁)")
            d.arrow(s_prev.bottom, (x_c - 0.25, gru.y0), via=[(s_prev.center[0], s_prev.y1 + 0.2),
                                                                (x_c - 0.25, s_prev.y1 + 0.2)])
            d.arrow(y_prev.bottom, (x_c + 0.25, gru.y0), via=[(y_prev.center[0], s_prev.y1 + 0.35),
                                                                (x_c + 0.25, s_prev.y1 + 0.35)])
            s_new = vector(d, (x_c, gru.y1 + 0.4), D, "query", "sᵢ", "D", at="right")
            d.arrow(gru.bottom, s_new.top)
            ctx = attention((s_new.x0, s_new.center[1]), "sᵢ · hⱼ\nsoftmax over j")
            out = d.op((x_c, ctx.center[1]), "W_o tanh(W_c [cᵢ; sᵢ])")
            d.arrow(ctx.right, out.left)
            d.arrow(s_new.bottom, out.top)
            steps.append(f"at step i the GRU first reads the embedded previous token yᵢ₋₁ {shp.alt('E')} and the "
                         f"previous state sᵢ₋₁ {shp.alt('D')} and gives the new state sᵢ; then sᵢ is the query: a dot "
                         f"product sᵢ · hⱼ with every row of H, a softmax over j gives the weights αᵢ {shp.alt('S')}, "
                         f"and their weighted sum of the rows is the context cᵢ {shp.alt('D')}; the output layer "
                         "reads tanh(W_c [cᵢ; sᵢ])")
        logits = vector(d, (x_c, out.y1 + 0.35), V, "score", "logits", "V", at="right")
        d.arrow(out.bottom, logits.top)
        steps[-1] += f", which gives the logits, one per token of the vocabulary {shp.alt('V')}"
        if kind == "none":
            steps.append("nothing but c leaves the encoder")
        who = {"none": "without attention", "additive": "with Bahdanau's attention",
               "dot": "with Luong's attention"}[kind]
        return f"Diagram of an RNN encoder-decoder {who}, at decoder step i: " + "; ".join(steps) + "."

    return _fit(draw)


def _wave_cells(rows: int, cols: int, kind: str) -> np.ndarray:
    """Drawn cells of a positional encoding: the position colour, stronger where the value is larger."""
    r, c = min(rows, CAP), min(cols, CAP)
    pos = np.round(np.arange(r) * ((rows - 1) / max(r - 1, 1)))[:, None]  # real positions, first and last kept
    if kind == "sinusoidal":
        # Real columns: whole (sin, cos) pairs, spread from the fastest to the slowest when not all fit.
        pairs = max(cols // 2, 1)
        drawn = np.round(np.linspace(0, pairs - 1, max(c // 2, 1))).astype(int)  # pair indices i
        freq = 1.0 / (10000 ** ((2 * drawn) / max(cols, 1)))  # omega_i
        angles = pos * freq[None, :]  # (r, pairs drawn)
        values = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(r, -1)[:, :c]
    else:
        values = np.random.default_rng(1).uniform(-1, 1, (r, c))
    base = np.array(_rgb(PALETTE["position"]))
    dark = np.array([0.55, 0.25, 0.12])
    cells = np.empty((r, c), dtype=object)
    for (a, b), v in np.ndenumerate(values):
        t = (v + 1) / 2  # 0 (value -1): white, 0.5: the position colour, 1 (value +1): dark
        colour = (1 - 2 * t) * np.ones(3) + 2 * t * base if t < 0.5 else (2 - 2 * t) * base + (2 * t - 1) * dark
        cells[a, b] = tuple(np.clip(colour, 0, 1))
    return cells


def positional_flow(L: int = 6, E: int = 16, *, kind: str = "sinusoidal", names: Mapping[str, str] | None = None,
                    shapes: str = "both"):
    """Chapter 06: token embeddings plus positional encodings give the input X.

    Args:
        L: tokens. E: model width.
        kind: "sinusoidal" (the encoding's cells are shaded by its real values: light -1, dark +1; when
            E is above CAP, whole (sin, cos) pairs spread from the fastest to the slowest are drawn)
            or "learned" (a trained table, shaded at random).
        names: other symbols, e.g. ``{"L": "T"}``. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, E = _size(L, "L"), _size(E, "E")
    if kind not in ("sinusoidal", "learned"):
        raise ValueError(f"kind must be 'sinusoidal' or 'learned', got {kind!r}")
    shp = _Shapes(names, shapes, {"L": L, "E": E})

    def draw(d: Diagram) -> str:
        ids = d.block((d.cell / 2 + 0.3, 0), L, 1, role="input", name="ids", name_at="above", shape=shp("L"),
                      shape_at="below")
        emb = d.op((ids.x1 + 0.65, 0), "embedding")
        d.arrow(ids.right, emb.left)
        tok = d.block((emb.x1 + 0.3 + d.ext(E) / 2, 0), L, E, role="input", name="tokens", shape=shp("L", "E"))
        d.arrow(emb.right, tok.left)
        plus = d.op((tok.x1 + 0.45, 0), "+")
        d.arrow(tok.right, plus.left)
        pos = d.block((plus.center[0], tok.y1 + 0.55 + d.ext(L) / 2), L, E, role="position", name="P",
                      shape=shp("L", "E"), shape_at="right", cells=_wave_cells(L, E, kind))
        d.arrow(pos.top, plus.bottom)
        label = ("sinusoidal\nencoding\n(light −1,\ndark +1)" if kind == "sinusoidal"
                 else "learned\nposition table")
        d.text(pos.x0 - 0.1, pos.center[1], label, ha="right", colour=INK)
        x = d.block((plus.x1 + 0.35 + d.ext(E) / 2, 0), L, E, role="input", name="X", shape=shp("L", "E"))
        d.arrow(plus.right, x.left)
        if kind == "sinusoidal":
            kept = min(E, CAP) // 2
            some = f"{kept} of its {E // 2} (sin, cos) column pairs drawn, fastest to slowest" if E > CAP else \
                "every (sin, cos) column pair drawn"
            what = ("a sinusoidal positional encoding P, shaded by its values from light (−1) to dark (+1), "
                    f"{some}: fast waves in the left-hand columns, slow ones on the right")
        else:
            what = "a learned table of position vectors P"
        return (f"Diagram of positional encoding: token ids {shp.alt('L')} are looked up in an embedding table, "
                f"giving token embeddings {shp.alt('L', 'E')}; {what}, of the same shape {shp.alt('L', 'E')}, "
                "is added element by element; the sum X is what attention receives.")

    return _fit(draw)


def transformer_flow(S: int = 7, T: int = 6, E: int = 16, *, N: int = 2, V: int | None = None,
                     B: int | None = None, H: int | None = None, pre_norm: bool = False,
                     names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 07: the encoder-decoder Transformer, encoder stack on the left, decoder stack on the right.

    Args:
        S: source tokens. T: target tokens (shifted right). E: model width. N: layers per stack.
        V: target vocabulary (the logits' width; default: not drawn).
        B: a batch axis in front of every shape (default: none drawn).
        H: heads: the cross-attention is labelled with its weights' shape, ``(B, H, T, S)`` (default: not).
        pre_norm: draw pre-norm layers: each sub-layer's rule ``x + sublayer(LayerNorm(x))`` under the
            stacks, and the final ``LayerNorm`` that ends each stack (default: neither drawn).
        names: other symbols. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    S, T, E, N = _size(S, "S"), _size(T, "T"), _size(E, "E"), _size(N, "N")
    V = None if V is None else _size(V, "V")
    B = None if B is None else _size(B, "B")
    H = None if H is None else _size(H, "H")
    if H is not None and E % H:
        raise ValueError(f"E must be a multiple of H, got E={E} and H={H}")
    if not isinstance(pre_norm, bool):
        raise TypeError(f"pre_norm must be True or False, got {pre_norm!r}")
    shp = _Shapes(names, shapes, {"S": S, "T": T, "E": E, "N": N, "V": V or 1, "B": B or 1, "H": H or 1})
    lead = ("B",) if B is not None else ()  # the batch axis, when drawn, in front of every shape

    def shape(*keys: str) -> str:
        return shp(*lead, *keys)

    def alt(*keys: str) -> str:
        return shp.alt(*lead, *keys)

    def draw(d: Diagram) -> str:
        xe, xd = 0.0, 2.9
        y = 0.0
        if B is None:
            d.text(xe, y, f"source tokens, {shp.count('S')}", colour=INK)
            d.text(xd, y, f"target tokens, shifted right, {shp.count('T')}", colour=INK)
        else:
            d.text(xe, y, "source tokens " + shape("S").replace("\n", " = "), colour=INK)
            d.text(xd, y, "target tokens, shifted right, " + shape("T").replace("\n", " = "), colour=INK)
        y += 0.45
        embs = [d.op((x, y), "embedding × √E + positions") for x in (xe, xd)]
        d.arrow((xe, 0.1), embs[0].top)
        d.arrow((xd, 0.1), embs[1].top)
        y = embs[0].y1 + 0.25
        src = d.block((xe, y + d.ext(S) / 2), S, E, role="input", name="X", shape=shape("S", "E"), shape_at="left")
        tgt = d.block((xd, y + d.ext(T) / 2), T, E, role="input", name="Y", shape=shape("T", "E"), shape_at="right")
        d.arrow(embs[0].bottom, src.top)
        d.arrow(embs[1].bottom, tgt.top)
        y = max(src.y1, tgt.y1) + 0.5
        e1 = d.op((xe, y), "self-attention")
        d1 = d.op((xd, y), "masked self-attention")
        e2 = d.op((xe, y + 0.55), "feed-forward")
        d2 = d.op((xd, y + 0.55), "cross-attention")
        d3 = d.op((xd, y + 1.1), "feed-forward")
        d.arrow(src.bottom, e1.top)
        d.arrow(tgt.bottom, d1.top)
        d.arrow(e1.bottom, e2.top)
        d.arrow(d1.bottom, d2.top, label="Q", label_at="right")
        d.arrow(d2.bottom, d3.top)
        enc = d.group([e1, e2], f"encoder layer × {shp.count('N')}", pad=0.16)
        dec = d.group([d1, d2, d3], f"decoder layer × {shp.count('N')}", pad=0.16)
        if H is not None:  # the weights that section 6 of the chapter reads, outside the layer's box
            d.arrow(d2.right, (dec.x1 + 0.25, d2.center[1]), head=False, colour=MUTED)
            d.text(dec.x1 + 0.3, d2.center[1], "weights\n" + shape("H", "T", "S"), ha="left")
        enc_end, dec_end = (xe, enc.y1), (xd, dec.y1)  # where each stack's output leaves
        if pre_norm:
            norms = [d.op((x, end[1] + 0.35), "final LayerNorm") for x, end in ((xe, enc_end), (xd, dec_end))]
            d.arrow(enc_end, norms[0].top)
            d.arrow(dec_end, norms[1].top)
            enc_end, dec_end = norms[0].bottom, norms[1].bottom
        mem = d.block((xe, enc_end[1] + 0.45 + d.ext(S) / 2), S, E, role="output", name="memory",
                      shape=shape("S", "E"), shape_at="left")
        d.arrow(enc_end, mem.top)
        d.arrow(mem.right, d2.left, via=[((mem.x1 + dec.x0) / 2, mem.center[1]), ((mem.x1 + dec.x0) / 2,
                                                                                   d2.center[1])],
                label="K, V", label_on=0)
        out = d.block((xd, dec_end[1] + 0.45 + d.ext(T) / 2), T, E, role="output", name="decoder\noutput",
                      shape=shape("T", "E"), shape_at="right")
        d.arrow(dec_end, out.top)
        lin = d.op((xd, out.y1 + 0.35), "linear → logits" + (" " + shape("T", "V").replace("\n", " = ")
                                                              if V else ""))
        d.arrow(out.bottom, lin.top)
        if pre_norm:
            d.text(xe, lin.center[1], "in every layer, each sub-layer:\nx ← x + sublayer(LayerNorm(x))", colour=INK)
        weights = "" if H is None else f" (its weights {alt('H', 'T', 'S')}: for each target position, a " \
                                         "distribution over the source positions)"
        final = " and a final LayerNorm" if pre_norm else ""
        rule = (" In every layer each sub-layer is a pre-norm residual step, x ← x + sublayer(LayerNorm(x))."
                if pre_norm else "")
        return (f"Diagram of the encoder-decoder Transformer: the source {alt('S')} and the target shifted "
                f"right {alt('T')} are embedded (times √E) with their positions into X {alt('S', 'E')} and Y "
                f"{alt('T', 'E')}; {N} encoder layers (self-attention, feed-forward){final} turn X into the memory "
                f"{alt('S', 'E')}; {N} decoder layers apply masked self-attention to Y, then cross-attention "
                f"whose queries come from the decoder and whose keys and values come from the memory{weights}, then "
                f"a feed-forward network{final}; a linear layer turns the decoder output {alt('T', 'E')} into logits"
                + (f" {alt('T', 'V')}" if V else "") + "." + rule)

    return _fit(draw)


def tiled_attention_flow(L: int = 4, S: int = 12, D: int = 4, *, block_k: int = 3, tile: int = 1,
                         names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 08: one block of queries meets the keys and values tile by tile (the online softmax).

    The score row of the query block is split into tiles: those already read are pale, the current
    one is outlined, the rest are not computed yet. Only a running max m, a running sum ℓ and an
    unnormalised output acc live across tiles (the names of the chapter's code); the current tile's
    scores and its value tile both feed the update.

    Args:
        L: queries in the block (Lb). S: keys. D: head width. block_k: keys per tile (Sb).
        tile: the index (0-based) of the tile being read.
        names: other symbols, e.g. ``{"L": "Lb", "S": "S", "block_k": "Sb"}``. shapes: as elsewhere.

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, S, D, Bk = _size(L, "L"), _size(S, "S"), _size(D, "D"), _size(block_k, "block_k")
    n = -(-S // Bk)
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or not 0 <= tile < n:
        raise ValueError(f"tile must be an index from 0 to {n - 1} (S={S} keys in tiles of {Bk}), got {tile!r}")
    if n > 8:
        raise ValueError(f"draw at most 8 tiles: S / block_k = {S} / {Bk} gives {n}; choose a larger block_k")
    shp = _Shapes(names, shapes, {"L": L, "S": S, "D": D, "block_k": Bk, "1": 1})
    sub = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")

    def draw(d: Diagram) -> str:
        import matplotlib.patches as mpatches

        gap = 0.1
        tile_w = min(d.ext(Bk), 4.0 / n - gap)  # the whole row of tiles stays within 4 inches
        tile_h = min(d.ext(Bk), 3.0 / n - gap)
        q = d.block((d.ext(D) / 2, 0), L, D, role="query", name="Q", shape=shp("L", "D"), shape_at="below")
        x0 = q.x1 + 0.3
        ks, ss = [], []
        for j in range(n):  # the matrix-product layout: Kᵀ tiles above their score tiles
            cx = x0 + j * (tile_w + gap) + tile_w / 2
            jj = str(j + 1).translate(sub)
            ks.append(d.block((cx, q.y0 - 0.25 - d.ext(D) / 2), D, Bk, role="key", name=f"K{jj}ᵀ", width=tile_w))
            ss.append(d.block((cx, 0), L, Bk, role="score", name=f"S{jj}", width=tile_w))
        d.text(x0 - 0.1, ks[0].center[1], f"keys in tiles\nof {shp.count('block_k')}", ha="right")
        cur = ss[tile]
        jj = str(tile + 1).translate(sub)
        score_shape = d.text(cur.center[0], cur.y1 + 0.06, shp("L", "block_k"), va="top")
        lane = ss[-1].x1 + 0.35  # a free column between the score tiles and the output, for the value arrow
        o = d.block((lane + 0.35 + d.ext(D) / 2, 0), L, D, role="output", name="acc")
        d.text(o.x1 + 0.08, o.center[1], shp("L", "D"), ha="left")
        vs = []
        for j in range(n):  # and the V tiles above the output, as in acc = P V
            ii = str(j + 1).translate(sub)
            y = o.y0 - 0.25 - (n - j - 1) * (tile_h + gap) - tile_h / 2
            vs.append(d.block((o.center[0], y), Bk, D, role="value", name=f"V{ii}", height=tile_h))
        d.text(o.x1 + 0.1, (vs[0].y0 + vs[-1].y1) / 2, f"values in\nthe same\ntiles,\n{shp('block_k', 'D')}", ha="left")
        m = d.block((o.x1 + 0.75, 0), L, 1, role="state", name="m", name_at="above")
        ell = d.block((m.x1 + 0.25, 0), L, 1, role="state", name="ℓ", name_at="above")
        for j in range(n):  # tiles already read fade; score tiles to come are not computed yet
            for blk in (ks[j], ss[j], vs[j]):
                if j < tile:
                    d.ax.add_patch(mpatches.Rectangle((blk.x0, blk.y0), blk.w, blk.h, facecolor="white", alpha=0.65,
                                                      edgecolor="none", zorder=3.5))
            if j > tile:
                blk = ss[j]
                d.ax.add_patch(mpatches.Rectangle((blk.x0, blk.y0), blk.w, blk.h, facecolor="white",
                                                  edgecolor=MUTED, linestyle=(0, (3, 2)), zorder=3.5))
        for blk in (ks[tile], ss[tile], vs[tile]):
            d.ax.add_patch(mpatches.Rectangle((blk.x0 - 0.03, blk.y0 - 0.03), blk.w + 0.06, blk.h + 0.06,
                                              facecolor="none", edgecolor=INK, linewidth=2.0, zorder=3.6))
        upd = d.op((o.center[0] + 0.3, score_shape.y1 + 0.45), "update m, ℓ, acc")
        d.arrow((cur.center[0], score_shape.y1 + 0.03), upd.left, via=[(cur.center[0], upd.center[1])])
        v = vs[tile]  # the value tile enters the update too: down the free lane, into the box's top
        entry = (upd.x0 + 0.12, upd.y0)
        d.arrow(v.left, entry, via=[(lane, v.center[1]), (lane, upd.y0 - 0.14), (entry[0], upd.y0 - 0.14)])
        d.arrow((upd.center[0] - 0.05, upd.y0), (upd.center[0] - 0.05, o.y1))
        d.arrow((upd.x1 - 0.2, upd.y0), (m.center[0], m.y1), via=[(upd.x1 - 0.2, upd.y0 - 0.12),
                                                                (m.center[0], upd.y0 - 0.12)])
        d.arrow((m.center[0], upd.y0 - 0.12), (ell.center[0], ell.y1), via=[(ell.center[0], upd.y0 - 0.12)])
        d.text(upd.center[0], upd.y1 + 0.06, "after the last tile: output = acc ÷ ℓ", va="top")
        d.text(ell.x1 + 0.1, ell.center[1], f"running\nmax m,\nsum ℓ\n{shp('L', '1')}", ha="left")
        return (f"Diagram of tiled attention with the online softmax: a block of queries Q {shp.alt('L', 'D')} meets "
                f"the {S} keys in {n} tiles of {Bk}; the scores of tile {tile + 1}, S{jj} {shp.alt('L', 'block_k')} = "
                f"Q K{jj}ᵀ, are outlined, the tiles before it are already folded in (pale) and the ones after it are "
                f"not computed yet (dashed); S{jj} and the value tile V{jj} {shp.alt('block_k', 'D')} update a running "
                f"row maximum m and row sum ℓ {shp.alt('L', '1')} and an unnormalised output acc {shp.alt('L', 'D')}; "
                "after the last tile the output is acc divided by ℓ. The full score matrix is never stored.")

    return _fit(draw)


def causal_tiles(L: int = 100, S: int | None = None, *, block_q: int = 32, block_k: int | None = None):
    """Chapter 08: which tiles of the causal ``(L, S)`` score matrix a tiled loop computes.

    The matrix is cut into tiles of ``block_q`` queries by ``block_k`` keys. A tile that lies wholly
    above the diagonal holds only blocked scores (query ``i`` sees keys ``0..i``): it is skipped
    (dashed). A tile on the diagonal is computed with the mask inside it, drawn as its staircase of
    allowed and blocked scores; a tile below it is computed in full. The loop of
    :func:`attn_course.tiled_attention` visits exactly the tiles drawn with a solid outline.

    Args:
        L: queries. S: keys (default ``L``). block_q: queries per tile. block_k: keys per tile
            (default ``block_q``).

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L = _size(L, "L")
    S = L if S is None else _size(S, "S")
    Bq = _size(block_q, "block_q")
    Bk = Bq if block_k is None else _size(block_k, "block_k")
    nq, nk = -(-L // Bq), -(-S // Bk)
    if nq > 10 or nk > 10:
        raise ValueError(f"draw at most 10 x 10 tiles: L / block_q = {L} / {Bq} and S / block_k = {S} / {Bk} give "
                         f"{nq} x {nk}; choose larger blocks")

    def draw(d: Diagram) -> str:
        import matplotlib.patches as mpatches

        size = min(0.5, 3.2 / max(nq, nk))  # inches along the longer side of a full tile
        unit = size / max(Bq, Bk)  # inches per token: tiles keep their aspect (256 x 512 is twice as wide as tall)
        heights = [unit * max(0.6 * Bq, min(Bq, L - a * Bq)) for a in range(nq)]  # a short last tile, drawn
        widths = [unit * max(0.6 * Bk, min(Bk, S - b * Bk)) for b in range(nk)]   # big enough to label
        sub = 6  # drawn cells per side of a diagonal tile, to show its staircase
        computed = skipped = diagonal = 0
        top, left = 0.0, 0.0
        y = top
        for a in range(nq):
            rows = slice(a * Bq, min((a + 1) * Bq, L))
            h = heights[a]
            x = left
            for b in range(nk):
                cols = slice(b * Bk, min((b + 1) * Bk, S))
                w = widths[b]
                if cols.start > rows.stop - 1:  # every key after every query of the tile: skipped
                    skipped += 1
                    rect = mpatches.Rectangle((x, y), w, h, facecolor=PALETTE["mask_blocked"], edgecolor=MUTED,
                                              linestyle=(0, (3, 2)), linewidth=1.0, zorder=2)
                    rect.set_gid("tile:skipped")
                    d.ax.add_patch(rect)
                else:
                    computed += 1
                    whole = cols.stop - 1 <= rows.start  # every key at or before every query of the tile
                    if whole:
                        rect = mpatches.Rectangle((x, y), w, h, facecolor=PALETTE["mask_allowed"], edgecolor="none",
                                                  zorder=2)
                        rect.set_gid("tile:full")
                        d.ax.add_patch(rect)
                    else:
                        diagonal += 1
                        r, c = min(sub, rows.stop - rows.start), min(sub, cols.stop - cols.start)
                        for i in range(r):
                            query = rows.start + (i + 0.5) * (rows.stop - rows.start) / r
                            for j in range(c):
                                key = cols.start + (j + 0.5) * (cols.stop - cols.start) / c
                                colour = PALETTE["mask_allowed"] if key <= query else PALETTE["mask_blocked"]
                                cell = mpatches.Rectangle((x + j * w / c, y + i * h / r), w / c, h / r,
                                                          facecolor=colour, edgecolor="none", zorder=2)
                                cell.set_gid("tile:diagonal")
                                d.ax.add_patch(cell)
                    frame = mpatches.Rectangle((x, y), w, h, facecolor="none", edgecolor=INK, linewidth=1.4, zorder=3)
                    d.ax.add_patch(frame)
                x += w
            y += h
        width, height = x - left, y - top
        d._note(left, top, left + width, top + height)
        for b in range(nk):  # key tile numbers above, query tile numbers on the left
            label = f"{b * Bk}–{min((b + 1) * Bk, S) - 1}"
            if _text_box(label, 7)[0] > widths[b] - 0.04:  # too wide for the tile: on two lines
                label = label.replace("–", "–\n")
            d.text(left + sum(widths[:b]) + widths[b] / 2, top - 0.1, label, va="bottom", size=7)
        for a in range(nq):
            d.text(left - 0.08, top + sum(heights[:a]) + heights[a] / 2, f"{a * Bq}–{min((a + 1) * Bq, L) - 1}",
                   ha="right", size=7)
        d.text(left + width / 2, top - 0.45, f"keys, S = {S}, in tiles of {Bk}", colour=INK, va="bottom")
        d.text(left - 0.65, top + height / 2, f"queries, L = {L},\nin tiles of {Bq}", colour=INK, ha="right")
        total = nq * nk
        counted = d.text(left + width + 0.2, top, f"{computed} of {total} tiles computed\n(solid outline):\n"
                         f"{diagonal} on the diagonal, with\nthe mask inside them,\n{computed - diagonal} in full",
                         ha="left", va="top", colour=INK)
        d.text(left + width + 0.2, counted.y1 + 0.12, f"{skipped} skipped (dashed):\nevery score blocked",
               ha="left", va="top", colour=INK)
        d._roles += ["mask_allowed"]
        d.legend(["mask_allowed", "mask_blocked"], y=top + height + 0.25)
        return (f"Diagram of the causal tile grid: the (L, S) = ({L}, {S}) score matrix in tiles of {Bq} queries by "
                f"{Bk} keys, {nq} by {nk} tiles. The {skipped} tiles wholly above the diagonal hold only blocked scores "
                f"and are skipped (dashed); the {diagonal} tiles on the diagonal are computed with the causal mask inside "
                f"them (a staircase of allowed and blocked scores); the {computed - diagonal} below it are computed in "
                f"full: {computed} of {total} tiles computed."
                + (" A short last tile is drawn larger than to scale." if L % Bq or S % Bk else ""))

    return _fit(draw)


def kv_cache_flow(T: int = 5, D: int = 8, *, window: int | None = None, names: Mapping[str, str] | None = None,
                  shapes: str = "both"):
    """Chapters 08 and 10: one generation step with a KV cache (optionally a rolling one).

    The new token's key and value are appended to the cache; its query attends over every cached
    row; nothing is recomputed for the earlier tokens.

    Args:
        T: tokens in the cache after this step (the new one included). D: head width.
        window: keep only the last ``window`` rows (chapter 10's rolling cache); older rows are dropped.
        names: other symbols, e.g. ``{"T": "t"}``. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    T, D = _size(T, "T"), _size(D, "D")
    W = None if window is None else _size(window, "window")
    kept = T if W is None else min(T, W)
    shp = _Shapes(names, shapes, {"T": T, "D": D, "W": kept, "1": 1})
    rows_key = "T" if W is None or W >= T else "W"

    def draw(d: Diagram) -> str:
        import matplotlib.patches as mpatches
        from matplotlib import colormaps

        new = {}
        for i, (name, role) in enumerate((("q", "query"), ("k", "key"), ("v", "value"))):
            new[name] = d.block((d.ext(D) / 2, i * 0.55), 1, D, role=role, name=name + "ₜ", name_at="left")
        d.text(new["q"].center[0], new["q"].y0 - 0.08, "new token " + shp("1", "D").replace("\n", " = "), va="bottom")
        x_c = new["q"].x1 + 0.9
        drawn = min(kept, CAP)
        hk = d.ext(kept)
        yk = new["k"].y0 - 0.1 + hk / 2
        cache_k = d.block((x_c + d.ext(D) / 2, yk), kept, D, role="key", name="K", shape=shp(rows_key, "D"))
        yv = cache_k.y1 + 0.5 + hk / 2
        cache_v = d.block((x_c + d.ext(D) / 2, yv), kept, D, role="value", name="V", shape=shp(rows_key, "D"))
        for blk, src in ((cache_k, new["k"]), (cache_v, new["v"])):  # the new row, outlined at the bottom
            row_h = blk.h / drawn
            d.ax.add_patch(mpatches.Rectangle((blk.x0, blk.y1 - row_h), blk.w, row_h, facecolor="none",
                                              edgecolor=INK, linewidth=2.0, zorder=3.6))
            d.arrow(src.right, (blk.x0, blk.y1 - row_h / 2), via=[(src.x1 + 0.3, src.center[1]),
                                                                 (src.x1 + 0.3, blk.y1 - row_h / 2)],
                    label="append", label_on=0)
        box = d.group([cache_k, cache_v], "KV cache" + (f", last {W} tokens" if W else ""), pad=0.1,
                      colour=_edge(PALETTE["state"]))
        if W is not None and T > W:
            d.text(box.center[0], box.y1 + 0.12, f"{T - W} older token{'s' if T - W > 1 else ''} dropped",
                   va="top")
        dot = d.op((box.x1 + 0.9, new["q"].center[1]), "@")
        d.arrow(new["q"].right, dot.left)
        d.arrow(cache_k.right, dot.bottom, via=[(dot.center[0], cache_k.right[1])])
        w = np.exp(np.linspace(-1.5, 0.5, drawn))
        cells = [[colormaps[WEIGHT_CMAP](v / w.max()) for v in w]]
        soft = d.op((dot.x1 + 0.6, dot.center[1]), "softmax")
        d.arrow(dot.right, soft.left)
        weights = d.block((soft.center[0], soft.y1 + 0.3 + d.cell / 2), 1, kept, role="weight", name="",
                          cells=cells, shape=shp("1", rows_key), shape_at="right")
        d.arrow(soft.bottom, weights.top)
        av = d.op((weights.center[0], cache_v.center[1]), "@")
        d.arrow(weights.bottom, av.top)
        d.arrow(cache_v.right, av.left)
        out = d.block((av.x1 + 0.3 + d.ext(D) / 2, av.center[1]), 1, D, role="output", name="oₜ", name_at="above",
                      shape=shp("1", "D"))
        d.arrow(av.right, out.left)
        rolled = (f"; the cache keeps only the last {W} tokens, so {T - W} older rows are dropped"
                  if W is not None and T > W else "")
        return (f"Diagram of one generation step with a KV cache: the new token's query, key and value qₜ, kₜ, vₜ "
                f"{shp.alt('1', 'D')} are computed; kₜ and vₜ are appended as the last rows of the cached keys K and "
                f"values V {shp.alt(rows_key, 'D')}{rolled}; qₜ Kᵀ and a softmax give the weights "
                f"{shp.alt('1', rows_key)}, and their product with V gives the output oₜ {shp.alt('1', 'D')}; the "
                "earlier tokens' keys and values are read, not recomputed.")

    return _fit(draw)


def rotary_pairs(D: int = 8, position: int = 3, *, base: float = 10000.0, interleaved: bool = True,
                 names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 09: rotary embeddings rotate each pair of a query's (or key's) numbers by m · θᵢ.

    Each pair i gets a dial that shows its angle at position m, θᵢ = base^(-2i/D): the first pair
    turns fast, the last slowly.

    Args:
        D: head width (even; at most 16 numbers drawn). position: the token's position m.
        base: the frequencies' base. interleaved: pair neighbours (0, 1), (2, 3), ... (True) or
            the two halves (0, D/2), (1, D/2 + 1), ... (False), as :mod:`attn_course.rotary`.
        names: other symbols. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    D = _size(D, "D")
    if D % 2 or D > 16:
        raise ValueError(f"D must be even and at most 16 to draw every pair, got {D}")
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 0:
        raise ValueError(f"position must be a non-negative integer, got {position!r}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ValueError(f"base must be a number above 1, got {base!r}")
    shp = _Shapes(names, shapes, {"D": D, "1": 1})
    pairs = D // 2
    angles = [position * base ** (-2 * i / D) for i in range(pairs)]
    partner = [(2 * i, 2 * i + 1) if interleaved else (i, i + pairs) for i in range(pairs)]

    def draw(d: Diagram) -> str:
        import matplotlib.patches as mpatches

        cw, ch = 0.3, 0.26
        pair_of = {c: i for i, pc in enumerate(partner) for c in pc}

        def vector(y, name):
            blk = d.block((D * cw / 2, y), 1, D, role="query", name=name, name_at="left", width=D * cw, height=ch,
                          cells=[[PALETTE["query"]] * D])
            for c in range(D):
                d.text(blk.x0 + (c + 0.5) * cw, y, str(pair_of[c]), size=_SMALL_PT, colour="#000000", zorder=3)
            return blk

        top = vector(0.0, "q")
        d.text(top.x1 + 0.1, 0.0, shp("D").replace("\n", " = ") + f"\nat position m = {position}", ha="left")
        dial_y = top.y1 + 0.7
        r = 0.26
        step = D * cw / pairs
        lines = MUTED
        for i, angle in enumerate(angles):
            cx = top.x0 + (i + 0.5) * step
            d.ax.add_patch(mpatches.Circle((cx, dial_y), r, facecolor="white", edgecolor=MUTED, linewidth=0.8))
            turned = math.degrees(angle % (2 * math.pi))
            d.ax.add_patch(mpatches.Wedge((cx, dial_y), 0.7 * r, -turned, 0, facecolor=PALETTE["position"],
                                          edgecolor=_edge(PALETTE["position"]), linewidth=0.6))
            d.arrow((cx, dial_y), (cx + r, dial_y), head=False, colour=MUTED)
            d.arrow((cx, dial_y), (cx + r * math.cos(angle), dial_y - r * math.sin(angle)), colour=INK)
            d._note(cx - r, dial_y - r, cx + r, dial_y + r)
            d.text(cx, dial_y + r + 0.05, f"{angle:.2f}" if angle >= 0.01 else f"{angle:.0e}", va="top", colour=INK)
            for c in partner[i]:
                d.arrow((top.x0 + (c + 0.5) * cw, top.y1), (cx, dial_y - r), head=False, colour=lines)
        d.text(top.x0 - 0.1, dial_y, "pair i turns\nby m · θᵢ\n(radians)", ha="right")
        bottom = vector(dial_y + r + 0.7, "R(m) q")
        for i in range(pairs):
            cx = top.x0 + (i + 0.5) * step
            for c in partner[i]:
                d.arrow((cx, dial_y + r + 0.22), (bottom.x0 + (c + 0.5) * cw, bottom.y0), colour=lines)
        d.text(bottom.x1 + 0.1, bottom.center[1], "rotated: lengths kept,\nonly angles change", ha="left")
        turns = ", ".join(f"{a:.3g}" for a in angles)
        layout = ("neighbours (0, 1), (2, 3), …" if interleaved else f"the two halves (0, {pairs}), (1, {pairs + 1}), …")
        return (f"Diagram of rotary embeddings: a query q {shp.alt('D')} at position m = {position} is split into "
                f"{pairs} pairs of numbers, {layout}, each cell labelled with its pair; pair i is rotated in its plane by "
                f"the angle m · θᵢ with θᵢ = {base:g}^(−2i/{D}), here {turns} radians from the first pair to the "
                "last, shown on one dial per pair; the rotated vector R(m) q has the same pairs, lengths kept.")

    return _fit(draw)


def grouped_heads(H: int = 8, groups: Sequence[int] = (8, 2, 1)):
    """Chapter 10: which key/value head each query head reads, for several numbers of key/value heads G.

    One panel per G: multi-head (G = H), grouped-query (1 < G < H), multi-query (G = 1). A query head
    and the key/value head it reads share a colour.

    Args:
        H: query heads. groups: the numbers of key/value heads to draw, each dividing H.

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    H = _size(H, "H")
    if isinstance(groups, (int, str)) or not groups:
        raise TypeError(f"groups must be a sequence of key/value head counts such as (8, 2, 1), got {groups!r}")
    groups = [_size(g, "groups") for g in groups]
    for g in groups:
        if H % g:
            raise ValueError(f"every entry of groups must divide H={H}, got {g}")

    def draw(d: Diagram) -> str:
        box, gap = 1.5 * d.cell, 0.5 * d.cell
        x = 0.0
        words = []
        for g in groups:
            width = H * (box + gap) - gap
            title = "multi-head" if g == H else ("multi-query" if g == 1 else "grouped-query")
            d.text(x + width / 2, 0, f"{title}, G = {g}", colour=INK, va="bottom")
            span = H // g
            qs, kvs = [], []
            for h in range(H):
                colour = HEAD_COLOURS[(h // span) % len(HEAD_COLOURS)]
                qs.append(d.block((x + h * (box + gap) + box / 2, 0.3), 1, 1, role="query", width=box, height=box,
                                  slice_edges=[colour]))
            for k in range(g):
                centre = x + (k * span + (span - 1) / 2) * (box + gap) + box / 2
                colour = HEAD_COLOURS[k % len(HEAD_COLOURS)]
                kb = d.block((centre, 0.95), 1, 1, role="key", width=box, height=0.6 * box, slice_edges=[colour])
                d.block((centre, 0.95 + 0.6 * box), 1, 1, role="value", width=box, height=0.6 * box,
                        slice_edges=[colour])
                kvs.append((kb, colour))
            for h, qb in enumerate(qs):
                kb, colour = kvs[h // span]
                d.arrow(qb.bottom, kb.top, head=False, colour=colour)
            words.append(f"G = {g} ({title}): " + ("each query head has its own key/value head" if g == H else
                                                   f"one key/value head serves all {H} query heads" if g == 1
                                                   else f"each key/value head serves {span} query heads"))
            x += width + 0.4
        d.text(-0.1, 0.3, "query\nheads", ha="right")
        d.text(-0.1, 0.95 + 0.3 * box, "key/value\nheads", ha="right")
        d.legend(["query", "key", "value"], y=1.4)
        return (f"Diagram of how {H} query heads share key/value heads, one panel per number of key/value heads G: "
                + "; ".join(words) + ". Lines join each query head (top row) to the key and value pair (bottom "
                "row) it reads; both take the same colour.")

    return _fit(draw)


def latent_attention_flow(L: int = 6, E: int = 32, H: int = 4, *, d_c: int = 8, d_h: int = 8, d_r: int = 4,
                          absorbed: bool = False, names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 11: multi-head latent attention (DeepSeek-V2): what is cached and how keys and values return.

    Default: X is down-projected to one latent c_KV per token, which is up-projected to every head's
    keys and values; a decoupled rotary key k_R, one per token and shared by the heads, is appended to
    each head's key. Only c_KV and k_R are cached. ``absorbed=True`` draws the inference form: W_UK is
    folded into the queries, attention scores and averages the latents directly, and each head's W_UV is applied
    to its averaged latents before W_O (as ``MultiHeadLatentAttention.forward_cached(absorb=True)`` does).

    Args:
        L: tokens. E: model width. H: heads. d_c: latent width. d_h: head width. d_r: rotary key width.
        absorbed: draw the absorbed (inference) form.
        names: other symbols, e.g. ``{"d_r": "d_hᴿ"}``. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, E, H = _size(L, "L"), _size(E, "E"), _size(H, "H")
    d_c, d_h, d_r = _size(d_c, "d_c"), _size(d_h, "d_h"), _size(d_r, "d_r")
    shp = _Shapes(names, shapes, {"L": L, "E": E, "H": H, "d_c": d_c, "d_h": d_h, "d_r": d_r, "d_h+d_r": d_h + d_r})
    shp.names.setdefault("d_h+d_r", f"{shp.sym('d_h')} + {shp.sym('d_r')}")

    def draw(d: Diagram) -> str:
        f = d.lift(H)
        x = d.block((d.ext(E) / 2, 0), L, E, role="input", name="X", shape=shp("L", "E"))
        trunk = x.x1 + 0.15
        xc = trunk + 0.95
        c = d.block((xc + d.ext(d_c) / 2, -0.35 - d.ext(L) / 2), L, d_c, role="state", name="c_KV",
                    shape=shp("L", "d_c"), shape_at="above")
        kr = d.block((xc + d.ext(d_r) / 2, 0.45 + d.ext(L) / 2), L, d_r, role="position", name="k_R",
                     shape=shp("L", "d_r"))
        d.arrow(x.right, (trunk, 0), head=False)
        for target, label in ((c, "@ W_DKV"), (kr, "@ W_KR,\nrotate")):
            d.arrow((trunk, 0), target.left, via=[(trunk, target.center[1])], label=label, label_on="last",
                    label_at="above")
        cache = d.group([c, kr], "cache:\n" + (f"{shp.sym('d_c')} + {shp.sym('d_r')} = {d_c + d_r}"
                                                if shapes != "symbols" else f"{shp.sym('d_c')} + {shp.sym('d_r')}")
                        + "\nnumbers per token", colour=_edge(PALETTE["state"]), pad=0.1, label_at="below")
        x2 = cache.x1 + 0.9
        if not absorbed:
            k = d.block((x2 + d.ext(d_h + d_r) / 2, c.center[1]), L, d_h + d_r, role="key", name="K", depth=H,
                        shape=shp("H", "L", "d_h+d_r"), shape_at="above",
                        cells=[[PALETTE["key"]] * min(d_h, CAP) + [PALETTE["position"]] * min(d_r, CAP)]
                        * min(L, CAP))
            v = d.block((x2 + d.ext(d_h) / 2, kr.y1 + 0.6 + f + d.ext(L) / 2), L, d_h, role="value", name="V",
                        depth=H, shape=shp("H", "L", "d_h"))
            d.arrow(c.right, k.left, label="@ W_UK", label_on="last")
            d.arrow((c.x1, c.center[1] + 0.1), v.left, via=[(c.x1 + 0.35, c.center[1] + 0.1),
                                                             (c.x1 + 0.35, v.center[1])], label="@ W_UV",
                    label_on="last")
            d.arrow(kr.right, (k.x0 + d.ext(d_h) + 0.02, k.y1), via=[(k.x0 + d.ext(d_h) + 0.02, kr.center[1])],
                    label="shared by\nevery head", label_on=0, label_at="below")
            q = d.block((k.x1 + f + 0.45 + d.ext(d_h + d_r) / 2, k.center[1]), L, d_h + d_r, role="query", name="Q",
                        depth=H, shape=shp("H", "L", "d_h+d_r"), shape_at="right",
                        cells=[[PALETTE["query"]] * min(d_h, CAP) + [PALETTE["position"]] * min(d_r, CAP)]
                        * min(L, CAP))
            att = d.op((q.center[0], (k.center[1] + v.center[1]) / 2), "attention\nin each head",
                       note=f"scores\n÷ √({shp.sym('d_h')} + {shp.sym('d_r')})", note_at="right")
            bend = k.x1 + f + 0.2
            d.arrow(k.right, att.left, via=[(bend, k.right[1]), (bend, att.center[1])])
            d.arrow(q.bottom, att.top)
            d.arrow(v.right, att.bottom, via=[(att.center[0], v.right[1])])
            return (f"Diagram of multi-head latent attention: X {shp.alt('L', 'E')} is projected down by W_DKV to a "
                    f"latent c_KV {shp.alt('L', 'd_c')} and by W_KR to a rotary key k_R {shp.alt('L', 'd_r')}, rotated "
                    f"by position; only these two are cached, {d_c + d_r} numbers per token and layer. W_UK "
                    f"up-projects the latent to each head's keys and W_UV to its values V {shp.alt('H', 'L', 'd_h')}; "
                    f"k_R, shared by every head, is appended to each head's keys, K {shp.alt('H', 'L', 'd_h+d_r')}; "
                    "attention then runs in each head with the queries, its scores divided by the square root of "
                    f"{shp.sym('d_h')} + {shp.sym('d_r')}.")
        qt = d.block((x2 + d.ext(d_c) / 2, c.center[1] - 0.55 - f - d.ext(L)), L, d_c, role="query", name="Q̃",
                     depth=H, shape=shp("H", "L", "d_c"), shape_at="right")
        d.text(qt.x0 - 0.12, qt.center[1], "queries with\nW_UK folded in", ha="right")
        scale = f"√({shp.sym('d_h')} + {shp.sym('d_r')})"
        sc = d.op((x2 + 0.35, c.center[1]), f"(Q̃ c_KVᵀ + q_R k_Rᵀ)\n÷ {scale}")
        d.arrow(qt.bottom, (qt.center[0], sc.y0))
        d.arrow(c.right, sc.left)
        # the rotary keys enter the score box near its left corner, clear of the "÷ √(...)" line
        d.arrow(kr.right, (sc.x0 + 0.15, sc.y1), via=[(sc.x0 + 0.15, kr.center[1])], label="with q_R",
                label_on=0, label_at="below")
        soft = d.op((sc.x1 + 0.55, sc.center[1]), "softmax")
        d.arrow(sc.right, soft.left)
        av = d.op((soft.center[0], kr.center[1]), "@ c_KV")
        d.arrow(soft.bottom, av.top)
        out = d.block((av.x1 + 0.35 + d.ext(d_c) / 2, av.center[1]), L, d_c, role="state", name="C̄", depth=H,
                      shape=shp("H", "L", "d_c"), shape_at="above")
        d.arrow(av.right, out.left)
        up = d.op((out.center[0], out.y1 + 0.5), "@ W_UV,i\nin each head")
        d.arrow(out.bottom, up.top)
        o = d.block((up.center[0], up.y1 + 0.35 + f + d.ext(L) / 2), L, d_h, role="value", name="O", depth=H,
                    shape=shp("H", "L", "d_h"), shape_at="left")
        d.arrow(up.bottom, o.top)
        wo = d.op((o.center[0], o.y1 + 0.45), "concat, @ W_O")
        d.arrow(o.bottom, wo.top)
        return (f"Diagram of multi-head latent attention with the up-projections absorbed, as at inference: the cache "
                f"holds the latent c_KV {shp.alt('L', 'd_c')} and the rotary key k_R {shp.alt('L', 'd_r')}; W_UK is "
                f"folded into the queries, Q̃ {shp.alt('H', 'L', 'd_c')}, so each head's scores are Q̃ c_KVᵀ plus the "
                f"rotary part q_R k_Rᵀ, divided by the square root of {shp.sym('d_h')} + {shp.sym('d_r')}; after the "
                f"softmax the weights average c_KV itself, giving each head's averaged latents C̄ {shp.alt('H', 'L', 'd_c')}; only then "
                f"does each head's block of W_UV map them to its output O {shp.alt('H', 'L', 'd_h')}, and the heads' "
                "outputs side by side go through W_O. No key or value is built for a cached token.")

    return _fit(draw)


def linear_attention_flow(Dk: int = 4, Dv: int = 6, *, rule: str = "linear", gate: bool = False,
                          names: Mapping[str, str] | None = None, shapes: str = "both"):
    """Chapter 12: linear attention as a recurrence: one step updates a (Dk, Dv) state and reads it with q_t.

    ``rule="linear"``: S_t = S_{t-1} + k_t v_tᵀ. ``rule="delta"``: the state first recalls
    v̂_t = S_{t-1}ᵀ k_t and is corrected towards v_t, S_t = S_{t-1} + β_t k_t (v_t − v̂_t)ᵀ. ``gate=True``
    decays the state by α_t first (Gated DeltaNet). The output is o_t = S_tᵀ q_t.

    Args:
        Dk: width of queries and keys (after the feature map). Dv: width of values.
        rule: "linear" or "delta". gate: multiply the state by a decay α_t before the update.
        names: other symbols. shapes: "both", "numbers" or "symbols".

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    Dk, Dv = _size(Dk, "Dk"), _size(Dv, "Dv")
    if rule not in ("linear", "delta"):
        raise ValueError(f"rule must be 'linear' or 'delta', got {rule!r}")
    if not isinstance(gate, bool):
        raise TypeError(f"gate must be True or False, got {gate!r}")
    shp = _Shapes(names, shapes, {"Dk": Dk, "Dv": Dv, "1": 1})

    def draw(d: Diagram) -> str:
        s_prev = d.block((d.ext(Dv) / 2, 0), Dk, Dv, role="state", name="Sₜ₋₁", shape=shp("Dk", "Dv"),
                         shape_at="above")
        x = s_prev.x1 + 0.35
        prev = s_prev.right
        if gate:
            g = d.op((x + 0.3, 0), "× αₜ")
            d.arrow(prev, g.left)
            prev, x = g.right, g.x1 + 0.35
        plus = d.op((max(x + 0.5, s_prev.center[0] + 2.75) if rule == "delta" else x + 0.5, 0), "+")
        d.arrow(prev, plus.left)
        s_new = d.block((plus.x1 + 0.35 + d.ext(Dv) / 2, 0), Dk, Dv, role="state", name="Sₜ", shape=shp("Dk", "Dv"),
                        shape_at="above")
        d.arrow(plus.right, s_new.left)
        read = d.op((s_new.x1 + 0.55, 0), "Sₜᵀ qₜ")
        d.arrow(s_new.right, read.left)
        q = d.block((read.center[0], read.y1 + 0.3 + d.ext(Dk) / 2), Dk, 1, role="query", name="qₜ", name_at="right",
                    shape=shp("Dk"), shape_at="left")
        d.arrow(q.top, read.bottom)
        o = d.block((read.x1 + 0.3 + d.ext(Dv) / 2, 0), 1, Dv, role="output", name="oₜ", name_at="above",
                    shape=shp("Dv"))
        d.arrow(read.right, o.left)
        # the update, built under the state line
        y1 = s_prev.y1 + 0.95
        k = d.block((-0.45, y1), Dk, 1, role="key", name="kₜ", name_at="above", shape=shp("Dk"), shape_at="left")
        if rule == "linear":
            outer = d.op((plus.center[0], y1), "kₜ vₜᵀ")
            d.arrow(k.right, outer.left)
            v = d.block((outer.center[0], outer.y1 + 0.35), 1, Dv, role="value", name="vₜ", name_at="left",
                        shape=shp("Dv"), shape_at="right")
            d.arrow(v.top, outer.bottom)
            words = "the outer product kₜ vₜᵀ is added to the state"
        else:
            recall = d.op((s_prev.center[0], y1), "Sₜ₋₁ᵀ kₜ")
            d.arrow(s_prev.bottom, recall.top)
            d.arrow(k.right, recall.left)
            minus = d.op((recall.x1 + 0.65, y1), "vₜ − v̂ₜ")
            d.arrow(recall.right, minus.left, label="v̂ₜ")
            v = d.block((minus.center[0], y1 - 0.5), 1, Dv, role="value", name="vₜ", name_at="left",
                        shape=shp("Dv"), shape_at="right")
            d.arrow(v.bottom, minus.top)
            beta = d.op((minus.x1 + 0.45, y1), "× βₜ")
            d.arrow(minus.right, beta.left)
            outer = d.op((max(plus.center[0], beta.x1 + 0.6), y1), "kₜ uₜᵀ")
            d.arrow(beta.right, outer.left, label="uₜ")
            y2 = y1 + max(0.35, d.ext(Dk) / 2 + 0.45)
            d.arrow(k.bottom, outer.bottom, via=[(k.center[0], y2), (outer.center[0], y2)])
            words = ("the state first recalls v̂ₜ = Sₜ₋₁ᵀ kₜ for the new key, and the outer product of kₜ with the "
                     "correction uₜ = βₜ (vₜ − v̂ₜ) is added (the delta rule)")
        d.arrow(outer.top, (outer.center[0], plus.y1))
        gate_words = "the state is first multiplied by a decay αₜ; " if gate else ""
        return (f"Diagram of one step of {'linear attention' if rule == 'linear' else 'the delta rule'} as a "
                f"recurrence: the state Sₜ₋₁ {shp.alt('Dk', 'Dv')} holds everything read so far; {gate_words}"
                f"with the new key kₜ {shp.alt('Dk')} and value vₜ {shp.alt('Dv')}, {words}, giving Sₜ of the same "
                f"fixed size; the query qₜ {shp.alt('Dk')} reads the output oₜ = Sₜᵀ qₜ {shp.alt('Dv')}.")

    return _fit(draw)



def _bias_shade(bias: float, lowest: float):
    """ALiBi's colour for a bias (0 down to ``lowest`` < 0): the position colour, darker the more negative,
    on one scale for every head."""
    fade = 0.85 * (bias / lowest if lowest < 0 else 0.0)
    base = np.array(_rgb(PALETTE["position"]))
    return tuple(base * (1 - fade) + fade * np.array([0.45, 0.2, 0.1]))


def alibi_flow(L: int = 6, H: int = 8, *, heads: Sequence[int] = (0, 3, 7), weights: bool = True):
    """Chapter 09: ALiBi, one bias matrix per head added to the scores before the softmax.

    The distances ``i - j`` of query ``i`` and key ``j`` (the same for every head) are multiplied by each
    head's own slope ``-m_h`` (:func:`attn_course.alibi_slopes`); each head adds its bias to its scores,
    and the causal mask and the softmax follow. The biases share one colour scale, so a steep head is
    visibly darker; its weights (drawn from the bias plus small illustrative scores) stay near the
    diagonal, while a shallow head's spread over every key.

    Args:
        L: queries and keys (``L <= CAP``: each distance is written in its cell).
        H: heads (the slopes depend on it).
        heads: the heads drawn, one row each (at most 4).
        weights: draw each head's weights (from its bias plus small illustrative scores); False ends each row
            at the mask and softmax, and writes each bias's range over its block instead.

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, H = _size(L, "L"), _size(H, "H")
    if L > CAP:
        raise ValueError(f"L must be at most {CAP} to write every distance, got {L}")
    if isinstance(heads, (int, str)) or not heads or len(heads) > 4:
        raise TypeError(f"heads must be a sequence of 1 to 4 head indices such as (0, 3, 7), got {heads!r}")
    heads = [int(h) for h in heads]
    if any(h < 0 or h >= H for h in heads):
        raise ValueError(f"every entry of heads must be in [0, H) = [0, {H}), got {heads}")
    slopes = [float(m) for m in alibi_slopes(H).double().tolist()]
    distance = np.arange(L)[:, None] - np.arange(L)[None, :]  # (L, L): i - j
    allowed = distance >= 0
    lowest = -max(slopes[h] for h in heads) * (L - 1)
    shp = _Shapes(None, "both", {"L": L, "H": H, "1": 1})

    def slope_text(m: float) -> str:
        return f"1/{round(1 / m)}" if abs(1 / m - round(1 / m)) < 1e-9 else f"{m:.3g}"

    def draw(d: Diagram) -> str:
        big = 0.22 if L <= 8 else 0.17  # cell of the distance matrix, wide enough for its numbers
        dist_cells = np.where(allowed, "#ffffff", PALETTE["mask_blocked"]).astype(object)
        dist = d.block((L * big / 2, 0.0), L, L, role="input", name="i − j", name_at="above", cells=dist_cells,
                       width=L * big, height=L * big, shape=shp("L", "L"), shape_at="left")
        for (i, j), dd in np.ndenumerate(distance):
            if dd >= 0:
                d.text(dist.x0 + (j + 0.5) * big, dist.y0 + (i + 0.5) * big, str(dd), size=7.5, colour=INK, zorder=3)
        y = dist.y1 + 0.45 + d.ext(L) / 2
        x_times = dist.center[0]
        rows = []
        words = []
        rng = np.random.default_rng(1)
        for h in heads:
            m = slopes[h]
            times = d.op((x_times, y), f"× −{slope_text(m)}")
            d.arrow((x_times, (rows[-1][0].y1 if rows else dist.y1 + 0.05)), times.top)
            bias = -m * distance
            cells = np.empty((L, L), dtype=object)
            for (i, j), b in np.ndenumerate(bias):
                cells[i, j] = _bias_shade(b, lowest) if allowed[i, j] else PALETTE["mask_blocked"]
            reach = f"{-m * (L - 1):.3g}".replace("-", "−")
            b_block = d.block((times.x1 + 0.35 + d.ext(L) / 2, y), L, L, role="position", cells=cells,
                              shape=f"bias, head {h}" if weights else f"bias, head {h}: 0 to {reach}",
                              shape_at="above")
            d.arrow(times.right, b_block.left)
            plus = d.op((b_block.x1 + 0.4, y), "+")
            d.arrow(b_block.right, plus.left)
            if rows:  # the first row's scores are named in full below
                note = d.text(plus.center[0] + 0.1, plus.y0 - 0.22, "its scores", va="bottom", ha="left", colour=INK)
                d.arrow((plus.center[0], note.y0 + note.h / 2), plus.top)
            scores = rng.normal(0.0, 0.4, (L, L))
            node = d.op((plus.x1 + 0.75, y), "mask,\nsoftmax")
            d.arrow(plus.right, node.left)
            if not weights:
                rows.append((times, plus))
                words.append(f"head {h} multiplies them by −{slope_text(m)} (its bias runs from 0 to {reach}, at "
                             f"distance {L - 1})")
                y += d.ext(L) + 0.75
                continue
            logits = np.where(allowed, scores + bias, -np.inf)
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            attention = e / e.sum(axis=1, keepdims=True)
            a = d.block((node.x1 + 0.35 + d.ext(L) / 2, y), L, L, role="weight", values=attention,
                        shape=f"weights, head {h}", shape_at="above")
            d.arrow(node.right, a.left)
            rows.append((times, plus))
            far = attention[-1, 0]
            words.append(f"head {h} multiplies them by −{slope_text(m)} (bias {reach} at distance {L - 1}; "
                         f"the last query's weight on the first key about {far:.2f})")
            y += d.ext(L) + 0.75
        # the scores enter every "+" from above: one column of score blocks would crowd the rows; a note instead
        first_plus = rows[0][1]
        note = d.text(first_plus.center[0], first_plus.y0 - d.ext(L) / 2 - 0.12, "+ the head's scores\nQKᵀ/√D " +
                      shp("L", "L").replace("\n", " = "), va="bottom", colour=INK)
        d.arrow((first_plus.center[0], note.y1 + 0.02), first_plus.top)
        scored = ("its scores (illustrative ones, which set the weights below)" if weights else
                  "its scores, QKᵀ/√D")
        return (f"Diagram of ALiBi with {H} heads: the distances i − j between query i and key j, {shp.alt('L', 'L')}, "
                "written in the cells (future keys greyed), are the same for every head; each head multiplies them by "
                f"its own slope and adds the result, a bias matrix of the same shape, to {scored} before the causal "
                "mask and the softmax; " + "; ".join(words) + ". The biases share one colour scale, darker the more "
                "negative.")

    return _fit(draw)


def rolling_cache_flow(window: int = 4, T: int = 10):
    """Chapter 10: a sliding window of ``window`` keys, and the rolling buffer that holds them.

    Left: the window mask over ``T`` positions (query ``i`` sees keys ``i - window + 1 .. i``), the last
    query's row outlined. Right: the ``T`` tokens so far; the last ``window`` are the keys that row
    reads; they sit in a buffer of ``window`` slots, position ``p`` in slot ``p mod window``, each over
    the position ``window`` places earlier; attention reads the slots in position order.

    Args:
        window: keys a query sees, its own included (``window <= 8``).
        T: tokens so far (``window <= T <= CAP``).

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    import matplotlib.patches as mpatches

    W, T = _size(window, "window"), _size(T, "T")
    if W > 8 or T > CAP or T < W:
        raise ValueError(f"window must be at most 8 and T between window and {CAP}, got window={W} and T={T}")
    shp = _Shapes(None, "both", {"T": T})
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    allowed = (j <= i) & (j > i - W)
    kept = list(range(T - W, T))
    slot_of = {p: p % W for p in kept}
    order = [slot_of[p] for p in kept]

    def draw(d: Diagram) -> str:
        mask = d.block((d.ext(T) / 2, d.ext(T) / 2), T, T, role="mask_allowed", name=f"M, window {W}", name_at="above",
                       cells=_mask_cells(allowed), shape=shp("T", "T"), shape_at="below")
        row_h = mask.h / T
        d.ax.add_patch(mpatches.Rectangle((mask.x0, mask.y1 - row_h), mask.w, row_h, facecolor="none", edgecolor=INK,
                                          linewidth=2.0, zorder=3.6))
        d.text(mask.x0 - 0.06, mask.y1 - row_h / 2, f"query {T - 1}", ha="right", colour=INK)
        if T > 1:
            d.text(mask.x0 - 0.06, mask.y0 + row_h / 2, "query 0", ha="right")
        d.text(mask.center[0], mask.y1 + 0.42, "rows: queries\ncolumns: keys", va="top")
        box = 0.27
        x0 = mask.x1 + 1.3
        y_tok = 0.25
        tokens = []
        for p in range(T):
            role = "key" if p in kept else "mask_blocked"
            blk = d.block((x0 + p * (box + 0.04) + box / 2, y_tok), 1, 1, role=role, width=box, height=box)
            d.text(blk.center[0], blk.center[1], str(p), size=_SMALL_PT, colour=INK if p in kept else MUTED, zorder=3)
            tokens.append(blk)
        d.text(tokens[0].x0 - 0.08, y_tok, f"keys of\npositions 0 to {T - 1}", ha="right", colour=INK)
        first_kept = tokens[T - W]
        if T > W:
            d.text((tokens[0].x0 + tokens[T - W - 1].x1) / 2, tokens[0].y1 + 0.06, "no longer kept", va="top")
        top = first_kept.y0 - 0.1
        d.arrow((first_kept.x0, top + 0.05), (tokens[-1].x1, top + 0.05), via=[(first_kept.x0, top), (tokens[-1].x1, top)],
                head=False, colour=INK)
        d.text((first_kept.x0 + tokens[-1].x1) / 2, top - 0.05, f"the keys query {T - 1} sees", va="bottom", colour=INK)
        # the buffer: W slots, centred under the kept tokens
        y_buf = y_tok + 1.05
        centre = (first_kept.x0 + tokens[-1].x1) / 2
        slots = []
        for s in range(W):
            x = centre + (s - (W - 1) / 2) * (box + 0.12)
            blk = d.block((x, y_buf), 1, 1, role="key", width=box, height=box)
            holder = next(p for p in kept if p % W == s)
            d.text(blk.center[0], blk.center[1], str(holder), size=_SMALL_PT, colour=INK, zorder=3)
            d.text(blk.center[0], blk.y1 + 0.05, f"slot {s}", va="top")
            slots.append(blk)
        group = d.group(slots, f"rolling buffer, {W} slots", pad=0.2, colour=_edge(PALETTE["state"]), label_at="below")
        for p in kept:
            d.arrow(tokens[p].bottom, slots[p % W].top, colour=MUTED)
        d.text(group.center[0], group.y1 + 0.3, "read in position order: slots " + ", ".join(map(str, order)),
               va="top", colour=INK)
        d.legend(["mask_allowed", "mask_blocked"], x=mask.x0 - 0.6, y=mask.y1 + 0.95)
        overwritten = [p for p in range(T - W, T) if p >= W]
        over_words = (", so positions " + ", ".join(map(str, overwritten)) + " have overwritten positions "
                      + ", ".join(str(p - W) for p in overwritten)) if overwritten else ""
        return (f"Diagram of a sliding window of {W} keys and its rolling cache after {T} tokens: the window mask M "
                f"{shp.alt('T', 'T')}, queries down the side and keys along the top, blue where a query may attend and "
                f"grey where it may not, lets query i see keys i − {W - 1} to i, so its last row, query {T - 1}, sees keys "
                f"{T - W} to {T - 1}; only those {W} keys are kept, in a buffer of {W} slots, position p in slot "
                f"p mod {W}{over_words}; attention reads the slots in position order, " + ", ".join(map(str, order))
                + ".")

    return _fit(draw)


def grouped_fold_flow(L: int = 3, H: int = 8, G: int = 2, D: int = 4):
    """Chapter 10: grouped-query attention without a copy, for the query heads of one group.

    The ``H / G`` query heads of a group stand in line along the query axis, ``(H/G·L, D)``; one matrix
    product with the group's key head ``(S, D)``, used as it is, gives every head's scores; the causal
    mask and the softmax act on each head's ``L`` rows; one product with the group's value head, and the
    rows unfold back into ``H / G`` heads. Rows keep their head's colour.

    Args:
        L: tokens (keys S = L). H: query heads. G: key/value heads (``H % G == 0``). D: head width.

    Returns:
        The ``Figure``; its alt text is ``fig.attn_alt``.
    """
    L, H, G, D = _size(L, "L"), _size(H, "H"), _size(G, "G"), _size(D, "D")
    if H % G:
        raise ValueError(f"G must divide H, got H={H} and G={G}")
    n = H // G
    shp = _Shapes({"n": "H/G", "nL": "H/G·L"}, "both", {"L": L, "S": L, "D": D, "n": n, "nL": n * L})
    position = np.arange(n * L) % L  # the position of each folded query row
    allowed = np.arange(L)[None, :] <= position[:, None]  # (H/G·L, S): causal within each head's rows
    drawn = min(n * L, CAP)

    def rows_by_head(cols: int, tint: float) -> np.ndarray:
        cells = np.empty((drawn, min(cols, CAP)), dtype=object)
        for (i, j), _ in np.ndenumerate(cells):
            cells[i, j] = head_colour(i * n // drawn, tint)
        return cells

    def draw(d: Diagram) -> str:
        f = d.lift(n)
        y = f + 0.9 + d.ext(L) + d.ext(n * L) / 2
        q = d.block((d.ext(D) / 2, y), L, D, role="query", name="Q", depth=n,
                    slice_edges=[HEAD_COLOURS[h % len(HEAD_COLOURS)] for h in range(n)], shape=shp("n", "L", "D"))
        fold = d.op((q.x1 + f + 0.45, y), "view")
        d.arrow(q.right, fold.left)
        qf = d.block((fold.x1 + 0.3 + d.ext(D) / 2, y), n * L, D, role="query", cells=rows_by_head(D, 0.45),
                     shape=shp("nL", "D"))
        d.arrow(fold.right, qf.left)
        qk = d.op((qf.x1 + 0.5, y), "@ Kᵀ")
        d.arrow(qf.right, qk.left)
        k = d.block((qk.center[0], qk.y0 - 0.3 - d.ext(L) / 2), L, D, role="key", name="K", shape=shp("S", "D"),
                    shape_at="left")
        d.arrow(k.bottom, qk.top)
        soft = d.op((qk.x1 + 0.75, y), "÷√D, mask\nper head,\nsoftmax")
        d.arrow(qk.right, soft.left)
        from matplotlib import colormaps

        weights = _demo_weights(drawn, min(L, CAP), allowed[:drawn, :CAP])
        shade = np.empty(weights.shape, dtype=object)  # weights where a head's query may attend, grey where masked
        for (i, j), w in np.ndenumerate(weights):
            shade[i, j] = colormaps[WEIGHT_CMAP](w / weights.max()) if allowed[i, j] else PALETTE["mask_blocked"]
        a = d.block((soft.x1 + 0.3 + d.ext(L) / 2, y), n * L, L, role="weight", name="A", name_at="above",
                    cells=shade, shape=shp("nL", "S"))
        d.arrow(soft.right, a.left)
        av = d.op((a.x1 + 0.5, y), "@ V")
        d.arrow(a.right, av.left)
        v = d.block((av.center[0], av.y0 - 0.3 - d.ext(L) / 2), L, D, role="value", name="V", shape=shp("S", "D"),
                    shape_at="right")
        d.arrow(v.bottom, av.top)
        of = d.block((av.x1 + 0.3 + d.ext(D) / 2, y), n * L, D, role="output", cells=rows_by_head(D, 0.45),
                     shape=shp("nL", "D"))
        d.arrow(av.right, of.left)
        unfold = d.op((of.x1 + 0.45, y), "view")
        d.arrow(of.right, unfold.left)
        o = d.block((unfold.x1 + 0.3 + d.ext(D) / 2, y), L, D, role="output", name="", depth=n,
                    slice_fills=[head_colour(h) for h in range(n)], shape=shp("n", "L", "D"))
        d.arrow(unfold.right, o.left)
        return (f"Diagram of grouped-query attention without a copy, for one group of {n} query heads: the queries "
                f"Q {shp.alt('n', 'L', 'D')} stand in line along the query axis, a view of shape "
                f"{shp.alt('nL', 'D')} whose rows keep their head's colour; one matrix product with the group's "
                f"single key head K {shp.alt('S', 'D')}, used as it is, gives the scores of every head; dividing by "
                f"the square root of D, a causal mask on each head's {L} rows and a softmax give the weights A "
                f"{shp.alt('nL', 'S')}; one product with the value head V {shp.alt('S', 'D')} gives the outputs "
                f"{shp.alt('nL', 'D')}, which unfold back into {n} heads {shp.alt('n', 'L', 'D')}. No key or value is "
                "copied for each query head.")

    return _fit(draw)
