"""The exercise checks of chapter 10: right, wrong, crashing and untouched answers."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from attn_course.exercises.ch10 import check_gqa_cache_bytes, check_grouped_attention, check_mean_pool_kv, check_receptive_field


def _scaffold(*args):
    ...


# --- right answers, and other ways of writing them -------------------------------------------------

def cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window=None, *, mistake=None):
    kept = seq_len if window is None else min(seq_len, window)
    if mistake == "ignore window":
        kept = seq_len
    if mistake == "window always":
        kept = window if window is not None else seq_len
    if mistake in ("window + 1", "window - 1") and window is not None:
        kept = min(seq_len, window + (1 if mistake == "window + 1" else -1))
    if mistake == "no batch":
        batch_size = 1
    factor = 1 if mistake == "no values" else 2
    return factor * num_layers * batch_size * num_kv_heads * kept * head_dim * bytes_per_number


def grouped_attention(q, k, v, *, mistake=None):
    B, H, L, D = q.shape
    group = H // k.size(1)
    if mistake == "tile":
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    elif mistake == "h // G":  # the number of groups taken for the group size
        owner = torch.arange(H) // k.size(1)
        k, v = k[:, owner], v[:, owner]
    elif mistake == "index h % G":
        owner = torch.arange(H) % k.size(1)
        k, v = k[:, owner], v[:, owner]
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / (1.0 if mistake == "no scale" else math.sqrt(D))
    if mistake != "no mask":
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(dim=-1) @ v


def grouped_attention_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def grouped_attention_einsum(q, k, v):
    B, H, L, D = q.shape
    G = k.size(1)
    qg = q.view(B, G, H // G, L, D)
    scores = torch.einsum("bgqld,bgsd->bgqls", qg, k) / math.sqrt(D)
    scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bgqls,bgsd->bgqld", scores.softmax(-1), v).reshape(B, H, L, D)


def mean_pool(weight, num_heads, num_kv_heads, *, mistake=None):
    rows, E = weight.shape
    D = rows // num_heads
    if mistake == "strided":
        return weight.view(num_heads // num_kv_heads, num_kv_heads, D, E).mean(dim=0).reshape(num_kv_heads * D, E)
    grouped = weight.view(num_kv_heads, num_heads // num_kv_heads, D, E)
    if mistake == "sum":
        return grouped.sum(dim=1).reshape(num_kv_heads * D, E)
    if mistake == "first":
        return grouped[:, 0].reshape(num_kv_heads * D, E)
    if mistake == "over width":
        return weight.view(num_heads, D, E).mean(dim=1).repeat_interleave(D, dim=0)[: num_kv_heads * D]
    return grouped.mean(dim=1).reshape(num_kv_heads * D, E)


def mean_pool_loop(weight, num_heads, num_kv_heads):
    D = weight.size(0) // num_heads
    group = num_heads // num_kv_heads
    blocks = []
    for g in range(num_kv_heads):
        heads = [weight[h * D:(h + 1) * D] for h in range(g * group, (g + 1) * group)]
        blocks.append(sum(heads) / group)
    return torch.cat(blocks)


def receptive_field(num_layers, window, seq_len, *, mistake=None):
    if mistake == "layers x window":
        return min(seq_len, num_layers * window)
    if mistake == "no clamp":
        return num_layers * (window - 1) + 1
    if mistake == "one layer":
        return min(seq_len, window)
    if mistake == "without itself":
        return min(seq_len, num_layers * (window - 1))
    return min(seq_len, num_layers * (window - 1) + 1)


def test_right_answers_pass():
    for feedback in (check_gqa_cache_bytes(cache_bytes), check_grouped_attention(grouped_attention),
                     check_grouped_attention(grouped_attention_sdpa), check_grouped_attention(grouped_attention_einsum),
                     check_mean_pool_kv(mean_pool), check_mean_pool_kv(mean_pool_loop), check_receptive_field(receptive_field)):
        assert feedback.status == "correct", str(feedback)
        assert bool(feedback)


def test_float32_grouped_attention_passes():
    assert check_grouped_attention(lambda q, k, v: grouped_attention(q.float(), k.float(), v.float()))


# --- wrong answers say what is wrong -------------------------------------------------------------

@pytest.mark.parametrize(
    "check, answer, text",
    [
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="no values"), "keys \\*and\\* values"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="ignore window"), "ignored the window"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window always"), "longer than the sequence"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a) + 1, "expected"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window + 1"), "off by one"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="window - 1"), "off by one"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a, mistake="no batch"), "left out the batch"),
        (check_gqa_cache_bytes, lambda *a: cache_bytes(*a) / 2**30, "expected"),  # GiB, not bytes
        (check_gqa_cache_bytes, lambda *a: str(cache_bytes(*a)), "return a number"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="tile"), "repeat_interleave"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="index h % G"), "repeat_interleave"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="h // G"), "group size is H // G"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="no scale"), "sqrt\\(D\\)"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v, mistake="no mask"), "causal mask"),
        (check_grouped_attention, lambda q, k, v: grouped_attention(q, k, v)[:, :2], "expected shape"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="sum"), "summed"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="strided"), "consecutive"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="first"), "first head"),
        (check_mean_pool_kv, lambda w, h, g: mean_pool(w, h, g, mistake="over width"), "differ"),
        (check_receptive_field, lambda n, w, s: receptive_field(n, w, s, mistake="layers x window"), "window - 1"),
        (check_receptive_field, lambda n, w, s: receptive_field(n, w, s, mistake="no clamp"), "start of the sequence"),
        (check_receptive_field, lambda n, w, s: receptive_field(n, w, s, mistake="one layer"), "one layer's view"),
        (check_receptive_field, lambda n, w, s: float(receptive_field(n, w, s)), "return an int"),
        (check_receptive_field, lambda n, w, s: receptive_field(n, w, s, mistake="without itself"), "one short"),
    ],
)
def test_wrong_answers_are_rejected_with_a_reason(check, answer, text):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert not feedback
    assert re.search(text, feedback.message), feedback.message


@pytest.mark.parametrize("check", [check_gqa_cache_bytes, check_grouped_attention, check_mean_pool_kv, check_receptive_field])
def test_scaffolds_and_crashes(check):
    assert check(_scaffold).status == "not attempted"
    assert check(...).status == "not attempted"

    def crash(*args):
        raise RuntimeError("boom")

    feedback = check(crash)
    assert feedback.status == "error" and "boom" in feedback.message and feedback.hint
