"""The shared heatmaps: colours scaled to the data by default, the scale named on the colour bar."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import attn_course as ac  # noqa: E402


def _image_limits(fig):
    image = fig.axes[0].images[0]
    return image.norm.vmin, image.norm.vmax


def test_heatmap_scales_to_the_data_by_default():
    weights = torch.tensor([[0.10, 0.35], [0.20, 0.15]])
    fig = ac.plot_attention(weights)
    assert _image_limits(fig) == pytest.approx((0.0, 0.35))
    assert "scaled to the data" in fig.axes[-1].get_ylabel() and "0.35" in fig.axes[-1].get_ylabel()
    plt.close(fig)


def test_heatmap_keeps_the_fixed_scale_as_an_option():
    fig = ac.plot_attention(torch.full((2, 2), 0.25), vmax=1.0)
    assert _image_limits(fig) == pytest.approx((0.0, 1.0))
    assert "fixed scale: 0 to 1" in fig.axes[-1].get_ylabel()
    plt.close(fig)


def test_small_heatmaps_are_annotated():
    fig = ac.plot_attention(torch.softmax(torch.randn(3, 3), dim=-1))
    assert len(fig.axes[0].texts) == 9
    plt.close(fig)


def test_grid_shares_one_scale_and_one_colour_bar():
    weights = torch.stack([torch.full((2, 2), 0.1), torch.full((2, 2), 0.4)])
    fig = ac.plot_attention_grid(weights)
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert len(heatmaps) == 2
    assert all(ax.images[0].norm.vmax == pytest.approx(0.4) for ax in heatmaps)
    assert sum("attention weight" in ax.get_ylabel() for ax in fig.axes) == 1
    plt.close(fig)


@pytest.mark.parametrize("vmax", [0, -1.0, "1", True])
def test_bad_vmax_is_refused(vmax):
    with pytest.raises(ValueError, match="vmax"):
        ac.plot_attention(torch.eye(2), vmax=vmax)


def test_query_row_outlines_the_row_and_marks_the_blocked_keys():
    words = ["<pad>", "<pad>", "a", "dog"]
    allowed = ac.combine_masks(ac.causal_mask(4), padding=torch.tensor([[False, False, True, True]]))[0]
    q = k = v = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    _, weights = ac.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    fig = ac.plotting.plot_query_row(allowed, weights, words, 3)
    left, right = fig.axes
    assert len(left.patches) == 1 and left.patches[0].get_y() == 2.5           # the row of query 3 is outlined
    crosses = [t for t in right.texts if t.get_text() == "×"]
    assert [round(t.get_position()[0]) for t in crosses] == [0, 1]            # the two padding keys are blocked
    assert [round(b.get_height(), 4) for b in right.patches] == [round(float(w), 4) for w in weights[3]]
    assert "sees: a, dog" in right.get_title()
    plt.close(fig)
    empty = ac.plotting.plot_query_row(allowed, weights, words, 0)             # a padding query at the front
    assert "nothing (output = 0)" in empty.axes[1].get_title()
    plt.close(empty)


@pytest.mark.parametrize("query", [4, -1, 1.0, True])
def test_query_row_refuses_a_query_outside_the_rows(query):
    allowed = ac.causal_mask(4)
    with pytest.raises(ValueError, match="query"):
        ac.plotting.plot_query_row(allowed, allowed.float(), list("abcd"), query)


def test_query_row_refuses_shapes_that_do_not_match_the_labels():
    with pytest.raises(ValueError, match="labels"):
        ac.plotting.plot_query_row(ac.causal_mask(4), torch.ones(4, 4), list("abc"), 0)
