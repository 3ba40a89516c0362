"""Checks for the exercises of chapter 10, grouped-query attention and sliding windows."""

from __future__ import annotations

import math

import torch

from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_gqa_cache_bytes", "check_grouped_attention", "check_mean_pool_kv", "check_receptive_field"]


@exercise(
    "Exercise 1, the cache of grouped-query attention, with and without a window",
    hint="2 (keys and values) * num_layers * batch_size * num_kv_heads * positions kept * head_dim * bytes_per_number, "
    "where the positions kept are seq_len, or min(seq_len, window) with a window",
)
def check_gqa_cache_bytes(cache_bytes) -> str:
    cases = [  # (num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window)
        (32, 8, 128, 4096, 1, 2, None),  # 32 layers, 8 kv heads of width 128 (Llama 3 8B, Mistral 7B)
        (32, 8, 128, 32768, 1, 2, 4096),  # Mistral 7B: window 4096
        (2, 1, 16, 100, 3, 4, None),
        (2, 2, 16, 10, 3, 4, 64),  # a window longer than the sequence
        (4, 4, 8, 64, 2, 2, 64),  # a window exactly the sequence
    ]
    for num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window in cases:
        kept = seq_len if window is None else min(seq_len, window)
        expected = 2 * num_layers * batch_size * num_kv_heads * kept * head_dim * bytes_per_number
        what = (f"cache_bytes(num_layers={num_layers}, num_kv_heads={num_kv_heads}, head_dim={head_dim}, seq_len={seq_len}, "
                f"batch_size={batch_size}, bytes_per_number={bytes_per_number}, window={window})")
        got = call(cache_bytes, num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_number, window)
        expect(isinstance(got, (int, float)) and not isinstance(got, bool), f"{what}: return a number, got {type(got).__name__}")
        if got == expected / 2:
            raise Mismatch(f"{what} = {got:,}, exactly half the answer: the cache stores keys *and* values")
        if window is not None and got == expected // kept * seq_len != expected:
            raise Mismatch(f"{what} = {got:,}: you ignored the window; only the last {window} positions are kept")
        if window is not None and got == expected // kept * window != expected:
            raise Mismatch(f"{what} = {got:,}: the window is longer than the sequence here, so only {seq_len} positions are stored")
        if window is not None and window < seq_len and got in (expected // kept * (window + 1), expected // kept * (window - 1)):
            raise Mismatch(f"{what} = {got:,}: the window is off by one; the cache keeps exactly the last {window} positions")
        if batch_size > 1 and got == expected // batch_size:
            raise Mismatch(f"{what} = {got:,}: you left out the batch; every sequence of the batch has its own cache")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    windowed = 2 * 32 * 8 * 4096 * 128 * 2  # 32 layers, 8 kv heads of width 128, 4096 positions kept, float16
    full_mha = 2 * 32 * 32 * 32768 * 128 * 2  # the same model with 32 key/value heads and no window, 32k positions
    return (f"right. A 32k-token conversation of a 32-layer model with 8 key/value heads of width 128 and a 4,096-token "
            f"window takes {windowed / 2**30:.2f} GiB in float16; with 32 key/value heads and no window it would take "
            f"{full_mha / 2**30:.0f} GiB.")


@exercise(
    "Exercise 2, grouped-query attention from its definition",
    hint="repeat each key/value head for its group: key.repeat_interleave(H // G, dim=1) (not .repeat, which "
    "tiles 0, 1, 0, 1, ...), then softmax(q @ k^T / sqrt(D)) @ v with a causal mask",
)
def check_grouped_attention(grouped_attention) -> str:
    generator = torch.Generator().manual_seed(11)
    for B, H, G, L, D in ((1, 8, 4, 4, 2), (2, 6, 2, 5, 4)):  # groups of 2 (where h // G is a valid, wrong index), then of 3
        _check_grouped_case(grouped_attention, generator, B, H, G, L, D)
    return "your grouping is the one of F.scaled_dot_product_attention(..., enable_gqa=True): query head h reads key/value head h // (H / G)."


def _check_grouped_case(grouped_attention, generator, B, H, G, L, D) -> None:
    q = torch.randn(B, H, L, D, generator=generator, dtype=torch.float64)
    k = torch.randn(B, G, L, D, generator=generator, dtype=torch.float64)
    v = torch.randn(B, G, L, D, generator=generator, dtype=torch.float64)
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # True = may attend

    def attention(k_full, v_full, scale=True, masked=True):
        scores = q @ k_full.transpose(-2, -1) / (math.sqrt(D) if scale else 1.0)  # (B, H, L, L)
        if masked:
            scores = scores.masked_fill(~causal, float("-inf"))
        return scores.softmax(dim=-1) @ v_full  # (B, H, L, D)

    got = call(grouped_attention, q.clone(), k.clone(), v.clone())
    what = f"grouped_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"
    got = expect_tensor(got, what=what, shape=(B, H, L, D)).double()
    group = H // G
    expected = attention(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
    if torch.allclose(got, expected, atol=1e-6):
        return
    if torch.allclose(got, attention(k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)), atol=1e-6):
        raise Mismatch(f"{what}: you tiled the key/value heads (0, 1, 0, 1, ...: head h % G) with .repeat; query head h "
                       "must read key/value head h // (H / G), so each head is repeated in place: 0, 0, 0, 1, 1, 1 "
                       "(repeat_interleave)")
    by_g = torch.arange(H) // G  # the number of groups taken for the group size
    if int(by_g.max()) < G and torch.allclose(got, attention(k[:, by_g], v[:, by_g]), atol=1e-6):
        raise Mismatch(f"{what}: query head h read key/value head h // G; the group size is H // G = {group}, so it is "
                       "h // (H // G)")
    if torch.allclose(got, attention(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), scale=False), atol=1e-6):
        raise Mismatch(f"{what}: the scores are not divided by sqrt(D)")
    if torch.allclose(got, attention(k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), masked=False), atol=1e-6):
        raise Mismatch(f"{what}: every query sees every key: apply the causal mask (query i sees keys 0..i)")
    expect_close(got, expected, what=what, atol=1e-6)


@exercise(
    "Exercise 3, mean-pooling key/value heads (Ainslie et al.)",
    hint="weight has num_heads blocks of head_dim rows; view it as (G, H // G, D, E), average over axis 1, "
    "and reshape to (G * D, E)",
)
def check_mean_pool_kv(mean_pool) -> str:
    generator = torch.Generator().manual_seed(12)
    H, G, D, E = 8, 2, 3, 5
    weight = torch.randn(H * D, E, generator=generator, dtype=torch.float64)
    got = call(mean_pool, weight.clone(), H, G)
    what = f"mean_pool(weight of shape {(H * D, E)}, num_heads={H}, num_kv_heads={G})"
    got = expect_tensor(got, what=what, shape=(G * D, E)).double()
    heads = weight.view(H, D, E)
    expected = heads.view(G, H // G, D, E).mean(dim=1).reshape(G * D, E)
    if torch.allclose(got, expected):
        # a second shape, so that the answer is not tuned to one case
        other = torch.randn(6 * 4, 3, generator=generator, dtype=torch.float64)
        got2 = expect_tensor(call(mean_pool, other.clone(), 6, 3), what="mean_pool(weight (24, 3), num_heads=6, num_kv_heads=3)", shape=(12, 3))
        expect_close(got2, other.view(3, 2, 4, 3).mean(dim=1).reshape(12, 3), what="mean_pool(weight (24, 3), num_heads=6, num_kv_heads=3)")
        return "your pooled weights match GroupedQueryAttention.from_multihead: each key/value head is its group's mean."
    if torch.allclose(got, heads.view(G, H // G, D, E).sum(dim=1).reshape(G * D, E)):
        raise Mismatch("you summed the heads of each group; Ainslie et al. take the mean (a sum makes keys H/G times larger)")
    if torch.allclose(got, heads.view(H // G, G, D, E).mean(dim=0).reshape(G * D, E)):
        raise Mismatch("you averaged heads h, h + G, h + 2G, ...; the group of key/value head g is the consecutive "
                       "query heads g * H/G .. (g + 1) * H/G - 1")
    if torch.allclose(got, heads.view(G, H // G, D, E)[:, 0].reshape(G * D, E)):
        raise Mismatch("you kept the first head of each group; mean-pooling averages all heads of the group")
    raise Mismatch(f"{what}: the values differ from the mean of each group's heads")


@exercise(
    "Exercise 4, how far back does a stack of sliding-window layers see?",
    hint="each layer moves information at most window - 1 positions back; count the token itself",
)
def check_receptive_field(receptive_field) -> str:
    for num_layers, window, seq_len in ((1, 4, 100), (3, 4, 100), (2, 1, 50), (6, 5, 20), (4, 4096, 32768), (32, 4096, 32768)):
        expected = min(seq_len, num_layers * (window - 1) + 1)
        got = call(receptive_field, num_layers, window, seq_len)
        what = f"receptive_field(num_layers={num_layers}, window={window}, seq_len={seq_len})"
        expect(isinstance(got, int) and not isinstance(got, bool), f"{what}: return an int, got {type(got).__name__} {got!r}")
        if got == min(seq_len, num_layers * window) != expected:
            raise Mismatch(f"{what} = {got}: layers x window counts the token itself once per layer; each layer adds window - 1")
        if got == num_layers * (window - 1) + 1 != expected:
            raise Mismatch(f"{what} = {got}: a token cannot see further back than the start of the sequence (seq_len)")
        if got == expected - 1 and expected < seq_len:
            raise Mismatch(f"{what} = {got}: one short; count the last position itself too (one layer with window "
                           f"{window} sees {window} positions)")
        if got == min(seq_len, window) != expected:
            raise Mismatch(f"{what} = {got}: that is one layer's view; stacked layers relay information further")
        expect(got == expected, f"{what}: expected {expected}, got {got}")
    return "right: Mistral's 32 layers with a 4096-token window relay information across the whole 32k context."
