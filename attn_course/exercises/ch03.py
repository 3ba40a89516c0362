"""Checks for the exercises of chapter 03, scaled dot-product attention.

Each check tries the answer on the notebook's sizes and then on sizes unlike them (``other_sizes``:
batch 1 and 3, ``L != S``, one query, odd widths), names the usual mistakes (no scale, the wrong
width under the root, the softmax over the wrong axis, ``K Qᵀ``, ``keys.T`` on a batch) before comparing
values, and uses the shared mechanism of ``attn_course.exercises``: torch's and the package's attention
forbidden in exercise 1, inputs watched for changes in place, results' dtype and device. The table
of wrong answers is in tests/test_exercises_ch03.py.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..scaled import scaled_dot_product_attention
from . import (Mismatch, NotAttempted, call, exercise, expect, expect_close, expect_sequence, expect_tensor,
               other_sizes, randn, rng)

__all__ = ["check_self_attention_by_hand", "check_softmax_jacobian", "check_self_attention_module", "check_cross_attention"]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=atol, rtol=1e-4)


def _pair(result, what: str):
    return expect_sequence(result, what=what, names=("context", "weights"))


def _diagnose_weights(weights: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, d_v: int, what: str,
                      d_in: int | None = None, notebook_d_k: int | None = None) -> None:
    """Name the usual mistakes in attention weights before comparing them value by value."""
    d_k = queries.size(-1)
    n_keys = keys.size(-2)
    scores = queries @ keys.transpose(-2, -1)  # (..., L, d_k) @ (..., d_k, S) -> (..., L, S)
    guesses = [
        (torch.softmax(scores, dim=-1), f"your weights are softmax(Q Kᵀ): you forgot to divide the scores by sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores / d_k, dim=-1), f"you divided the scores by d_k = {d_k}; divide by its square root, sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores, dim=-1) / math.sqrt(d_k), "you divided the weights after the softmax: the scale must act on the "
         "scores, before the softmax (the weights of a row must still sum to one)"),
    ]
    if d_v != d_k:
        guesses.append((torch.softmax(scores / math.sqrt(d_v), dim=-1),
                        f"you divided by sqrt({d_v}), the width of the values; the scale comes from the width of queries and "
                        f"keys, sqrt(d_k) = sqrt({d_k})"))
    if n_keys not in (d_k, d_v, 1):
        guesses.append((torch.softmax(scores / math.sqrt(n_keys), dim=-1),
                        f"you divided by sqrt({n_keys}), the number of keys (tokens); the scale comes from the width of "
                        f"queries and keys, sqrt(d_k) = sqrt({d_k})"))
    n_queries = queries.size(-2)
    if n_queries not in (d_k, d_v, n_keys, 1):
        guesses.append((torch.softmax(scores / math.sqrt(n_queries), dim=-1),
                        f"you divided by sqrt({n_queries}), the number of queries; the scale comes from the width of "
                        f"queries and keys, sqrt(d_k) = sqrt({d_k})"))
    if notebook_d_k is not None and notebook_d_k != d_k:
        guesses.append((torch.softmax(scores / math.sqrt(notebook_d_k), dim=-1),
                        f"you divided by sqrt({notebook_d_k}), the exercise's d_k, but here d_k = {d_k}: take d_k from the "
                        "width of the keys, not a fixed number"))
    if d_in is not None and d_in not in (d_k, d_v, n_keys, 1):
        guesses.append((torch.softmax(scores / math.sqrt(d_in), dim=-1),
                        f"you divided by sqrt({d_in}), the width of the input tokens; the scale comes from the width of "
                        f"queries and keys after projection, sqrt(d_k) = sqrt({d_k})"))
    if scores.size(-1) > 1:
        guesses.append((torch.softmax(scores / math.sqrt(d_k), dim=-2),
                        "your weights' columns sum to one, not their rows: take the softmax over the keys, the last axis"))
    if scores.size(-1) == scores.size(-2):
        guesses.append((torch.softmax(scores.transpose(-2, -1) / math.sqrt(d_k), dim=-1),
                        "your weights are transposed: row i must hold query i's weights, so compute Q Kᵀ, not K Qᵀ"))
    if scores.dim() >= 3 and scores.size(0) > 1:
        guesses.append((torch.softmax(scores / math.sqrt(d_k), dim=0),
                        "your softmax runs over the batch (the first axis), so the sequences share one distribution; take "
                        "it over the keys, the last axis"))
    right = torch.softmax(scores / math.sqrt(d_k), dim=-1)
    for guess, message in guesses:
        if not _close(guess, right):  # a mistake that gives the right numbers here (one key, say) cannot be named
            expect(not _close(weights, guess), f"{what}: {message}")


def _weights_and_context(result, queries, keys, values, what: str, d_in: int | None = None,
                         notebook_d_k: int | None = None) -> None:
    """Check a (context, weights) pair against scaled dot-product attention of queries, keys, values."""
    L, S, d_v = queries.size(-2), keys.size(-2), values.size(-1)
    lead = tuple(queries.shape[:-2])
    context, weights = _pair(result, what)
    weights = expect_tensor(weights, what=f"weights for {what}", dtype="float", device=queries)
    if not bool(torch.isfinite(weights).all()):
        large = bool((queries @ keys.transpose(-2, -1)).abs().max() / math.sqrt(queries.size(-1)) > 80)
        raise Mismatch(f"weights for {what}: your weights contain inf or NaN" + (
            ": exp of a score near 100 overflows float32. Subtract each row's maximum before exponentiating, or use "
            "the library's softmax, which does" if large else ""))
    if tuple(weights.shape) == lead + (S, L) and S != L:
        raise Mismatch(f"weights for {what}: your weights have shape {tuple(weights.shape)}, one row per key; row i must "
                       f"hold query i's weights over the {S} keys, shape {lead + (L, S)}: compute Q Kᵀ, not K Qᵀ")
    expect_tensor(weights, what=f"weights for {what}", shape=lead + (L, S))
    _diagnose_weights(weights, queries, keys, d_v, f"weights for {what}", d_in=d_in, notebook_d_k=notebook_d_k)
    expected_context, expected_weights = scaled_dot_product_attention(queries, keys, values)
    expect_close(weights, expected_weights, what=f"weights for {what}")
    context = expect_tensor(context, what=f"context for {what}", dtype="float", device=queries)
    if S > 1 and context.shape == values.shape and _close(context, values):
        raise Mismatch(f"context for {what}: your context is the values themselves; multiply them by the weights")
    expect_tensor(context, what=f"context for {what}", shape=lead + (L, d_v))
    expect_close(context, expected_context, what=f"context for {what}")


@exercise(
    "Exercise 1, self-attention from three projection matrices",
    hint="project x with each of the three matrices; the scores are the queries times the transposed keys, divided "
         "by the square root of the keys' width d_k (not of the values or of x); softmax over the keys, the last "
         "axis; the context is the weights times the values",
    forbid=("sdpa",),
)
def check_self_attention_by_hand(self_attention_by_hand) -> str:
    generator = rng(31)
    # The notebook's exercise: T = 5 tokens of width 4, d_k = 16 != d_v = 6, and then other sizes, and
    # inputs large enough that a softmax without its maximum shift overflows float32.
    cases = [(5, 4, 16, 6, 1.0)] + [(s.T, s.E, s.E + 3, max(1, s.E - 2), 1.0) for s in other_sizes(same_length=True)]
    cases.append((6, 5, 8, 3, 6.0))  # scores near +-100
    for T, d_in, d_k, d_v, scale in cases:
        x = randn(T, d_in, generator=generator, scale=scale)
        W_query, W_key, W_value = (randn(d_in, d, generator=generator) for d in (d_k, d_k, d_v))
        what = f"x of shape (T={T}, d_in={d_in}), d_k={d_k}, d_v={d_v}" + (" (scores near ±100)" if scale > 1 else "")
        result = call(self_attention_by_hand, x, W_query, W_key, W_value)
        queries, keys, values = x @ W_query, x @ W_key, x @ W_value  # (T, d_in) @ (d_in, d) -> (T, d)
        _weights_and_context(result, queries, keys, values, what, d_in=d_in, notebook_d_k=16)
    return "your weights and context vectors match attn_course.scaled_dot_product_attention, at every size tried."


@exercise(
    "Exercise 2, the Jacobian of the softmax",
    hint="treat the diagonal (where i and j are the same index) and the rest apart: raising score j raises p_j in proportion to p_j (1 - p_j) "
         "and lowers every other p_i in proportion to p_i p_j; together that is a diagonal matrix of p minus the outer "
         "product of p with itself",
)
def check_softmax_jacobian(softmax_jacobian) -> str:
    generator = rng(32)
    cases = {
        "p = softmax of 5 random scores": torch.softmax(randn(5, generator=generator, dtype=torch.float64), dim=0),
        "a nearly one-hot p (scores [12, 0, 1, -2])": torch.softmax(torch.tensor([12.0, 0.0, 1.0, -2.0], dtype=torch.float64), dim=0),
        "p of one entry, [1.0]": torch.ones(1, dtype=torch.float64),
        "p = softmax of 9 random scores (float32)": torch.softmax(randn(9, generator=generator, scale=2.0), dim=0),
    }
    norms = []
    for what, p in cases.items():
        expected = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), torch.log(p))  # (S, S)
        got = expect_tensor(call(softmax_jacobian, p), what=what, shape=(p.numel(), p.numel()), dtype="float", convert=True)
        if p.numel() > 1:
            tolerance = 1e-6 if p.dtype == torch.float64 else 1e-5
            expect(not _close(got, torch.diag(p), atol=tolerance), f"{what}: your matrix is diag(p); the term - p pᵀ is missing "
                   "(raising one score also lowers every other probability)")
            expect(not _close(got, -torch.outer(p, p), atol=tolerance), f"{what}: your matrix is - p pᵀ; the diagonal term diag(p) is missing")
            expect(not _close(got, torch.outer(p, p) - torch.diag(p), atol=tolerance), f"{what}: your signs are flipped; the diagonal must be positive")
            expect(not _close(got, torch.diag(p * (1 - p)), atol=tolerance), f"{what}: only your diagonal, p_i (1 - p_i), is right; the "
                   "off-diagonal entries - p_i p_j are missing (raising score j lowers every other probability)")
            expect(not _close(got, torch.diag(p) - (p @ p), atol=tolerance), f"{what}: p @ p is a number (a dot product); the term you "
                   "need is the outer product p pᵀ, an (S, S) matrix")
            expect(not _close(got, torch.eye(p.numel(), dtype=p.dtype) - p[None, :].expand(p.numel(), -1), atol=tolerance),
                   f"{what}: that is the Jacobian of the log-softmax, δ_ij - p_j; the softmax's has one more factor p_i")
            at_p = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), p)
            expect(not _close(got, at_p, atol=tolerance), f"{what}: that is the Jacobian of the softmax taken at the scores "
                   "s = p; but p holds the probabilities, and the scores that give them are log p (up to a constant). "
                   "Write the Jacobian in terms of p itself")
        # float64 p: float64 precision (an answer computed in float16 or float32 is off by more than 1e-6).
        atol, rtol = (1e-6, 1e-5) if p.dtype == torch.float64 else (1e-5, 1e-4)
        expect_close(got, expected, what=what, atol=atol, rtol=rtol)
        norms.append(float(expected.norm()))
    return (
        f"your Jacobian matches autograd. Its norm is {norms[0]:.3f} for the spread-out p and {norms[1]:.1e} for the nearly "
        "one-hot p: a saturated softmax passes almost no gradient back to its scores."
    )


def _check_module(module_class, d_in: int, d_k: int, d_v: int, x: torch.Tensor) -> tuple:
    B, T = x.shape[:2]
    module = call(module_class, d_in, d_k, d_v)
    expect(isinstance(module, nn.Module), f"{getattr(module_class, '__name__', module_class)} must be a subclass of torch.nn.Module")
    if not any(hasattr(module, name) for name in ("W_query", "W_key", "W_value")):
        call(module, x)  # the untouched scaffold returns None: "not attempted"
    for name, d_out in (("W_query", d_k), ("W_key", d_k), ("W_value", d_v)):
        layer = getattr(module, name, None)
        expect(isinstance(layer, nn.Linear), f"the module needs an attribute {name} that is an nn.Linear; got {type(layer).__name__}")
        expect(
            (layer.in_features, layer.out_features) == (d_in, d_out),
            f"{name} must map d_in={d_in} to {d_out} (d_k={d_k}, d_v={d_v}); got nn.Linear({layer.in_features}, {layer.out_features})",
        )
        expect(layer.bias is None, f"{name} must have no bias (bias=False), as in attn_course.SelfAttention")
    what = f"x of shape (B={B}, T={T}, d_in={d_in}), d_k={d_k}, d_v={d_v}"
    result = call(module, x)
    with torch.no_grad():
        queries, keys, values = module.W_query(x), module.W_key(x), module.W_value(x)  # (B, T, d)
    _weights_and_context(result, queries, keys, values, what, d_in=d_in, notebook_d_k=8)
    return module, result[0]


@exercise(
    "Exercise 3, a self-attention module with d_k ≠ d_v",
    hint="three linear layers without bias, named as the exercise says: queries and keys of width d_k, values of "
         "width d_v; in forward, divide the scores by the square root of d_k, and swap only the last two axes of the "
         "keys (a batch has three)",
)
def check_self_attention_module(module_class) -> str:
    if module_class is ... or module_class is None:
        raise NotAttempted
    generator = rng(34)
    torch.manual_seed(33)  # the module's own initialisation (the global generator is restored after the check)
    module, context = _check_module(module_class, 5, 8, 3, randn(2, 6, 5, generator=generator))
    expect(context.requires_grad, "your context does not require grad: compute it from the layers' outputs, without .detach() or torch.no_grad()")
    context.sum().backward()
    for name in ("W_query", "W_key", "W_value"):
        grad = getattr(module, name).weight.grad
        if grad is None or not bool(grad.abs().sum() > 0):
            raise Mismatch(f"no gradient reaches {name}.weight: compute the output from the layers' outputs, without .detach() or torch.no_grad()")
    # Other batches, lengths and widths: batch 1 and 3, one token, d_k < d_v, odd widths.
    for size in other_sizes(same_length=True):
        d_in, d_k, d_v = size.E, size.E + 1, max(1, size.E // 2 + 2)
        _check_module(module_class, d_in, d_k, d_v, randn(size.B, size.T, d_in, generator=generator))
    return "the module gives contexts of shape (B, T, d_v), scaled by sqrt(d_k), at every size tried, and trains all three projections."


@exercise(
    "Exercise 4, cross-attention on a batch",
    hint="queries come from the query sequence, keys and values from the context sequence; swap only the last two "
         "axes of the keys (on a batch, the plain transpose reverses all three); scale by the square root of the "
         "projected width d_k, and take the softmax over the keys, the last axis",
)
def check_cross_attention(cross_attention) -> str:
    generator = rng(35)
    # The notebook's sizes (every axis its own size), then others: batch 1, one query, L > S, L < S.
    cases = [(3, 4, 6, 5, 7, 8, 2)] + [(s.B, s.L, s.S, s.E, s.E + 2, s.E + 1, max(1, s.E - 3)) for s in other_sizes()]
    for B, L, S, d_query, d_context, d_k, d_v in cases:
        x_query = randn(B, L, d_query, generator=generator)
        x_context = randn(B, S, d_context, generator=generator)
        W_query = randn(d_query, d_k, generator=generator)
        W_key = randn(d_context, d_k, generator=generator)
        W_value = randn(d_context, d_v, generator=generator)
        what = f"B={B}, L={L} queries of width {d_query}, S={S} keys of width {d_context}, d_k={d_k}, d_v={d_v}"
        result = call(cross_attention, x_query, x_context, W_query, W_key, W_value)
        queries = x_query @ W_query  # (B, L, d_query) @ (d_query, d_k) -> (B, L, d_k)
        keys, values = x_context @ W_key, x_context @ W_value  # (B, S, d_k), (B, S, d_v)
        weights = _pair(result, what)[1]
        if isinstance(weights, torch.Tensor) and weights.shape == (B, L, S) and d_query not in (d_k, d_v, S, 1):
            scores = queries @ keys.transpose(-2, -1)  # (B, L, S)
            expect(not _close(weights, torch.softmax(scores / math.sqrt(d_query), dim=-1)),
                   f"weights for {what}: you divided by sqrt({d_query}), the width of the query tokens; the scale comes from "
                   f"the width of queries and keys after projection, sqrt(d_k) = sqrt({d_k})")
        _weights_and_context(result, queries, keys, values, what, notebook_d_k=8)
    return ("queries from one sequence, keys and values from another: your weights and context match "
            "attn_course.scaled_dot_product_attention for every batch, length and width tried.")
