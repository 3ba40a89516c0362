"""Chapter 08: the idea behind FlashAttention, in plain PyTorch.

Exact attention needs every score of a row before it can normalise that row, so the obvious
implementation materialises the whole ``(L, S)`` matrix of scores and then of weights: memory that
grows with the square of the sequence length. FlashAttention (Dao et al., 2022) computes the *same*
result tile by tile, with the **online softmax** (Milakov and Gimelshein, 2018): it keeps, for every
query, the largest score seen so far ``m``, the sum of exponentials so far ``l`` and an unnormalised
output ``acc``; when a new tile of keys raises the maximum, the old sum and output are rescaled by
``exp(m_old - m_new)``. Only an ``(L_block, S_block)`` tile of scores exists at any moment.

This module is for understanding, not for speed: the loops run in Python. PyTorch's fused
``F.scaled_dot_product_attention`` does the same in one kernel.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_positive_int, check_tensor
from .scaled import _check_attention_inputs

__all__ = ["online_softmax", "tiled_attention"]


def online_softmax(scores: torch.Tensor, block_size: int = 4) -> torch.Tensor:
    """Softmax over the last axis, reading the scores one block of columns at a time.

    The first pass streams over the blocks and keeps two numbers per row: the running maximum ``m``
    and the running sum ``l`` of ``exp(score - m)``. When a block brings a larger maximum, the sum
    so far is rescaled by ``exp(m_old - m_new)``, so that at the end ``l = sum_j exp(s_j - m)``
    for the true maximum ``m``. A second pass writes ``exp(s_j - m) / l``. A row that is all
    ``-inf`` (nothing to attend to) gives zeros, not NaN.

    Args:
        scores: any floating-point tensor.
        block_size: how many columns are read at a time.

    Returns:
        The same values as ``torch.softmax(scores, dim=-1)`` (zeros for all ``-inf`` rows).

    Shape:
        ``(..., S)`` -> ``(..., S)``
    """
    check_tensor("scores", scores, min_dim=1, floating=True)
    check_positive_int("block_size", block_size)
    row_max = torch.full(scores.shape[:-1] + (1,), float("-inf"), dtype=scores.dtype, device=scores.device)  # (..., 1)
    row_sum = torch.zeros_like(row_max)  # (..., 1)
    for start in range(0, scores.size(-1), block_size):
        block = scores[..., start:start + block_size]  # (..., block)
        new_max = torch.maximum(row_max, block.amax(dim=-1, keepdim=True))  # (..., 1)
        safe_max = _finite_or_zero(new_max)  # rows still all -inf: exp(-inf - 0) = 0, not NaN
        row_sum = row_sum * torch.exp(row_max - safe_max) + torch.exp(block - safe_max).sum(dim=-1, keepdim=True)
        row_max = new_max
    weights = torch.exp(scores - _finite_or_zero(row_max)) / row_sum  # (..., S)
    return weights.masked_fill(row_sum == 0, 0.0)


def _finite_or_zero(row_max: torch.Tensor) -> torch.Tensor:
    """The running maximum, with 0 in rows that have seen only -inf (so that exp(-inf - 0) = 0)."""
    return row_max.masked_fill(torch.isneginf(row_max), 0.0)


def _tile_scores(query_tile, key_tile, rows: slice, cols: slice, attn_mask, is_causal: bool, scale: float):
    """Scaled and masked scores of one tile: queries ``rows`` against keys ``cols``."""
    scores = (query_tile @ key_tile.transpose(-2, -1)) * scale  # (..., Lb, D) @ (..., D, Sb) -> (..., Lb, Sb)
    if is_causal:
        query_pos = torch.arange(rows.start, rows.stop, device=scores.device)  # (Lb,)
        key_pos = torch.arange(cols.start, cols.stop, device=scores.device)  # (Sb,)
        scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))  # (Lb, Sb) broadcast
    elif attn_mask is not None:
        tile_mask = attn_mask[..., rows if attn_mask.size(-2) > 1 else slice(None), cols if attn_mask.size(-1) > 1 else slice(None)]
        if tile_mask.dtype == torch.bool:
            scores = scores.masked_fill(~tile_mask, float("-inf"))  # True = may attend
        else:
            scores = scores + tile_mask.to(scores.dtype)
    return scores


def _key_blocks(rows: slice, key_len: int, key_block_size: int, is_causal: bool):
    """Starts and ends of the key tiles that query ``rows`` must visit (causal: none past the diagonal)."""
    last_key = min(key_len, rows.stop) if is_causal else key_len  # top-left causal: query i sees keys 0..i
    for start in range(0, last_key, key_block_size):
        yield slice(start, min(start + key_block_size, last_key))


class _TiledAttention(torch.autograd.Function):
    """Tiled attention whose backward pass recomputes each tile instead of storing the weights."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, query_block_size, key_block_size):
        L, S = query.size(-2), key.size(-2)
        output = torch.zeros(query.shape[:-1] + (value.size(-1),), dtype=query.dtype, device=query.device)  # (..., L, Dv)
        logsumexp = torch.full(query.shape[:-1] + (1,), float("inf"), dtype=query.dtype, device=query.device)  # (..., L, 1)
        for q_start in range(0, L, query_block_size):
            rows = slice(q_start, min(q_start + query_block_size, L))
            query_tile = query[..., rows, :]  # (..., Lb, D)
            row_max = torch.full(query_tile.shape[:-1] + (1,), float("-inf"), dtype=query.dtype, device=query.device)  # (..., Lb, 1)
            row_sum = torch.zeros_like(row_max)  # (..., Lb, 1)
            acc = torch.zeros(query_tile.shape[:-1] + (value.size(-1),), dtype=query.dtype, device=query.device)  # (..., Lb, Dv)
            for cols in _key_blocks(rows, S, key_block_size, is_causal):
                scores = _tile_scores(query_tile, key[..., cols, :], rows, cols, attn_mask, is_causal, scale)  # (..., Lb, Sb)
                new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (..., Lb, 1)
                safe_max = _finite_or_zero(new_max)
                probs = torch.exp(scores - safe_max)  # (..., Lb, Sb), unnormalised
                correction = torch.exp(row_max - safe_max)  # (..., Lb, 1): how much the old maximum was too small
                row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
                acc = acc * correction + probs @ value[..., cols, :]  # (..., Lb, Sb) @ (..., Sb, Dv) -> (..., Lb, Dv)
                row_max = new_max
            nothing_to_attend = row_sum == 0  # (..., Lb, 1)
            output[..., rows, :] = (acc / row_sum).masked_fill(nothing_to_attend, 0.0)
            # log of the softmax denominator; +inf where a row attends to nothing, so that the
            # backward pass recomputes exp(score - inf) = 0 there.
            logsumexp[..., rows, :] = (_finite_or_zero(row_max) + torch.log(row_sum)).masked_fill(nothing_to_attend, float("inf"))
        ctx.save_for_backward(query, key, value, output, logsumexp, *(() if attn_mask is None else (attn_mask,)))
        ctx.settings = (attn_mask is not None, is_causal, scale, query_block_size, key_block_size)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, logsumexp, *maybe_mask = ctx.saved_tensors
        has_mask, is_causal, scale, query_block_size, key_block_size = ctx.settings
        attn_mask = maybe_mask[0] if has_mask else None
        L, S = query.size(-2), key.size(-2)
        grad_query, grad_key, grad_value = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        # d(loss)/d(score_ij) = p_ij * (dO_i . v_j - dO_i . O_i); the second term is one number per query.
        output_dot_grad = (grad_output * output).sum(dim=-1, keepdim=True)  # (..., L, 1)
        for q_start in range(0, L, query_block_size):
            rows = slice(q_start, min(q_start + query_block_size, L))
            query_tile, grad_out_tile = query[..., rows, :], grad_output[..., rows, :]  # (..., Lb, D), (..., Lb, Dv)
            for cols in _key_blocks(rows, S, key_block_size, is_causal):
                key_tile, value_tile = key[..., cols, :], value[..., cols, :]  # (..., Sb, D), (..., Sb, Dv)
                scores = _tile_scores(query_tile, key_tile, rows, cols, attn_mask, is_causal, scale)
                probs = torch.exp(scores - logsumexp[..., rows, :])  # (..., Lb, Sb): the weights, recomputed
                grad_value[..., cols, :] += probs.transpose(-2, -1) @ grad_out_tile  # (..., Sb, Lb) @ (..., Lb, Dv)
                grad_probs = grad_out_tile @ value_tile.transpose(-2, -1)  # (..., Lb, Dv) @ (..., Dv, Sb) -> (..., Lb, Sb)
                grad_scores = probs * (grad_probs - output_dot_grad[..., rows, :]) * scale  # softmax backward
                grad_query[..., rows, :] += grad_scores @ key_tile  # (..., Lb, Sb) @ (..., Sb, D) -> (..., Lb, D)
                grad_key[..., cols, :] += grad_scores.transpose(-2, -1) @ query_tile  # (..., Sb, Lb) @ (..., Lb, D)
        return grad_query, grad_key, grad_value, None, None, None, None, None


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    query_block_size: int = 64,
    key_block_size: int = 64,
) -> torch.Tensor:
    """Exact attention computed tile by tile with the online softmax, as FlashAttention does.

    For each block of ``query_block_size`` queries it visits the keys ``key_block_size`` at a time,
    keeping a running maximum, a running softmax denominator and an unnormalised output per query;
    with ``is_causal=True`` it skips the tiles above the diagonal altogether. The full ``(L, S)``
    matrix of weights never exists, in the forward pass or in the backward pass (which recomputes
    each tile's weights from the saved log-sum-exp of every row, as FlashAttention does). The
    result equals :func:`torch.nn.functional.scaled_dot_product_attention` up to rounding.

    Mask convention (as ``F.scaled_dot_product_attention``): a **boolean** mask is True where a
    query **may** attend to a key; a **float** mask is added to the scores. ``is_causal=True`` lets
    query ``i`` see keys ``0..i``. A query with nothing to attend to gets zeros, never NaN.

    Args:
        query: queries.
        key: keys.
        value: values.
        attn_mask: optional bool or float mask, broadcastable to ``(..., L, S)``.
        is_causal: apply a causal mask (top-left aligned). Cannot be combined with ``attn_mask``.
        scale: factor on the scores; defaults to ``1/sqrt(E)``.
        query_block_size: queries per tile.
        key_block_size: keys per tile.

    Returns:
        The attention output (no weights: not storing them is the point).

    Shape:
        - query: ``(..., L, E)``, key: ``(..., S, E)``, value: ``(..., S, Ev)``; leading dimensions broadcast.
        - output: ``(..., L, Ev)``
    """
    _check_attention_inputs(query, key, value, attn_mask, 0.0, is_causal, scale)
    check_positive_int("query_block_size", query_block_size)
    check_positive_int("key_block_size", key_block_size)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else float(scale)
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    # One batch shape for all three (autograd sums the gradients of broadcast inputs back), and
    # float32 arithmetic for half-precision inputs.
    compute_dtype = torch.promote_types(query.dtype, torch.float32)
    q, k, v = (x.expand(*batch, *x.shape[-2:]).to(compute_dtype) for x in (query, key, value))
    output = _TiledAttention.apply(q, k, v, attn_mask, is_causal, scale, query_block_size, key_block_size)
    return output.to(query.dtype)
