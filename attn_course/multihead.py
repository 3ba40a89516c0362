"""Chapter 05: multi-head attention, with the same interface and masks as ``nn.MultiheadAttention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_positive_int, check_probability, check_tensor, describe
from .scaled import _attention_weights, _recording_graph, scaled_dot_product_attention

__all__ = ["MultiHeadAttention", "BACKENDS"]

BACKENDS = ("reference", "sdpa")


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch first: ``H`` heads of width ``D = E / H`` attend in parallel.

    Args:
        embed_dim: model width ``E``.
        num_heads: number of heads ``H``; must divide ``embed_dim``.
        dropout: dropout on the attention weights, applied in training mode only.
        bias: add biases to the four projections.
        backend: ``"reference"`` computes the weights explicitly with
            :func:`attn_course.scaled_dot_product_attention` (for teaching and inspection);
            ``"sdpa"`` calls PyTorch's fused ``F.scaled_dot_product_attention`` and computes the
            weights separately, only when ``need_weights=True``.
        qk_head_dim: width of each head's queries and keys, the paper's ``d_k`` (Vaswani et al. 2017,
            Table 3 rows (B)); defaults to ``D = E / H``. The values keep width ``D``, so the output
            is unchanged in shape; only the query and key projections become ``(E, H * qk_head_dim)``.

    Mask convention (as ``nn.MultiheadAttention``): a boolean mask is **True where attending is
    not allowed**; ``key_padding_mask`` is True at padding; a float mask is added to the scores.

    Shape:
        - query: ``(B, L, E)``, key and value: ``(B, S, E)``
        - key_padding_mask: ``(B, S)``
        - attn_mask: ``(L, S)``, ``(B * H, L, S)`` or ``(B, H, L, S)``
        - output: ``(B, L, E)``; weights: ``(B, H, L, S)``, one map per head (not averaged)
    """

    def __init__(
        self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, backend: str = "reference",
        qk_head_dim: int | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_positive_int("num_heads", num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"num_heads must divide embed_dim, got embed_dim={embed_dim} and num_heads={num_heads} "
                f"(remainder {embed_dim % num_heads})"
            )
        check_probability("dropout", dropout)
        check_bool("bias", bias)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        if qk_head_dim is not None:
            check_positive_int("qk_head_dim", qk_head_dim)
        self.qk_head_dim = self.head_dim if qk_head_dim is None else qk_head_dim
        self.dropout, self.backend = float(dropout), backend
        self.q_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_heads * self.qk_head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def extra_repr(self) -> str:
        text = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, backend={self.backend!r}"
        return text if self.qk_head_dim == self.head_dim else f"{text}, qk_head_dim={self.qk_head_dim}"

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, backend: str = "reference") -> "MultiHeadAttention":
        """Copy the weights of an ``nn.MultiheadAttention(batch_first=True)`` so both compute the same."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module.batch_first:
            raise ValueError("module must be built with batch_first=True, got batch_first=False")
        if not module._qkv_same_embed_dim:
            raise ValueError(
                f"module must have kdim == vdim == embed_dim, got kdim={module.kdim}, vdim={module.vdim}, "
                f"embed_dim={module.embed_dim}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("module must not use add_bias_kv or add_zero_attn, which this class does not implement")
        has_bias = module.in_proj_bias is not None
        weight = module.in_proj_weight
        ours = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=has_bias, backend=backend)
        ours = ours.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
                rows = slice(i * module.embed_dim, (i + 1) * module.embed_dim)
                proj.weight.copy_(weight[rows])
                if has_bias:
                    proj.bias.copy_(module.in_proj_bias[rows])
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)

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

        ``is_causal=True`` applies a causal mask (query ``i`` sees keys ``0..i``), on its own or
        together with the other masks. A query with no key left to attend to gets zeros, not NaN.
        """
        B, L, S = self._check_inputs(query, key, value)
        H, D = self.num_heads, self.head_dim
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        mask = self._merge_masks(key_padding_mask, attn_mask, is_causal, B, L, S, query)  # (B|1, H|1, L, S) or None

        # Project, then split the width E into H heads of width D.
        Dk = self.qk_head_dim  # D unless the module was built with another qk_head_dim
        q = self.q_proj(query).view(B, L, H, Dk).transpose(1, 2)  # (B, L, H * Dk) -> (B, H, L, Dk)
        k = self.k_proj(key).view(B, S, H, Dk).transpose(1, 2)  # (B, S, H * Dk) -> (B, H, S, Dk)
        v = self.v_proj(value).view(B, S, H, D).transpose(1, 2)  # (B, S, E) -> (B, H, S, D)
        dropout_p = self.dropout if self.training else 0.0

        # Rows that may attend to nothing: allow them everything, then zero their output below.
        # (This keeps NaN out of fused kernels, forward and backward.) Eagerly, the fix is skipped
        # when no row is empty; a recorded graph (torch.export, ONNX) always applies it, which
        # changes nothing where no row is empty.
        empty_rows = None
        if mask is not None:
            empty_rows = ~mask.any(dim=-1, keepdim=True) if mask.dtype == torch.bool else torch.isneginf(mask).all(dim=-1, keepdim=True)
            if _recording_graph() or bool(empty_rows.any()):
                mask = mask | empty_rows if mask.dtype == torch.bool else mask.masked_fill(empty_rows, 0.0)
            else:
                empty_rows = None

        weights = None
        # A causal mask alone is passed on as is_causal=True, which both backends handle without
        # building and checking a mask.
        only_causal = is_causal and key_padding_mask is None and attn_mask is None
        if self.backend == "reference":
            context, weights = scaled_dot_product_attention(
                q, k, v, attn_mask=None if only_causal else mask, dropout_p=dropout_p, is_causal=only_causal
            )  # (B, H, L, D), (B, H, L, S)
        else:
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if only_causal else mask, dropout_p=dropout_p, is_causal=only_causal
            )  # (B, H, L, D)
            if need_weights:
                weights = _attention_weights(q, k, mask, False, None)  # (B, H, L, S), before dropout
        if empty_rows is not None:
            context = context.masked_fill(empty_rows, 0.0)
            if weights is not None:
                weights = weights.masked_fill(empty_rows, 0.0)

        # Merge the heads back into one width-E vector per query, then mix them.
        context = context.transpose(1, 2).reshape(B, L, H * D)  # (B, H, L, D) -> (B, L, E)
        output = self.out_proj(context)  # (B, L, E)
        return output, (weights if need_weights else None)

    def _check_inputs(self, query, key, value) -> tuple[int, int, int]:
        E = self.embed_dim
        for name, x in (("query", query), ("key", key), ("value", value)):
            check_tensor(name, x, floating=True)
            if x.dim() != 3:
                raise ValueError(f"{name} must be batch first, (B, length, E={E}), got shape {tuple(x.shape)}")
            if x.size(-1) != E:
                raise ValueError(f"{name} must have last dimension embed_dim={E}, got shape {tuple(x.shape)}")
            if x.dtype != self.q_proj.weight.dtype or x.device != self.q_proj.weight.device:
                raise TypeError(
                    f"{name} is {x.dtype} on {x.device} but the module's weights are {self.q_proj.weight.dtype} "
                    f"on {self.q_proj.weight.device}; call module.to(...) or move the input"
                )
        B, L, S = query.size(0), query.size(1), key.size(1)
        if key.size(0) != B or value.size(0) != B:
            raise ValueError(
                f"query, key and value must share the batch size, got query {tuple(query.shape)}, "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if value.size(1) != S:
            raise ValueError(f"key and value must have the same length S, got key {tuple(key.shape)} and value {tuple(value.shape)}")
        return B, L, S

    def _merge_masks(self, key_padding_mask, attn_mask, is_causal, B, L, S, query):
        """All masks as one, broadcastable to (B, H, L, S): bool "True = may attend" if every mask is
        bool, otherwise a float mask to add to the scores."""
        H = self.num_heads
        parts = []  # blocked-convention bool masks or additive float masks, each (B|1, H|1, L|1, S)
        if key_padding_mask is not None:
            check_tensor("key_padding_mask", key_padding_mask)
            if tuple(key_padding_mask.shape) != (B, S):
                raise ValueError(f"key_padding_mask must have shape (B, S) = {(B, S)}, got {tuple(key_padding_mask.shape)}")
            parts.append(("key_padding_mask", key_padding_mask[:, None, None, :]))  # (B, 1, 1, S)
        if attn_mask is not None:
            check_tensor("attn_mask", attn_mask)
            shape = tuple(attn_mask.shape)
            if shape == (L, S):
                attn_mask = attn_mask[None, None]  # (1, 1, L, S)
            elif shape == (B * H, L, S):
                attn_mask = attn_mask.view(B, H, L, S)
            elif shape not in ((B, H, L, S), (B, 1, L, S)):
                raise ValueError(
                    f"attn_mask must have shape (L, S) = {(L, S)}, (B * H, L, S) = {(B * H, L, S)} or "
                    f"(B, H, L, S) = {(B, H, L, S)}, got {shape}"
                )
            parts.append(("attn_mask", attn_mask))
        if is_causal:
            causal_blocked = ~torch.ones(L, S, dtype=torch.bool, device=query.device).tril()  # (L, S)
            parts.append(("causal mask", causal_blocked[None, None]))
        if not parts:
            return None
        for name, m in parts:
            if m.dtype != torch.bool and not m.is_floating_point():
                raise TypeError(f"{name} must be a bool or floating-point tensor, got dtype {m.dtype}")
            if m.device != query.device:
                raise ValueError(f"{name} is on {m.device} but query is on {query.device}")
        if all(m.dtype == torch.bool for _, m in parts):
            blocked = parts[0][1]
            for _, m in parts[1:]:
                blocked = blocked | m
            return ~blocked  # allowed convention, for scaled_dot_product_attention
        additive = torch.zeros((), dtype=query.dtype, device=query.device)
        for _, m in parts:
            if m.dtype == torch.bool:
                m = torch.zeros(m.shape, dtype=query.dtype, device=query.device).masked_fill(m, float("-inf"))
            additive = additive + m.to(query.dtype)
        return additive
