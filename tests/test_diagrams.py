"""The diagram language: every builder draws at many sizes, in the palette's colours, legibly, with alt text."""

import itertools
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import colormaps  # noqa: E402
from matplotlib.colors import to_hex, to_rgb, to_rgba  # noqa: E402

import attn_course as ac  # noqa: E402
from attn_course import bench  # noqa: E402
from attn_course import diagrams as dg  # noqa: E402

CHAPTERS = pathlib.Path(__file__).resolve().parent.parent / "chapters"

# Each builder at a chapter's sizes, at the smallest sizes, and at sizes far beyond CAP (clamped).
CASES = {
    "attention_small": lambda: dg.attention_flow(L=1, D=1, E=1),
    "attention_ch03": lambda: dg.attention_flow(L=6, D=4, E=3, names={"L": "T", "D": "d_k", "E": "d_in"}),
    "attention_simple": lambda: dg.attention_flow(L=6, E=3, simple=True),
    "attention_causal": lambda: dg.attention_flow(L=6, D=4, mask="causal", projections=False),
    "attention_padding": lambda: dg.attention_flow(L=5, S=7, D=4, mask="causal+padding", padding=2,
                                                   projections=False),
    "attention_sliding": lambda: dg.attention_flow(L=8, D=4, mask="sliding", window=3, projections=False),
    "attention_array_mask": lambda: dg.attention_flow(L=3, S=4, D=2, mask=np.tril(np.ones((3, 4), bool)),
                                                      projections=False),
    "attention_rotary_alibi": lambda: dg.attention_flow(L=8, D=4, rotary=True, bias="alibi", mask="causal"),
    "attention_heads_batch": lambda: dg.attention_flow(L=5, D=4, E=12, heads=3, batch=2, legend=True),
    "attention_huge": lambda: dg.attention_flow(L=4096, D=128, E=1024, heads=32, batch=8, mask="causal"),
    "attention_huge_cross": lambda: dg.attention_flow(L=4096, S=8192, D=128, heads=32, projections=False),
    "head_split": lambda: dg.head_split(L=5, E=12, H=3),
    "head_split_huge": lambda: dg.head_split(L=2048, E=4096, H=32, batch=4),
    "head_layouts_split": lambda: dg.head_layouts(T=5, E=12, H=3),
    "head_layouts_merge": lambda: dg.head_layouts(T=7, E=16, H=4, step="merge"),
    "multihead": lambda: dg.multihead_flow(L=5, E=12, H=3),
    "multihead_projections": lambda: dg.multihead_flow(L=5, E=12, H=3, batch=2, names={"L": "T"}, legend=True,
                                                       projections=True),
    "multihead_gqa": lambda: dg.multihead_flow(L=6, E=32, H=8, kv_heads=2, batch=2, legend=True),
    "multihead_huge": lambda: dg.multihead_flow(L=4096, E=8192, H=64, kv_heads=8),
    "seq2seq_additive": lambda: dg.seq2seq_attention(S=6, D=8),
    "seq2seq_dot_long": lambda: dg.seq2seq_attention(S=40, D=512, kind="dot"),
    "encoder_decoder_none": lambda: dg.encoder_decoder_step("none", S=8, E=16, D=64, V=12),
    "encoder_decoder_additive": lambda: dg.encoder_decoder_step("additive", S=8, E=16, D=64, V=12, tokens=list("52163779")),
    "encoder_decoder_dot": lambda: dg.encoder_decoder_step("dot", S=8, E=16, D=64, V=12),
    "encoder_decoder_small": lambda: dg.encoder_decoder_step("additive", S=1, E=1, D=1, V=2),
    "encoder_decoder_huge": lambda: dg.encoder_decoder_step("dot", S=500, E=512, D=1024, V=30000),
    "positional": lambda: dg.positional_flow(L=6, E=16),
    "positional_huge": lambda: dg.positional_flow(L=2048, E=1024, kind="learned"),
    "transformer": lambda: dg.transformer_flow(S=7, T=6, E=16, N=2, V=30),
    "transformer_huge": lambda: dg.transformer_flow(S=512, T=512, E=4096, N=96, V=50000),
    "transformer_batch_heads": lambda: dg.transformer_flow(S=28, T=34, E=64, N=2, V=44, B=3, H=4),
    "tiled": lambda: dg.tiled_attention_flow(L=4, S=12, D=4, block_k=3, tile=1),
    "tiled_huge": lambda: dg.tiled_attention_flow(L=128, S=1024, D=64, block_k=128, tile=7),
    "causal_tiles": lambda: dg.causal_tiles(100, block_q=32),
    "causal_tiles_small": lambda: dg.causal_tiles(1, block_q=1),
    "causal_tiles_rectangular": lambda: dg.causal_tiles(6, 9, block_q=2, block_k=3),
    "causal_tiles_huge": lambda: dg.causal_tiles(4096, block_q=512, block_k=1024),
    "kv_cache": lambda: dg.kv_cache_flow(T=5, D=8),
    "kv_cache_rolling": lambda: dg.kv_cache_flow(T=9, D=4, window=4),
    "kv_cache_huge": lambda: dg.kv_cache_flow(T=100_000, D=128, window=4096),
    "rotary": lambda: dg.rotary_pairs(D=8, position=3),
    "rotary_halves": lambda: dg.rotary_pairs(D=16, position=1000, interleaved=False),
    "grouped_heads": lambda: dg.grouped_heads(8, (8, 2, 1)),
    "grouped_heads_huge": lambda: dg.grouped_heads(32, (32, 4)),
    "grouped_fold": lambda: dg.grouped_fold_flow(L=3, H=8, G=2, D=4),
    "grouped_fold_mqa_huge": lambda: dg.grouped_fold_flow(L=64, H=32, G=1, D=128),
    "alibi": lambda: dg.alibi_flow(L=6, H=8, heads=(0, 3, 7)),
    "alibi_small": lambda: dg.alibi_flow(L=1, H=1, heads=(0,)),
    "alibi_huge": lambda: dg.alibi_flow(L=12, H=112, heads=(0, 7, 63, 111)),
    "rolling_cache": lambda: dg.rolling_cache_flow(window=4, T=10),
    "rolling_cache_small": lambda: dg.rolling_cache_flow(window=1, T=1),
    "rolling_cache_huge": lambda: dg.rolling_cache_flow(window=8, T=12),
    "latent": lambda: dg.latent_attention_flow(L=6, E=32, H=4, d_c=8, d_h=8, d_r=4),
    "latent_absorbed": lambda: dg.latent_attention_flow(L=6, E=32, H=4, d_c=8, d_h=8, d_r=4, absorbed=True),
    "latent_huge": lambda: dg.latent_attention_flow(L=4096, E=5120, H=128, d_c=512, d_h=128, d_r=64),
    "linear": lambda: dg.linear_attention_flow(4, 6),
    "delta_gated": lambda: dg.linear_attention_flow(4, 6, rule="delta", gate=True),
    "delta_huge": lambda: dg.linear_attention_flow(64, 128, rule="delta", gate=True),
}


@pytest.fixture(scope="module")
def drawn():
    """Every case drawn once (and rendered, so that text extents are known)."""
    figures = {}
    for name, make in CASES.items():
        fig = make()
        fig.canvas.draw()
        figures[name] = fig
    yield figures
    for fig in figures.values():
        plt.close(fig)


def texts(fig):
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip() and t.get_visible()]


def patches(fig, prefix):
    return [p for p in fig.findobj(matplotlib.patches.Patch) if (p.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize("name", list(CASES))
def test_every_builder_draws_a_sized_figure_with_an_alt_text(drawn, name):
    fig = drawn[name]
    width, height = fig.get_size_inches()
    assert 1.0 < width <= 12.5 and 0.8 < height <= 11, (name, width, height)  # huge sizes are clamped
    assert len(fig.findobj(matplotlib.patches.Patch)) < 2500, name  # no 4096 grid cells
    alt = dg.alt_text(fig)
    assert alt.startswith("Diagram of ") and alt.endswith("."), alt
    assert len(alt) < 900, len(alt)


@pytest.mark.parametrize("name", [n for n in CASES if "huge" not in n])
def test_the_chapters_sizes_fit_the_page(drawn, name):
    """At a chapter's sizes a diagram is at most 7.5 inches wide: 750 px at the notebook's 100 dpi."""
    assert drawn[name].get_size_inches()[0] <= 7.5, name


@pytest.mark.parametrize("name", list(CASES))
def test_no_two_labels_overlap(drawn, name):
    fig = drawn[name]
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer).expanded(0.98, 0.9)) for t in texts(fig)]
    clashes = [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]
    assert not clashes, clashes


def test_attention_flow_labels_its_blocks_and_shapes():
    fig = dg.attention_flow(L=6, D=4, E=3, mask="causal", names={"L": "T", "D": "d_k", "E": "d_in"})
    words = {t.get_text() for t in texts(fig)}
    assert {"X", "Q", "K", "V", "QKᵀ", "A", "O", "M", "softmax", "mask", "÷√d_k", "@ W_Q"} <= words, words
    assert "(T, d_k)\n(6, 4)" in words and "(T, d_in)\n(6, 3)" in words and "(T, T)\n(6, 6)" in words
    alt = dg.alt_text(fig)
    for shape in ("(T, d_in) = (6, 3)", "(T, d_k) = (6, 4)", "(T, T) = (6, 6)", "√d_k = √4", "causal"):
        assert shape in alt, (shape, alt)
    plt.close(fig)
    cross = {t.get_text() for t in texts(dg.attention_flow(L=3, S=5, D=2, projections=False))}
    assert "(L, S)\n(3, 5)" in cross and "(S, D)\n(5, 2)" in cross  # keys of their own length: S
    plt.close("all")


def test_shapes_can_show_numbers_or_symbols_only():
    numbers = {t.get_text() for t in texts(dg.attention_flow(L=6, D=4, shapes="numbers"))}
    symbols = {t.get_text() for t in texts(dg.attention_flow(L=6, D=4, shapes="symbols"))}
    assert "(6, 4)" in numbers and "(L, D)" not in numbers
    assert "(L, D)" in symbols and "(6, 4)" not in symbols
    plt.close("all")


@pytest.mark.parametrize("make, role, name", [
    (lambda: dg.attention_flow(), "query", "Q"),
    (lambda: dg.attention_flow(), "key", "K"),
    (lambda: dg.attention_flow(), "value", "V"),
    (lambda: dg.attention_flow(), "score", "QKᵀ"),
    (lambda: dg.attention_flow(), "output", "O"),
    (lambda: dg.attention_flow(), "input", "X"),
    (lambda: dg.positional_flow(), "input", "tokens"),
    (lambda: dg.kv_cache_flow(), "key", "K"),
    (lambda: dg.tiled_attention_flow(), "output", "acc"),
    (lambda: dg.linear_attention_flow(), "state", "Sₜ"),
    (lambda: dg.latent_attention_flow(), "state", "c_KV"),
])
def test_blocks_take_their_roles_colour(make, role, name):
    fig = make()
    found = patches(fig, f"block:{role}:{name}")
    assert found, f"no {role} block named {name}"
    assert all(to_hex(p.get_facecolor()) == dg.PALETTE[role].lower() for p in found)
    plt.close(fig)


def test_weights_are_shaded_like_the_heatmaps_and_masks_in_the_mask_colours():
    fig = dg.attention_flow(L=6, D=4, mask="causal")
    lut = colormaps[dg.WEIGHT_CMAP](np.linspace(0, 1, 256))[:, :3]
    cells = patches(fig, "cell:weight:A")
    assert len(cells) == 36
    for cell in cells:
        assert np.abs(lut - np.array(cell.get_facecolor()[:3])).sum(axis=1).min() < 1e-6
    darkest = to_rgba(colormaps[dg.WEIGHT_CMAP](0.0))
    x0, y0 = min(c.get_x() for c in cells), min(c.get_y() for c in cells)
    index = lambda c, z, z0, size: round((z - z0) / size)  # noqa: E731
    above_diagonal = [c for c in cells if index(c, c.get_x(), x0, c.get_width()) >  # blocked by the causal mask
                      index(c, c.get_y(), y0, c.get_height())]
    assert above_diagonal and all(np.allclose(c.get_facecolor(), darkest) for c in above_diagonal)
    mask = {to_hex(p.get_facecolor()) for p in patches(fig, "cell:mask_allowed:M")}
    assert mask == {dg.PALETTE["mask_allowed"].lower(), dg.PALETTE["mask_blocked"].lower()}
    plt.close(fig)


def test_attention_flow_shades_the_weights_it_is_given():
    # The chapter's own weights, not the illustrative pattern (reviews of chapters 03 and 04).
    weights = torch.softmax(torch.randn(2, 5, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    fig = dg.attention_flow(L=2, S=5, D=3, projections=False, weights=weights)
    cells = patches(fig, "cell:weight:A")
    assert len(cells) == 10
    cmap = colormaps[dg.WEIGHT_CMAP]
    xs, ys = sorted({round(c.get_x(), 6) for c in cells}), sorted({round(c.get_y(), 6) for c in cells})
    for c in cells:
        i, j = ys.index(round(c.get_y(), 6)), xs.index(round(c.get_x(), 6))
        assert np.allclose(c.get_facecolor(), cmap(float(weights[i, j] / weights.max())))
    plt.close(fig)
    for bad in (torch.ones(3, 5), -torch.ones(2, 5), torch.full((2, 5), float("nan"))):
        with pytest.raises(ValueError, match="weights"):
            dg.attention_flow(L=2, S=5, D=3, projections=False, weights=bad)


def test_given_weights_are_not_hidden_by_the_blocks_name():
    # Chapter 02's review: the name "A" written over the middle cells hid the largest of the chapter's weights.
    weights = torch.softmax(torch.randn(6, 6, generator=torch.Generator().manual_seed(1)), dim=-1)
    for given in (None, weights):
        fig = dg.attention_flow(L=6, E=4, simple=True, weights=given)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        cells = [c.get_window_extent(renderer) for c in patches(fig, "cell:weight:A")]
        name = next(t for t in texts(fig) if t.get_text() == "A").get_window_extent(renderer)
        covered = [c for c in cells if c.overlaps(name)]
        assert bool(covered) == (given is None), f"weights={'given' if given is not None else None}: {len(covered)} cells"
        plt.close(fig)


def _grid(cells):
    """The drawn cells as a boolean grid: True where the cell has the mask's "may attend" colour."""
    xs, ys = sorted({round(c.get_x(), 6) for c in cells}), sorted({round(c.get_y(), 6) for c in cells})
    grid = np.zeros((len(ys), len(xs)), dtype=bool)
    for c in cells:
        grid[ys.index(round(c.get_y(), 6)), xs.index(round(c.get_x(), 6))] = (
            to_hex(c.get_facecolor()) == dg.PALETTE["mask_allowed"].lower())
    return grid


@pytest.mark.parametrize("kwargs, expected", [
    (dict(L=4, S=6, mask="causal"), lambda: ac.causal_mask(4, 6)),
    (dict(L=6, mask="sliding", window=3), lambda: ac.sliding_window_mask(6, 3)),
    (dict(L=5, S=5, mask="causal+padding", padding=2),
     lambda: ac.combine_masks(ac.causal_mask(5), padding=torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool))[0]),
])
def test_the_drawn_mask_is_the_packages_mask(kwargs, expected):
    fig = dg.attention_flow(D=2, projections=False, **kwargs)
    assert np.array_equal(_grid(patches(fig, "cell:mask_allowed:M")), expected().numpy())
    plt.close(fig)


def test_the_heatmaps_use_the_same_colours():
    fig = ac.plot_attention(torch.softmax(torch.randn(3, 3), dim=-1))
    assert fig.axes[0].images[0].get_cmap().name == dg.WEIGHT_CMAP
    plt.close(fig)
    fig = ac.plot_mask(ac.causal_mask(4), list("abcd"), list("abcd"), title="causal")
    image = fig.axes[0].images[0]
    assert image.get_cmap() is dg.MASK_COLOURS
    rgba = image.to_rgba(image.get_array())
    assert to_hex(rgba[0, 3]) == dg.PALETTE["mask_blocked"].lower()  # above the diagonal: blocked
    assert to_hex(rgba[3, 0]) == dg.PALETTE["mask_allowed"].lower()
    assert [t.get_text() for t in fig.axes[-1].get_yticklabels()] == ["blocked\n(False)", "may attend\n(True)"]
    plt.close(fig)


@pytest.mark.parametrize("bad, error", [(torch.ones(3, 3), TypeError), (torch.ones(3, dtype=torch.bool), ValueError)])
def test_plot_mask_refuses_what_is_not_a_boolean_matrix(bad, error):
    with pytest.raises(error, match="allowed"):
        ac.plot_mask(bad)


def test_plot_mask_checks_its_labels():
    with pytest.raises(ValueError, match="key_labels"):
        ac.plot_mask(ac.causal_mask(3), key_labels=["a", "b"])


def test_every_role_and_head_colour_carries_legible_text():
    for role, colour in dg.PALETTE.items():
        assert dg.contrast_ratio(dg.text_colour(colour), colour) >= 4.5, role
    for colour in dg.HEAD_COLOURS:
        assert dg.contrast_ratio(dg.text_colour(colour), colour) >= 4.5, colour
    for colour in (dg.INK, dg.MUTED):  # labels on the white card the site puts figures on
        assert dg.contrast_ratio(colour, "#ffffff") >= 4.5, colour


def test_contrast_ratio_matches_the_wcag_examples():
    assert dg.contrast_ratio("#000000", "#ffffff") == pytest.approx(21.0)
    assert dg.contrast_ratio("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert dg.text_colour("#1F5FA8") == "#ffffff" and dg.text_colour("#F0E442") == "#000000"


@pytest.mark.parametrize("name", ["attention_causal", "multihead", "latent", "tiled", "seq2seq_additive"])
def test_the_names_drawn_on_blocks_are_legible(drawn, name):
    for t in texts(drawn[name]):
        box = t.get_bbox_patch()
        if box is not None and box.get_facecolor()[3] > 0:
            assert dg.contrast_ratio(t.get_color(), box.get_facecolor()[:3]) >= 4.5, t.get_text()


def _lab(colour):
    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = np.cbrt(np.maximum(xyz / np.array([0.95047, 1.0, 1.08883]), 0.008856))
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _deuteranope(colour):
    """Machado et al. (2009)'s simulation of deuteranopia, severity 1."""
    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    seen = np.clip(np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                             [-0.011820, 0.042940, 0.968881]]) @ linear, 0, 1)
    return tuple(np.where(seen <= 0.0031308, 12.92 * seen, 1.055 * seen ** (1 / 2.4) - 0.055))


def test_head_colours_and_role_colours_are_told_apart():
    distance = lambda a, b: float(np.linalg.norm(_lab(a) - _lab(b)))  # noqa: E731  (CIE76 ΔE)
    heads = dg.HEAD_COLOURS
    assert len(heads) >= 8 and len(set(heads)) == len(heads)
    assert min(distance(a, b) for a, b in itertools.combinations(heads, 2)) > 20
    assert min(distance(_deuteranope(a), _deuteranope(b)) for a, b in itertools.combinations(heads, 2)) > 12
    roles = [r for r in dg.PALETTE if r not in ("parameter", "weight")]
    assert min(distance(dg.PALETTE[a], dg.PALETTE[b]) for a, b in itertools.combinations(roles, 2)) > 15
    qkv = [dg.PALETTE[r] for r in ("query", "key", "value")]
    assert min(distance(_deuteranope(a), _deuteranope(b)) for a, b in itertools.combinations(qkv, 2)) > 20


def test_large_sizes_are_clamped_but_still_grow():
    d = dg.Diagram()
    lengths = [d.ext(n) for n in (1, 6, 12, 13, 64, 4096, 10**6)]
    assert lengths == sorted(lengths) and lengths[1] == pytest.approx(6 * dg.CELL)
    assert lengths[-1] <= (dg.CAP + 2) * dg.CELL


@pytest.mark.parametrize("call, match", [
    (lambda: dg.attention_flow(L=0), "L"),
    (lambda: dg.attention_flow(L=2.5), "L"),
    (lambda: dg.attention_flow(D=True), "D"),
    (lambda: dg.attention_flow(mask="diagonal"), "mask"),
    (lambda: dg.attention_flow(mask="sliding"), "window"),
    (lambda: dg.attention_flow(mask=np.ones((2, 2), bool), L=3), "mask"),
    (lambda: dg.attention_flow(bias="t5"), "bias"),
    (lambda: dg.attention_flow(S=3, padding=3, mask="padding", projections=False), "padding"),
    (lambda: dg.attention_flow(L=3, S=5), "projections"),
    (lambda: dg.attention_flow(shapes="letters"), "shapes"),
    (lambda: dg.attention_flow(labels={"Z": "zeta"}), "labels"),
    (lambda: dg.head_split(E=10, H=3), "divisible"),
    (lambda: dg.multihead_flow(H=4, E=8, kv_heads=3), "kv_heads"),
    (lambda: dg.seq2seq_attention(kind="general"), "kind"),
    (lambda: dg.seq2seq_attention(S=3, tokens=["a"]), "tokens"),
    (lambda: dg.encoder_decoder_step("general"), "kind"),
    (lambda: dg.encoder_decoder_step(S=3, tokens=["a"]), "tokens"),
    (lambda: dg.encoder_decoder_step(V=0), "V"),
    (lambda: dg.positional_flow(kind="rotary"), "kind"),
    (lambda: dg.transformer_flow(E=10, H=4), "multiple of H"),
    (lambda: dg.transformer_flow(B=0), "B"),
    (lambda: dg.tiled_attention_flow(S=12, block_k=3, tile=4), "tile"),
    (lambda: dg.tiled_attention_flow(S=100, block_k=3), "block_k"),
    (lambda: dg.causal_tiles(100, block_q=8), "block"),
    (lambda: dg.rotary_pairs(D=7), "D"),
    (lambda: dg.rotary_pairs(position=-1), "position"),
    (lambda: dg.grouped_heads(8, (3,)), "groups"),
    (lambda: dg.grouped_fold_flow(H=8, G=3), "G must divide H"),
    (lambda: dg.linear_attention_flow(rule="hebbian"), "rule"),
    (lambda: dg.Diagram().block((0, 0), 2, 2, role="queries"), "role"),
    (lambda: dg.Diagram().finish("Q K V"), "alt"),
])
def test_bad_arguments_say_which_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: dg.attention_flow(names=["L", "T"]), "names"),
    (lambda: dg.grouped_heads(8, 2), "groups"),
    (lambda: dg.linear_attention_flow(gate="yes"), "gate"),
])
def test_arguments_of_the_wrong_type_are_refused(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_transformer_flow_shows_the_batch_and_the_cross_attention_weights():
    fig = dg.transformer_flow(S=28, T=34, E=64, N=2, V=44, B=3, H=4)
    alt = dg.alt_text(fig)
    for shape in ("X (B, S, E) = (3, 28, 64)", "Y (B, T, E) = (3, 34, 64)", "memory (B, S, E) = (3, 28, 64)",
                  "its weights (B, H, T, S) = (3, 4, 34, 28)", "logits (B, T, V) = (3, 34, 44)"):
        assert shape in alt, shape
    drawn = [t.get_text() for t in fig.axes[0].texts]
    assert "weights\n(B, H, T, S)\n(3, 4, 34, 28)" in drawn and "(B, S, E)\n(3, 28, 64)" in drawn
    plain = dg.alt_text(dg.transformer_flow(S=28, T=34, E=64, N=2, V=44))  # without B and H: as before
    assert "X (S, E) = (28, 64)" in plain and "weights" not in plain


def test_transformer_flow_pre_norm_draws_the_final_norms_and_the_rule():
    """Chapter 07's layers are pre-norm: each stack ends with a LayerNorm, drawn and named in the alt text."""
    fig = dg.transformer_flow(S=28, T=34, E=64, N=2, V=44, B=3, H=4, pre_norm=True)
    labels = [p.get_gid()[3:] for p in patches(fig, "op:")]
    assert labels.count("final LayerNorm") == 2, labels
    drawn = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "x ← x + sublayer(LayerNorm(x))" in drawn and "decoder\noutput" in drawn
    alt = dg.alt_text(fig)
    assert alt.count("a final LayerNorm") == 2 and "pre-norm residual step" in alt
    plain = dg.transformer_flow(S=28, T=34, E=64, N=2, V=44)
    assert "final LayerNorm" not in [p.get_gid()[3:] for p in patches(plain, "op:")]
    with pytest.raises(TypeError, match="pre_norm"):
        dg.transformer_flow(pre_norm="yes")


def test_encoder_decoder_step_draws_each_decoder_in_its_order():
    """Bahdanau attends with s_(i-1) before the GRU; Luong updates first and attends with s_i; without
    attention nothing is scored and only the summary reaches the decoder."""
    def ops(fig):
        return {p.get_gid()[3:]: p.get_extents().y0 for p in patches(fig, "op:")}  # display y: up is larger

    bahdanau, luong, plain = (dg.encoder_decoder_step(kind) for kind in ("additive", "dot", "none"))
    for fig in (bahdanau, luong, plain):
        fig.canvas.draw()
    b, l, n = ops(bahdanau), ops(luong), ops(plain)
    score_b = next(k for k in b if "softmax" in k and "tanh" in k)
    score_l = next(k for k in l if "softmax" in k and "·" in k)
    assert b[score_b] > b["GRU([yᵢ₋₁; cᵢ], sᵢ₋₁)"]  # the score is drawn above, i.e. before, the GRU
    assert l["GRU(yᵢ₋₁, sᵢ₋₁)"] > l[score_l]  # the GRU before the score
    assert not any("softmax" in k for k in n) and "GRU([yᵢ₋₁; c], sᵢ₋₁)" in n
    assert patches(bahdanau, "block:query:") and patches(luong, "block:query:") and not patches(plain, "block:query:")
    assert "previous decoder state sᵢ₋₁ (D,) = (64,) is the query" in dg.alt_text(bahdanau)
    assert "then sᵢ is the query" in dg.alt_text(luong) and "nothing but c leaves the encoder" in dg.alt_text(plain)
    words = {t.get_text() for t in texts(bahdanau)}
    assert {"x₀", "x₇", "(S, D)\n(8, 64)", "(V,) = (12,)"} <= words, words
    for fig in (bahdanau, luong, plain):
        plt.close(fig)


def test_primitives_compose_a_new_diagram():
    d = dg.Diagram()
    x = d.block((0.5, 0.5), 4, 6, role="input", name="X", shape="(4, 6)")
    heads = d.block((2.5, 0.5), 4, 2, role="query", name="Q", depth=3, slice_edges=dg.HEAD_COLOURS)
    node = d.op((1.5, 0.5), "split")
    d.arrow(x.right, node.left)
    d.arrow(node.right, heads.left, label="(3, 4, 2)")
    d.group([x, node, heads], "one layer")
    d.legend()
    fig = d.finish("Diagram of X split into three heads.")
    assert dg.alt_text(fig) == "Diagram of X split into three heads."
    assert {"X", "Q", "split", "(3, 4, 2)", "one layer", "input", "query"} <= {t.get_text() for t in texts(fig)}
    assert len(patches(fig, "slice:query:Q")) == 2 and heads.lift == pytest.approx(2 * dg.STEP)
    with pytest.raises(ValueError, match="text alternative"):
        dg.alt_text(plt.figure())
    plt.close("all")


def test_show_displays_the_picture_with_its_alt_text(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *args, **kwargs: shown.append((args, kwargs)))
    fig = dg.kv_cache_flow(T=4, D=4)
    dg.show(fig)
    (bundle,), options = shown[0]
    assert options == {"raw": True}
    assert bundle["image/png"].startswith(b"\x89PNG") and bundle["text/plain"] == dg.alt_text(fig)
    plt.close(fig)


def stale_alt_texts(notebook: dict) -> list:
    """Cells that show a diagram (an image whose plain text starts "Diagram", as show() writes it) whose
    metadata lacks that text, which the website uses as the picture's alt."""
    stale = []
    for index, cell in enumerate(notebook.get("cells", [])):
        alt = ((cell.get("metadata", {}).get("mystnb") or {}).get("image") or {}).get("alt", "")
        stale += [(index, text[:60]) for text in dg.diagram_alt_texts(cell) if text not in alt]
    return stale


def test_stale_alt_texts_finds_a_diagram_whose_metadata_lags_behind():
    output = {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "Diagram of A (2, 3)."}}
    good = {"metadata": {"mystnb": {"image": {"alt": "Diagram of A (2, 3)."}}}, "outputs": [output]}
    old = {"metadata": {"mystnb": {"image": {"alt": "Diagram of A (2, 2)."}}}, "outputs": [output]}
    bare = {"metadata": {}, "outputs": [output]}
    assert stale_alt_texts({"cells": [good]}) == []
    assert [i for i, _ in stale_alt_texts({"cells": [good, old, bare]})] == [1, 2]


def test_sync_alt_texts_writes_the_diagrams_text_into_the_metadata(tmp_path):
    output = {"output_type": "display_data", "metadata": {},
              "data": {"image/png": "iVBOR", "text/plain": ["Diagram of A ", "(2, 3)."]}}
    cells = [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [output], "execution_count": 1},
             {"cell_type": "code", "metadata": {"mystnb": {"image": {"alt": "Diagram of A (2, 3). Rows sum to 1."}}},
              "source": "", "outputs": [output], "execution_count": 2},
             {"cell_type": "markdown", "metadata": {}, "source": "text"}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert dg.sync_alt_texts(path) == 1 and dg.sync_alt_texts(path) == 0
    synced = json.loads(path.read_text())
    assert synced["cells"][0]["metadata"]["mystnb"]["image"]["alt"] == "Diagram of A (2, 3)."
    assert synced["cells"][1]["metadata"]["mystnb"]["image"]["alt"].endswith("Rows sum to 1.")  # kept
    assert stale_alt_texts(synced) == []
    with pytest.raises(ValueError, match="path"):
        dg.sync_alt_texts(tmp_path / "missing.ipynb")


@pytest.mark.parametrize("path", sorted(CHAPTERS.glob("*.ipynb")), ids=lambda p: p.name)
def test_every_chapter_diagram_has_its_alt_text_in_the_cell_metadata(path):
    assert stale_alt_texts(json.loads(path.read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize("T, E, H", [(5, 12, 3), (7, 16, 4), (4, 6, 2), (3, 4, 1), (10, 16, 8)])
def test_head_layouts_draws_the_tokens_that_torch_puts_in_each_head(T, E, H):
    """The alt text names the tokens of the wrong split's 'head' 0 and of the wrong merge's row 0: they are
    what torch's view(H, T, D) and reshape(T, E) of the (H, T, D) heads put there."""
    D = E // H
    token = torch.arange(T)[:, None].expand(T, E).contiguous()  # each number of x is its token's index
    split = dg.alt_text(dg.head_layouts(T, E, H, step="split"))
    wrong_head = token.view(H, T, D)[0, :, 0].tolist()  # the bug, on one sequence
    assert f"'head' 0 holds tokens {', '.join(map(str, wrong_head))} in its rows" in split, split
    assert token.view(T, H, D).transpose(0, 1)[0, :, 0].tolist() == list(range(T))  # the right split: token t in row t
    heads = token.view(T, H, D).transpose(0, 1).contiguous()  # (H, T, D)
    merge = dg.alt_text(dg.head_layouts(T, E, H, step="merge"))
    row0 = sorted(set(heads.reshape(T, E)[0].tolist()))  # merged without the transpose
    assert f"fills row 0 with tokens {', '.join(map(str, row0))} of head 0" in merge, merge
    torch.testing.assert_close(heads.transpose(0, 1).reshape(T, E), token)  # with it: x again



def test_multihead_flow_projections_draw_each_heads_slices_from_x_and_name_the_head_colours():
    fig = dg.multihead_flow(L=5, E=12, H=3, batch=2, names={"L": "T"}, legend=True, projections=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert {"X", "@ W_Q,h", "@ W_K,h", "@ W_V,h", "head 0", "head 1", "head 2"} <= set(texts)
    assert "(B, T, E)\n(2, 5, 12)" in texts
    assert "W_Q,h, W_K,h and W_V,h of shape (E, D) = (12, 4)" in fig.attn_alt
    plain = dg.multihead_flow(L=5, E=12, H=3)
    assert "X" not in [t.get_text() for t in plain.axes[0].texts] and "head 0" not in plain.attn_alt

@pytest.mark.parametrize("kwargs, match", [({"T": 11}, "T must be at most 10"), ({"E": 18, "H": 3}, "E at most 16"),
                                           ({"E": 12, "H": 5}, "divisible"), ({"step": "both"}, "step must be")])
def test_head_layouts_refuses_what_it_cannot_draw(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dg.head_layouts(**kwargs)


def test_alibi_flow_draws_the_packages_slopes_on_one_scale():
    """The slope of each drawn head is alibi_slopes'; a steeper head's bias is drawn darker (one scale)."""
    fig = dg.alibi_flow(L=6, H=12, heads=(0, 8, 11))
    slopes = ac.alibi_slopes(12, dtype=torch.float64).tolist()
    labels = [t.get_text() for t in texts(fig)]
    for h in (0, 8, 11):
        m = slopes[h]
        expected = f"× −1/{round(1 / m)}" if abs(1 / m - round(1 / m)) < 1e-9 else f"× −{m:.3g}"
        assert expected in labels, (expected, labels)
    bias_cells = [p for p in patches(fig, "cell:position")]
    darkest = min(sum(to_rgb(p.get_facecolor())) for p in bias_cells)
    lightest = max(sum(to_rgb(p.get_facecolor())) for p in bias_cells)
    assert darkest < lightest - 0.5  # head 0 at distance 5 is much darker than a distance of 0
    assert "head 0 multiplies them by −1/" in dg.alt_text(fig) or "head 0 multiplies them by −0." in dg.alt_text(fig)


def test_alibi_flow_without_weights_writes_each_bias_range_and_draws_no_weights():
    """weights=False (chapter 09) ends each row at the mask and softmax and writes the bias's range instead."""
    fig = dg.alibi_flow(L=6, H=8, heads=(0, 3, 7), weights=False)
    labels = [t.get_text() for t in texts(fig)]
    assert any("bias, head 0: 0 to −2.5" in label for label in labels), labels
    assert not patches(fig, "cell:weight") and patches(dg.alibi_flow(L=6, H=8, heads=(0, 3, 7)), "cell:weight")
    assert "illustrative" not in dg.alt_text(fig) and "its bias runs from 0 to −2.5" in dg.alt_text(fig)


def test_attention_flow_with_out_proj_draws_the_heads_merged_through_w_o():
    fig = dg.attention_flow(L=6, D=8, E=16, heads=2, out_proj=True)
    assert any("@ W_O" in t.get_text() for t in texts(fig))
    assert "through the output projection W_O into Y (L, E) = (6, 16)" in dg.alt_text(fig)
    assert "W_O" not in dg.alt_text(dg.attention_flow(L=6, D=8, E=16, heads=2))
    with pytest.raises(ValueError, match="needs heads"):
        dg.attention_flow(L=6, D=8, out_proj=True)


def test_multihead_flow_with_kv_heads_says_which_query_heads_each_serves():
    fig = dg.multihead_flow(L=6, E=32, H=8, kv_heads=2)
    assert "key/value head g serves\nquery heads 4g to 4g + 3" in [t.get_text() for t in texts(fig)]
    assert "key/value head g serves query heads 4g to 4g + 3" in dg.alt_text(fig)
    assert "serves" not in dg.alt_text(dg.multihead_flow(L=6, E=32, H=8))


def test_grouped_fold_flow_masks_each_heads_rows_as_the_package_folds_them():
    import matplotlib.colors as mcolors
    from matplotlib.patches import Rectangle

    L, H, G = 3, 8, 2
    fig = dg.grouped_fold_flow(L=L, H=H, G=G, D=4)
    alt = dg.alt_text(fig)
    assert "(H/G·L, D) = (12, 4)" in alt and "(H/G·L, S) = (12, 3)" in alt and "No key or value is copied" in alt
    # the weights block: grey exactly where query row r (position r % L of its head) may not see key j
    grey = mcolors.to_rgba(dg.PALETTE["mask_blocked"])
    cells = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert sum(mcolors.to_rgba(p.get_facecolor()) == grey for p in cells) == (H // G) * L * (L - 1) // 2
    # the package folds the same way: head h, position i is row h * L + i of its group
    q = torch.arange(H * L, dtype=torch.float32).view(1, H, L, 1)
    folded = ac.gqa._fold(q, G)  # (1, G, H/G * L, 1)
    assert folded[0, 0, :, 0].tolist() == [float(h * L + i) for h in range(H // G) for i in range(L)]


def test_rolling_cache_flow_puts_each_position_in_the_slot_of_the_package_cache():
    for window, T in ((4, 10), (3, 3), (5, 12), (1, 6)):
        fig = dg.rolling_cache_flow(window=window, T=T)
        cache = ac.RollingKVCache(1, 1, 1, 1, window)
        for p in range(T):
            cache.update(0, torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
        slots = [int(v) for v in cache.keys[0].flatten().tolist()]
        kept_order = [int(v) for v in cache._kept_in_order(cache.keys[0], T).flatten().tolist()]
        alt = dg.alt_text(fig)
        order = [slots.index(p) for p in kept_order]
        assert alt.endswith("attention reads the slots in position order, " + ", ".join(map(str, order)) + "."), alt
        drawn = [t.get_text() for t in texts(fig)]
        assert f"slot {window - 1}" in drawn and "read in position order: slots " + ", ".join(map(str, order)) in drawn


@pytest.mark.parametrize("call, match", [
    (lambda: dg.alibi_flow(L=13), "L must be at most"),
    (lambda: dg.alibi_flow(H=4, heads=(4,)), "heads"),
    (lambda: dg.alibi_flow(heads=3), "heads"),
    (lambda: dg.rolling_cache_flow(window=9, T=12), "window"),
    (lambda: dg.rolling_cache_flow(window=4, T=3), "window"),
])
def test_chapter_09_and_10_builders_refuse_what_they_cannot_draw(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_rotary_attention_flow_joins_w_v_to_the_values():
    """With rotary=True the arrows of W_Q and W_K stop at their "rotate" boxes; W_V's reaches V itself."""
    fig = dg.attention_flow(L=6, D=8, E=16, rotary=True)
    v_block = next(p for p in patches(fig, "block:value"))
    v_left = (v_block.get_x(), v_block.get_y() + v_block.get_height() / 2)  # the middle of V's left side, inches
    ends = [tuple(p._path_original.vertices[-1]) for p in fig.findobj(matplotlib.patches.FancyArrowPatch)
            if getattr(p, "_path_original", None) is not None]  # where each arrow was drawn to, in inches
    assert any(np.allclose(end, v_left) for end in ends), (v_left, ends)


def test_rotary_attention_flow_names_the_positions_when_given():
    """rotary="0..5" writes "by 0..5" under both "rotate" boxes and names the positions in the alt text."""
    fig = dg.attention_flow(L=6, D=8, E=16, rotary="0..5")
    assert [t.get_text() for t in fig.axes[0].texts].count("by 0..5") == 2
    assert "rotated by their positions 0..5 (rotary embeddings)" in fig.attn_alt
    plain = dg.attention_flow(L=6, D=8, E=16, rotary=True)
    assert "by 0..5" not in [t.get_text() for t in plain.axes[0].texts]
    assert "rotated by their positions (rotary embeddings)" in plain.attn_alt


@pytest.mark.parametrize("L, S, block_q, block_k", [(100, 100, 32, 32), (6, 9, 2, 3), (7, 7, 7, 7), (64, 64, 8, 16)])
def test_causal_tiles_draws_the_tiles_that_tiled_attention_visits(L, S, block_q, block_k):
    fig = dg.causal_tiles(L, S, block_q=block_q, block_k=block_k)
    skipped = len(patches(fig, "tile:skipped"))
    full = len(patches(fig, "tile:full"))
    total = -(-L // block_q) * -(-S // block_k)
    q, k = torch.randn(1, L, 4), torch.randn(1, S, 4)
    with torch.no_grad():
        counts = bench.operator_counts(lambda: ac.tiled_attention(q, k, k, is_causal=True, query_block_size=block_q,
                                                                     key_block_size=block_k))
    visited = counts["aten::matmul"] // 2  # two products per tile
    assert total - skipped == visited, (skipped, visited)
    assert f"{visited} of {total} tiles computed" in dg.alt_text(fig)
    assert full <= visited
    plt.close(fig)


def test_tiled_attention_flow_feeds_the_value_tile_into_the_update():
    fig = dg.tiled_attention_flow(L=4, S=12, D=8, block_k=4, tile=1, names={"L": "Lb", "block_k": "Sb"})
    words = {t.get_text() for t in texts(fig)}
    assert {"acc", "update m, ℓ, acc", "(Lb, Sb)\n(4, 4)", "(Lb, D)\n(4, 8)"} <= words, words
    assert any("(Sb, D)\n(4, 8)" in w for w in words) and any("(Lb, 1)\n(4, 1)" in w for w in words)
    assert "value tile V₂ (Sb, D) = (4, 8)" in dg.alt_text(fig)
    plt.close(fig)


def test_positional_flow_shades_real_sin_cos_columns_of_the_encoding():
    # Chapter 06 (E = 16, 12 columns drawn): whole (sin, cos) pairs, fastest to slowest, each cell shaded by the
    # value of the package's encoding at a real position and column (row 0: sin 0 = 0, cos 0 = 1, alternating).
    import attn_course as ac

    cells = dg._wave_cells(5, 16, "sinusoidal")
    pe = ac.sinusoidal_positional_encoding(5, 16, dtype=torch.float64)
    columns = [j for i in (0, 1, 3, 4, 6, 7) for j in (2 * i, 2 * i + 1)]  # 6 of the 8 pairs, spread evenly
    assert cells.shape == (5, 12)
    drawn = [(float(pe[r, j]), sum(cells[r, c])) for r in range(5) for c, j in enumerate(columns)]
    drawn.sort()
    # one scale: a larger value is never lighter (the sum of the colour's channels never grows)
    assert all(a[1] >= b[1] - 1e-9 for a, b in zip(drawn, drawn[1:]))
    assert drawn[0][1] > drawn[-1][1] + 0.5  # light for -1, dark for +1
    assert len({cells[0, c] for c in range(0, 12, 2)}) == 1 and len({cells[0, c] for c in range(1, 12, 2)}) == 1
    assert sum(cells[0, 0]) > sum(cells[0, 1])  # sin 0 = 0 (mid) is lighter than cos 0 = 1 (dark)
    assert "light (−1) to dark (+1)" in dg.positional_flow(L=5, E=16).attn_alt
