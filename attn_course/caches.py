"""Chapters 08, 10 and 11: the caches of cached decoding, in one place.

A decoder-only model generates one token at a time, and each new token needs attention over *all*
earlier tokens. The earlier tokens' keys and values never change (causal attention: a token never
sees the future), so they can be kept in a **cache**: each step then projects only the new tokens,
writes what they contribute to the cache, and attends from them to everything stored.

What is stored depends on the attention, and so do the bytes per token:

- :class:`KVCache` (chapter 08): keys and values of every head, ``2 * H * D`` numbers per token and
  layer; with grouped-query attention (chapter 10) ``G`` heads instead of ``H``.
- :class:`RollingKVCache` (chapter 10): the same for a sliding window, only the last ``window``
  positions, in a rolling buffer that never grows.
- :class:`LatentKVCache` (chapter 11): multi-head latent attention's compressed latent ``c_KV`` and
  its one rotary key ``k_R`` per token, ``d_c + d_h^R`` numbers per token and layer.

All three are a :class:`Cache`: per layer, a few buffers allocated once, whose second-to-last axis
is the position, and a count of the positions written. They hold tensors and know nothing about
attention; each attention module builds the cache it needs (``module.new_cache(...)``) and fills it
in its own ``forward_cached``. :func:`cached_self_attention` is that step for chapter 05's
:class:`~attn_course.MultiHeadAttention`, which has no cached step of its own.

Imports run one way: the mechanism modules below this one (``multihead`` for
:func:`cached_self_attention`), the attention modules that build caches (``gqa``, ``latent``) above
it, and the model that stacks them (``decoder``) on top.

Shapes: ``B`` batch, ``H`` heads, ``G`` key/value heads, ``T`` tokens, ``S`` positions kept,
``E`` model width, ``D`` head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_positive_int, check_tensor, describe
from .masks import causal_mask
from .multihead import MultiHeadAttention
from .scaled import scaled_dot_product_attention

__all__ = ["Cache", "KVCache", "RollingKVCache", "LatentKVCache", "cached_self_attention", "cache_elements_per_token",
           "CACHE_KINDS"]


CACHE_KINDS = ("mha", "gqa", "mqa", "mla")


def cache_elements_per_token(kind: str, *, num_heads: int | None = None, num_kv_heads: int | None = None,
                             head_dim: int | None = None, kv_latent_dim: int | None = None,
                             rope_head_dim: int | None = None, num_layers: int = 1) -> int:
    """Numbers a cache keeps per token, as in Table 1 of DeepSeek-V2 (DeepSeek-AI 2024).

    ========  ===================================  ==============================================
    kind      elements per token and layer         arguments
    ========  ===================================  ==============================================
    ``mha``   ``2 * n_h * d_h`` (keys and values)  ``num_heads`` (n_h), ``head_dim`` (d_h)
    ``gqa``   ``2 * g * d_h``                      ``num_kv_heads`` (g, the groups), ``head_dim``
    ``mqa``   ``2 * d_h``                          ``head_dim``
    ``mla``   ``d_c + d_h^R``                      ``kv_latent_dim`` (d_c), ``rope_head_dim`` (d_h^R,
                                                   default 0)
    ========  ===================================  ==============================================

    Multiply by the bytes of one number (2 for float16) for bytes, and by the tokens and sequences
    for the whole cache. The count is per sequence, whatever the batch.

    Args:
        kind: ``"mha"``, ``"gqa"``, ``"mqa"`` or ``"mla"``.
        num_heads, num_kv_heads, head_dim, kv_latent_dim, rope_head_dim: as in the table; each kind
            takes exactly its own arguments (another one is an error, not silently ignored).
        num_layers: ``l``, the layers that keep a cache.

    Returns:
        The number of cached elements per token, all layers together.
    """
    needed = {"mha": ("num_heads", "head_dim"), "gqa": ("num_kv_heads", "head_dim"), "mqa": ("head_dim",),
              "mla": ("kv_latent_dim",)}
    if kind not in needed:
        raise ValueError(f"kind must be one of {CACHE_KINDS}, got {kind!r}")
    given = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
             "kv_latent_dim": kv_latent_dim, "rope_head_dim": rope_head_dim}
    for name in needed[kind]:
        if given[name] is None:
            raise ValueError(f"kind={kind!r} needs {name}, got None")
        check_positive_int(name, given[name])
    allowed = needed[kind] + (("rope_head_dim",) if kind == "mla" else ())
    for name, value in given.items():
        if value is not None and name not in allowed:
            raise ValueError(f"kind={kind!r} does not use {name} (it takes {', '.join(allowed)}), got {name}={value!r}")
    check_positive_int("num_layers", num_layers)
    if kind == "mha":
        per_layer = 2 * num_heads * head_dim  # a key and a value per head
    elif kind == "gqa":
        per_layer = 2 * num_kv_heads * head_dim  # a key and a value per group
    elif kind == "mqa":
        per_layer = 2 * head_dim  # one key and one value for all heads
    else:
        if rope_head_dim is not None:
            check_positive_int("rope_head_dim", rope_head_dim, allow_zero=True)
        per_layer = kv_latent_dim + (rope_head_dim or 0)  # the latent c_KV and the shared rotary key k_R
    return per_layer * num_layers


class Cache:
    """What every cache shares: per layer, named buffers filled position by position.

    Each part (``"keys"`` and ``"values"``, say) has one buffer per layer of shape
    ``(*leading, capacity, width)``: the position is the second-to-last axis. Subclasses name the
    parts and their shapes and write new positions with :meth:`_append` (after the stored ones) or
    :meth:`_roll` (over the oldest, in a rolling buffer).

    Args:
        num_layers: number of attention layers that use the cache.
        parts: for each part's name, its buffer shape with ``None`` at the position axis, for example
            ``{"keys": (B, H, None, D), "values": (B, H, None, D)}``.
        capacity: positions each buffer holds.
        capacity_name: the constructor argument that set ``capacity``, for error messages.
        device, dtype: of the buffers.
    """

    def __init__(self, num_layers: int, parts: dict[str, tuple], capacity: int, *, capacity_name: str = "max_len",
                 device=None, dtype: torch.dtype = torch.float32) -> None:
        check_positive_int("num_layers", num_layers)
        check_positive_int(capacity_name, capacity)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}")
        self._buffers = {}
        for name, shape in parts.items():
            shape = tuple(capacity if size is None else size for size in shape)  # the position axis gets the capacity
            self._buffers[name] = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self._capacity, self._capacity_name = capacity, capacity_name
        self._lengths = [0] * num_layers  # positions written so far, per layer

    @property
    def num_layers(self) -> int:
        return len(self._lengths)

    @property
    def length(self) -> int:
        """Number of positions written so far (in the first layer)."""
        return self._lengths[0]

    @property
    def nbytes(self) -> int:
        """Memory taken by the buffers, in bytes (all of their capacity, filled or not)."""
        return sum(t.numel() * t.element_size() for buffers in self._buffers.values() for t in buffers)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position takes in every layer together, per sequence of the batch."""
        return self.nbytes // (self._capacity * self._batch_size())

    def _batch_size(self) -> int:
        return next(iter(self._buffers.values()))[0].size(0)

    def reset(self) -> None:
        """Forget every position (the buffers are kept and overwritten)."""
        self._lengths = [0] * len(self._lengths)

    def crop(self, length: int) -> None:
        """Forget the positions from ``length`` on, in every layer; the first ``length`` stay.

        The next update writes at position ``length`` again: to time the same decoding step
        several times, or to drop tokens that a draft proposed and the model rejected.

        Args:
            length: positions to keep, at most the fewest that any layer holds.
        """
        check_positive_int("length", length, allow_zero=True)
        if length > min(self._lengths):
            raise ValueError(f"length must be at most the {min(self._lengths)} positions every layer holds, got {length}")
        self._lengths = [length] * len(self._lengths)

    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {describe(layer)}")

    def _check(self, layer: int, layout: str, **new: torch.Tensor) -> int:
        """Check ``layer`` and the new tensors of every part against the buffers; return ``T_new``.

        ``layout`` spells the expected shape for messages, e.g. ``"(B, H, T_new, D)"``.
        """
        self._check_layer(layer)
        lengths = set()
        for name, x in new.items():
            check_tensor(name, x, floating=True)
            buffer = self._buffers[name][layer]
            expected = tuple(buffer.shape[:-2]) + ("T_new", buffer.size(-1))
            if x.dim() != buffer.dim() or x.shape[:-2] != buffer.shape[:-2] or x.size(-1) != buffer.size(-1):
                raise ValueError(f"{name} must have shape {layout} = {expected}, got {tuple(x.shape)}")
            lengths.add(x.size(-2))
        if len(lengths) > 1:
            shapes = " and ".join(f"{name} {tuple(x.shape)}" for name, x in new.items())
            raise ValueError(f"{' and '.join(new)} must hold the same number of new positions, got {shapes}")
        return lengths.pop()

    def _append(self, layer: int, **new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write the new positions after the stored ones; return every part's positions so far."""
        start, count = self._lengths[layer], next(iter(new.values())).size(-2)
        if start + count > self._capacity:
            raise ValueError(f"the cache holds {self._capacity_name}={self._capacity} positions; "
                             f"{start} stored plus {count} new do not fit")
        for name, x in new.items():
            self._buffers[name][layer][..., start:start + count, :] = x  # no copy of the stored positions
        self._lengths[layer] = start + count
        return tuple(self._buffers[name][layer][..., :start + count, :] for name in new)  # (..., S, width) each

    def _kept_in_order(self, buffer: torch.Tensor, seen: int) -> torch.Tensor:
        """The positions a rolling buffer keeps after ``seen`` were written, oldest first."""
        if seen <= self._capacity:
            return buffer[..., :seen, :]
        slots = (torch.arange(self._capacity, device=buffer.device) + seen) % self._capacity  # oldest slot first
        return buffer[..., slots, :]

    def _roll(self, layer: int, **new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rolling buffer: return the kept positions, oldest first, followed by every new one; then
        keep only the last ``capacity`` positions (position ``p`` lives in slot ``p % capacity``)."""
        seen, count = self._lengths[layer], next(iter(new.values())).size(-2)
        everything = tuple(torch.cat([self._kept_in_order(self._buffers[name][layer], seen), x], dim=-2)
                           for name, x in new.items())  # (..., kept + T_new, width) each
        last = min(count, self._capacity)  # only the last `capacity` new positions can stay
        slots = torch.arange(seen + count - last, seen + count, device=next(iter(new.values())).device) % self._capacity
        for name, x in new.items():
            self._buffers[name][layer][..., slots, :] = x[..., count - last:, :]
        self._lengths[layer] = seen + count
        return everything


class _HeadCache(Cache):
    """Keys and values per head, ``(B, heads, capacity, D)`` per layer: what KVCache and RollingKVCache share."""

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, capacity: int,
                 capacity_name: str, *, device=None, dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("batch_size", batch_size), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        shape = (batch_size, num_heads, None, head_dim)  # None: the position axis
        super().__init__(num_layers, {"keys": shape, "values": shape}, capacity, capacity_name=capacity_name,
                         device=device, dtype=dtype)
        self.keys, self.values = self._buffers["keys"], self._buffers["values"]  # one buffer per layer each


class KVCache(_HeadCache):
    """The keys and values of the tokens processed so far, for every layer of a model.

    The buffers are allocated once, for ``max_len`` tokens; each step writes the new tokens' keys
    and values after the ones already there (no copying of the old ones, unlike ``torch.cat``).

    Args:
        num_layers: number of attention layers that use the cache.
        batch_size: ``B``.
        num_heads: ``H`` (``G``, the key/value heads, for grouped-query attention).
        head_dim: ``D``.
        max_len: the most tokens it can hold.
        device: where to allocate the buffers.
        dtype: dtype of the buffers (the model's).

    Shape:
        Each layer holds keys and values of shape ``(B, H, max_len, D)``, of which the first
        :attr:`length` positions are filled: ``2 * H * D`` numbers per token and layer.
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, max_len: int,
                 *, device=None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(num_layers, batch_size, num_heads, head_dim, max_len, "max_len", device=device, dtype=dtype)
        self.max_len = max_len

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
        self._check(layer, "(B, H, T_new, D)", keys=keys, values=values)
        return self._append(layer, keys=keys, values=values)


class RollingKVCache(_HeadCache):
    """A key/value cache that keeps only the last ``window`` positions of every layer (a rolling buffer).

    Position ``p`` is written to slot ``p % window``, over the position ``p - window`` that no query
    will see again; the memory stays ``window`` positions however long the generation runs, as in
    Mistral's "rolling buffer cache".

    Args:
        num_layers: number of attention layers that use the cache.
        batch_size: ``B``.
        num_heads: key/value heads ``G`` stored.
        head_dim: ``D``.
        window: positions kept per layer.
        device, dtype: of the buffers.

    Shape:
        Each layer holds keys and values of shape ``(B, G, window, D)``.
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, window: int,
                 *, device=None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(num_layers, batch_size, num_heads, head_dim, window, "window", device=device, dtype=dtype)
        self.window = window

    @property
    def length(self) -> int:
        """Number of positions seen so far (in the first layer); at most ``window`` of them are kept."""
        return self._lengths[0]

    def crop(self, length: int) -> None:
        """Forget the positions from ``length`` on; possible only while nothing was overwritten yet."""
        if max(self._lengths) > self.window:
            raise ValueError(f"a rolling cache that has seen {max(self._lengths)} positions in a window of {self.window} "
                             "has overwritten the older ones: it cannot go back")
        super().crop(length)

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys and values of new positions; return the kept old ones followed by the new ones.

        Returns:
            ``(keys, values)``: the (at most ``window``) kept earlier positions, oldest first, then
            every new position; the new queries need all of them. Afterwards the buffer keeps the
            last ``window`` positions.

        Shape:
            keys, values: ``(B, G, T_new, D)`` -> ``(B, G, min(T_old, window) + T_new, D)`` each.
        """
        self._check(layer, "(B, G, T_new, D)", keys=keys, values=values)
        return self._roll(layer, keys=keys, values=values)


class LatentKVCache(Cache):
    """The cache of multi-head latent attention (chapter 11): latents and rotary keys, no per-head keys.

    For every token it keeps the compressed latent ``c_KV`` (width ``d_c``), from which every head's
    key and value are recomputed (or into which the up-projections are absorbed), and the decoupled
    rotary key ``k_R`` (width ``d_h^R``), one for all heads: ``d_c + d_h^R`` numbers per token and
    layer, against ``2 * H * D`` for :class:`KVCache`. The two sit side by side in one buffer, so
    that the absorbed step reads them as one key per token (:meth:`joint`) without copying.

    Args:
        num_layers: number of attention layers that use the cache.
        batch_size: ``B``.
        kv_latent_dim: ``d_c``.
        rope_head_dim: ``d_h^R`` (0: no rotary part, only latents are stored).
        max_len: the most tokens it can hold.
        device, dtype: of the buffers.

    Shape:
        Each layer holds one buffer ``(B, max_len, d_c + d_h^R)``: :attr:`latents` are its first
        ``d_c`` columns, :attr:`rope_keys` (None without a rotary part) the last ``d_h^R``.
    """

    def __init__(self, num_layers: int, batch_size: int, kv_latent_dim: int, rope_head_dim: int, max_len: int,
                 *, device=None, dtype: torch.dtype = torch.float32) -> None:
        check_positive_int("batch_size", batch_size)
        check_positive_int("kv_latent_dim", kv_latent_dim)
        check_positive_int("rope_head_dim", rope_head_dim, allow_zero=True)
        super().__init__(num_layers, {"joint": (batch_size, None, kv_latent_dim + rope_head_dim)}, max_len,
                         capacity_name="max_len", device=device, dtype=dtype)
        self.kv_latent_dim, self.rope_head_dim, self.max_len = kv_latent_dim, rope_head_dim, max_len
        buffers = self._buffers["joint"]
        self.latents = [buffer[..., :kv_latent_dim] for buffer in buffers]  # views, one per layer: (B, max_len, d_c)
        self.rope_keys = [buffer[..., kv_latent_dim:] for buffer in buffers] if rope_head_dim else None

    def update(self, layer: int, latents: torch.Tensor, rope_keys: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append the latents (and rotary keys) of new tokens to ``layer``; return all stored so far.

        Returns:
            ``(all_latents, all_rope_keys)``, views of the buffer, old tokens first; the second is
            None for a cache without a rotary part.

        Shape:
            latents: ``(B, T_new, d_c)``, rope_keys: ``(B, T_new, d_h^R)`` -> ``(B, S, d_c)``, ``(B, S, d_h^R)``.
        """
        self._check_layer(layer)
        if self.rope_head_dim and rope_keys is None:
            raise ValueError(f"rope_keys must be given: this cache stores rotary keys of width rope_head_dim={self.rope_head_dim}")
        if not self.rope_head_dim and rope_keys is not None:
            raise ValueError(f"rope_keys must be None: this cache was built with rope_head_dim=0, got {describe(rope_keys)}")
        B = self._batch_size()
        for name, x, width in (("latents", latents, self.kv_latent_dim), ("rope_keys", rope_keys, self.rope_head_dim)):
            if x is None:
                continue
            check_tensor(name, x, floating=True)
            if x.dim() != 3 or x.size(0) != B or x.size(-1) != width:
                raise ValueError(f"{name} must have shape (B, T_new, {'d_c' if name == 'latents' else 'd_h^R'}) = "
                                 f"{(B, 'T_new', width)}, got {tuple(x.shape)}")
        if rope_keys is not None and rope_keys.size(1) != latents.size(1):
            raise ValueError(f"latents and rope_keys must hold the same number of new positions, got latents "
                             f"{tuple(latents.shape)} and rope_keys {tuple(rope_keys.shape)}")
        new = latents if rope_keys is None else torch.cat([latents, rope_keys], dim=-1)  # (B, T_new, d_c + d_h^R)
        (joint,) = self._append(layer, joint=new)  # (B, S, d_c + d_h^R)
        return joint[..., :self.kv_latent_dim], (joint[..., self.kv_latent_dim:] if self.rope_head_dim else None)

    def joint(self, layer: int) -> torch.Tensor:
        """The stored latents and rotary keys of ``layer`` side by side, a view: ``(B, S, d_c + d_h^R)``.

        This is the one key per token that every head scores in the absorbed form of latent attention."""
        self._check_layer(layer)
        return self._buffers["joint"][layer][:, :self._lengths[layer]]


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
