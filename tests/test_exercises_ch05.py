"""The exercise checks of chapter 05: a right answer passes, a wrong one says what is wrong, a crash
is reported without a traceback, and the untouched scaffold counts as not attempted."""

import math

import pytest
import torch

from attn_course.exercises.ch05 import (
    check_count_parameters,
    check_merge_heads,
    check_cross_attention,
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


def count_parameters(embed_dim, num_heads, bias=True):
    return 4 * embed_dim * embed_dim + (4 * embed_dim if bias else 0)


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
    (check_count_parameters, count_parameters),
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
        (check_count_parameters, lambda e, h, b: e / 0, "ZeroDivisionError"),
        (check_cross_attention, lambda q, m, mha, kpm: q @ m, "RuntimeError"),
    ],
)
def test_crashing_answers_are_reported_without_a_traceback(check, answer, error):
    feedback = check(answer)
    assert feedback.status == "error"
    assert error in feedback.message and "Traceback" not in str(feedback)
    assert "Hint:" in str(feedback)


@pytest.mark.parametrize(
    "check, answer, words",
    [
        (check_split_heads, lambda x, h: x.reshape(x.size(0), h, x.size(1), -1), "viewed x as (B, H, T, D) directly"),
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), -1, h).permute(0, 3, 1, 2), "interleaved"),
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), h, -1), "expected shape"),
        (check_merge_heads, lambda c: c.reshape(c.size(0), c.size(2), -1), "without moving the head axis"),
        (check_merge_heads, lambda c: c.transpose(1, 2), "expected shape (2, 5, 12)"),
        (check_count_parameters, lambda e, h, b: 3 * e * e + (3 * e if b else 0), "not the output projection"),
        (check_count_parameters, lambda e, h, b: h * count_parameters(e, h, b), "does not grow with the number of heads"),
        (check_count_parameters, lambda e, h, b: 4 * e * e, "left out the four bias vectors"),
        (check_count_parameters, lambda e, h, b: "many", "expected a number, got str"),
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
    assert check_count_parameters(lambda e, h, b: torch.tensor(count_parameters(e, h, b)))
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    check_cross_attention(cross_attention)
    assert torch.equal(torch.rand(1), before)
