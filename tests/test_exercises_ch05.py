"""The exercise checks of chapter 05: a right answer, written several ways, passes; each plausible wrong
answer is rejected with a message that names the mistake (the answers the review found accepted among
them: code that reads the notebook's globals B, T, E = 2, 5, 12, and an exercise 4 that calls ``mha``);
right values that cannot be trained through (no_grad, .detach(), the softmax's output zeroed in place) are named
by the checks' case with autograd on; a crash is reported without a traceback; the untouched scaffold counts as
not attempted."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_course as ac

from attn_course.exercises.ch05 import (
    check_count_parameters,
    check_cross_attention,
    check_merge_heads,
    check_split_fused_qkv,
    check_split_heads,
)

B, T, E = 2, 5, 12  # the notebook's globals, which the answers below that read them must not get away with


def scaffold(*args):
    ...


# --- Exercise 1: split and merge -----------------------------------------------------------------

def split_heads(x, num_heads):
    B, T, E = x.shape
    return x.view(B, T, num_heads, E // num_heads).transpose(1, 2)


def merge_heads(context):
    B, H, T, D = context.shape
    return context.transpose(1, 2).reshape(B, T, H * D)


def split_unflatten(x, num_heads):  # another right answer
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def split_stack(x, num_heads):  # and another: one slice of the width per head, stacked on a new axis 1
    return torch.stack(x.split(x.size(-1) // num_heads, dim=-1), dim=1)


def split_permute(x, num_heads):  # and another
    return x.reshape(x.size(0), x.size(1), num_heads, -1).permute(0, 2, 1, 3).contiguous()


def merge_flatten(context):  # another right answer
    return context.permute(0, 2, 1, 3).flatten(2)


def merge_cat(context):  # and another: the heads' outputs side by side
    return torch.cat(context.unbind(1), dim=-1)


def split_globals(x, num_heads):  # the review: the notebook's B, T, E read from the globals
    return x.view(B, T, num_heads, E // num_heads).transpose(1, 2)


def merge_globals(context):  # the review: literally the code of the notebook's section 3
    return context.transpose(1, 2).reshape(B, T, E)


def split_three_heads(x, num_heads):  # the notebook's H = 3, whatever num_heads says
    return split_heads(x, 3)


def split_view_bhtd(x, num_heads):
    return x.reshape(x.size(0), num_heads, x.size(1), -1)


def split_interleaved(x, num_heads):
    return x.reshape(x.size(0), x.size(1), -1, num_heads).permute(0, 3, 1, 2)


def split_d_t(x, num_heads):  # (B, H, D, T): a transpose too many
    return split_heads(x, num_heads).transpose(-2, -1)


def split_in_place(x, num_heads):  # right values, but the caller's x is scaled and scaled back in place
    x.mul_(2.0)
    heads = split_heads(x, num_heads) / 2
    return heads


def split_half(x, num_heads):  # right layout, computed in float16
    return split_heads(x.half(), num_heads)


def split_long(x, num_heads):
    return split_heads(x, num_heads).long()


def merge_no_transpose(context):
    return context.reshape(context.size(0), context.size(2), -1)


def merge_interleaved(context):
    return context.permute(0, 2, 3, 1).reshape(context.size(0), context.size(2), -1)


def merge_transpose_only(context):
    return context.transpose(1, 2)


# --- Exercise 2: the fused projection ------------------------------------------------------------

def split_fused_qkv(qkv, num_heads):
    E = qkv.size(-1) // 3
    return tuple(split_heads(t, num_heads) for t in qkv.split(E, dim=-1))


def fused_by_permute(qkv, num_heads):  # another right answer: one view with an axis for q/k/v, one permute
    B, T, three_E = qkv.shape
    D = three_E // 3 // num_heads
    return qkv.view(B, T, 3, num_heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)


def fused_stacked(qkv, num_heads):  # and another: one (3, B, H, T, D) tensor, which unpacks into q, k, v
    B, T, three_E = qkv.shape
    return qkv.view(B, T, 3, num_heads, -1).permute(2, 0, 3, 1, 4)


def fused_list(qkv, num_heads):
    return list(split_fused_qkv(qkv, num_heads))


def fused_globals(qkv, num_heads):  # the review: E = 12 from the notebook
    return tuple(t.view(B, T, num_heads, E // num_heads).transpose(1, 2) for t in qkv.split(E, dim=-1))


def fused_width_12(qkv, num_heads):  # E = 12 written in, the sizes read from qkv otherwise
    return tuple(split_heads(t, num_heads) for t in qkv.split(12, dim=-1))


def fused_per_head_layout(qkv, num_heads):  # each head's [q_h | k_h | v_h] side by side
    return qkv.view(qkv.size(0), qkv.size(1), num_heads, -1).transpose(1, 2).chunk(3, dim=-1)


def fused_view_bhtd(qkv, num_heads):
    E = qkv.size(-1) // 3
    return tuple(t.reshape(t.size(0), num_heads, t.size(1), -1) for t in qkv.split(E, -1))


def fused_interleaved(qkv, num_heads):
    E = qkv.size(-1) // 3
    return tuple(t.reshape(t.size(0), t.size(1), -1, num_heads).permute(0, 3, 1, 2) for t in qkv.split(E, -1))


def fused_no_transpose(qkv, num_heads):
    E = qkv.size(-1) // 3
    return tuple(t.reshape(t.size(0), t.size(1), num_heads, -1) for t in qkv.split(E, -1))


def fused_strided_thirds(qkv, num_heads):  # q, k, v taken as every third column
    return tuple(split_heads(qkv[..., i::3], num_heads) for i in range(3))


def fused_chunk_tokens(qkv, num_heads):  # chunked along the tokens instead of the width
    return tuple(t for t in qkv.chunk(3, dim=1))


# --- Exercise 3: parameters ----------------------------------------------------------------------

def count_parameters(embed_dim, num_heads, bias=True, qk_head_dim=None):
    d_k = embed_dim // num_heads if qk_head_dim is None else qk_head_dim
    return 2 * embed_dim * num_heads * d_k + 2 * embed_dim * embed_dim + ((2 * num_heads * d_k + 2 * embed_dim) if bias else 0)


def count_by_projection(embed_dim, num_heads, bias, qk_head_dim=None):  # another right answer
    widths = [num_heads * (qk_head_dim or embed_dim // num_heads)] * 2 + [embed_dim, embed_dim]
    return sum(embed_dim * w + (w if bias else 0) for w in widths)


def count_numpy(embed_dim, num_heads, bias, qk_head_dim=None):  # a numpy integer is an integer
    return np.int64(count_parameters(embed_dim, num_heads, bias, qk_head_dim))


def count_with(*, qk="H*dk", v="E", out="E", bias_qk="H*dk"):
    # a parametrised wrong count: widths of the query/key, value and output projections
    def count(E, H, bias, qk_head_dim=None):
        dk = E // H if qk_head_dim is None else qk_head_dim
        width = {"H*dk": H * dk, "dk": dk, "E": E}
        weights = 2 * E * width[qk] + E * width[v] + E * width[out]
        biases = (2 * width[bias_qk] + width[v] + width[out]) if bias else 0
        return weights + biases
    return count


# --- Exercise 4: cross-attention with padding ----------------------------------------------------

def cross_attention(queries, memory, mha, key_padding_mask, scale_width=None, use_mask=True, invert=False):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)  # (B, H, L, D)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))  # (B, H, S, D)
    width = q.size(-1) if scale_width is None else scale_width
    scores = q @ k.transpose(-2, -1) / math.sqrt(width)  # (B, H, L, S)
    if use_mask:
        blocked = ~key_padding_mask if invert else key_padding_mask
        scores = scores.masked_fill(blocked[:, None, None, :], float("-inf"))
    weights = scores.softmax(-1)
    if use_mask:  # a query whose memory is all padding: 0 / 0 = NaN, and it must get zero weights
        weights = weights.masked_fill(key_padding_mask.all(-1)[:, None, None, None], 0.0)
    return mha.out_proj(merge_heads(weights @ v))


def cross_einsum(queries, memory, mha, key_padding_mask):  # another right answer
    H, D = mha.num_heads, mha.head_dim
    q = mha.q_proj(queries).unflatten(-1, (H, D))  # (B, L, H, D)
    k = mha.k_proj(memory).unflatten(-1, (H, D))  # (B, S, H, D)
    v = mha.v_proj(memory).unflatten(-1, (H, D))
    scores = torch.einsum("blhd,bshd->bhls", q, k) / D ** 0.5
    scores = torch.where(key_padding_mask[:, None, None, :], torch.finfo(scores.dtype).min, scores)
    weights = F.softmax(scores, dim=-1) * (~key_padding_mask).any(-1)[:, None, None, None]  # all padding: zero
    context = torch.einsum("bhls,bshd->blhd", weights, v).flatten(2)
    return mha.out_proj(context)


def cross_calls_mha(queries, memory, mha, key_padding_mask):  # the review: accepted until now
    return mha(queries, memory, memory, key_padding_mask=key_padding_mask)


def cross_calls_forward(queries, memory, mha, key_padding_mask):
    return mha.forward(queries, memory, memory, key_padding_mask=key_padding_mask)[0]


def cross_calls_class_forward(queries, memory, mha, key_padding_mask):
    return type(mha).forward(mha, queries, memory, memory, key_padding_mask=key_padding_mask)[0]


def cross_sdpa(queries, memory, mha, key_padding_mask):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=~key_padding_mask[:, None, None, :])
    return mha.out_proj(merge_heads(context))


def cross_torch_module(queries, memory, mha, key_padding_mask):
    torch_mha = torch.nn.MultiheadAttention(mha.embed_dim, mha.num_heads, batch_first=True)
    return torch_mha(queries, memory, memory, key_padding_mask=key_padding_mask)[0]


def cross_after_softmax(queries, memory, mha, key_padding_mask):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1)
    weights = weights.masked_fill(key_padding_mask[:, None, None, :], 0.0)
    return mha.out_proj(merge_heads(weights @ v))


def cross_mask_on_queries(queries, memory, mha, key_padding_mask):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, :, None],
                                                                          float("-inf"))
    return mha.out_proj(merge_heads(scores.softmax(-1) @ v))


def cross_right_padding_assumed(queries, memory, mha, key_padding_mask):  # rebuilds the mask from the lengths
    lengths = (~key_padding_mask).sum(-1)
    rebuilt = torch.arange(memory.size(1))[None, :] >= lengths[:, None]
    return cross_attention(queries, memory, mha, rebuilt)


def cross_inverts_in_place(queries, memory, mha, key_padding_mask):  # flips the caller's mask to "allowed"
    allowed = key_padding_mask.logical_not_()
    return cross_attention(queries, memory, mha, ~allowed)


def cross_pair(queries, memory, mha, key_padding_mask):
    out = cross_attention(queries, memory, mha, key_padding_mask)
    return out, None


def cross_keys_from_queries(queries, memory, mha, key_padding_mask):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.v_proj, mha.k_proj))  # keys and values swapped
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :],
                                                                          float("-inf"))
    return mha.out_proj(merge_heads(scores.softmax(-1) @ v))


def count_by_building(embed_dim, num_heads, bias, qk_head_dim=None):  # the review: accepted until now
    module = ac.MultiHeadAttention(embed_dim, num_heads, bias=bias, qk_head_dim=qk_head_dim)
    return sum(p.numel() for p in module.parameters())


def count_by_linear_layers(embed_dim, num_heads, bias, qk_head_dim=None):  # the previous review: nn.Linear built
    width = num_heads * (qk_head_dim or embed_dim // num_heads)
    layers = [torch.nn.Linear(embed_dim, w, bias=bias) for w in (width, width, embed_dim, embed_dim)]
    return sum(p.numel() for layer in layers for p in layer.parameters())


def cross_nan_when_all_padding(queries, memory, mha, key_padding_mask):  # the chapter's former solution
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :],
                                                                          float("-inf"))
    return mha.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


def cross_smallest_fill(queries, memory, mha, key_padding_mask):  # finite fill: an empty memory averages padding
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :],
                                                                          torch.finfo(q.dtype).min)
    return mha.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


def cross_naive_softmax(queries, memory, mha, key_padding_mask):  # the review: exp without the max shift
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    e = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp().masked_fill(key_padding_mask[:, None, None, :], 0)
    weights = (e / e.sum(-1, keepdim=True)).nan_to_num(0.0)  # empty memory: 0 / 0 -> 0 (right); overflow: inf / inf
    weights = torch.where(torch.isinf(e).any(-1, keepdim=True), float("nan"), weights)
    return mha.out_proj(merge_heads(weights @ v))


def cross_minus_1e9(queries, memory, mha, key_padding_mask):  # the review: -1e9, right in float32
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :], -1e9)
    weights = scores.softmax(-1).masked_fill(key_padding_mask.all(-1)[:, None, None, None], 0.0)
    return mha.out_proj(merge_heads(weights @ v))


def cross_additive_minus_1e9(queries, memory, mha, key_padding_mask):  # the review: an additive -1e9 mask
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    bias = torch.zeros(key_padding_mask.shape, dtype=q.dtype, device=q.device).masked_fill(key_padding_mask, -1e9)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias[:, None, None, :]
    weights = scores.softmax(-1).masked_fill(key_padding_mask.all(-1)[:, None, None, None], 0.0)
    return mha.out_proj(merge_heads(weights @ v))


def cross_renormalised(queries, memory, mha, key_padding_mask):  # the review: softmax over all keys, renormalised
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1) * ~key_padding_mask[:, None, None, :]
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    return mha.out_proj(merge_heads(weights @ v))


def cross_package_helper(queries, memory, mha, key_padding_mask):  # the review: the package's masked softmax
    from attn_course.alignment import _weights_and_context
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    c = torch.stack([_weights_and_context(s[:, h], v[:, h], key_padding_mask)[0] for h in range(H)], 1)
    return mha.out_proj(merge_heads(c))


def cross_cpu_fill(queries, memory, mha, key_padding_mask):  # the review: a -inf tensor made without device=
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    s = torch.where(key_padding_mask[:, None, None, :], torch.full(s.shape, float("-inf"), dtype=s.dtype), s)
    return mha.out_proj(merge_heads(torch.softmax(s, -1).nan_to_num(0.0) @ v))


def cross_cpu_empty(queries, memory, mha, key_padding_mask):  # the review: the empty-row mask built on the CPU
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    empty = torch.zeros(key_padding_mask.size(0), dtype=torch.bool)
    empty |= key_padding_mask.all(-1).cpu() if key_padding_mask.device.type != "meta" else empty
    return mha.out_proj(merge_heads(torch.softmax(s, -1).masked_fill(empty[:, None, None, None], 0.0) @ v))


def cross_upcast(queries, memory, mha, key_padding_mask):  # float32 result of float16 inputs: passes, the course's rule
    wide = lambda layer, x: F.linear(x.float(), layer.weight.float(), layer.bias.float())
    H = mha.num_heads
    q = split_heads(wide(mha.q_proj, queries), H)
    k, v = (split_heads(wide(proj, memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    return wide(mha.out_proj, merge_heads(torch.softmax(s, -1).nan_to_num(0.0) @ v))


def cross_float64_result(queries, memory, mha, key_padding_mask):  # the course's dtype rule: a wider result passes
    return cross_attention(queries, memory, mha, key_padding_mask).double()


def cross_softmax_in_float32(queries, memory, mha, key_padding_mask):  # the third review: rejected until now
    # the common habit: only the softmax in float32, cast back; for float64 inputs it is judged at float32's
    # tolerance, as an answer computed wholly in float32 is (the course's dtype rule)
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(s.float(), -1).to(s.dtype).nan_to_num(0.0)
    return mha.out_proj(merge_heads(weights @ v))


def _scores_and_values(queries, memory, mha, key_padding_mask, fill=float("-inf")):
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(key_padding_mask[:, None, None, :], fill)
    return s, v  # (B, H, L, S), (B, H, S, D)


def cross_branch_cpu_zeros(queries, memory, mha, key_padding_mask):  # the fourth review: accepted until now
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    w = torch.softmax(s, -1)
    if key_padding_mask.all(-1).any():  # a branch on a value: the meta device cannot run it
        w = torch.where(torch.isnan(w), torch.zeros(w.shape, dtype=w.dtype), w)  # no device=
    return mha.out_proj(merge_heads(w @ v))


def cross_bool_loop_cpu_tensor(queries, memory, mha, key_padding_mask):  # the fourth review: accepted until now
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    keep = torch.tensor([0.0 if bool(row.all()) else 1.0 for row in key_padding_mask], dtype=s.dtype)  # no device=
    return mha.out_proj(merge_heads(torch.nan_to_num(torch.softmax(s, -1)) * keep[:, None, None, None] @ v))


def cross_branch_on_device(queries, memory, mha, key_padding_mask):  # right: the same branch, device= given
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    w = torch.softmax(s, -1)
    if key_padding_mask.all(-1).any():
        w = torch.where(torch.isnan(w), torch.zeros(w.shape, dtype=w.dtype, device=w.device), w)
    return mha.out_proj(merge_heads(w @ v))


def cross_bool_loop_moved(queries, memory, mha, key_padding_mask):  # right: the loop's tensor moved to the device
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    keep = torch.tensor([0.0 if bool(row.all()) else 1.0 for row in key_padding_mask], dtype=s.dtype).to(s.device)
    return mha.out_proj(merge_heads(torch.nan_to_num(torch.softmax(s, -1)) * keep[:, None, None, None] @ v))


def cross_branch_cpu_scalar(queries, memory, mha, key_padding_mask):  # right: a 0-dim CPU value, which CUDA accepts
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    w = torch.softmax(s, -1)
    if bool(torch.isnan(w).any()):
        w = torch.where(torch.isnan(w), torch.tensor(0.0, dtype=w.dtype), w)
    return mha.out_proj(merge_heads(w @ v))


def cross_finite_fill(fill):  # the fourth review: a finite fill, the empty rows zeroed; None: the dtype's smallest
    def answer(queries, memory, mha, key_padding_mask):
        smallest = torch.finfo(queries.dtype).min
        s, v = _scores_and_values(queries, memory, mha, key_padding_mask, fill=smallest if fill is None else fill)
        w = torch.softmax(s, -1).masked_fill(key_padding_mask.all(-1)[:, None, None, None], 0.0)
        return mha.out_proj(merge_heads(w @ v))
    answer.__name__ = f"cross_fill_{'finfo_min' if fill is None else format(fill, 'g')}"
    return answer


# The sixth review: right values that cannot be trained through (every check now runs one case with autograd on,
# through the shared expect_gradients)
def cross_under_no_grad(queries, memory, mha, key_padding_mask):  # the notebook's demonstration cells run so
    with torch.no_grad():
        return cross_attention(queries, memory, mha, key_padding_mask)


def cross_values_detached(queries, memory, mha, key_padding_mask):  # no gradient reaches v_proj
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    return mha.out_proj(merge_heads(torch.nan_to_num(torch.softmax(s, -1)) @ v.detach()))


def cross_zeroed_in_place(queries, memory, mha, key_padding_mask):  # the solution's line, in place
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    weights = torch.softmax(s, -1)
    weights.masked_fill_(key_padding_mask.all(-1)[:, None, None, None], 0.0)  # the softmax's output, saved for backward
    return mha.out_proj(merge_heads(weights @ v))


def cross_zeroed_by_index(queries, memory, mha, key_padding_mask):  # the same, by an indexed assignment
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    weights = torch.softmax(s, -1)
    weights[key_padding_mask.all(-1)] = 0.0
    return mha.out_proj(merge_heads(weights @ v))


def cross_scores_filled_in_place(queries, memory, mha, key_padding_mask):  # right: in place on the scores, which
    H = mha.num_heads                                                      # autograd did not save
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores.masked_fill_(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.where(key_padding_mask.all(-1)[:, None, None, None], 0.0, torch.softmax(scores, -1))
    return mha.out_proj(merge_heads(weights @ v))


def cross_log_softmax(queries, memory, mha, key_padding_mask):  # right: the weights as exp of the log-softmax
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    return mha.out_proj(merge_heads(torch.log_softmax(s, -1).exp().nan_to_num(0.0) @ v))


def cross_online_softmax(queries, memory, mha, key_padding_mask):  # the seventh review: the package's softmax
    s, v = _scores_and_values(queries, memory, mha, key_padding_mask)
    return mha.out_proj(merge_heads(ac.efficient.online_softmax(s) @ v))


def cross_float32_mask(queries, memory, mha, key_padding_mask):  # the seventh review: a mask made without dtype=
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    additive = torch.where(key_padding_mask, float("-inf"), 0.0)[:, None, None, :]  # float32, whatever the scores
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + additive
    return mha.out_proj(merge_heads(torch.softmax(s, -1).nan_to_num(0.0) @ v))


def cross_additive_from_package(queries, memory, mha, key_padding_mask):  # the same, with the package's helper
    H = mha.num_heads
    q = split_heads(mha.q_proj(queries), H)
    k, v = (split_heads(proj(memory), H) for proj in (mha.k_proj, mha.v_proj))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + ac.blocked_to_additive(key_padding_mask)[:, None, None, :]
    return mha.out_proj(merge_heads(torch.softmax(s, -1).nan_to_num(0.0) @ v))


RIGHT = [
    (check_split_heads, split_heads),
    (check_split_heads, split_unflatten),
    (check_split_heads, split_stack),
    (check_split_heads, split_permute),
    (check_merge_heads, merge_heads),
    (check_merge_heads, merge_flatten),
    (check_merge_heads, merge_cat),
    (check_split_fused_qkv, split_fused_qkv),
    (check_split_fused_qkv, fused_by_permute),
    (check_split_fused_qkv, fused_stacked),
    (check_split_fused_qkv, fused_list),
    (check_count_parameters, count_parameters),
    (check_count_parameters, count_by_projection),
    (check_count_parameters, count_numpy),
    (check_count_parameters, lambda e, h, b, dk: torch.tensor(count_parameters(e, h, b, dk))),
    (check_cross_attention, cross_attention),
    (check_cross_attention, cross_einsum),
    (check_cross_attention, cross_float64_result),
    (check_cross_attention, cross_softmax_in_float32),
    # the course's dtype rule: a half-precision result of full-precision inputs is rejected, the converse passes
    # (the exercise's text says so)
    (check_cross_attention, cross_upcast),
    # the fourth review: answers that branch on a value (the meta device cannot run them; the CPU case is watched
    # instead), and the smallest number of the scores' own dtype as the fill (the seventh review: every fixed finite
    # fill is now named, see WRONG)
    (check_cross_attention, cross_branch_on_device),
    (check_cross_attention, cross_bool_loop_moved),
    (check_cross_attention, cross_branch_cpu_scalar),
    (check_cross_attention, cross_finite_fill(None)),
    # the sixth review: written otherwise, still trainable (in place on the scores, which autograd did not save)
    (check_cross_attention, cross_scores_filled_in_place),
    (check_cross_attention, cross_log_softmax),
]


@pytest.mark.parametrize("check, answer", RIGHT, ids=lambda f: f.__name__)
def test_right_answers_pass(check, answer):
    feedback = check(answer)
    assert feedback.status == "correct", str(feedback)
    assert bool(feedback)


@pytest.mark.parametrize("check", [check_split_heads, check_merge_heads, check_split_fused_qkv, check_count_parameters,
                                   check_cross_attention], ids=lambda f: f.__name__)
def test_untouched_scaffold_is_not_attempted(check):
    for answer in (scaffold, ...):
        feedback = check(answer)
        assert feedback.status == "not attempted" and not feedback
        assert "Not attempted yet" in str(feedback)


# Answers that crash: reported with the inputs they failed on, without a traceback. The first three are
# the review's accepted answers, which read the notebook's B, T, E.
@pytest.mark.parametrize(
    "check, answer, words",
    [
        (check_split_heads, split_globals, "called with x of shape (3, 7, 24)"),
        (check_merge_heads, merge_globals, "called with context of shape (3, 2, 7, 12)"),
        (check_split_fused_qkv, fused_globals, "called with qkv of shape (3, 7, 72)"),
        (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), h, 5), "RuntimeError"),
        (check_merge_heads, lambda c: c.transpose(1, 2).view(c.size(0), c.size(2), -1), "RuntimeError"),
        (check_count_parameters, lambda e, h, b, dk: e / 0, "ZeroDivisionError"),
        (check_cross_attention, lambda q, m, mha, kpm: q @ m, "RuntimeError"),
        # the mask along the queries: it broadcasts only when L == S (then it is named, see WRONG)
        (check_cross_attention, cross_mask_on_queries, "called with queries of shape (3, 4, 24), memory of shape (3, 7, 24)"),
    ],
)
def test_crashing_answers_are_reported_without_a_traceback(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "error", str(feedback)
    assert words in feedback.message and "Traceback" not in str(feedback), feedback.message
    assert "Hint:" in str(feedback)


# A result moved to the CPU: named on the meta device (no accelerator) as a copy out of it, on an accelerator as a
# result on the CPU.
COPIED_TO_CPU = ("copies the input's data to the CPU" if ac.exercises.other_device().type == "meta"
                 else "but your result is on cpu")

# The table of plausible wrong answers: each must be rejected ("incorrect") with a message naming the mistake.
WRONG = [
    # Exercise 1a
    (check_split_heads, split_view_bhtd, "viewed x as (B, H, T, D) directly"),
    (check_split_heads, split_interleaved, "interleaved"),
    (check_split_heads, split_three_heads, "expected 2 heads on axis 1"),
    (check_split_heads, split_d_t, "expected shape (3, 2, 7, 12)"),
    (check_split_heads, lambda x, h: x.view(x.size(0), x.size(1), h, -1), "left the head axis behind the token axis"),
    (check_split_heads, split_in_place, "changed its input `x` in place"),
    (check_split_heads, split_half, "your result is torch.float16 but the inputs were torch.float32"),
    (check_split_heads, split_long, "expected floating-point numbers, got dtype torch.int64"),
    # the review: a downcast of float64 inputs (a float32 result passes the course's dtype rule, the lost digits
    # do not)
    (check_split_heads, lambda x, h: split_heads(x.to(torch.float32), h), "only to float32 precision"),
    (check_split_heads, lambda x, h: split_heads(x, h).float(), "only to float32 precision"),
    (check_split_heads, lambda x, h: split_heads(x.half(), h).to(x.dtype), "values differ"),
    # Exercise 1b
    (check_merge_heads, merge_no_transpose, "without moving the head axis"),
    (check_merge_heads, merge_interleaved, "interleaved"),
    (check_merge_heads, merge_transpose_only, "expected shape (3, 7, 24)"),
    (check_merge_heads, lambda c: merge_heads(c) * 1.001, "values differ"),
    (check_merge_heads, lambda c: merge_heads(c.float()), "only to float32 precision"),
    (check_merge_heads, lambda c: merge_heads(c.to(torch.bfloat16)), "your result is torch.bfloat16"),
    # Exercise 2
    (check_split_fused_qkv, fused_per_head_layout, "[q_h | k_h | v_h]"),
    (check_split_fused_qkv, lambda qkv, h: split_fused_qkv(qkv, h)[::-1], "wrong order (v, k, q)"),
    (check_split_fused_qkv, lambda qkv, h: (lambda q, k, v: (k, q, v))(*split_fused_qkv(qkv, h)), "wrong order (k, q, v)"),
    (check_split_fused_qkv, fused_view_bhtd, "viewed each as (B, H, T, D) directly"),
    (check_split_fused_qkv, fused_interleaved, "interleaved"),
    (check_split_fused_qkv, fused_no_transpose, "expected shape (3, 2, 7, 12)"),
    (check_split_fused_qkv, fused_width_12, "got 6 item(s)"),
    (check_split_fused_qkv, fused_strided_thirds, "values differ"),
    (check_split_fused_qkv, fused_chunk_tokens, "expected shape"),
    (check_split_fused_qkv, lambda qkv, h: split_heads(qkv, h), "expected three tensors (q, k, v), got one Tensor"),
    (check_split_fused_qkv, lambda qkv, h: split_fused_qkv(qkv, h)[:2], "got 2 item(s)"),
    (check_split_fused_qkv, lambda qkv, h: tuple(t * 1.01 for t in split_fused_qkv(qkv, h)), "values differ"),
    (check_split_fused_qkv, lambda qkv, h: split_fused_qkv(qkv.float(), h), "only to float32 precision"),
    # the third review: q, k, v stacked on axis 1 (with B = 3 it read as a stack on axis 0; no hint until now)
    (check_split_fused_qkv, lambda qkv, h: torch.stack(split_fused_qkv(qkv, h), dim=1), "stacked q, k and v on axis 1"),
    (check_split_fused_qkv, lambda qkv, h: (lambda q, k, v: (q, k, v.float()))(*split_fused_qkv(qkv, h)),
     "only to float32 precision"),
    # Exercise 3: qk_head_dim ignored, values or output narrowed too, d_k taken as the total width, the output
    # projection or the biases forgotten, heads multiplied, E-wide query/key biases, not an integer
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
    # the review: the output projection's bias forgotten (was rejected without a diagnosis); the module built
    (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b, dk) - (e if b else 0),
     "left out the output projection's bias"),
    (check_count_parameters, count_by_building, "you called attn_course.multihead.MultiHeadAttention.__init__"),
    (check_count_parameters, count_by_linear_layers, "count the weights and biases without building the layers"),
    (check_count_parameters, lambda e, h, b, dk: sum(p.numel() for p in torch.nn.MultiheadAttention(e, h, bias=b).parameters()),
     "without building the layers"),
    (check_count_parameters, lambda e, h, b, dk: 4 * e * e + (4 * e if b else 0), "left qk_head_dim out"),
    (check_count_parameters, lambda e, h, b, dk: "many", "return an integer, got str"),
    (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b, dk) / 1, "return an integer, got float"),
    # the fifth review: a default head width rounded the wrong way, round(E / H + 0.5), which is E / H when that is
    # even (Python rounds halves to even) and one more when it is odd; every default width tried was even
    (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b, dk if dk is not None else round(e / h + 0.5)),
     "default head width E // num_heads = 3; your count fits a width of 4"),
    (check_count_parameters, lambda e, h, b, dk: count_parameters(e, h, b, dk if dk is not None else e // h - 1),
     "default head width E // num_heads = 64; your count fits a width of 63"),
    # Exercise 4: mha's own forward, torch's attention (the review: calling mha was accepted), the mask,
    # the scale, the padding side, the mask changed in place, a pair returned
    (check_cross_attention, cross_calls_mha, "you called attn_course.MultiHeadAttention"),
    (check_cross_attention, cross_calls_forward, "you called attn_course.MultiHeadAttention"),
    (check_cross_attention, cross_calls_class_forward, "you called attn_course.MultiHeadAttention"),
    (check_cross_attention, cross_sdpa, "you called torch.nn.functional.scaled_dot_product_attention"),
    (check_cross_attention, cross_torch_module, "you called torch.nn.MultiheadAttention"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, use_mask=False), "no effect"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, invert=True), "True = may attend"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, scale_width=q.size(-1)), "sqrt(E)"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm, scale_width=1), "did not scale"),
    (check_cross_attention, cross_after_softmax, "after the softmax"),
    (check_cross_attention, cross_right_padding_assumed, "padded on the left"),
    (check_cross_attention, lambda q, m, mha, kpm: (cross_mask_on_queries if q.size(1) == m.size(1) else cross_attention)(
        q, m, mha, kpm), "padded *queries*"),  # named where it broadcasts, L == S
    (check_cross_attention, cross_inverts_in_place, "changed its input `key_padding_mask` in place"),
    (check_cross_attention, cross_pair, "not a pair"),
    (check_cross_attention, cross_keys_from_queries, "values differ"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm) + 0.1, "values differ"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm)[:, :2], "expected shape (3, 4, 24)"),
    # the review: the chapter's former solution on a memory that is all padding (NaN), a softmax without its
    # max shift (overflows), a fill of -1e9 (overflows float16), a result moved to the CPU (on an accelerator)
    (check_cross_attention, cross_nan_when_all_padding, "is all padding, and your output is NaN there"),
    (check_cross_attention, cross_smallest_fill, "averaged the padding's values"),
    (check_cross_attention, cross_naive_softmax, "exp of a score above 88.7 overflows"),
    (check_cross_attention, cross_minus_1e9, "-1e9 does not exist in float16"),
    (check_cross_attention, cross_additive_minus_1e9, "-1e9 does not exist in float16"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm) - mha.out_proj.bias,
     "left out its bias"),
    # the second review: the package's private masked softmax, tensors made without device= (named on the
    # accelerator, else on the meta device), the softmax over all keys renormalised after zeroing the padding
    (check_cross_attention, cross_package_helper, "you called attn_course.alignment._weights_and_context"),
    (check_cross_attention, cross_cpu_fill, "made without device="),
    (check_cross_attention, cross_cpu_empty, "made without device="),
    (check_cross_attention, cross_renormalised, "underflow to 0"),
    # the fourth review: a tensor made without device= behind a branch on a value (the meta device cannot run it:
    # the watched CPU run names it), and a finite fill that real scores far below zero pass
    (check_cross_attention, cross_branch_cpu_zeros, "made without device="),
    (check_cross_attention, cross_branch_cpu_zeros, "`where`"),
    (check_cross_attention, cross_bool_loop_cpu_tensor, "made without device="),
    (check_cross_attention, cross_finite_fill(-100.0), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-1e3), "a fixed finite fill (-100, -1e4, even float16's"),
    # the sixth review: right values that cannot be trained through (.detach() inside, torch.no_grad() around,
    # .detach() on v, the softmax's output zeroed in place), each named by the case run with autograd on
    (check_split_heads, lambda x, h: x.detach().unflatten(-1, (h, -1)).transpose(1, 2), "carries no gradient"),
    (check_merge_heads, lambda c: c.detach().transpose(1, 2).flatten(2), "carries no gradient"),
    (check_split_fused_qkv, lambda qkv, h: [t.detach().unflatten(-1, (h, -1)).transpose(1, 2) for t in qkv.chunk(3, -1)],
     "carries no gradient"),
    (check_cross_attention, cross_under_no_grad, "carries no gradient: it was computed under torch.no_grad()"),
    (check_cross_attention, lambda q, m, mha, kpm: cross_attention(q, m, mha, kpm).detach(), "carries no gradient"),
    (check_cross_attention, cross_values_detached, "was detached"),
    (check_cross_attention, cross_zeroed_in_place, "modified by an inplace operation"),
    (check_cross_attention, cross_zeroed_in_place, "build a new tensor instead"),
    (check_cross_attention, cross_zeroed_by_index, "modified by an inplace operation"),
    # the seventh review: the package's online_softmax (it gives a row that is all -inf zero weights), every fixed
    # finite fill (the docstring let -1e4 pass while the message said a finite fill is wrong: now the real scores
    # of that case are -180000, and a fixed fill below -65504 does not exist in float16), a float32 mask on float16
    # scores, and a result moved to the CPU in Exercises 1 and 2 (named on the accelerator, else on the meta device)
    (check_cross_attention, cross_online_softmax, "you called attn_course.online_softmax"),
    (check_cross_attention, cross_finite_fill(-5e3), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-1e4), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-1.5e4), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-65504.0), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-1e5), "a fixed finite fill (-100, -1e4, even float16's"),
    (check_cross_attention, cross_finite_fill(-1e6), "-1e9 does not exist in float16"),
    (check_cross_attention, cross_finite_fill(-3.4e38), "-1e9 does not exist in float16"),
    (check_cross_attention, cross_float32_mask, "promotes them to float32"),
    (check_cross_attention, cross_additive_from_package, "promotes them to float32"),
    (check_split_heads, lambda x, h: split_heads(x, h).cpu(), COPIED_TO_CPU),
    (check_split_heads, lambda x, h: split_heads(x.to("cpu"), h), COPIED_TO_CPU),
    (check_merge_heads, lambda c: merge_heads(c.cpu()), COPIED_TO_CPU),
    (check_merge_heads, lambda c: merge_heads(c).to("cpu"), COPIED_TO_CPU),
    (check_split_fused_qkv, lambda qkv, h: [t.to("cpu") for t in split_fused_qkv(qkv, h)], COPIED_TO_CPU),
    (check_split_fused_qkv, lambda qkv, h: torch.stack(split_fused_qkv(qkv, h)).cpu(), COPIED_TO_CPU),
]


@pytest.mark.parametrize("check, answer, words", WRONG, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(WRONG)])
def test_wrong_answers_say_what_is_wrong(check, answer, words):
    feedback = check(answer)
    assert feedback.status == "incorrect", str(feedback)
    assert words in feedback.message, feedback.message
    assert "Hint:" in str(feedback)


def test_the_checks_leave_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    check_cross_attention(cross_attention)
    check_split_heads(split_heads)
    assert torch.equal(torch.rand(1), before)


def test_the_count_check_agrees_with_the_module_and_the_papers_rows_b():
    for E_, H, bias, dk in [(512, 8, False, 16), (512, 8, True, 32), (12, 3, True, 8), (768, 12, True, None)]:
        module = ac.MultiHeadAttention(E_, H, bias=bias, qk_head_dim=dk)
        assert count_parameters(E_, H, bias, dk) == sum(p.numel() for p in module.parameters())
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


def test_graded_mode_keeps_the_named_mistake_and_drops_the_hint(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_GRADED", "1")
    feedback = check_cross_attention(cross_calls_mha)
    assert feedback.status == "incorrect" and "you called" in str(feedback)
    assert "Hint" not in str(feedback)


def test_the_case_on_another_device_compares_values_on_an_accelerator(monkeypatch):
    # This machine may have no accelerator (then the case runs on the meta device): the CPU stands in for one,
    # so that the comparison of values there runs too.
    import attn_course.exercises.ch05 as ch05
    monkeypatch.setattr(ch05, "other_device", lambda: torch.device("cpu"))
    assert check_cross_attention(cross_attention).status == "correct"
    def off_only_there(q, m, mha, kpm):  # right everywhere but in the case on the other device
        there = (q.shape, m.size(1), q.dtype) == (torch.Size([3, 3, 8]), 5, torch.float32)
        return cross_attention(q, m, mha, kpm) * (2 if there else 1)

    feedback = check_cross_attention(off_only_there)
    assert feedback.status == "incorrect" and "cpu device" in feedback.message, feedback.message


def test_the_success_message_says_when_the_device_case_could_not_run():
    # an answer that branches on a value cannot run on the meta device: the message must not say "keeps to the
    # inputs' device" then; an answer that runs there keeps the notebook's message
    from attn_course.exercises.ch05 import other_device
    if other_device().type != "meta":
        pytest.skip("an accelerator is present: the case runs there")
    branching = str(check_cross_attention(cross_branch_on_device))
    assert "keeps to the inputs' device" not in branching and "has not run on a GPU" in branching, branching
    assert str(check_cross_attention(cross_attention)).rstrip().endswith("and it keeps to the inputs' device.")
