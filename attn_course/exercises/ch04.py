"""Checks for the exercises of chapter 04, causal attention and masks."""

from __future__ import annotations

import math

import torch

from ..masks import causal_mask, combine_masks, padding_mask
from ..scaled import SelfAttention, scaled_dot_product_attention
from . import Mismatch, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_causal_mask", "check_masked_attention", "check_batch_mask", "check_leak_test"]


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
    return f"blocked keys get weight 0, and row {empty}, with nothing to attend to, gives zeros instead of NaN."


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
        expect(not torch.equal(got, wrong_axis), f"{what}: your padding mask blocks *queries* (rows) instead of *keys* "
               "(columns): real tokens can still attend to padding. Use padding[:, None, :]")
        expect(not torch.equal(got, causal.expand(B, T, T)), f"{what}: the padding is missing: every sequence got the plain causal mask")
        expect(not torch.equal(got, padding[:, None, :].expand(B, T, T)), f"{what}: the causal part is missing: tokens can see later tokens")
        expect(not torch.equal(got, ~expected), f"{what}: your mask is in the blocked convention (True = blocked); here True must mean 'may attend'")
        if not torch.equal(got, expected):
            b = int((got != expected).flatten(1).any(1).nonzero()[0])
            raise Mismatch(f"{what}: the mask of sequence {b} (length {lengths[b]}) should be\n{_show(expected[b])}\nbut you returned\n{_show(got[b])}")
    return "every sequence gets the causal mask, with its padding keys blocked for every query."


def _attention_models():
    """Callables x (B, T, E) -> outputs (B, T, E): which of them let the future leak into the past."""
    torch.manual_seed(42)
    E = 6
    attention = SelfAttention(E, E)

    def causal(x):
        return attention(x, is_causal=True)[0]

    def full(x):
        return attention(x)[0]

    def one_ahead(x):  # each token also sees the next one
        T = x.size(-2)
        return attention(x, attn_mask=torch.ones(T, T, dtype=torch.bool).tril(1))[0]

    def first_peeks(x):  # causal, except that the first output peeks at token 3
        out = attention(x, is_causal=True)[0].clone()
        out[:, 0] = out[:, 0] + 1e-3 * x[:, 3]
        return out

    def only_itself(x):
        T = x.size(-2)
        return attention(x, attn_mask=torch.eye(T, dtype=torch.bool))[0]

    return E, [
        ("causal self-attention", causal, False),
        ("self-attention without a mask", full, True),
        ("attention that also sees the next token", one_ahead, True),
        ("causal attention whose first output peeks at token 3 (by 0.001)", first_peeks, True),
        ("attention in which each token sees only itself", only_itself, False),
    ]


@exercise(
    "Exercise 4, a leak test",
    hint="for each position t, copy x, replace every token after t with new random vectors, run the model on both "
    "and compare outputs[:, :t + 1] with torch.equal (or allclose with a tiny tolerance)",
)
def check_leak_test(leaks_future) -> str:
    E, models = _attention_models()
    x = torch.randn(2, 7, E, generator=torch.Generator().manual_seed(43))
    verdicts = []
    for name, model, leaks in models:
        with torch.no_grad():
            answer = call(leaks_future, model, x.clone())
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            answer = bool(answer)
        expect(isinstance(answer, bool), f"leaks_future must return True or False; for the {name} it returned {type(answer).__name__} {answer!r}")
        expect(answer == leaks, f"for the {name} you returned {answer}, but it {'does' if leaks else 'does not'} let later tokens "
               f"change earlier outputs")
        verdicts.append(name)
    return f"your test tells leaky from causal attention in all {len(verdicts)} models, including one that leaks by only 0.001."
