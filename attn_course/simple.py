"""Chapter 02: simple self-attention, no trainable weights and no scaling."""

from __future__ import annotations

import torch

from ._checks import check_tensor

__all__ = ["simple_self_attention"]


def simple_self_attention(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token becomes a weighted average of all tokens, weighted by dot-product similarity.

    ``weights = softmax(x @ x^T)`` over the last axis, ``context = weights @ x``.

    Args:
        x: token embeddings, one row per token.

    Returns:
        ``(context, weights)``.

    Shape:
        - x: ``(..., T, E)``
        - context: ``(..., T, E)``
        - weights: ``(..., T, T)``; row ``i`` holds how much token ``i`` takes from each token.
    """
    check_tensor("x", x, min_dim=2, floating=True)
    scores = x @ x.transpose(-2, -1)  # (..., T, E) @ (..., E, T) -> (..., T, T)
    # Softmax in float32 at least, so that float16/bfloat16 inputs do not lose the small weights.
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(x.dtype, torch.float32)).to(x.dtype)
    context = weights @ x  # (..., T, T) @ (..., T, E) -> (..., T, E)
    return context, weights
