"""Chapters 08 to 12: a small decoder-only language model, and greedy generation with or without a cache.

A decoder-only language model generates one token at a time, and each new token needs attention
over *all* earlier tokens. Without a cache, every step runs the model over the whole sequence
again: step ``t`` costs work proportional to ``t`` tokens (and ``t**2`` attention scores), so
generating ``N`` tokens costs ``O(N**2)`` token passes. With a cache (:mod:`attn_course.caches`)
each step projects only the new token and attends from it to the kept past: ``O(t)`` attention work
and ``O(1)`` everything else per step.

:class:`DecoderOnlyLM` is a small GPT-style model built from the package's chapter 07 blocks (an
:class:`~attn_course.EncoderLayer` with causal self-attention is a decoder-only block), with the
attention and position options of the later chapters; :func:`generate` decodes greedily with or
without the cache, and both give the same tokens.

This module sits on top of the package: it combines the mechanism modules and the caches below it,
and nothing in the package imports it (``attn_course.kv_cache`` re-exports it for old imports).

Shapes: ``B`` batch, ``T`` tokens, ``E`` model width, ``H`` heads, ``D`` head width, ``V`` vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_tensor, describe
from .caches import Cache, KVCache, cached_self_attention
from .gqa import GroupedQueryAttention
from .latent import MultiHeadLatentAttention
from .linear import DeltaNetAttention, LinearAttention
from .multihead import BACKENDS, MultiHeadAttention
from .positional import LearnedPositionalEmbedding, PositionalEncoding, TokenEmbedding
from .transformer import EncoderLayer

__all__ = ["DecoderOnlyLM", "generate", "POSITIONS", "ATTENTIONS", "RecurrentCache"]

POSITIONS = ("sinusoidal", "learned", "rotary", "alibi", "none")
SOFTMAX_ATTENTIONS = ("mha", "gqa", "mla")
RECURRENT_ATTENTIONS = ("linear", "delta", "gated_delta")  # chapter 12: a state of fixed size instead of a cache
ATTENTIONS = SOFTMAX_ATTENTIONS + RECURRENT_ATTENTIONS


def _layer_kinds(attention, num_layers: int) -> tuple[str | None, tuple[str, ...] | None]:
    """``(the softmax kind or None, the kind of every layer or None)`` of an ``attention`` argument.

    A string or None names one kind for every layer (None is resolved later, from ``num_kv_heads``);
    a list or tuple names each layer's kind, at most one softmax kind among them (a hybrid).
    """
    if attention is None or isinstance(attention, str):
        if attention in RECURRENT_ATTENTIONS:
            return None, (attention,) * num_layers
        return attention, None  # checked, and None resolved, by _check_attention
    if not isinstance(attention, (list, tuple)):
        raise TypeError(f"attention must be one of {ATTENTIONS}, None, or a list of them (one per layer), "
                        f"got {describe(attention)}")
    if len(attention) != num_layers:
        raise ValueError(f"attention as a list must name one kind per layer: num_layers={num_layers} kinds, "
                         f"got {len(attention)}: {list(attention)}")
    for kind in attention:
        if kind not in ATTENTIONS:
            raise ValueError(f"every entry of attention must be one of {ATTENTIONS}, got {kind!r} in {list(attention)}")
    softmax = sorted({kind for kind in attention if kind in SOFTMAX_ATTENTIONS})
    if len(softmax) > 1:
        raise ValueError(f"a hybrid takes one softmax kind for its softmax layers, got {softmax} in {list(attention)}")
    return (softmax[0] if softmax else None), tuple(attention)


def _check_recurrent_only(num_kv_heads, window, position, kv_latent_dim, q_latent_dim, rope_head_dim) -> None:
    """A model whose layers are all linear attention or delta rule takes no option of softmax attention."""
    for name, value in (("num_kv_heads", num_kv_heads), ("window", window), ("kv_latent_dim", kv_latent_dim),
                        ("q_latent_dim", q_latent_dim), ("rope_head_dim", rope_head_dim)):
        if value is not None:
            raise ValueError(f"{name} is an option of softmax attention layers, and this model has none "
                             f"(attention='linear', 'delta' or 'gated_delta' everywhere), got {name}={value!r}")
    if position in ("rotary", "alibi"):
        raise ValueError(f"position={position!r} acts inside softmax attention, and this model has no softmax layer; "
                         f"use 'sinusoidal', 'learned' or 'none'")


class RecurrentCache:
    """The cache of a :class:`DecoderOnlyLM` with linear attention or delta-rule layers (chapter 12).

    Each such layer keeps a recurrent state of fixed size (``(B, H, D_k, D)``, and a normaliser for
    linear attention), however many tokens came before; the softmax layers of a hybrid keep their
    keys and values in an ordinary cache (``kv_cache``) of their own, which grows with the tokens.

    Attributes:
        states: per layer of the model, its state, or None for a softmax layer.
        kv_cache: the softmax layers' cache (None without softmax layers).
        kv_layers: for each softmax layer of the model, its layer in ``kv_cache``.
    """

    def __init__(self, states: list, kv_cache: Cache | None, kv_layers: dict[int, int]) -> None:
        self.states, self.kv_cache, self.kv_layers = states, kv_cache, kv_layers
        self._length = 0

    @property
    def length(self) -> int:
        """Number of tokens processed so far."""
        return self._length

    @property
    def nbytes(self) -> int:
        """Memory taken by the states and the softmax layers' cache, in bytes."""
        tensors = [t for state in self.states if state is not None
                   for t in (state if isinstance(state, tuple) else (state,))]
        return sum(t.numel() * t.element_size() for t in tensors) + (self.kv_cache.nbytes if self.kv_cache else 0)


def _check_attention(attention, num_heads, num_kv_heads, window, position, kv_latent_dim, q_latent_dim,
                     rope_head_dim) -> str:
    """The attention choice of :class:`DecoderOnlyLM`, checked against the options it goes with."""
    if attention is None:
        attention = "gqa" if num_kv_heads is not None else "mha"
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS} or None, got {attention!r}")
    latent_options = {"kv_latent_dim": kv_latent_dim, "q_latent_dim": q_latent_dim, "rope_head_dim": rope_head_dim}
    if attention != "mla":
        for name, value in latent_options.items():
            if value is not None:
                raise ValueError(f"{name} is an option of attention='mla', got {name}={value!r} with attention={attention!r}")
    if attention == "mha" and num_kv_heads not in (None, num_heads):
        raise ValueError(f"attention='mha' has one key/value head per query head: num_kv_heads must be None or "
                         f"num_heads={num_heads}, got {num_kv_heads} (use attention='gqa')")
    if attention == "gqa" and num_kv_heads is None:
        raise ValueError("attention='gqa' needs num_kv_heads (the shared key/value heads), got None")
    if attention == "mla":
        if kv_latent_dim is None:
            raise ValueError("attention='mla' needs kv_latent_dim (the latent width d_c), got None")
        if num_kv_heads is not None or window is not None:
            raise ValueError(f"attention='mla' takes neither num_kv_heads nor window, got num_kv_heads={num_kv_heads} "
                             f"and window={window}")
        if position == "alibi":
            raise ValueError("attention='mla' takes position 'rotary' (its decoupled rotary part), 'sinusoidal', "
                             "'learned' or 'none', got 'alibi'")
        if rope_head_dim is not None and position != "rotary":
            raise ValueError(f"rope_head_dim is the rotary part of attention='mla' and needs position='rotary', "
                             f"got position={position!r}")
        if rope_head_dim == 0:
            raise ValueError("rope_head_dim must be positive with position='rotary' (it carries the positions), got 0")
    return attention


_RECURRENT = (LinearAttention, DeltaNetAttention)


class _NoPosition(nn.Module):
    """No position information at all (only the causal mask tells tokens apart): dropout only."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        return self.dropout(x)


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
        attention: ``"mha"`` (one key/value head per query head), ``"gqa"`` (``num_kv_heads`` shared
            key/value heads; MQA with 1) or ``"mla"`` (multi-head latent attention, chapter 11); None
            (the default) means ``"gqa"`` when ``num_kv_heads`` is given, else ``"mha"``. Chapter 12:
            ``"linear"`` (:class:`~attn_course.LinearAttention`, elu+1), ``"delta"`` or
            ``"gated_delta"`` (:class:`~attn_course.DeltaNetAttention` without or with the gate),
            which keep a state of fixed size instead of a cache; or a list with one kind per layer
            for a **hybrid**, at most one softmax kind among them, e.g. ``["gated_delta"] * 3 +
            ["mha"]`` (three linear layers to one softmax layer, the ratio of Qwen3-Next and Kimi
            Linear). The softmax options (``num_kv_heads``, ``window``, rotary or ALiBi positions,
            the latent widths) apply to the softmax layers; the linear layers get positions only
            from the embeddings.
        kv_latent_dim: with ``"mla"`` (and only then, required): the latent width ``d_c``.
        q_latent_dim: with ``"mla"``: the query latent width ``d_c'``; None for queries straight from the input.
        rope_head_dim: with ``"mla"`` and ``position="rotary"``: the decoupled rotary width ``d_h^R``
            (even; None for half the head width, rounded down to an even number, at least 2). With
            another position MLA has no rotary part.

    With ``"rotary"``, ``"alibi"``, ``num_kv_heads`` or ``window`` the layers' ``self_attn`` is a
    :class:`~attn_course.GroupedQueryAttention`; with ``attention="mla"`` a
    :class:`~attn_course.MultiHeadLatentAttention` of ``num_heads`` heads of width ``d_model / num_heads``
    (with biases, as the other attentions of this model). :meth:`new_cache` gives the cache the
    layers' attention needs: with linear or delta-rule layers a :class:`RecurrentCache`.

    Shape:
        - tokens: ``(B, T)`` integer ids -> logits: ``(B, T, V)``; ``logits[:, t]`` predicts token ``t + 1``.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, num_layers: int = 2, d_ff: int = 128,
                 max_len: int = 256, dropout: float = 0.0, backend: str = "sdpa", position: str = "sinusoidal",
                 num_kv_heads: int | None = None, window: int | None = None, attention: str | None = None,
                 kv_latent_dim: int | None = None, q_latent_dim: int | None = None,
                 rope_head_dim: int | None = None) -> None:
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
        softmax_kind, kinds = _layer_kinds(attention, num_layers)
        if softmax_kind is None and kinds is not None:  # linear attention or the delta rule in every layer
            _check_recurrent_only(num_kv_heads, window, position, kv_latent_dim, q_latent_dim, rope_head_dim)
        else:
            softmax_kind = _check_attention(softmax_kind, num_heads, num_kv_heads, window, position, kv_latent_dim,
                                            q_latent_dim, rope_head_dim)
        kinds = kinds or (softmax_kind,) * num_layers
        if isinstance(attention, (list, tuple)):
            attention = tuple(attention)
        elif attention is None:
            attention = softmax_kind
        self.max_len, self.position, self.attention, self.layer_attention = max_len, position, attention, kinds
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
        if softmax_kind == "mla":
            head_dim = d_model // num_heads
            if position != "rotary":
                rope_head_dim = 0  # positions come from the embeddings (or nowhere)
            elif rope_head_dim is None:
                rope_head_dim = max(2, head_dim // 4 * 2)  # half the head width, even
            for layer in (layer for layer, kind in zip(self.layers, kinds) if kind == "mla"):
                layer.self_attn = MultiHeadLatentAttention(
                    d_model, num_heads, head_dim, kv_latent_dim, q_latent_dim=q_latent_dim, rope_head_dim=rope_head_dim,
                    bias=True, dropout=dropout, backend=backend)
        elif position in ("rotary", "alibi") or num_kv_heads is not None or window is not None:
            for layer in (layer for layer, kind in zip(self.layers, kinds) if kind in SOFTMAX_ATTENTIONS):
                layer.self_attn = GroupedQueryAttention(
                    d_model, num_heads, num_kv_heads or num_heads, dropout=dropout, window=window,
                    rotary=position == "rotary", alibi=position == "alibi", backend=backend)
        for layer, kind in zip(self.layers, kinds):  # chapter 12: linear attention and the delta rule
            if kind == "linear":
                layer.self_attn = LinearAttention(d_model, num_heads)
            elif kind in ("delta", "gated_delta"):
                layer.self_attn = DeltaNetAttention(d_model, num_heads, use_gate=kind == "gated_delta")
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
            if isinstance(layer.self_attn, _RECURRENT):  # causal by construction, returns the output alone
                x, _ = layer.apply_sublayers(x, lambda h: (layer.self_attn(h), None))
            elif isinstance(layer.self_attn, MultiHeadLatentAttention):  # self-attention of one input: called with x alone
                x, _ = layer.apply_sublayers(x, lambda h: layer.self_attn(h, is_causal=True, need_weights=False))
            else:
                x, _ = layer(x, is_causal=True)  # (B, T, E)
        return self.lm_head(self.final_norm(x))  # (B, T, V)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> Cache | RecurrentCache:
        """An empty cache for this model, on its device and in its dtype: a :class:`~attn_course.KVCache`,
        or the cache its attention modules build (``self_attn.new_cache``); with linear attention or
        delta-rule layers a :class:`RecurrentCache` of their states (and of the softmax layers' cache)."""
        if any(isinstance(layer.self_attn, _RECURRENT) for layer in self.layers):
            check_positive_int("batch_size", batch_size)
            softmax_layers = [i for i, layer in enumerate(self.layers) if not isinstance(layer.self_attn, _RECURRENT)]
            states = [None if i in softmax_layers else layer.self_attn.new_state(batch_size)
                      for i, layer in enumerate(self.layers)]
            kv_cache = self._softmax_cache(batch_size, max_len, len(softmax_layers)) if softmax_layers else None
            return RecurrentCache(states, kv_cache, {layer: j for j, layer in enumerate(softmax_layers)})
        return self._softmax_cache(batch_size, max_len, len(self.layers))

    def _softmax_cache(self, batch_size: int, max_len: int | None, num_layers: int) -> Cache:
        """The cache of ``num_layers`` softmax attention layers like this model's."""
        weight = self.lm_head.weight
        attn = next(layer.self_attn for layer in self.layers if not isinstance(layer.self_attn, _RECURRENT))
        if not isinstance(attn, MultiHeadAttention):  # a GroupedQueryAttention: G heads, maybe a rolling window
            return attn.new_cache(batch_size, max_len or self.max_len, num_layers=num_layers)
        return KVCache(num_layers, batch_size, attn.num_heads, attn.head_dim, max_len or self.max_len,
                       device=weight.device, dtype=weight.dtype)

    def forward_cached(self, tokens: torch.Tensor, cache: Cache | RecurrentCache, *, absorb: bool = False) -> torch.Tensor:
        """Logits for new tokens that follow the ``cache.length`` tokens already in ``cache``.

        The same as ``self(all_tokens)[:, -T_new:]``, but only the new tokens are computed; their
        keys and values (or latents) are added to ``cache``, or written into the layers' states.
        ``absorb=True`` (``attention="mla"`` only) uses the absorbed form of
        :meth:`~attn_course.MultiHeadLatentAttention.forward_cached`.

        Shape:
            tokens: ``(B, T_new)`` -> logits: ``(B, T_new, V)``
        """
        recurrent = any(isinstance(layer.self_attn, _RECURRENT) for layer in self.layers)
        if not isinstance(cache, RecurrentCache if recurrent else Cache):
            expected = "a RecurrentCache" if recurrent else "a KVCache"
            raise TypeError(f"cache must be {expected} (model.new_cache(batch_size)), got {type(cache).__name__}")
        check_bool("absorb", absorb)
        if absorb and "mla" not in self.layer_attention:
            raise ValueError(f"absorb=True needs attention='mla' (the absorbed form of latent attention), "
                             f"this model has attention={self.attention!r}")
        start = cache.length
        self._check_tokens(tokens, start)
        x = self.positional(self.embedding(tokens), start=start)  # (B, T_new, E), positions start, start+1, ...
        for i, layer in enumerate(self.layers):  # the layer of chapter 07, with a cached attention step
            # A softmax layer's keys and values: in `cache`, or in a hybrid's cache of its softmax layers.
            kv_cache, j = (cache.kv_cache, cache.kv_layers.get(i)) if recurrent else (cache, i)
            if isinstance(layer.self_attn, _RECURRENT):  # read and replace the layer's state
                x, _ = layer.apply_sublayers(x, lambda h: self._recurrent_step(layer.self_attn, h, cache, i))
            elif isinstance(layer.self_attn, MultiHeadAttention):
                x, _ = layer.apply_sublayers(x, lambda h: (cached_self_attention(layer.self_attn, h, kv_cache, j), None))
            elif isinstance(layer.self_attn, MultiHeadLatentAttention):
                x, _ = layer.apply_sublayers(x, lambda h: (layer.self_attn.forward_cached(h, kv_cache, j, absorb=absorb), None))
            else:  # GroupedQueryAttention has its own cached step
                x, _ = layer.apply_sublayers(x, lambda h: (layer.self_attn.forward_cached(h, kv_cache, j), None))
        if recurrent:
            cache._length += tokens.size(1)
        return self.lm_head(self.final_norm(x))  # (B, T_new, V)

    @staticmethod
    def _recurrent_step(attn: nn.Module, h: torch.Tensor, cache: RecurrentCache, i: int):
        output, cache.states[i] = attn.forward_cached(h, cache.states[i])  # (B, T_new, E), the new state
        return output, None


@torch.no_grad()
def generate(model: DecoderOnlyLM, prompt: torch.Tensor, max_new_tokens: int, use_cache: bool = True, *,
             absorb: bool = False) -> torch.Tensor:
    """Greedy decoding: append the most likely next token, ``max_new_tokens`` times.

    Args:
        model: a :class:`DecoderOnlyLM` (put it in ``eval()`` mode to switch dropout off).
        prompt: the tokens to continue.
        max_new_tokens: how many tokens to generate.
        use_cache: keep the keys and values in a :class:`KVCache` (one new token per step), or run
            the model over the whole sequence at every step. Both give the same tokens.
        absorb: with ``use_cache`` and ``attention="mla"``: decode with the absorbed form.

    Returns:
        The prompt followed by the generated tokens.

    Shape:
        prompt: ``(B, P)`` -> ``(B, P + max_new_tokens)``
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a DecoderOnlyLM, got {type(model).__name__}")
    check_positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
    check_bool("use_cache", use_cache)
    check_bool("absorb", absorb)
    if absorb and not use_cache:
        raise ValueError("absorb=True is a form of cached decoding: it needs use_cache=True")
    if absorb and "mla" not in model.layer_attention:
        raise ValueError(f"absorb=True needs a model with attention='mla', got attention={model.attention!r}")
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
        logits = model.forward_cached(prompt, cache, absorb=absorb)[:, -1]  # (B, V): the whole prompt once ("prefill")
    else:
        logits = model(prompt)[:, -1]
    for step in range(max_new_tokens):
        next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
        if step == max_new_tokens - 1:
            break
        if use_cache:
            logits = model.forward_cached(next_token, cache, absorb=absorb)[:, -1]  # one new token: (B, 1) -> (B, V)
        else:
            logits = model(tokens)[:, -1]  # everything again: (B, T + 1) -> (B, V)
    return tokens
