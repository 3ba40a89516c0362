"""Chapter 08: decoding with a key/value cache.

A decoder-only language model generates one token at a time, and each new token needs attention
over *all* earlier tokens. Without a cache, every step runs the model over the whole sequence
again: step ``t`` costs work proportional to ``t`` tokens (and ``t**2`` attention scores), so
generating ``N`` tokens costs ``O(N**2)`` token passes. But the keys and values of earlier tokens
never change (causal attention: a token never sees the future), so they can be kept: with a
**KV cache** each step projects only the new token, appends its key and value, and attends from
that one query to the cached keys: ``O(t)`` attention work and ``O(1)`` everything else per step.

:class:`DecoderOnlyLM` is a small GPT-style model built from the package's chapter 07 blocks (an
:class:`~attn_course.EncoderLayer` with causal self-attention is a decoder-only block);
:func:`generate` decodes greedily with or without the cache, and both give the same tokens.

Shapes: ``B`` batch, ``T`` tokens, ``E`` model width, ``H`` heads, ``D`` head width, ``V`` vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_tensor, describe
from .masks import causal_mask
from .multihead import BACKENDS, MultiHeadAttention
from .positional import LearnedPositionalEmbedding, PositionalEncoding, TokenEmbedding
from .scaled import scaled_dot_product_attention
from .transformer import EncoderLayer

__all__ = ["KVCache", "cached_self_attention", "DecoderOnlyLM", "generate", "POSITIONS"]

POSITIONS = ("sinusoidal", "learned", "rotary", "alibi", "none")


class _NoPosition(nn.Module):
    """No position information at all (only the causal mask tells tokens apart): dropout only."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        return self.dropout(x)


class KVCache:
    """The keys and values of the tokens processed so far, for every layer of a model.

    The buffers are allocated once, for ``max_len`` tokens; each step writes the new tokens' keys
    and values after the ones already there (no copying of the old ones, unlike ``torch.cat``).

    Args:
        num_layers: number of attention layers that use the cache.
        batch_size: ``B``.
        num_heads: ``H``.
        head_dim: ``D``.
        max_len: the most tokens it can hold.
        device: where to allocate the buffers.
        dtype: dtype of the buffers (the model's).

    Shape:
        Each layer holds keys and values of shape ``(B, H, max_len, D)``, of which the first
        :attr:`length` positions are filled.
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, max_len: int,
                 *, device=None, dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("num_layers", num_layers), ("batch_size", batch_size), ("num_heads", num_heads),
                            ("head_dim", head_dim), ("max_len", max_len)):
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}")
        shape = (batch_size, num_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.max_len = max_len
        self._lengths = [0] * num_layers  # tokens stored, per layer

    @property
    def length(self) -> int:
        """Number of tokens whose keys and values are stored (in the first layer)."""
        return self._lengths[0]

    @property
    def nbytes(self) -> int:
        """Memory taken by the buffers, in bytes (all of ``max_len``, filled or not)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def reset(self) -> None:
        """Forget every token (the buffers are kept and overwritten)."""
        self._lengths = [0] * len(self._lengths)

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the keys and values of new tokens to ``layer``, and return all stored so far.

        Args:
            layer: index of the layer.
            keys: keys of the new tokens.
            values: values of the new tokens.

        Returns:
            ``(all_keys, all_values)``, views of the buffers, old tokens first.

        Shape:
            keys, values: ``(B, H, T_new, D)`` -> ``(B, H, T_old + T_new, D)`` each.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self.keys):
            raise ValueError(f"layer must be an int in [0, {len(self.keys)}), got {describe(layer)}")
        buffer = self.keys[layer]
        for name, x in (("keys", keys), ("values", values)):
            check_tensor(name, x, floating=True)
            if x.dim() != 4 or x.shape[:2] != buffer.shape[:2] or x.size(-1) != buffer.size(-1):
                raise ValueError(
                    f"{name} must have shape (B, H, T_new, D) = {(buffer.size(0), buffer.size(1), 'T_new', buffer.size(3))}, "
                    f"got {tuple(x.shape)}"
                )
        if keys.shape != values.shape:
            raise ValueError(f"keys and values must have the same shape, got {tuple(keys.shape)} and {tuple(values.shape)}")
        start, new = self._lengths[layer], keys.size(2)
        if start + new > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {start} stored plus {new} new do not fit")
        self.keys[layer][:, :, start:start + new] = keys  # write after the stored tokens
        self.values[layer][:, :, start:start + new] = values
        self._lengths[layer] = start + new
        return self.keys[layer][:, :, :start + new], self.values[layer][:, :, :start + new]  # (B, H, S, D) each


def cached_self_attention(attn: MultiHeadAttention, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Causal self-attention of new tokens, reusing the cached keys and values of the earlier ones.

    Only the new tokens are projected; their keys and values are appended to ``cache``; then each
    new query attends to every stored key up to its own position (a causal mask aligned to the
    bottom-right corner, since the queries are the *last* tokens). With one new token, no mask is
    needed at all: every stored token is in its past.

    Args:
        attn: the layer's :class:`~attn_course.MultiHeadAttention` (its projections are used as they are).
        x: the new tokens (after the layer's norm, as the layer would feed them to ``attn``).
        cache: the model's :class:`KVCache`.
        layer: which of the cache's layers belongs to ``attn``.

    Returns:
        The same as ``attn(x_all, x_all, x_all, is_causal=True)[0]`` at the new positions, where
        ``x_all`` is every token so far.

    Shape:
        - x: ``(B, T_new, E)`` -> output: ``(B, T_new, E)``
    """
    if not isinstance(attn, MultiHeadAttention):
        raise TypeError(f"attn must be an attn_course.MultiHeadAttention, got {type(attn).__name__}")
    check_tensor("x", x, floating=True)
    if x.dim() != 3 or x.size(-1) != attn.embed_dim:
        raise ValueError(f"x must have shape (B, T_new, E={attn.embed_dim}), got {tuple(x.shape)}")
    B, T, E = x.shape
    H, D = attn.num_heads, attn.head_dim
    q = attn.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, T, E) -> (B, H, T, D)
    k = attn.k_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    v = attn.v_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    keys, values = cache.update(layer, k, v)  # (B, H, S, D) each, S = tokens so far
    S = keys.size(2)
    allowed = None if T == 1 else causal_mask(T, S, align="bottom_right", device=x.device)  # (T, S), True = may attend
    dropout_p = attn.dropout if attn.training else 0.0
    if attn.backend == "sdpa":
        context = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, dropout_p=dropout_p)  # (B, H, T, D)
    else:
        context, _ = scaled_dot_product_attention(q, keys, values, attn_mask=allowed, dropout_p=dropout_p)  # (B, H, T, D)
    context = context.transpose(1, 2).reshape(B, T, E)  # (B, H, T, D) -> (B, T, E)
    return attn.out_proj(context)


class DecoderOnlyLM(nn.Module):
    """A small GPT-style language model: embeddings, causal pre-norm layers, a next-token head.

    Each layer is an :class:`~attn_course.EncoderLayer` called with ``is_causal=True``: causal
    self-attention plus a feed-forward network, which is all a decoder-only block is.

    Args:
        vocab_size: ``V``.
        d_model: model width ``E``.
        num_heads: heads ``H`` per layer.
        num_layers: number of layers.
        d_ff: hidden width of the feed-forward networks.
        max_len: longest sequence (prompt plus generated tokens).
        dropout: dropout probability (training mode only).
        backend: attention implementation, ``"sdpa"`` or ``"reference"``.
        position: how the model knows positions (chapter 09): ``"sinusoidal"`` (the default, added to
            the embeddings), ``"learned"`` (a trained table), ``"rotary"`` (queries and keys rotated),
            ``"alibi"`` (a distance bias per head) or ``"none"`` (only the causal mask).
        num_kv_heads: key/value heads per layer (chapter 10); None for one per query head.
        window: sliding-window attention over the last ``window`` positions (chapter 10); None for all.

    With ``"rotary"``, ``"alibi"``, ``num_kv_heads`` or ``window`` the layers' ``self_attn`` is a
    :class:`~attn_course.GroupedQueryAttention`, and :meth:`new_cache` gives its cache.

    Shape:
        - tokens: ``(B, T)`` integer ids -> logits: ``(B, T, V)``; ``logits[:, t]`` predicts token ``t + 1``.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, num_layers: int = 2, d_ff: int = 128,
                 max_len: int = 256, dropout: float = 0.0, backend: str = "sdpa", position: str = "sinusoidal",
                 num_kv_heads: int | None = None, window: int | None = None) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("d_ff", d_ff), ("max_len", max_len)):
            check_positive_int(name, value)
        check_probability("dropout", dropout)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        if num_kv_heads is not None:
            check_positive_int("num_kv_heads", num_kv_heads)
        self.max_len, self.position = max_len, position
        self.embedding = TokenEmbedding(vocab_size, d_model)
        if position == "learned":
            self.positional = LearnedPositionalEmbedding(max_len, d_model, dropout=dropout)
        elif position == "sinusoidal":
            self.positional = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        else:  # rotary and ALiBi act inside attention
            self.positional = _NoPosition(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout=dropout, backend=backend, norm_first=True) for _ in range(num_layers)
        )
        if position in ("rotary", "alibi") or num_kv_heads is not None or window is not None:
            from .gqa import GroupedQueryAttention  # (gqa imports this module)

            for layer in self.layers:
                layer.self_attn = GroupedQueryAttention(
                    d_model, num_heads, num_kv_heads or num_heads, dropout=dropout, window=window,
                    rotary=position == "rotary", alibi=position == "alibi", backend=backend)
        self.final_norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def _check_tokens(self, tokens: torch.Tensor, start: int = 0) -> None:
        check_tensor("tokens", tokens)
        if tokens.dim() != 2 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be a (B, T) tensor of integer ids, got {describe(tokens)}")
        if start + tokens.size(1) > self.max_len:
            raise ValueError(f"{start + tokens.size(1)} tokens in all but max_len={self.max_len}")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for every position of ``tokens``, computed from scratch (no cache)."""
        self._check_tokens(tokens)
        x = self.positional(self.embedding(tokens))  # (B, T, E)
        for layer in self.layers:
            x, _ = layer(x, is_causal=True)  # (B, T, E)
        return self.lm_head(self.final_norm(x))  # (B, T, V)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for this model, on its device and in its dtype."""
        weight = self.lm_head.weight
        attn = self.layers[0].self_attn
        if not isinstance(attn, MultiHeadAttention):  # a GroupedQueryAttention: G heads, maybe a rolling window
            return attn.new_cache(batch_size, max_len or self.max_len, num_layers=len(self.layers))
        return KVCache(len(self.layers), batch_size, attn.num_heads, attn.head_dim, max_len or self.max_len,
                       device=weight.device, dtype=weight.dtype)

    def forward_cached(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits for new tokens that follow the ``cache.length`` tokens already in ``cache``.

        The same as ``self(all_tokens)[:, -T_new:]``, but only the new tokens are computed; their
        keys and values are added to ``cache``.

        Shape:
            tokens: ``(B, T_new)`` -> logits: ``(B, T_new, V)``
        """
        from .gqa import RollingKVCache  # (gqa imports this module)

        if not isinstance(cache, (KVCache, RollingKVCache)):
            raise TypeError(f"cache must be a KVCache (model.new_cache(batch_size)), got {type(cache).__name__}")
        start = cache.length
        self._check_tokens(tokens, start)
        x = self.positional(self.embedding(tokens), start=start)  # (B, T_new, E), positions start, start+1, ...
        for i, layer in enumerate(self.layers):  # the layer of chapter 07, with a cached attention step
            if isinstance(layer.self_attn, MultiHeadAttention):
                x, _ = layer.apply_sublayers(x, lambda h: (cached_self_attention(layer.self_attn, h, cache, i), None))
            else:  # GroupedQueryAttention has its own cached step
                x, _ = layer.apply_sublayers(x, lambda h: (layer.self_attn.forward_cached(h, cache, i), None))
        return self.lm_head(self.final_norm(x))  # (B, T_new, V)


@torch.no_grad()
def generate(model: DecoderOnlyLM, prompt: torch.Tensor, max_new_tokens: int, use_cache: bool = True) -> torch.Tensor:
    """Greedy decoding: append the most likely next token, ``max_new_tokens`` times.

    Args:
        model: a :class:`DecoderOnlyLM` (put it in ``eval()`` mode to switch dropout off).
        prompt: the tokens to continue.
        max_new_tokens: how many tokens to generate.
        use_cache: keep the keys and values in a :class:`KVCache` (one new token per step), or run
            the model over the whole sequence at every step. Both give the same tokens.

    Returns:
        The prompt followed by the generated tokens.

    Shape:
        prompt: ``(B, P)`` -> ``(B, P + max_new_tokens)``
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a DecoderOnlyLM, got {type(model).__name__}")
    check_positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
    check_bool("use_cache", use_cache)
    model._check_tokens(prompt)
    if prompt.size(1) == 0:
        raise ValueError("prompt must hold at least one token per sequence, got shape (B, 0)")
    if prompt.size(1) + max_new_tokens > model.max_len:
        raise ValueError(f"prompt ({prompt.size(1)} tokens) plus max_new_tokens={max_new_tokens} exceeds max_len={model.max_len}")
    tokens = prompt
    if max_new_tokens == 0:
        return tokens
    if use_cache:
        cache = model.new_cache(prompt.size(0), prompt.size(1) + max_new_tokens)
        logits = model.forward_cached(prompt, cache)[:, -1]  # (B, V): the whole prompt once ("prefill")
    else:
        logits = model(prompt)[:, -1]
    for step in range(max_new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
        if step == max_new_tokens - 1:
            break
        if use_cache:
            logits = model.forward_cached(next_token, cache)[:, -1]  # one new token: (B, 1) -> (B, V)
        else:
            logits = model(tokens)[:, -1]  # everything again: (B, T + 1) -> (B, V)
    return tokens
