"""Chapter 04: mask helpers.

PyTorch has two mask conventions, and mixing them up is the most common attention bug:

- ``F.scaled_dot_product_attention`` (and :func:`attn_course.scaled_dot_product_attention`):
  a boolean mask is **True where a query may attend** ("allowed").
- ``nn.MultiheadAttention`` (and :class:`attn_course.MultiHeadAttention`): a boolean mask is
  **True where attending is not allowed** ("blocked"); ``key_padding_mask`` is True at padding.

Every helper here returns the **allowed** convention (True = may attend) and says so in its name's
docstring; :func:`allowed_to_blocked` converts for ``nn.MultiheadAttention``-style arguments.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int, check_tensor, describe

__all__ = ["causal_mask", "padding_mask", "combine_masks", "allowed_to_blocked", "blocked_to_additive"]


def causal_mask(query_len: int, key_len: int | None = None, *, device=None) -> torch.Tensor:
    """Allowed-convention causal mask: query ``i`` may attend to keys ``0..i``.

    Aligned to the top-left corner, as ``F.scaled_dot_product_attention(is_causal=True)``.

    Args:
        query_len: number of queries ``L``.
        key_len: number of keys ``S`` (defaults to ``L``).
        device: where to create the mask.

    Returns:
        Bool tensor, True = may attend.

    Shape:
        ``(L, S)``
    """
    check_positive_int("query_len", query_len, allow_zero=True)
    key_len = query_len if key_len is None else key_len
    check_positive_int("key_len", key_len, allow_zero=True)
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril()  # (L, S)


def padding_mask(lengths, max_len: int | None = None) -> torch.Tensor:
    """Allowed-convention padding mask: True at the real tokens of each sequence, False at padding.

    Args:
        lengths: the true length of each sequence (a 1-D int tensor or a list of ints).
        max_len: the padded length ``S`` (defaults to the longest length).

    Returns:
        Bool tensor, True = a real token (may be attended to). For ``nn.MultiheadAttention``'s
        ``key_padding_mask`` (True = padding) pass ``allowed_to_blocked(padding_mask(...))``.

    Shape:
        lengths: ``(B,)`` -> ``(B, S)``
    """
    if not isinstance(lengths, torch.Tensor):
        if not isinstance(lengths, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be a 1-D int tensor or a list of ints, got {describe(lengths)}")
        lengths = torch.tensor(lengths, dtype=torch.long)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor, got {describe(lengths)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    check_positive_int("max_len", max_len, allow_zero=True)
    if longest > max_len:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence (length {longest})")
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (B, S)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine allowed-convention boolean masks: a position is allowed only if every mask allows it.

    A ``(B, S)`` padding mask is first reshaped to ``(B, 1, S)`` so that it broadcasts over queries.

    Args:
        masks: bool masks in the allowed convention, or None (skipped).

    Returns:
        Their broadcast logical AND, or None when no mask is given.

    Shape:
        ``(L, S)`` and ``(B, S)`` -> ``(B, L, S)``; add a head axis with ``mask[:, None]`` for
        ``(B, H, L, S)`` scores.
    """
    combined = None
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        check_tensor(f"masks[{i}]", mask, min_dim=2)
        if mask.dtype != torch.bool:
            raise TypeError(f"masks[{i}] must be a bool mask (True = may attend), got dtype {mask.dtype}")
        combined = mask if combined is None else combined & mask
    return combined


def allowed_to_blocked(mask: torch.Tensor) -> torch.Tensor:
    """Convert a boolean mask from "True = may attend" to "True = blocked" (or back): ``~mask``."""
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    return ~mask


def blocked_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a blocked-convention bool mask into a float mask to add to the scores.

    Blocked positions get ``-inf`` (not ``-1e9``, which overflows to ``-inf`` in float16 anyway and
    silently leaks weight in bfloat16 sums); allowed positions get ``0``.
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
