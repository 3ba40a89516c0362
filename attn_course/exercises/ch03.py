"""Checks for the exercises of chapter 03, scaled dot-product attention."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..scaled import scaled_dot_product_attention
from . import Mismatch, NotAttempted, attempted, call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_self_attention_by_hand", "check_softmax_jacobian", "check_self_attention_module", "check_cross_attention"]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.detach().double().cpu(), atol=atol, rtol=1e-4)


def _diagnose_weights(weights: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, d_v: int, what: str,
                      d_in: int | None = None) -> None:
    """Name the usual mistakes in attention weights before comparing them value by value."""
    d_k = queries.size(-1)
    scores = queries @ keys.transpose(-2, -1)  # (..., T, d_k) @ (..., d_k, T) -> (..., T, T)
    guesses = [
        (torch.softmax(scores, dim=-1), f"your weights are softmax(Q Kᵀ): you forgot to divide the scores by sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores / d_k, dim=-1), f"you divided the scores by d_k = {d_k}; divide by its square root, sqrt(d_k) = {math.sqrt(d_k):.2f}"),
        (torch.softmax(scores / math.sqrt(d_v), dim=-1),
         f"you divided by sqrt({d_v}), the width of the values; the scale comes from the width of queries and keys, sqrt(d_k) = sqrt({d_k})"),
        (torch.softmax(scores / math.sqrt(d_k), dim=-2), "your weights' columns sum to one, not their rows: take the softmax over the keys, dim=-1"),
        (torch.softmax(scores.transpose(-2, -1) / math.sqrt(d_k), dim=-1),
         "your weights are transposed: row i must hold query i's weights, so compute Q Kᵀ, not K Qᵀ"),
    ]
    if d_in is not None and d_in not in (d_k, d_v, 1):
        guesses.append((torch.softmax(scores / math.sqrt(d_in), dim=-1),
                        f"you divided by sqrt({d_in}), the width of the input tokens; the scale comes from the width of "
                        f"queries and keys after projection, sqrt(d_k) = sqrt({d_k})"))
    if scores.dim() >= 3:
        guesses.append((torch.softmax(scores / math.sqrt(d_k), dim=0),
                        "your softmax runs over the batch (dim=0), so the sequences share one distribution; take it over the keys, dim=-1"))
    for guess, message in guesses:
        expect(not _close(weights, guess), f"{what}: {message}")


@exercise(
    "Exercise 1, self-attention from three projection matrices",
    hint="queries = x @ W_query (and the same for keys, values); weights = softmax(queries @ keys.T / sqrt(d_k), dim=-1); "
    "context = weights @ values",
)
def check_self_attention_by_hand(self_attention_by_hand) -> str:
    generator = torch.Generator().manual_seed(31)
    T, d_in, d_k, d_v = 5, 4, 16, 6
    x = torch.randn(T, d_in, generator=generator)
    W_query, W_key, W_value = (torch.randn(d_in, d, generator=generator) for d in (d_k, d_k, d_v))
    result = call(self_attention_by_hand, x, W_query, W_key, W_value)
    expect(isinstance(result, tuple) and len(result) == 2, f"return a pair (context, weights); got {type(result).__name__}")
    context, weights = (attempted(r) for r in result)
    what = f"weights for x of shape (T={T}, d_in={d_in}), d_k={d_k}, d_v={d_v}"
    expect_tensor(weights, what=what, shape=(T, T))
    queries, keys, values = x @ W_query, x @ W_key, x @ W_value  # (T, d_in) @ (d_in, d) -> (T, d)
    _diagnose_weights(weights, queries, keys, d_v, what, d_in=d_in)
    expected_context, expected_weights = scaled_dot_product_attention(queries, keys, values)
    expect_close(weights, expected_weights, what=what)
    expect_tensor(context, what=f"context (T={T}, d_v={d_v})", shape=(T, d_v))
    expect(not _close(context, values), "your context equals the values themselves: multiply them by the weights, weights @ values")
    expect_close(context, expected_context, what=f"context (T={T}, d_v={d_v})")
    return "your weights and context vectors match attn_course.scaled_dot_product_attention."


@exercise(
    "Exercise 2, the Jacobian of the softmax",
    hint="∂p_i/∂s_j = p_i (δ_ij - p_j): torch.diag(p) - torch.outer(p, p)",
)
def check_softmax_jacobian(softmax_jacobian) -> str:
    generator = torch.Generator().manual_seed(32)
    cases = {
        "p = softmax of 5 random scores": torch.softmax(torch.randn(5, generator=generator, dtype=torch.float64), dim=0),
        "a nearly one-hot p (scores [12, 0, 1, -2])": torch.softmax(torch.tensor([12.0, 0.0, 1.0, -2.0], dtype=torch.float64), dim=0),
    }
    norms = []
    for what, p in cases.items():
        expected = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=0), torch.log(p))  # (S, S)
        got = expect_tensor(call(softmax_jacobian, p.clone()), what=what, shape=(p.numel(), p.numel()))
        expect(not _close(got, torch.diag(p), atol=1e-6), f"{what}: your matrix is diag(p); the term - p pᵀ is missing "
               "(raising one score also lowers every other probability)")
        expect(not _close(got, -torch.outer(p, p), atol=1e-6), f"{what}: your matrix is - p pᵀ; the diagonal term diag(p) is missing")
        expect(not _close(got, torch.outer(p, p) - torch.diag(p), atol=1e-6), f"{what}: your signs are flipped; the diagonal must be positive")
        expect(not _close(got, torch.diag(p * (1 - p)), atol=1e-6), f"{what}: only your diagonal, p_i (1 - p_i), is right; the "
               "off-diagonal entries - p_i p_j are missing (raising score j lowers every other probability)")
        expect(not _close(got, torch.diag(p) - (p @ p), atol=1e-6), f"{what}: p @ p is a number (a dot product); the term you "
               "need is the outer product p pᵀ, torch.outer(p, p), an (S, S) matrix")
        expect_close(got, expected, what=what, atol=1e-6)
        norms.append(float(expected.norm()))
    return (
        f"your Jacobian matches autograd. Its norm is {norms[0]:.3f} for the spread-out p and {norms[1]:.1e} for the nearly "
        "one-hot p: a saturated softmax passes almost no gradient back to its scores."
    )


@exercise(
    "Exercise 3, a self-attention module with d_k ≠ d_v",
    hint="three nn.Linear(d_in, ..., bias=False) named W_query, W_key (to d_k) and W_value (to d_v); in forward, "
    "scale the scores by 1 / sqrt(d_k)",
)
def check_self_attention_module(module_class) -> str:
    if module_class is ... or module_class is None:
        raise NotAttempted
    d_in, d_k, d_v, B, T = 5, 8, 3, 2, 6
    torch.manual_seed(33)
    module = call(module_class, d_in, d_k, d_v)
    expect(isinstance(module, nn.Module), f"{getattr(module_class, '__name__', module_class)} must be a subclass of torch.nn.Module")
    x = torch.randn(B, T, d_in, generator=torch.Generator().manual_seed(34))
    if not any(hasattr(module, name) for name in ("W_query", "W_key", "W_value")):
        call(module, x)  # the untouched scaffold returns None: "not attempted"
    for name, d_out in (("W_query", d_k), ("W_key", d_k), ("W_value", d_v)):
        layer = getattr(module, name, None)
        expect(isinstance(layer, nn.Linear), f"the module needs an attribute {name} that is an nn.Linear; got {type(layer).__name__}")
        expect(
            (layer.in_features, layer.out_features) == (d_in, d_out),
            f"{name} must map d_in={d_in} to {d_out}; got nn.Linear({layer.in_features}, {layer.out_features})",
        )
        expect(layer.bias is None, f"{name} must have no bias (bias=False), as in attn_course.SelfAttention")
    result = call(module, x)
    expect(isinstance(result, tuple) and len(result) == 2, f"forward must return a pair (context, weights); got {type(result).__name__}")
    context, weights = (attempted(r) for r in result)
    what = f"weights for x of shape (B={B}, T={T}, d_in={d_in})"
    expect_tensor(weights, what=what, shape=(B, T, T))
    with torch.no_grad():
        queries, keys, values = module.W_query(x), module.W_key(x), module.W_value(x)  # (B, T, d)
        _diagnose_weights(weights, queries, keys, d_v, what, d_in=d_in)
        expected_context, expected_weights = scaled_dot_product_attention(queries, keys, values)
    expect_close(weights, expected_weights, what=what)
    expect_close(context, expected_context, what=f"context for x of shape (B={B}, T={T}, d_in={d_in})")
    expect(context.requires_grad, "your context does not require grad: compute it from the layers' outputs, without .detach() or torch.no_grad()")
    context.sum().backward()
    for name in ("W_query", "W_key", "W_value"):
        grad = getattr(module, name).weight.grad
        if grad is None or not bool(grad.abs().sum() > 0):
            raise Mismatch(f"no gradient reaches {name}.weight: compute the output from the layers' outputs, without .detach() or torch.no_grad()")
    return f"the module gives contexts of shape (B, T, d_v) = {tuple(context.shape)}, scaled by sqrt(d_k), and trains all three projections."


@exercise(
    "Exercise 4, cross-attention on a batch",
    hint="queries = x_query @ W_query (B, L, d_k); keys = x_context @ W_key (B, S, d_k); values = x_context @ W_value (B, S, d_v); "
    "scores = queries @ keys.transpose(-2, -1) / sqrt(d_k) (B, L, S); softmax over the keys, dim=-1. "
    "(keys.T on a 3-D batch reverses all three axes: use keys.transpose(-2, -1) or keys.mT)",
)
def check_cross_attention(cross_attention) -> str:
    generator = torch.Generator().manual_seed(35)
    B, L, S, d_query, d_context, d_k, d_v = 3, 4, 6, 5, 7, 8, 2
    x_query = torch.randn(B, L, d_query, generator=generator)
    x_context = torch.randn(B, S, d_context, generator=generator)
    W_query = torch.randn(d_query, d_k, generator=generator)
    W_key = torch.randn(d_context, d_k, generator=generator)
    W_value = torch.randn(d_context, d_v, generator=generator)
    result = call(cross_attention, x_query.clone(), x_context.clone(), W_query, W_key, W_value)
    expect(isinstance(result, tuple) and len(result) == 2, f"return a pair (context, weights); got {type(result).__name__}")
    context, weights = (attempted(r) for r in result)
    sizes = f"B={B}, L={L} queries, S={S} keys"
    what = f"weights ({sizes})"
    weights = expect_tensor(weights, what=what)
    expect(tuple(weights.shape) != (B, S, L), f"{what}: your weights have shape (B, S, L) = {(B, S, L)}; row i must hold query i's "
           f"weights over the S keys, shape (B, L, S) = {(B, L, S)}: compute queries @ keysᵀ, not keys @ queriesᵀ")
    expect_tensor(weights, what=what, shape=(B, L, S))
    queries = x_query @ W_query  # (B, L, d_query) @ (d_query, d_k) -> (B, L, d_k)
    keys, values = x_context @ W_key, x_context @ W_value  # (B, S, d_k), (B, S, d_v)
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(d_k)  # (B, L, d_k) @ (B, d_k, S) -> (B, L, S)
    expect(not _close(weights, torch.softmax(scores, dim=0)), f"{what}: your softmax runs over the batch (dim=0), so the {B} "
           "sentences share one distribution; take it over the keys, dim=-1")
    expect(not _close(weights, torch.softmax(scores * math.sqrt(d_k) / math.sqrt(d_query), dim=-1)),
           f"{what}: you divided by sqrt({d_query}), the width of the query tokens; the scale comes from the width of queries "
           f"and keys after projection, sqrt(d_k) = sqrt({d_k})")
    _diagnose_weights(weights, queries, keys, d_v, what)
    expected_context, expected_weights = scaled_dot_product_attention(queries, keys, values)
    expect_close(weights, expected_weights, what=what)
    what = f"context ({sizes}, d_v={d_v})"
    expect_tensor(context, what=what, shape=(B, L, d_v))
    expect_close(context, expected_context, what=what)
    return (f"queries from one sequence, keys and values from another: weights ({B}, {L}, {S}), one row per query and one "
            f"column per key, and context ({B}, {L}, {d_v}), one vector of width d_v per query.")
