"""Checks for the exercises of chapter 05, multi-head attention."""

from __future__ import annotations

import math

import torch

from ..multihead import MultiHeadAttention
from . import Mismatch, attempted, call, exercise, expect, expect_close, expect_tensor

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_split_fused_qkv",
    "check_count_parameters",
    "check_cross_attention",
]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=1e-5, rtol=1e-4)


@exercise(
    "Exercise 1a, split the width into heads",
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
    "Exercise 1b, merge the heads back",
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


def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, E = x.shape
    return x.view(B, T, H, E // H).transpose(1, 2)  # (B, T, E) -> (B, T, H, D) -> (B, H, T, D)


@exercise(
    "Exercise 2, split a fused query-key-value projection",
    hint="the last axis of qkv is [all queries | all keys | all values], E numbers each: "
    "q, k, v = qkv.split(E, dim=-1), then split each into heads with view(B, T, H, D).transpose(1, 2)",
)
def check_split_fused_qkv(split_fused_qkv) -> str:
    generator = torch.Generator().manual_seed(55)
    B, T, E = 2, 5, 12
    qkv = torch.randn(B, T, 3 * E, generator=generator)
    for H in (3, 4, 1):
        D = E // H
        what = f"split_fused_qkv(qkv, num_heads={H}) for qkv of shape (B, T, 3E) = {(B, T, 3 * E)}"
        got = call(split_fused_qkv, qkv.clone(), H)
        expect(isinstance(got, (tuple, list)) and len(got) == 3,
               f"{what}: expected three tensors (q, k, v), got {type(got).__name__}"
               + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""))
        for name, tensor in zip("qkv", got):
            expect_tensor(tensor, what=f"{what}, {name}", shape=(B, H, T, D))
        thirds = [part.contiguous() for part in qkv.split(E, dim=-1)]  # the right layout: [queries | keys | values]
        want = [_heads(part, H) for part in thirds]
        if all(_same(g, w) for g, w in zip(got, want)):
            continue
        if {i for i, g in enumerate(got) for j, w in enumerate(want) if _same(g, w)} == {0, 1, 2}:
            order = ", ".join("qkv"[j] for g in got for j, w in enumerate(want) if _same(g, w))
            raise Mismatch(f"{what}: you return the right three tensors in the wrong order ({order}). "
                           "The fused projection puts the queries first, then the keys, then the values.")
        per_head = qkv.view(B, T, H, 3 * D).transpose(1, 2).split(D, dim=-1)  # [q_h | k_h | v_h] per head
        if H > 1 and all(_same(g, w) for g, w in zip(got, per_head)):
            raise Mismatch(
                f"{what}: you read the last axis as H blocks of [q_h | k_h | v_h] (each head's query, key and "
                "value side by side, the layout of some other codebases). Here, as in nn.MultiheadAttention's "
                "in_proj_weight and GPT-2's c_attn, it is [all queries | all keys | all values]: split it into "
                "three blocks of E first, then split each into heads."
            )
        if H > 1 and all(_same(g, part.view(B, H, T, D)) for g, part in zip(got, thirds)):
            raise Mismatch(
                f"{what}: you split q, k and v right, then viewed each as (B, H, T, D) directly: the right shape "
                "with pieces of different tokens in one head. View as (B, T, H, D) first, then transpose."
            )
        if H > 1 and all(_same(g, part.view(B, T, D, H).permute(0, 3, 1, 2)) for g, part in zip(got, thirds)):
            raise Mismatch(f"{what}: your heads take every H-th column (interleaved); head h must get the "
                           f"contiguous columns h*D .. (h+1)*D - 1 of its block, here D = {D}.")
        for name, g, w in zip("qkv", got, want):
            expect_close(g, w, what=f"{what}, {name}")
    return ("q, k and v each come out as (B, H, T, D), from the [queries | keys | values] layout of "
            "nn.MultiheadAttention's in_proj_weight and GPT-2's c_attn, for H = 3, 4 and 1.")


def _parameter_count(embed_dim: int, num_heads: int, bias: bool, qk_head_dim: int | None = None) -> int:
    module = MultiHeadAttention(embed_dim, num_heads, bias=bias, qk_head_dim=qk_head_dim)
    return sum(p.numel() for p in module.parameters())


def _count(E: int, H: int, bias: bool, qk: int, v: int, out: int) -> int:
    """Parameters of projections to widths qk (query and key), v (value) and of an output projection
    from width out: a helper for naming wrong answers."""
    weights = E * qk * 2 + E * v + out * E
    return weights + ((2 * qk + v + E) if bias else 0)


@exercise(
    "Exercise 3, count the parameters when d_k differs",
    hint="queries and keys: (E, H * qk_head_dim) each; values: (E, E); output: (E, E); with bias=True one bias "
    "per output column of each projection. qk_head_dim=None means E // num_heads.",
)
def check_count_parameters(count_parameters) -> str:
    cases = [(768, 12, True, None), (768, 12, False, None), (512, 8, False, 16), (512, 8, True, 32),
             (64, 1, True, None), (64, 16, False, None), (32, 4, True, 2), (12, 3, True, 8), (6, 3, True, None)]
    for E, H, bias, qk_head_dim in cases:
        call_text = f"count_parameters(embed_dim={E}, num_heads={H}, bias={bias}, qk_head_dim={qk_head_dim})"
        got = attempted(call(count_parameters, E, H, bias, qk_head_dim))
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        expect(isinstance(got, (int, float)) and not isinstance(got, bool),
               f"{call_text}: expected a number, got {type(got).__name__}")
        want = _parameter_count(E, H, bias, qk_head_dim)
        if got == want:
            continue
        dk = E // H if qk_head_dim is None else qk_head_dim
        message = f"{call_text}: expected {want:,}, got {got:,}."
        if qk_head_dim is not None and got == _parameter_count(E, H, bias):
            message += (" You left qk_head_dim out: with it the query and key projections become (E, H * qk_head_dim),"
                        " smaller or larger than (E, E).")
        elif got == _count(E, H, bias, H * dk, H * dk, H * dk):
            message += (" You narrowed the values and the output projection too; only queries and keys take "
                        "qk_head_dim. The values keep width D = E / H (the paper's d_v), so the output is still E wide.")
        elif got == _count(E, H, bias, H * dk, H * dk, E):
            message += " You narrowed the values too; only queries and keys take qk_head_dim (d_v stays E / H)."
        elif H > 1 and got == _count(E, H, bias, dk, E, E):
            message += (" qk_head_dim is the width of one head's queries and keys: the projection is "
                        "(E, num_heads * qk_head_dim), not (E, qk_head_dim).")
        elif got == _count(E, H, bias, H * dk, E, E) - (E * E + (E if bias else 0)):
            message += " You counted the query, key and value projections but not the output projection."
        elif H > 1 and got == H * want:
            message += " The count does not grow with the number of heads: the H heads share out the width."
        elif bias and got == _parameter_count(E, H, False, qk_head_dim):
            message += " You left out the four bias vectors."
        elif not bias and got == _parameter_count(E, H, True, qk_head_dim):
            message += " With bias=False the projections have no biases: count only the weights."
        elif bias and qk_head_dim is not None and got == _count(E, H, False, H * dk, E, E) + 4 * E:
            message += " The query and key biases have H * qk_head_dim entries each, not E."
        raise Mismatch(message)
    return ("2·E·H·d_k + 2·E² (+ 2·H·d_k + 2·E biases): 2,362,368 for a GPT-2-sized layer whatever the number of "
            "heads, and fewer when the keys are narrower, as in Table 3 rows (B).")


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
