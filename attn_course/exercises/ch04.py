"""Checks for the exercises of chapter 04, causal attention and masks.

Each check tries the notebook's case and then cases unlike it (other lengths, ``L != S``, left
padding, rows with nothing to attend to, scores near 100, float16 and bfloat16), names the usual
mistakes (the blocked convention, the upper triangle, off by one, padding on the query axis, a mask
cut from a fixed-size buffer (masks are tried up to T = 20), a leak test that looks at one position,
compares with a tolerance, or changes the later tokens in a way a leak through their centred copy, their
direction or their length does not see), and uses the shared mechanism of
``attn_course.exercises``: ``tril``/``triu`` and the package's mask helpers forbidden where the
exercise says so (``forbid=("tril", "attn_course")``), torch's and the package's attention in
exercise 2, inputs watched for changes in place. Exercise 2 also tries allowed scores far below any
finite fill (about -7e31: a fill of -1e4 or -1e9 hands the weight to the blocked keys) and one case on
another device (:func:`attn_course.exercises.other_device`: the GPU, else PyTorch's meta device, where a
tensor made without ``device=`` is named). The table of wrong answers is in tests/test_exercises_ch04.py.
"""

from __future__ import annotations

import math
import sys

import torch

from ..masks import causal_mask, combine_masks, padding_mask, sliding_window_mask
from ..scaled import SelfAttention, scaled_dot_product_attention
from . import (Mismatch, call, call_elsewhere, exercise, expect, expect_close, expect_on_device, expect_sequence,
               expect_tensor, forbidden, other_device, randn, rng)
from ._core import _StudentCodeFailed

__all__ = ["check_causal_mask", "check_masked_attention", "check_batch_mask", "check_leak_test", "check_sliding_window_mask"]


def _show(mask: torch.Tensor) -> str:
    return "\n".join("  " + " ".join("1" if bool(v) else "0" for v in row) for row in mask.reshape(-1, mask.size(-1)))


def _bool_mask(got, what: str, shape) -> torch.Tensor:
    T = shape[-1]
    if isinstance(got, torch.Tensor) and got.dim() == 2 and got.size(0) == got.size(1) and 0 < got.size(0) < T:
        raise Mismatch(f"{what}: expected shape {tuple(shape)}, got {tuple(got.shape)}: your mask stops at {got.size(0)} "
                       f"positions. Did you cut it from a mask of a fixed size (a buffer of max_len = {got.size(0)}, as "
                       "in section 11)? Slicing [:T, :T] cannot make it longer than the buffer: build the mask from T "
                       "itself (torch.arange(T))")
    got = expect_tensor(got, what=what, shape=shape)
    if got.dtype != torch.bool:
        raise Mismatch(f"{what} must return a bool tensor (True = may attend), got dtype {got.dtype}. Only a bool mask "
                       "means allowed or blocked: a float mask is *added* to the scores, so 1.0 and 0.0 would block nothing")
    return got.cpu()


@exercise(
    "Exercise 1, a causal mask without tril",
    hint="compare positions instead of cutting a triangle: a column of query positions against a row of key "
         "positions broadcasts to a (T, T) grid, True where the key comes no later than the query",
    forbid=("tril", "attn_course"),
)
def check_causal_mask(causal_mask_by_hand) -> str:
    for T in (5, 1, 2, 8, 20):  # 20: longer than section 11's buffer (max_len = 16)
        expected = causal_mask(T)
        what = f"causal_mask_by_hand({T})"
        got = _bool_mask(call(causal_mask_by_hand, T), what, (T, T))
        if T == 1:
            expect(bool(got.all()), "for T = 1 the single token must be allowed to attend to itself: [[True]]")
            continue
        ones = torch.ones(T, T, dtype=torch.bool)
        expect(not torch.equal(got, ~expected), f"{what}: your mask is True where attending is *blocked*: that is "
               f"nn.MultiheadAttention's convention. Here True must mean 'may attend'. You returned\n{_show(got)}")
        expect(not torch.equal(got, expected.T), f"{what}: your mask lets each token see the future (upper triangle). "
               f"You returned\n{_show(got)}")
        expect(not torch.equal(got, expected & ~torch.eye(T, dtype=torch.bool)),
               f"{what}: the diagonal is missing: each token may attend to itself (query i sees keys 0..i, i included)")
        expect(not torch.equal(got, expected | torch.eye(T, dtype=torch.bool).roll(1, dims=1)),
               f"{what}: off by one: each query also sees the next token (j <= i + 1). Query i may see keys 0..i only. "
               f"You returned\n{_show(got)}")
        expect(not torch.equal(got, ones), f"{what}: every position may attend everywhere: nothing is masked")
        if not torch.equal(got, expected):
            raise Mismatch(f"{what} should be\n{_show(expected)}\nbut you returned\n{_show(got)}")
    return "your mask is True exactly where key j <= query i, as attn_course.causal_mask, for every T tried."


def _diagnose_masked(output, weights, q, k, v, allowed, what: str) -> None:
    """Compare a (output, weights) answer with the package's masked attention, naming the usual mistakes.

    The result must be on the inputs' device and in their dtype; the comparisons themselves run on the CPU.
    """
    L, S = allowed.shape
    weights = expect_tensor(weights, what=f"weights for {what}", shape=(L, S), dtype="float", device=q)
    _same_dtype(weights, q, f"weights for {what}")
    output = expect_tensor(output, what=f"output for {what}", dtype="float", device=q)
    _same_dtype(output, q, f"output for {what}")
    q, k, v, allowed = (t.detach().cpu() for t in (q, k, v, allowed))
    weights, output = weights.detach().cpu(), output.detach().cpu()
    low = q.dtype in (torch.float16, torch.bfloat16)  # half precision: compared with float64 attention of the same inputs
    expected_output, expected_weights = scaled_dot_product_attention(*(t.double() if low else t for t in (q, k, v)),
                                                                     attn_mask=allowed)
    w = weights.double()
    empty = [int(i) for i in (~allowed.any(-1)).nonzero().flatten()]
    if bool(torch.isnan(w).any()):
        row = int(torch.isnan(w).any(-1).nonzero()[0])
        because = (f": row {row} has no key it may attend to, so its scores are all -inf and the softmax computes 0/0. "
                   "Give such rows zero weights") if row in empty else ""
        raise Mismatch(f"weights for {what}: your weights contain NaN in row {row}{because}")
    for row in empty:
        expect(not torch.allclose(w[row], torch.full((S,), 1.0 / S, dtype=torch.float64), atol=1e-3),
               f"weights for {what}: row {row} may attend to nothing but got weight 1/{S} on every key: a finite fill value "
               "(like -1e9) makes the softmax of an all-masked row uniform, so the query averages keys it must not see. "
               "Give such rows zero weights")
    blocked = w[~allowed]
    blocked_weight = blocked.abs().max().item() if blocked.numel() else 0.0
    expect(blocked_weight < 1e-6, f"weights for {what}: blocked positions must get weight exactly 0; the largest blocked weight "
           f"is {blocked_weight:.4f}. Is True = may attend? (mask where the mask is False)")
    scores = q.double() @ k.double().T  # (L, E) @ (E, S) -> (L, S)
    unscaled = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if not torch.allclose(unscaled, expected_weights.double(), atol=1e-3):
        expect(not torch.allclose(w, unscaled, atol=1e-4),
               f"weights for {what}: your weights are not scaled: divide the scores by sqrt(E) = {math.sqrt(q.size(-1)):.2f}")
    E = q.size(-1)
    for divisor, mistake in ((math.sqrt(8), f"sqrt(8), the notebook's E, but here E = {E}: take the width from q"),
                             (math.sqrt(S), f"sqrt(S) = sqrt({S}), the number of keys; the scale comes from the width E")):
        if abs(divisor - math.sqrt(E)) > 1e-9:
            other = torch.softmax((scores / divisor).masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
            if not torch.allclose(other, expected_weights.double(), atol=1e-3):
                expect(not torch.allclose(w, other, atol=1e-4), f"weights for {what}: you divided the scores by {mistake}")
    # Half precision's rounding: attention computed wholly in float16 stays within 4e-3 of float64 attention of the
    # same inputs, in bfloat16 (8 bits of mantissa) within 3e-2 (both measured over 200 draws of these sizes).
    tolerance = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}.get(q.dtype, {})
    expect_close(weights.float() if low else weights, expected_weights.float(), what=f"weights for {what}", **tolerance)
    expect_tensor(output, what=f"output for {what}", shape=expected_output.shape)
    if bool(torch.isnan(output).any()):
        raise Mismatch(f"output for {what}: your output contains NaN" + (
            f" (row {empty[0]} has no key to attend to: its output must be zeros)" if empty else ""))
    expect_close(output.float() if low else output, expected_output.float(), what=f"output for {what}", **tolerance)


def _same_dtype(got: torch.Tensor, like: torch.Tensor, what: str) -> None:
    expect(got.dtype == like.dtype, f"{what}: your result is {got.dtype} but the inputs were {like.dtype}: return the "
           "inputs' dtype, as ac.scaled_dot_product_attention does (compute in float32 inside if you like, then cast "
           "back)")


_SAFE_SOFTMAX = ("it is a private softmax that gives rows with nothing to attend to zero weights, the "
                 "very step this exercise asks you to write: use torch.softmax and handle those rows yourself")


def _run_masked(masked_attention, q, k, v, allowed, what: str):
    with forbidden(torch._safe_softmax, torch._masked_softmax, reason=_SAFE_SOFTMAX):
        result = call(masked_attention, q, k, v, allowed)
    return expect_sequence(result, what=f"masked_attention for {what}", names=("output", "weights"))


def _random_mask(L: int, S: int, generator: torch.Generator, empty_row: int | None = None) -> torch.Tensor:
    allowed = torch.rand(L, S, generator=generator) < 0.6  # (L, S)
    allowed[:, 0] |= True
    if empty_row is not None:
        allowed[empty_row] = False
    return allowed


def _spike(blocked_score: float) -> tuple:
    """Two queries, three keys; key 2 is blocked for both and scores ``blocked_score`` after the scale."""
    q = torch.zeros(2, 8)
    q[:, 0] = 20.0
    k = torch.zeros(3, 8)
    k[2, 0] = blocked_score * math.sqrt(8) / 20.0
    v = torch.arange(24, dtype=torch.float32).view(3, 8)
    allowed = torch.tensor([[True, True, False], [True, False, False]])
    return q, k, v, allowed


@exercise(
    "Exercise 2, masked attention that never returns NaN",
    hint="fill the blocked scores (where the mask is False) with minus infinity before the softmax; then find the "
         "rows with no allowed key at all and give them zero weights, so that their output is zero too",
    forbid=("sdpa", "attn_course"),
)
def check_masked_attention(masked_attention) -> str:
    generator = rng(41)
    # 1. The notebook's case: L = 4 queries, S = 5 keys, a scattered row and a row with nothing to attend to.
    L, S, E = 4, 5, 8
    q, k, v = (randn(n, E, generator=generator, scale=2.0) for n in (L, S, S))
    allowed = causal_mask(L, S)
    allowed[1] = torch.tensor([True, False, True, False, True])
    allowed[2] = False  # a query with nothing to attend to
    output, weights = _run_masked(masked_attention, q, k, v, allowed, "(L=4, S=5)")
    _diagnose_masked(output, weights, q, k, v, allowed, "(L=4, S=5)")

    # 2. A blocked key with a huge score: softmax-then-renormalise underflows to 0/0 here (section 3), and
    #    exp of the blocked score itself overflows.
    what = "a blocked key with a huge score (about 283 after scaling)"
    spike = _spike(800 / math.sqrt(8))
    spiky_out = expect_tensor(_run_masked(masked_attention, *spike, what)[0], what=f"output for {what}", shape=(2, 8))
    expected_spiky, _ = scaled_dot_product_attention(*spike[:3], attn_mask=spike[3])
    if bool(torch.isnan(spiky_out).any()) or torch.allclose(spiky_out.detach().float().cpu(), torch.zeros(2, 8)):
        # Which computation let the blocked score in? e^x overflows float32 above about 88.7, while a softmax taken
        # first underflows the allowed weights only when they sit more than about 103 below the blocked score (69
        # with a sum clamped at 1e-30): blocked scores of 95 and 80 tell the two apart.
        def probe(score: float) -> str:
            out = expect_tensor(_run_masked(masked_attention, *_spike(score), what)[0], what=f"output for {what}", shape=(2, 8))
            out = out.detach().float().cpu()
            if not bool(torch.isfinite(out).all()):
                return "not finite"
            right = scaled_dot_product_attention(*_spike(score)[:3], attn_mask=_spike(score)[3])[0]
            return "right" if torch.allclose(out, right, atol=1e-3, rtol=1e-3) else "wrong"

        at_95 = probe(95.0)
        overflow = at_95 == "not finite" or (at_95 == "wrong" and probe(80.0) == "right")
        if overflow:
            raise Mismatch(f"output for {what}: you get NaN or zeros. The blocked score went into an exponential: e^283 "
                           "overflows float32 to inf, and inf times a zero of the mask is NaN. Fill the blocked scores "
                           "with -inf before exponentiating (or before the softmax, which subtracts each row's maximum)")
        raise Mismatch(f"output for {what}: you get NaN or zeros. Did you take the softmax first and then zero and "
                       "renormalise the blocked weights? The huge blocked score takes all the weight in the first softmax, "
                       "the allowed weights underflow to 0, and 0/0 follows. Fill the blocked scores with -inf *before* "
                       "the softmax")
    expect_close(spiky_out, expected_spiky, what=f"output for {what}")

    # 3. Left padding behind a causal mask (the padding queries at the front see nothing), L != S, one
    #    query, and scores near +-100 in float32.
    T = 6
    real = padding_mask([3], T, side="left")[0]  # (T,): three padding tokens first
    left = causal_mask(T) & real[None, :]  # (T, T)
    cases = [("left padding behind a causal mask (T=6, 3 padding tokens first)", T, T, 5, left, 1.0),
             ("L=3 queries, S=7 keys", 3, 7, 4, _random_mask(3, 7, generator, empty_row=1), 1.0),
             ("one query, S=4 keys", 1, 4, 6, _random_mask(1, 4, generator), 1.0),
             ("L=5 queries, S=2 keys", 5, 2, 3, _random_mask(5, 2, generator, empty_row=4), 1.0),
             ("scores near ±100 (L=4, S=6)", 4, 6, 4, _random_mask(4, 6, generator), 7.0)]
    for what, L, S, E, allowed, scale in cases:
        q = randn(L, E, generator=generator, scale=scale)
        k = randn(S, E, generator=generator, scale=scale)
        v = randn(S, E, generator=generator)
        output, weights = _run_masked(masked_attention, q, k, v, allowed, what)
        _diagnose_masked(output, weights, q, k, v, allowed, what)

    # 4. Half precision, where -1e9 does not exist (section 4), and bfloat16: the output and the weights in
    #    the inputs' dtype, with row 2 (nothing to attend to) at zero.
    q, k, v = (randn(n, 8, generator=generator, scale=2.0) for n in (4, 5, 5))
    allowed = causal_mask(4, 5)
    allowed[2] = False
    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        what = f"{name} inputs (L=4, S=5, row 2 with nothing to attend to)"
        low = [t.to(dtype) for t in (q, k, v)]
        try:
            output, weights = _run_masked(masked_attention, *low, allowed, what)
        except _StudentCodeFailed as failed:
            if isinstance(failed.error, RuntimeError) and "overflow" in str(failed.error):
                raise Mismatch(f"for {what} your code raised {type(failed.error).__name__}: a fill value such as -1e9 "
                               f"does not exist in {name} (largest magnitude {torch.finfo(dtype).max:.0f}): fill with "
                               "float('-inf'), or with the smallest number of the scores' own dtype") from None
            raise
        _diagnose_masked(output, weights, *low, allowed, what)

    # 5. Allowed scores far below any finite fill (about -7e31): -1e4 (BERT's -10000.0) or -1e9 is then above
    #    them, and the blocked keys win the softmax. Only -inf (or the dtype's smallest number) stays below.
    what = "a query whose only allowed key scores about -7e31 (L=2, S=3)"
    q = torch.tensor([[1e16, 0.0], [0.0, 1.0]])
    k = torch.tensor([[-1e16, 0.0], [0.0, 1.0], [0.0, -1.0]])
    v = torch.arange(6, dtype=torch.float32).view(3, 2)
    allowed = torch.tensor([[True, False, False], [True, True, False]])
    output, weights = _run_masked(masked_attention, q, k, v, allowed, what)
    w = expect_tensor(weights, what=f"weights for {what}", shape=(2, 3), dtype="float").detach().double().cpu()
    if bool(torch.isfinite(w).all()) and float(w[0, 1:].sum()) > 0.5:
        raise Mismatch(f"weights for {what}: row 0 gives its blocked keys weight {round(float(w[0, 1:].sum()), 3)} and "
                       "its allowed key (score -7e31) almost nothing. A finite fill value (-1e4, -1e9 ...) is not below "
                       "every score: where the allowed scores are lower still, the blocked keys win the softmax. Fill "
                       "with float('-inf') (or torch.finfo(scores.dtype).min), which no allowed score is below")
    _diagnose_masked(output, weights, q, k, v, allowed, what)

    # 6. Once more on another device (the GPU, else the meta device, which has shapes and dtypes but no values):
    #    new tensors must follow the inputs' device.
    device = other_device()
    what = f"inputs on the {device.type} device (L=4, S=5, row 2 with nothing to attend to)"
    q, k, v = (randn(n, 8, generator=generator).to(device) for n in (4, 5, 5))
    allowed = causal_mask(4, 5, device=device)
    allowed[2] = False
    with forbidden(torch._safe_softmax, torch._masked_softmax, reason=_SAFE_SOFTMAX):
        got = call_elsewhere(masked_attention, q, k, v, allowed, device=device, what=f"masked_attention for {what}",
                             made_by="torch.zeros, torch.full, torch.tensor, torch.zeros(w.shape) ...")
    if got is not None:
        output, weights = expect_sequence(got, what=f"masked_attention for {what}", names=("output", "weights"))
        weights = expect_on_device(weights, device, f"weights for {what}", dtype="float")
        output = expect_on_device(output, device, f"output for {what}", dtype="float")
        expect_tensor(weights, what=f"weights for {what}", shape=(4, 5))
        expect_tensor(output, what=f"output for {what}", shape=(4, 8))
        if device.type != "meta":
            _diagnose_masked(output, weights, q, k, v, allowed, what)
    return ("blocked keys get weight 0, also when their score is huge, and rows with nothing to attend to give zeros "
            "instead of NaN, with left padding, at other sizes, in float32, float16 and bfloat16.")


@exercise(
    "Exercise 3, one mask for a padded batch of a causal model",
    hint="build the causal (T, T) mask and a (B, T) mask of real tokens by comparing positions with the lengths; "
         "the padding mask must block keys, so give it a length-one query axis in the middle before combining the "
         "two with a logical and",
    forbid=("attn_course",),
)
def check_batch_mask(batch_mask) -> str:
    # The first case has B == T, where a wrong broadcast runs silently; then B = 1, no padding at all,
    # and a short sequence in a long batch.
    # The last case pads beyond the longest sequence (a fixed block size).
    for lengths, T in (([4, 1, 3, 2], 4), ([5, 2, 4], 5), ([3], 3), ([6, 6], 6), ([1, 7], 7), ([2, 3], 5)):
        B = len(lengths)
        expected = combine_masks(causal_mask(T), padding=padding_mask(lengths, T))  # (B, T, T)
        what = f"batch_mask({lengths}, T={T})"
        got = expect_tensor(call(batch_mask, list(lengths), T), what=what)
        longest = max(lengths)
        expect(not (T != longest and tuple(got.shape) == (B, longest, longest)), f"{what}: your mask is "
               f"{tuple(got.shape)}: you used the longest length, {longest}, but the batch is padded to T = {T}")
        expect(got.dtype == torch.bool, f"{what} must be a bool mask (True = may attend), got dtype {got.dtype}")
        expect(got.dim() == 3, f"{what} must have shape (B, T, T) = {(B, T, T)}, one (T, T) mask per sequence; got {tuple(got.shape)}. "
               "A (B, S) padding mask has to be reshaped to (B, 1, S) before it meets the (T, T) causal mask")
        expect_tensor(got, what=what, shape=(B, T, T))
        got = got.cpu()
        if torch.equal(got, expected):
            continue
        padding = padding_mask(lengths, T)
        causal = causal_mask(T)
        wrong_axis = causal & padding[:, :, None]  # padding applied to the queries instead of the keys
        expect(not torch.equal(got, wrong_axis), f"{what}: your padding mask blocks the padding *queries* (their rows are all "
               "False), alone or together with the padding keys: behind the causal mask the two give this same mask. A "
               "padding mask must block the padding *keys* (columns) only. Behind the causal mask this hides the mistake for real tokens "
               "(they never see later padding anyway), but every padding query now has nothing to attend to: NaN in a naive "
               "softmax (section 7), and the same mask without the causal part would let real tokens read padding. "
               "A padding mask blocks keys: give it a query axis of length one, (B, 1, T)")
        expect(not torch.equal(got, causal.expand(B, T, T)), f"{what}: the padding is missing: every sequence got the plain causal mask")
        expect(not torch.equal(got, padding[:, None, :].expand(B, T, T)), f"{what}: the causal part is missing: tokens can see later tokens")
        expect(not torch.equal(got, ~expected), f"{what}: your mask is in the blocked convention (True = blocked); here True must mean 'may attend'")
        left = combine_masks(causal, padding=padding_mask(lengths, T, side="left"))
        expect(not torch.equal(got, left), f"{what}: your padding is at the front (left padding, section 7); this "
               "exercise's sequences are padded at the end, as in section 5: sequence b's real tokens are positions "
               "0 to lengths[b] - 1")
        b = int((got != expected).flatten(1).any(1).nonzero()[0])
        raise Mismatch(f"{what}: the mask of sequence {b} (length {lengths[b]}) should be\n{_show(expected[b])}\nbut you returned\n{_show(got[b])}")
    return "every sequence gets the causal mask, with its padding keys blocked for every query, for every batch tried."


def _attention_models():
    """Callables x (B, T, E) -> outputs (B, T, E), with whether each lets the future leak into the past
    and, for the leaky ones, what a leak test must do to catch it."""
    torch.manual_seed(42)
    E = 6
    attention = SelfAttention(E, E)

    def causal(x):
        return attention(x, is_causal=True)[0]

    def full(x):
        return attention(x)[0]

    def one_ahead(x):  # each token also sees the next one
        T = x.size(-2)
        i = torch.arange(T, device=x.device)
        return attention(x, attn_mask=i[None, :] <= i[:, None] + 1)[0]

    def first_peeks(x):  # causal, except that the first output moves by a millionth of any change of token 3
        out = attention(x, is_causal=True)[0].clone()
        out[:, 0] = out[:, 0] + 1e-6 * x[:, 3]
        return out

    def rounding_peeks(x):
        # Outputs of about 1e-5 (2^-17), and output 0 moves by at most one rounding step of float32 when token 3
        # changes: relative 1e-7 or less, absolute 1e-12 or less. A differentiable leak (the derivative is
        # 3.7 rounding steps per unit of x), which only an exact comparison sees.
        out = attention(x, is_causal=True)[0] * 2.0 ** -17
        base = 2.0 ** -17 * (1.6 + 0.35 * torch.tanh(out[:, 0] * 2.0 ** 17))  # in [1.25, 1.95] * 2^-17
        step = 2.0 ** -40  # one rounding step of float32 there
        leak = step * torch.remainder(3.7 * x[:, 3], 1.0)  # (B, E): from 0 to less than one step
        out = out.clone()
        out[:, 0] = base + leak  # rounds to base or to base plus one step
        return out

    def middle_peeks(x):
        # Causal, except that output 4 peeks at token 5's direction (as F.normalize, a cosine or a LayerNorm without
        # eps would give): position 0 never moves, and scaling token 5 by a positive number leaves the leak as it was.
        out = attention(x, is_causal=True)[0].clone()
        out[:, 4] = out[:, 4] + 1e-3 * torch.nn.functional.normalize(x[:, 5], dim=-1)
        return out

    def last_leaks(x):  # causal, except that the next-to-last output sees the last token
        T = x.size(-2)
        allowed = causal_mask(T, device=x.device)
        allowed[T - 2, T - 1] = True
        return attention(x, attn_mask=allowed)[0]

    def second_sequence_peeks(x):
        # Causal for sequence 0; in sequence 1, output 2 takes in token 5 minus its mean over the features (as a
        # LayerNorm-like step would): the gradient of any sum of the outputs over the features is 0 there.
        out = attention(x, is_causal=True)[0].clone()
        out[1:, 2] = out[1:, 2] + 1e-3 * (x[1:, 5] - x[1:, 5].mean(-1, keepdim=True))
        return out

    def first_sees_second(x):  # causal, except that output 0 also sees token 1: the only leak is at t = 0
        T = x.size(-2)
        allowed = causal_mask(T, device=x.device)
        allowed[0, 1] = True
        return attention(x, attn_mask=allowed)[0]

    def first_sequence_peeks(x):
        # Causal for every sequence but the first; in sequence 0, output 2 takes in token 5's length (as an RMS
        # statistic would) through a path without gradient (a value taken with .detach(), as a statistic computed
        # under no_grad would be): every gradient, and the whole Jacobian, is 0 there, and negating token 5 or
        # permuting its features leaves the leak as it was.
        out = attention(x, is_causal=True)[0].clone()
        out[:1, 2] = out[:1, 2] + 1e-3 * x[:1, 5].detach().norm(dim=-1, keepdim=True)
        return out

    def only_itself(x):
        T = x.size(-2)
        return attention(x, attn_mask=torch.eye(T, dtype=torch.bool, device=x.device))[0]

    def sliding_window(x):  # causal, each token sees itself and the two before it
        return attention(x, attn_mask=sliding_window_mask(x.size(-2), 3, device=x.device))[0]

    def small_causal(x):  # the same outputs as rounding_peeks, without its leak
        out = attention(x, is_causal=True)[0] * 2.0 ** -17
        out = out.clone()
        out[:, 0] = 2.0 ** -17 * (1.6 + 0.35 * torch.tanh(out[:, 0] * 2.0 ** 17))
        return out

    every_position = "a leak test must compare the outputs at every earlier position, not only position 0"
    exactly = "compare exactly (torch.equal): the causal mask gives earlier outputs that are bit-for-bit the same"
    return E, [
        ("causal self-attention", causal, False, ""),
        ("self-attention without a mask", full, True, ""),
        ("attention that also sees the next token", one_ahead, True,
         "it leaks from token t + 1 into output t only: after changing the tokens after t, compare outputs 0..t, t included"),
        ("causal attention whose first output moves by a millionth of any change of token 3", first_peeks, True,
         f"the leak is a millionth of the change, about 1e-6: a tolerance that large misses it; {exactly}"),
        ("causal attention with outputs of about 1e-5 whose first output moves by at most one rounding step of float32 "
         "(about 1e-12, or 1e-7 of its size) when token 3 changes", rounding_peeks, True,
         f"no tolerance, absolute or relative, is smaller than one rounding step; {exactly}"),
        ("causal attention whose output 4 peeks at token 5 (by 0.001 times its direction, token 5 divided by its length)",
         middle_peeks, True,
         f"output 0 never moves in this model: {every_position}, and exactly"),
        ("attention in which the next-to-last output also sees the last token", last_leaks, True,
         f"only the last token leaks, and only into output T - 2: {every_position}"),
        ("causal attention in which output 2 of the second sequence peeks at token 5 (by 0.001, through token 5 minus its "
         "mean over the features)", second_sequence_peeks, True,
         "the leak is in the second sequence of the batch only: compare every sequence's earlier outputs, not the first "
         "sequence's"),
        ("attention in which output 0 also sees token 1 (and nothing else leaks)", first_sees_second, True,
         "the only leak is from token 1 into output 0: does your loop skip t = 0? Start at t = 0: change the tokens "
         "after 0 and compare output 0"),
        ("causal attention in which output 2 of the first sequence peeks at token 5 (by 0.001 times its length, through "
         "a path without gradient)", first_sequence_peeks, True,
         "the leak is in the first sequence of the batch only: compare every sequence's earlier outputs, not only the last "
         "one's (a flag set in a loop over the sequences must not be overwritten by the next sequence: combine them with "
         "or, or compare the whole batch at once)"),
        ("attention in which each token sees only itself", only_itself, False, ""),
        ("sliding-window causal attention (each token sees itself and the two before it)", sliding_window, False, ""),
        ("causal attention with outputs of about 1e-5", small_causal, False, ""),
    ]


def _as_bool(answer):
    """True or False from a bool, a numpy bool or a one-element tensor; anything else unchanged."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and answer.dtype == torch.bool:
        return bool(answer)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(answer, numpy.bool_):
        return bool(answer)
    return answer


def _watched(model, lengths: list, x: torch.Tensor, changes: list, gradients: list | None = None,
             shifts: list | None = None, scalings: list | None = None, same_lengths: list | None = None):
    """``model``, noting the length of every input it is given (a leak test that runs shorter inputs), for
    inputs of ``x``'s shape how far they are from ``x`` (a leak test whose changes are too small to see) and
    whether a changed one differs from ``x`` by the same number in every feature of each token (a shift, which
    a centred copy of a token does not see), whether every changed token keeps its direction (a scaling, which
    a token's direction does not see) or its length (a negation or a permutation of its features, which a
    token's length does not see), and whether an input tracks gradients (a leak test built on gradients or a
    Jacobian)."""
    def run(inputs):
        lengths.append(int(inputs.size(-2)) if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else -1)
        if gradients is not None and isinstance(inputs, torch.Tensor) and inputs.requires_grad:
            gradients.append(True)
        if isinstance(inputs, torch.Tensor) and inputs.shape == x.shape and inputs.is_floating_point():
            change = inputs.detach().cpu().double() - x.double()  # (B, T, E)
            changes.append(float(change.abs().max()))
            if shifts is not None and changes[-1] > 0:
                spread = float((change - change.mean(-1, keepdim=True)).abs().max())  # 0 up to float32's rounding for a shift
                shifts.append(spread <= 1e-3 * changes[-1])
            if changes[-1] > 0 and (scalings is not None or same_lengths is not None):
                new, old = inputs.detach().cpu().double(), x.double()  # (B, T, E)
                moved = (new != old).any(-1)  # (B, T): the tokens that changed
                new, old = new[moved], old[moved]  # (N, E)
                if scalings is not None:
                    cosine = torch.nn.functional.cosine_similarity(new, old, dim=-1)
                    scalings.append(bool((cosine > 1 - 1e-9).all()))
                if same_lengths is not None:
                    same_lengths.append(bool(torch.allclose(new.norm(dim=-1), old.norm(dim=-1), rtol=1e-9, atol=0.0)))
        return model(inputs)
    return run


@exercise(
    "Exercise 4, a leak test",
    hint="for each position t, change every token after t (in a copy), run the model on both inputs and compare the "
         "outputs up to t, t included, of every sequence, exactly; one position, one sequence or a tolerance can each "
         "miss a leak",
)
def check_leak_test(leaks_future) -> str:
    E, models = _attention_models()
    x = randn(2, 7, E, generator=rng(43))
    # A test that reads gradients sees only differentiable dependence, and a gradient of a sum can cancel out:
    # two leaky models are built so that such a test misses their leak.
    through_gradients = {
        "second_sequence_peeks": "the leak is token 5 minus its mean over the features (as a LayerNorm-like step "
                                 "makes), whose gradient sums to zero over the features: the gradient of a sum of "
                                 "outputs is exactly 0 there although output 2 moves",
        "first_sequence_peeks": "the leak (token 5's length) goes through a path without gradient (a value taken with "
                                ".detach(), as a statistic computed under no_grad would be; a count of tokens or a "
                                "rounding would do the same): every gradient, and the whole Jacobian, is 0 there "
                                "although output 2 moves",
    }
    for name, model, leaks, how_to_catch in models:
        lengths, changes, gradients, shifts, scalings, same_lengths = [], [], [], [], [], []
        # Gradients stay on, so that a test built on them runs, and is named below where it misses a leak.
        answer = _as_bool(call(leaks_future, _watched(model, lengths, x, changes, gradients, shifts, scalings,
                                                      same_lengths), x))
        expect(isinstance(answer, bool), f"leaks_future must return True or False; for the {name} it returned "
               f"{type(answer).__name__} {answer!r}")
        if any(0 <= n < x.size(-2) for n in lengths):
            # Rejected on every machine, whatever the answers: whether a prefix gives bit-for-bit the first outputs of
            # the full input depends on the machine and the length (on a CPU with torch 2.13, this causal model's
            # prefixes of 3 tokens or more do, those of 1 and 2 do not).
            raise Mismatch(f"for the {name} your test ran the model on a shorter input (the first tokens only) and "
                           "compared its outputs with the first outputs of the full input. A shorter input need not give "
                           "bit-for-bit the same outputs, even in causal attention: another length may be computed in "
                           "another order and round differently (by about 1e-7), so such a test can report a leak where "
                           "there is none, depending on the machine. Keep the length: change the later tokens instead, "
                           "and compare exactly.")
        if leaks and not answer and changes and 0 < max(changes) < 0.05:
            raise Mismatch(f"for the {name} you returned False, but later tokens do change earlier outputs there. Your "
                           f"changes to the tokens are tiny (at most {max(changes):.0e}): a leak in proportion to the change "
                           "then hides below float32's rounding. Change the later tokens for new ones (new random vectors, "
                           "say), and compare exactly.")
        if leaks and not answer and shifts and all(shifts) and model.__name__ == "second_sequence_peeks":
            raise Mismatch(f"for the {name} you returned False, but later tokens do change earlier outputs there. Your "
                           "changes add the same number to every feature of a token, and this leak is a token minus its "
                           "mean over the features (as a LayerNorm-like step makes), which such a shift leaves exactly as "
                           "it was. Change the later tokens for new ones (new random vectors, say), and compare exactly.")
        if leaks and not answer and scalings and all(scalings) and model.__name__ == "middle_peeks":
            raise Mismatch(f"for the {name} you returned False, but later tokens do change earlier outputs there. Your "
                           "changes multiply the later tokens by a positive number, and this leak is a token's direction "
                           "(as F.normalize, a cosine or a LayerNorm without eps gives), which such a scaling leaves "
                           "exactly as it was. Change the later tokens for new ones (new random vectors, say), and compare "
                           "exactly.")
        if leaks and not answer and same_lengths and all(same_lengths) and model.__name__ == "first_sequence_peeks" \
                and not gradients:
            raise Mismatch(f"for the {name} you returned False, but later tokens do change earlier outputs there. Your "
                           "changes keep each later token's length (negating it, or permuting or flipping the signs of "
                           "its features), and this leak is a token's length (as an RMS statistic gives), which such a "
                           "change leaves exactly as it was. Change the later tokens for new ones (new random vectors, "
                           "say), and compare exactly.")
        if leaks and not answer and gradients and model.__name__ in through_gradients:
            raise Mismatch(f"for the {name} you returned False, but later tokens do change earlier outputs there. Your "
                           f"test reads gradients, and {through_gradients[model.__name__]}. A gradient shows only "
                           "differentiable dependence, so it can miss a leak: change the later tokens (in a copy) and "
                           "compare the outputs exactly.")
        if leaks:
            expect(answer, f"for the {name} you returned False, but later tokens do change earlier outputs there: {how_to_catch}.")
        else:
            expect(not answer, f"for the {name} you returned True, but no later token changes an earlier output there. Outputs at "
                   "and after a changed token may move: compare only the positions before it (change the tokens after t, "
                   "compare the outputs up to t); and change the tokens in x, not the outputs.")
    n_leaky = sum(leaks for _, _, leaks, _ in models)
    return (f"your test tells leaky from causal attention in all {len(models)} models: it catches all {n_leaky} leaky ones, "
            "including a leak of one rounding step, one that never reaches position 0, one from token 1 into output 0 only, "
            "one in the first sequence only and one in the second only.")


@exercise(
    "Exercise 5, a sliding-window mask",
    hint="compare positions, as in exercise 1: the distance from query i back to key j is i minus j, and a key may be "
         "attended to when that distance is at least zero and less than the window",
    forbid=("tril", "attn_course"),
)
def check_sliding_window_mask(sliding_window_mask_by_hand) -> str:
    for T, window in ((7, 3), (6, 1), (5, 5), (4, 9), (1, 1), (8, 2), (20, 4)):  # 20: longer than a buffer of 16
        expected = sliding_window_mask(T, window)  # (T, T), True = may attend
        what = f"sliding_window_mask_by_hand(T={T}, window={window})"
        got = _bool_mask(call(sliding_window_mask_by_hand, T, window), what, (T, T))
        if torch.equal(got, expected):
            continue
        query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T)
        distance = query - key  # (T, T), i - j
        causal = distance >= 0
        shown = f"You returned\n{_show(got)}\nbut it should be\n{_show(expected)}"
        expect(not torch.equal(got, ~expected), f"{what}: your mask is True where attending is *blocked* (nn.MultiheadAttention's "
               "convention); here True must mean 'may attend'")
        expect(not torch.equal(got, distance.abs() < window), f"{what}: your band is symmetric, so each query also sees the "
               f"{window - 1} keys after it (the future). Keep only i - j >= 0. {shown}")
        expect(not torch.equal(got, expected.T), f"{what}: your window looks forward (the upper side of the diagonal): query i "
               f"sees keys i..i + window - 1. It must look back, at keys i - window + 1..i. {shown}")
        expect(not torch.equal(got, (distance >= 0) & (distance <= window)), f"{what}: off by one: each query sees window + 1 = "
               f"{window + 1} keys. The window counts the query itself: keys i - window + 1..i, that is 0 <= i - j < window. {shown}")
        expect(not torch.equal(got, (distance >= 0) & (distance < window - 1)), f"{what}: off by one: each query sees only "
               f"window - 1 = {window - 1} keys. The window counts the query itself: 0 <= i - j < window. {shown}")
        expect(not torch.equal(got, (distance > 0) & (distance <= window)), f"{what}: the diagonal is missing: a query sees "
               f"itself and the {window - 1} keys before it, not the {window} keys before it. {shown}")
        expect(not torch.equal(got, causal), f"{what}: this is the plain causal mask: keys more than window - 1 = {window - 1} "
               f"positions back must be blocked. {shown}")
        expect(not torch.equal(got, distance < window), f"{what}: the causal part is missing: your mask lets each query see "
               f"every later key. {shown}")
        raise Mismatch(f"{what}: {shown}")
    return ("your mask equals attn_course.sliding_window_mask for T = 7 with window 3, and in the edge cases "
            "window = 1, window >= T and T = 1.")
