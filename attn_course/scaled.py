"""Chapter 03: scaled dot-product attention, written out step by step, and self-attention with
trainable query, key and value projections."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_same_device_and_dtype, check_tensor


def _recording_graph() -> bool:
    """True while torch.export, torch.compile or the ONNX exporter (torch.compiler.is_compiling) or
    torch.jit.trace records this code as a graph: a Python ``if`` on a tensor's values cannot be
    recorded there, so the graph takes the branch-free form of the same computation."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    return bool(is_compiling is not None and is_compiling()) or torch.jit.is_tracing()


__all__ = ["scaled_dot_product_attention", "SelfAttention"]


def _broadcast(name_a: str, shape_a, name_b: str, shape_b) -> torch.Size:
    try:
        return torch.broadcast_shapes(tuple(shape_a), tuple(shape_b))
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of {name_a} {tuple(shape_a)} and {name_b} {tuple(shape_b)} do not broadcast"
        ) from None


def _check_attention_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale):
    check_tensor("query", query, min_dim=2, floating=True)
    check_tensor("key", key, min_dim=2, floating=True)
    check_tensor("value", value, min_dim=2, floating=True)
    check_same_device_and_dtype(query=query, key=key, value=value)
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must have the same last dimension (the width E that the dot product runs over), "
            f"got query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length S (dimension -2), got key {tuple(key.shape)} "
            f"and value {tuple(value.shape)}"
        )
    batch = _broadcast("query", query.shape[:-2], "key", key.shape[:-2])
    batch = _broadcast("query/key", batch, "value", value.shape[:-2])
    check_probability("dropout_p", dropout_p)
    check_bool("is_causal", is_causal)
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float or None, got {type(scale).__name__} {scale!r}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    L, S = query.size(-2), key.size(-2)
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as torch's scaled_dot_product_attention)")
        check_tensor("attn_mask", attn_mask)
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be a bool or floating-point tensor, got dtype {attn_mask.dtype}")
        if attn_mask.device != query.device:
            raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {query.device}")
        try:
            torch.broadcast_shapes(tuple(attn_mask.shape), (*batch, L, S))
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' shape "
                f"{(*batch, L, S)} (batch..., L, S)"
            ) from None
        if attn_mask.dim() > len(batch) + 2:
            raise ValueError(
                f"attn_mask has {attn_mask.dim()} dimensions but the scores {(*batch, L, S)} have {len(batch) + 2}"
            )


def _attention_weights(query, key, attn_mask, is_causal, scale):
    """Steps 1 to 3 of attention (scores, masks, softmax) on inputs that were already checked."""
    L, S, dtype = query.size(-2), key.size(-2), query.dtype
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else float(scale)

    # 1. Similarity of every query with every key. float16 tops out at 65504, so its scores are
    # computed in float32 (bfloat16 has float32's range and stays as it is).
    if query.dtype == torch.float16:
        query, key = query.float(), key.float()
    scores = (query * scale) @ key.transpose(-2, -1)  # (..., L, E) @ (..., E, S) -> (..., L, S)

    # 2. Masks: blocked positions get -inf, so that softmax gives them exactly zero weight. The
    # scores are a fresh tensor that autograd does not need (the matmul's backward uses query and
    # key), so they are masked in place: one fewer (..., L, S) temporary.
    if is_causal:
        allowed = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()  # (L, S), top-left aligned
        scores.masked_fill_(~allowed, float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores.masked_fill_(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)

    # 3. Normalise each row to weights that sum to one (in float32 at least, for half precision).
    compute_dtype = torch.promote_types(scores.dtype, torch.float32)
    if attn_mask is None or S == 0:  # (is_causal alone always leaves key 0 to every query)
        return torch.softmax(scores, dim=-1, dtype=compute_dtype).to(dtype)
    # A row whose scores are all -inf has nothing to attend to: softmax would give 0/0 = NaN there,
    # and NaN gradients. Such rows are found from the mask (small) rather than from the scores
    # (large); only if there are any, they get finite scores, and then zero weights (a recorded
    # graph, which cannot branch on values, always takes that path: it changes no other row).
    if attn_mask.dtype == torch.bool:
        nothing_to_attend = ~attn_mask.any(dim=-1, keepdim=True)  # (..., L|1, 1)
    else:
        nothing_to_attend = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)  # (..., L|1, 1)
    if not _recording_graph() and not bool(nothing_to_attend.any()):
        return torch.softmax(scores, dim=-1, dtype=compute_dtype).to(dtype)
    scores = scores.masked_fill(nothing_to_attend, 0.0)
    weights = torch.softmax(scores, dim=-1, dtype=compute_dtype)  # (..., L, S)
    return weights.masked_fill(nothing_to_attend, 0.0).to(dtype)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, ``softmax(Q K^T / sqrt(E) + mask) V``, one step at a time.

    Takes the same arguments as :func:`torch.nn.functional.scaled_dot_product_attention` and gives
    the same output, but also returns the attention weights.

    Mask convention (as ``F.scaled_dot_product_attention``): a **boolean** mask is True where a query
    **may** attend to a key; a **float** mask is added to the scores (use ``-inf`` to block).
    ``is_causal=True`` lets query ``i`` see keys ``0..i`` (the mask is aligned to the top-left
    corner, as PyTorch aligns it, also when ``L != S``).

    A query that may attend to no key at all gets zeros in its output and weights, never NaN.
    Scores are normalised in float32 (or float64), and float16 scores are computed in float32, so
    half-precision inputs neither overflow nor lose small weights.

    Args:
        query: queries.
        key: keys.
        value: values.
        attn_mask: optional bool or float mask, broadcastable to ``(..., L, S)``.
        dropout_p: probability of zeroing an attention weight (the rest are scaled by ``1/(1-p)``).
            Applied whenever it is positive: pass 0.0 at evaluation time.
        is_causal: apply a causal mask. Cannot be combined with ``attn_mask``.
        scale: factor on the scores; defaults to ``1/sqrt(E)``.

    Returns:
        ``(output, weights)``; the weights are those multiplied with ``value`` (after dropout).

    Shape:
        - query: ``(..., L, E)``, key: ``(..., S, E)``, value: ``(..., S, Ev)``; the leading
          dimensions broadcast.
        - output: ``(..., L, Ev)``, weights: ``(..., L, S)``.

    Equivalent to::

        scores = query @ key.transpose(-2, -1) * scale + mask
        weights = scores.softmax(dim=-1)
        output = weights @ value
    """
    _check_attention_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale)
    weights = _attention_weights(query, key, attn_mask, is_causal, scale)  # (..., L, S)

    # 4. Dropout on the weights, then the weighted average of the values.
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p, training=True)
    output = weights @ value  # (..., L, S) @ (..., S, Ev) -> (..., L, Ev)
    return output, weights


class SelfAttention(nn.Module):
    """Single-head self-attention with trainable query, key and value projections.

    Args:
        d_in: width of the input tokens.
        d_out: width of queries, keys, values and of the output.
        qkv_bias: add a bias to the three projections.

    Shape:
        - x: ``(..., T, d_in)``
        - context: ``(..., T, d_out)``, weights: ``(..., T, T)``

    Mask convention (as ``F.scaled_dot_product_attention``): a boolean ``attn_mask`` is True where a
    token may attend; a float mask is added to the scores.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        check_bool("qkv_bias", qkv_bias)
        self.d_in, self.d_out = d_in, d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_tensor("x", x, min_dim=2, floating=True)
        if x.size(-1) != self.d_in:
            raise ValueError(f"x must have last dimension d_in={self.d_in}, got shape {tuple(x.shape)}")
        queries = self.W_query(x)  # (..., T, d_out)
        keys = self.W_key(x)  # (..., T, d_out)
        values = self.W_value(x)  # (..., T, d_out)
        return scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask, is_causal=is_causal)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"
