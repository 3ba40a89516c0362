"""Chapter 07: the encoder-decoder Transformer, assembled from the package's own pieces.

Everything attention-related comes from earlier chapters: :class:`~attn_course.TokenEmbedding`
(scaled by ``sqrt(d_model)``) and :class:`~attn_course.PositionalEncoding` (chapter 06),
:class:`~attn_course.MultiHeadAttention` (chapter 05) with its padding and causal masks (chapter 04).
This module only adds what sits around attention: the position-wise feed-forward network, residual
connections, layer normalisation, and the stacking of layers into an encoder and a decoder.

Pre-norm or post-norm
---------------------
The original Transformer (Vaswani et al., 2017) is **post-norm**: each sub-layer is followed by a
layer norm, ``x = norm(x + sublayer(x))``. This package defaults to **pre-norm**
(``norm_first=True``), ``x = x + sublayer(norm(x))``, plus one final layer norm after the last
layer of each stack. The residual path is then a clean sum from the embeddings to the output, so
gradients reach the first layers undiminished; pre-norm trains stably with a large learning rate and
a short warm-up (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture"),
which is what a model trained in two minutes on a CPU needs. ``norm_first=False`` builds the
original post-norm layers, for comparison.

Mask convention (as :class:`~attn_course.MultiHeadAttention` and ``nn.MultiheadAttention``): a
boolean mask is **True where attending is not allowed**; a ``key_padding_mask`` is True at padding.
Use :func:`attn_course.allowed_to_blocked` to pass masks made by :func:`attn_course.padding_mask`
or :func:`attn_course.causal_mask`, which use the opposite ("allowed") convention.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``E`` model width (``d_model``),
``H`` heads, ``V`` vocabulary size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_tensor
from .multihead import BACKENDS, MultiHeadAttention
from .positional import PositionalEncoding, TokenEmbedding

__all__ = ["FeedForward", "EncoderLayer", "DecoderLayer", "TransformerConfig", "Transformer"]


class FeedForward(nn.Module):
    """The position-wise feed-forward network: ``Linear(E, d_ff) -> ReLU -> dropout -> Linear(d_ff, E)``.

    It is applied to every position separately and identically: attention mixes information
    *between* positions, the feed-forward network transforms each position on its own.

    Args:
        d_model: model width ``E``.
        d_ff: width of the hidden layer (usually 2 to 4 times ``d_model``).
        dropout: dropout on the hidden layer, in training mode only.

    Shape:
        - x: ``(..., E)``
        - output: ``(..., E)``
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        check_probability("dropout", dropout)
        self.expand = nn.Linear(d_model, d_ff)
        self.activation = nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.contract = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(self.activation(self.expand(x)))  # (..., E) -> (..., d_ff)
        return self.contract(hidden)  # (..., d_ff) -> (..., E)


def _check_layer_args(d_model, num_heads, d_ff, dropout, backend, norm_first) -> None:
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    check_positive_int("d_ff", d_ff)
    check_probability("dropout", dropout)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_bool("norm_first", norm_first)


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, then feed-forward, each with a residual connection.

    Pre-norm (``norm_first=True``, the default)::

        x = x + dropout(self_attn(norm1(x)))
        x = x + dropout(feed_forward(norm2(x)))

    Post-norm (``norm_first=False``, as in the original paper)::

        x = norm1(x + dropout(self_attn(x)))
        x = norm2(x + dropout(feed_forward(x)))

    Args:
        d_model: model width ``E``.
        num_heads: attention heads ``H`` (must divide ``d_model``).
        d_ff: hidden width of the feed-forward network.
        dropout: dropout on the attention weights, the feed-forward hidden layer and each sub-layer's
            output, in training mode only.
        backend: ``"sdpa"`` (PyTorch's fused kernel, fast) or ``"reference"`` (the chapter 03
            implementation, explicit weights); both compute the same thing.
        norm_first: pre-norm (True) or post-norm (False); see the module docstring.

    Mask convention: a boolean mask is True where attending is **not** allowed;
    ``key_padding_mask`` is True at padding tokens.

    Shape:
        - x: ``(B, S, E)``
        - key_padding_mask: ``(B, S)``; attn_mask: ``(S, S)`` or ``(B, H, S, S)``
        - output: ``(B, S, E)``; weights: ``(B, H, S, S)`` or None
    """

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, backend: str = "sdpa", norm_first: bool = True
    ) -> None:
        super().__init__()
        _check_layer_args(d_model, num_heads, d_ff, dropout, backend, norm_first)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, backend=backend)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(x, weights)``: the layer's output and, if ``need_weights``, its self-attention weights."""

        def attend(h):
            return self.self_attn(h, h, h, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                  is_causal=is_causal, need_weights=need_weights)

        return self.apply_sublayers(x, attend)

    def apply_sublayers(self, x: torch.Tensor, attend) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's residual connections and norms around a given attention step.

        ``attend(h) -> (output, weights)`` stands in for the self-attention; :meth:`forward` passes
        the plain one, chapter 08's key/value cache a cached one (``attn_course.caches``, ``attn_course.decoder``).
        """
        if self.norm_first:
            attended, weights = attend(self.norm1(x))
            x = x + self.dropout(attended)
            x = x + self.dropout(self.feed_forward(self.norm2(x)))
        else:
            attended, weights = attend(x)
            x = self.norm1(x + self.dropout(attended))
            x = self.norm2(x + self.dropout(self.feed_forward(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """One decoder layer: causal self-attention, cross-attention to the encoder, feed-forward.

    Pre-norm (``norm_first=True``, the default)::

        x = x + dropout(self_attn(norm1(x)))             # each target position sees itself and earlier ones
        x = x + dropout(cross_attn(norm2(x), memory))    # queries from the target, keys/values from the source
        x = x + dropout(feed_forward(norm3(x)))

    Post-norm (``norm_first=False``) puts each norm after its residual sum instead.

    Args:
        d_model, num_heads, d_ff, dropout, backend, norm_first: as :class:`EncoderLayer`.

    Mask convention: a boolean mask is True where attending is **not** allowed;
    ``tgt_key_padding_mask`` and ``memory_key_padding_mask`` are True at padding tokens. Self-attention
    is causal by default (``is_causal=True``): position ``t`` only sees positions ``0..t``.

    Shape:
        - x: ``(B, T, E)``; memory (the encoder's output): ``(B, S, E)``
        - tgt_key_padding_mask: ``(B, T)``; memory_key_padding_mask: ``(B, S)``; tgt_attn_mask: ``(T, T)``
        - output: ``(B, T, E)``; self-attention weights ``(B, H, T, T)`` and cross-attention
          weights ``(B, H, T, S)``, or None for both
    """

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, backend: str = "sdpa", norm_first: bool = True
    ) -> None:
        super().__init__()
        _check_layer_args(d_model, num_heads, d_ff, dropout, backend, norm_first)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, backend=backend)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, backend=backend)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_attn_mask: torch.Tensor | None = None,
        is_causal: bool = True,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Return ``(x, self_weights, cross_weights)``; the weights are None unless ``need_weights``."""

        def attend_self(h):
            return self.self_attn(h, h, h, key_padding_mask=tgt_key_padding_mask, attn_mask=tgt_attn_mask,
                                  is_causal=is_causal, need_weights=need_weights)

        def attend_source(h):
            return self.cross_attn(h, memory, memory, key_padding_mask=memory_key_padding_mask,
                                   need_weights=need_weights)

        return self.apply_sublayers(x, attend_self, attend_source)

    def apply_sublayers(self, x: torch.Tensor, attend_self, attend_source):
        """The layer's residual connections and norms around given attention steps.

        ``attend_self(h)`` and ``attend_source(h)`` return ``(output, weights)``; :meth:`forward`
        passes the plain ones, the translator's cached decoding a cached self-attention
        (``attn_course.translator``). Returns ``(x, self_weights, cross_weights)``.
        """
        if self.norm_first:
            attended, self_weights = attend_self(self.norm1(x))
            x = x + self.dropout(attended)
            attended, cross_weights = attend_source(self.norm2(x))
            x = x + self.dropout(attended)
            x = x + self.dropout(self.feed_forward(self.norm3(x)))
        else:
            attended, self_weights = attend_self(x)
            x = self.norm1(x + self.dropout(attended))
            attended, cross_weights = attend_source(x)
            x = self.norm2(x + self.dropout(attended))
            x = self.norm3(x + self.dropout(self.feed_forward(x)))
        return x, self_weights, cross_weights


@dataclass(frozen=True)
class TransformerConfig:
    """The whole configuration of a :class:`Transformer`; saved with checkpoints.

    Args:
        src_vocab_size: number of source tokens (characters plus special symbols).
        tgt_vocab_size: number of target tokens.
        d_model: model width ``E``.
        num_heads: attention heads ``H`` per layer.
        num_encoder_layers, num_decoder_layers: depth of each stack.
        d_ff: hidden width of the feed-forward networks.
        dropout: dropout probability (training mode only).
        max_len: longest source or target sequence (in tokens, special symbols included).
        pad_id: the padding id, shared by both vocabularies.
        norm_first: pre-norm (True) or post-norm (False) layers.
        backend: attention implementation, ``"sdpa"`` or ``"reference"``.
        causal_decoder: mask the future in the decoder's self-attention. Always True in a real model;
            False only to see what goes wrong without the mask (chapter 07's experiment).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 64
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    d_ff: int = 256
    dropout: float = 0.0
    max_len: int = 128
    pad_id: int = 0
    norm_first: bool = True
    backend: str = "sdpa"
    causal_decoder: bool = True

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
                     "num_decoder_layers", "d_ff", "max_len"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads must divide d_model, got d_model={self.d_model} and num_heads={self.num_heads}")
        check_probability("dropout", self.dropout)
        check_positive_int("pad_id", self.pad_id, allow_zero=True)
        if self.pad_id >= min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id must be a valid id in both vocabularies, got {self.pad_id}")
        check_bool("norm_first", self.norm_first)
        check_bool("causal_decoder", self.causal_decoder)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    def to_dict(self) -> dict:
        """A plain dict of the fields (for checkpoints and ``TransformerConfig(**d)``)."""
        return asdict(self)


class Transformer(nn.Module):
    """An encoder-decoder Transformer (Vaswani et al., 2017) for sequence-to-sequence tasks.

    The source goes through embedding, positional encoding and the encoder layers, giving the
    ``memory``; the target, shifted right (it starts with the start symbol), goes through its own
    embedding, positional encoding and the decoder layers, which attend causally to the target and
    fully to the memory; a final linear layer gives the logits of the next target token.

    Padding masks are derived from ``config.pad_id``: padding keys are never attended to, so adding
    more padding to a batch does not change the outputs at real positions.

    Args:
        config: a :class:`TransformerConfig`.

    Shape:
        - src: ``(B, S)`` source token ids; tgt: ``(B, T)`` target token ids (teacher forcing input)
        - logits: ``(B, T, V_tgt)``
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = c = config
        self.src_embedding = TokenEmbedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_embedding = TokenEmbedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.positional = PositionalEncoding(c.d_model, max_len=c.max_len, dropout=c.dropout)
        layer_args = (c.d_model, c.num_heads, c.d_ff, c.dropout, c.backend, c.norm_first)
        self.encoder_layers = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(c.num_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(c.num_decoder_layers))
        # Pre-norm leaves the residual stream un-normalised: one last norm closes each stack.
        self.encoder_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.output_projection = nn.Linear(c.d_model, c.tgt_vocab_size)
        self._init_embeddings()

    def _init_embeddings(self) -> None:
        # Small embeddings: times sqrt(d_model) they come out with entries of size about 1, like the
        # positional encoding's, so that neither drowns the other at the start of training.
        for embedding in (self.src_embedding.embedding, self.tgt_embedding.embedding):
            nn.init.normal_(embedding.weight, std=self.config.d_model ** -0.5)
            with torch.no_grad():
                embedding.weight[self.config.pad_id].zero_()

    def _check_ids(self, name: str, ids: torch.Tensor) -> None:
        check_tensor(name, ids)
        if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must be a (B, length) tensor of integer token ids, got {ids.dtype} of shape {tuple(ids.shape)}")
        if ids.size(1) > self.config.max_len:
            raise ValueError(f"{name} has {ids.size(1)} tokens but config.max_len={self.config.max_len}")

    def encode(self, src: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, list | None]:
        """Run the encoder.

        Args:
            src: source ids, padded with ``config.pad_id``.
            need_weights: also return each layer's self-attention weights.

        Returns:
            ``(memory, weights)``: the encoder output and a list with one ``(B, H, S, S)`` tensor per
            layer (or None).

        Shape:
            src ``(B, S)`` -> memory ``(B, S, E)``
        """
        self._check_ids("src", src)
        src_padding = self.padding_of(src)  # (B, S), True at padding (blocked convention)
        x = self.embed_source(src)  # (B, S, E)
        all_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, key_padding_mask=src_padding, need_weights=need_weights)
            all_weights.append(weights)
        return self.encoder_norm(x), (all_weights if need_weights else None)

    def embed_source(self, src: torch.Tensor) -> torch.Tensor:
        """Token embedding (times ``sqrt(E)``) plus positional encoding: ``(B, S)`` ids -> ``(B, S, E)``."""
        return self.positional(self.src_embedding(src))

    def embed_target(self, tgt: torch.Tensor, start: int = 0) -> torch.Tensor:
        """As :meth:`embed_source`, for target ids at positions ``start, start + 1, ...`` (``start``
        serves decoding one new token at a time with cached keys and values)."""
        return self.positional(self.tgt_embedding(tgt), start=start)

    def padding_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The key padding mask of a batch of ids: True at padding (blocked convention). ``(B, S)`` -> ``(B, S)``."""
        return ids.eq(self.config.pad_id)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, dict | None]:
        """Run the decoder on the target prefix ``tgt`` and return next-token logits.

        Args:
            tgt: target ids so far, starting with the start symbol, padded with ``config.pad_id``.
            memory: the encoder output.
            memory_key_padding_mask: True at the padding of the source, ``model.padding_of(src)``.
            need_weights: also return the attention weights.

        Returns:
            ``(logits, weights)``; ``weights`` is None or a dict with lists ``"self"`` (one
            ``(B, H, T, T)`` tensor per layer) and ``"cross"`` (one ``(B, H, T, S)`` per layer).

        Shape:
            tgt ``(B, T)``, memory ``(B, S, E)``, memory_key_padding_mask ``(B, S)`` -> logits ``(B, T, V_tgt)``
        """
        self._check_ids("tgt", tgt)
        check_tensor("memory", memory, floating=True)
        x = self.embed_target(tgt)  # (B, T, E)
        tgt_padding = self.padding_of(tgt)  # (B, T), True at padding
        self_weights, cross_weights = [], []
        for layer in self.decoder_layers:
            x, w_self, w_cross = layer(x, memory, tgt_key_padding_mask=tgt_padding,
                                       memory_key_padding_mask=memory_key_padding_mask,
                                       is_causal=self.config.causal_decoder, need_weights=need_weights)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        logits = self.output_projection(self.decoder_norm(x))  # (B, T, E) -> (B, T, V_tgt)
        return logits, ({"self": self_weights, "cross": cross_weights} if need_weights else None)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, dict | None]:
        """Teacher forcing: logits for every target position at once.

        Args:
            src: source ids ``(B, S)``, padded with ``config.pad_id``.
            tgt: target input ids ``(B, T)``: the target shifted right (start symbol first).
            need_weights: also return the attention weights.

        Returns:
            ``(logits, weights)``: logits ``(B, T, V_tgt)``, where ``logits[:, t]`` predicts target
            token ``t + 1``; ``weights`` is None or a dict with lists ``"encoder"``, ``"self"``
            and ``"cross"`` (one tensor per layer, see :meth:`encode` and :meth:`decode`).
        """
        check_bool("need_weights", need_weights)
        self._check_ids("src", src)
        self._check_ids("tgt", tgt)
        if src.size(0) != tgt.size(0):
            raise ValueError(f"src and tgt must have the same batch size, got src {tuple(src.shape)} and tgt {tuple(tgt.shape)}")
        memory, encoder_weights = self.encode(src, need_weights=need_weights)
        logits, decoder_weights = self.decode(tgt, memory, self.padding_of(src), need_weights=need_weights)
        if not need_weights:
            return logits, None
        return logits, {"encoder": encoder_weights, **decoder_weights}
