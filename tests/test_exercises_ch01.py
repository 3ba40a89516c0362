"""The exercise checks of chapter 01: for each exercise, the right answer written more than one way and a
table of the wrong answers students plausibly write, each rejected with a message that names the mistake."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_course as ac
from attn_course.exercises.ch01 import (check_general_attention, check_luong_attention, check_teacher_forcing_inputs,
                                        check_token_query_step)

CHECKS = [check_general_attention, check_luong_attention, check_teacher_forcing_inputs, check_token_query_step]


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: Luong's general score ------------------------------------------------------------

def general_right(s, H, W_a):
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)  # (B, S)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_einsum(s, H, W_a):  # another correct formulation
    weights = torch.softmax(torch.einsum("bq,qk,bsk->bs", s, W_a, H), dim=-1)
    return torch.einsum("bs,bsk->bk", weights, H), weights


def general_bmm(s, H, W_a):  # and another: project the keys instead of the query
    keys = H @ W_a.T  # (B, S, Dq)
    weights = torch.softmax((keys @ s[:, :, None])[..., 0], dim=-1)
    return (weights[:, None, :] @ H)[:, 0], weights


def general_transposed(s, H, W_a):
    weights = torch.softmax(((s @ W_a.T)[:, None, :] * H).sum(-1), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_no_W(s, H, W_a):
    weights = torch.softmax((s[:, None, :] * H).sum(-1), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_scaled(s, H, W_a):
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1) / H.size(-1) ** 0.5, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_wrong_axis(s, H, W_a):
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1), dim=0)
    return (weights[:, :, None] * H).sum(1), weights


def general_scores(s, H, W_a):
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), scores


def general_broadcast(s, H, W_a):
    weights = torch.softmax((s @ W_a) @ H.transpose(1, 2), dim=-1)  # (B, Dk) @ (B, Dk, S) -> (B, B, S)
    return (weights @ H).sum(1), weights


def general_swapped(s, H, W_a):
    context, weights = general_right(s, H, W_a)
    return weights, context


def general_mean_context(s, H, W_a):
    _, weights = general_right(s, H, W_a)
    return H.mean(1), weights


def general_context_broadcast(s, H, W_a):
    _, weights = general_right(s, H, W_a)
    return weights @ H, weights  # (B, S) @ (B, S, Dk) -> (B, B, Dk)


def general_weights_only(s, H, W_a):
    return general_right(s, H, W_a)[1]


# The review's mis-diagnosis (a temperature of 2 was named "sqrt(Dk)" when Dk = 4), and the other classes.
def general_temperature_two(s, H, W_a):
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1) / 2, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_dim1(s, H, W_a):  # another correct formulation: dim=1 is the last axis of (B, S)
    weights = torch.softmax(torch.bmm(H, (s @ W_a)[:, :, None])[..., 0], dim=1)
    return torch.bmm(weights[:, None, :], H)[:, 0], weights


def general_float64(s, H, W_a):  # and another: computed in float64
    return general_right(s.double(), H.double(), W_a.double())


def general_naive_exp(s, H, W_a):  # a softmax without its max shift: overflows on scores near 100
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
    return (weights[:, :, None] * H).sum(1), weights


def general_sdpa(s, H, W_a):
    query = (s @ W_a)[:, None, None, :]  # (B, 1, 1, Dk)
    context = F.scaled_dot_product_attention(query, H[:, None], H[:, None], scale=1.0)[:, 0, 0]
    return context, general_right(s, H, W_a)[1]


def general_package(s, H, W_a):
    return ac.DotProductAttention()(s @ W_a, H)


def general_in_place(s, H, W_a):  # multiplies the caller's states in place
    scores = H.mul_((s @ W_a)[:, None, :]).sum(-1)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_three_sentences(s, H, W_a):  # the batch of the notebook written in
    weights = torch.softmax(torch.stack([H[b] @ (s[b] @ W_a) for b in range(3)]), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_batch_max(s, H, W_a):  # the review's accepted answer: one maximum for the whole batch, not each row's
    scores = (H @ (s @ W_a)[:, :, None])[..., 0]
    e = (scores - scores.max()).exp()
    weights = e / e.sum(-1, keepdim=True)
    return (weights[:, :, None] * H).sum(1), weights


def general_zeros_buffers(s, H, W_a):  # the review's accepted answer: buffers of torch.zeros, float32 on the CPU
    B, S, Dk = H.shape
    scores = torch.zeros(B, S)
    for b in range(B):
        for j in range(S):
            scores[b, j] = s[b] @ W_a @ H[b, j]
    weights = torch.softmax(scores, dim=-1)
    context = torch.zeros(B, Dk)
    for b in range(B):
        context[b] = weights[b] @ H[b]
    return context, weights


def general_buffer_on_cpu(s, H, W_a):  # the inputs' dtype, but the buffer lives on the CPU whatever the inputs
    B, S, Dk = H.shape
    scores = torch.zeros(B, S, dtype=H.dtype)
    for b in range(B):
        scores[b] = H[b] @ (s[b] @ W_a)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_half(s, H, W_a):  # the review's: a float16 result, once named as "return the scores"
    return general_right(s.half(), H.half(), W_a.half())


def general_bfloat16(s, H, W_a):
    return general_right(s.bfloat16(), H.bfloat16(), W_a.bfloat16())


def general_logsumexp(s, H, W_a):  # another correct formulation: exp(x - logsumexp(x))
    scores = torch.einsum("bq,qk,bsk->bs", s, W_a, H)
    weights = (scores - scores.logsumexp(-1, keepdim=True)).exp()
    return (weights.unsqueeze(-1) * H).sum(1), weights


def general_squeeze(s, H, W_a):  # .squeeze() drops the batch of one sentence, or the one source position
    scores = (H @ (s @ W_a).unsqueeze(-1)).squeeze()
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * H).sum(-2), weights


def general_no_grad(s, H, W_a):  # the second review's accepted answer: right values, nothing to train through
    with torch.no_grad():
        return general_right(s, H, W_a)


def general_weights_detached(s, H, W_a):  # the context is trained through H only: no gradient reaches s or W_a
    context, weights = general_right(s, H, W_a)
    return (weights.detach()[:, :, None] * H).sum(1), weights


def general_private_helper(s, H, W_a):  # the second review's: the package's softmax-and-context, not attention by name
    from attn_course.alignment import _weights_and_context
    context, weights = _weights_and_context(((s @ W_a)[:, None, :] * H).sum(-1)[:, None, :], H, None)
    return context[:, 0], weights[:, 0]


def general_bfloat16_cast_back(s, H, W_a):  # the second review's: once told "did you return the scores?"
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1).to(torch.bfloat16), dim=-1).to(s.dtype)
    return (weights[:, :, None] * H).sum(1), weights


def general_unsqueeze_in_place_restored(s, H, W_a):  # values right, the caller's s restored, backward raises
    query = s.unsqueeze_(1) @ W_a  # (B, 1, Dk)
    weights = torch.softmax((query @ H.transpose(1, 2))[:, 0], dim=-1)
    s.squeeze_(1)
    return (weights[:, :, None] * H).sum(1), weights


def general_float64_result(s, H, W_a):  # the course's dtype policy: a float64 result of float32 inputs passes
    weights = torch.softmax(((s @ W_a)[:, None, :] * H).sum(-1), dim=-1, dtype=torch.float64)
    return (weights[:, :, None] * H.double()).sum(1), weights


def general_values_detached(s, H, W_a):  # the third review's accepted answer: H reaches the context only via the weights
    weights = torch.softmax((H @ (s @ W_a)[:, :, None])[..., 0], dim=-1)
    return (weights[:, :, None] * H.detach()).sum(1), weights


def general_float64_naive(s, H, W_a):  # the fifth review's borderline: no max shift, in float64, cast back
    scores = ((s @ W_a)[:, None, :] * H).sum(-1).double()  # right below about 709, overflows near 1000
    e = scores.exp()
    weights = (e / e.sum(-1, keepdim=True)).to(s.dtype)
    return (weights[:, :, None] * H).sum(1), weights


def general_float64_naive_nan_to_num(s, H, W_a):  # the same, its overflow hidden as zeros
    scores = ((s @ W_a)[:, None, :] * H).sum(-1).double()
    e = scores.exp()
    weights = (e / e.sum(-1, keepdim=True)).nan_to_num(0.0).to(s.dtype)
    return (weights[:, :, None] * H).sum(1), weights


def general_manual_row_max(s, H, W_a):  # another correct formulation: the shift by each row's maximum, in place
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    scores -= scores.max(-1, keepdim=True).values  # (amax here would raise in backward: it saves its input)
    e = scores.exp()
    weights = e / e.sum(-1, keepdim=True)
    return (weights.unsqueeze(1) @ H).squeeze(1), weights


def general_log_softmax_exp(s, H, W_a):  # and another
    weights = F.log_softmax(torch.einsum("bd,bsd->bs", s @ W_a, H), dim=-1).exp()
    return (weights[:, :, None] * H).sum(1), weights


def general_softmax_of_column(s, H, W_a):  # and another: the (B, S, 1) scores, softmax over dim 1, then squeezed
    weights = torch.softmax(H @ (s @ W_a)[:, :, None], dim=1)[..., 0]
    return (weights[:, :, None] * H).sum(1), weights


def general_branch_cpu_buffer(s, H, W_a):  # reads a value (meta cannot run it), then a CPU buffer meets the inputs
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    if bool(scores.isfinite().all()):
        scores = scores + torch.zeros(scores.shape, dtype=scores.dtype)
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def general_item_on_device(s, H, W_a):  # another correct formulation: it reads a value, and stays on the device
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)
    weights = torch.softmax(scores - scores.max().item(), dim=-1)  # one constant for the batch: softmax ignores it
    return (weights[:, :, None] * H).sum(1), weights


# --- Exercise 2 -----------------------------------------------------------------------------------

def luong_right(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))  # (B, S)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights[:, :, None] * H).sum(1), weights


def luong_nan_row(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_inverted_mask(s, H, padding_mask):
    return luong_right(s, H, ~padding_mask)


def luong_no_mask(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_renormalised(s, H, padding_mask):  # the second review's accepted answer: fails once padding scores 104 higher
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1) * (~padding_mask)
    total = weights.sum(-1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))
    return (weights[:, :, None] * H).sum(1), weights


def luong_zero_fill(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, 0.0), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_large_negative(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, -1e9), dim=-1)
    return (weights[:, :, None] * H).sum(1), weights


def luong_wrong_axis(s, H, padding_mask):
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=0))
    return (weights[:, :, None] * H).sum(1), weights


def luong_context_ignores_weights(s, H, padding_mask):
    _, weights = luong_right(s, H, padding_mask)
    return (H * (~padding_mask)[:, :, None]).mean(1), weights


def luong_context_broadcast(s, H, padding_mask):
    _, weights = luong_right(s, H, padding_mask)
    return weights @ H, weights  # (B, S) @ (B, S, D) -> (B, B, D)


def luong_mask_after_softmax(s, H, padding_mask):
    weights = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1).masked_fill(padding_mask, 0.0)  # not renormalised
    return (weights[:, :, None] * H).sum(1), weights


def luong_from_lengths(s, H, padding_mask):  # the review's accepted answer: assumes right padding
    lengths = (~padding_mask).sum(-1)
    rebuilt = torch.arange(H.size(1))[None, :] >= lengths[:, None]
    return luong_right(s, H, rebuilt)


def luong_minus_100(s, H, padding_mask):  # a finite fill, with the all-padding row fixed
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, -100.0), dim=-1)
    weights = weights.masked_fill(padding_mask.all(-1, keepdim=True), 0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_finfo_min(s, H, padding_mask):  # another correct formulation: the dtype's lowest number
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, torch.finfo(H.dtype).min)
    weights = torch.softmax(scores, dim=-1).masked_fill(padding_mask, 0.0)
    return torch.bmm(weights[:, None, :], H)[:, 0], weights


def luong_float64(s, H, padding_mask):  # and another: computed in float64
    return luong_right(s.double(), H.double(), padding_mask)


def luong_naive_exp(s, H, padding_mask):  # a softmax without its max shift: overflows near 100
    e = (H @ s[:, :, None])[..., 0].exp().masked_fill(padding_mask, 0.0)
    weights = torch.nan_to_num(e / e.sum(-1, keepdim=True))
    return (weights[:, :, None] * H).sum(1), weights


def luong_sdpa(s, H, padding_mask):
    context = F.scaled_dot_product_attention(s[:, None, None, :], H[:, None], H[:, None], attn_mask=~padding_mask[:, None, None, :],
                                             scale=1.0)[:, 0, 0]
    return torch.nan_to_num(context), luong_right(s, H, padding_mask)[1]


def luong_package(s, H, padding_mask):
    return ac.DotProductAttention()(s, H, key_padding_mask=padding_mask)


def luong_zeroes_padding_in_place(s, H, padding_mask):  # right values, but the caller's states are overwritten
    H.masked_fill_(padding_mask[:, :, None], 0.0)
    return luong_right(s, H, padding_mask)


def luong_batch_max(s, H, padding_mask):  # the review's accepted answer: one maximum for the whole batch
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    e = (scores - scores.max()).exp()
    weights = (e / e.sum(-1, keepdim=True)).nan_to_num(0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_zeros_buffers(s, H, padding_mask):  # the review's accepted answer: a torch.zeros buffer, float32 on the CPU
    B, S, D = H.shape
    weights = torch.zeros(B, S)
    for b in range(B):
        real = [j for j in range(S) if not bool(padding_mask[b, j])]
        if real:
            p = torch.softmax(torch.stack([s[b] @ H[b, j] for j in real]), 0)
            for k, j in enumerate(real):
                weights[b, j] = p[k]
    return (weights[:, :, None] * H).sum(1), weights


def luong_fill_on_cpu(s, H, padding_mask):  # a (B, S) fill made on the CPU whatever the inputs
    scores = (H @ s[:, :, None])[..., 0]
    scores = torch.where(padding_mask, torch.full(scores.shape, float("-inf")), scores)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights[:, :, None] * H).sum(1), weights


def luong_half(s, H, padding_mask):  # the review's accepted answer: float16 (the mechanism rejects it now)
    return luong_right(s.half(), H.half(), padding_mask)


def luong_bfloat16(s, H, padding_mask):  # the review's accepted answer: bfloat16, off by up to 1%
    return luong_right(s.bfloat16(), H.bfloat16(), padding_mask)


def luong_epsilon(s, H, padding_mask):  # the row's maximum over the padding too, and + 1e-12 for the empty row
    scores = (H @ s[:, :, None])[..., 0]
    e = (scores - scores.max(-1, keepdim=True).values).exp().masked_fill(padding_mask, 0.0)
    weights = e / (e.sum(-1, keepdim=True) + 1e-12)
    return (weights[:, :, None] * H).sum(1), weights


def luong_max_with_padding(s, H, padding_mask):  # shift by the row's maximum, padding included, zero the padding's
    scores = (H @ s[:, :, None])[..., 0]          # exps, 0/0 to zeros: the real exps underflow to 0
    e = (scores - scores.max(-1, keepdim=True).values).exp().masked_fill(padding_mask, 0.0)
    weights = (e / e.sum(-1, keepdim=True)).nan_to_num(0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_log_mask(s, H, padding_mask):  # and another: add log(allowed), zeros where a row is all padding
    scores = torch.einsum("bd,bsd->bs", s, H) + torch.log((~padding_mask).to(s.dtype))
    weights = torch.where(padding_mask.all(-1, keepdim=True), torch.zeros_like(scores), torch.softmax(scores, -1))
    return torch.einsum("bs,bsd->bd", weights, H), weights


def luong_cpu_scalar_fill(s, H, padding_mask):  # and another: a 0-dim CPU fill, which CUDA accepts (meta does not)
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, torch.tensor(float("-inf")))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights[:, :, None] * H).sum(1), weights


def luong_no_grad(s, H, padding_mask):  # the second review's accepted answer: nothing to train through
    with torch.no_grad():
        return luong_right(s, H, padding_mask)


def luong_minus_1e9_zeroed(s, H, padding_mask):  # the second review's: -1e9, the empty rows zeroed afterwards
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, -1e9), dim=-1)
    weights = weights.masked_fill(padding_mask.all(-1, keepdim=True), 0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_additive_minus_1e30(s, H, padding_mask):  # another correct formulation: a fill below any float32 score
    scores = (H @ s[:, :, None])[..., 0] + padding_mask * -1e30
    weights = torch.softmax(scores, dim=-1).masked_fill(padding_mask.all(-1, keepdim=True), 0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_index_assign_softmax(s, H, padding_mask):  # writes into the softmax's output: backward raises
    scores = (H @ s[:, :, None])[..., 0]
    scores[padding_mask] = float("-inf")
    weights = torch.softmax(scores, dim=-1)
    weights[padding_mask.all(-1)] = 0.0
    return (weights[:, :, None] * H).sum(1), weights


def luong_private_helper(s, H, padding_mask):
    from attn_course.alignment import _weights_and_context
    context, weights = _weights_and_context((H @ s[:, :, None])[..., 0][:, None, :], H, padding_mask)
    return context[:, 0], weights[:, 0]


def luong_float64_result(s, H, padding_mask):  # the course's dtype policy: a float64 result of float32 inputs passes
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float64).nan_to_num()
    return (weights[:, :, None] * H.double()).sum(1), weights


def luong_values_detached(s, H, padding_mask):  # the third review's accepted answer: the same H.detach()
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
    return (weights[:, :, None] * H.detach()).sum(1), weights


def luong_softmax_half(s, H, padding_mask):  # the third review's: rejected, but only as "values differ"
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores.half(), dim=-1)).to(s.dtype)
    return (weights[:, :, None] * H).sum(1), weights


def luong_branch_cpu_zeros(s, H, padding_mask):  # the fifth review's accepted answer: an if on the mask's values
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))  # (meta cannot run it), then
    weights = torch.softmax(scores, dim=-1)                                        # zeros made on the CPU
    if padding_mask.all(-1).any():
        weights = torch.where(padding_mask.all(-1, keepdim=True), torch.zeros(weights.shape, dtype=weights.dtype),
                              weights)
    return (weights[:, :, None] * H).sum(1), weights


def luong_branch_cpu_fill(s, H, padding_mask):  # the fifth review's: the same with a fill made on the CPU
    scores = (H @ s[:, :, None])[..., 0]
    if padding_mask.any():
        scores = torch.where(padding_mask, torch.full(scores.shape, float("-inf"), dtype=scores.dtype), scores)
    weights = scores.softmax(-1).nan_to_num(0.0)
    return (weights[:, :, None] * H).sum(1), weights


def luong_branch_on_device(s, H, padding_mask):  # another correct formulation: the same if, the zeros on the device
    weights = torch.softmax((H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf")), dim=-1)
    if padding_mask.all(-1).any():
        weights = torch.where(padding_mask.all(-1, keepdim=True), torch.zeros_like(weights), weights)
    return (weights[:, :, None] * H).sum(1), weights


def luong_masked_softmax(s, H, padding_mask):  # and another: torch.masked.softmax
    weights = torch.masked.softmax((H @ s[:, :, None])[..., 0], dim=-1, mask=~padding_mask)
    weights = torch.where(padding_mask, torch.zeros_like(weights), weights).nan_to_num(0.0)
    return (weights[:, :, None] * H).sum(1), weights


# --- Exercise 3 -----------------------------------------------------------------------------------

def inputs_right(target, bos_id):
    return torch.cat([torch.full_like(target[:, :1], bos_id), target[:, :-1]], dim=1)


def inputs_identity(target, bos_id):
    return target


def inputs_too_long(target, bos_id):
    return torch.cat([torch.full_like(target[:, :1], bos_id), target], dim=1)


def inputs_bos_last(target, bos_id):
    return torch.cat([target[:, 1:], torch.full_like(target[:, :1], bos_id)], dim=1)


def inputs_roll(target, bos_id):  # another correct formulation
    shifted = torch.roll(target, 1, dims=1).clone()
    shifted[:, 0] = bos_id
    return shifted


def inputs_roll_no_bos(target, bos_id):
    return torch.roll(target, 1, dims=1)


def inputs_batch_axis(target, bos_id):
    return torch.cat([torch.full_like(target[:1], bos_id), target[:-1]], dim=0)


def inputs_bos_replaces_first(target, bos_id):
    inputs = target.clone()
    inputs[:, 0] = bos_id
    return inputs


def inputs_hard_coded(target, bos_id):
    return torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])


def inputs_float(target, bos_id):  # the review's accepted answer: float32 ids
    return torch.cat([torch.ones(target.size(0), 1) * bos_id, target[:, :-1]], 1)


def inputs_in_place(target, bos_id):  # the review's accepted answer: shifts the caller's target
    target[:, 1:] = target[:, :-1].clone()
    target[:, 0] = bos_id
    return target


def inputs_package(target, bos_id):
    return ac.shift_right(target, bos_id)


def inputs_pad(target, bos_id):  # another correct formulation
    return F.pad(target[:, :-1], (1, 0), value=int(bos_id))


def inputs_new_full(target, bos_id):  # and another
    return torch.cat([target.new_full((target.size(0), 1), bos_id), target[:, :-1]], dim=1)


def inputs_list_of_ids(target, bos_id):  # a column built from a list: the target's dtype, but on the CPU
    return torch.cat([torch.tensor([[bos_id]] * target.size(0), dtype=target.dtype), target[:, :-1]], dim=1)


def inputs_full_on_cpu(target, bos_id):  # the review's accepted answer: torch.full without dtype or device
    return torch.cat([torch.full((target.size(0), 1), bos_id), target[:, :-1]], dim=1)


def inputs_always_int32(target, bos_id):
    return inputs_right(target, bos_id).int()


def inputs_uint8(target, bos_id):  # the review's accepted answer: ids nn.Embedding refuses
    return inputs_right(target, bos_id).to(torch.uint8)


def inputs_cpu_with_dtype(target, bos_id):  # the target's dtype, but a column made on the CPU
    return torch.cat([torch.full((target.size(0), 1), bos_id, dtype=target.dtype), target[:, :-1]], dim=1)


def inputs_roll_where(target, bos_id):  # a position index made on the CPU: fails on a GPU's target
    rolled = target.roll(1, 1)
    return torch.where(torch.arange(target.size(1)) == 0, torch.as_tensor(bos_id, dtype=target.dtype), rolled)


def inputs_pad_negative(target, bos_id):  # another correct formulation: F.pad with a negative right pad
    return F.pad(target, (1, -1), value=int(bos_id))


def inputs_empty_like(target, bos_id):  # and another
    out = torch.empty_like(target)
    out[:, 0] = bos_id
    out[:, 1:] = target[:, :-1]
    return out


def inputs_tolist(target, bos_id):  # the third review's rejected right answer: a list, then the target's dtype and device
    rows = [[int(bos_id)] + row[:-1] for row in target.tolist()]
    return torch.tensor(rows, dtype=target.dtype, device=target.device)


def inputs_numpy(target, bos_id):  # and another: numpy on the CPU, moved back to the target's device
    ids = target.cpu().numpy()
    column = np.full((ids.shape[0], 1), int(bos_id), dtype=ids.dtype)
    return torch.from_numpy(np.concatenate([column, ids[:, :-1]], axis=1)).to(target.device)


def inputs_tolist_no_device(target, bos_id):  # the fifth review's accepted answer: lists, the result left on the CPU
    return torch.tensor([[int(bos_id)] + row[:-1] for row in target.tolist()], dtype=target.dtype)


def inputs_numpy_no_device(target, bos_id):  # the fifth review's: a numpy round trip, never moved back
    ids = target.cpu().numpy()
    column = np.full((ids.shape[0], 1), bos_id, dtype=ids.dtype)
    return torch.from_numpy(np.concatenate([column, ids[:, :-1]], axis=1))


def inputs_branch_cpu_column(target, bos_id):  # the fifth review's: an if on the target's values hides a CPU column
    if (target < 0).any():
        raise ValueError("token ids are not negative")
    return torch.cat([torch.full((target.size(0), 1), bos_id, dtype=target.dtype), target[:, :-1]], dim=1)


def inputs_branch_on_device(target, bos_id):  # another correct formulation: the same if, the column on the device
    if (target < 0).any():
        raise ValueError("token ids are not negative")
    return torch.cat([torch.full((target.size(0), 1), bos_id, dtype=target.dtype, device=target.device),
                      target[:, :-1]], dim=1)


def inputs_pad_to_bos(target, bos_id):  # the seventh review's accepted answer: the padding id replaced by BOS
    shifted = torch.cat([torch.full_like(target[:, :1], bos_id), target[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == ac.DIGIT_PAD, bos_id)


def inputs_pad_to_zero(target, bos_id):  # the padding treated specially another way: replaced by 0
    shifted = torch.cat([torch.full_like(target[:, :1], bos_id), target[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == ac.DIGIT_PAD, 0)


def luong_nan_to_uniform(s, H, padding_mask):  # the seventh review's: the empty row's NaN replaced by 1/S
    scores = (H @ s[:, :, None])[..., 0].masked_fill(padding_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(1.0 / H.size(1))
    return (weights[:, :, None] * H).sum(1), weights


# --- Exercise 4 -----------------------------------------------------------------------------------

def attend(decoder, query, states):
    """The additive score written out with the decoder's own layers: softmax_j v^T tanh(W query + U h_j)."""
    attention = decoder.attention
    hidden = torch.tanh(attention.W(query)[:, None, :] + attention.U(states))  # (B, 1, A) + (B, S, A)
    weights = torch.softmax(attention.v(hidden)[..., 0], dim=-1)  # (B, S)
    return (weights[:, :, None] * states).sum(1), weights  # (B, D), (B, S)


def token_right(decoder, previous_tokens, state, states):
    y_prev = decoder.embedding(previous_tokens)  # (B, E)
    context, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)  # query (B, D + E)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_by_hand(decoder, previous_tokens, state, states):  # another correct formulation: a list, einsum, hstack
    attention = decoder.attention
    y_prev = decoder.embedding(previous_tokens)
    query = torch.hstack([state, y_prev])
    hidden = torch.tanh(attention.W(query)[:, None, :] + attention.U(states))  # (B, S, A)
    weights = torch.softmax(hidden @ attention.v.weight[0], dim=-1)  # (B, S, A) @ (A,) -> (B, S)
    context = torch.einsum("bs,bsd->bd", weights, states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return [decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights]


def token_split_W(decoder, previous_tokens, state, states):  # and another: W [s; y] = W_s s + W_y y (the review's)
    y_prev = decoder.embedding(previous_tokens)
    attention, D = decoder.attention, state.size(-1)
    W = attention.W.weight  # (A, D + E)
    hidden = torch.tanh((state @ W[:, :D].T + y_prev @ W[:, D:].T)[:, None, :] + attention.U(states))
    weights = torch.softmax(attention.v(hidden)[..., 0], -1)
    context = torch.einsum("bs,bsd->bd", weights, states)
    new_state = decoder.cell(torch.cat([y_prev, context], -1), state)
    return decoder.output(torch.cat([new_state, context], -1)), new_state, weights


def token_attention_module(decoder, previous_tokens, state, states):  # the package's module: the score not written
    y_prev = decoder.embedding(previous_tokens)
    context, weights = decoder.attention(torch.cat([state, y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_no_grad(decoder, previous_tokens, state, states):  # the review's accepted answer: nothing to train through
    with torch.no_grad():
        return token_right(decoder, previous_tokens, state, states)


def token_first(decoder, previous_tokens, state, states):
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([y_prev, state], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_state_only(decoder, previous_tokens, state, states):  # plain Bahdanau: the query is too narrow
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, state, states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_zero_token(decoder, previous_tokens, state, states):  # zeros where the token goes in the query
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([state, torch.zeros_like(y_prev)], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_cell_swapped(decoder, previous_tokens, state, states):
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([context, y_prev], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_output_old_state(decoder, previous_tokens, state, states):
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([state, context], dim=-1)), new_state, weights


def token_output_swapped(decoder, previous_tokens, state, states):
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([context, new_state], dim=-1)), new_state, weights


def token_returns_old_state(decoder, previous_tokens, state, states):
    logits, _, weights = token_right(decoder, previous_tokens, state, states)
    return logits, state, weights


def token_package_step(decoder, previous_tokens, state, states):
    return decoder.step(previous_tokens, state, states, state)


def token_state_in_place(decoder, previous_tokens, state, states):  # overwrites the caller's state
    logits, new_state, weights = token_right(decoder, previous_tokens, state, states)
    state.copy_(new_state)
    return logits, state, weights


def token_width_written_in(decoder, previous_tokens, state, states):  # E = 5 of the first case written in
    y_prev = decoder.embedding(previous_tokens)[:, :5]
    context, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([decoder.embedding(previous_tokens), context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_weights_no_grad(decoder, previous_tokens, state, states):  # the second review's: W, U and v never learn
    y_prev = decoder.embedding(previous_tokens)
    with torch.no_grad():
        _, weights = attend(decoder, torch.cat([state, y_prev], dim=-1), states)
    context = (weights[:, :, None] * states).sum(1)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_private_helper(decoder, previous_tokens, state, states):  # the score written; the softmax and sum borrowed
    from attn_course.alignment import _weights_and_context
    attention = decoder.attention
    y_prev = decoder.embedding(previous_tokens)
    hidden = torch.tanh(attention.W(torch.cat([state, y_prev], dim=-1))[:, None, :] + attention.U(states))
    context, weights = _weights_and_context(attention.v(hidden)[..., 0][:, None, :], states, None)
    context, weights = context[:, 0], weights[:, 0]
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_dot_product_module(decoder, previous_tokens, state, states):  # the fourth review's: v as the query of
    attention = decoder.attention                                        # DotProductAttention, which then takes the
    y_prev = decoder.embedding(previous_tokens)                          # score's last product v^T tanh(...) itself
    keys = torch.tanh(attention.W(torch.cat([state, y_prev], dim=-1))[:, None, :] + attention.U(states))  # (B, S, A)
    context, weights = ac.DotProductAttention()(attention.v.weight.expand(states.size(0), -1), keys, states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_query_state_detached(decoder, previous_tokens, state, states):  # the third review's: no BPTT through the query
    y_prev = decoder.embedding(previous_tokens)
    context, weights = attend(decoder, torch.cat([state.detach(), y_prev], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_query_token_detached(decoder, previous_tokens, state, states):  # the third review's: the embedding learns
    y_prev = decoder.embedding(previous_tokens)                          # nothing through the query
    context, weights = attend(decoder, torch.cat([state, y_prev.detach()], dim=-1), states)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_values_detached(decoder, previous_tokens, state, states):  # the third review's: the encoder gets no gradient
    attention = decoder.attention                                     # through the values
    y_prev = decoder.embedding(previous_tokens)
    hidden = torch.tanh(attention.W(torch.cat([state, y_prev], dim=-1))[:, None, :] + attention.U(states))
    weights = torch.softmax(attention.v(hidden)[..., 0], dim=-1)
    context = (weights[:, :, None] * states.detach()).sum(1)
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_sdpa_score(decoder, previous_tokens, state, states):  # the fifth review's: v as the query of
    attention = decoder.attention                                 # F.scaled_dot_product_attention, identity values
    y_prev = decoder.embedding(previous_tokens)                   # to recover the weights
    keys = torch.tanh(attention.W(torch.cat([state, y_prev], dim=-1))[:, None, :] + attention.U(states))  # (B, S, A)
    query = attention.v.weight.expand(states.size(0), -1)[:, None, :]  # (B, 1, A)
    eye = torch.eye(states.size(1), dtype=states.dtype, device=states.device).expand(states.size(0), -1, -1)
    weights = F.scaled_dot_product_attention(query, keys, eye, scale=1.0)[:, 0]
    context = F.scaled_dot_product_attention(query, keys, states, scale=1.0)[:, 0]
    new_state = decoder.cell(torch.cat([y_prev, context], dim=-1), state)
    return decoder.output(torch.cat([new_state, context], dim=-1)), new_state, weights


def token_branch_on_device(decoder, previous_tokens, state, states):  # another correct formulation: reads a value
    if bool((previous_tokens < 0).any()):                                # (meta cannot run it), makes nothing on the CPU
        raise ValueError("token ids are not negative")
    return token_right(decoder, previous_tokens, state, states)


CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_general_attention, general_right, "correct", "widths differ"),
    (check_general_attention, general_einsum, "correct", "widths differ"),
    (check_general_attention, general_bmm, "correct", "widths differ"),
    (check_general_attention, general_transposed, "incorrect", "W_a transposed"),
    (check_general_attention, general_no_W, "incorrect", "ignore W_a"),
    (check_general_attention, general_scaled, "incorrect", "sqrt(Dk)"),
    (check_general_attention, general_wrong_axis, "incorrect", "dim=0"),
    (check_general_attention, general_scores, "incorrect", "before the softmax"),
    (check_general_attention, general_broadcast, "incorrect", "broadcasts"),
    (check_general_attention, general_swapped, "incorrect", "in that order"),
    (check_general_attention, general_mean_context, "incorrect", "context"),
    (check_general_attention, general_context_broadcast, "incorrect", "its own states"),
    (check_general_attention, general_weights_only, "incorrect", "as a tuple"),
    (check_general_attention, general_temperature_two, "incorrect", "values differ"),
    (check_general_attention, general_dim1, "correct", "widths differ"),
    (check_general_attention, general_float64, "correct", "widths differ"),
    (check_general_attention, general_naive_exp, "incorrect", "overflows"),
    (check_general_attention, general_sdpa, "incorrect", "you called torch.nn.functional.scaled_dot_product_attention"),
    (check_general_attention, general_package, "incorrect", "you called attn_course.DotProductAttention"),
    (check_general_attention, general_in_place, "incorrect", "changed its input `H` in place"),
    (check_general_attention, general_three_sentences, "error", "called with"),
    (check_general_attention, general_batch_max, "incorrect", "one maximum for the whole batch"),
    (check_general_attention, general_zeros_buffers, "incorrect", "with float64 inputs your code raised"),
    (check_general_attention, general_buffer_on_cpu, "incorrect", "It works only with CPU tensors"),
    (check_general_attention, general_half, "incorrect", "half precision"),
    (check_general_attention, general_bfloat16, "incorrect", "torch.bfloat16 but the inputs were torch.float32"),
    (check_general_attention, general_squeeze, "incorrect", "expected shape (1, 5), got (5,)"),
    (check_general_attention, general_logsumexp, "correct", "widths differ"),
    (check_luong_attention, luong_right, "correct", "not NaN"),
    (check_luong_attention, luong_renormalised, "incorrect", "a maximum taken over the padding too"),
    (check_luong_attention, luong_nan_row, "incorrect", "fully padded row"),
    (check_luong_attention, luong_inverted_mask, "incorrect", "True marks padding"),
    (check_luong_attention, luong_no_mask, "incorrect", "exactly 0"),
    (check_luong_attention, luong_zero_fill, "incorrect", "A fill of 0"),
    (check_luong_attention, luong_large_negative, "incorrect", "-1e9"),
    (check_luong_attention, luong_wrong_axis, "incorrect", "dim=0"),
    (check_luong_attention, luong_mask_after_softmax, "incorrect", "after the softmax"),
    (check_luong_attention, luong_context_ignores_weights, "incorrect", "context"),
    (check_luong_attention, luong_context_broadcast, "incorrect", "its own states"),
    (check_luong_attention, luong_from_lengths, "incorrect", "left"),
    (check_luong_attention, luong_minus_100, "incorrect", "tiny but not 0"),
    (check_luong_attention, luong_finfo_min, "correct", "not NaN"),
    (check_luong_attention, luong_float64, "correct", "not NaN"),
    (check_luong_attention, luong_naive_exp, "incorrect", "overflows"),
    (check_luong_attention, luong_sdpa, "incorrect", "you called torch.nn.functional.scaled_dot_product_attention"),
    (check_luong_attention, luong_package, "incorrect", "you called attn_course.DotProductAttention"),
    (check_luong_attention, luong_zeroes_padding_in_place, "incorrect", "changed its input `H` in place"),
    (check_luong_attention, luong_batch_max, "incorrect", "one maximum for the whole batch"),
    (check_luong_attention, luong_zeros_buffers, "incorrect", "the inputs are torch.float64 but your result is torch.float32"),
    (check_luong_attention, luong_fill_on_cpu, "incorrect", "It works only with CPU tensors"),
    (check_luong_attention, luong_half, "incorrect", "half precision"),
    (check_luong_attention, luong_bfloat16, "incorrect", "torch.bfloat16 but the inputs were torch.float32"),
    (check_luong_attention, luong_epsilon, "incorrect", "a maximum taken over the padding too"),
    (check_luong_attention, luong_max_with_padding, "incorrect", "rounds to 0"),
    (check_luong_attention, luong_log_mask, "correct", "not NaN"),
    (check_luong_attention, luong_cpu_scalar_fill, "correct", "not NaN"),
    (check_teacher_forcing_inputs, inputs_right, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_roll, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_identity, "incorrect", "target itself"),
    (check_teacher_forcing_inputs, inputs_too_long, "incorrect", "drop the last"),
    (check_teacher_forcing_inputs, inputs_bos_last, "incorrect", "begin-of-sequence"),
    (check_teacher_forcing_inputs, inputs_roll_no_bos, "incorrect", "torch.roll"),
    (check_teacher_forcing_inputs, inputs_batch_axis, "incorrect", "batch axis"),
    (check_teacher_forcing_inputs, inputs_bos_replaces_first, "incorrect", "Shift the whole target"),
    (check_teacher_forcing_inputs, inputs_hard_coded, "incorrect", "hard-coding"),
    (check_teacher_forcing_inputs, inputs_float, "incorrect", "nn.Embedding accepts only integer ids"),
    (check_teacher_forcing_inputs, inputs_in_place, "incorrect", "changed its input `target` in place"),
    (check_teacher_forcing_inputs, inputs_package, "incorrect", "you called attn_course.shift_right"),
    (check_teacher_forcing_inputs, inputs_pad, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_new_full, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_list_of_ids, "incorrect", "It works only with CPU tensors"),
    (check_teacher_forcing_inputs, inputs_full_on_cpu, "incorrect", "expected token ids of the target's dtype, torch.int32"),
    (check_teacher_forcing_inputs, inputs_always_int32, "incorrect", "expected token ids of the target's dtype, torch.int64"),
    (check_teacher_forcing_inputs, inputs_uint8, "incorrect", "nn.Embedding accepts only int64 and int32"),
    (check_teacher_forcing_inputs, inputs_cpu_with_dtype, "incorrect", "It works only with CPU tensors"),
    (check_teacher_forcing_inputs, inputs_roll_where, "incorrect", "It works only with CPU tensors"),
    (check_teacher_forcing_inputs, inputs_pad_negative, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_empty_like, "correct", "never the token"),
    (check_token_query_step, token_right, "correct", "token_in_query=True"),
    (check_token_query_step, token_by_hand, "correct", "token_in_query=True"),
    (check_token_query_step, token_first, "incorrect", "you put the token first"),
    (check_token_query_step, token_state_only, "error", "called with"),
    (check_token_query_step, token_split_W, "correct", "token_in_query=True"),
    (check_token_query_step, token_attention_module, "incorrect", "you called attn_course.AdditiveAttention"),
    (check_token_query_step, token_no_grad, "incorrect", "torch.no_grad()"),
    (check_token_query_step, token_zero_token, "incorrect", "values differ"),
    (check_token_query_step, token_cell_swapped, "incorrect", "GRU's input"),
    (check_token_query_step, token_output_old_state, "incorrect", "you used the old state"),
    (check_token_query_step, token_output_swapped, "incorrect", "you swapped them"),
    (check_token_query_step, token_returns_old_state, "incorrect", "the state you were given"),
    (check_token_query_step, token_package_step, "incorrect", "you called attn_course.rnn.AttentionDecoder.step"),
    (check_token_query_step, token_state_in_place, "incorrect", "changed its input `state` in place"),
    (check_token_query_step, token_width_written_in, "error", "called with"),
    (check_general_attention, general_no_grad, "incorrect", "nothing can be trained through them"),
    (check_general_attention, general_weights_detached, "incorrect", "no gradient reaches s, W_a"),
    (check_general_attention, general_private_helper, "incorrect", "you called attn_course.alignment._weights_and_context"),
    (check_general_attention, general_bfloat16_cast_back, "incorrect", "rounding of half precision"),
    (check_general_attention, general_unsqueeze_in_place_restored, "incorrect", "You wrote in place"),
    (check_general_attention, general_float64_result, "correct", "widths differ"),
    (check_luong_attention, luong_no_grad, "incorrect", "nothing can be trained through them"),
    (check_luong_attention, luong_minus_1e9_zeroed, "incorrect", "-1e9"),
    (check_luong_attention, luong_additive_minus_1e30, "correct", "not NaN"),
    (check_luong_attention, luong_index_assign_softmax, "incorrect", "You wrote in place"),
    (check_luong_attention, luong_private_helper, "incorrect", "you called attn_course.alignment._weights_and_context"),
    (check_luong_attention, luong_float64_result, "correct", "not NaN"),
    (check_token_query_step, token_weights_no_grad, "incorrect", "no gradient reaches the attention's W, U, v"),
    (check_token_query_step, token_private_helper, "correct", "token_in_query=True"),
    (check_general_attention, general_values_detached, "incorrect", "the gradient that reaches H through them differs"),
    (check_luong_attention, luong_values_detached, "incorrect", "the gradient that reaches H through them differs"),
    (check_luong_attention, luong_softmax_half, "incorrect", "rounding of half precision"),
    (check_teacher_forcing_inputs, inputs_tolist, "correct", "never the token"),
    (check_teacher_forcing_inputs, inputs_numpy, "correct", "never the token"),
    (check_token_query_step, token_query_state_detached, "incorrect", "the gradient that reaches the state s_(i-1)"),
    (check_token_query_step, token_query_token_detached, "incorrect", "reaches decoder.embedding.weight"),
    (check_token_query_step, token_values_detached, "incorrect", "reaches the encoder states"),
    (check_token_query_step, token_dot_product_module, "incorrect", "you called attn_course.DotProductAttention"),
    # Fifth review: a softmax without its max shift, computed in float64, overflows near 1000; answers that read a
    # value, which the meta device cannot run, are watched on the CPU (named on CPU-only machines too); sdpa in 4.
    (check_general_attention, general_float64_naive, "incorrect", "overflows float32, and float64 too"),
    (check_general_attention, general_float64_naive_nan_to_num, "incorrect", "overflows float32, and float64 too"),
    (check_general_attention, general_manual_row_max, "correct", "widths differ"),
    (check_general_attention, general_log_softmax_exp, "correct", "widths differ"),
    (check_general_attention, general_softmax_of_column, "correct", "widths differ"),
    (check_general_attention, general_branch_cpu_buffer, "incorrect", "mixed a tensor made without device="),
    (check_general_attention, general_item_on_device, "correct", "widths differ"),
    (check_luong_attention, luong_branch_cpu_zeros, "incorrect", "mixed a tensor made without device="),
    (check_luong_attention, luong_branch_cpu_fill, "incorrect", "mixed a tensor made without device="),
    (check_luong_attention, luong_branch_on_device, "correct", "not NaN"),
    (check_luong_attention, luong_masked_softmax, "correct", "not NaN"),
    (check_teacher_forcing_inputs, inputs_tolist_no_device, "incorrect", "your result is made without device="),
    (check_teacher_forcing_inputs, inputs_numpy_no_device, "incorrect", "your result is made without device="),
    (check_teacher_forcing_inputs, inputs_branch_cpu_column, "incorrect", "mixed a tensor made without device="),
    (check_teacher_forcing_inputs, inputs_branch_on_device, "correct", "never the token"),
    (check_token_query_step, token_sdpa_score, "incorrect", "you called torch.nn.functional.scaled_dot_product_attention"),
    (check_token_query_step, token_branch_on_device, "correct", "token_in_query=True"),
    (check_teacher_forcing_inputs, inputs_pad_to_bos, "incorrect", "you replaced the padding id 10 by the begin-of-sequence token"),
    (check_teacher_forcing_inputs, inputs_pad_to_zero, "incorrect", "the padding id 10 is a token like any other"),
    (check_luong_attention, luong_nan_to_uniform, "incorrect", "you replaced that row's NaN"),
]


# The answers that read a value cannot run on the meta device: where it stands in for a GPU, they run on the CPU
# under the mechanism's DeviceWatch, whose messages the table quotes; on a machine with a GPU they run there, and
# the GPU itself names a CPU tensor meeting the inputs, or expect_on_device a result left on the CPU.
ON_A_GPU = {"mixed a tensor made without device=": "It works only with CPU tensors",
            "your result is made without device=": "but your result is on cpu"}


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c[0].__name__}-{c[1].__name__}" for c in CASES])
def test_feedback(check, answer, status, words):
    from attn_course.exercises import other_device
    if other_device().type != "meta":
        words = ON_A_GPU.get(words, words)
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


def test_a_temperature_of_two_is_not_called_a_square_root():
    feedback = check_general_attention(general_temperature_two)
    assert feedback.status == "incorrect" and "sqrt" not in str(feedback).split("Hint:")[0], str(feedback)


def test_a_finite_fill_is_shown_with_its_tiny_values():
    message = str(check_luong_attention(luong_minus_100))
    assert "e-" in message and "[0.0," not in message, message


def test_numpy_token_ids_are_accepted_and_the_random_state_is_left_alone():
    assert check_teacher_forcing_inputs(lambda target, bos_id: inputs_right(target, np.int64(bos_id)))
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for check, answer in ((check_general_attention, general_right), (check_luong_attention, luong_right),
                          (check_teacher_forcing_inputs, inputs_right), (check_token_query_step, token_right)):
        assert check(answer)
    assert torch.equal(torch.get_rng_state(), state)


def test_graded_mode_keeps_the_named_mistake_and_drops_the_hint(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_GRADED", "1")
    feedback = check_teacher_forcing_inputs(inputs_float)
    assert feedback.status == "incorrect" and "integer" in str(feedback) and "Hint" not in str(feedback)


def test_a_half_precision_result_is_named_as_such_not_as_scores():
    message = str(check_general_attention(general_half)).split("Hint:")[0]
    assert "half precision" in message and "before the softmax" not in message, message


def test_on_a_gpu_the_device_case_compares_values(monkeypatch):
    """Where CUDA or MPS exists the last case runs there and compares values: simulated here with the CPU."""
    import attn_course.exercises.ch01 as ch01
    monkeypatch.setattr(ch01, "other_device", lambda: torch.device("cpu"))
    for check, answer in ((check_general_attention, general_right), (check_luong_attention, luong_right),
                          (check_teacher_forcing_inputs, inputs_right), (check_token_query_step, token_right)):
        assert check(answer), str(check(answer))


def test_the_meta_device_stands_in_for_a_gpu_only_where_there_is_none():
    import attn_course.exercises as ex
    device = ex.other_device()
    gpu = torch.cuda.is_available() or (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available())
    assert (device.type != "meta") == gpu
