"""Chapter 04: mask helpers.

PyTorch has two boolean mask conventions, and mixing them up is the most common attention bug,
because the wrong one raises no error (it just attends to the wrong keys):

- ``F.scaled_dot_product_attention`` (and :func:`attn_course.scaled_dot_product_attention`):
  a boolean mask is **True where a query may attend** ("allowed").
- ``nn.MultiheadAttention`` (and :class:`attn_course.MultiHeadAttention`): a boolean mask is
  **True where attending is not allowed** ("blocked"); ``key_padding_mask`` is True at padding.

Both also accept a **float** mask, which is *added* to the scores: ``0`` where attending is
allowed, ``-inf`` where it is blocked.

Every helper here returns the **allowed** convention (True = may attend) and says so in its
docstring; :func:`allowed_to_blocked` converts for ``nn.MultiheadAttention``-style arguments and
:func:`blocked_to_additive` makes the float form.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int, check_tensor, describe

__all__ = ["causal_mask", "sliding_window_mask", "padding_mask", "combine_masks", "allowed_to_blocked", "blocked_to_additive"]

_ALIGNMENTS = ("top_left", "bottom_right")
_SIDES = ("right", "left")


def causal_mask(query_len: int, key_len: int | None = None, *, device=None, align: str = "top_left") -> torch.Tensor:
    """Causal mask in the allowed convention (True = may attend): no query sees a later key.

    With ``align="top_left"`` (the default, as ``F.scaled_dot_product_attention(is_causal=True)``)
    query ``i`` may attend to keys ``0..i``. With ``align="bottom_right"`` (as
    ``torch.nn.attention.bias.causal_lower_right``) the last query sees every key, which is what a
    model needs when the ``L`` queries are the *last* ``L`` of ``S`` tokens (generation with cached
    keys): query ``i`` may attend to keys ``0..i + S - L``. For ``L == S`` both are the same.

    Args:
        query_len: number of queries ``L``.
        key_len: number of keys ``S`` (defaults to ``L``).
        device: where to create the mask (default: the CPU).
        align: ``"top_left"`` or ``"bottom_right"``.

    Returns:
        Bool tensor, True = may attend (lower triangle, diagonal included). For
        ``nn.MultiheadAttention``'s ``attn_mask`` (True = blocked) pass ``allowed_to_blocked(mask)``.

    Shape:
        ``(L, S)``

    Example::

        >>> causal_mask(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    check_positive_int("query_len", query_len, allow_zero=True)
    key_len = query_len if key_len is None else key_len
    check_positive_int("key_len", key_len, allow_zero=True)
    if align not in _ALIGNMENTS:
        raise ValueError(f"align must be one of {_ALIGNMENTS}, got {align!r}")
    diagonal = 0 if align == "top_left" else key_len - query_len
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(diagonal)  # (L, S)


def sliding_window_mask(query_len: int, window: int, key_len: int | None = None, *, device=None,
                        align: str = "top_left") -> torch.Tensor:
    """Sliding-window causal mask in the allowed convention (True = may attend), as Longformer and Mistral.

    Query ``i`` may attend to the ``window`` keys ``i - window + 1 .. i`` (itself included) and to no
    other: a causal mask with everything older than ``window`` positions cut off. With
    ``window >= S`` it is :func:`causal_mask`. ``align`` places the queries as in :func:`causal_mask`:
    ``"bottom_right"`` when the ``L`` queries are the last ``L`` of ``S`` positions (new tokens after a
    cache), so that query ``i`` sits at position ``i + S - L``.

    Args:
        query_len: number of queries ``L``.
        window: how many keys each query sees, itself included (at least 1).
        key_len: number of keys ``S`` (defaults to ``L``).
        device: where to create the mask (default: the CPU).
        align: ``"top_left"`` (default, as :func:`causal_mask`) or ``"bottom_right"``.

    Returns:
        Bool tensor, True = may attend: a band of width ``window`` ending on the diagonal. For
        ``nn.MultiheadAttention``'s ``attn_mask`` (True = blocked) pass ``allowed_to_blocked(mask)``.

    Shape:
        ``(L, S)``

    Example::

        >>> sliding_window_mask(4, 2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_positive_int("query_len", query_len, allow_zero=True)
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int (how many keys each query sees), got {describe(window)}")
    if window < 1:
        raise ValueError(f"window must be at least 1 (a query always sees itself), got {window}")
    key_len = query_len if key_len is None else key_len
    check_positive_int("key_len", key_len, allow_zero=True)
    if align not in _ALIGNMENTS:
        raise ValueError(f"align must be one of {_ALIGNMENTS}, got {align!r}")
    offset = 0 if align == "top_left" else key_len - query_len
    query_pos = torch.arange(query_len, device=device)[:, None] + offset  # (L, 1)
    key_pos = torch.arange(key_len, device=device)[None, :]  # (1, S)
    distance = query_pos - key_pos  # (L, S), i - j
    return (distance >= 0) & (distance < window)  # (L, S)


def padding_mask(lengths, max_len: int | None = None, *, side: str = "right", device=None) -> torch.Tensor:
    """Padding mask in the allowed convention: True at the real tokens of each sequence, False at padding.

    Args:
        lengths: the true length of each sequence (a 1-D int tensor or a list of ints).
        max_len: the padded length ``S`` (defaults to the longest length).
        side: where the padding sits, ``"right"`` (real tokens first, the usual layout) or
            ``"left"`` (padding first, common when a decoder generates a whole batch at once).
        device: where to create the mask (default: the device of ``lengths``, the CPU for a list).

    Returns:
        Bool tensor, True = a real token (may be attended to). It describes **keys**: combine it
        with other masks through ``combine_masks(..., padding=mask)``, which puts it on the key
        axis. For ``nn.MultiheadAttention``'s ``key_padding_mask`` (True = padding) pass
        ``allowed_to_blocked(padding_mask(...))``.

    Shape:
        lengths: ``(B,)`` -> ``(B, S)``

    Example::

        >>> padding_mask([3, 1]).int()
        tensor([[1, 1, 1],
                [1, 0, 0]], dtype=torch.int32)
    """
    if not isinstance(lengths, torch.Tensor):
        if not isinstance(lengths, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
            raise TypeError(f"lengths must be a 1-D int tensor or a list of ints, got {describe(lengths)}")
        lengths = torch.tensor(lengths, dtype=torch.long)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor, got {describe(lengths)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    if side not in _SIDES:
        raise ValueError(f"side must be one of {_SIDES}, got {side!r}")
    if device is not None:
        lengths = lengths.to(device)
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    check_positive_int("max_len", max_len, allow_zero=True)
    if longest > max_len:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence (length {longest})")
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    if side == "right":
        return positions[None, :] < lengths[:, None]  # (1, S) < (B, 1) -> (B, S)
    return positions[None, :] >= (max_len - lengths)[:, None]  # (1, S) >= (B, 1) -> (B, S)


def _check_bool_mask(name: str, mask, min_dim: int = 0) -> None:
    check_tensor(name, mask, min_dim=min_dim)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool mask (True = may attend), got dtype {mask.dtype}")


def combine_masks(*masks: torch.Tensor | None, padding: torch.Tensor | None = None) -> torch.Tensor | None:
    """Combine allowed-convention boolean masks: a position is allowed only if every mask allows it.

    The masks in ``masks`` must broadcast together (shapes aligned on the right, as usual). A
    ``(B, S)`` padding mask says which *keys* are real, and a plain broadcast would line its batch
    axis up with the *query* axis of an ``(L, S)`` mask (silently, whenever ``B == L``); so pass it
    as ``padding=``, and it is reshaped to ``(B, 1, S)`` (or ``(B, 1, 1, S)`` next to 4-D masks)
    first, so that it masks the same keys for every query.

    Args:
        masks: bool masks in the allowed convention (True = may attend), each broadcastable to the
            scores' shape, for example ``(L, S)``, ``(B, L, S)`` or ``(B, H, L, S)``; None is skipped.
        padding: an optional ``(B, S)`` key padding mask in the allowed convention (True = a real
            token), as :func:`padding_mask` makes.

    Returns:
        Their broadcast logical AND (True = may attend), or None when no mask is given.

    Shape:
        ``(L, S)`` with ``padding`` ``(B, S)`` -> ``(B, L, S)``; add a head axis with ``mask[:, None]``
        for ``(B, H, L, S)`` scores.

    Raises:
        TypeError: a mask is not a bool tensor.
        ValueError: the masks do not broadcast together, or lie on different devices.
    """
    named = []
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        _check_bool_mask(f"masks[{i}]", mask)
        named.append((f"masks[{i}]", mask))
    if padding is not None:
        _check_bool_mask("padding", padding)
        if padding.dim() != 2:
            raise ValueError(f"padding must be a (B, S) key padding mask, got shape {tuple(padding.shape)}")
        rank = max([3] + [m.dim() for _, m in named])
        key_axis_only = padding.view(padding.size(0), *([1] * (rank - 2)), padding.size(1))  # (B, S) -> (B, 1, ..., 1, S)
        named.append(("padding", key_axis_only))
    if not named:
        return None
    first_name, first = named[0]
    for name, mask in named[1:]:
        if mask.device != first.device:
            raise ValueError(f"{name} is on {mask.device} but {first_name} is on {first.device}; put all masks on one device")
    try:
        torch.broadcast_shapes(*(tuple(m.shape) for _, m in named))
    except RuntimeError:
        shapes = ", ".join(f"{name} {tuple(m.shape)}" for name, m in named)
        raise ValueError(
            f"the masks do not broadcast together: {shapes} (padding reshaped to put its batch axis first "
            f"and its keys last). For a (B, S) padding mask, pass it as padding=..., not positionally."
        ) from None
    combined = first
    for _, mask in named[1:]:
        combined = combined & mask  # broadcast AND
    return combined


def allowed_to_blocked(mask: torch.Tensor) -> torch.Tensor:
    """Convert a boolean mask from "True = may attend" to "True = blocked" (or back): ``~mask``.

    Use it to pass this package's masks (allowed convention, as ``F.scaled_dot_product_attention``)
    to ``nn.MultiheadAttention`` and :class:`attn_course.MultiHeadAttention` (blocked convention,
    for both ``attn_mask`` and ``key_padding_mask``). Applied twice it gives the mask back.

    Args:
        mask: a bool mask in either convention.

    Returns:
        The bool mask in the other convention.

    Shape:
        Any; the output has the input's shape.
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    return ~mask


def blocked_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a blocked-convention bool mask (True = blocked) into a float mask to add to the scores.

    Blocked positions get ``-inf`` and allowed positions ``0``; both ``F.scaled_dot_product_attention``
    and ``nn.MultiheadAttention`` accept the result as ``attn_mask``. For a mask in the allowed
    convention use ``blocked_to_additive(allowed_to_blocked(mask))``.

    Why ``-inf`` and not a big finite number such as ``-1e9``: ``-1e9`` does not exist in float16
    (whose largest magnitude is 65504): converting it gives ``-inf`` anyway, and ``masked_fill``
    with it raises an overflow error. A finite stand-in that does fit, such as
    ``torch.finfo(torch.float16).min``, overflows to ``-inf`` as soon as a score of about -16 or less,
    or a second such mask, is added to it; and in a row where every key is blocked it gives each
    blocked key the *same* weight,
    so the query silently averages the padding instead of producing an obvious NaN (or, in this
    package, zeros).

    Args:
        mask: a bool mask, True = blocked.
        dtype: the floating-point dtype of the result (use the scores' dtype).

    Returns:
        A float mask: ``-inf`` where blocked, ``0`` where allowed.

    Shape:
        Any; the output has the input's shape.
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
