"""Checks for the exercises of chapter 04, causal attention and masks."""

from __future__ import annotations

import math

import torch

from ..masks import causal_mask, combine_masks, padding_mask, sliding_window_mask
from ..scaled import SelfAttention, scaled_dot_product_attention
from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_causal_mask", "check_masked_attention", "check_batch_mask", "check_leak_test", "check_sliding_window_mask"]


def _show(mask: torch.Tensor) -> str:
    return "\n".join("  " + " ".join("1" if bool(v) else "0" for v in row) for row in mask.reshape(-1, mask.size(-1)))


@exercise(
    "Exercise 1, a causal mask without tril",
    hint="compare positions: torch.arange(T)[None, :] <= torch.arange(T)[:, None] is True where key j <= query i",
)
def check_causal_mask(causal_mask_by_hand) -> str:
    for T in (5, 1):
        expected = causal_mask(T)
        got = expect_tensor(call(causal_mask_by_hand, T), what=f"causal_mask_by_hand({T})", shape=(T, T))
        if got.dtype != torch.bool:
            as_bool = got != 0
            hint = " (your numbers are the right pattern)" if torch.equal(as_bool.cpu(), expected) else ""
            raise Mismatch(
                f"causal_mask_by_hand({T}) must return a bool tensor (True = may attend), got dtype {got.dtype}{hint}. "
                "A float mask means something else: it is *added* to the scores, so 1.0 and 0.0 would block nothing."
            )
        got = got.cpu()
        if T == 1:
            expect(bool(got.all()), "for T = 1 the single token must be allowed to attend to itself: [[True]]")
            continue
        expect(not torch.equal(got, ~expected), "your mask is True where attending is *blocked*: that is nn.MultiheadAttention's "
               f"convention. Here True must mean 'may attend'. You returned\n{_show(got)}")
        expect(not torch.equal(got, expected.T), f"your mask lets each token see the future (upper triangle). You returned\n{_show(got)}")
        expect(not torch.equal(got, expected & ~torch.eye(T, dtype=torch.bool)),
               "the diagonal is missing: each token may attend to itself (query i sees keys 0..i, i included)")
        expect(not torch.equal(got, torch.ones(T, T, dtype=torch.bool).tril(1)),
               f"off by one: each query also sees the next token (j <= i + 1). Query i may see keys 0..i only. You returned\n{_show(got)}")
        if not torch.equal(got, expected):
            raise Mismatch(f"causal_mask_by_hand({T}) should be\n{_show(expected)}\nbut you returned\n{_show(got)}")
    return "your mask is True exactly where key j <= query i, as attn_course.causal_mask."


def _masked_attention_case():
    generator = torch.Generator().manual_seed(41)
    L, S, E = 4, 5, 8
    q, k, v = (torch.randn(n, E, generator=generator) * 2 for n in (L, S, S))
    allowed = causal_mask(L, S)
    allowed[1] = torch.tensor([True, False, True, False, True])
    allowed[2] = False  # a query with nothing to attend to
    return q, k, v, allowed


@exercise(
    "Exercise 2, masked attention that never returns NaN",
    hint="scores.masked_fill(~allowed, float('-inf')) before the softmax; find the rows where ~allowed.any(-1) "
    "and set their weights to zero (torch.where or masked_fill) after it",
)
def check_masked_attention(masked_attention) -> str:
    q, k, v, allowed = _masked_attention_case()
    result = call(masked_attention, q.clone(), k.clone(), v.clone(), allowed.clone())
    expect(isinstance(result, tuple) and len(result) == 2, f"return a pair (output, weights); got {type(result).__name__}")
    output, weights = result
    expected_output, expected_weights = scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    L, S = allowed.shape
    weights = expect_tensor(weights, what=f"weights (L={L}, S={S})", shape=(L, S)).detach().cpu().double()
    empty = 2
    if bool(torch.isnan(weights).any()):
        raise Mismatch(f"your weights contain NaN in row {int(torch.isnan(weights).any(-1).nonzero()[0])}: row {empty} has no key "
                       "it may attend to, so its scores are all -inf and softmax computes 0/0")
    expect(not torch.allclose(weights[empty], torch.full((S,), 1.0 / S, dtype=torch.float64), atol=1e-4),
           f"row {empty} may attend to nothing but got weight 1/{S} on every key: a finite fill value (like -1e9) makes "
           "the softmax of an all-masked row uniform, so the query averages keys it must not see. Use -inf, and zero that row")
    blocked_weight = weights[~allowed].abs().max().item()
    expect(blocked_weight < 1e-6, f"blocked positions must get weight exactly 0; the largest blocked weight is {blocked_weight:.4f}. "
           "Is True = may attend? (mask with ~allowed)")
    unscaled = torch.softmax((q @ k.T).masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0).double()
    expect(not torch.allclose(weights, unscaled, atol=1e-5), f"your weights are not scaled: divide the scores by sqrt(E) = {math.sqrt(q.size(-1)):.2f}")
    expect_close(weights, expected_weights, what=f"weights (L={L}, S={S})")
    output = expect_tensor(output, what=f"output (L={L}, E={v.size(-1)})", shape=expected_output.shape)
    expect(not bool(torch.isnan(output).any()), f"your output contains NaN (row {empty} has no key to attend to: its output must be zeros)")
    expect_close(output, expected_output, what=f"output (L={L}, E={v.size(-1)})")

    # A blocked key with a huge score: softmax-then-renormalise underflows to 0/0 here (section 3).
    spiky_q = torch.zeros(2, 8)
    spiky_q[:, 0] = 20.0
    spiky_k = torch.zeros(3, 8)
    spiky_k[2, 0] = 40.0  # key 2 scores 800 / sqrt(8) with both queries, and both may not see it
    spiky_v = torch.arange(24, dtype=torch.float32).view(3, 8)
    spiky_allowed = torch.tensor([[True, True, False], [True, False, False]])
    what = "output when a blocked key has a huge score (about 283 after scaling)"
    result = call(masked_attention, spiky_q, spiky_k, spiky_v, spiky_allowed)
    expect(isinstance(result, tuple) and len(result) == 2, f"return a pair (output, weights); got {type(result).__name__}")
    spiky_out = expect_tensor(result[0], what=what, shape=(2, 8))
    expected_spiky, _ = scaled_dot_product_attention(spiky_q, spiky_k, spiky_v, attn_mask=spiky_allowed)
    expect(not bool(torch.isnan(spiky_out).any()) and not torch.allclose(spiky_out.detach().float().cpu(), torch.zeros(2, 8)),
           f"{what}: you get NaN or zeros. Did you take the softmax first and then zero and renormalise the blocked weights? The "
           "huge blocked score takes all the weight in the first softmax, the allowed weights underflow to 0, and 0/0 follows. "
           "Fill the blocked scores with -inf *before* the softmax")
    expect_close(spiky_out, expected_spiky, what=what)

    # Half precision, where -1e9 does not exist (section 4).
    q16, k16, v16 = (t.to(torch.float16) for t in (q, k, v))
    try:
        result = masked_attention(q16, k16, v16, allowed.clone())
    except RuntimeError as error:
        raise Mismatch(f"in float16 your code raised RuntimeError: {error}. A fill value such as -1e9 does not exist in "
                       "float16 (largest magnitude 65504, section 4): fill with float('-inf')") from None
    except Exception as error:
        raise Mismatch(f"in float16 your code raised {type(error).__name__}: {error}") from None
    what = "output for float16 inputs"
    expect(isinstance(result, tuple) and len(result) == 2, f"{what}: return a pair (output, weights); got {type(result).__name__}")
    out16 = expect_tensor(result[0], what=what, shape=expected_output.shape)
    expect(not bool(torch.isnan(out16).any()), f"{what}: your output contains NaN (row {empty} has no key to attend to)")
    expect_close(out16.float(), expected_output, what=what, atol=2e-2, rtol=2e-2)
    return (f"blocked keys get weight 0, also when their score is huge, and row {empty}, with nothing to attend to, gives zeros "
            "instead of NaN, in float32 and in float16.")


@exercise(
    "Exercise 3, one mask for a padded batch of a causal model",
    hint="causal (T, T) & padding[:, None, :] -> (B, T, T): the padding mask must broadcast over the queries, "
    "so that it blocks the same keys for every query",
)
def check_batch_mask(batch_mask) -> str:
    for lengths, T in (([4, 1, 3, 2], 4), ([5, 2, 4], 5)):  # the first has B == T, where a wrong broadcast runs silently
        B = len(lengths)
        expected = combine_masks(causal_mask(T), padding=padding_mask(lengths, T))  # (B, T, T)
        what = f"batch_mask({lengths}, T={T})"
        got = expect_tensor(call(batch_mask, list(lengths), T), what=what)
        expect(got.dtype == torch.bool, f"{what} must be a bool mask (True = may attend), got dtype {got.dtype}")
        expect(got.dim() == 3, f"{what} must have shape (B, T, T) = {(B, T, T)}, one (T, T) mask per sequence; got {tuple(got.shape)}. "
               "A (B, S) padding mask has to be reshaped to (B, 1, S) before it meets the (T, T) causal mask")
        expect_tensor(got, what=what, shape=(B, T, T))
        got = got.cpu()
        padding = padding_mask(lengths, T)
        causal = causal_mask(T)
        wrong_axis = causal & padding[:, :, None]  # padding applied to the queries instead of the keys
        expect(not torch.equal(got, wrong_axis), f"{what}: your padding mask blocks the padding *queries* (their rows are all "
               "False) instead of the padding *keys* (columns). Behind the causal mask this hides the mistake for real tokens "
               "(they never see later padding anyway), but every padding query now has nothing to attend to: NaN in a naive "
               "softmax (section 7), and the same mask without the causal part would let real tokens read padding. "
               "A padding mask blocks keys: padding[:, None, :]")
        expect(not torch.equal(got, causal.expand(B, T, T)), f"{what}: the padding is missing: every sequence got the plain causal mask")
        expect(not torch.equal(got, padding[:, None, :].expand(B, T, T)), f"{what}: the causal part is missing: tokens can see later tokens")
        expect(not torch.equal(got, ~expected), f"{what}: your mask is in the blocked convention (True = blocked); here True must mean 'may attend'")
        if not torch.equal(got, expected):
            b = int((got != expected).flatten(1).any(1).nonzero()[0])
            raise Mismatch(f"{what}: the mask of sequence {b} (length {lengths[b]}) should be\n{_show(expected[b])}\nbut you returned\n{_show(got[b])}")
    return "every sequence gets the causal mask, with its padding keys blocked for every query."


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
        return attention(x, attn_mask=torch.ones(T, T, dtype=torch.bool, device=x.device).tril(1))[0]

    def first_peeks(x):  # causal, except that the first output peeks at token 3
        out = attention(x, is_causal=True)[0].clone()
        out[:, 0] = out[:, 0] + 1e-3 * x[:, 3]
        return out

    def middle_peeks(x):  # causal, except that output 4 peeks at token 5: position 0 never moves
        out = attention(x, is_causal=True)[0].clone()
        out[:, 4] = out[:, 4] + 1e-3 * x[:, 5]
        return out

    def last_leaks(x):  # causal, except that the next-to-last output sees the last token
        T = x.size(-2)
        allowed = causal_mask(T, device=x.device)
        allowed[T - 2, T - 1] = True
        return attention(x, attn_mask=allowed)[0]

    def second_sequence_peeks(x):  # causal for sequence 0; in sequence 1, output 2 peeks at token 5
        out = attention(x, is_causal=True)[0].clone()
        out[1:, 2] = out[1:, 2] + 1e-3 * x[1:, 5]
        return out

    def only_itself(x):
        T = x.size(-2)
        return attention(x, attn_mask=torch.eye(T, dtype=torch.bool, device=x.device))[0]

    def sliding_window(x):  # causal, each token sees itself and the two before it
        return attention(x, attn_mask=sliding_window_mask(x.size(-2), 3, device=x.device))[0]

    every_position = "a leak test must compare the outputs at every earlier position, not only position 0"
    return E, [
        ("causal self-attention", causal, False, ""),
        ("self-attention without a mask", full, True, ""),
        ("attention that also sees the next token", one_ahead, True,
         "it leaks from token t + 1 into output t only: after changing the tokens after t, compare outputs 0..t, t included"),
        ("causal attention whose first output peeks at token 3 (by 0.001)", first_peeks, True,
         "the leak is 0.001: compare exactly (torch.equal), or with a tolerance far below it"),
        ("causal attention whose output 4 peeks at token 5 (by 0.001)", middle_peeks, True,
         f"output 0 never moves in this model: {every_position}, and exactly"),
        ("attention in which the next-to-last output also sees the last token", last_leaks, True,
         f"only the last token leaks, and only into output T - 2: {every_position}"),
        ("causal attention in which output 2 of the second sequence peeks at token 5 (by 0.001)", second_sequence_peeks, True,
         "the leak is in the second sequence of the batch only: compare every sequence, outputs[:, :t + 1], not outputs[0]"),
        ("attention in which each token sees only itself", only_itself, False, ""),
        ("sliding-window causal attention (each token sees itself and the two before it)", sliding_window, False, ""),
    ]


@exercise(
    "Exercise 4, a leak test",
    hint="for each position t, copy x, replace every token after t with new random vectors, run the model on both "
    "and compare outputs[:, :t + 1] (every sequence, every position up to t) with torch.equal",
)
def check_leak_test(leaks_future) -> str:
    E, models = _attention_models()
    x = torch.randn(2, 7, E, generator=torch.Generator().manual_seed(43))
    for name, model, leaks, how_to_catch in models:
        with torch.no_grad():
            answer = call(leaks_future, model, x.clone())
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            answer = bool(answer)
        expect(isinstance(answer, bool), f"leaks_future must return True or False; for the {name} it returned {type(answer).__name__} {answer!r}")
        if leaks:
            expect(answer, f"for the {name} you returned False, but later tokens do change earlier outputs there: {how_to_catch}.")
        else:
            expect(not answer, f"for the {name} you returned True, but no later token changes an earlier output there. Outputs at "
                   "and after a changed token may move: compare only the positions before it (change the tokens after t, "
                   "compare outputs[:, :t + 1]); and change the tokens in x, not the outputs.")
    n_leaky = sum(leaks for _, _, leaks, _ in models)
    return (f"your test tells leaky from causal attention in all {len(models)} models: it catches all {n_leaky} leaky ones, "
            "including a leak of 0.001 that never reaches position 0 and one in the second sequence only.")


@exercise(
    "Exercise 5, a sliding-window mask",
    hint="compare positions: with i = torch.arange(T)[:, None] (queries) and j = torch.arange(T)[None, :] (keys), "
    "query i may attend to key j when 0 <= i - j < window",
)
def check_sliding_window_mask(sliding_window_mask_by_hand) -> str:
    for T, window in ((7, 3), (6, 1), (5, 5), (4, 9)):
        expected = sliding_window_mask(T, window)  # (T, T), True = may attend
        what = f"sliding_window_mask_by_hand(T={T}, window={window})"
        got = expect_tensor(call(sliding_window_mask_by_hand, T, window), what=what, shape=(T, T))
        if got.dtype != torch.bool:
            raise Mismatch(f"{what} must return a bool tensor (True = may attend), got dtype {got.dtype}. A float mask is "
                           "*added* to the scores, so 1.0 and 0.0 would block nothing")
        got = got.cpu()
        if torch.equal(got, expected):
            continue
        query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T)
        distance = query - key  # (T, T), i - j
        causal = causal_mask(T)
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
            "window = 1 and window >= T.")
