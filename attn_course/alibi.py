"""Chapter 09: attention with linear biases (ALiBi, Press, Smith and Lewis 2022, "Train Short, Test Long").

ALiBi puts no position into the embeddings at all. Each head ``h`` instead adds ``-m_h * (i - j)`` to
the score of query ``i`` and key ``j``: a penalty that grows linearly with the distance, steeply for
heads with a large slope ``m_h`` (they look at the last few tokens) and gently for heads with a small
one (they look far back). The slopes are a geometric sequence fixed before training: for ``H`` heads
(a power of two) ``m_h = 2 ** (-8 (h + 1) / H)``, so 8 heads get ``1/2, 1/4, ..., 1/256``.

Shapes: ``H`` heads, ``L`` queries, ``S`` keys.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_positive_int, describe

__all__ = ["alibi_slopes", "alibi_bias"]


def _geometric_slopes(n: int) -> list[float]:
    """``2 ** (-8 / n)``, its square, ... : the slopes for ``n`` heads, ``n`` a power of two."""
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def _check_dtype(dtype) -> torch.dtype:
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}")
    return dtype


def alibi_slopes(num_heads: int, *, device=None, dtype=None) -> torch.Tensor:
    """The head slopes ``m_h`` of Press et al. (2022).

    For a power of two ``H``: the geometric sequence that starts at ``2 ** (-8 / H)`` with that same
    ratio (8 heads: ``1/2, 1/4, ..., 1/256``; 16 heads: ``1/sqrt(2), 1/2, ..., 1/256``), as the paper
    defines it. For another ``H``, the rule of the authors' code (``get_slopes`` in
    ofirpress/attention_with_linear_biases, "a workaround": the paper trains only powers of two), which
    BLOOM and MPT use too: the slopes of the power of two just below, ``n = 2 ** floor(log2 H)``,
    followed by every other slope of ``2n`` heads (the 1st, 3rd, ...) until there are ``H``.

    Args:
        num_heads: ``H``.
        device, dtype: of the result (default: the CPU and torch's default dtype).

    Returns:
        The slopes, one per head, in that order (for a power of two, largest first; otherwise the
        ``n`` slopes of the power of two, then the extra ones).

    Shape:
        ``(H,)``
    """
    check_positive_int("num_heads", num_heads)
    dtype = _check_dtype(dtype)
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _geometric_slopes(n)
    if n < num_heads:
        slopes += _geometric_slopes(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype)


def alibi_bias(num_heads: int, query_len: int, key_len: int | None = None, *, device=None, dtype=None) -> torch.Tensor:
    """The ALiBi bias ``-m_h * (i - j)`` of every head, query ``i`` and key ``j``, to add to the scores.

    When ``S > L`` the queries are taken to be the *last* ``L`` of the ``S`` positions (aligned to the
    bottom-right corner, as when new tokens attend to a cache): query ``i`` sits at position
    ``i + S - L``. A key after its query (``j > i``) gets a *positive* bias; combine the bias with a
    causal mask (``bias.masked_fill(~causal_mask(L, S, align="bottom_right"), float("-inf"))``, mask in
    the allowed convention) as the paper's causal language models do.

    Args:
        num_heads: ``H``.
        query_len: ``L``.
        key_len: ``S`` (defaults to ``L``).
        device, dtype: of the result (default: the CPU and torch's default dtype).

    Returns:
        A float tensor to add to the scores; usable as the float ``attn_mask`` of
        ``F.scaled_dot_product_attention`` (broadcast over the batch).

    Shape:
        ``(H, L, S)``
    """
    check_positive_int("num_heads", num_heads)
    check_positive_int("query_len", query_len, allow_zero=True)
    key_len = query_len if key_len is None else key_len
    check_positive_int("key_len", key_len, allow_zero=True)
    dtype = _check_dtype(dtype)
    query_pos = torch.arange(query_len, device=device, dtype=torch.float64) + (key_len - query_len)  # (L,)
    key_pos = torch.arange(key_len, device=device, dtype=torch.float64)  # (S,)
    distance = query_pos[:, None] - key_pos[None, :]  # (L, 1) - (1, S) -> (L, S), i - j
    slopes = alibi_slopes(num_heads, device=device, dtype=torch.float64)  # (H,)
    return (-slopes[:, None, None] * distance).to(dtype)  # (H, 1, 1) * (L, S) -> (H, L, S)
