"""Checks for the exercises of chapter 05, multi-head attention."""

from __future__ import annotations

import math

import torch

from ..multihead import MultiHeadAttention
from . import Mismatch, attempted, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_split_heads", "check_merge_heads", "check_count_parameters", "check_cross_attention"]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=1e-5, rtol=1e-4)


@exercise(
    "Exercise 1, split the width into heads",
    hint="x.view(B, T, num_heads, E // num_heads) gives (B, T, H, D); then .transpose(1, 2) gives (B, H, T, D)",
)
def check_split_heads(split_heads) -> str:
    generator = torch.Generator().manual_seed(51)
    B, T, E = 2, 5, 12
    x = torch.randn(B, T, E, generator=generator)
    for H in (3, 4, 1):
        D = E // H
        what = f"split_heads(x, num_heads={H}) for x of shape (B, T, E) = {(B, T, E)}"
        got = call(split_heads, x, H)
        expect_tensor(got, what=what, shape=(B, H, T, D))
        if H > 1 and _same(got, x.view(B, H, T, D)):
            raise Mismatch(
                f"{what}: you viewed x as (B, H, T, D) directly. The shape is right but the numbers are not: "
                "the memory of x is ordered token by token, so that view puts pieces of different tokens into "
                "one head. View as (B, T, H, D) first, then swap the T and H axes."
            )
        if H > 1 and _same(got, x.view(B, T, D, H).permute(0, 3, 1, 2)):
            raise Mismatch(
                f"{what}: your heads take every H-th column (interleaved). Head h must get the contiguous "
                f"columns h*D .. (h+1)*D - 1 of the width, here D = {D}."
            )
        expect_close(got, x.view(B, T, H, D).transpose(1, 2), what=what)
    return "head h of token t holds columns h*D .. (h+1)*D - 1 of token t, for H = 3, 4 and 1."


@exercise(
    "Exercise 2, merge the heads back",
    hint="context.transpose(1, 2) gives (B, T, H, D); .reshape(B, T, H * D) then glues each token's heads together",
)
def check_merge_heads(merge_heads) -> str:
    generator = torch.Generator().manual_seed(52)
    B, H, T, D = 2, 3, 5, 4
    context = torch.randn(B, H, T, D, generator=generator)
    what = f"merge_heads(context) for context of shape (B, H, T, D) = {(B, H, T, D)}"
    got = call(merge_heads, context)
    expect_tensor(got, what=what, shape=(B, T, H * D))
    if _same(got, context.reshape(B, T, H * D)):
        raise Mismatch(
            f"{what}: you reshaped to (B, T, H*D) without moving the head axis first. The shape is right, "
            "but each row now mixes different tokens of one head. Transpose (B, H, T, D) to (B, T, H, D) first."
        )
    expect_close(got, context.transpose(1, 2).reshape(B, T, H * D), what=what)
    x = torch.randn(B, T, H * D, generator=generator)
    round_trip = call(merge_heads, x.view(B, T, H, D).transpose(1, 2))
    expect_close(round_trip, x, what="merge_heads(split(x)), which should give x back")
    return "merging is the exact inverse of splitting: merge_heads(split_heads(x)) == x."


def _parameter_count(embed_dim: int, num_heads: int, bias: bool) -> int:
    return sum(p.numel() for p in MultiHeadAttention(embed_dim, num_heads, bias=bias).parameters())


@exercise(
    "Exercise 3, count the parameters",
    hint="four E x E weight matrices (query, key, value, output), plus four bias vectors of length E when bias=True",
)
def check_count_parameters(count_parameters) -> str:
    cases = [(768, 12, True), (768, 12, False), (512, 8, True), (64, 1, True), (64, 16, False), (6, 3, True)]
    for E, H, bias in cases:
        got = attempted(call(count_parameters, E, H, bias))
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"count_parameters({E}, {H}, {bias}): expected a number, got {type(got).__name__}")
        want = _parameter_count(E, H, bias)
        if got != want:
            message = f"count_parameters(embed_dim={E}, num_heads={H}, bias={bias}): expected {want:,}, got {got:,}."
            if got == 3 * E * E + (3 * E if bias else 0):
                message += " You counted the query, key and value projections but not the output projection."
            elif H > 1 and got == H * want:
                message += " The count does not grow with the number of heads: the H heads share out the width E."
            elif bias and got == 4 * E * E:
                message += " You left out the four bias vectors."
            raise Mismatch(message)
    return "4·E² + 4·E: 2,362,368 for a GPT-2-sized layer (E = 768), whatever the number of heads."


def _by_hand(mha, queries, memory, allowed, q_scale=1.0):
    """Multi-head attention written out (for the wrong-answer diagnoses): allowed is (B, S), True = may attend."""
    B, L, E = queries.shape
    S, H, D = memory.size(1), mha.num_heads, mha.head_dim
    q = (mha.q_proj(queries) * q_scale).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    k = mha.k_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    v = mha.v_proj(memory).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    mask = None if allowed is None else allowed[:, None, None, :]  # (B, 1, 1, S)
    context = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, D)
    return mha.out_proj(context.transpose(1, 2).reshape(B, L, E))  # (B, L, E)


@exercise(
    "Exercise 4, cross-attention with padding",
    hint="queries go through mha.q_proj, memory through k_proj and v_proj; split into (B, H, L, D) and "
    "(B, H, S, D); scores (B, H, L, S) / sqrt(D); block padding with "
    "scores.masked_fill(key_padding_mask[:, None, None, :], float('-inf')); softmax; @ v; merge; mha.out_proj",
)
def check_cross_attention(cross_attention) -> str:
    B, L, S, E, H = 2, 3, 5, 12, 3
    with torch.random.fork_rng(devices=[]):  # leaves the notebook's random state as it was
        torch.manual_seed(54)
        mha = MultiHeadAttention(E, H).eval()
        queries, memory = torch.randn(B, L, E), torch.randn(B, S, E)
        lengths = torch.tensor([3, 4])
        key_padding_mask = torch.arange(S)[None, :] >= lengths[:, None]  # (B, S), True = padding
        what = (f"cross_attention(queries, memory, mha, key_padding_mask) for queries (B, L, E) = {(B, L, E)}, "
                f"memory (B, S, E) = {(B, S, E)} and {H} heads")
        got = call(cross_attention, queries, memory, mha, key_padding_mask.clone())
    if isinstance(got, tuple):
        got = got[0]
    expect_tensor(got, what=what, shape=(B, L, E))
    with torch.no_grad():
        expected, _ = mha(queries, memory, memory, key_padding_mask=key_padding_mask)
        no_mask = _by_hand(mha, queries, memory, None)
        inverted = _by_hand(mha, queries, memory, key_padding_mask)
        scaled_by_e = _by_hand(mha, queries, memory, ~key_padding_mask, q_scale=math.sqrt((E // H) / E))
    if _same(got, no_mask):
        raise Mismatch(f"{what}: the padding mask had no effect: the queries still attend to the padding keys.")
    if _same(got, inverted):
        raise Mismatch(f"{what}: you attended only to the padding. key_padding_mask is True at the padding "
                       "(nn.MultiheadAttention's convention): block where it is True.")
    if _same(got, scaled_by_e):
        raise Mismatch(f"{what}: you divided the scores by sqrt(E) = {math.sqrt(E):.2f}; each head's dot product runs "
                       f"over its own width D = {E // H}, so divide by sqrt(D) = {math.sqrt(E // H):.2f}.")
    expect_close(got, expected, what=what)
    return "your cross-attention matches ac.MultiHeadAttention(queries, memory, memory, key_padding_mask=...)."
