"""Checks for the exercises of chapter 08, efficient attention."""

from __future__ import annotations

import math

import torch

from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_online_softmax_update", "check_attention_row_online", "check_kv_cache_bytes"]


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


@exercise(
    "Exercise 3, how big is a KV cache?",
    hint="two tensors (keys and values) per layer, each of batch_size * num_heads * seq_len * head_dim numbers, "
    "each number bytes_per_number bytes",
)
def check_kv_cache_bytes(kv_cache_bytes) -> str:
    cases = [  # (num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number)
        (12, 12, 64, 1024, 1, 2),  # GPT-2 small, float16
        (2, 4, 16, 100, 3, 4),
        (32, 32, 128, 4096, 8, 2),  # a 7B-parameter model with multi-head attention, float16
    ]
    for case in cases:
        num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number = case
        expected = 2 * num_layers * batch_size * num_heads * seq_len * head_dim * bytes_per_number
        got = call(kv_cache_bytes, num_layers, num_heads, head_dim, seq_len, batch_size, bytes_per_number)
        what = (f"kv_cache_bytes(num_layers={num_layers}, num_heads={num_heads}, head_dim={head_dim}, seq_len={seq_len}, "
                f"batch_size={batch_size}, bytes_per_number={bytes_per_number})")
        expect(isinstance(got, (int, float)) and not isinstance(got, bool), f"{what}: return a number, got {type(got).__name__}")
        if got == expected / 2:
            raise Mismatch(f"{what} = {got}, exactly half the answer: the cache stores keys *and* values")
        expect(got == expected, f"{what}: expected {expected:,} bytes, got {got:,}")
    big = 2 * 32 * 8 * 32 * 4096 * 128 * 2
    return f"right. The last case, a 7B-size model with batch 8 and 4096 tokens, needs {big / 2**30:.0f} GiB for its cache alone."
