"""Checks for the exercises of chapter 02, simple self-attention."""

from __future__ import annotations

import torch

from ..simple import simple_self_attention
from . import call, exercise, expect, expect_close, expect_tensor

__all__ = ["check_stable_softmax", "check_batched_self_attention", "check_hard_attention"]


@exercise(
    "Exercise 1, a softmax that does not overflow",
    hint="subtract each row's maximum (keepdim=True) before torch.exp, then divide by the row sum",
)
def check_stable_softmax(stable_softmax) -> str:
    generator = torch.Generator().manual_seed(1)
    small = torch.randn(3, 5, generator=generator)
    expect_close(call(stable_softmax, small), torch.softmax(small, dim=-1), what="stable_softmax(x) for x of shape (3, 5)")
    large = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]])
    got = expect_tensor(call(stable_softmax, large), what="stable_softmax on scores near ±1000", shape=large.shape)
    expect(
        bool(torch.isfinite(got).all()),
        "on scores like [1000, 1001, 1002] your result contains inf or NaN: exp(1000) overflows float32",
    )
    expect_close(got, torch.softmax(large, dim=-1), what="stable_softmax on scores near ±1000")
    return "your softmax matches torch.softmax, also on scores of ±1000."


@exercise(
    "Exercise 2, simple self-attention for a batch",
    hint="transpose only the last two axes (x.transpose(-2, -1)), and take the softmax over dim=-1",
)
def check_batched_self_attention(batched_self_attention) -> str:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 3, generator=generator)
    result = call(batched_self_attention, x)
    expect(
        isinstance(result, tuple) and len(result) == 2,
        f"return a pair (context, weights); got {type(result).__name__}",
    )
    context, weights = result
    expected_context, expected_weights = simple_self_attention(x)
    expect_tensor(weights, what="weights for x of shape (B=2, T=4, E=3)", shape=(2, 4, 4))
    column_sums = weights.sum(dim=-2)
    if torch.allclose(column_sums, torch.ones_like(column_sums)) and not torch.allclose(weights.sum(-1), torch.ones(2, 4)):
        expect(False, "your weights' columns sum to one, not their rows: the softmax ran over the wrong axis")
    expect_close(weights, expected_weights, what="weights for x of shape (B=2, T=4, E=3)")
    expect_close(context, expected_context, what="context for x of shape (B=2, T=4, E=3)")
    return "both the weights (B, T, T) and the context vectors (B, T, E) are right for every sequence in the batch."


@exercise(
    "Exercise 3, hard attention",
    hint="scores = x @ x.T; weights = torch.nn.functional.one_hot(scores.argmax(dim=-1), T).to(x.dtype)",
)
def check_hard_attention(hard_attention) -> str:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, generator=generator)
    result = call(hard_attention, x)
    expect(isinstance(result, tuple) and len(result) == 2, f"return a pair (context, weights); got {type(result).__name__}")
    context, weights = result
    expect_tensor(weights, what="hard weights for x of shape (T=5, E=4)", shape=(5, 5))
    weights = weights.detach().float()
    one_hot = ((weights == 0) | (weights == 1)).all() and torch.allclose(weights.sum(-1), torch.ones(5))
    expect(bool(one_hot), "every row of hard weights must be one-hot: a single 1, zeros elsewhere")
    expected_index = (x @ x.T).argmax(dim=-1)
    expect(
        bool((weights.argmax(dim=-1) == expected_index).all()),
        f"each row's 1 must sit at the key with the highest score; expected columns {expected_index.tolist()}, "
        f"got {weights.argmax(dim=-1).tolist()}",
    )
    expect_close(context, x[expected_index], what="hard context for x of shape (T=5, E=4)")
    return "each token copies exactly the token it scores highest with."
