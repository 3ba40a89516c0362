"""Pictures shared by the chapters: attention heatmaps with the tokens on both axes, and masks.

Colours come from :mod:`attn_course.diagrams`, so that a heatmap's weights look like the weights in
the mechanism diagrams (:data:`~attn_course.diagrams.WEIGHT_CMAP`) and a mask looks the same
everywhere (:data:`~attn_course.diagrams.MASK_COLOURS`: blue = may attend, grey = blocked).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .diagrams import WEIGHT_CMAP

__all__ = ["plot_attention", "plot_attention_grid", "plot_mask", "plot_query_row"]


def _as_matrix(weights) -> "torch.Tensor":
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"weights must be a 2-D (queries, keys) matrix, got shape {tuple(w.shape)}")
    return w


def plot_attention(
    weights,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax=None,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = WEIGHT_CMAP,
    colorbar: bool = True,
    vmax: float | None = None,
):
    """Draw one attention matrix as a heatmap: queries down the side, keys along the top.

    Args:
        weights: ``(L, S)`` weights (a tensor or array).
        query_labels, key_labels: token strings for the rows and the columns.
        ax: a matplotlib axis to draw on (a new figure when None).
        title: the axis title.
        annotate: write each weight in its cell (default: when the matrix is at most 10 x 10).
        cmap: colour map (default the course's weight colours, as in the diagrams).
        colorbar: add a colour bar; its label says which scale the colours use.
        vmax: top of the colour scale. None (the default) scales the colours to the data, from 0 to
            the largest weight, so that weights spread between 0.1 and 0.35 are still told apart;
            1.0 shows them against the whole range a weight can take.

    Returns:
        The matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    w = _as_matrix(weights)
    L, S = w.shape
    for name, labels, n in (("query_labels", query_labels, L), ("key_labels", key_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels but the weights have {n} along that axis")
    if vmax is not None and (isinstance(vmax, bool) or not isinstance(vmax, (int, float)) or not vmax > 0):
        raise ValueError(f"vmax must be a positive number or None (scale to the data), got {vmax!r}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(3.0, 0.5 * S + 1.5), max(2.5, 0.45 * L + 1.0)))
    else:
        fig = ax.figure
    top = colour_top(w, vmax)
    image = ax.imshow(w.numpy(), cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
    ax.set_xticks(range(S), labels=list(key_labels) if key_labels is not None else range(S), rotation=90 if S > 12 else 0)
    ax.set_yticks(range(L), labels=list(query_labels) if query_labels is not None else range(L))
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title, pad=28 if S <= 12 else 40)
    if annotate is None:
        annotate = L <= 10 and S <= 10
    if annotate:
        for i in range(L):
            for j in range(S):
                value = float(w[i, j])
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if value > 0.6 * top else "white")
    if colorbar:
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=colour_label(top, vmax))
    return fig


def colour_top(w: "torch.Tensor", vmax: float | None) -> float:
    """The top of the colour scale: ``vmax``, or the data's largest value (1.0 for an all-zero matrix)."""
    if vmax is not None:
        return float(vmax)
    largest = float(w.max()) if w.numel() else 0.0
    return largest if largest > 0 else 1.0


def colour_label(top: float, vmax: float | None) -> str:
    """The colour bar's label: which scale the colours use."""
    if vmax is None:
        return f"attention weight (colours scaled to the data: 0 to {top:.2f})"
    return f"attention weight (fixed scale: 0 to {top:g})"


def plot_attention_grid(weights, query_labels=None, key_labels=None, *, titles=None, ncols: int = 4, suptitle=None,
                        vmax: float | None = None):
    """Several attention matrices side by side (for example one per head), on one colour scale with
    one colour bar.

    Args:
        weights: ``(N, L, S)`` matrices.
        query_labels, key_labels: token strings, shared by all panels.
        titles: one title per panel (default ``head 0``, ``head 1``, ...).
        ncols: panels per row.
        suptitle: a title over the whole figure.
        vmax: top of the shared colour scale (None: the largest weight of all panels).

    Returns:
        The matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"weights must be (N, L, S), got shape {tuple(w.shape)}")
    n = w.size(0)
    titles = [f"head {i}" for i in range(n)] if titles is None else list(titles)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    L, S = w.shape[1:]
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * max(2.6, 0.3 * S + 1.2), nrows * max(2.6, 0.3 * L + 1.2)), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        plot_attention(w[i], query_labels, key_labels, ax=ax, title=titles[i], annotate=False, colorbar=False,
                       vmax=colour_top(w, vmax))
        ax.tick_params(labelsize=8)
        if i % ncols:
            ax.set_ylabel("")
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    top = colour_top(w, vmax)
    mappable = plt.cm.ScalarMappable(norm=plt.Normalize(0.0, top), cmap=WEIGHT_CMAP)
    fig.colorbar(mappable, ax=axes.ravel().tolist(), fraction=0.02, pad=0.02, label=colour_label(top, vmax))
    return fig


def plot_mask(allowed, query_labels: Sequence[str] | None = None, key_labels: Sequence[str] | None = None, *,
              ax=None, title: str | None = None, colorbar: bool = True):
    """Draw a boolean ``(L, S)`` mask, True = may attend, in the course's mask colours.

    Blue cells may be attended to, grey cells are blocked, as in every mechanism diagram
    (:data:`attn_course.diagrams.MASK_COLOURS`); white lines separate the cells.

    Args:
        allowed: ``(L, S)`` booleans (a tensor or array), True where the query may attend to the key.
        query_labels, key_labels: token strings for the rows and the columns.
        ax: a matplotlib axis to draw on (a new figure when None).
        title: the axis title.
        colorbar: add a two-entry colour bar that names the colours.

    Returns:
        The matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    from .diagrams import MASK_COLOURS

    mask = torch.as_tensor(allowed).detach().cpu()
    if mask.dtype != torch.bool:
        raise TypeError(f"allowed must be a boolean (L, S) mask, True = may attend, got dtype {mask.dtype}")
    if mask.dim() != 2:
        raise ValueError(f"allowed must be a 2-D (queries, keys) mask, got shape {tuple(mask.shape)}")
    L, S = mask.shape
    for name, labels, n in (("query_labels", query_labels, L), ("key_labels", key_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels but the mask has {n} along that axis")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(3.0, 0.45 * S + 2.2), max(2.5, 0.4 * L + 1.2)))
    else:
        fig = ax.figure
    image = ax.imshow(mask.float().numpy(), cmap=MASK_COLOURS, vmin=0, vmax=1)
    ax.set_xticks(range(S), labels=list(key_labels) if key_labels is not None else range(S),
                  rotation=60 if key_labels is not None and max(map(len, map(str, key_labels)), default=0) > 2 else 0)
    ax.set_yticks(range(L), labels=list(query_labels) if query_labels is not None else range(L))
    ax.set_xticks([j - 0.5 for j in range(1, S)], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, L)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        bar = fig.colorbar(image, ax=ax, ticks=[0.25, 0.75], fraction=0.046, pad=0.04)
        bar.ax.set_yticklabels(["blocked\n(False)", "may attend\n(True)"])
    return fig


def plot_query_row(allowed, weights, labels: Sequence[str], query: int, *, figsize=(8.0, 3.4)):
    """One query's view of a mask: the mask with the query's row outlined, and that query's weights.

    Left, the ``(T, T)`` mask in the course's mask colours (:func:`plot_mask`); right, a bar for each
    key with the query's attention weight, a red × on every key the mask blocks, and a title that
    lists the keys the query may see ("nothing (output = 0)" for a row with no allowed key).

    Args:
        allowed: ``(T, T)`` booleans, True = may attend.
        weights: ``(T, T)`` attention weights computed with that mask.
        labels: the ``T`` tokens (queries and keys are the same sequence).
        query: the row to show, ``0 <= query < T``.
        figsize: the figure's size in inches.

    Returns:
        The matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    mask = torch.as_tensor(allowed).detach().cpu()
    w = _as_matrix(weights)
    T = len(labels)
    if tuple(mask.shape) != (T, T) or tuple(w.shape) != (T, T):
        raise ValueError(f"allowed and weights must both be (T, T) = {(T, T)} for {T} labels, got "
                         f"{tuple(mask.shape)} and {tuple(w.shape)}")
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T:
        raise ValueError(f"query must be an int in 0..{T - 1}, got {query!r}")
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1, 1.3]})
    plot_mask(mask, labels, labels, ax=left, colorbar=False, title="mask (blue = may attend, grey = blocked)")
    left.title.set_fontsize(9)
    left.add_patch(plt.Rectangle((-0.5, query - 0.5), T, 1, fill=False, edgecolor="tab:red", linewidth=2.5,
                                zorder=3, clip_on=False))  # above the grid lines
    right.bar(range(T), w[query].numpy(), color="tab:blue")
    for key in range(T):
        if not bool(mask[query, key]):
            right.text(key, 0.02, "×", ha="center", fontsize=14, color="tab:red")
    right.set_xticks(range(T), labels=list(labels), rotation=60)
    right.set_ylim(0, 1)
    right.set_ylabel("attention weight")
    seen = [labels[key] for key in range(T) if bool(mask[query, key])]
    right.set_title(f"query {query} '{labels[query]}' sees: {', '.join(seen) if seen else 'nothing (output = 0)'}",
                    fontsize=9)
    # Fixed margins that hold rotated labels of a few characters ("<pad>"): the same layout for every query
    # and every sentence, so that an explorable's views, saved uncropped, all have one size.
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.88, wspace=0.35)
    return fig
