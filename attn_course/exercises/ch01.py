"""Checks for the exercises of chapter 01, why attention: encoder-decoder RNNs, Bahdanau and Luong.

Each check tries the answer on cases chosen so that the usual mistakes give a wrong result, and names
the mistake when it recognises one; the table of those mistakes is in tests/test_exercises_ch01.py.
They use the shared mechanism of ``attn_course.exercises``: torch's and the package's attention
forbidden where the exercise writes it (``forbid=("sdpa",)``), ``ac.shift_right`` and the decoder's own
``step`` forbidden where the exercise rewrites them, inputs watched for changes in place, sizes unlike
the notebook's (``other_sizes``), left padding and a fully padded row (``padding_cases``), scores near
+-100 (``large_scores``), the dtype of token ids, and numpy integers accepted as token ids.
"""

from __future__ import annotations

import numpy as np
import torch

from ..alignment import DotProductAttention
from ..rnn import AttentionDecoder, shift_right
from . import (Mismatch, call, exercise, expect, expect_close, expect_sequence, expect_tensor, other_sizes,
               padding_cases, padding_mask_for, randn, rng)

__all__ = ["check_general_attention", "check_luong_attention", "check_teacher_forcing_inputs",
           "check_token_query_step"]


def _pair(result, what: str):
    return expect_sequence(result, what=what, names=("context", "weights"))


def _context_shape(context, B: int, width: int, what: str) -> torch.Tensor:
    """The context must be (B, width); name the broadcast that weights @ H makes of (B, S) @ (B, S, width)."""
    if isinstance(context, torch.Tensor) and B > 1 and tuple(context.shape) == (B, B, width):
        raise Mismatch(f"{what}: expected shape {(B, width)}, got {(B, B, width)}: a matrix product of the (B, S) "
                       "weights with the (B, S, width) states multiplies the weights, as one matrix, with every "
                       "sentence's states. Each sentence's weights must meet only its own states: give the weights "
                       "a middle axis of size 1 before the product, or multiply elementwise and sum over the "
                       "source positions")
    return expect_tensor(context, what=what, shape=(B, width))


def _rows_sum_to_one(weights: torch.Tensor) -> bool:
    w = weights.detach().double()
    return bool(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-4))


# --- Exercise 1 -----------------------------------------------------------------------------------

def _general(s, H, W_a):
    """Reference for Luong's general score: e_j = s^T W_a h_j, softmax over j, c = sum_j a_j h_j."""
    scores = ((s @ W_a)[:, None, :] * H).sum(dim=-1)  # (B, Dk) -> (B, 1, Dk) * (B, S, Dk) -> (B, S)
    weights = torch.softmax(scores, dim=-1)  # over the source positions
    return (weights[:, :, None] * H).sum(dim=1), weights  # (B, Dk), (B, S)


def _general_mistakes(s, H, W_a) -> dict[str, torch.Tensor]:
    """The weights that the usual mistakes produce, each with what to tell the student."""
    out = {}
    if W_a.size(0) == W_a.size(1):  # only a square W_a lets these run at all
        out["you used W_a transposed: the score is s^T W_a h_j, so W_a's rows pair with the decoder state s "
            "(width Dq) and its columns with the encoder states h_j (width Dk): s times W_a has shape (B, Dk)"] = \
            torch.softmax(((s @ W_a.T)[:, None, :] * H).sum(-1), dim=-1)
        out["your scores ignore W_a: this is the plain dot product s^T h_j of section 6"] = \
            torch.softmax((s[:, None, :] * H).sum(-1), dim=-1)
    scores = ((s @ W_a)[:, None, :] * H).sum(-1)  # (B, S)
    for name, width in (("Dk", H.size(-1)), ("Dq", s.size(-1))):
        out[f"you divided the scores by sqrt({name}): Luong's general score is not scaled (the scaling by "
            "sqrt(d_k) comes with the Transformer, chapter 03)"] = torch.softmax(scores / width ** 0.5, dim=-1)
    if s.size(0) > 1:
        out["your weights sum to one down the batch (dim=0), not across the source positions (the last axis)"] = \
            torch.softmax(scores, dim=0)
    return out


@exercise(
    "Exercise 1, Luong's general score",
    hint="first carry the decoder state into the keys' space with W_a (a (B, Dk) result); then each sentence "
         "needs the dot product of that vector with each of its own S encoder states, which gives scores of "
         "shape (B, S); the softmax runs over the source positions, the last axis; the context is the weighted "
         "sum of the states over the source positions",
    forbid=("sdpa",),
)
def check_general_attention(general_attention) -> str:
    generator = rng(11)
    cases = []
    # A square W_a first (it lets the layout mistakes run) with Dk = 5, so that dividing by sqrt(Dk) is
    # not dividing by a round temperature; then the decoder and the encoder of different widths.
    for B, S, Dq, Dk in ((3, 4, 5, 5), (2, 7, 3, 6)):
        cases.append((randn(B, Dq, generator=generator), randn(B, S, Dk, generator=generator),
                      randn(Dq, Dk, generator=generator)))
    # Sizes unlike the notebook's: one sentence, one source position, B == S, odd widths.
    for size in other_sizes():
        cases.append((randn(size.B, size.E, generator=generator), randn(size.B, size.S, size.D, generator=generator),
                      randn(size.E, size.D, generator=generator)))
    # Scores near +-100: a softmax written with exp and no shift overflows float32.
    s = randn(2, 4, generator=generator)
    H = randn(2, 6, 4, generator=generator)
    W_a = randn(4, 4, generator=generator)
    W_a = W_a * (100.0 / float(((s @ W_a)[:, None, :] * H).sum(-1).max()))  # the largest score is +100
    cases.append((s, H, W_a))
    for s, H, W_a in cases:
        B, S, Dk = H.shape
        Dq = s.size(-1)
        shapes = f"s (B={B}, Dq={Dq}), H (B={B}, S={S}, Dk={Dk}) and W_a ({Dq}, {Dk})"
        context, weights = _pair(call(general_attention, s, H, W_a), f"general_attention(s, H, W_a) for {shapes}")
        if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Dk) and (B, Dk) != (B, S) and \
                isinstance(context, torch.Tensor) and tuple(context.shape) == (B, S):
            raise Mismatch("return (context, weights) in that order: context is (B, Dk), weights (B, S)")
        if isinstance(weights, torch.Tensor) and B > 1 and tuple(weights.shape) == (B, B, S):
            raise Mismatch(f"weights for {shapes}: shape (B, B, S) = {(B, B, S)}: a (B, Dk) matrix times a (B, Dk, S) "
                           "batch broadcasts to every pair of sentences. Each sentence's query must meet only its "
                           "own states: give the (B, Dk) query a middle axis of size 1 first")
        what = f"weights for {shapes}"
        weights = expect_tensor(weights, what=what, shape=(B, S), dtype="float")
        w = weights.detach().double()
        expected_context, expected_weights = _general(s, H, W_a)
        expect(bool(torch.isfinite(w).all()),
               f"{what}: your weights contain inf or NaN. These scores reach about 100: exp(100) overflows float32. "
               "Use torch.softmax, or subtract each row's maximum before exponentiating")
        if not torch.allclose(w, expected_weights.double(), atol=1e-5, rtol=1e-4):
            for mistake, wrong in _general_mistakes(s, H, W_a).items():
                if torch.allclose(w, wrong.double(), atol=1e-5, rtol=1e-4):
                    raise Mismatch(f"{what}: {mistake}")
            if not _rows_sum_to_one(w):
                raise Mismatch(f"{what}: each row must sum to one over the source positions; got row sums "
                               f"{[round(v, 3) for v in w.sum(-1).tolist()]}. Did you return the scores, before the "
                               "softmax?")
        expect_close(weights, expected_weights, what=what)
        context = _context_shape(context, B, Dk, f"context for {shapes}")
        expect_close(context, expected_context, what=f"context for {shapes}")
    return "your weights and context vectors are right, also when the decoder and encoder widths differ."


# --- Exercise 2 -----------------------------------------------------------------------------------

def _tiny(values) -> list[str]:
    """Weights shown so that 1e-44 does not print as 0.0."""
    return [f"{v:.1e}" if v != 0 else "0" for v in values]


@exercise(
    "Exercise 2, Luong's dot-product attention with padding",
    hint="the scores are each sentence's dot products of s with its own S states, shape (B, S); give the "
         "padding positions (True in the mask) minus infinity before the softmax over the last axis, so that "
         "exp makes them exactly 0; a row that is all padding then comes out as 0/0 = NaN, which you replace by "
         "zeros (torch.nan_to_num, or a fill where the whole row is padding); use the mask as it is given",
    forbid=("sdpa",),
)
def check_luong_attention(luong_attention) -> str:
    generator = rng(12)
    reference = DotProductAttention()

    def run(s, H, padding_mask, label):
        B, S, D = H.shape
        what = f"weights for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and {label}"
        context, weights = _pair(call(luong_attention, s, H, padding_mask), f"luong_attention(s, H, padding_mask) with {label}")
        weights = expect_tensor(weights, what=what, shape=(B, S), dtype="float")
        expected_context, expected_weights = reference(s, H, key_padding_mask=padding_mask)
        return what, context, weights, expected_context, expected_weights

    # 1. The notebook's case: five, two and no real tokens (right padding), with the named mistakes.
    B, S, D = 3, 5, 4
    s = randn(B, D, generator=generator)
    H = randn(B, S, D, generator=generator)
    padding_mask = padding_mask_for([5, 2, 0], S)
    what, context, weights, expected_context, expected_weights = run(s, H, padding_mask, "a padding mask")
    w = weights.detach().double()
    expect(not bool(torch.isnan(w[:2]).any()), f"{what}: rows with real tokens contain NaN")
    if torch.allclose(w[:2].sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5) or \
            torch.allclose(w.nan_to_num().sum(0), torch.ones(S, dtype=torch.float64), atol=1e-5):
        raise Mismatch(f"{what}: your weights sum to one down the batch (dim=0), not across the source positions "
                       "(the last axis)")
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
    if not bool((w[padding_mask] == 0).all()):
        small = bool((w[padding_mask].abs() < 1e-6).all())
        raise Mismatch(f"{what}: padding positions must get weight exactly 0; got {_tiny(w[padding_mask].tolist())}. "
                       + ("Those are tiny but not 0: a finite fill (such as -100) only makes the padding unlikely. "
                          if small else "A fill of 0 is an ordinary score. ")
                       + "Fill the padding's scores with float('-inf') before the softmax")
    expect_close(weights, expected_weights, what=what)
    context = _context_shape(context, B, D, f"context for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and a padding mask")
    expect_close(context, expected_context, what=f"context for s (B={B}, D={D}), H (B={B}, S={S}, D={D}) and a padding mask")

    # 2. No padding, right padding, left padding, and a row of nothing but padding: the mask as given.
    for label, mask in padding_cases(batch_size=3, max_len=5, empty_row=True):
        s, H = randn(3, 4, generator=generator), randn(3, 5, 4, generator=generator)
        what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
        if label.startswith("left"):
            lengths = (~mask).sum(-1)
            right = padding_mask_for(lengths.tolist(), 5)  # the same lengths, padded on the right
            _, right_weights = reference(s, H, key_padding_mask=right)
            if torch.allclose(weights.detach().double().nan_to_num(), right_weights.double(), atol=1e-5):
                raise Mismatch(f"{what}: your weights are those of right padding (tokens first, padding last), but "
                               "this mask pads on the left. Use the mask you are given, not lengths rebuilt from it")
        expect_close(weights, expected_weights, what=what)
        expect_close(_context_shape(context, 3, 4, f"context with {label}"), expected_context, what=f"context with {label}")

    # 3. Other batches, lengths and widths (one sentence, one position, odd widths), and scores near +-100.
    for size in other_sizes():
        s, H = randn(size.B, size.E, generator=generator), randn(size.B, size.S, size.E, generator=generator)
        lengths = [max(1, size.S - b) for b in range(size.B)]
        mask = padding_mask_for(lengths, size.S, side="left" if size.B % 2 else "right")
        label = f"lengths {lengths}"
        what, context, weights, expected_context, expected_weights = run(s, H, mask, label)
        expect_close(weights, expected_weights, what=what)
        expect_close(_context_shape(context, size.B, size.E, f"context with {label}"), expected_context,
                     what=f"context with {label}")
    s = randn(2, 4, generator=generator)
    H = randn(2, 6, 4, generator=generator)
    s = s * (100.0 / float((H @ s[:, :, None]).max()))  # the largest score is +100
    mask = padding_mask_for([6, 3], 6)
    what, context, weights, expected_context, expected_weights = run(s, H, mask, "scores near 100")
    expect(bool(torch.isfinite(weights).all()) and _rows_sum_to_one(weights),
           f"{what}: your weights contain inf or NaN, or a row that does not sum to one: exp(100) overflows "
           "float32. Use torch.softmax, or subtract each row's maximum before exponentiating")
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what="context with scores near 100")
    return "your weights ignore the padding on either side, and the fully padded row gives zeros, not NaN."


# --- Exercise 3 -----------------------------------------------------------------------------------

@exercise(
    "Exercise 3, the decoder's inputs under teacher forcing",
    hint="put one column holding bos_id in front of the target, with the target's own dtype and device, and "
         "drop the target's last column, so that the result keeps the shape (B, T); build a new tensor rather "
         "than writing into target",
    forbid=(shift_right,),
)
def check_teacher_forcing_inputs(teacher_forcing_inputs) -> str:
    target = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    bos_id = 11
    expected = torch.tensor([[11, 3, 1, 4], [11, 5, 9, 2]])
    got = call(teacher_forcing_inputs, target, bos_id)
    what = "teacher_forcing_inputs(target, 11) for target [[3, 1, 4, 1], [5, 9, 2, 6]]"
    got = expect_tensor(got, what=what)
    if tuple(got.shape) == (2, 5):
        raise Mismatch(f"{what}: expected shape (2, 4), got (2, 5): drop the last target token, which is never "
                       "an input (nothing comes after it to predict)")
    got = expect_tensor(got, what=what, shape=expected.shape)
    expect(not got.is_floating_point() and got.dtype != torch.bool,
           f"{what}: expected integer token ids (dtype torch.long, like the target), got dtype {got.dtype}: "
           "nn.Embedding accepts only integer ids. A tensor made by torch.ones or torch.zeros is float32 unless "
           "you give it the target's dtype")
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
           f"{what}: you put the begin-of-sequence token in place of y_0 but kept y_1 ... y_(T-1) where they were: "
           "step i would still see y_i. Shift the whole target one step to the right")
    expect(torch.equal(got, expected), f"{what}: expected {expected.tolist()}, got {got.tolist()}")
    # Other lengths, batches and ids (a numpy integer too, as token ids often are), T = 1, an int32 target.
    generator = rng(13)
    for B, T, bos, dtype in ((2, 7, 10, torch.long), (1, 1, np.int64(11), torch.long), (3, 2, 0, torch.long),
                             (4, 5, 7, torch.int32)):
        other = torch.randint(0, 10, (B, T), generator=generator, dtype=dtype)
        shown = f"teacher_forcing_inputs(target, {int(bos)}) for a target of shape ({B}, {T}) and dtype {dtype}"
        got = expect_tensor(call(teacher_forcing_inputs, other, bos), what=shown)
        expect(tuple(got.shape) == (B, T), f"{shown}: expected shape {(B, T)}, got {tuple(got.shape)}: avoid "
                                           "hard-coding the length, the batch or the token id")
        got = expect_tensor(got, what=shown, dtype="integer")
        want = torch.cat([torch.full((B, 1), int(bos), dtype=dtype), other[:, :-1]], dim=1)
        expect(torch.equal(got.long(), want.long()),
               f"{shown}: expected {want.tolist()}, got {got.tolist()}: avoid hard-coding the length, the batch or "
               "the token id")
    return "at step i the decoder sees y_(i-1) (BOS at the first step) and never the token it must predict."


# --- Exercise 4 -----------------------------------------------------------------------------------

def _token_decoder(E: int, D: int, A: int, generator: torch.Generator) -> AttentionDecoder:
    """A decoder of the exercise's kind with parameters drawn from ``generator`` (the global RNG untouched)."""
    decoder = AttentionDecoder(12, E, D, attention="additive", attention_dim=A, token_in_query=True)
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.copy_(randn(*parameter.shape, generator=generator, scale=0.5))
    return decoder


def _token_step_variants(decoder, tokens, state, states):
    """What the plausible mistakes compute: name -> (logits, new state, weights)."""
    y = decoder.embedding(tokens)  # (B, E)

    def finish(query, cell_input_order="y,c", output_from="new", output_order="s,c"):
        context, weights = decoder.attention(query, states)
        cell_input = torch.cat([y, context] if cell_input_order == "y,c" else [context, y], dim=-1)
        new = decoder.cell(cell_input, state)
        used = new if output_from == "new" else state
        logits = decoder.output(torch.cat([used, context] if output_order == "s,c" else [context, used], dim=-1))
        return logits, new, weights

    return {
        "the query must be the state first, then the embedded token, [s_(i-1); y_(i-1)]: you put the token first":
            finish(torch.cat([y, state], dim=-1)),
        "the GRU's input is [y_(i-1); c_i], the embedded token first, then the context: you swapped them":
            finish(torch.cat([state, y], dim=-1), cell_input_order="c,y"),
        "the prediction is W_o [s_i; c_i] with the new state s_i, the GRU's output: you used the old state s_(i-1)":
            finish(torch.cat([state, y], dim=-1), output_from="old"),
        "the output layer reads [s_i; c_i], the new state first, then the context: you swapped them":
            finish(torch.cat([state, y], dim=-1), output_order="c,s"),
    }


@exercise(
    "Exercise 4, Bahdanau's query with the previous token",
    hint="follow section 8's Bahdanau step line by line and change only the query: the attention module is "
         "asked with the previous state and the embedded previous token joined along the last axis, state "
         "first (width D + E); the GRU's input, the new state and the output layer are as in Bahdanau's step; "
         "return the logits, the new state and the weights",
    forbid=(AttentionDecoder.step,),
)
def check_token_query_step(token_query_step) -> str:
    generator = rng(14)
    cases = [(5, 8, 6, 3, 4)]  # E, D, A, B, S
    for size in other_sizes():  # one sentence, one source position, B == S, odd widths
        cases.append((size.H + 6, size.E, size.D + 1, size.B, size.S))
    for number, (E, D, A, B, S) in enumerate(cases):
        decoder = _token_decoder(E, D, A, generator)
        tokens = torch.randint(0, 12, (B,), generator=generator)
        if number == 0:
            tokens[0] = 11  # the begin-of-sequence token at the first step
        state = randn(B, D, generator=generator)
        states = randn(B, S, D, generator=generator)
        shapes = f"previous_tokens ({B},), state ({B}, {D}) and states ({B}, {S}, {D}), with E={E}"
        result = expect_sequence(call(token_query_step, decoder, tokens, state, states),
                                 what=f"token_query_step(decoder, ...) for {shapes}", names=("logits", "state", "weights"))
        with torch.no_grad():
            want_logits, want_state, want_weights = decoder.step(tokens, state, states, state)
            variants = _token_step_variants(decoder, tokens, state, states)
        logits = expect_tensor(result[0], what=f"logits for {shapes}", shape=(B, 12), dtype="float")
        new_state = expect_tensor(result[1], what=f"new state for {shapes}", shape=(B, D), dtype="float")
        weights = expect_tensor(result[2], what=f"weights for {shapes}", shape=(B, S), dtype="float")
        got = [t.detach().double() for t in (logits, new_state, weights)]
        if S > 1 or number == 0:
            for mistake, wrong in variants.items():
                if all(torch.allclose(g, w.double(), atol=1e-5, rtol=1e-4) for g, w in zip(got, wrong)):
                    raise Mismatch(f"token_query_step for {shapes}: {mistake}")
        if torch.allclose(got[1], state.double(), atol=1e-6):
            raise Mismatch(f"new state for {shapes}: you returned the state you were given; return s_i, the GRU's output")
        expect_close(weights, want_weights, what=f"weights for {shapes}")
        expect_close(new_state, want_state, what=f"new state for {shapes}")
        expect_close(logits, want_logits, what=f"logits for {shapes}")
    return "your step equals the package's decoder.step for a decoder with token_in_query=True, at every size tried."
