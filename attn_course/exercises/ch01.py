"""Checks for the exercises of chapter 01, why attention: encoder-decoder RNNs, Bahdanau and Luong.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch01.py.
"""

from __future__ import annotations

import torch

from ..alignment import DotProductAttention
from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_general_attention", "check_luong_attention", "check_teacher_forcing_inputs"]


def _pair(result, what: str):
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{what}: return a pair (context, weights); got {type(result).__name__}")
    return result


def _context_shape(context, B: int, width: int, what: str) -> torch.Tensor:
    """The context must be (B, width); name the broadcast that weights @ H makes of (B, S) @ (B, S, width)."""
    if isinstance(context, torch.Tensor) and tuple(context.shape) == (B, B, width):
        raise Mismatch(f"{what}: expected shape {(B, width)}, got {(B, B, width)}: weights @ H multiplies the (B, S) "
                       "weights, as one matrix, with every sentence's states. Give each sentence its own row: "
                       "(weights[:, None, :] @ H)[:, 0], or (weights[:, :, None] * H).sum(1)")
    return expect_tensor(context, what=what, shape=(B, width))


def _general(s, H, W_a):
    """Reference for Luong's general score: e_j = s^T W_a h_j, softmax over j, c = sum_j a_j h_j."""
    scores = ((s @ W_a)[:, None, :] * H).sum(dim=-1)  # (B, Dk) -> (B, 1, Dk) * (B, S, Dk) -> (B, S)
    weights = torch.softmax(scores, dim=-1)  # over the source positions
    return (weights[:, :, None] * H).sum(dim=1), weights  # (B, Dk), (B, S)


def _general_mistakes(s, H, W_a) -> dict[str, torch.Tensor]:
    """The weights that the usual mistakes produce, each with what to tell the student."""
    def softmax_rows(scores, dim=-1):
        return torch.softmax(scores, dim=dim)

    out = {}
    if W_a.size(0) == W_a.size(1):  # only a square W_a lets these run at all
        out["you used W_a transposed: the score is s^T W_a h_j, so W_a's rows pair with the decoder state s "
            "(width Dq) and its columns with the encoder states h_j (width Dk): (s @ W_a) has shape (B, Dk)"] = \
            softmax_rows(((s @ W_a.T)[:, None, :] * H).sum(-1))
        out["your scores ignore W_a: this is the plain dot product s^T h_j of section 6"] = \
            softmax_rows((s[:, None, :] * H).sum(-1))
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)  # (B, S)
    for name, width in (("Dk", H.size(-1)), ("Dq", s.size(-1))):
        out[f"you divided the scores by sqrt({name}): Luong's general score is not scaled (the scaling by "
            "sqrt(d_k) comes with the Transformer, chapter 03)"] = softmax_rows(scores / width ** 0.5)
    out["your weights sum to one down the batch (dim=0), not across the source positions (dim=-1)"] = \
        softmax_rows(scores, dim=0)
    return out


@exercise(
    "Exercise 1, Luong's general score",
    hint="(s @ W_a) has shape (B, Dk); scores = ((s @ W_a)[:, None, :] * H).sum(-1), or "
         "torch.einsum('bq,qk,bsk->bs', s, W_a, H), shape (B, S); softmax over dim=-1; "
         "context = (weights[:, :, None] * H).sum(1)",
)
def check_general_attention(general_attention) -> str:
    generator = torch.Generator().manual_seed(11)
    cases = []
    for B, S, Dq, Dk in ((3, 5, 4, 4), (2, 7, 3, 6)):  # a square W_a first: it lets the layout mistakes run
        s = torch.randn(B, Dq, generator=generator)
        H = torch.randn(B, S, Dk, generator=generator)
        W_a = torch.randn(Dq, Dk, generator=generator)
        cases.append((s, H, W_a))
    for s, H, W_a in cases:
        B, S, Dk = H.shape
        Dq = s.size(-1)
        shapes = f"s (B={B}, Dq={Dq}), H (B={B}, S={S}, Dk={Dk}) and W_a ({Dq}, {Dk})"
        result = call(general_attention, s.clone(), H.clone(), W_a.clone())
        expect(isinstance(result, tuple) and len(result) == 2,
               f"general_attention(s, H, W_a): return a pair (context, weights); got {type(result).__name__}")
        context, weights = result
        if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Dk) and \
                isinstance(context, torch.Tensor) and tuple(context.shape) == (B, S):
            raise Mismatch("return (context, weights) in that order: context is (B, Dk), weights (B, S)")
        if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, B, S):
            raise Mismatch(f"weights for {shapes}: shape (B, B, S) = {(B, B, S)}: a (B, Dk) matrix times a (B, Dk, S) "
                           "batch broadcasts to every pair of sentences. Give s @ W_a a middle axis: "
                           "(s @ W_a)[:, None, :] @ H.transpose(1, 2) is (B, 1, S)")
        what = f"weights for {shapes}"
        weights = expect_tensor(weights, what=what, shape=(B, S))
        w = weights.detach().double()
        expected_context, expected_weights = _general(s, H, W_a)
        if not torch.allclose(w, expected_weights.double(), atol=1e-5, rtol=1e-4):
            for mistake, wrong in _general_mistakes(s, H, W_a).items():
                if torch.allclose(w, wrong.double(), atol=1e-5, rtol=1e-4):
                    raise Mismatch(f"{what}: {mistake}")
            if not torch.allclose(w.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-4):
                raise Mismatch(f"{what}: each row must sum to one over the source positions; got row sums "
                               f"{[round(v, 3) for v in w.sum(-1).tolist()]}. Did you return the scores, before the softmax?")
        expect_close(weights, expected_weights, what=what)
        context = _context_shape(context, B, Dk, f"context for {shapes}")
        expect_close(context, expected_context, what=f"context for {shapes}")
    return "your weights and context vectors are right, also when the decoder and encoder widths differ."


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
    if torch.allclose(w[:2].sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5) or \
            torch.allclose(w.nan_to_num().sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5):
        raise Mismatch(f"{what}: your weights sum to one down the batch (dim=0), not across the source positions (dim=-1)")
    expect(not bool(torch.isnan(w[2]).any()),
           f"{what}: the fully padded row (the third) is NaN: the softmax of a row of -inf is 0/0. "
           "A row with nothing to attend to must give zero weights and a zero context")
    expect(not (bool((w[1, :2] == 0).all()) and bool((w[1, 2:] > 0).any())),
           f"{what}: your weights are zero at the real tokens and positive at the padding: "
           "in this course's convention True marks padding, the positions to ignore")
    if bool((w[1, 2:] == 0).all()) and torch.allclose(w[2], torch.full((S,), 1 / S, dtype=torch.float64), atol=1e-6):
        raise Mismatch(f"{what}: the fully padded row (the third) is uniform, {1 / S:.2f} everywhere: a large negative "
                       "fill such as -1e9 leaves all the scores of that row equal, so the softmax spreads its weight over "
                       "padding. A row with nothing to attend to must give zero weights and a zero context")
    unmasked = torch.softmax((H @ s[:, :, None])[..., 0], dim=-1).masked_fill(padding_mask, 0.0)  # (B, S)
    if torch.allclose(w[:2], unmasked[:2].double(), atol=1e-6) and not torch.allclose(w[1].sum(), torch.ones((), dtype=torch.float64)):
        raise Mismatch(f"{what}: you zeroed the padding after the softmax, so the weights of the second row (two real "
                       "tokens) no longer sum to one. Fill the padding's scores with float('-inf') before the softmax")
    expect(bool((w[padding_mask] == 0).all()),
           f"{what}: padding positions must get weight exactly 0; got {[round(v, 4) for v in w[padding_mask].tolist()]}. "
           "Fill their scores with float('-inf') before the softmax (a fill of 0 is an ordinary score)")
    expect_close(weights, expected_weights, what=what)
    context = _context_shape(context, B, D, "context for s (B=3, D=4), H (B=3, S=5, D=4) and a padding mask")
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
    expect(not (bool((got[0] == bos_id).all()) and torch.equal(got[1], target[0])),
           f"{what}: you shifted along the batch axis (dim=0): the first row became all {bos_id}s. Shift along the "
           "time axis, dim=1: each row is one sequence")
    expect(not torch.equal(got, target),
           f"{what}: you returned the target itself; the decoder would see y_i while predicting y_i and learn to copy "
           "its input instead of translating")
    expect(not torch.equal(got, torch.roll(target, 1, dims=1)),
           f"{what}: torch.roll moved the last token to the front; the first input must be the begin-of-sequence "
           f"token {bos_id} (the last target token is never an input)")
    expect(bool((got[:, 0] == bos_id).all()),
           f"{what}: every row must start with the begin-of-sequence token {bos_id}; got first column {got[:, 0].tolist()}")
    expect(not torch.equal(got[:, 1:], target[:, 1:]),
           f"{what}: you put the begin-of-sequence token in place of y_1 but kept y_2 ... y_T where they were: step i "
           "would still see y_i. Shift the whole target one step to the right")
    expect(torch.equal(got, expected), f"{what}: expected {expected.tolist()}, got {got.tolist()}")
    longer = torch.arange(14).remainder(10).reshape(2, 7)
    expect(torch.equal(call(teacher_forcing_inputs, longer.clone(), 10),
                       torch.cat([torch.full((2, 1), 10), longer[:, :-1]], dim=1)),
           "your function gives the right answer for the example but not for a (2, 7) target with bos_id=10: "
           "avoid hard-coding the length or the token id")
    return "at step i the decoder sees y_{i-1} (BOS at the first step) and never the token it must predict."
