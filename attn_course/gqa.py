"""Chapter 10: grouped-query attention (GQA), multi-query attention (MQA) and sliding windows.

When a model generates text, the keys and values of every earlier token sit in a cache (chapter 08),
``2 * layers * B * H * S * D`` numbers that grow with every token: for long contexts the cache, not
the weights, fills the memory and its reading sets the speed. Two ways to shrink it:

- **Share keys and values between heads.** Multi-query attention (Shazeer 2019) keeps ``H`` query
  heads but one key/value head; grouped-query attention (Ainslie et al. 2023) keeps ``G`` key/value
  heads, each shared by a group of ``H / G`` query heads. The cache shrinks by ``H / G``.
  Query head ``h`` reads key/value head ``h // (H / G)``, the grouping of
  ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
- **Look back only ``window`` tokens** (Longformer, Beltagy et al. 2020; Mistral, Jiang et al. 2023).
  The cache then holds only the last ``window`` positions, written in a rolling buffer; stacked
  layers still pass information further, ``window - 1`` positions per layer.

Shapes: ``B`` batch, ``H`` query heads, ``G`` key/value heads (``num_kv_heads``), ``L`` queries,
``S`` keys, ``E`` model width, ``D = E / H`` head width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._checks import check_bool, check_positive_int, check_probability, check_tensor, describe
from .alibi import alibi_bias
from .caches import KVCache, RollingKVCache
from .masks import sliding_window_mask
from .multihead import BACKENDS, MultiHeadAttention
from .rotary import RotaryEmbedding
from .scaled import _attention_weights, scaled_dot_product_attention

__all__ = ["GroupedQueryAttention", "grouped_attention", "kv_copies", "KVCopy", "RollingKVCache"]  # RollingKVCache lives in attn_course.caches


def _and_allowed(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """Combine a merged mask (allowed-convention bool, additive float or None) with a bool "allowed" mask."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _add_bias(mask: torch.Tensor | None, bias: torch.Tensor) -> torch.Tensor:
    """Add a float bias to a merged mask (allowed-convention bool, additive float or None)."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf"))
    return mask + bias


def _enable_gqa_supported() -> bool:
    import inspect

    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        try:
            q = torch.zeros(1, 2, 1, 2)
            F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
            return True
        except TypeError:
            return False


class GroupedQueryAttention(nn.Module):
    """Attention with ``H`` query heads sharing ``G`` key/value heads (GQA; MQA when ``G = 1``).

    ``num_kv_heads == num_heads`` is multi-head attention: the same numbers as
    :class:`~attn_course.MultiHeadAttention` with the same weights. Query head ``h`` reads key/value
    head ``h // (H / G)``, as ``F.scaled_dot_product_attention(..., enable_gqa=True)``.

    Args:
        embed_dim: model width ``E``.
        num_heads: query heads ``H``; must divide ``embed_dim``.
        num_kv_heads: key/value heads ``G``; must divide ``num_heads``.
        dropout: dropout on the attention weights, in training mode only.
        bias: add biases to the four projections.
        window: if set, each query sees only itself and the ``window - 1`` positions before it
            (sliding-window attention, which is causal by construction), and the cached path keeps
            only ``window`` positions.
        rotary: rotate queries and keys with rotary embeddings (:class:`~attn_course.RotaryEmbedding`,
            interleaved layout) by their positions.
        rope_base: the rotary frequency base.
        alibi: add the ALiBi bias of :func:`~attn_course.alibi_bias` to the scores.
        backend: ``"reference"`` (:func:`attn_course.scaled_dot_product_attention` on the query heads
            of each group folded into one axis, so that no key or value is copied per query head) or ``"sdpa"`` (PyTorch's fused kernel with
            ``enable_gqa=True``; the weights are computed separately when ``need_weights=True``).

    Mask convention (as :class:`~attn_course.MultiHeadAttention` and ``nn.MultiheadAttention``): a
    boolean mask is **True where attending is not allowed**; ``key_padding_mask`` is True at padding;
    a float mask is added to the scores. When ``L != S`` the queries are the last ``L`` of the ``S``
    positions for the window, the rotary positions and the ALiBi bias (``is_causal`` stays aligned to
    the top-left, as in ``MultiHeadAttention``).

    Shape:
        - query: ``(B, L, E)``, key and value: ``(B, S, E)``
        - key_padding_mask: ``(B, S)``; attn_mask: ``(L, S)``, ``(B * H, L, S)`` or ``(B, H, L, S)``
        - output: ``(B, L, E)``; weights: ``(B, H, L, S)`` (one map per query head) or None
        - ``q_proj``: ``E -> E``; ``k_proj``, ``v_proj``: ``E -> G * D``; ``out_proj``: ``E -> E``
    """

    # The input and mask handling of MultiHeadAttention, shared (they only read embed_dim, num_heads
    # and q_proj): one definition of the mask conventions in the package.
    _check_inputs = MultiHeadAttention._check_inputs
    _merge_masks = MultiHeadAttention._merge_masks

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int, dropout: float = 0.0, bias: bool = True,
                 window: int | None = None, rotary: bool = False, rope_base: float = 10000.0,
                 alibi: bool = False, backend: str = "reference") -> None:
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_kv_heads", num_kv_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads must divide num_heads (each key/value head serves a whole group of query heads), "
                f"got num_heads={num_heads} and num_kv_heads={num_kv_heads}"
            )
        check_probability("dropout", dropout)
        check_bool("bias", bias)
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, int):
                raise TypeError(f"window must be None or an int >= 1, got {describe(window)}")
            if window < 1:
                raise ValueError(f"window must be at least 1 (a query always sees itself), got {window}")
        check_bool("rotary", rotary)
        check_bool("alibi", alibi)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        head_dim = embed_dim // num_heads
        if rotary and head_dim % 2:
            raise ValueError(f"rotary=True needs an even head width, got head_dim = embed_dim / num_heads = {head_dim}")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.group_size = num_heads // num_kv_heads
        self.dropout, self.window, self.alibi, self.backend = float(dropout), window, alibi, backend
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.rotary = RotaryEmbedding(head_dim, base=rope_base) if rotary else None

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"window={self.window}, alibi={self.alibi}, dropout={self.dropout}, backend={self.backend!r}")

    @classmethod
    def from_multihead(cls, module: nn.Module, num_kv_heads: int, **kwargs) -> "GroupedQueryAttention":
        """Convert multi-head attention to GQA by mean-pooling the key and value heads of each group.

        Ainslie et al. (2023) start from a trained multi-head checkpoint: the projection of the
        key/value head of group ``g`` is the mean of the projections of the ``H / G`` heads in that
        group; a short "uptraining" then recovers most of the quality.

        Args:
            module: a :class:`~attn_course.MultiHeadAttention` or a :class:`GroupedQueryAttention`
                with ``num_kv_heads == num_heads``.
            num_kv_heads: ``G`` of the result.
            kwargs: ``window``, ``rotary``, ``rope_base``, ``alibi``, ``backend`` of the result
                (a GroupedQueryAttention source passes on its own unless given).
        """
        if isinstance(module, GroupedQueryAttention):
            if module.num_kv_heads != module.num_heads:
                raise ValueError(f"module must have one key/value head per query head, got num_kv_heads={module.num_kv_heads} "
                                 f"and num_heads={module.num_heads}")
            defaults = dict(window=module.window, rotary=module.rotary is not None,
                            rope_base=module.rotary.base if module.rotary is not None else 10000.0,
                            alibi=module.alibi, backend=module.backend)
        elif isinstance(module, MultiHeadAttention):
            defaults = dict(backend=module.backend)
        else:
            raise TypeError(f"module must be an attn_course.MultiHeadAttention or GroupedQueryAttention, got {type(module).__name__}")
        weight = module.q_proj.weight
        has_bias = module.q_proj.bias is not None
        ours = cls(module.embed_dim, module.num_heads, num_kv_heads, dropout=module.dropout, bias=has_bias,
                   **{**defaults, **kwargs}).to(device=weight.device, dtype=weight.dtype)
        H, G, D, E = module.num_heads, num_kv_heads, module.head_dim, module.embed_dim
        with torch.no_grad():
            for source, target in ((module.k_proj, ours.k_proj), (module.v_proj, ours.v_proj)):
                target.weight.copy_(source.weight.view(G, H // G, D, E).mean(dim=1).reshape(G * D, E))  # (H*D, E) -> (G*D, E)
                if has_bias:
                    target.bias.copy_(source.bias.view(G, H // G, D).mean(dim=1).reshape(G * D))  # (H*D,) -> (G*D,)
            for source, target in ((module.q_proj, ours.q_proj), (module.out_proj, ours.out_proj)):
                target.load_state_dict(source.state_dict())
        return ours.train(module.training)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention step of the plain and the cached paths: :func:`grouped_attention` with this
        module's dropout (in training mode) and backend."""
        return grouped_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
                                 need_weights=need_weights)

    def _position_masks(self, mask, L: int, S: int, device, dtype):
        """Add the window and the ALiBi bias (queries = the last L of S positions) to a merged mask."""
        if self.window is not None:
            mask = _and_allowed(mask, sliding_window_mask(L, self.window, S, device=device, align="bottom_right"))
        if self.alibi:
            mask = _add_bias(mask, alibi_bias(self.num_heads, L, S, device=device, dtype=dtype))  # (H, L, S) broadcasts
        return mask

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value``; see the class docstring for shapes and masks.

        A query with no key left to attend to gets zeros, not NaN.
        """
        B, L, S = self._check_inputs(query, key, value)
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        mask = self._merge_masks(key_padding_mask, attn_mask, is_causal, B, L, S, query)  # (B|1, H|1, L, S) or None
        mask = self._position_masks(mask, L, S, query.device, query.dtype)

        q = self.q_proj(query).view(B, L, H, D).transpose(1, 2)  # (B, L, E) -> (B, H, L, D)
        k = self.k_proj(key).view(B, S, G, D).transpose(1, 2)  # (B, S, G*D) -> (B, G, S, D)
        v = self.v_proj(value).view(B, S, G, D).transpose(1, 2)  # (B, S, G*D) -> (B, G, S, D)
        if self.rotary is not None:
            q = self.rotary.rotate(q, torch.arange(S - L, S, device=query.device), "query")  # the last L positions
            k = self.rotary.rotate(k, torch.arange(S, device=query.device), "key")
        context, weights = self._attend(q, k, v, mask, need_weights)  # (B, H, L, D), (B, H, L, S)
        context = context.transpose(1, 2).reshape(B, L, H * D)  # (B, H, L, D) -> (B, L, E)
        return self.out_proj(context), weights

    # -- cached decoding -----------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int | None = None, num_layers: int = 1):
        """An empty cache for this module (``num_layers`` of them stacked, for a whole model).

        Without a window: a :class:`~attn_course.KVCache` of ``G`` heads and ``max_len`` positions.
        With a window: a :class:`RollingKVCache` of ``window`` positions (``max_len`` is not needed).
        """
        weight = self.q_proj.weight
        if self.window is not None:
            return RollingKVCache(num_layers, batch_size, self.num_kv_heads, self.head_dim, self.window,
                                  device=weight.device, dtype=weight.dtype)
        if max_len is None:
            raise ValueError("max_len must be given for a module without a window (the cache keeps every position)")
        return KVCache(num_layers, batch_size, self.num_kv_heads, self.head_dim, max_len, device=weight.device, dtype=weight.dtype)

    def forward_cached(self, x: torch.Tensor, cache, layer: int = 0) -> torch.Tensor:
        """Causal self-attention of new tokens that follow the ``cache.length`` tokens in ``cache``.

        Only the new tokens are projected; their ``G`` key/value heads are added to the cache (keys
        rotated first, when ``rotary``); each new query attends to the kept keys up to its own
        position (and within the window).

        Returns:
            The same as ``self(x_all, x_all, x_all, is_causal=True)[0]`` at the new positions, where
            ``x_all`` is every token so far.

        Shape:
            x: ``(B, T_new, E)`` -> ``(B, T_new, E)``
        """
        if not isinstance(cache, (KVCache, RollingKVCache)):
            raise TypeError(f"cache must be a KVCache or RollingKVCache (module.new_cache(...)), got {type(cache).__name__}")
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.size(-1) != self.embed_dim:
            raise ValueError(f"x must have shape (B, T_new, E={self.embed_dim}), got {tuple(x.shape)}")
        if (self.window is None) != isinstance(cache, KVCache):
            raise TypeError(f"a module with window={self.window} needs the cache of module.new_cache(...), got a {type(cache).__name__}")
        B, T, E = x.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        start = cache._lengths[layer] if isinstance(layer, int) and 0 <= layer < len(cache._lengths) else 0
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, T, E) -> (B, H, T, D)
        k = self.k_proj(x).view(B, T, G, D).transpose(1, 2)  # (B, T, G*D) -> (B, G, T, D)
        v = self.v_proj(x).view(B, T, G, D).transpose(1, 2)  # (B, G, T, D)
        if self.rotary is not None:
            positions = torch.arange(start, start + T, device=x.device)  # (T,)
            q, k = self.rotary(q, k, positions)
        keys, values = cache.update(layer, k, v)  # (B, G, S, D) each
        S = keys.size(2)
        # Causal (and windowed) mask of the new queries, the last T of the S positions; allowed convention.
        mask = None if T == 1 and self.window is None else sliding_window_mask(T, self.window or S, S, device=x.device,
                                                                                align="bottom_right")
        if self.alibi:
            mask = _add_bias(mask, alibi_bias(H, T, S, device=x.device, dtype=x.dtype))
        context, _ = self._attend(q, keys, values, mask, need_weights=False)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, E)  # (B, H, T, D) -> (B, T, E)
        return self.out_proj(context)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
                      dropout_p: float = 0.0, backend: str = "reference", need_weights: bool = False,
                      scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of ``H`` query heads to ``G`` key/value heads, query head ``h`` reading head ``h // (H / G)``.

    The attention step of :class:`GroupedQueryAttention` (and of
    :class:`~attn_course.MultiHeadLatentAttention`, whose absorbed form is attention to one shared
    head): rows that may attend to nothing give zeros, never NaN, on both backends.

    Args:
        q, k, v: queries, keys and values, heads on the second axis.
        mask: None, or a merged mask broadcastable to ``(B, H, L, S)``: bool **True = may attend**
            (the convention of ``F.scaled_dot_product_attention``), or float to add to the scores.
        dropout_p: dropout on the weights (pass 0.0 at evaluation time).
        backend: ``"reference"`` (:func:`~attn_course.scaled_dot_product_attention`, the weights
            computed explicitly, with the ``H/G`` query heads of each group folded into the query axis,
            ``(B, G, H/G * L, Dk)``, so that no key or value is copied per query head) or ``"sdpa"``
            (PyTorch's fused kernel with ``enable_gqa=True``).
        need_weights: also return the weights.
        scale: factor on the scores; defaults to ``1/sqrt(Dk)``.

    Returns:
        ``(context, weights)``; weights is None unless ``need_weights``.

    Shape:
        - q: ``(B, H, L, Dk)``, k: ``(B, G, S, Dk)``, v: ``(B, G, S, Dv)``; ``G`` divides ``H``.
        - context: ``(B, H, L, Dv)``, weights: ``(B, H, L, S)``.
    """
    B, H, L, Dk = q.shape
    G, S, Dv = k.size(1), k.size(2), v.size(-1)
    group = H // G

    # Rows that may attend to nothing: allow them everything, then zero their output below.
    empty_rows = None
    if mask is not None:
        empty_rows = ~mask.any(dim=-1, keepdim=True) if mask.dtype == torch.bool else torch.isneginf(mask).all(dim=-1, keepdim=True)
        if bool(empty_rows.any()):
            mask = mask | empty_rows if mask.dtype == torch.bool else mask.masked_fill(empty_rows, 0.0)
        else:
            empty_rows = None

    weights = None
    if backend == "sdpa":
        if group == 1:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        elif _ENABLE_GQA:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, enable_gqa=True)
        else:  # an older torch: copy each key/value head to its group
            context = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                                     attn_mask=mask, dropout_p=dropout_p, scale=scale)  # (B, H, L, Dv)
        if need_weights:
            weights = _attention_weights(_fold(q, G), k, _fold_mask(mask, G, group), False, scale).view(B, H, L, S)
    else:
        # The query heads of one group stand in line as group * L queries of the group's one
        # key/value head: (B, G, H/G * L, Dk) against (B, G, S, Dk), ordinary batched matrix products
        # in which no key or value is copied. (Broadcasting (B, G, H/G, L, Dk) against (B, G, 1, S, Dk)
        # would give the same numbers, but torch.matmul implements that broadcast by copying the key
        # head for every query head of its group.)
        context, weights = scaled_dot_product_attention(
            _fold(q, G), k, v, attn_mask=_fold_mask(mask, G, group), dropout_p=dropout_p, scale=scale
        )  # (B, G, H/G*L, Dv), (B, G, H/G*L, S)
        context = context.view(B, H, L, Dv)  # (B, G, H/G*L, Dv) -> (B, H, L, Dv): the heads of a group are consecutive
        weights = weights.view(B, H, L, S)
    if empty_rows is not None:
        context = context.masked_fill(empty_rows, 0.0)
        if weights is not None:
            weights = weights.masked_fill(empty_rows, 0.0)
    return context, (weights if need_weights else None)


def _fold(q: torch.Tensor, G: int) -> torch.Tensor:
    """Queries ``(B, H, L, D)`` as ``(B, G, H/G * L, D)``: the ``H/G`` heads of each group, one after the other."""
    B, H, L, D = q.shape
    return q.reshape(B, G, (H // G) * L, D)  # a view when the heads are contiguous; at most one copy of q


def _fold_mask(mask: torch.Tensor | None, G: int, group: int) -> torch.Tensor | None:
    """A mask broadcastable to ``(B, H, L, S)`` as one broadcastable to the folded ``(B, G, H/G * L, S)``."""
    if mask is None:
        return None
    while mask.dim() < 4:
        mask = mask[None]  # (..., L, S) -> (1, ..., L, S)
    b, h, L, S = mask.shape
    if h == 1:
        if L == 1 or group == 1:
            return mask  # (b, 1, L, S) broadcasts as it is: one head per group, or one row for every query
        return mask.expand(b, 1, group, L, S).reshape(b, 1, group * L, S)  # the L rows repeated for each head of a group
    return mask.reshape(b, G, group * L, S)  # (b, H, L, S) -> (b, G, H/G * L, S), a view


_ENABLE_GQA = _enable_gqa_supported()


# -- which operations copy the keys and values per query head -----------------------------------------
@dataclass(frozen=True)
class KVCopy:
    """One operation that wrote more numbers taken from the keys and values than they hold.

    Attributes:
        of: ``"keys"``, ``"values"`` or ``"keys and values"``: whose numbers it wrote.
        function: the torch function the code called (``"torch.matmul"``, ``"Tensor.__getitem__"``, ...).
        op: the aten operation that PyTorch ran for it (``"aten.clone"``, ``"aten.index"``, ...).
        shape: the shape of what it wrote.
        numbers: how many numbers it wrote (or, for a buffer filled piece by piece, the buffer holds).
        source: how many distinct numbers of the keys and values it read them from.
        times: how many operations wrote them (more than 1 for copies made one at a time, as in a loop over
            query heads, added up within the call).
    """

    of: str
    function: str
    op: str
    shape: tuple
    numbers: int
    source: int
    times: int = 1


_COPYING = {"clone", "_to_copy", "copy_", "contiguous", "copy"}  # ops that write their input's numbers unchanged

_DATALESS = {"new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "empty_like", "zeros_like",
             "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _distinct(t: torch.Tensor) -> int:
    """How many different memory locations a tensor view reads (a broadcast axis, stride 0, counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n


def _function_name(func) -> str:
    name = getattr(func, "__name__", repr(func))
    qualname = getattr(func, "__qualname__", name)
    if qualname.startswith("TensorBase.") or qualname.startswith("Tensor."):
        return "Tensor." + name
    if name == "__matmul__":
        return "torch.matmul"
    module = getattr(func, "__module__", None) or "torch"
    return f"{module if module.startswith('torch') else 'torch'}.{name}"


class _OuterFunction(TorchFunctionMode):
    """Remembers the outermost torch function being run (what the user's code called)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.current = 0, "?"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.depth == 0:
            self.current = _function_name(func)
        self.depth += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.depth -= 1


class _Provenance(TorchDispatchMode):
    """Follows which storages hold numbers derived from the queries, the keys or the values (and nothing
    else), and records the operations that write keys or values, unmixed with queries, into more numbers
    than they were read from (a broadcast made real, a gather, a per-head copy), and the buffers filled
    with more key/value numbers than ``group`` copies of their sources would hold."""

    def __init__(self, sources: dict[str, torch.Tensor], group: int, outer: _OuterFunction) -> None:
        super().__init__()
        self.labels: dict[int, frozenset] = {}
        self.sizes = {name: t.numel() for name, t in sources.items()}
        self.group, self.outer, self.copies, self.alive, self.flagged = group, outer, [], [], set()
        self.views: dict[tuple, int] = {}  # how often each key/value view was copied out whole
        self.totals: dict[frozenset, int] = {}  # numbers written by copying ops, per keys / values
        self.named: set = set()
        for name, t in sources.items():
            self.labels[_storage_key(t)] = self.labels.get(_storage_key(t), frozenset()) | {name}

    def _of(self, key: int) -> str:
        return " and ".join(name for name in ("keys", "values") if name in self.labels[key])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._follow(func, args, kwargs, out)
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):  # a tensor without plain storage
            pass
        return out

    def _follow(self, func, args, kwargs, out) -> None:
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.numel() > 0]
        labels = frozenset().union(*(self.labels.get(_storage_key(t), frozenset()) for t in inputs))
        name = func.overloadpacket.__name__
        if not labels or name in _DATALESS:
            return
        in_storages = {_storage_key(t) for t in inputs}
        kv = frozenset(label for label in labels if label != "queries")
        for t in (t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.numel() > 0):
            key = _storage_key(t)
            self.labels[key] = self.labels.get(key, frozenset()) | labels
            self.alive.append(t)  # keeps the storage, so that its address is not reused during the run
            if "queries" in self.labels[key] or key in self.flagged:
                continue
            views = {(_storage_key(x), x.storage_offset(), tuple(x.shape), x.stride()): x for x in inputs
                     if self.labels.get(_storage_key(x), frozenset()) & kv}
            source = sum(_distinct(x) for x in views.values())
            stored = t.untyped_storage().nbytes() // t.element_size()
            if name in _COPYING and self.group > 1 and not self._tally(name, args, t, kv):
                continue
            if key not in in_storages and t.numel() > source:  # more numbers out than distinct numbers in
                self.flagged.add(key)
                self.copies.append(KVCopy(self._of(key), self.outer.current, f"aten.{name}", tuple(t.shape), t.numel(),
                                          source))
            elif key in in_storages and func._schema.is_mutable and self.group > 1 and \
                    stored >= self.group * sum(self.sizes[label] for label in self.labels[key]):
                self.flagged.add(key)  # a buffer written piece by piece until it holds a copy per query head
                self.copies.append(KVCopy(self._of(key), self.outer.current, f"aten.{name}", tuple(t.shape), stored,
                                          sum(self.sizes[label] for label in self.labels[key])))


    def _tally(self, name, args, t, kv) -> bool:
        """Adds up the numbers that copying ops write from the keys or values within the call: the same view
        copied ``group`` times (a copy per query head, made in a loop), or copies adding up to more than
        ``max(3, group)`` times the keys or values, is recorded. False when it recorded one."""
        src = args[1] if name == "copy_" and len(args) > 1 else args[0]
        if not isinstance(src, torch.Tensor) or not (self.labels.get(_storage_key(src), frozenset()) & kv):
            return True
        labels = frozenset(label for label in self.labels[_storage_key(src)] if label != "queries")
        view = (_storage_key(src), src.storage_offset(), tuple(src.shape), src.stride())
        self.views[view] = times = self.views.get(view, 0) + 1
        self.totals[labels] = total = self.totals.get(labels, 0) + t.numel()
        size = sum(self.sizes[label] for label in labels)
        if labels in self.named:
            return True
        if times >= self.group:
            self.named.add(labels)
            self.copies.append(KVCopy(" and ".join(n for n in ("keys", "values") if n in labels), self.outer.current,
                                      f"aten.{name}", tuple(t.shape), times * t.numel(), _distinct(src), times))
            return False
        if total > max(3, self.group) * size:
            self.named.add(labels)
            self.copies.append(KVCopy(" and ".join(n for n in ("keys", "values") if n in labels), self.outer.current,
                                      f"aten.{name}", tuple(t.shape), total, size, times))
            return False
        return True


def kv_copies(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, **kwargs):
    """Run ``fn(q, k, v, *args, **kwargs)`` and list the operations that copied keys or values per query head.

    Every operation PyTorch runs (at the level of its aten kernels, so also inside ``torch.matmul``) is
    followed: an operation whose result is made of key or value numbers alone (no query mixed in yet)
    and holds more numbers than it read, as a broadcast made real, an index that repeats heads or a
    ``repeat_interleave`` does, is a copy; so is a buffer filled until it holds the keys or values
    ``H / G`` times over. Views (``expand``, ``[:, :, None]``, ``transpose``), and one copy of the keys
    or values at their own size (``contiguous``, ``double``), are not.

    Returns:
        ``(result, copies)``: what ``fn`` returned and a list of :class:`KVCopy`, empty when no key or
        value was copied per query head.

    Shape:
        q: ``(B, H, L, D)``; k, v: ``(B, G, S, D)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    group = max(1, q.size(1) // max(1, k.size(1))) if q.dim() == k.dim() == 4 else 1
    outer = _OuterFunction()
    watch = _Provenance({"queries": q, "keys": k, "values": v}, group, outer)
    with outer, watch:
        result = fn(q, k, v, *args, **kwargs)
    return result, watch.copies
