"""The exercise checks of chapter 11: for each exercise, right answers written several ways and the table of
wrong answers students plausibly write, each rejected with a message that names the mistake."""

import ast
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import attn_course as ac
from attn_course.exercises.ch11 import check_absorbed_scores, check_cache_per_token, check_merged_output

CHECKS = [check_cache_per_token, check_absorbed_scores, check_merged_output]


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: the cache per token ----------------------------------------------------------------

def cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    return 2 * num_heads * head_dim * num_layers, (kv_latent_dim + rope_head_dim) * num_layers, \
        (kv_latent_dim + rope_head_dim) / (2 * head_dim)


def cache_numpy_and_fraction(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):  # other types, right
    per_layer = np.array([2 * num_heads * head_dim, kv_latent_dim + rope_head_dim])
    mha, mla = per_layer * num_layers
    return [mha, mla, Fraction(kv_latent_dim + rope_head_dim, 2 * head_dim)]


def cache_tensors(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):  # one-element tensors, right
    mla = torch.tensor(kv_latent_dim + rope_head_dim) * num_layers
    return torch.tensor(2 * num_heads * head_dim * num_layers), mla, torch.tensor((kv_latent_dim + rope_head_dim) / (2 * head_dim))


def cache_package(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha = ac.cache_elements_per_token("mha", num_heads=num_heads, head_dim=head_dim, num_layers=num_layers)
    mla = ac.cache_elements_per_token("mla", kv_latent_dim=kv_latent_dim, rope_head_dim=rope_head_dim,
                                      num_layers=num_layers)
    return mha, mla, (kv_latent_dim + rope_head_dim) / (2 * head_dim)


def cache_mha_no_values(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    _, mla, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return num_heads * head_dim * num_layers, mla, groups


def cache_one_layer(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    return cache_right(1, num_heads, head_dim, kv_latent_dim, rope_head_dim)


def cache_mla_one_layer(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, _, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, kv_latent_dim + rope_head_dim, groups


def cache_rope_per_head(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, _, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, (kv_latent_dim + num_heads * rope_head_dim) * num_layers, groups


def cache_latent_twice(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, _, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, 2 * (kv_latent_dim + rope_head_dim) * num_layers, groups


def cache_no_rope_key(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, _, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, kv_latent_dim * num_layers, groups


def cache_groups_keys_only(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, _ = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla, (kv_latent_dim + rope_head_dim) / head_dim


def cache_groups_fraction(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, _ = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla, mla / mha


def cache_groups_all_layers(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, _ = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla, mla / (2 * head_dim)


def cache_groups_rounded(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla, math.ceil(groups)


def cache_float_elements(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return float(mha), float(mla), groups


def cache_from_groups(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):  # right: floats, whole numbers
    groups = (kv_latent_dim + rope_head_dim) / (2 * head_dim)
    return num_heads * 2 * head_dim * num_layers * 1.0, groups * 2 * head_dim * num_layers, groups


def cache_not_whole(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, groups = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla + 0.5, groups


def cache_two_values(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim):
    mha, mla, _ = cache_right(num_layers, num_heads, head_dim, kv_latent_dim, rope_head_dim)
    return mha, mla


# --- Exercise 2: absorbed scores ---------------------------------------------------------------------

def scores_right(q_content, q_rope, w_uk, latents, rope_keys):
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    q_latent = torch.einsum("bhld,hdc->bhlc", q_content, w_uk.view(H, D, Dc))  # (B, H, L, Dc)
    content = q_latent @ latents[:, None].transpose(-2, -1)  # (B, H, L, S)
    rotary = q_rope @ rope_keys[:, None].transpose(-2, -1)  # (B, H, L, S)
    return (content + rotary) / math.sqrt(D + q_rope.size(-1))


def scores_joint_key(q_content, q_rope, w_uk, latents, rope_keys):  # the package's way: one joint key per token, right
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    q_latent = (q_content.unsqueeze(-2) @ w_uk.view(H, 1, D, Dc)).squeeze(-2)  # (B, H, L, 1, D) @ (H, 1, D, Dc)
    queries = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, L, Dc + Dr)
    keys = torch.cat([latents, rope_keys], dim=-1)  # (B, S, Dc + Dr)
    return torch.einsum("bhlk,bsk->bhls", queries, keys) * (D + q_rope.size(-1)) ** -0.5


def scores_loop(q_content, q_rope, w_uk, latents, rope_keys):  # head by head, right
    B, H, L, D = q_content.shape
    out = []
    for h in range(H):
        block = w_uk[h * D:(h + 1) * D]  # (D, Dc)
        q_latent = q_content[:, h] @ block  # (B, L, Dc)
        out.append(q_latent @ latents.transpose(1, 2) + q_rope[:, h] @ rope_keys.transpose(1, 2))
    return torch.stack(out, dim=1) / math.sqrt(D + q_rope.size(-1))


def scores_naive(q_content, q_rope, w_uk, latents, rope_keys):  # right numbers, but the keys are built
    B, H, L, D = q_content.shape
    S = latents.size(1)
    keys = (latents @ w_uk.T).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    return (q_content @ keys.transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_naive_per_head(q_content, q_rope, w_uk, latents, rope_keys):  # keys built one head at a time
    B, H, L, D = q_content.shape
    out = []
    for h in range(H):
        keys = latents @ w_uk[h * D:(h + 1) * D].T  # (B, S, D)
        out.append(q_content[:, h] @ keys.transpose(1, 2) + q_rope[:, h] @ rope_keys.transpose(1, 2))
    return torch.stack(out, dim=1) / math.sqrt(D + q_rope.size(-1))


def scores_scale_d(q_content, q_rope, w_uk, latents, rope_keys):
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys) * math.sqrt(
        q_content.size(-1) + q_rope.size(-1)) / math.sqrt(q_content.size(-1))


def scores_unscaled(q_content, q_rope, w_uk, latents, rope_keys):
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys) * math.sqrt(q_content.size(-1) + q_rope.size(-1))


def scores_no_rope(q_content, q_rope, w_uk, latents, rope_keys):
    B, H, L, D = q_content.shape
    q_latent = torch.einsum("bhld,hdc->bhlc", q_content, w_uk.view(H, D, latents.size(-1)))
    return q_latent @ latents[:, None].transpose(-2, -1) / math.sqrt(D + q_rope.size(-1))


def scores_wrong_split(q_content, q_rope, w_uk, latents, rope_keys):
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    blocks = w_uk.view(D, H, Dc).transpose(0, 1)  # head h takes rows h, h + H, ...
    q_latent = torch.einsum("bhld,hdc->bhlc", q_content, blocks)
    return (q_latent @ latents[:, None].transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))


def scores_reshaped_wrong(q_content, q_rope, w_uk, latents, rope_keys):
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    blocks = w_uk.reshape(H, Dc, D).transpose(1, 2)  # reads the (H*D, Dc) numbers as (H, Dc, D)
    q_latent = torch.einsum("bhld,hdc->bhlc", q_content, blocks)
    return (q_latent @ latents[:, None].transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))


def scores_transposed_first(q_content, q_rope, w_uk, latents, rope_keys):  # right: W_UK^T viewed as (Dc, H, D)
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    w_t = w_uk.T.reshape(Dc, H, D)  # (Dc, H, D): W_UK,h^T for every head
    q_latent = torch.einsum("bhld,chd->bhlc", q_content, w_t)
    return (q_latent @ latents[:, None].transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))


def scores_heads_summed(q_content, q_rope, w_uk, latents, rope_keys):
    """W_UK applied to the heads' queries side by side: the heads' content scores added together."""
    B, H, L, D = q_content.shape
    q_flat = q_content.transpose(1, 2).reshape(B, L, H * D)  # (B, L, H*D)
    q_latent = q_flat @ w_uk  # (B, L, Dc): sums over the heads
    content = (q_latent @ latents.transpose(1, 2))[:, None]  # (B, 1, L, S)
    rotary = (q_rope @ rope_keys[:, None].transpose(-2, -1)).sum(dim=1, keepdim=True)
    return ((content + rotary) / math.sqrt(D + q_rope.size(-1))).expand(B, H, L, -1)


def scores_naive_in_chunks(q_content, q_rope, w_uk, latents, rope_keys):
    """Keys rebuilt ten cached tokens at a time: no tensor is large, but the cache is up-projected all the same."""
    B, H, L, D = q_content.shape
    S = latents.size(1)
    pieces = []
    for start in range(0, S, 10):
        keys = (latents[:, start:start + 10] @ w_uk.T).view(B, -1, H, D).transpose(1, 2)  # (B, H, 10, D)
        pieces.append(q_content @ keys.transpose(-2, -1))
    rotary = q_rope @ rope_keys[:, None].transpose(-2, -1)
    return (torch.cat(pieces, dim=-1) + rotary) / math.sqrt(D + q_rope.size(-1))


def scores_elementwise(q_content, q_rope, w_uk, latents, rope_keys):  # right, absorbed with broadcasting and sums
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    q_latent = (q_content[..., :, None] * w_uk.view(H, 1, D, Dc)).sum(dim=-2)  # (B, H, L, Dc)
    content = (q_latent[..., None, :] * latents[:, None, None]).sum(dim=-1)  # (B, H, L, S)
    rotary = (q_rope[..., None, :] * rope_keys[:, None, None]).sum(dim=-1)
    return (content + rotary) / math.sqrt(D + q_rope.size(-1))


def scores_keys_per_token_elementwise(q_content, q_rope, w_uk, latents, rope_keys):
    """The review's answer: every head's key of one cached token at a time, rebuilt with * and .sum (no matmul)."""
    B, H, L, D = q_content.shape
    w = w_uk.view(H, D, -1)
    cols = []
    for s in range(latents.size(1)):
        k = (w[None] * latents[:, s, None, None, :]).sum(-1)  # (B, H, D): token s's keys, every head
        cols.append((q_content * k[:, :, None, :]).sum(-1))  # (B, H, L)
    content = torch.stack(cols, dim=-1)  # (B, H, L, S)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_by_prod(q_content, q_rope, w_uk, latents, rope_keys):
    """The ninth review's answer: each cached token's keys rebuilt in every head, the products by stack().prod(0)."""
    B, H, L, D = q_content.shape
    w = w_uk.view(H, D, -1)
    cols = []
    for s in range(latents.size(1)):
        k = torch.stack(torch.broadcast_tensors(latents[:, s, None, None, :], w[None]), 0).prod(0).sum(-1)  # (B, H, D)
        cols.append(torch.stack(torch.broadcast_tensors(q_content, k[:, :, None, :]), 0).prod(0).sum(-1))  # (B, H, L)
    content = torch.stack(cols, dim=-1)  # (B, H, L, S)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_by_squares(q_content, q_rope, w_uk, latents, rope_keys):
    """The same with the products by the polarization identity ab = ((a + b)^2 - (a - b)^2) / 4."""
    B, H, L, D = q_content.shape
    w = w_uk.view(H, D, -1)

    def product(a, b):
        return ((a + b) ** 2 - (a - b) ** 2) / 4

    cols = []
    for s in range(latents.size(1)):
        k = product(latents[:, s, None, None, :], w[None]).sum(-1)  # (B, H, D): token s's keys, every head
        cols.append(product(q_content, k[:, :, None, :]).sum(-1))  # (B, H, L)
    content = torch.stack(cols, dim=-1)  # (B, H, L, S)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_naive_when_narrow_heads(q_content, q_rope, w_uk, latents, rope_keys):
    """The twelfth review's answer: keys rebuilt whenever a head is no wider than the latent (DeepSeek-V2's
    proportion, d_c = 4 d_h), the absorbed form otherwise."""
    if q_content.size(-1) <= latents.size(-1):
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_naive_when_many_heads(q_content, q_rope, w_uk, latents, rope_keys):
    """The thirteenth review's answer: keys rebuilt only when there are more than two heads."""
    if q_content.size(1) > 2:
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_naive_in_float64(q_content, q_rope, w_uk, latents, rope_keys):
    """The thirteenth review's answer: keys rebuilt only for float64 inputs."""
    if q_content.dtype == torch.float64:
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_triple_loop(q_content, q_rope, w_uk, latents, rope_keys):
    """Keys built one batch, head and token at a time with * and .sum, into a buffer on the inputs' device."""
    B, H, L, D = q_content.shape
    S = latents.size(1)
    scores = q_content.new_zeros(B, H, L, S)
    for b in range(B):
        for h in range(H):
            w = w_uk[h * D:(h + 1) * D]  # (D, Dc)
            for s in range(S):
                key = (w * latents[b, s]).sum(-1)  # (D,): head h's key of token s
                scores[b, h, :, s] = (q_content[b, h] * key).sum(-1) + (q_rope[b, h] * rope_keys[b, s]).sum(-1)
    return scores / math.sqrt(D + q_rope.size(-1))


def scores_cpu_buffer(q_content, q_rope, w_uk, latents, rope_keys):  # right numbers on the CPU, a CPU buffer
    B, H, L, D = q_content.shape
    out = torch.zeros(B, H, L, latents.size(1), dtype=q_content.dtype)
    out += scores_right(q_content, q_rope, w_uk, latents, rope_keys)
    return out


def scores_softmaxed(q_content, q_rope, w_uk, latents, rope_keys):  # weights, not scores
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys).softmax(dim=-1)


def scores_in_place(q_content, q_rope, w_uk, latents, rope_keys):
    q_content /= math.sqrt(q_content.size(-1) + q_rope.size(-1))  # scales the caller's queries
    B, H, L, D = q_content.shape
    q_latent = torch.einsum("bhld,hdc->bhlc", q_content, w_uk.view(H, D, latents.size(-1)))
    return q_latent @ latents[:, None].transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1) / math.sqrt(
        D + q_rope.size(-1))


def scores_package(q_content, q_rope, w_uk, latents, rope_keys):
    B, H, L, D = q_content.shape
    module = ac.MultiHeadLatentAttention(8, H, D, latents.size(-1), rope_head_dim=q_rope.size(-1) or 0)
    module.forward(torch.zeros(1, 1, 8))
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_float32(q_content, q_rope, w_uk, latents, rope_keys):  # a float32 result of float64 inputs: the policy passes it
    return scores_right(q_content.float(), q_rope.float(), w_uk.float(), latents.float(), rope_keys.float())


def scores_float16(q_content, q_rope, w_uk, latents, rope_keys):  # half precision of full-precision inputs
    return scores_right(q_content.half().float(), q_rope.half().float(), w_uk.half().float(), latents.half().float(),
                        rope_keys.half().float()).half()


def scores_numpy_keys(q_content, q_rope, w_uk, latents, rope_keys):
    """The fourth review's answer: every head's keys built in numpy, out of sight of the size and work watch (on a
    GPU machine the CPU copy round trip runs, so only leaving torch can name it)."""
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    keys = np.einsum("hdc,bsc->bhsd", w_uk.detach().cpu().numpy().reshape(H, D, Dc), latents.detach().cpu().numpy())
    content = np.einsum("bhld,bhsd->bhls", q_content.detach().cpu().numpy(), keys)
    content = torch.from_numpy(content).to(dtype=q_content.dtype, device=q_content.device)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_numpy_implicit(q_content, q_rope, w_uk, latents, rope_keys):
    """The same, handing the tensors to numpy directly (np.asarray goes through Tensor.__array__)."""
    B, H, L, D = q_content.shape
    keys = np.einsum("hdc,bsc->bhsd", np.asarray(w_uk).reshape(H, D, -1), np.asarray(latents))
    content = torch.tensor(np.einsum("bhld,bhsd->bhls", np.asarray(q_content), keys), dtype=q_content.dtype)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_tolist_keys(q_content, q_rope, w_uk, latents, rope_keys):
    """Keys built from Python lists."""
    B, H, L, D = q_content.shape
    rows, lat = w_uk.tolist(), latents.tolist()
    keys = torch.tensor([[[[sum(r * c for r, c in zip(rows[h * D + d], lat[b][s])) for d in range(D)]
                           for s in range(len(lat[b]))] for h in range(H)] for b in range(B)], dtype=q_content.dtype)
    return (q_content @ keys.transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))


def scores_first_batch_only(q_content, q_rope, w_uk, latents, rope_keys):  # works for B = 1 only
    right = scores_right(q_content, q_rope, w_uk, latents, rope_keys)
    return right[:1].expand_as(right)


# --- Exercise 3: W_UV folded into W_O ------------------------------------------------------------------

def merge_right(w_uv, w_o, num_heads):
    HD, Dc = w_uv.shape
    D = HD // num_heads
    return torch.cat([w_o[:, h * D:(h + 1) * D] @ w_uv[h * D:(h + 1) * D] for h in range(num_heads)], dim=1)


def merge_einsum(w_uv, w_o, num_heads):  # right, another way
    E = w_o.size(0)
    D = w_uv.size(0) // num_heads
    return torch.einsum("ehd,hdc->ehc", w_o.view(E, num_heads, D), w_uv.view(num_heads, D, -1)).reshape(E, -1)


def merge_block_diagonal(w_uv, w_o, num_heads):  # right: W_O @ blockdiag(W_UV,0, ..., W_UV,H-1)
    D = w_uv.size(0) // num_heads
    blocks = torch.block_diag(*[w_uv[h * D:(h + 1) * D] for h in range(num_heads)])  # (H*D, H*Dc)
    return w_o @ blocks


def merge_whole(w_uv, w_o, num_heads):
    return w_o @ w_uv


def merge_transposed(w_uv, w_o, num_heads):
    return merge_right(w_uv, w_o, num_heads).T


def merge_stacked(w_uv, w_o, num_heads):
    D = w_uv.size(0) // num_heads
    return torch.stack([w_o[:, h * D:(h + 1) * D] @ w_uv[h * D:(h + 1) * D] for h in range(num_heads)])


def merge_wrong_split(w_uv, w_o, num_heads):
    E, HD = w_o.shape
    D = HD // num_heads
    uv = w_uv.view(D, num_heads, -1).transpose(0, 1)
    return torch.einsum("ehd,hdc->ehc", w_o.view(E, num_heads, D), uv).reshape(E, -1)


def merge_wo_wrong_split(w_uv, w_o, num_heads):
    E, HD = w_o.shape
    D = HD // num_heads
    o = w_o.view(E, D, num_heads).transpose(1, 2)  # head h takes columns h, h + H, ...
    return torch.einsum("ehd,hdc->ehc", o, w_uv.view(num_heads, D, -1)).reshape(E, -1)


def merge_latent_major(w_uv, w_o, num_heads):
    E = w_o.size(0)
    D = w_uv.size(0) // num_heads
    per_head = torch.einsum("ehd,hdc->ehc", w_o.view(E, num_heads, D), w_uv.view(num_heads, D, -1))  # (E, H, Dc)
    return per_head.transpose(1, 2).reshape(E, -1)  # columns ordered c * H + h


def merge_reversed(w_uv, w_o, num_heads):
    D = w_uv.size(0) // num_heads
    return torch.cat([w_o[:, h * D:(h + 1) * D] @ w_uv[h * D:(h + 1) * D] for h in reversed(range(num_heads))], dim=1)


def merge_wo_rows(w_uv, w_o, num_heads):
    """Head h's block taken from W_O's rows h*D..: runs when E == H * D (the notebook's sizes), and is wrong."""
    D = w_uv.size(0) // num_heads
    return torch.cat([w_o[h * D:(h + 1) * D].T @ w_uv[h * D:(h + 1) * D] for h in range(num_heads)], dim=1)


def merge_reshaped_wrong(w_uv, w_o, num_heads):
    E = w_o.size(0)
    D = w_uv.size(0) // num_heads
    uv = w_uv.reshape(num_heads, -1, D).transpose(1, 2)  # reads the (H*D, Dc) numbers as (H, Dc, D)
    return torch.einsum("ehd,hdc->ehc", w_o.view(E, num_heads, D), uv).reshape(E, -1)


def merge_cpu_buffer(w_uv, w_o, num_heads):  # right numbers on the CPU, a buffer made without device=
    D = w_uv.size(0) // num_heads
    Dc = w_uv.size(1)
    out = torch.empty(w_o.size(0), num_heads * Dc, dtype=w_o.dtype)
    for h in range(num_heads):
        out[:, h * Dc:(h + 1) * Dc] = w_o[:, h * D:(h + 1) * D] @ w_uv[h * D:(h + 1) * D]
    return out


def merge_in_place(w_uv, w_o, num_heads):
    w_o.mul_(1.0)
    w_uv.add_(0.0)
    return merge_right(w_uv.mul_(2.0), w_o, num_heads) / 2


def merge_float32_buffer(w_uv, w_o, num_heads):  # the fourth review's: a float32 buffer filled block by block, right
    D = w_uv.size(0) // num_heads
    Dc = w_uv.size(1)
    out = torch.zeros(w_o.size(0), num_heads * Dc, device=w_o.device)
    for h in range(num_heads):
        out[:, h * Dc:(h + 1) * Dc] = w_o[:, h * D:(h + 1) * D] @ w_uv[h * D:(h + 1) * D]
    return out


def merge_float16(w_uv, w_o, num_heads):  # half precision of full-precision weights
    return merge_right(w_uv, w_o, num_heads).half()


def merge_package(w_uv, w_o, num_heads):
    ac.MultiHeadLatentAttention(4, 1, 2, 2)
    return merge_right(w_uv, w_o, num_heads)


def scores_keys_conv1d_per_coordinate(q_content, q_rope, w_uk, latents, rope_keys):
    """The second review's answer: every head's keys rebuilt one coordinate at a time with F.conv1d (no matmul)."""
    B, H, L, D = q_content.shape
    heads = []
    for h in range(H):
        content = 0
        for d in range(D):
            key_d = torch.nn.functional.conv1d(latents.transpose(1, 2), w_uk[h * D + d:h * D + d + 1, :, None])  # (B, 1, S)
            content = content + q_content[:, h, :, d:d + 1] @ key_d  # (B, L, S)
        heads.append(content)
    return (torch.stack(heads, 1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_addbmm_in_chunks(q_content, q_rope, w_uk, latents, rope_keys):
    """The second review's answer: each head's keys rebuilt ten cached tokens at a time with torch.addbmm."""
    B, H, L, D = q_content.shape
    S = latents.size(1)
    batches = []
    for b in range(B):
        heads = []
        for h in range(H):
            w = w_uk[h * D:(h + 1) * D]
            keys = [torch.addbmm(latents.new_zeros(min(10, S - s0), D), latents[b:b + 1, s0:s0 + 10], w.T[None])
                    for s0 in range(0, S, 10)]
            heads.append(torch.cat([q_content[b, h] @ k.T for k in keys], -1))
        batches.append(torch.stack(heads))
    return (torch.stack(batches) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_addr_in_chunks(q_content, q_rope, w_uk, latents, rope_keys):
    """The fifth review's answer: each head's keys rebuilt a third of the cache at a time, one latent coordinate
    per torch.addr (an outer product), so that no tensor is as large as a head's keys."""
    B, H, L, D = q_content.shape
    S, Dc = latents.shape[1], latents.shape[2]
    out = q_content.new_empty(B, H, L, S)
    step = max(1, S // 3)
    for b in range(B):
        for h in range(H):
            w = w_uk[h * D:(h + 1) * D]  # (D, Dc)
            for s0 in range(0, S, step):
                s1 = min(S, s0 + step)
                keys = q_content.new_zeros(s1 - s0, D)
                for c in range(Dc):
                    keys = torch.addr(keys, latents[b, s0:s1, c], w[:, c])
                out[b, h, :, s0:s1] = q_content[b, h] @ keys.T + q_rope[b, h] @ rope_keys[b, s0:s1].T
    return out / math.sqrt(D + q_rope.size(-1))


def scores_keys_by_division(q_content, q_rope, w_uk, latents, rope_keys):
    """The fifth review's answer: one key per cached token, the product written as a division by the reciprocal."""
    B, H, L, D = q_content.shape
    S = latents.size(1)
    out = q_content.new_empty(B, H, L, S)
    for h in range(H):
        w = w_uk[h * D:(h + 1) * D]  # (D, Dc)
        for j in range(S):
            key = (latents[:, j, None, :] / (1.0 / w)).sum(-1)  # (B, D): the key of token j
            out[:, h, :, j] = (q_content[:, h] @ key[:, :, None])[..., 0] + (q_rope[:, h] @ rope_keys[:, j, :, None])[..., 0]
    return out / math.sqrt(D + q_rope.size(-1))



def scores_naive_for_prefill(q_content, q_rope, w_uk, latents, rope_keys):
    """The sixth review's answer: the absorbed form for one query, the keys built for several (section 4 finds that
    cheaper for prefill): the exercise asks for the absorbed decode path for every L."""
    if q_content.size(2) > 1:
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_naive_when_prefill(q_content, q_rope, w_uk, latents, rope_keys):
    """The seventh review's answer: vLLM's rule, the keys built when the queries are as many as the cached tokens."""
    if q_content.size(2) >= latents.size(1):
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_naive_when_an_eighth(q_content, q_rope, w_uk, latents, rope_keys):
    """The seventh review's answer: the keys built when the queries are at least an eighth of the cached tokens."""
    if 8 * q_content.size(2) >= latents.size(1):
        return scores_naive(q_content, q_rope, w_uk, latents, rope_keys)
    return scores_right(q_content, q_rope, w_uk, latents, rope_keys)


def scores_block_diagonal(q_content, q_rope, w_uk, latents, rope_keys):  # right: every head's block on one diagonal
    B, H, L, D = q_content.shape
    Dc = latents.size(-1)
    blocks = torch.block_diag(*w_uk.split(D))  # (H*D, H*Dc)
    q_latent = (q_content.transpose(1, 2).reshape(B, L, H * D) @ blocks).view(B, L, H, Dc).transpose(1, 2)
    content = q_latent @ latents[:, None].transpose(-2, -1)  # (B, H, L, S)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_scalar_times_column(q_content, q_rope, w_uk, latents, rope_keys):
    """The sixth review's answer: each cached token's keys rebuilt as a sum of latent coordinate times column of W_UK;
    with batch 1 the coordinate is a one-element tensor."""
    B, H, L, D = q_content.shape
    S, Dc = latents.shape[1], latents.shape[2]
    columns = []
    for s in range(S):
        keys = sum(latents[:, s, c, None] * w_uk[:, c] for c in range(Dc)).view(B, H, D)  # token s, every head
        columns.append((q_content @ keys[..., None])[..., 0])  # (B, H, L)
    content = torch.stack(columns, dim=-1)
    return (content + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(D + q_rope.size(-1))


def scores_keys_in_python_numbers(q_content, q_rope, w_uk, latents, rope_keys):
    """The sixth review's answer: the keys built in Python numbers through .item(), out of the watch's sight."""
    B, H, L, D = q_content.shape
    S, Dc = latents.shape[1], latents.shape[2]
    keys = q_content.new_tensor([[[[sum(w_uk[h * D + d, c].item() * latents[b, s, c].item() for c in range(Dc))
                                    for d in range(D)] for s in range(S)] for h in range(H)] for b in range(B)])
    return (q_content @ keys.transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))


def scores_keys_through_float(q_content, q_rope, w_uk, latents, rope_keys):
    """The same through float(t)."""
    B, H, L, D = q_content.shape
    S, Dc = latents.shape[1], latents.shape[2]
    keys = q_content.new_tensor([[[[sum(float(w_uk[h * D + d, c]) * float(latents[b, s, c]) for c in range(Dc))
                                    for d in range(D)] for s in range(S)] for h in range(H)] for b in range(B)])
    return (q_content @ keys.transpose(-2, -1) + q_rope @ rope_keys[:, None].transpose(-2, -1)) / math.sqrt(
        D + q_rope.size(-1))

CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_cache_per_token, cache_right, "correct", "2.25 groups"),
    (check_cache_per_token, cache_numpy_and_fraction, "correct", "2.25 groups"),
    (check_cache_per_token, cache_tensors, "correct", "2.25 groups"),
    (check_cache_per_token, cache_float_elements, "correct", "2.25 groups"),
    (check_cache_per_token, cache_from_groups, "correct", "2.25 groups"),
    (check_cache_per_token, cache_not_whole, "incorrect", "a count of numbers is a whole number"),
    (check_cache_per_token, cache_package, "incorrect", "you called attn_course.cache_elements_per_token"),
    (check_cache_per_token, cache_mha_no_values, "incorrect", "a key *and* a value"),
    (check_cache_per_token, cache_one_layer, "incorrect", "one layer's cache"),
    (check_cache_per_token, cache_mla_one_layer, "incorrect", "one layer's cache"),
    (check_cache_per_token, cache_rope_per_head, "incorrect", "rotary key per head"),
    (check_cache_per_token, cache_latent_twice, "incorrect", "the latent is cached once"),
    (check_cache_per_token, cache_no_rope_key, "incorrect", "leaves out the decoupled rotary key"),
    (check_cache_per_token, cache_groups_keys_only, "incorrect", "a GQA group caches a key and a value"),
    (check_cache_per_token, cache_groups_fraction, "incorrect", "fraction of MHA's cache"),
    (check_cache_per_token, cache_groups_all_layers, "incorrect", "compares all layers"),
    (check_cache_per_token, cache_groups_rounded, "incorrect", "equivalent_groups should be 2.25, got 3"),
    (check_cache_per_token, cache_two_values, "incorrect", "got 2 item(s)"),
    (check_absorbed_scores, scores_right, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_joint_key, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_loop, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_naive, "incorrect", "the up-projection the absorbed form avoids"),
    (check_absorbed_scores, scores_naive_per_head, "incorrect", "the up-projection the absorbed form avoids"),
    (check_absorbed_scores, scores_naive_in_chunks, "incorrect", "never up-projects the cache"),
    (check_absorbed_scores, scores_elementwise, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_keys_per_token_elementwise, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_triple_loop, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_naive_when_many_heads, "incorrect", "one head's keys"),
    (check_absorbed_scores, scores_naive_in_float64, "incorrect", "the up-projection the absorbed form avoids"),
    (check_absorbed_scores, scores_naive_when_narrow_heads, "incorrect", "one head's keys"),
    (check_absorbed_scores, scores_keys_by_prod, "incorrect", "whatever operation made the products"),
    (check_absorbed_scores, scores_keys_by_squares, "incorrect", "whatever operation made the products"),
    (check_absorbed_scores, scores_keys_conv1d_per_coordinate, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_keys_addbmm_in_chunks, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_keys_addr_in_chunks, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_keys_by_division, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_naive_for_prefill, "incorrect", "the exercise is the absorbed decode path"),
    (check_absorbed_scores, scores_naive_when_prefill, "incorrect", "the exercise is the absorbed decode path"),
    (check_absorbed_scores, scores_naive_when_an_eighth, "incorrect", "the exercise is the absorbed decode path"),
    (check_absorbed_scores, scores_block_diagonal, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_keys_scalar_times_column, "incorrect", "rebuilding one head's keys"),
    (check_absorbed_scores, scores_keys_in_python_numbers, "incorrect", "you called Tensor.item"),
    (check_absorbed_scores, scores_keys_through_float, "incorrect", "you called Tensor.__float__"),
    (check_absorbed_scores, scores_cpu_buffer, "incorrect", "make new tensors on the inputs' device"),
    (check_absorbed_scores, scores_scale_d, "incorrect", "scale is 1/sqrt(d_h + d_h^R)"),
    (check_absorbed_scores, scores_unscaled, "incorrect", "not scaled"),
    (check_absorbed_scores, scores_no_rope, "incorrect", "rotary part q_R . k_R is missing"),
    (check_absorbed_scores, scores_wrong_split, "incorrect", "split the wrong way"),
    (check_absorbed_scores, scores_reshaped_wrong, "incorrect", "reshaped as (H, d_c, D)"),
    (check_absorbed_scores, scores_transposed_first, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_heads_summed, "incorrect", "the sum over heads"),
    (check_absorbed_scores, scores_softmaxed, "incorrect", "values differ"),
    (check_absorbed_scores, scores_in_place, "incorrect", "changed its input `q_content` in place"),
    (check_absorbed_scores, scores_package, "incorrect", "you called attn_course.MultiHeadLatentAttention"),
    (check_absorbed_scores, scores_float32, "correct", "no key is rebuilt"),
    (check_absorbed_scores, scores_float16, "incorrect", "compute in the inputs' dtype"),
    (check_absorbed_scores, scores_numpy_keys, "incorrect", "you called Tensor.numpy"),
    (check_absorbed_scores, scores_numpy_implicit, "incorrect", "leaving torch for numpy"),
    (check_absorbed_scores, scores_tolist_keys, "incorrect", "you called Tensor.tolist"),
    (check_absorbed_scores, scores_first_batch_only, "incorrect", "values differ"),
    (check_merged_output, merge_right, "correct", "That saves no work"),
    (check_merged_output, merge_einsum, "correct", "92.3M in all"),
    (check_merged_output, merge_block_diagonal, "correct", "336M multiply-adds"),
    (check_merged_output, merge_whole, "incorrect", "adds the heads' products together"),
    (check_merged_output, merge_transposed, "incorrect", "is the transpose"),
    (check_merged_output, merge_stacked, "incorrect", "side by side"),
    (check_merged_output, merge_wrong_split, "incorrect", "split the wrong way"),
    (check_merged_output, merge_wo_wrong_split, "incorrect", "W_O's columns are split into heads the wrong way"),
    (check_merged_output, merge_latent_major, "incorrect", "ordered latent by latent"),
    (check_merged_output, merge_reversed, "incorrect", "reverse order"),
    (check_merged_output, merge_wo_rows, "incorrect", "values differ"),
    (check_merged_output, merge_reshaped_wrong, "incorrect", "reshaped as (H, d_c, D)"),
    (check_merged_output, merge_cpu_buffer, "incorrect", "make new tensors on the inputs' device"),
    (check_merged_output, merge_in_place, "incorrect", "in place"),
    (check_merged_output, merge_package, "incorrect", "you called attn_course.MultiHeadLatentAttention"),
    (check_merged_output, merge_float32_buffer, "correct", "That saves no work"),
    (check_merged_output, merge_float16, "incorrect", "compute in the inputs' dtype"),
]


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c.__name__}-{a.__name__}" for c, a, _, _ in CASES])
def test_feedback(check, answer, status, words):
    feedback = check(answer)
    assert feedback.status == status, str(feedback)
    assert words in str(feedback), str(feedback)
    assert bool(feedback) == (status == "correct")
    if status in ("incorrect", "error"):
        assert "Hint:" in str(feedback)


@pytest.mark.parametrize("check", CHECKS)
def test_scaffold_is_not_attempted_and_crashes_are_reported_without_traceback(check):
    assert check(scaffold).status == "not attempted"
    assert check(None).status == "not attempted"
    feedback = check(crashes)
    assert feedback.status == "error"
    assert "RuntimeError: shapes do not match" in str(feedback) and "Traceback" not in str(feedback)
    assert check("not a function").status == "incorrect"


def test_the_size_watch_lets_the_absorbed_form_through_and_leaves_no_mode_behind():
    modes = torch._C._len_torch_dispatch_stack() if hasattr(torch._C, "_len_torch_dispatch_stack") else None
    assert check_absorbed_scores(scores_naive).status == "incorrect"
    assert check_absorbed_scores(crashes).status == "error"
    assert check_absorbed_scores(scores_right)
    if modes is not None:
        assert torch._C._len_torch_dispatch_stack() == modes
    torch.testing.assert_close(torch.ones(2) @ torch.ones(2), torch.tensor(2.0))


def test_the_notebooks_random_state_is_left_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for check, answer in ((check_cache_per_token, cache_right), (check_absorbed_scores, scores_right),
                          (check_merged_output, merge_right)):
        assert check(answer)
    assert torch.equal(torch.get_rng_state(), state)


def test_graded_mode_keeps_the_named_mistake_and_drops_the_hint(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_GRADED", "1")
    feedback = check_absorbed_scores(scores_no_rope)
    assert feedback.status == "incorrect" and "rotary part q_R . k_R is missing" in str(feedback)
    assert "Hint" not in str(feedback)


def _recorded(name):
    """A chapter's committed notebook: its code cells' sources and printed outputs, and its markdown in one line."""
    notebook = json.loads((Path(__file__).parents[1] / "chapters" / name).read_text())
    code = [("".join(cell["source"]), "".join("".join(output.get("text", "")) for output in cell.get("outputs", [])))
            for cell in notebook["cells"] if cell["cell_type"] == "code"]
    markdown = " ".join(" ".join("".join(cell["source"]).split()) for cell in notebook["cells"]
                        if cell["cell_type"] == "markdown")
    return code, markdown


def _row(table, name):
    """The printed losses of one row of a table, as the strings the table shows."""
    lines = [line for line in table.splitlines() if line[:24].strip() == name]  # both tables pad names to 24
    assert len(lines) == 1, f"no single row {name!r} in:\n{table}"
    return lines[0].split()


def test_chapter_10s_losses_typed_into_this_chapter_match_chapter_10s_recorded_output():
    """Cell 40 types chapter 10's G = 1 losses by hand (MQA_LOSSES) and the prose quotes them and chapter 10's MHA
    losses: if chapter 10 is re-executed and its table moves, this fails until chapter 11 is brought in line."""
    ch10_code, _ = _recorded("10_grouped_query_attention.ipynb")
    ch10_table = next(out for source, out in ch10_code if "test loss: mean (low-high)" in out)
    ch10_mqa = _row(ch10_table, "G = 1")[-3:]  # seeds 0, 1, 2, printed with two decimals
    ch10_mha = _row(ch10_table, "G = 8")[-3:]
    ch11_code, ch11_markdown = _recorded("11_latent_attention.ipynb")
    source, ch11_table = next((source, out) for source, out in ch11_code if "MQA_LOSSES = (" in source)
    typed = next(ast.literal_eval(node.value) for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MQA_LOSSES" for t in node.targets))
    assert [f"{loss:.2f}" for loss in typed] == ch10_mqa, (typed, ch10_mqa)
    ch11_mha = [f"{float(loss):.2f}" for loss in _row(ch11_table, "MHA")[-4:-1]]  # seeds 0, 1, 2 (then the mean)
    assert ch11_mha == ch10_mha, (ch11_mha, ch10_mha)  # "the same model trained with the same seeds ... as here"
    low, high, mean = min(typed), max(typed), sum(typed) / len(typed)
    for quoted in (f"between {low:.2f} and {high:.2f} with the same seeds in chapter 10's recorded run",
                   f"the {mean:.2f} of chapter 10's recorded run",
                   "ended at " + ", ".join(ch10_mha[:2]) + f" and {ch10_mha[2]}"):
        assert quoted in ch11_markdown, quoted
