"""Checks for the exercises of chapter 01, why attention: encoder-decoder RNNs, Bahdanau and Luong."""

from __future__ import annotations

import torch

from ..alignment import AdditiveAttention, DotProductAttention
from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_bahdanau_attention", "check_luong_attention", "check_teacher_forcing_inputs"]


def _pair(result, what: str):
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{what}: return a pair (context, weights); got {type(result).__name__}")
    return result


def _bahdanau_case(seed: int):
    generator = torch.Generator().manual_seed(seed)
    B, S, Dq, Dk, A = 3, 5, 4, 6, 7
    s = torch.randn(B, Dq, generator=generator)
    H = torch.randn(B, S, Dk, generator=generator)
    W = torch.randn(A, Dq, generator=generator) * 0.7
    U = torch.randn(A, Dk, generator=generator) * 0.7
    v = torch.randn(A, generator=generator)
    return s, H, W, U, v


@exercise(
    "Exercise 1, Bahdanau's additive attention by hand",
    hint="hidden = torch.tanh((s @ W.T)[:, None, :] + H @ U.T) has shape (B, S, A); scores = hidden @ v; "
         "softmax over dim=-1 (the source positions); context = (weights[:, :, None] * H).sum(1)",
)
def check_bahdanau_attention(bahdanau_attention) -> str:
    s, H, W, U, v = _bahdanau_case(11)
    B, S = H.shape[:2]
    result = _pair(call(bahdanau_attention, s, H, W, U, v), "bahdanau_attention(s, H, W, U, v)")
    context, weights = result
    what = "weights for s (B=3, Dq=4) and H (B=3, S=5, Dk=6)"
    weights = expect_tensor(weights, what=what, shape=(B, S))
    module = AdditiveAttention(W.size(1), U.size(1), W.size(0))
    with torch.no_grad():
        module.W.weight.copy_(W)
        module.U.weight.copy_(U)
        module.v.weight.copy_(v[None, :])
        expected_context, expected_weights = module(s, H)
    w = weights.detach().double()
    if not torch.allclose(w, expected_weights.double(), atol=1e-5, rtol=1e-4):
        no_tanh = torch.softmax((s @ W.T)[:, None, :] @ v[:, None] + (H @ U.T) @ v[:, None], dim=1)[..., 0]  # (B, S)
        expect(not torch.allclose(w, no_tanh.double(), atol=1e-5),
               f"{what}: these are the weights without the tanh; without it, v^T (W s + U h_j) is linear "
               "and the W s part is the same for every j, so it cancels in the softmax")
        expect(not torch.allclose(w.sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5),
               f"{what}: your weights sum to one down the batch (dim=0), not across the source positions (dim=-1)")
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what="context for s (B=3, Dq=4) and H (B=3, S=5, Dk=6)")
    return "your weights and context vectors equal attn_course.AdditiveAttention's."


@exercise(
    "Exercise 2, Luong's dot-product attention with padding",
    hint="scores = (H @ s[:, :, None])[..., 0], shape (B, S); scores.masked_fill(padding_mask, float('-inf')); "
         "softmax over dim=-1; then torch.nan_to_num(weights) (or masked_fill) turns a fully padded row into zeros",
)
def check_luong_attention(luong_attention) -> str:
    generator = torch.Generator().manual_seed(12)
    B, S, D = 3, 5, 4
    s = torch.randn(B, D, generator=generator)
    H = torch.randn(B, S, D, generator=generator)
    padding_mask = torch.tensor([
        [False, False, False, False, False],  # five real tokens
        [False, False, True, True, True],  # two real tokens
        [True, True, True, True, True],  # nothing to attend to
    ])
    context, weights = _pair(call(luong_attention, s, H, padding_mask), "luong_attention(s, H, padding_mask)")
    what = "weights for s (B=3, D=4), H (B=3, S=5, D=4) and a padding mask"
    weights = expect_tensor(weights, what=what, shape=(B, S))
    expected_context, expected_weights = DotProductAttention()(s, H, key_padding_mask=padding_mask)
    w = weights.detach().double()
    expect(not bool(torch.isnan(w[:2]).any()), f"{what}: rows with real tokens contain NaN")
    expect(not bool(torch.isnan(w[2]).any()),
           f"{what}: the fully padded row (the third) is NaN: the softmax of a row of -inf is 0/0. "
           "A row with nothing to attend to must give zero weights and a zero context")
    expect(not (bool((w[1, :2] == 0).all()) and bool((w[1, 2:] > 0).any())),
           f"{what}: your weights are zero at the real tokens and positive at the padding: "
           "in this course's convention True marks padding, the positions to ignore")
    expect(bool((w[padding_mask] == 0).all()),
           f"{what}: padding positions must get weight exactly 0; got {w[padding_mask].tolist()}")
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what="context for s (B=3, D=4), H (B=3, S=5, D=4) and a padding mask")
    return "your weights ignore the padding, and the fully padded row gives zeros, not NaN."


@exercise(
    "Exercise 3, the decoder's inputs under teacher forcing",
    hint="torch.cat([torch.full_like(target[:, :1], bos_id), target[:, :-1]], dim=1)",
)
def check_teacher_forcing_inputs(teacher_forcing_inputs) -> str:
    target = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    bos_id = 11
    expected = torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])
    got = call(teacher_forcing_inputs, target.clone(), bos_id)
    what = "teacher_forcing_inputs(target, 11) for target [[3, 1, 4, 1], [5, 9, 2, 6]]"
    got = expect_tensor(got, what=what)
    if tuple(got.shape) == (2, 5):
        raise Mismatch(f"{what}: expected shape (2, 4), got (2, 5): drop the last target token, which is never "
                       "an input (nothing comes after it to predict)")
    got = expect_tensor(got, what=what, shape=expected.shape)
    expect(not torch.equal(got, target),
           f"{what}: you returned the target itself; the decoder would see y_i while predicting y_i and learn to copy "
           "its input instead of translating")
    expect(bool((got[:, 0] == bos_id).all()),
           f"{what}: every row must start with the begin-of-sequence token {bos_id}; got first column {got[:, 0].tolist()}")
    expect(torch.equal(got, expected), f"{what}: expected {expected.tolist()}, got {got.tolist()}")
    longer = torch.arange(14).remainder(10).reshape(2, 7)
    expect(torch.equal(call(teacher_forcing_inputs, longer.clone(), 10),
                       torch.cat([torch.full((2, 1), 10), longer[:, :-1]], dim=1)),
           "your function gives the right answer for the example but not for a (2, 7) target with bos_id=10: "
           "avoid hard-coding the length or the token id")
    return "at step i the decoder sees y_{i-1} (BOS at the first step) and never the token it must predict."
