"""The exercise checks of chapter 05: a right answer passes, a wrong one says what is wrong, a crash
is reported without a traceback, and the untouched scaffold counts as not attempted."""

import math

import pytest
import torch

import attn_course as ac

from attn_course.exercises.ch05 import (
    check_count_parameters,
    check_cross_attention,
    check_merge_heads,
    check_split_fused_qkv,
    check_split_heads,
)


def scaffold(*args):
    ...


def split_heads(x, num_heads):
    B, T, E = x.shape
    return x.view(B, T, num_heads, E // num_heads).transpose(1, 2)


def merge_heads(context):
    B, H, T, D = context.shape
    return context.transpose(1, 2).reshape(B, T, H * D)


def split_fused_qkv(qkv, num_heads):
    E = qkv.size(-1) // 3
    return tuple(split_heads(t, num_heads) for t in qkv.split(E, dim=-1))


def split_fused_qkv_by_permute(qkv, num_heads):
    # the same answer written another way: one view with an axis for q/k/v, then one permute
    B, T, three_E = qkv.shape
    D = three_E // 3 // num_heads
    return qkv.view(B, T, 3, num_heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)


def fused_per_head_layout(qkv, num_heads):
    # the other layout: each head's [q_h | k_h | v_h] side by side
    B, T, three_E = qkv.shape
    return qkv.view(B, T, num_heads, -1).transpose(1, 2).chunk(3, dim=-1)


def count_parameters(embed_dim, num_heads, bias=True, qk_head_dim=None):
    d_k = embed_dim // num_heads if qk_head_dim is None else qk_head_dim
    return 2 * embed_dim * num_heads * d_k + 2 * embed_dim * embed_dim + ((2 * num_heads * d_k + 2 * embed_dim) if bias else 0)


def count_parameters_by_projection(embed_dim, num_heads, bias, qk_head_dim=None):
    # the same count written another way: projection by projection
    widths = [num_heads * (qk_head_dim or embed_dim // num_heads)] * 2 + [embed_dim, embed_dim]
    return sum(embed_dim * w + (w if bias else 0) for w in widths)


def count_with(*, qk="H*dk", v="E", out="E", bias_qk="H*dk"):
    # a parametrised wrong count: widths of the query/key, value and output projections
    def count(E, H, bias, qk_head_dim=None):
        dk = E // H if qk_head_dim is None else qk_head_dim
        width = {"H*dk": H * dk, "dk": dk, "E": E}
        weights = 2 * E * width[qk] + E * width[v] + E * width[out]
        biases = (2 * width[bias_qk] + width[v] + width[out]) if bias else 0
        return weights + biases
    return count


def cross_attention(queries, memory, mha, key_padding_mask, scale_width=None, use_mask=True, invert=False):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)  # (B, H, L, D)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))  # (B, H, S, D)
    width = q.size(-1) if scale_width is None else scale_width
    scores = q @ k.transpose(-2, -1) / math.sqrt(width)  # (B, H, L, S)
    if use_mask:
        blocked = ~key_padding_mask if invert else key_padding_mask
        scores = scores.masked_fill(blocked[:, None, None, :], float("-inf"))
    return mha.out_proj(merge_heads(scores.softmax(-1) @ v))


RIGHT = [
    (check_split_heads, split_heads),
    (check_merge_heads, merge_heads),
    (check_split_fused_qkv, split_fused_qkv),
    (check_split_fused_qkv, split_fused_qkv_by_permute),
    (check_split_fused_qkv, lambda qkv, h: list(split_fused_qkv(qkv, h))),
    (check_count_parameters, count_parameters),
    (check_count_parameters, count_parameters_by_projection),
    (check_cross_attention, cross_attention),
]


@pytest.mark.parametrize("check, answer", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_pass(check, answer):
    feedback = check(answer)
    assert feedback.status == "correct", str(feedback)
    assert bool(feedback)


@pytest.mark.parametrize("check", [c for c, _ in RIGHT], ids=lambda f: f.__name__)
def test_untouched_scaffold_is_not_attempted(check):
    for answer in (scaffold, ...):
        feedback = check(answer)
        assert feedback.status == "not attempted" and not feedback
        assert "Not attempted yet" in str(feedback)


@pytest.mark.parametrize(
    "check, answer, error",
    [
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), h, 5), "RuntimeError"),
        (check_merge_heads, lambda c: c.transpose(1, 2).view(c.size(0), c.size(2), -1), "RuntimeError"),
        # chunked along the token axis instead of the width: the view then fails
        (check_split_fused_qkv, lambda qkv, h: tuple(t.view(2, 5, h, -1).transpose(1, 2) for t in qkv.chunk(3, dim=1)),
         "RuntimeError"),
        (check_count_parameters, lambda e, h, b, dk: e / 0, "ZeroDivisionError"),
        (check_cross_attention, lambda q, m, mha, kpm: q @ m, "RuntimeError"),
    ],
)
def test_crashing_answers_are_reported_without_a_traceback(check, answer, error):
    feedback = check(answer)
    assert feedback.status == "error"
    assert error in feedback.message and "Traceback" not in str(feedback)
    assert "Hint:" in str(feedback)


# The table of plausible wrong answers: each must be rejected ("incorrect") with a message naming the mistake.
@pytest.mark.parametrize(
    "check, answer, words",
    [
        (check_split_heads, lambda x, h: x.reshape(x.size(0), h, x.size(1), -1), "viewed x as (B, H, T, D) directly"),
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), -1, h).permute(0, 3, 1, 2), "interleaved"),
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), h, -1), "expected shape"),
        (check_merge_heads, lambda c: c.reshape(c.size(0), c.size(2), -1), "without moving the head axis"),
        (check_merge_heads, lambda c: c.transpose(1, 2), "expected shape (2, 5, 12)"),
        # Exercise 2: the other layout, the wrong order, the classic view, no transpose, interleaved heads, one tensor
        (check_split_fused_qkv, fused_per_head_layout, "[q_h | k_h | v_h]"),
        (check_split_fused_qkv, lambda qkv, h: split_fused_qkv(qkv, h)[::-1], "wrong order (v, k, q)"),
        (check_split_fused_qkv, lambda qkv, h: (lambda q, k, v: (k, q, v))(*split_fused_qkv(qkv, h)), "wrong order (k, q, v)"),
        (check_split_fused_qkv, lambda qkv, h: tuple(t.reshape(t.size(0), h, t.size(1), -1) for t in qkv.split(12, -1)),
         "viewed each as (B, H, T, D) directly"),
        (check_split_fused_qkv, lambda qkv, h: tuple(t.reshape(t.size(0), t.size(1), -1, h).permute(0, 3, 1, 2)
                                                     for t in qkv.split(12, -1)), "interleaved"),
        (check_split_fused_qkv, lambda qkv, h: tuple(t.reshape(t.size(0), t.size(1), h, -1) for t in qkv.split(12, -1)),
         "expected shape (2, 3, 5, 4)"),
        (check_split_fused_qkv, lambda qkv, h: split_heads(qkv, h), "expected three tensors (q, k, v), got Tensor"),
        (check_split_fused_qkv, lambda qkv, h: split_fused_qkv(qkv, h)[:2], "of length 2"),
        (check_split_fused_qkv, lambda qkv, h: tuple(t * 1.01 for t in split_fused_qkv(qkv, h)), "values differ"),
        # Exercise 3: qk_head_dim ignored, values or output narrowed too, d_k taken as the total width,
        # the output projection or the biases forgotten, heads multiplied, E-wide query/key biases, not a number
        (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b), "left qk_head_dim out"),
        (check_count_parameters, count_with(v="H*dk", out="H*dk"), "narrowed the values and the output projection too"),
        (check_count_parameters, count_with(v="H*dk"), "narrowed the values too"),
        (check_count_parameters, count_with(qk="dk", bias_qk="dk"), "not (E, qk_head_dim)"),
        (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b, dk) - e * e - (e if b else 0),
         "not the output projection"),
        (check_count_parameters, lambda e, h, b, dk: h * count_parameters(e, h, b, dk), "does not grow with the number of heads"),
        (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, False, dk), "left out the four bias vectors"),
        (check_count_parameters, count_with(bias_qk="E"), "H * qk_head_dim entries each"),
        (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, True, dk), "With bias=False the projections have no biases"),
        (check_count_parameters, lambda e, h, b, dk: 4 * e * e + (4 * e if b else 0), "left qk_head_dim out"),
        (check_count_parameters, lambda e, h, b, dk: "many", "expected a number, got str"),
        (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, use_mask=False), "no effect"),
        (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, invert=True), "only to the padding"),
        (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, scale_width=12), "sqrt(E)"),
        (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm) + 0.1, "values differ"),
        (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm)[:, :2], "expected shape (2, 3, 12)"),
    ],
)
def test_wrong_answers_say_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message
    assert "Hint:" in str(feedback)


def test_count_accepts_a_one_element_tensor_and_the_check_keeps_the_global_rng():
    assert check_count_parameters(lambda e, h, b, dk: torch.tensor(count_parameters(e, h, b, dk)))
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    check_cross_attention(cross_attention)
    assert torch.equal(torch.rand(1), before)


def test_the_count_check_agrees_with_the_module_and_the_papers_rows_b():
    for E, H, bias, dk in [(512, 8, False, 16), (512, 8, True, 32), (12, 3, True, 8), (768, 12, True, None)]:
        module = ac.MultiHeadAttention(E, H, bias=bias, qk_head_dim=dk)
        assert count_parameters(E, H, bias, dk) == sum(p.numel() for p in module.parameters())
    # Table 3 rows (B): 18 attention layers without biases, 65 M parameters at d_k = 64
    for dk, listed in ((16, 58), (32, 60)):
        saved = 18 * (count_parameters(512, 8, False) - count_parameters(512, 8, False, dk))
        assert round(65 - saved / 1e6) == listed


def test_fused_split_gives_the_projections_of_nn_multihead_attention():
    torch.manual_seed(0)
    torch_mha = torch.nn.MultiheadAttention(12, 3, batch_first=True)
    ours = ac.MultiHeadAttention.from_torch(torch_mha)
    x = torch.randn(2, 5, 12)
    qkv = torch.nn.functional.linear(x, torch_mha.in_proj_weight, torch_mha.in_proj_bias)  # (B, T, 3E)
    for got, proj in zip(split_fused_qkv(qkv, 3), (ours.q_proj, ours.k_proj, ours.v_proj)):
        torch.testing.assert_close(got, split_heads(proj(x), 3))
