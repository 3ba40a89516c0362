"""Chapter 11: multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", section 2.1).

Chapter 10 shrank the key/value cache by sharing key/value heads between query heads. MLA shrinks it
another way: each token's keys and values, for every head, are computed from **one small latent
vector** ``c_KV`` of width ``d_c``, and only that latent is cached. The paper's equations (9) to (19),
for token ``t`` and head ``i``::

    c_KV_t  = W_DKV h_t                                  (9)   width d_c: cached
    k_C_t   = W_UK c_KV_t,   v_C_t = W_UV c_KV_t         (10), (11)  n_h heads of width d_h each
    c_Q_t   = W_DQ h_t,      q_C_t = W_UQ c_Q_t          (12), (13)  (q_C_t = W_Q h_t without query compression)
    q_R_t   = RoPE(W_QR c_Q_t)                           (14)  n_h heads of width d_h^R
    k_R_t   = RoPE(W_KR h_t)                             (15)  width d_h^R, one for all heads: cached
    q_t,i   = [q_C_t,i ; q_R_t,i],   k_t,i = [k_C_t,i ; k_R_t]                    (16), (17)
    o_t,i   = sum_j softmax_j(q_t,i . k_j,i / sqrt(d_h + d_h^R)) v_C_j,i          (18)
    u_t     = W_O [o_t,1 ; ... ; o_t,n_h]                                          (19)

**Absorption.** The score of the content part is ``q_C_t,i . (W_UK,i c_KV_j) = (W_UK,i^T q_C_t,i) .
c_KV_j``: multiply each query by ``W_UK,i^T`` once (width ``d_c``) and score it against the cached
latents directly; no per-head key is ever computed. Likewise the values: ``sum_j a_j W_UV,i c_KV_j =
W_UV,i (sum_j a_j c_KV_j)``: average the latents, then apply ``W_UV,i`` once per query, in front of
``W_O``. The absorbed form is multi-query attention (chapter 10) with one shared key/value "head", the
latent, of width ``d_c`` (plus ``d_h^R``).

**Why the rotary part is decoupled.** Rotary embeddings (chapter 09) rotate queries and keys by their
positions. Rotating the content part would give ``q_t . k_j = c_Q_t^T W_UQ^T R_t^T R_j W_UK c_KV_j``
with ``R_t^T R_j = R_(j - t)``: a rotation that depends on the key's position sits between the
query and ``W_UK`` (matrix products do not commute), so ``W_UK`` could no longer be folded into the
query, and every cached key would have to be recomputed at every step. So the content part carries
no position at all, and a separate, small rotary part carries it: rotary queries per head and one
rotary key per token shared by the heads (width ``d_h^R``), which is cached as it is.

DeepSeek-V2 also puts an RMS norm after each latent and scales the widths' bottlenecks for stable
training at scale (section 3.1.2); this module follows the equations without them.

Shapes: ``B`` batch, ``L`` (and ``T``) tokens, ``S`` cached tokens, ``E`` model width (the paper's
``d``), ``H`` heads (``n_h``), ``D`` head width (``d_h``), ``Dc`` = ``d_c``, ``Dq`` = ``d_c'``,
``Dr`` = ``d_h^R``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_tensor, describe
from .caches import LatentKVCache
from .gqa import grouped_attention
from .masks import causal_mask
from .multihead import BACKENDS, MultiHeadAttention
from .rotary import RotaryEmbedding

__all__ = ["MultiHeadLatentAttention"]

DEFAULT_ROPE_BASE = 10000.0


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention: keys and values of every head from one cached latent per token.

    Args:
        embed_dim: model width ``E`` (the paper's ``d``).
        num_heads: heads ``H`` (``n_h``).
        head_dim: width ``D`` of each head's content queries, keys and values (``d_h``); need not be
            ``E / H`` (DeepSeek-V2: ``E = 5120``, 128 heads of 128).
        kv_latent_dim: width ``d_c`` of the key/value latent ``c_KV``, the cached part.
        q_latent_dim: width ``d_c'`` of the query latent ``c_Q``; None computes the queries from the
            input directly (``W_Q``, ``W_QR``), as DeepSeek-V2-Lite does.
        rope_head_dim: width ``d_h^R`` of the decoupled rotary queries (per head) and key (shared),
            even; 0 for no rotary part (positions must then come from elsewhere, e.g. the embeddings).
        rope_base: the rotary frequency base (only with a rotary part).
        bias: add biases to the projections (the paper has none).
        dropout: dropout on the attention weights, in training mode only.
        backend: ``"reference"`` (the weights computed explicitly) or ``"sdpa"`` (PyTorch's fused kernel).

    The projections, named after the paper's matrices (``y = W x``, as ``nn.Linear`` stores them):

    ==================  ==========  =====================================
    attribute           paper       shape of ``weight``
    ==================  ==========  =====================================
    ``kv_down_proj``    ``W_DKV``   ``(Dc, E)``
    ``k_up_proj``       ``W_UK``    ``(H * D, Dc)``
    ``v_up_proj``       ``W_UV``    ``(H * D, Dc)``
    ``k_rope_proj``     ``W_KR``    ``(Dr, E)``, or None
    ``q_down_proj``     ``W_DQ``    ``(Dq, E)``, or None
    ``q_proj``          ``W_UQ``    ``(H * D, Dq)``; ``W_Q`` ``(H * D, E)`` without ``q_latent_dim``
    ``q_rope_proj``     ``W_QR``    ``(H * Dr, Dq or E)``, or None
    ``out_proj``        ``W_O``     ``(E, H * D)``
    ==================  ==========  =====================================

    Mask convention (as ``nn.MultiheadAttention``): a boolean mask is **True where attending is not
    allowed**; ``key_padding_mask`` is True at padding; a float mask is added to the scores.

    Shape:
        - x: ``(B, L, E)`` (self-attention: queries, keys and values all come from ``x``)
        - key_padding_mask: ``(B, L)``; attn_mask: ``(L, L)``, ``(B * H, L, L)`` or ``(B, H, L, L)``
        - output: ``(B, L, E)``; weights: ``(B, H, L, L)`` or None
        - cache per token and layer: ``Dc + Dr`` numbers (:meth:`new_cache`)

    Example::

        mla = MultiHeadLatentAttention(embed_dim=64, num_heads=4, head_dim=16, kv_latent_dim=32, rope_head_dim=8)
        out, weights = mla(x, is_causal=True)                      # x (B, T, 64): the naive form
        cache = mla.new_cache(batch_size=x.size(0), max_len=100)   # 32 + 8 numbers per token
        first = mla.forward_cached(x[:, :-1], cache)               # prefill
        last = mla.forward_cached(x[:, -1:], cache, absorb=True)   # one token, scored against the latents
    """

    # The mask handling of MultiHeadAttention, shared (it only reads num_heads): one definition of the
    # mask conventions in the package.
    _merge_masks = MultiHeadAttention._merge_masks

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, kv_latent_dim: int,
                 q_latent_dim: int | None = None, rope_head_dim: int = 0, rope_base: float = DEFAULT_ROPE_BASE,
                 bias: bool = False, dropout: float = 0.0, backend: str = "reference") -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("kv_latent_dim", kv_latent_dim)):
            check_positive_int(name, value)
        if q_latent_dim is not None:
            check_positive_int("q_latent_dim", q_latent_dim)
        check_positive_int("rope_head_dim", rope_head_dim, allow_zero=True)
        if rope_head_dim % 2:
            raise ValueError(f"rope_head_dim must be even (rotary embeddings rotate pairs of numbers), got {rope_head_dim}")
        if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)):
            raise TypeError(f"rope_base must be a float greater than 1, got {describe(rope_base)}")
        if not (math.isfinite(rope_base) and rope_base > 1.0):
            raise ValueError(f"rope_base must be a finite float greater than 1, got {rope_base}")
        if rope_head_dim == 0 and rope_base != DEFAULT_ROPE_BASE:
            raise ValueError(f"rope_base={rope_base} has no effect without a rotary part: give rope_head_dim > 0 too")
        check_bool("bias", bias)
        check_probability("dropout", dropout)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.kv_latent_dim, self.q_latent_dim, self.rope_head_dim = kv_latent_dim, q_latent_dim, rope_head_dim
        self.dropout, self.backend = float(dropout), backend
        self.scale = 1.0 / math.sqrt(head_dim + rope_head_dim)  # equation (18)
        H, D, Dr = num_heads, head_dim, rope_head_dim

        # Keys and values: one latent per token (9), up-projected per head (10), (11).
        self.kv_down_proj = nn.Linear(embed_dim, kv_latent_dim, bias=bias)
        self.k_up_proj = nn.Linear(kv_latent_dim, H * D, bias=bias)
        self.v_up_proj = nn.Linear(kv_latent_dim, H * D, bias=bias)
        # Queries: through their own latent (12), (13), or straight from the input.
        self.q_down_proj = nn.Linear(embed_dim, q_latent_dim, bias=bias) if q_latent_dim else None
        query_source = q_latent_dim or embed_dim
        self.q_proj = nn.Linear(query_source, H * D, bias=bias)
        # The decoupled rotary part (14), (15): queries per head, one key per token.
        self.q_rope_proj = nn.Linear(query_source, H * Dr, bias=bias) if Dr else None
        self.k_rope_proj = nn.Linear(embed_dim, Dr, bias=bias) if Dr else None
        self.rotary = RotaryEmbedding(Dr, base=rope_base) if Dr else None
        self.out_proj = nn.Linear(H * D, embed_dim, bias=bias)  # (19)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"kv_latent_dim={self.kv_latent_dim}, q_latent_dim={self.q_latent_dim}, "
                f"rope_head_dim={self.rope_head_dim}, dropout={self.dropout}, backend={self.backend!r}")

    @property
    def cache_elements_per_token(self) -> int:
        """Numbers cached per token: the latent and the rotary key, ``d_c + d_h^R``."""
        return self.kv_latent_dim + self.rope_head_dim

    # -- the pieces of equations (9) to (17) ----------------------------------------------------------
    def _check_x(self, x: torch.Tensor) -> None:
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.size(-1) != self.embed_dim:
            raise ValueError(f"x must have shape (B, L, E={self.embed_dim}), got {tuple(x.shape)}")
        weight = self.kv_down_proj.weight
        if x.dtype != weight.dtype or x.device != weight.device:
            raise TypeError(f"x is {x.dtype} on {x.device} but the module's weights are {weight.dtype} on "
                            f"{weight.device}; call module.to(...) or move the input")

    def _queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Content queries ``(B, H, T, D)`` and rotated rotary queries ``(B, H, T, Dr)`` (or None)."""
        B, T, _ = x.shape
        H, D, Dr = self.num_heads, self.head_dim, self.rope_head_dim
        source = x if self.q_down_proj is None else self.q_down_proj(x)  # (B, T, Dq): c_Q (12)
        q_content = self.q_proj(source).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D) (13)
        if self.rotary is None:
            return q_content, None
        q_rope = self.q_rope_proj(source).view(B, T, H, Dr).transpose(1, 2)  # (B, T, H*Dr) -> (B, H, T, Dr)
        return q_content, self.rotary.rotate(q_rope, positions, "rotary queries")  # (14)

    def _latents(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the cache keeps: latents ``(B, T, Dc)`` and rotated rotary keys ``(B, T, Dr)`` (or None)."""
        latents = self.kv_down_proj(x)  # (B, T, E) -> (B, T, Dc): c_KV (9)
        if self.rotary is None:
            return latents, None
        return latents, self.rotary.rotate(self.k_rope_proj(x), positions, "rotary keys")  # (B, T, Dr) (15)

    def _attend_naive(self, q_content, q_rope, latents, rope_keys, mask, need_weights):
        """Equations (10), (11), (16) to (18) as written: per-head keys and values from the latents."""
        B, H, L, D = q_content.shape
        S = latents.size(1)
        k_content = self.k_up_proj(latents).view(B, S, H, D).transpose(1, 2)  # (B, S, H*D) -> (B, H, S, D) (10)
        values = self.v_up_proj(latents).view(B, S, H, D).transpose(1, 2)  # (B, H, S, D) (11)
        if rope_keys is None:
            queries, keys = q_content, k_content
        else:
            shared = rope_keys[:, None].expand(B, H, S, self.rope_head_dim)  # (B, S, Dr) -> (B, H, S, Dr), no copy
            queries = torch.cat([q_content, q_rope], dim=-1)  # (B, H, L, D + Dr) (16)
            keys = torch.cat([k_content, shared], dim=-1)  # (B, H, S, D + Dr) (17)
        return grouped_attention(queries, keys, values, mask, dropout_p=self.dropout if self.training else 0.0,
                                 backend=self.backend, need_weights=need_weights, scale=self.scale)  # (18)

    def _attend_absorbed(self, q_content, q_rope, joint, mask):
        """The same numbers with ``W_UK`` folded into the queries and ``W_UV`` applied after the average:
        attention of every head to one shared head, the latents (``joint`` holds the latents and the
        rotary keys side by side, ``(B, S, Dc + Dr)``, as :meth:`LatentKVCache.joint` gives them)."""
        B, H, L, D = q_content.shape
        Dc, S = self.kv_latent_dim, joint.size(1)
        latents = joint[..., :Dc]  # (B, S, Dc), a view
        w_uk = self.k_up_proj.weight.view(H, D, Dc)  # (H*D, Dc) -> (H, D, Dc): W_UK,i for each head i
        w_uv = self.v_up_proj.weight.view(H, D, Dc)  # W_UV,i
        # q . (W_UK,i c + b) = (W_UK,i^T q) . c + q . b; the last term is the same for every key of a
        # query, and softmax ignores it: the bias of W_UK drops out.
        q_latent = torch.einsum("bhld,hdc->bhlc", q_content, w_uk)  # (B, H, L, D) x (H, D, Dc) -> (B, H, L, Dc)
        queries = q_latent if q_rope is None else torch.cat([q_latent, q_rope], dim=-1)  # (B, H, L, Dc + Dr)
        keys = joint[:, None]  # (B, 1, S, Dc + Dr): one key per token for all heads, the latent and the rotary key
        # Every head reads the same keys and values, so the heads can stand in line as H * L queries
        # of one head: one matrix product against the cache, which is never copied per head.
        if mask is not None:
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, L, S), b and h maybe 1
            mask = mask.expand(mask.size(0), H, L, S).reshape(mask.size(0), 1, H * L, S)  # (b, 1, H*L, S)
        context_latent, _ = grouped_attention(queries.reshape(B, 1, H * L, -1), keys, latents[:, None], mask,
                                              dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
                                              scale=self.scale)  # (B, 1, H*L, Dc): each query's average of the latents
        context_latent = context_latent.view(B, H, L, Dc)  # (B, 1, H*L, Dc) -> (B, H, L, Dc)
        context = torch.einsum("bhlc,hdc->bhld", context_latent, w_uv)  # (B, H, L, Dc) x (H, D, Dc) -> (B, H, L, D)
        if self.v_up_proj.bias is not None:  # sum_j a_j (W c_j + b) = W (sum_j a_j c_j) + b: the weights sum to one
            context = context + self.v_up_proj.bias.view(H, 1, D)
        return context

    def _merge_heads(self, context: torch.Tensor) -> torch.Tensor:
        B, H, L, D = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(B, L, H * D))  # (B, H, L, D) -> (B, L, H*D) -> (B, L, E) (19)

    # -- the plain path ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, *, key_padding_mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False, need_weights: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention of ``x`` in the naive form: per-head keys and values up-projected from the latents.

        The rotary part rotates token ``t`` by position ``t``. A query with no key left to attend to
        gets zeros, not NaN. See the class docstring for shapes and the mask convention.

        Returns:
            ``(output, weights)``; weights ``(B, H, L, L)``, or None unless ``need_weights``.
        """
        self._check_x(x)
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        B, L, _ = x.shape
        mask = self._merge_masks(key_padding_mask, attn_mask, is_causal, B, L, L, x)  # (B|1, H|1, L, L) or None
        positions = torch.arange(L, device=x.device)
        q_content, q_rope = self._queries(x, positions)  # (B, H, L, D), (B, H, L, Dr)
        latents, rope_keys = self._latents(x, positions)  # (B, L, Dc), (B, L, Dr)
        context, weights = self._attend_naive(q_content, q_rope, latents, rope_keys, mask, need_weights)  # (B, H, L, D)
        return self._merge_heads(context), weights

    # -- cached decoding -----------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int, num_layers: int = 1) -> LatentKVCache:
        """An empty :class:`~attn_course.caches.LatentKVCache` for ``max_len`` tokens (``num_layers``
        of them stacked, for a whole model), on the module's device and in its dtype."""
        weight = self.kv_down_proj.weight
        return LatentKVCache(num_layers, batch_size, self.kv_latent_dim, self.rope_head_dim, max_len,
                             device=weight.device, dtype=weight.dtype)

    def forward_cached(self, x: torch.Tensor, cache: LatentKVCache, layer: int = 0, *, absorb: bool = False
                       ) -> torch.Tensor:
        """Causal self-attention of new tokens that follow the ``cache.length`` tokens in ``cache``.

        Only the new tokens are projected; their latents and rotary keys (rotated by their positions)
        are appended to ``cache``; each new query attends to every cached token up to its own position.

        Args:
            x: the new tokens.
            cache: from :meth:`new_cache`.
            layer: which of the cache's layers belongs to this module.
            absorb: score the queries against the cached latents directly (``W_UK`` folded into the
                queries, ``W_UV`` applied after the weighted average, before ``W_O``) instead of
                up-projecting every cached latent to per-head keys and values. Same numbers, up to rounding.

        Returns:
            The same as ``self(x_all, is_causal=True)[0]`` at the new positions, where ``x_all`` is
            every token so far.

        Shape:
            x: ``(B, T_new, E)`` -> ``(B, T_new, E)``
        """
        if not isinstance(cache, LatentKVCache):
            raise TypeError(f"cache must be a LatentKVCache (module.new_cache(...)), got {type(cache).__name__}")
        if (cache.kv_latent_dim, cache.rope_head_dim) != (self.kv_latent_dim, self.rope_head_dim):
            raise ValueError(f"cache holds latents of width {cache.kv_latent_dim} and rotary keys of width "
                             f"{cache.rope_head_dim}, but this module has kv_latent_dim={self.kv_latent_dim} and "
                             f"rope_head_dim={self.rope_head_dim}")
        self._check_x(x)
        check_bool("absorb", absorb)
        T = x.size(1)
        start = cache._lengths[layer] if isinstance(layer, int) and 0 <= layer < cache.num_layers else 0
        positions = torch.arange(start, start + T, device=x.device)  # (T,): the new tokens' positions
        latents, rope_keys = cache.update(layer, *self._latents(x, positions))  # (B, S, Dc), (B, S, Dr): all so far
        q_content, q_rope = self._queries(x, positions)  # (B, H, T, D), (B, H, T, Dr)
        S = latents.size(1)
        mask = None if T == 1 else causal_mask(T, S, align="bottom_right", device=x.device)  # (T, S), True = may attend
        if absorb:
            context = self._attend_absorbed(q_content, q_rope, cache.joint(layer), mask)
        else:
            context, _ = self._attend_naive(q_content, q_rope, latents, rope_keys, mask, need_weights=False)
        return self._merge_heads(context)  # (B, T, E)
