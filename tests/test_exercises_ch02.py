"""The exercise checks of chapter 02: for each exercise, the right answer written two ways and a table
of the wrong answers students plausibly write, each rejected with a message that names the mistake."""

import math
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.functional import softmax as softmax_imported_by_name

import attn_course as ac

from attn_course.exercises.ch02 import (
    check_attention_without_self,
    check_batched_self_attention,
    check_cosine_self_attention,
    check_shuffled_attention,
    check_stable_softmax,
)

CHECKS = [check_stable_softmax, check_batched_self_attention, check_attention_without_self, check_cosine_self_attention,
          check_shuffled_attention]


def scaffold(*args):
    ...  # the cell as handed out


def crashes(*args):
    raise RuntimeError("shapes do not match")


# --- Exercise 1: a softmax that does not overflow -------------------------------------------------

def softmax_right(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_logsumexp(s):  # log_softmax(s).exp() written out: logsumexp subtracts the maximum for the student
    return torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))


def softmax_logsumexp_method(s):  # the same through the Tensor method
    return (s - s.logsumexp(-1, keepdim=True)).exp()


def softmax_amax(s):  # and another
    shifted = s - s.amax(dim=-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(-1, keepdim=True)


def softmax_naive(s):
    return torch.exp(s) / torch.exp(s).sum(dim=-1, keepdim=True)


def softmax_global_max(s):
    e = torch.exp(s - s.max())
    return e / e.sum(dim=-1, keepdim=True)


def softmax_columns(s):
    e = torch.exp(s - s.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


def softmax_dim1(s):
    e = torch.exp(s - s.max(dim=1, keepdim=True).values)
    return e / e.sum(dim=1, keepdim=True)


def softmax_no_keepdim_max(s):
    e = torch.exp(s - s.max(dim=-1).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_no_keepdim_sum(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1)


def softmax_subtract_min(s):
    e = torch.exp(s - s.min(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_clamped(s):
    e = torch.exp(s.clamp(-80, 80))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_library(s):
    return torch.softmax(s, dim=-1)


def softmax_library_method(s):
    return s.softmax(-1)


def softmax_functional(s):
    return F.softmax(s, dim=-1)


def softmax_global_sum(s):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum()


# The answers the independent review found accepted (reviews/chapters-01-02.md), and other routes to a
# library softmax: all rejected by name now.
def softmax_log_softmax_exp(s):
    return torch.log_softmax(s, -1).exp()


def softmax_functional_log_softmax_exp(s):
    return F.log_softmax(s, dim=-1).exp()


def softmax_method_log_softmax_exp(s):
    return s.log_softmax(-1).exp()


def softmax_private(s):
    return torch._softmax(s, -1, False)


def softmax_module(s):
    return nn.Softmax(dim=-1)(s)


def softmax_special(s):
    return torch.special.softmax(s, -1)


def softmax_aten(s):
    return torch.ops.aten._softmax(s, -1, False)


def softmax_alias(s):
    return softmax_imported_by_name(s, dim=-1)


def softmax_package(s):
    return ac.online_softmax(s)


def softmax_hidden_in_try(s):
    try:
        return torch.softmax(s, -1)
    finally:
        pass


def softmax_in_place(s):  # right values, but the caller's scores are overwritten
    s -= s.max(-1, keepdim=True).values
    e = torch.exp(s)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_in_place_on_a_copy(s):  # another correct formulation: in place, on its own copy
    s = s.clone()
    s -= s.amax(-1, keepdim=True)
    s.exp_()
    return s / s.sum(dim=-1, keepdim=True)


def softmax_float64(s):  # another correct formulation: computed in float64
    d = s.double()
    e = torch.exp(d - d.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def softmax_matrix_only(s):  # right for (N, S), wrong for (B, L, S): the max over axis 1
    e = torch.exp(s - s.max(dim=1, keepdim=True).values)
    return e / e.sum(dim=1, keepdim=True)


def softmax_half(s):  # the shift is right, but computed in float16
    e = torch.exp((s - s.amax(-1, keepdim=True)).half())
    return (e / e.sum(-1, keepdim=True)).float()


# The answers the second review found accepted (reviews/chapter-02.md): a library softmax hidden inside another
# library function.
def softmax_through_sdpa(s):  # identity keys and values: the attention weights are softmax(s)
    S = s.size(-1)
    eye = torch.eye(S, dtype=s.dtype).expand(*s.shape[:-1], S, S)
    return F.scaled_dot_product_attention(s.unsqueeze(-2), eye, eye, scale=1.0).squeeze(-2)


def softmax_through_cross_entropy(s):  # exp(-cross_entropy) with every target is the softmax
    flat = s.reshape(-1, s.size(-1))
    n, S = flat.shape
    columns = [torch.exp(-F.cross_entropy(flat, torch.full((n,), j), reduction="none")) for j in range(S)]
    return torch.stack(columns, -1).reshape(s.shape)


def softmax_categorical(s):
    return torch.distributions.Categorical(logits=s).probs


def softmax_normalize(s):  # another correct formulation: F.normalize with p=1
    return F.normalize(torch.exp(s - s.amax(-1, keepdim=True)), p=1, dim=-1)


# --- Exercise 2: simple self-attention for a batch ------------------------------------------------

def batched_right(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)  # (B, T, T)
    return w @ x, w


def batched_einsum(x):  # another correct formulation
    w = torch.softmax(torch.einsum("bte,bse->bts", x, x), dim=-1)
    return torch.einsum("bts,bse->bte", w, x), w


def batched_bmm_permute(x):  # and another
    w = torch.softmax(torch.bmm(x, x.permute(0, 2, 1)), dim=2)
    return torch.bmm(w, x), w


def batched_dot_T(x):
    w = torch.softmax(x @ x.permute(2, 1, 0), dim=-1)  # what x.T does to a 3-D tensor (deprecated there)
    return w @ x, w


def batched_wrong_axis(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=1)
    return w @ x, w


def batched_over_batch(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=0)
    return w @ x, w


def batched_weights_only(x):
    return torch.softmax(x @ x.transpose(-2, -1), dim=-1)


def batched_swapped(x):
    context, weights = batched_right(x)
    return weights, context


def batched_no_softmax(x):
    s = x @ x.transpose(-2, -1)
    return s @ x, s


def batched_first_only(x):
    w = torch.softmax(x[0] @ x[0].T, dim=-1)
    return (w @ x[0]).expand_as(x), w.expand(x.size(0), -1, -1)


def batched_package(x):
    return ac.simple_self_attention(x)


def batched_sdpa(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return F.scaled_dot_product_attention(x, x, x, scale=1.0), w


def batched_hard_coded_batch(x):
    w = torch.softmax(torch.stack([x[0] @ x[0].T, x[1] @ x[1].T]), dim=-1)  # B = 2 written in
    return w @ x, w


def batched_centres_in_place(x):
    x -= x.mean(dim=-1, keepdim=True)  # "for stability", on the caller's tensor
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w @ x, w


def batched_list(x):  # another correct formulation: a list instead of a tuple
    return list(batched_right(x))


def batched_context_wrong_order(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w.transpose(-2, -1) @ x, w


def batched_python_loop(x):  # right values, but one sentence at a time
    w = torch.stack([torch.softmax(x[b] @ x[b].T, dim=-1) for b in range(x.shape[0])])
    return w @ x, w


def batched_unbind_loop(x):  # the same loop over x.unbind(0)
    pairs = [(torch.softmax(s @ s.T, -1) @ s, torch.softmax(s @ s.T, -1)) for s in x.unbind(0)]
    return torch.stack([c for c, _ in pairs]), torch.stack([w for _, w in pairs])


def batched_vmap(x):  # another correct formulation: vmap runs the one-sentence code on the whole batch at once
    def one(s):
        w = torch.softmax(s @ s.T, dim=-1)
        return w @ s, w
    return torch.vmap(one)(x)


def batched_mT(x):  # and another
    w = torch.softmax(x @ x.mT, dim=-1)
    return w @ x, w


# --- Exercise 3: attention that skips itself -------------------------------------------------------

def without_self_right(x):
    T = x.size(-2)
    scores = (x @ x.transpose(-2, -1)).masked_fill(torch.eye(T, dtype=torch.bool, device=x.device), float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


def without_self_renormalised(x):  # zero the diagonal, then renormalise: 0 / 0 where the own score dominates
    keep = ~torch.eye(x.size(-2), dtype=torch.bool, device=x.device)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1) * keep
    w = w / w.sum(dim=-1, keepdim=True)
    return w @ x, w


def without_self_renormalised_float_eye(x):  # the same with a float32 identity: float16 inputs crash
    T = x.size(-2)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1) * (1 - torch.eye(T))
    w = w / w.sum(dim=-1, keepdim=True)
    return w @ x, w


def without_self_plain(x):
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1)
    return w @ x, w


def without_self_zero_score(x):
    T = x.size(-2)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(torch.eye(T, dtype=torch.bool), 0.0), dim=-1)
    return w @ x, w


def without_self_after_softmax(x):
    T = x.size(-2)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1).masked_fill(torch.eye(T, dtype=torch.bool), 0.0)
    return w @ x, w


def without_self_anti_diagonal(x):
    T = x.size(-2)
    anti = torch.eye(T, dtype=torch.bool).flip(-1)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(anti, float("-inf")), dim=-1)
    return w @ x, w


def without_self_causal(x):
    T = x.size(-2)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # the other mask of the course's chapters
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(future, float("-inf")), dim=-1)
    return w @ x, w


def without_self_inverted(x):
    T = x.size(-2)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(~torch.eye(T, dtype=torch.bool), float("-inf")), dim=-1)
    return w @ x, w


def without_self_old_context(x):
    _, w = without_self_right(x)
    return torch.softmax(x @ x.transpose(-2, -1), dim=-1) @ x, w


def without_self_T_written_in(x):
    scores = (x @ x.transpose(-2, -1)).masked_fill(torch.eye(5, dtype=torch.bool), float("-inf"))  # T = 5
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


def without_self_in_place(x):
    scores = x @ x.transpose(-2, -1)
    scores.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))  # in place on its own scores: fine
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


def without_self_batch_axis(x):
    n = x.size(0)  # right for one sentence (T, E), wrong for a batch (B, T, E)
    scores = (x @ x.transpose(-2, -1)).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ x, w


# The answers the second review found accepted (reviews/chapter-02.md), and their relatives.
def _itself(x):
    return torch.eye(x.size(-2), dtype=torch.bool, device=x.device)


def without_self_fill(value):
    def answer(x):
        w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(_itself(x), value), dim=-1)
        return w @ x, w
    answer.__name__ = f"without_self_fill_{value:g}".replace("-", "minus_").replace("+", "")
    return answer


def without_self_penalty(x):  # subtracts 50 from each token's score with itself
    w = torch.softmax(x @ x.transpose(-2, -1) - 50.0 * _itself(x).to(x.dtype), dim=-1)
    return w @ x, w


def without_self_finfo_float32(x):  # the smallest float32 written in: float16 has no such number
    scores = x @ x.transpose(-2, -1)
    w = torch.softmax(scores.masked_fill(_itself(x), torch.finfo(torch.float32).min), dim=-1)
    return w @ x, w


def without_self_finfo(x):  # another correct formulation: the smallest number of the scores' own dtype
    scores = x @ x.transpose(-2, -1)
    w = torch.softmax(scores.masked_fill(_itself(x), torch.finfo(scores.dtype).min), dim=-1)
    return w @ x, w


def without_self_where(x):  # and another
    w = torch.softmax(torch.where(_itself(x), float("-inf"), x @ x.transpose(-2, -1)), dim=-1)
    return w @ x, w


def without_self_positions(x):  # and another: compare the query's index with the key's
    i = torch.arange(x.size(-2), device=x.device)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(i[:, None] == i[None, :], float("-inf")), dim=-1)
    return w @ x, w


def without_self_eye_times_inf(x):  # 0 * -inf is NaN off the diagonal
    w = torch.softmax(x @ x.transpose(-2, -1) + torch.eye(x.size(-2)) * float("-inf"), dim=-1)
    return w @ x, w


def without_self_same_vector(x):  # hides every token equal to the query, not the query's own position
    same = (x.unsqueeze(-2) == x.unsqueeze(-3)).all(-1)  # (..., T, T)
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(same, float("-inf")), dim=-1)
    return w @ x, w


def without_self_cpu_mask(x):  # the mask is made on the CPU whatever x's device
    w = torch.softmax((x @ x.transpose(-2, -1)).masked_fill(torch.eye(x.size(-2), dtype=torch.bool),
                                                           float("-inf")), dim=-1)
    return w @ x, w


def without_self_diag_embed_float32(x):  # a float32 matrix of -inf on the diagonal, added to the scores
    T = x.size(-2)
    minus_inf = torch.diag_embed(torch.full((T,), float("-inf"), device=x.device)).nan_to_num(nan=0.0, posinf=0.0)
    w = torch.softmax(x @ x.transpose(-2, -1) + minus_inf, dim=-1)
    return w @ x, w


def without_self_renormalised_nan_patched(x):  # zero after the softmax, renormalise, NaN rows made uniform
    T = x.size(-2)
    eye = torch.eye(T, dtype=torch.bool, device=x.device)
    w = torch.softmax(x @ x.transpose(-2, -1), dim=-1).masked_fill(eye, 0)
    w = w / w.sum(-1, keepdim=True)
    w = torch.nan_to_num(w, nan=1.0 / (T - 1)).masked_fill(eye, 0)
    return w @ x, w


# --- Exercise 4: cosine-similarity attention ------------------------------------------------------

def cosine_right(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_normalize(x, temperature):  # another correct formulation
    unit = F.normalize(x, dim=-1)
    w = F.softmax(torch.einsum("...te,...se->...ts", unit, unit) / temperature, dim=-1)
    return w @ x, w


def cosine_similarity_fn(x, temperature):  # and another
    scores = F.cosine_similarity(x.unsqueeze(-2), x.unsqueeze(-3), dim=-1)  # (..., T, T)
    w = torch.softmax(scores / temperature, dim=-1)
    return w @ x, w


def cosine_not_normalised(x, temperature):
    w = torch.softmax(x @ x.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_per_feature(x, temperature):
    unit = x / x.norm(dim=-2, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_times_temperature(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) * temperature, dim=-1)
    return w @ x, w


def cosine_no_temperature(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1), dim=-1)
    return w @ x, w


def cosine_wrong_axis(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-2)
    return w @ x, w


def cosine_unit_context(x, temperature):
    unit = x / x.norm(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ unit, w


def cosine_fixed_temperature(x, temperature):
    return cosine_right(x, 0.5)


def cosine_loose_epsilon(x, temperature):  # a guard against division by zero large enough to show
    unit = x / (x.norm(dim=-1, keepdim=True) + 1e-3)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_clamped_epsilon(eps):  # F.normalize's clamp max(norm, eps): changes only vectors shorter than eps
    def cosine_normalize_eps(x, temperature):
        unit = F.normalize(x, dim=-1, eps=eps)
        w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
        return w @ x, w
    cosine_normalize_eps.__name__ = f"cosine_normalize_eps_{eps:g}"
    return cosine_normalize_eps


def cosine_norm_clamped(x, temperature):  # the same clamp written out
    unit = x / x.norm(dim=-1, keepdim=True).clamp(min=0.1)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_normalize_tiny_eps(x, temperature):  # another correct formulation: a guard far below any length
    unit = F.normalize(x, dim=-1, eps=1e-9)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_clamp_min_1e3(x, temperature):  # (fifth review: accepted) a guard of 1e-3, above the short token's length
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-3)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_normalises_in_place(x, temperature):
    x /= x.norm(dim=-1, keepdim=True)
    w = torch.softmax(x @ x.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


def cosine_squared_norm(x, temperature):
    unit = x / (x * x).sum(dim=-1, keepdim=True)
    w = torch.softmax(unit @ unit.transpose(-2, -1) / temperature, dim=-1)
    return w @ x, w


# --- Exercise 5: shuffle the words ------------------------------------------------------------------

def shuffled_right(context, weights, order):
    return context[order], weights[order][:, order]


def shuffled_permutation_matrix(context, weights, order):  # another correct formulation
    P = torch.eye(weights.size(0), dtype=weights.dtype)[torch.as_tensor(order)]  # (T, T): row k picks token order[k]
    return P @ context, P @ weights @ P.T


def shuffled_index_select(context, weights, order):  # and another
    index = torch.as_tensor(order, dtype=torch.long)
    return context.index_select(0, index), weights.index_select(0, index).index_select(1, index)


def shuffled_rows_only(context, weights, order):
    return context[order], weights[order]


def shuffled_columns_only(context, weights, order):
    return context[order], weights[:, order]


def shuffled_inverse(context, weights, order):
    inverse = torch.argsort(torch.as_tensor(order))
    return context[inverse], weights[inverse][:, inverse]


def shuffled_unchanged(context, weights, order):
    return context, weights


def shuffled_context_inverse(context, weights, order):
    return context[torch.argsort(torch.as_tensor(order))], weights[order][:, order]


def shuffled_swapped(context, weights, order):
    return weights[order][:, order], context[order]


def shuffled_in_place(context, weights, order):  # right values, written over the caller's tensors
    weights[:] = weights[order][:, order]
    context[:] = context[order]
    return context, weights


def shuffled_T_written_in(context, weights, order):
    index = torch.as_tensor(order)[:5]
    return context[index], weights[index][:, index]


def shuffled_package(context, weights, order):  # recomputes attention from the context vectors: not the same thing
    return ac.simple_self_attention(context[order])



def shuffled_grid(context, weights, order):  # another correct formulation: an open grid of indices
    index = torch.as_tensor(order, dtype=torch.long)
    return context[index], weights[index[:, None], index[None, :]]


def shuffled_recompute(context, weights, order):  # recovers x from context = weights @ x, then attends again
    x = torch.linalg.solve(weights.double(), context.double()).float()
    xs = x[torch.as_tensor(order, dtype=torch.long)]
    w = torch.softmax(xs @ xs.T, dim=-1)
    return w @ xs, w


def shuffled_recompute_exp(context, weights, order):  # the same with a softmax written out
    x = torch.linalg.solve(weights.double(), context.double()).float()
    xs = x[torch.as_tensor(order, dtype=torch.long)]
    e = (xs @ xs.T - (xs @ xs.T).amax(-1, keepdim=True)).exp()
    w = e / e.sum(-1, keepdim=True)
    return w @ xs, w

def batched_numpy_loop(x):  # the loop moved to numpy, where the count of torch calls does not see it
    import numpy as np
    weights = []
    for xi in x.detach().numpy():
        s = xi @ xi.T
        e = np.exp(s - s.max(-1, keepdims=True))
        weights.append(e / e.sum(-1, keepdims=True))
    w = torch.from_numpy(np.stack(weights))
    return w @ x, w


def batched_list_loop(x):  # the same loop over Python lists
    rows = x.tolist()
    w = torch.stack([torch.softmax(torch.tensor(r) @ torch.tensor(r).T, dim=-1) for r in rows])
    return w @ x, w


def without_self_upcast(x):  # computes in float32 whatever the input: float16 in, float32 out
    return without_self_right(x.float())


def without_self_upcast64(x):  # the same in float64
    return without_self_right(x.double())


def without_self_half_weights_only(x):  # context in float32, weights cast back to the input's dtype
    context, w = without_self_right(x.float())
    return context, w.to(x.dtype)


def without_self_scaled_penalty(x):  # a finite penalty scaled to the scores: exp(-100) is a denormal, not 0
    scores = x @ x.transpose(-2, -1)
    w = torch.softmax(scores - _itself(x).to(x.dtype) * (4 * scores.detach().abs().amax() + 100), dim=-1)
    return w @ x, w


def without_self_naive_softmax(x):  # masked with -inf, then the naive softmax of section 4 (no maximum subtracted)
    e = torch.exp((x @ x.transpose(-2, -1)).masked_fill(_itself(x), float("-inf")))
    w = e / e.sum(-1, keepdim=True)
    return w @ x, w


def without_self_own_stable_softmax(x):  # another correct formulation: a masked softmax written out
    masked = (x @ x.transpose(-2, -1)).masked_fill(_itself(x), float("-inf"))
    e = torch.exp(masked - masked.amax(-1, keepdim=True))
    w = e / e.sum(-1, keepdim=True)
    return w @ x, w


def cosine_naive_softmax(x, temperature):  # the naive softmax of section 4: exp(100) overflows at tau = 0.01
    unit = x / x.norm(dim=-1, keepdim=True)
    e = torch.exp(unit @ unit.transpose(-2, -1) / temperature)
    w = e / e.sum(-1, keepdim=True)
    return w @ x, w


def cosine_own_stable_softmax(x, temperature):  # another correct formulation: the stable softmax of exercise 1
    unit = x / x.norm(dim=-1, keepdim=True)
    s = unit @ unit.transpose(-2, -1) / temperature
    e = torch.exp(s - s.amax(-1, keepdim=True))
    w = e / e.sum(-1, keepdim=True)
    return w @ x, w


def cosine_from_gram(x, temperature):  # another: norms from the diagonal of x x^T
    gram = x @ x.transpose(-2, -1)
    norms = gram.diagonal(dim1=-2, dim2=-1).sqrt()
    w = torch.softmax(gram / (norms[..., :, None] * norms[..., None, :]) / temperature, dim=-1)
    return w @ x, w


def softmax_subtract_last(s):  # (third review: accepted) the last score instead of the maximum
    e = torch.exp(s - s[..., -1:])
    return e / e.sum(-1, keepdim=True)


def softmax_subtract_first(s):  # the first score instead of the maximum
    e = torch.exp(s - s[..., :1])
    return e / e.sum(-1, keepdim=True)


def softmax_subtract_mean(s):  # the mean instead of the maximum
    e = torch.exp(s - s.mean(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def softmax_shift_only_if_large(s):  # (third review: accepted) shifts only when a score would overflow
    if bool((s > 88).any()):
        s = s - s.max(-1, keepdim=True).values
    e = torch.exp(s)
    return e / e.sum(-1, keepdim=True)


def softmax_shift_rows_with_positive_max(s):  # shifts only the rows whose maximum is above 0
    m = s.max(-1, keepdim=True).values
    e = torch.exp(torch.where(m > 0, s - m, s))
    return e / e.sum(-1, keepdim=True)


def softmax_shift_only_if_row_max_large(s):  # (fifth review: accepted) shifts rows whose maximum is above 50 only
    m = s.max(-1, keepdim=True).values
    m = torch.where(m.abs() > 50, m, torch.zeros_like(m))
    e = torch.exp(s - m)
    return e / e.sum(-1, keepdim=True)


def softmax_upcast(s):  # another correct formulation: computed in float32, returned in float32 for float16 scores
    return softmax_right(s.float())


def softmax_logcumsumexp(s):  # (third review: accepted) logsumexp as the last entry of logcumsumexp
    return torch.exp(s - torch.logcumsumexp(s, dim=-1)[..., -1:])


def softmax_logaddexp_fold(s):  # (third review: accepted) logsumexp as a fold of logaddexp
    acc = s[..., 0:1]
    for k in range(1, s.shape[-1]):
        acc = torch.logaddexp(acc, s[..., k:k + 1])
    return torch.exp(s - acc)


def _solve_by_hand(a, b):  # Gauss-Jordan elimination with partial pivoting: no library solver is called
    a, b = a.double().clone(), b.double().clone()
    n = a.size(0)
    for i in range(n):
        p = i + int(a[i:, i].abs().argmax())
        a[[i, p]], b[[i, p]] = a[[p, i]], b[[p, i]]
        a[i], b[i] = a[i] / a[i, i], b[i] / a[i, i]
        for r in range(n):
            if r != i:
                a[r], b[r] = a[r] - a[r, i] * a[i], b[r] - a[r, i] * b[i]
    return b


def _shuffled_recompute_with(exponential, solve=_solve_by_hand):
    def shuffled_recompute_other_exp(context, weights, order):  # recompute x, then a softmax with another exponential
        x = solve(weights.double(), context.double()).float()
        xs = x[torch.as_tensor(order, dtype=torch.long)]
        s = xs @ xs.T
        e = exponential(s - s.amax(-1, keepdim=True))
        w = e / e.sum(-1, keepdim=True)
        return w @ xs, w
    return shuffled_recompute_other_exp


shuffled_recompute_exp2 = _shuffled_recompute_with(lambda s: torch.exp2(s * 1.4426950408889634))
shuffled_recompute_pow = _shuffled_recompute_with(lambda s: torch.pow(torch.e, s))
shuffled_recompute_rpow = _shuffled_recompute_with(lambda s: torch.e ** s)
shuffled_recompute_expm1 = _shuffled_recompute_with(lambda s: torch.expm1(s) + 1)
# (fourth review) Exponentials by other names, with x recovered by hand, and x recovered by a library solver.
shuffled_recompute_sigmoid = _shuffled_recompute_with(lambda s: 1 / torch.sigmoid(-s) - 1)
shuffled_recompute_expit = _shuffled_recompute_with(lambda s: 1 / torch.special.expit(-s) - 1)
shuffled_recompute_tensor_sigmoid = _shuffled_recompute_with(lambda s: 1 / (-s).sigmoid() - 1)
shuffled_recompute_softplus = _shuffled_recompute_with(lambda s: torch.nn.functional.softplus(s).expm1())
shuffled_recompute_tanh = _shuffled_recompute_with(lambda s: (1 + torch.tanh(s / 2)) / (1 - torch.tanh(s / 2)))
shuffled_recompute_cosh_sinh = _shuffled_recompute_with(lambda s: s.cosh() + s.sinh())
shuffled_recompute_ldexp = _shuffled_recompute_with(lambda s: torch.ldexp(torch.ones_like(s), s / math.log(2)))
shuffled_recompute_elu = _shuffled_recompute_with(lambda s: torch.nn.functional.elu(s) + 1)  # s <= 0 after the shift


def _shuffled_review_case(context, weights, order):  # the fourth review's accepted answer: solve for x, exp via sigmoid
    o = torch.as_tensor(order)
    x = torch.linalg.solve(weights, context)
    xs = x[o]
    s = xs @ xs.T
    s = s - s.amax(-1, keepdim=True)
    e = 1 / torch.sigmoid(-s) - 1
    w = e / e.sum(-1, keepdim=True)
    return w @ xs, w


_exp_by_hand = lambda s: 1 / torch.sigmoid(-s) - 1  # noqa: E731 (named after the solver in these cases)
shuffled_recompute_inv = _shuffled_recompute_with(_exp_by_hand, lambda w, c: torch.linalg.inv(w) @ c)
shuffled_recompute_tensor_inverse = _shuffled_recompute_with(_exp_by_hand, lambda w, c: w.inverse() @ c)
shuffled_recompute_pinv = _shuffled_recompute_with(_exp_by_hand, lambda w, c: torch.linalg.pinv(w) @ c)
shuffled_recompute_tensor_pinverse = _shuffled_recompute_with(_exp_by_hand, lambda w, c: w.pinverse() @ c)
shuffled_recompute_lstsq = _shuffled_recompute_with(_exp_by_hand, lambda w, c: torch.linalg.lstsq(w, c).solution)
shuffled_recompute_numpy_solve = _shuffled_recompute_with(
    _exp_by_hand, lambda w, c: torch.from_numpy(np.linalg.solve(w.numpy(), c.numpy())))

CASES = [
    # (check, answer, expected status, words the message must contain)
    (check_stable_softmax, softmax_right, "correct", "any shape"),
    (check_stable_softmax, softmax_logsumexp, "incorrect", "you called torch.logsumexp: it subtracts each row's maximum"),
    (check_stable_softmax, softmax_logsumexp_method, "incorrect", "you called Tensor.logsumexp"),
    (check_stable_softmax, softmax_amax, "correct", "any shape"),
    (check_stable_softmax, softmax_naive, "incorrect", "overflows"),
    (check_stable_softmax, softmax_global_max, "incorrect", "one maximum for the whole tensor"),
    (check_stable_softmax, softmax_columns, "incorrect", "columns sum to one"),
    (check_stable_softmax, softmax_dim1, "incorrect", "axis 1"),
    (check_stable_softmax, softmax_no_keepdim_max, "incorrect", "keepdim"),
    (check_stable_softmax, softmax_no_keepdim_sum, "incorrect", "keepdim"),
    (check_stable_softmax, softmax_subtract_min, "incorrect", "minimum"),
    (check_stable_softmax, softmax_clamped, "incorrect", "clamp"),
    (check_stable_softmax, softmax_library, "incorrect", "you called torch.softmax"),
    (check_stable_softmax, softmax_library_method, "incorrect", "you called Tensor.softmax"),
    (check_stable_softmax, softmax_functional, "incorrect", "you called torch.nn.functional.softmax"),
    (check_stable_softmax, softmax_global_sum, "incorrect", "values differ"),
    (check_stable_softmax, softmax_log_softmax_exp, "incorrect", "you called torch.log_softmax"),
    (check_stable_softmax, softmax_functional_log_softmax_exp, "incorrect", "you called torch.nn.functional.log_softmax"),
    (check_stable_softmax, softmax_method_log_softmax_exp, "incorrect", "you called Tensor.log_softmax"),
    (check_stable_softmax, softmax_private, "incorrect", "you called torch._softmax"),
    (check_stable_softmax, softmax_module, "incorrect", "you called torch.nn.Softmax"),
    (check_stable_softmax, softmax_special, "incorrect", "you called torch.special.softmax"),
    (check_stable_softmax, softmax_aten, "incorrect", "you called torch.ops.aten._softmax"),
    (check_stable_softmax, softmax_alias, "incorrect", "you called torch.nn.functional.softmax"),
    (check_stable_softmax, softmax_package, "incorrect", "you called attn_course.online_softmax"),
    (check_stable_softmax, softmax_hidden_in_try, "incorrect", "write the softmax yourself"),
    (check_stable_softmax, softmax_in_place, "incorrect", "changed its input `s` in place"),
    (check_stable_softmax, softmax_in_place_on_a_copy, "correct", "any shape"),
    (check_stable_softmax, softmax_float64, "correct", "any shape"),
    (check_stable_softmax, softmax_matrix_only, "incorrect", "axis 1"),
    (check_stable_softmax, softmax_half, "incorrect", "values differ"),
    (check_stable_softmax, softmax_through_sdpa, "incorrect",
     "you called torch.nn.functional.scaled_dot_product_attention: it computes a softmax inside"),
    (check_stable_softmax, softmax_through_cross_entropy, "incorrect",
     "you called torch.nn.functional.cross_entropy: it computes a softmax inside"),
    (check_stable_softmax, softmax_categorical, "incorrect", "you called torch.nn.functional.softmax"),
    (check_stable_softmax, softmax_normalize, "correct", "any shape"),
    (check_stable_softmax, softmax_subtract_last, "incorrect", "its first or last score"),
    (check_stable_softmax, softmax_subtract_first, "incorrect", "its first or last score"),
    (check_stable_softmax, softmax_subtract_mean, "incorrect", "its mean"),
    (check_stable_softmax, softmax_shift_only_if_large, "incorrect", "not only when a score is large"),
    (check_stable_softmax, softmax_shift_rows_with_positive_max, "incorrect", "not only when a score is large"),
    # (fifth review) A shift only where a row's maximum is large: float16 overflows at exp(11.1).
    (check_stable_softmax, softmax_shift_only_if_row_max_large, "incorrect", "in float16: your result contains inf or NaN"),
    (check_stable_softmax, softmax_shift_only_if_row_max_large, "incorrect", "not only when a score is large"),
    (check_stable_softmax, softmax_upcast, "correct", "any shape"),
    (check_stable_softmax, softmax_logcumsumexp, "incorrect", "you called torch.logcumsumexp: it subtracts each row's maximum"),
    (check_stable_softmax, softmax_logaddexp_fold, "incorrect", "you called torch.logaddexp: it subtracts each row's maximum"),
    (check_batched_self_attention, batched_right, "correct", "every sequence"),
    (check_batched_self_attention, batched_einsum, "correct", "every sequence"),
    (check_batched_self_attention, batched_bmm_permute, "correct", "every sequence"),
    (check_batched_self_attention, batched_dot_T, "error", "reverses all of them"),
    (check_batched_self_attention, batched_wrong_axis, "incorrect", "columns sum to one"),
    (check_batched_self_attention, batched_over_batch, "incorrect", "across the batch"),
    (check_batched_self_attention, batched_weights_only, "incorrect", "(context, weights)"),
    (check_batched_self_attention, batched_package, "incorrect", "you called attn_course.simple_self_attention"),
    (check_batched_self_attention, batched_sdpa, "incorrect", "you called torch.nn.functional.scaled_dot_product_attention"),
    (check_batched_self_attention, batched_hard_coded_batch, "error", "called with x of shape (1, 3, 6)"),
    (check_batched_self_attention, batched_centres_in_place, "incorrect", "changed its input `x` in place"),
    (check_batched_self_attention, batched_list, "correct", "every sequence"),
    (check_batched_self_attention, batched_swapped, "incorrect", "in that order"),
    (check_batched_self_attention, batched_no_softmax, "incorrect", "values differ"),
    (check_batched_self_attention, batched_first_only, "incorrect", "values differ"),
    (check_batched_self_attention, batched_context_wrong_order, "incorrect", "context"),
    (check_batched_self_attention, batched_python_loop, "incorrect", "a Python loop over the batch"),
    (check_batched_self_attention, batched_unbind_loop, "incorrect", "a Python loop over the batch"),
    (check_batched_self_attention, batched_vmap, "correct", "every sequence"),
    (check_batched_self_attention, batched_mT, "correct", "every sequence"),
    (check_batched_self_attention, batched_numpy_loop, "incorrect", "you called Tensor.numpy"),
    (check_batched_self_attention, batched_list_loop, "incorrect", "you called Tensor.tolist"),
    (check_attention_without_self, without_self_right, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_renormalised, "incorrect", "0 / 0"),
    (check_attention_without_self, without_self_renormalised_float_eye, "incorrect", "without dtype="),
    (check_attention_without_self, without_self_plain, "incorrect", "plain self-attention"),
    (check_attention_without_self, without_self_zero_score, "incorrect", "A score of 0 is not enough"),
    (check_attention_without_self, without_self_after_softmax, "incorrect", "after the softmax"),
    (check_attention_without_self, without_self_anti_diagonal, "incorrect", "same token"),
    (check_attention_without_self, without_self_causal, "incorrect", "same token"),
    (check_attention_without_self, without_self_inverted, "incorrect", "inverted"),
    (check_attention_without_self, without_self_old_context, "incorrect", "plain self-attention's context"),
    (check_attention_without_self, without_self_batch_axis, "error", "called with x of shape (3, 2, 4)"),
    (check_attention_without_self, without_self_T_written_in, "error", "called with x of shape (4, 4)"),
    (check_attention_without_self, without_self_in_place, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_fill(-30.0), "incorrect", "only minus infinity"),
    (check_attention_without_self, without_self_fill(-100.0), "incorrect", "only minus infinity"),
    (check_attention_without_self, without_self_penalty, "incorrect", "only minus infinity"),
    (check_attention_without_self, without_self_fill(-1e9), "incorrect", "-1e9 does not exist in float16"),
    (check_attention_without_self, without_self_finfo_float32, "incorrect", "does not exist in float16"),
    (check_attention_without_self, without_self_fill(-1e4), "incorrect", "a finite number is not below every score"),
    (check_attention_without_self, without_self_eye_times_inf, "incorrect", "0 × (−inf) = NaN"),
    (check_attention_without_self, without_self_same_vector, "incorrect", "not the query's own position"),
    (check_attention_without_self, without_self_cpu_mask, "incorrect", "on the input's device"),
    (check_attention_without_self, without_self_diag_embed_float32, "incorrect", "without dtype="),
    (check_attention_without_self, without_self_finfo, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_where, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_positions, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_own_stable_softmax, "correct", "no token attends to itself"),
    (check_attention_without_self, without_self_upcast, "incorrect", "your weights are torch.float32, not float16"),
    (check_attention_without_self, without_self_upcast64, "incorrect", "your weights are torch.float64, not float16"),
    (check_attention_without_self, without_self_half_weights_only, "incorrect", "your context is torch.float32, not float16"),
    (check_attention_without_self, without_self_scaled_penalty, "incorrect", "only minus infinity"),
    (check_attention_without_self, without_self_naive_softmax, "incorrect", "the naive softmax of section 4"),
    (check_attention_without_self, without_self_renormalised_nan_patched, "incorrect", "replace the resulting NaN"),
    (check_cosine_self_attention, cosine_right, "correct", "directions"),
    (check_cosine_self_attention, cosine_normalize, "correct", "directions"),
    (check_cosine_self_attention, cosine_similarity_fn, "correct", "directions"),
    (check_cosine_self_attention, cosine_not_normalised, "incorrect", "did not normalise"),
    (check_cosine_self_attention, cosine_per_feature, "incorrect", "each feature"),
    (check_cosine_self_attention, cosine_times_temperature, "incorrect", "multiplied by the temperature"),
    (check_cosine_self_attention, cosine_no_temperature, "incorrect", "left out the temperature"),
    (check_cosine_self_attention, cosine_wrong_axis, "incorrect", "over the queries"),
    (check_cosine_self_attention, cosine_unit_context, "incorrect", "original vectors"),
    (check_cosine_self_attention, cosine_fixed_temperature, "incorrect", "temperature 0.1"),
    (check_cosine_self_attention, cosine_squared_norm, "incorrect", "values differ"),
    (check_cosine_self_attention, cosine_loose_epsilon, "incorrect", "values differ"),
    (check_cosine_self_attention, cosine_normalises_in_place, "incorrect", "changed its input `x` in place"),
    (check_cosine_self_attention, cosine_naive_softmax, "incorrect", "exp(100) overflows float32"),
    (check_cosine_self_attention, cosine_own_stable_softmax, "correct", "directions"),
    (check_cosine_self_attention, cosine_from_gram, "correct", "directions"),
    (check_cosine_self_attention, cosine_clamped_epsilon(0.4), "incorrect", "did you guard the division with an eps"),
    (check_cosine_self_attention, cosine_clamped_epsilon(1e-2), "incorrect", "did you guard the division with an eps"),
    (check_cosine_self_attention, cosine_norm_clamped, "incorrect", "did you guard the division with an eps"),
    (check_cosine_self_attention, cosine_normalize_tiny_eps, "correct", "directions"),
    # (fifth review) A guard of exactly 1e-3, which the old short token (length 0.001) did not see.
    (check_cosine_self_attention, cosine_clamped_epsilon(1e-3), "incorrect", "did you guard the division with an eps"),
    (check_cosine_self_attention, cosine_clamp_min_1e3, "incorrect", "did you guard the division with an eps"),
    (check_shuffled_attention, shuffled_right, "correct", "does not see word order"),
    (check_shuffled_attention, shuffled_permutation_matrix, "correct", "does not see word order"),
    (check_shuffled_attention, shuffled_index_select, "correct", "does not see word order"),
    (check_shuffled_attention, shuffled_rows_only, "incorrect", "but not the columns"),
    (check_shuffled_attention, shuffled_columns_only, "incorrect", "but not the rows"),
    (check_shuffled_attention, shuffled_inverse, "incorrect", "inverse of the order"),
    (check_shuffled_attention, shuffled_unchanged, "incorrect", "before shuffling"),
    (check_shuffled_attention, shuffled_context_inverse, "incorrect", "inverse of the order"),
    (check_shuffled_attention, shuffled_swapped, "incorrect", "in that order"),
    (check_shuffled_attention, shuffled_in_place, "incorrect", "in place"),
    (check_shuffled_attention, shuffled_T_written_in, "incorrect", "T=7"),
    (check_shuffled_attention, shuffled_package, "incorrect", "you called attn_course.simple_self_attention"),
    (check_shuffled_attention, shuffled_grid, "correct", "does not see word order"),
    (check_shuffled_attention, shuffled_recompute, "incorrect", "you called torch.linalg.linalg_solve: this exercise "
                                                                "asks you to move the numbers you are given"),
    (check_shuffled_attention, shuffled_recompute_exp, "incorrect", "without computing attention again"),
    (check_shuffled_attention, shuffled_recompute_exp2, "incorrect", "you called torch.exp2"),
    (check_shuffled_attention, shuffled_recompute_pow, "incorrect", "you called torch.pow"),
    (check_shuffled_attention, shuffled_recompute_rpow, "incorrect", "without computing attention again"),
    (check_shuffled_attention, shuffled_recompute_expm1, "incorrect", "you called torch.expm1"),
    # (fourth review) Recovering x with a library solver, and exponentials by other names.
    (check_shuffled_attention, _shuffled_review_case, "incorrect", "solving context = weights @ x"),
    (check_shuffled_attention, shuffled_recompute_inv, "incorrect", "you called torch.linalg.linalg_inv"),
    (check_shuffled_attention, shuffled_recompute_tensor_inverse, "incorrect", "you called Tensor.inverse"),
    (check_shuffled_attention, shuffled_recompute_pinv, "incorrect", "you called torch.linalg.linalg_pinv"),
    (check_shuffled_attention, shuffled_recompute_tensor_pinverse, "incorrect", "you called Tensor.pinverse"),
    (check_shuffled_attention, shuffled_recompute_lstsq, "incorrect", "you called torch.linalg.linalg_lstsq"),
    (check_shuffled_attention, shuffled_recompute_numpy_solve, "incorrect", "you called numpy.linalg.solve"),
    (check_shuffled_attention, shuffled_recompute_sigmoid, "incorrect", "you called torch.sigmoid"),
    (check_shuffled_attention, shuffled_recompute_expit, "incorrect", "you called torch.special.expit"),
    (check_shuffled_attention, shuffled_recompute_tensor_sigmoid, "incorrect", "you called Tensor.sigmoid"),
    (check_shuffled_attention, shuffled_recompute_softplus, "incorrect", "you called torch.nn.functional.softplus"),
    (check_shuffled_attention, shuffled_recompute_tanh, "incorrect", "you called torch.tanh"),
    (check_shuffled_attention, shuffled_recompute_cosh_sinh, "incorrect", "an exponential by another name"),
    (check_shuffled_attention, shuffled_recompute_ldexp, "incorrect", "you called torch.ldexp"),
    (check_shuffled_attention, shuffled_recompute_elu, "incorrect", "an exponential by another name"),
]


@pytest.mark.parametrize("check, answer, status, words", CASES, ids=[f"{c[0].__name__}-{c[1].__name__}" for c in CASES])
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


def test_the_softmax_check_puts_torch_back_as_it_was():
    softmax, method, functional = torch.softmax, torch.Tensor.softmax, F.softmax
    profile, modes = sys.getprofile(), torch._C._len_torch_function_stack()
    check_stable_softmax(softmax_library)
    check_stable_softmax(crashes)
    check_stable_softmax(softmax_log_softmax_exp)
    assert torch.softmax is softmax and F.softmax is functional and "softmax" not in vars(torch.Tensor)
    assert torch.Tensor.softmax is method
    assert sys.getprofile() is profile and torch._C._len_torch_function_stack() == modes
    torch.testing.assert_close(torch.tensor([0.0, 0.0]).softmax(-1), torch.tensor([0.5, 0.5]))


def test_the_notebooks_random_state_is_left_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for check, answer in ((check_stable_softmax, softmax_right), (check_batched_self_attention, batched_right),
                          (check_attention_without_self, without_self_right), (check_cosine_self_attention, cosine_right),
                          (check_shuffled_attention, shuffled_right)):
        assert check(answer)
    assert torch.equal(torch.get_rng_state(), state)


def test_graded_mode_keeps_the_named_mistake_and_drops_the_hint(monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_GRADED", "1")
    feedback = check_stable_softmax(softmax_log_softmax_exp)
    assert feedback.status == "incorrect" and "you called torch.log_softmax" in str(feedback)
    assert "Hint" not in str(feedback)
