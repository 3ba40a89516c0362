"""Chapter 01: the attention of encoder-decoder RNNs.

Bahdanau et al. (2015) score each encoder state ``h_j`` against the decoder state ``s`` with a small
network, ``v^T tanh(W s + U h_j)`` (additive attention); Luong et al. (2015) use the dot product
``s . h_j`` (multiplicative attention). Both turn the scores into weights with a softmax over the
source positions and return the weighted average of the values (the context vector).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_positive_int, check_tensor

__all__ = ["AdditiveAttention", "DotProductAttention"]


def _check_alignment_inputs(query, keys, values, key_padding_mask, query_dim=None, key_dim=None):
    check_tensor("query", query, floating=True)
    check_tensor("keys", keys, floating=True)
    if query.dim() not in (2, 3):
        raise ValueError(f"query must be (B, Dq) for one decoder step or (B, L, Dq), got shape {tuple(query.shape)}")
    if keys.dim() != 3:
        raise ValueError(f"keys must be (B, S, Dk), got shape {tuple(keys.shape)}")
    if query.size(0) != keys.size(0):
        raise ValueError(f"query and keys must share the batch size, got query {tuple(query.shape)} and keys {tuple(keys.shape)}")
    if query_dim is not None and query.size(-1) != query_dim:
        raise ValueError(f"query must have last dimension query_dim={query_dim}, got shape {tuple(query.shape)}")
    if key_dim is not None and keys.size(-1) != key_dim:
        raise ValueError(f"keys must have last dimension key_dim={key_dim}, got shape {tuple(keys.shape)}")
    B, S = keys.size(0), keys.size(1)
    if values is not None:
        check_tensor("values", values, floating=True)
        if values.dim() != 3 or values.shape[:2] != keys.shape[:2]:
            raise ValueError(f"values must be (B, S, Dv) with B, S as in keys {tuple(keys.shape)}, got {tuple(values.shape)}")
    if key_padding_mask is not None:
        check_tensor("key_padding_mask", key_padding_mask)
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be a bool tensor (True = padding), got dtype {key_padding_mask.dtype}")
        if tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(f"key_padding_mask must have shape (B, S) = {(B, S)}, got {tuple(key_padding_mask.shape)}")


def _weights_and_context(scores, values, key_padding_mask):
    """Mask, softmax over the source axis and average the values.

    scores: (B, L, S); values: (B, S, Dv); key_padding_mask: (B, S), True = padding.
    """
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))  # (B, L, S)
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.masked_fill(torch.isneginf(scores).all(-1, keepdim=True), 0.0).to(values.dtype)
    context = weights @ values  # (B, L, S) @ (B, S, Dv) -> (B, L, Dv)
    return context, weights


class AdditiveAttention(nn.Module):
    """Bahdanau (additive) attention: ``score(s, h_j) = v^T tanh(W s + U h_j)``.

    Args:
        query_dim: width ``Dq`` of the decoder state (the query).
        key_dim: width ``Dk`` of the encoder states (the keys).
        hidden_dim: width of the scoring network's hidden layer.

    Shape:
        - query: ``(B, Dq)`` for one decoder step, or ``(B, L, Dq)``
        - keys: ``(B, S, Dk)``; values: ``(B, S, Dv)`` (default: the keys)
        - key_padding_mask: ``(B, S)``, **True at padding** (as ``nn.MultiheadAttention``)
        - context: ``(B, Dv)`` or ``(B, L, Dv)``; weights: ``(B, S)`` or ``(B, L, S)``
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        check_positive_int("query_dim", query_dim)
        check_positive_int("key_dim", key_dim)
        check_positive_int("hidden_dim", hidden_dim)
        self.query_dim, self.key_dim, self.hidden_dim = query_dim, key_dim, hidden_dim
        self.W = nn.Linear(query_dim, hidden_dim, bias=False)  # W s
        self.U = nn.Linear(key_dim, hidden_dim, bias=False)  # U h_j
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # v^T

    def forward(self, query, keys, values=None, key_padding_mask=None):
        _check_alignment_inputs(query, keys, values, key_padding_mask, self.query_dim, self.key_dim)
        one_step = query.dim() == 2
        q = query[:, None, :] if one_step else query  # (B, L, Dq)
        hidden = torch.tanh(self.W(q)[:, :, None, :] + self.U(keys)[:, None, :, :])  # (B, L, 1, A) + (B, 1, S, A) -> (B, L, S, A)
        scores = self.v(hidden).squeeze(-1)  # (B, L, S)
        context, weights = _weights_and_context(scores, keys if values is None else values, key_padding_mask)
        return (context[:, 0], weights[:, 0]) if one_step else (context, weights)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}"


class DotProductAttention(nn.Module):
    """Luong (multiplicative, "dot") attention: ``score(s, h_j) = s . h_j``; no parameters.

    Shape:
        - query: ``(B, D)`` for one decoder step, or ``(B, L, D)``
        - keys: ``(B, S, D)`` (same width as the query); values: ``(B, S, Dv)`` (default: the keys)
        - key_padding_mask: ``(B, S)``, **True at padding** (as ``nn.MultiheadAttention``)
        - context: ``(B, Dv)`` or ``(B, L, Dv)``; weights: ``(B, S)`` or ``(B, L, S)``
    """

    def forward(self, query, keys, values=None, key_padding_mask=None):
        _check_alignment_inputs(query, keys, values, key_padding_mask)
        if query.size(-1) != keys.size(-1):
            raise ValueError(
                f"dot-product attention needs query and keys of one width, got query {tuple(query.shape)} "
                f"and keys {tuple(keys.shape)}"
            )
        one_step = query.dim() == 2
        q = query[:, None, :] if one_step else query  # (B, L, D)
        scores = q @ keys.transpose(1, 2)  # (B, L, D) @ (B, D, S) -> (B, L, S)
        context, weights = _weights_and_context(scores, keys if values is None else values, key_padding_mask)
        return (context[:, 0], weights[:, 0]) if one_step else (context, weights)
