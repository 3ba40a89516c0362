"""Checks for the exercises of chapter 08, efficient attention."""

from __future__ import annotations

import math

import torch

import torch.nn.functional as F

from ..masks import causal_mask
from . import Mismatch, attempted, call, exercise, expect, expect_close, expect_tensor, mutable

__all__ = [
    "check_online_softmax_update",
    "check_attention_row_online",
    "check_merge_states",
    "check_kv_cache_bytes",
    "check_cache_attention_step",
]


def _pair(result, what: str):
    expect(isinstance(result, tuple) and len(result) == 2, f"{what}: return a pair (new_max, new_sum); got {type(result).__name__}")
    return result


@exercise(
    "Exercise 1, one step of the online softmax",
    hint="new_max = torch.maximum(running_max, block.amax(dim=-1)); then "
    "new_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(block - new_max[:, None]).sum(dim=-1)",
)
def check_online_softmax_update(update) -> str:
    generator = torch.Generator().manual_seed(8)
    scores = torch.randn(3, 10, generator=generator, dtype=torch.float64) * 3
    scores[1, 6] = 12.0  # row 1's maximum arrives late, so the sum so far must be rescaled
    # One step on a known state first, for a precise message.
    running_max = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    running_sum = torch.tensor([1.5, 2.0, 1.0], dtype=torch.float64)
    block = scores[:, :4]
    new_max, new_sum = _pair(call(update, running_max.clone(), running_sum.clone(), block.clone()), "update(running_max, running_sum, block)")
    expected_max = torch.maximum(running_max, block.amax(dim=-1))
    if isinstance(new_max, torch.Tensor) and new_max.shape == (4,):
        raise Mismatch("new_max has shape (4,), one entry per column of the block: you took the maximum over dim 0 "
                       "(the rows); each row needs its own maximum, over dim=-1")
    if isinstance(new_max, torch.Tensor) and new_max.numel() == 1:
        raise Mismatch("new_max is one number for all rows: each row (each query) keeps its own running maximum, "
                       "so take block.amax(dim=-1), one per row")
    if (isinstance(new_max, torch.Tensor) and new_max.shape == (3,)
            and torch.allclose(new_max.double(), torch.maximum(running_max.max(), block.max()).expand(3))):
        raise Mismatch("new_max is the largest score of the whole block, repeated: the maximum is per row "
                       "(block.amax(dim=-1)), not global")
    expect_close(new_max, expected_max, what="new_max (the largest score seen so far, per row)")
    not_rescaled = running_sum + torch.exp(block - expected_max[:, None]).sum(dim=-1)
    expected_sum = running_sum * torch.exp(running_max - expected_max) + torch.exp(block - expected_max[:, None]).sum(dim=-1)
    got_sum = expect_tensor(new_sum, what="new_sum", shape=(3,)).detach().double()
    if not torch.allclose(got_sum, expected_sum) and torch.allclose(got_sum, not_rescaled):
        raise Mismatch(
            "new_sum adds the new block correctly but keeps the old sum as it was: the old sum was "
            "computed relative to the old maximum, so multiply it by exp(running_max - new_max) first"
        )
    expect_close(new_sum, expected_sum, what="new_sum (sum of exp(score - new_max) over the scores seen so far)")
    # Then a whole stream, starting from nothing seen (max -inf, sum 0).
    state = (torch.full((3,), float("-inf"), dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    for start in range(0, 10, 3):
        state = _pair(call(update, state[0], state[1], scores[:, start:start + 3]), "update(...) on a stream of blocks")
    expect(bool(torch.isfinite(state[1]).all()), "starting from running_max = -inf and running_sum = 0, your sums became inf or NaN")
    expect_close(state[0], scores.amax(dim=-1), what="the final running maximum after all blocks")
    expect_close(torch.log(state[1].double()) + state[0].double(), torch.logsumexp(scores, dim=-1),
                 what="max + log(sum) after all blocks (it must equal torch.logsumexp)")
    return "streaming the blocks through your update gives the exact softmax normaliser (torch.logsumexp)."


@exercise(
    "Exercise 2, one query's attention output, block by block",
    hint="keep m (max), l (sum) and acc (a vector of width Dv); for each block: scores = keys_block @ query * scale, "
    "new_m = max(m, scores.max()), c = exp(m - new_m), p = exp(scores - new_m), l = l * c + p.sum(), "
    "acc = acc * c + p @ values_block; at the end return acc / l",
)
def check_attention_row_online(attention_row) -> str:
    generator = torch.Generator().manual_seed(9)
    S, D, Dv = 11, 4, 3
    query = torch.randn(D, generator=generator, dtype=torch.float64)
    keys = torch.randn(S, D, generator=generator, dtype=torch.float64) * 2
    values = torch.randn(S, Dv, generator=generator, dtype=torch.float64)
    weights = torch.softmax(keys @ query / math.sqrt(D), dim=-1)  # (S,)
    expected = weights @ values  # (Dv,)
    for block_size in (4, 1, 11, 16):
        got = call(attention_row, query, keys, values, block_size)
        got = expect_tensor(got, what=f"attention_row(query, keys, values, block_size={block_size})", shape=(Dv,))
        unscaled = torch.softmax(keys @ query, dim=-1) @ values
        if not torch.allclose(got.double(), expected) and torch.allclose(got.double(), unscaled):
            raise Mismatch("your output is attention without the 1/sqrt(D) scaling of the scores")
        unnormalised = (torch.exp(keys @ query / math.sqrt(D) - (keys @ query / math.sqrt(D)).max()) @ values)
        if not torch.allclose(got.double(), expected) and torch.allclose(got.double(), unnormalised):
            raise Mismatch("your output is not divided by the running sum l at the end")
        expect_close(got, expected, what=f"the output for block_size={block_size} (S={S} keys)")
    return "your block-by-block output equals exact attention for every block size: that is FlashAttention's inner loop."


def _state(scores: torch.Tensor, values: torch.Tensor):
    """(m, l, acc) of rows of scores (R, n) over values (n, Dv); a row of -inf gives (-inf, 0, 0)."""
    if scores.size(-1) == 0:  # no keys at all
        R = scores.size(0)
        return (torch.full((R,), float("-inf"), dtype=scores.dtype), torch.zeros(R, dtype=scores.dtype),
                torch.zeros(R, values.size(-1), dtype=scores.dtype))
    m = scores.amax(dim=-1)  # (R,)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # 0 in place of an infinite maximum
    p = torch.exp(scores - safe[:, None])  # (R, n)
    return m, p.sum(dim=-1), p @ values  # (R,), (R,), (R, Dv)


def _triple(result, what: str):
    expect(isinstance(result, (tuple, list)) and len(result) == 3,
           f"{what}: return a triple (m, l, acc); got {type(result).__name__}")
    return tuple(result)


@exercise(
    "Exercise 2, merge two partial softmax states",
    hint="the merged maximum is m = torch.maximum(m_a, m_b); each state's sum and accumulator were computed relative "
    "to its own maximum, so multiply them by exp(m_a - m) and exp(m_b - m) before adding; where m is -inf (nothing "
    "seen on either side) use 0 in place of m in the exponent",
)
def check_merge_states(merge) -> str:
    generator = torch.Generator().manual_seed(12)
    R, S, Dv = 5, 12, 3
    scores = torch.randn(R, S, generator=generator, dtype=torch.float64) * 3  # (R, S): one row per query
    scores[1, 9] = 14.0  # row 1's largest score is in the second part
    scores[2] -= 1000.0  # row 2 lives far below the others: a maximum over all rows underflows it
    scores[3, :7] = float("-inf")  # row 3 sees nothing in the first part (masked), only in the second
    scores[4] = float("-inf")  # row 4 sees nothing at all
    values = torch.randn(S, Dv, generator=generator, dtype=torch.float64)  # (S, Dv)
    live = torch.tensor([True, True, True, True, False])  # rows with at least one key
    exact = torch.softmax(scores[:4], dim=-1) @ values  # (4, Dv): attention over all S keys
    lse = torch.logsumexp(scores[:4], dim=-1)  # (4,): what m + log(l) must be
    for split in (7, 3, 0):
        a, b = _state(scores[:, :split], values[:split]), _state(scores[:, split:], values[split:])
        what = f"merge(state_a, state_b) with keys 0..{split - 1} in state_a and {split}..{S - 1} in state_b"
        got = _triple(call(merge, tuple(t.clone() for t in a), tuple(t.clone() for t in b)), what)
        m = expect_tensor(got[0], what=f"{what}: m", shape=(R,)).detach().double()
        l = expect_tensor(got[1], what=f"{what}: l", shape=(R,)).detach().double()
        acc = expect_tensor(got[2], what=f"{what}: acc", shape=(R, Dv)).detach().double()
        output = acc[live] / l[live, None]  # (4, Dv)
        if bool(torch.isnan(output[2]).any() | (l[2] == 0)) and not bool(torch.isnan(output[:2]).any()):
            raise Mismatch(f"{what}: row 2, whose scores are all near -1000, lost its whole sum (l = 0 or NaN). "
                           "Did you take one maximum over all rows (global) instead of one per row? Each query "
                           "keeps its own m: torch.maximum(m_a, m_b), elementwise.")
        if split > 0:
            plain = (a[2] + b[2])[:4] / (a[1] + b[1])[:4, None]
            if torch.allclose(output, plain, atol=1e-6) and not torch.allclose(plain, exact, atol=1e-6):
                raise Mismatch(f"{what}: you added the two sums and accumulators as they are; each is relative to its "
                               "own maximum, so rescale each by exp(its maximum - the merged maximum) first.")
            mean = (a[2][:3] / a[1][:3, None] + b[2][:3] / b[1][:3, None]) / 2
            if torch.allclose(output[:3], mean, atol=1e-6):
                raise Mismatch(f"{what}: your output is the mean of the two partial outputs. Each part deserves a "
                               "weight proportional to its share of the softmax mass, l · exp(m), not one half.")
            scale_a = torch.exp(a[0] - torch.maximum(a[0], b[0]))[:3]
            scale_b = torch.exp(b[0] - torch.maximum(a[0], b[0]))[:3]
            only_l = (a[2][:3] + b[2][:3]) / (a[1][:3] * scale_a + b[1][:3] * scale_b)[:, None]
            if torch.allclose(output[:3], only_l, atol=1e-6) and not torch.allclose(only_l, exact[:3], atol=1e-6):
                raise Mismatch(f"{what}: you rescaled the sums l but not the accumulators acc; both must be multiplied "
                               "by exp(m_part - m).")
        if not bool(torch.isfinite(l).all() and torch.isfinite(acc).all()):
            raise Mismatch(f"{what}: your l or acc holds NaN or inf in row(s) "
                           f"{(~(torch.isfinite(l) & torch.isfinite(acc).all(-1))).nonzero().flatten().tolist()}. "
                           "Where both maxima are -inf (a query that has seen no key), exp(-inf - (-inf)) is NaN: use 0 "
                           "in place of an infinite maximum in the exponent, and keep l = 0, acc = 0 for such a row.")
        expect_close(output, exact, what=f"{what}: the output acc / l of the rows that see a key")
        expect_close(m[live] + torch.log(l[live]), lse,
                     what=f"{what}: m + log(l), which must be the log of the whole softmax denominator")
        expect(bool((l[4] == 0) and (acc[4] == 0).all()),
               f"{what}: row 4 has seen no key on either side; its merged state must keep l = 0 and acc = 0, got "
               f"l = {float(l[4]):g}")
    return ("two partial states merge exactly: attention over a long cache can be split among workers and "
            "combined at the end (the idea of Flash-Decoding), and FlashAttention's loop is this merge, one block at a time.")


@exercise(
    "Exercise 3, how big is a KV cache?",
    hint="two tensors (keys and values) per layer, each of batch_size * num_heads * seq_len * head_dim numbers, "
    "each number bytes_per_number bytes. For the question: 64 GiB is 64 * 2**30 bytes; divide it by the bytes "
    "that one token of GPT-2 small's cache takes",
)
def check_kv_cache_bytes(kv_cache_bytes, gpt2_tokens_in_64_gib=None) -> str:
    cases = [  # (num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number)
        (3, 4, 16, 100, 5, 4),  # every factor different, so that each mistake has its own number
        (12, 12, 64, 1024, 1, 2),  # GPT-2 small, float16
        (32, 32, 128, 4096, 8, 2),  # a 7B-parameter model with multi-head attention, float16
    ]
    for case in cases:
        num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number = case
        expected = 2 * num_layers * batch_size * num_heads * seq_len * head_dim * bytes_per_number
        got = call(kv_cache_bytes, num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number)
        what = (f"kv_cache_bytes(num_layers={num_layers}, num_heads={num_heads}, head_dim={head_dim}, seq_len={seq_len}, "
                f"batch_size={batch_size}, bytes_per_number={bytes_per_number})")
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        expect(isinstance(got, (int, float)) and not isinstance(got, bool), f"{what}: return a number, got {type(got).__name__}")
        if got == expected / 2:
            raise Mismatch(f"{what} = {got:,}, exactly half the answer: the cache stores keys *and* values")
        if num_layers > 1 and got == expected / num_layers:
            raise Mismatch(f"{what} = {got:,}: that is one layer; every layer keeps its own keys and values")
        if batch_size > 1 and got == expected / batch_size:
            raise Mismatch(f"{what} = {got:,}: that is one sequence; each of the batch_size sequences has its own cache")
        if bytes_per_number > 1 and got == expected / bytes_per_number:
            raise Mismatch(f"{what} = {got:,}: that counts numbers, not bytes; multiply by bytes_per_number")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    answer = attempted(gpt2_tokens_in_64_gib)  # the scaffold's `...` counts as not attempted
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    expect(isinstance(answer, (int, float)) and not isinstance(answer, bool),
           f"gpt2_tokens_in_64_gib: expected a number of tokens, got {type(answer).__name__}")
    per_token = 2 * 12 * 12 * 64 * 2  # bytes of GPT-2 small's cache per token, float16
    tokens = 64 * 2**30 / per_token
    if abs(answer - 64e9 / per_token) <= 1:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}: you used 64 GB (10^9 bytes); section 1's 64 GiB "
                       "are 64 * 2**30 bytes")
    if abs(answer - 2 * tokens) <= 1:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}, twice the answer: a token stores a key *and* a value")
    if abs(answer - tokens * 12) <= 12 or abs(answer - tokens / 12) <= 1:
        raise Mismatch(f"gpt2_tokens_in_64_gib = {answer:,.0f}: count all 12 layers, each with its own cache, once")
    expect(abs(answer - tokens) <= 1,
           f"gpt2_tokens_in_64_gib = {answer:,.0f}: divide 64 GiB by the bytes one token of GPT-2 small's cache takes "
           "(kv_cache_bytes with seq_len=1 and batch_size=1)")
    big = 2 * 32 * 8 * 32 * 4096 * 128 * 2
    return (f"right: the memory of one layer's weights for one 32k-token sequence would hold GPT-2 small's cache "
            f"for millions of tokens. And a 7B-size model with batch 8 and 4096 tokens needs {big / 2**30:.0f} GiB "
            "for its cache alone.")


def _cache_reference(query, key, value, cache_keys, cache_values, length, mask="bottom_right", whole=False,
                     scale=None):
    """The right step (or one of its plausible wrong variants) on copies of the buffers: write, then attend."""
    T = query.size(2)
    keys, values = cache_keys.clone(), cache_values.clone()
    keys[:, :, length:length + T], values[:, :, length:length + T] = key, value
    S = keys.size(2) if whole else length + T
    keys, values = keys[:, :, :S], values[:, :, :S]  # (B, H, S, D)
    if mask == "inverted":  # the other convention: True = blocked
        allowed = ~causal_mask(T, S, align="bottom_right")
    else:
        allowed = None if mask is None else causal_mask(T, S, align=mask)  # (T, S), True = may attend
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, scale=scale)  # (B, H, T, D)


_CACHE_MISTAKES = (
    ("whole buffer", "you attended to all max_len slots of the buffers, the empty ones too; take only the first "
                     "length + T positions"),
    ("whole buffer, masked", "you attended to all max_len slots of the buffers, the empty ones too; take only the "
                             "first length + T positions"),
    ("no mask", "the new tokens of a chunk see each other's future: with T > 1 new tokens, query i (token "
                "length + i) may attend only to keys 0 .. length + i, a causal mask aligned to the bottom-right corner"),
    ("top left", "your causal mask is aligned to the top-left corner, so query i sees only keys 0 .. i. The new "
                 "queries are the *last* T of the length + T tokens: use align='bottom_right'"),
    ("no scale", "the scores are not divided by sqrt(D)"),
    ("inverted", "your mask blocks the past and allows the future: ac.causal_mask is True where attending is "
                 "*allowed* (the convention of F.scaled_dot_product_attention too); did you use it the other way round?"),
)


@exercise(
    "Exercise 4, the key/value cache update",
    hint="write key and value into cache_keys[:, :, length:length + T] and cache_values[...] (in place), take the "
    "first length + T positions of the buffers as keys and values, and attend with a causal mask aligned to the "
    "bottom-right corner: query i is token length + i",
)
def check_cache_attention_step(cache_attention_step) -> str:
    generator = torch.Generator().manual_seed(21)
    B, H, D, max_len = 2, 3, 8, 16
    q, k, v = (torch.randn(B, H, 12, D, generator=generator, dtype=torch.float64) for _ in range(3))  # 12 tokens
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, 12, D): every token from scratch
    cache_keys = torch.zeros(B, H, max_len, D, dtype=torch.float64)  # (B, H, max_len, D): nothing stored yet
    cache_values = torch.zeros(B, H, max_len, D, dtype=torch.float64)
    for start, end in ((0, 5), (5, 6), (6, 9), (9, 12)):  # a prompt of 5 tokens, one token, then chunks of 3
        T = end - start
        what = f"cache_attention_step(...) for tokens {start}..{end - 1} with length={start}"
        before_keys, before_values = cache_keys.clone(), cache_values.clone()
        new = [t[:, :, start:end].clone() for t in (q, k, v)]
        got = call(cache_attention_step, *new, mutable(cache_keys), mutable(cache_values), start)  # written in place
        got = expect_tensor(got, what=what, shape=(B, H, T, D)).detach().double()
        if torch.equal(cache_keys, before_keys) and torch.equal(cache_values, before_values):
            raise Mismatch(f"{what}: the cache buffers did not change. Write the new keys and values into "
                           "cache_keys and cache_values in place (cache_keys[:, :, a:b] = key), so that later steps "
                           "find them; torch.cat makes a new tensor and leaves the buffers as they were.")
        if start > 0 and torch.allclose(cache_keys[:, :, :T], k[:, :, start:end]):
            raise Mismatch(f"{what}: you wrote the new keys at position 0, over the first tokens; they go after the "
                           f"{start} stored ones, at positions length .. length + T - 1.")
        if not (torch.allclose(cache_keys[:, :, :end], k[:, :, :end]) and torch.allclose(cache_values[:, :, :end], v[:, :, :end])):
            raise Mismatch(f"{what}: after the step, the first {end} positions of the buffers should hold the keys "
                           f"and values of tokens 0..{end - 1}; they do not (check the slice you write into, and "
                           "that keys go to cache_keys and values to cache_values).")
        if not (torch.equal(cache_keys[:, :, end:], before_keys[:, :, end:])
                and torch.equal(cache_values[:, :, end:], before_values[:, :, end:])):
            raise Mismatch(f"{what}: you wrote beyond position {end - 1}: the slots after the stored tokens must stay "
                           "as they were.")
        if torch.isnan(got).any():
            raise Mismatch(f"{what}: your output holds NaN, which happens when a query has every key blocked. "
                           "ac.causal_mask is True where attending is *allowed*: did you use it the other way round?")
        right = full[:, :, start:end]
        if not torch.allclose(got, right, atol=1e-6):
            for name, message in _CACHE_MISTAKES:
                mask = {"no mask": None, "whole buffer": None, "top left": "top_left", "inverted": "inverted"}.get(
                    name, "bottom_right")
                variant = _cache_reference(*new, before_keys, before_values, start, mask=mask,
                                           whole=name.startswith("whole"), scale=1.0 if name == "no scale" else None)
                if torch.allclose(got, variant, atol=1e-6) and not torch.allclose(variant, right, atol=1e-6):
                    raise Mismatch(f"{what}: {message}.")
        expect_close(got, right, what=f"{what}: the outputs of the new tokens (they must equal causal attention over "
                                      f"all {end} tokens, at positions {start}..{end - 1})")
    return ("your step fills the cache in place and gives the same outputs as attention over the whole sequence, "
            "for a prompt, a single token and chunks: the update of ac.KVCache and the attention of "
            "ac.cached_self_attention.")
